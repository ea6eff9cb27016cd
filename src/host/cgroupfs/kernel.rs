//! The kernel's part in a cgroup tree and in processes' affinities: the traits a kernel (the
//! host's, or a simulated one) implements, and the host's cgroup2 ([`HostCgroups`]).
//!
//! A real cgroup2 makes every file of a cgroup itself, computes `cpuset.cpus.effective`, and
//! has containers' cgroups come and go by their runtime; a simulated tree (the sandbox's) is
//! plain files whose kernel computes the effective CPUs, makes files on the first write, and
//! has no one else to remove cgroups. The backend asks its [`CgroupKernel`] at each of those
//! points and does the rest (paths, errors, read-back, the read cache) the same way on both.

use std::fs;
use std::path::Path;

use super::{CgroupFs, HostError};
use crate::core::cpuset::CpuSet;
use crate::core::state::CgroupPath;
use crate::host::fsutil::{FsError, Root};

/// The kernel's part in a cgroup tree (module docs).
pub trait CgroupKernel: Send + Sync + std::fmt::Debug {
    /// Writes `bytes` to the file `rel` below `root`, in one write.
    fn write(&self, root: &Root, rel: &Path, bytes: &[u8]) -> Result<(), FsError>;
    /// Removes the cgroup `rel` below `root` (holding no process).
    fn remove(&self, root: &Root, rel: &str) -> Result<(), FsError>;
    /// Whether the children of the cgroup directory `dir` have the cpuset controller.
    fn cpuset_enabled(&self, dir: &Path) -> bool;
    /// Whether `file`, a cgroup's `cpuset.cpus` whose parent has the controller, can be written.
    fn cpuset_file_ready(&self, file: &Path) -> bool;
    /// Whether `path` is a container's cgroup that its runtime removed ([`CgroupFs::vanished`]).
    fn vanished(&self, fs: &CgroupFs, path: &CgroupPath) -> bool;
    /// The effective CPUs of cgroup `path` ([`CgroupFs::effective`]); `None` if it does not exist.
    fn effective(&self, fs: &CgroupFs, path: &CgroupPath) -> Result<Option<CpuSet>, HostError>;
    /// The root cgroup's effective CPUs; `None` without the cpuset controller.
    fn root_effective(&self, fs: &CgroupFs) -> Result<Option<CpuSet>, HostError>;
}

/// The kernel's part in processes' affinities.
pub trait ProcessKernel: Send + Sync + std::fmt::Debug {
    /// Sets the affinity of every thread of `pid` (empty `cpus`: every CPU); a process that is
    /// gone is not an error when `optional`.
    fn set_affinity(&self, fs: &CgroupFs, pid: u32, cpus: &CpuSet, optional: bool) -> Result<(), HostError>;
    /// The affinity of `pid`'s main thread, `None` if it is gone.
    fn affinity(&self, fs: &CgroupFs, pid: u32) -> Option<CpuSet>;
    /// The cgroup `pid` sits in, relative to the root (`""`: the root); `None` where that
    /// cannot be known.
    fn cgroup(&self, fs: &CgroupFs, pid: u32) -> Option<String>;
    /// Keeps `cpus` busy from below cgroup `path` until the result is dropped, before they
    /// become an isolated partition ([`super::settle`]); nothing runs on a simulated kernel.
    fn keep_busy(&self, _fs: &CgroupFs, _path: &CgroupPath, _cpus: &CpuSet) -> super::settle::Busy {
        super::settle::Busy::default()
    }
}

/// The host's cgroup2: its files answer.
#[derive(Debug, Clone, Copy)]
pub struct HostCgroups;

impl CgroupKernel for HostCgroups {
    fn write(&self, root: &Root, rel: &Path, bytes: &[u8]) -> Result<(), FsError> {
        root.write(rel, bytes)
    }

    fn remove(&self, root: &Root, rel: &str) -> Result<(), FsError> {
        root.remove_dir(rel)
    }

    fn cpuset_enabled(&self, dir: &Path) -> bool {
        fs::read_to_string(dir.join("cgroup.subtree_control"))
            .is_ok_and(|t| t.split_whitespace().any(|c| c.trim_start_matches('+') == "cpuset"))
    }

    fn cpuset_file_ready(&self, file: &Path) -> bool {
        file.exists()
    }

    fn vanished(&self, fs: &CgroupFs, path: &CgroupPath) -> bool {
        path.outside_pools() && !fs.exists(path)
    }

    fn effective(&self, fs: &CgroupFs, path: &CgroupPath) -> Result<Option<CpuSet>, HostError> {
        let dir = fs.dir(path);
        if !dir.is_dir() {
            return Ok(None);
        }
        fs.effective_at(&dir)
    }

    fn root_effective(&self, fs: &CgroupFs) -> Result<Option<CpuSet>, HostError> {
        fs.effective_at(&fs.root)
    }
}
