//! cpupoold: divides a host's CPUs into reserved, exclusive and shared pools and applies them
//! through cgroup v2 and systemd.
#![forbid(unsafe_code)]
pub mod core;
pub mod host;
