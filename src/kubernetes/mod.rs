//! The Kubernetes-facing code, one room per thing it is, each with the protocol stack it speaks
//! beside it:
//!
//! ```text
//! deviceplugin  the kubelet device plugin (v1beta1: registrar, the DevicePlugin service,
//!               PodResources reconciliation); its API in deviceplugin/proto.rs
//! nri           the NRI plugin the container runtime calls (containers start on their CPUs);
//!               its multiplexer, ttRPC and messages in nri/{mux,ttrpc,proto}.rs
//! dra           the DRA driver's kubelet plugin (`k8s` feature): registration and
//!               NodePrepareResources; the DRA plugin and registration APIs in dra/proto.rs
//!               (always built: the tests' kubelet-shaped peer speaks them)
//! cluster       the cluster objects (`k8s` feature): the CpuPoolNode report, the ConfigMap
//!               configuration, the node's pods, ResourceSlices and DeviceClasses, the CRD
//! apiserver     our client of the API server (`k8s` feature): options, the client once it can
//!               be made, its errors in words; the cluster objects and the DRA driver use it
//! grpc          what the kubelet- and runtime-facing adapters share: PodResources and CRI
//!               clients and their APIs, the sockets the kubelet dials
//! cdi           the CDI spec of a prepared claim, which the engine writes and the runtime
//!               reads (/var/run/cdi)
//! ```
//!
//! The four adapters (deviceplugin, nri, dra, cluster) stand with the other adapters and never
//! import each other; `grpc` and `cdi` stand below the engine, `apiserver` beside it
//! (docs/development.md's floors, which tests/layout.rs holds).
#![deny(missing_docs)]

#[cfg(feature = "k8s")]
pub mod apiserver;
pub mod cdi;
#[cfg(feature = "k8s")]
pub mod cluster;
pub mod deviceplugin;
pub mod dra;
pub mod grpc;
pub mod nri;
