//! The node's Kubernetes plumbing that the adapters facing the kubelet and the runtime share:
//! the device plugin ([`crate::deviceplugin`]), the NRI plugin ([`crate::nri`]) and the DRA
//! driver (`crate::k8s::dra`). None of them decides anything; each is spoken or written the way
//! its published API says.
//!
//! ```text
//! proto     the kubelet's and the runtime's gRPC APIs, written from the published .proto files:
//!           device plugin v1beta1, PodResources v1, the DRA plugin v1, plugin registration,
//!           the CRI subset
//! clients   our clients of them: Registration, PodResourcesLister, the CRI's ListContainers
//! incoming  the sockets the kubelet dials (device plugin, DRA): bound in place, connections
//!           within a budget
//! claims    the DRA claim records of earlier releases (<state_dir>/dra/<uid>.json), which the
//!           engine takes into its state at start
//! cdi       the CDI spec of a prepared claim, which the runtime reads (/var/run/cdi)
//! ```
//!
//! It stands above `host` (its files are written with host's durable writes) and below the
//! adapters, which never import each other.
#![deny(missing_docs)]

pub mod cdi;
pub mod claims;
pub mod clients;
pub(crate) mod incoming;
pub mod proto;
