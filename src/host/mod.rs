//! Host side: every side effect, each function given the root or connection it works on.
pub mod store;
pub mod simhost;
pub mod sysfs;
pub mod cgroupfs;
