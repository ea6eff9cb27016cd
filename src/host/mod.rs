//! Host side: every side effect, each function given the root or connection it works on.
pub mod cgroupfs;
pub mod simhost;
pub mod store;
pub mod sysfs;
