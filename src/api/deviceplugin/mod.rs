//! The kubelet device plugin.
pub mod devices;
pub mod proto;
pub mod host;
