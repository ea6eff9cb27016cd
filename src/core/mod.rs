//! The pure domain: CPU sets, topology, pools, state, allocation and effect planning.
//!
//! Nothing here does I/O, reads a clock or awaits. The engine feeds it requests and executes the
//! effects it returns through the host side.
pub mod alloc;
pub mod cache;
pub mod classes;
pub mod container;
pub mod cpuset;
pub mod devices;
pub mod edit;
pub mod housekeeping;
pub mod isolation;
pub mod plan;
pub mod pool;
pub mod power;
pub mod state;
pub mod topology;
