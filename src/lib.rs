//! cpupoold: divides a host's CPUs into reserved, exclusive and shared pools and applies them
//! through cgroup v2 and systemd.
//!
//! Data flows inward to one owner: adapters decode requests and send them to the [`engine`],
//! which decides every change of the state with the pure [`core`], executes its effects
//! through the [`host`] side, saves the state and publishes a snapshot. The adapters ask that
//! snapshot their questions (a container's CPUs for its devices, a claim's assignments) and
//! change the state only through the engine, which also owns a prepared DRA claim and writes
//! its CDI spec. The management interfaces are [`api`]; everything that faces Kubernetes (the
//! device plugin, NRI, the DRA driver, the cluster objects) is [`kubernetes`]. The floors the
//! modules stand on, and the test that holds them, are in docs/development.md.
#![forbid(unsafe_code)]
pub mod api;
pub mod backoff;
pub mod config;
/// The pure domain, a crate of its own (cpupool-core/) so that the compiler keeps it on the
/// ground floor; `crate::core::` names it throughout the daemon.
pub use cpupool_core as core;
pub mod counters;
pub mod daemon;
pub mod engine;
pub mod fds;
pub mod host;
pub mod kubernetes;
pub mod logging;
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
