//! cpupoold: divides a host's CPUs into reserved, exclusive and shared pools and applies them
//! through cgroup v2 and systemd.
//!
//! Data flows inward to one owner: adapters decode requests and send them to the [`engine`],
//! which decides every change of the state with the pure [`core`], executes its effects
//! through the [`host`] side, saves the state and publishes a snapshot. The adapters that
//! place a container (the device plugin, NRI, the DRA driver) read that snapshot and work
//! out the container's CPUs from it with `core`'s functions; they change the state only through
//! the engine (the DRA driver writes a prepared claim's record and CDI spec itself, once the
//! engine has booked its CPUs). The floors the modules stand on, and the test that holds them,
//! are in docs/development.md.
#![forbid(unsafe_code)]
pub mod api;
pub mod backoff;
pub mod config;
pub mod core;
pub mod counters;
pub mod daemon;
pub mod deviceplugin;
pub mod engine;
pub mod fds;
pub mod host;
#[cfg(feature = "k8s")]
pub mod k8s;
pub mod logging;
pub mod node;
pub mod nri;
pub mod reclaim;
pub mod sandbox;
pub mod sim;
pub mod threads;

/// An error and its causes on one line: "a: b: c". On the ground floor: every room logs and
/// reports errors this way.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
