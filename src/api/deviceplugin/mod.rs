//! The kubelet device plugin.
pub mod proto;
