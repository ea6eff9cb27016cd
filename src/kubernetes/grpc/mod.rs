//! The gRPC plumbing more than one adapter of the home uses: the kubelet's PodResources (the
//! device plugin's reconciliation and the NRI plugin ask which container holds which devices),
//! the runtime's CRI (both map a container to its cgroup), and the sockets the kubelet dials
//! (the device plugin's endpoints and the DRA driver's). Each adapter's own API stands beside it
//! (the device plugin's `v1beta1`, the DRA plugin's and its registration, NRI's ttRPC).
//!
//! ```text
//! proto     PodResources v1 and the CRI subset, generated from the published .proto files
//! clients   our clients of them over unix sockets, each answer waited for at most 5 s
//! incoming  the sockets the kubelet dials: bound in place, connections within a budget, a
//!           peer of another uid than root's or ours closed at accept
//! ```
//!
//! It stands on the floor above `host` and below the engine and the adapters, and decides
//! nothing: each API is spoken the way its published definition says.
#![deny(missing_docs)]

pub mod clients;
pub(crate) mod incoming;
pub mod proto;
