//! Host side: every side effect, each function given the root or connection it works on.
//!
//! The engine applies its plan through a [`Backend`]: [`cgroupfs::CgroupFs`] writes every cgroup
//! file itself (hosts without systemd, the sandbox); [`systemd::Systemd`] sets slices and units
//! through systemd's D-Bus API and writes directly only what systemd does not manage
//! (partitions, cgroups that are not units). Both execute the same planned effects.
//!
//! Where the kernel decides the outcome of a write, the surface's module defines a small trait
//! for the kernel's part and implements it for the host's kernel; [`kernel::Kernel`] bundles
//! them, and a simulated kernel (`crate::sim`) implements the same traits. Nothing here names
//! the simulation.
pub mod bus;
pub mod cgroupfs;
pub mod dirwatch;
pub mod fsutil;
pub mod health;
pub mod housekeeping;
pub mod irq;
pub mod irqbalance;
pub mod kernel;
pub mod kubelet;
pub mod pidwatch;
pub mod power;
pub mod procfs;
pub mod resctrl;
pub mod socket;
pub mod store;
pub mod sysfs;
pub mod systemd;

use crate::core::cpuset::CpuSet;
use crate::core::plan::{Effect, Key, Partition};
use crate::core::state::CgroupPath;
pub use cgroupfs::HostError;

/// Reading or writing a host file failed: the file, what was written, and the kernel's answer
/// in `#[source]`. The one I/O error of the host side: each surface's error wraps it
/// (`Io`), or is it ([`power::PowerError`]).
#[derive(Debug, thiserror::Error)]
pub enum IoError {
    /// Reading failed.
    #[error("reading `{}`", path.display())]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Writing failed.
    #[error("writing `{data}` to `{}`", path.display())]
    Write {
        /// The file.
        path: std::path::PathBuf,
        /// What was written.
        data: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// What the host holds now for one placement.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Observed {
    /// Its CPUs.
    pub cpus: CpuSet,
    /// Its memory nodes (cgroups; empty where unknown).
    pub mems: CpuSet,
    /// Its partition (valid partitions only: an invalid one reads as a member).
    pub partition: Partition,
}

/// Where a target sits, and the CPUs the kernel lets it use there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Confinement {
    /// The cgroup (or slice) it sits in, relative to the cgroup root (`/` for the root).
    pub parent: String,
    /// That cgroup's effective CPUs.
    pub cpus: CpuSet,
}

/// Executes planned effects and reads back what the host holds.
///
/// `Sync`: the engine applies effects on its thread while the drift check reads the host on
/// another ([`crate::engine::Handle::check_drift`]).
pub trait Backend: Send + Sync {
    /// `cgroupfs` or `systemd`, for logs.
    fn name(&self) -> &'static str;
    /// Executes one effect.
    fn apply(&self, effect: &Effect) -> Result<(), HostError>;
    /// What `key` holds now; `None` when it does not exist.
    fn observe(&self, key: &Key) -> Result<Option<Observed>, HostError>;
    /// The cgroups directly below `top` (to find stale pool slices).
    fn children(&self, top: &CgroupPath) -> Vec<CgroupPath>;
    /// The kernel's word on a partition: `isolated`, `root invalid (...)`, ...; `None` where
    /// the cgroup or the file does not exist.
    fn partition_status(&self, path: &CgroupPath) -> Option<String>;
    /// [`Backend::partition_status`] as last read, where nothing this backend wrote since can
    /// have changed it (the drift check's [`Backend::refresh`] reads it afresh): what every
    /// published snapshot shows.
    fn kept_partition_status(&self, path: &CgroupPath) -> Option<String> {
        self.partition_status(path)
    }
    /// Whether the kernel has `cpuset.cpus.exclusive` (Linux 6.7): isolated partitions can then
    /// sit below a parent that is not a partition itself, which leaves the other pool CPUs free
    /// for lending.
    fn remote_partitions(&self) -> bool;
    /// Whether the kubelet's pod cgroup (`kubepods.slice`, or `kubepods` with the cgroupfs
    /// driver) exists: the kubelet runs pods on this host.
    fn kubelet_pods(&self) -> bool {
        false
    }
    /// When a process started (`/proc/PID/stat` field 22, clock ticks since boot); `None` if
    /// it does not exist. With the pid, it names one process for good.
    fn process_start(&self, pid: u32) -> Option<u64>;
    /// What the kernel enforces on `key` now: the effective CPUs of a cgroup or of a running
    /// unit's cgroup, a process's affinity. `None`: nothing to read (a unit that is not
    /// running, a process that is gone, a host without the cpuset controller).
    fn enforced(&self, key: &Key) -> Result<Option<CpuSet>, HostError>;
    /// Where `key` sits and the CPUs the kernel lets it use there (a cgroup's parent, a unit's
    /// slice, a process's cgroup); `None` where that cannot be known.
    fn confinement(&self, key: &Key) -> Result<Option<Confinement>, HostError>;
    /// Whether `path` is a container's cgroup (outside `cpupool.slice`) that is gone from the
    /// kernel's tree: writes to it are skipped, and it is not drift.
    fn vanished(&self, path: &CgroupPath) -> bool {
        let _ = path;
        false
    }
    /// Forgets what the backend remembers of the host between its own writes (where pool
    /// slices sit, their partitions), so that the next reads see changes made by others: the
    /// drift check calls it before it reads.
    fn refresh(&self) {}
    /// Whether [`Backend::observe`] can read units (systemd can; cgroupfs cannot).
    fn can_read_units(&self) -> bool {
        true
    }
    /// Whether this backend moves a process into a scope for `Run` (systemd) rather than
    /// setting its affinity in place.
    fn runs_scopes(&self) -> bool {
        false
    }
    /// Whether unit `unit` runs no process: not loaded, or its cgroup not populated (the
    /// kernel's `cgroup.events`, which says so before systemd has collected the unit). `false`
    /// where that cannot be known.
    fn unit_runs_nothing(&self, unit: &str) -> bool {
        let _ = unit;
        false
    }
    /// Starts a transient scope `unit` in `slice` holding `pid`, confined to `cpus` (empty: to
    /// the slice's).
    fn start_scope(&self, unit: &str, slice: &str, pid: u32, cpus: &CpuSet) -> Result<(), HostError> {
        let _ = (slice, pid, cpus);
        Err(HostError::NoSystemd(unit.to_owned()))
    }
}

/// Reads a small kernel file whole: `open`, `read` until the end, `close`. Not
/// [`std::fs::read_to_string`], which also stats the file for its size (a kernel file says 4096 or
/// 0): at 10,000 targets read back at a restart, or every CPU's topology on a 1,024-CPU host, one
/// system call in four.
pub(crate) fn read_small(path: &std::path::Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut bytes = Vec::with_capacity(128);
    let mut chunk = [0u8; 512];
    loop {
        match f.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => bytes.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    String::from_utf8(bytes).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}
