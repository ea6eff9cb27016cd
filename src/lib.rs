//! cpupoold: divides a host's CPUs into reserved, exclusive and shared pools and applies them
//! through cgroup v2 and systemd.
//!
//! Data flows inward to one owner: adapters decode requests and send them to the [`engine`],
//! which decides with the pure [`core`], executes effects through the [`host`] side, saves
//! the state and publishes the result.
#![forbid(unsafe_code)]
pub mod api;
pub mod backoff;
pub mod config;
pub mod core;
pub mod daemon;
pub mod engine;
pub mod fds;
pub mod host;
#[cfg(feature = "k8s")]
pub mod k8s;
pub mod kubelet;
pub mod logging;
pub mod nri;
pub mod reclaim;
pub mod sandbox;
pub mod threads;
