//! Kernel housekeeping files: the unbound workqueue and writeback cpumasks, kernel threads'
//! affinities ([`Kthreads`]), the kernel's word on isolation (`/proc/cmdline`,
//! `devices/system/cpu/{isolated,nohz_full}`, `cpuset.cpus.isolated`), and the durable record
//! of the masks and affinities found before we changed them.
//!
//! Data flow: the engine reads the masks after the partitions exist, asks
//! [`crate::core::housekeeping::trimmed_mask`] what they should be, writes them here and reads
//! them back. Before its first write it records the masks it found in
//! `<state_dir>/housekeeping.json` ([`Saved`], kernel threads' affinities too), durably and with
//! a previous copy ([`Remembered`]), so that ending isolation or starting after a crash puts back
//! what the host had; the file goes once nothing is recorded. Each function takes its root.
#![deny(missing_docs)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::fsutil::{FsError, Root};
use super::store::{MemoryFile, Remembered};
use crate::core::cpuset::CpuSet;
use crate::core::housekeeping::{self, BootIsolation, MaskError, TaskStat};

/// The unbound workqueues' cpumask, relative to the sysfs root.
pub const WORKQUEUE_MASK: &str = "devices/virtual/workqueue/cpumask";
/// The writeback workqueue's cpumask, relative to the sysfs root. `/sys/bus/workqueue/devices/
/// writeback` is a symlink to this directory, and writes never follow symlinks.
pub const WRITEBACK_MASK: &str = "devices/virtual/workqueue/writeback/cpumask";
/// Where the masks and affinities found before our first write are kept, in the state
/// directory ([`Saved::load`]).
pub const MEMORY: MemoryFile = MemoryFile {
    name: "housekeeping.json",
    keeper: "housekeeping",
    holds: "the workqueue masks and kernel thread affinities",
};

/// A housekeeping file that could not be read, parsed or written.
#[derive(Debug, thiserror::Error)]
pub enum HousekeepingError {
    /// Reading or writing failed.
    #[error(transparent)]
    Fs(#[from] FsError),
    /// A mask file holds something that is not a mask.
    #[error("parsing `{}`", path.display())]
    Mask {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        #[source]
        source: MaskError,
    },
    /// A kernel thread's affinity could not be set.
    #[error("setting the affinity of kernel thread {comm} ({pid}) to CPUs {cpus}")]
    Affinity {
        /// The thread.
        pid: u32,
        /// Its name.
        comm: String,
        /// What was written.
        cpus: CpuSet,
        /// The kernel's answer (`EINVAL`: it binds the thread itself).
        #[source]
        source: std::io::Error,
    },
}

/// Reads the mask file `rel` below `sysfs`; `None` when the kernel has none.
pub fn read_mask(sysfs: &Path, rel: &str) -> Result<Option<CpuSet>, HousekeepingError> {
    let root = Root::new(sysfs);
    if !root.exists(rel) {
        return Ok(None);
    }
    let text = root.read_to_string(rel)?;
    housekeeping::parse_mask(&text)
        .map(Some)
        .map_err(|source| HousekeepingError::Mask { path: sysfs.join(rel), source })
}

/// Writes `cpus` to the mask file `rel`, as the kernel prints a mask of `bits` CPUs.
pub fn write_mask(sysfs: &Path, rel: &str, cpus: &CpuSet, bits: u32) -> Result<(), HousekeepingError> {
    let text = format!("{}\n", housekeeping::format_mask(cpus, bits));
    Root::new(sysfs).write(rel, text.as_bytes())?;
    Ok(())
}

/// What the kernel isolates on its own: the boot command line, the CPUs it isolated from the
/// scheduler and from the tick, and those isolated partitions hold now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelIsolation {
    /// `isolcpus=` and `nohz_full=` on `/proc/cmdline`.
    pub boot: BootIsolation,
    /// `devices/system/cpu/isolated`.
    pub isolated: CpuSet,
    /// `devices/system/cpu/nohz_full` (the kernel prints `(null)` when there are none).
    pub nohz_full: CpuSet,
    /// The root cgroup's `cpuset.cpus.isolated` (Linux 6.6+); `None` on older kernels.
    pub partitions: Option<CpuSet>,
}

impl KernelIsolation {
    /// The CPUs that are not housekeeping CPUs whatever the pools say: isolated from the
    /// scheduler or from the tick at boot, on the command line or as the kernel reports them.
    pub fn not_housekeeping(&self) -> CpuSet {
        self.boot.isolcpus.union(&self.boot.nohz_full).union(&self.isolated).union(&self.nohz_full)
    }
}

/// Reads [`KernelIsolation`]; a file that is missing or unreadable counts as empty.
pub fn read_kernel(procfs: &Path, sysfs: &Path, cgroup: &Path) -> KernelIsolation {
    let read = |root: &Path, rel: &str| Root::new(root).read_to_string(rel).ok();
    let list = |text: Option<String>| text.and_then(|t| CpuSet::parse(&t).ok()).unwrap_or_default();
    KernelIsolation {
        boot: housekeeping::parse_cmdline(&read(procfs, "cmdline").unwrap_or_default()),
        isolated: list(read(sysfs, "devices/system/cpu/isolated")),
        nohz_full: list(read(sysfs, "devices/system/cpu/nohz_full")),
        partitions: read(cgroup, "cpuset.cpus.isolated").and_then(|t| CpuSet::parse(&t).ok()),
    }
}

/// The masks as they were before cpupoold first changed them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Saved {
    /// The unbound workqueues' mask, in the kernel's hex format.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workqueue: Option<String>,
    /// The writeback mask.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writeback: Option<String>,
    /// Kernel threads narrowed off isolated CPUs, by pid.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub kthreads: BTreeMap<u32, SavedThread>,
}

/// A kernel thread's affinity before cpupoold narrowed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedThread {
    /// Its name.
    pub comm: String,
    /// Its start time (`/proc/PID/stat` field 22): a pid reused by another thread is not it.
    pub start: u64,
    /// Its `Cpus_allowed_list` then.
    pub cpus: String,
}

impl Saved {
    /// Whether nothing is recorded.
    pub fn is_empty(&self) -> bool {
        self.workqueue.is_none() && self.writeback.is_none() && self.kthreads.is_empty()
    }

    /// The record for the mask file `rel`.
    pub fn slot(&mut self, rel: &str) -> &mut Option<String> {
        if rel == WRITEBACK_MASK {
            &mut self.writeback
        } else {
            &mut self.workqueue
        }
    }

    /// The record left in `state_dir` by an earlier run (its previous copy when it is damaged,
    /// none an empty record), as a memory whose saves delete the file once it is empty.
    pub fn load(state_dir: &Path) -> Remembered<Saved> {
        Remembered::<Saved>::load(state_dir, MEMORY).deleted_when_empty(Saved::is_empty)
    }
}

/// A kernel thread as procfs shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kthread {
    /// Its pid.
    pub pid: u32,
    /// Name, flags and start time.
    pub stat: TaskStat,
    /// Its `Cpus_allowed_list`.
    pub allowed: CpuSet,
}

/// Kernel threads under a procfs root, and their affinities.
///
/// On the host's kernel ([`HostKthreads`]) the affinity is set with `sched_setaffinity` and read
/// back from `PID/status`. A simulated kernel (the sandbox's, `crate::sim::kthreads`) plays the
/// kernel's part on a tree of plain files instead, never changing a real process; the daemon
/// learns what the kernel made of a write only from the read-back, either way.
#[derive(Debug, Clone)]
pub struct Kthreads {
    procfs: PathBuf,
    kernel: &'static dyn KthreadKernel,
}

/// The kernel's part in setting a kernel thread's affinity: it takes the CPUs, or refuses
/// (`EINVAL`: it binds the thread itself, or no CPU is allowed; `ESRCH`: the thread is gone).
pub trait KthreadKernel: Send + Sync + std::fmt::Debug {
    /// Sets `t`'s affinity (a thread of `fs`) to `cpus`.
    fn set_affinity(&self, fs: &Kthreads, t: &Kthread, cpus: &CpuSet) -> Result<(), HousekeepingError>;
}

/// The host's kernel: `sched_setaffinity`.
#[derive(Debug, Clone, Copy)]
pub struct HostKthreads;

impl KthreadKernel for HostKthreads {
    fn set_affinity(&self, _fs: &Kthreads, t: &Kthread, cpus: &CpuSet) -> Result<(), HousekeepingError> {
        let err = |source| affinity_error(t, cpus, source);
        let mut set = nix::sched::CpuSet::new();
        for cpu in cpus.iter() {
            set.set(cpu as usize).map_err(|e| err(e.into()))?;
        }
        let pid = i32::try_from(t.pid).map_err(|_| err(nix::Error::ESRCH.into()))?;
        nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(pid), &set).map_err(|e| err(e.into()))
    }
}

/// The error of setting `t`'s affinity to `cpus`.
pub fn affinity_error(t: &Kthread, cpus: &CpuSet, source: std::io::Error) -> HousekeepingError {
    HousekeepingError::Affinity { pid: t.pid, comm: t.stat.comm.clone(), cpus: cpus.clone(), source }
}

impl Kthreads {
    /// Kernel threads under `procfs`, on the host's kernel.
    pub fn new(procfs: &Path) -> Kthreads {
        Kthreads { procfs: procfs.to_owned(), kernel: &HostKthreads }
    }

    /// The same threads, answered by `part`, the chosen kernel's part in this surface
    /// ([`Kernel`](super::kernel::Kernel) bundles the parts and hands each over, `with_kernel`).
    pub fn answered_by(self, part: &'static dyn KthreadKernel) -> Kthreads {
        Kthreads { kernel: part, ..self }
    }

    /// The procfs root.
    pub fn procfs(&self) -> &Path {
        &self.procfs
    }

    /// The kernel threads userspace may move (see [`TaskStat::movable_kthread`]). Tasks that
    /// exit while being read are left out.
    pub fn movable(&self) -> Result<Vec<Kthread>, HousekeepingError> {
        let entries = std::fs::read_dir(&self.procfs).map_err(|source| {
            HousekeepingError::Fs(FsError { op: "listing", path: self.procfs.clone(), source })
        })?;
        let mut out = Vec::new();
        for e in entries.filter_map(Result::ok) {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
            if let Some(t) = self.read(pid).filter(|t| t.stat.movable_kthread()) {
                out.push(t);
            }
        }
        out.sort_by_key(|t| t.pid);
        Ok(out)
    }

    /// One task, `None` when it is gone or unreadable.
    pub fn read(&self, pid: u32) -> Option<Kthread> {
        let root = Root::new(&self.procfs);
        let stat = housekeeping::parse_task_stat(&root.read_to_string(format!("{pid}/stat")).ok()?)?;
        let allowed = housekeeping::parse_allowed(&root.read_to_string(format!("{pid}/status")).ok()?)?;
        Some(Kthread { pid, stat, allowed })
    }

    /// Sets `t`'s affinity to `cpus`.
    pub fn set_affinity(&self, t: &Kthread, cpus: &CpuSet) -> Result<(), HousekeepingError> {
        self.kernel.set_affinity(self, t, cpus)
    }
}

/// Whether a failed [`Kthreads::set_affinity`] is the kernel's refusal (`EINVAL`: it binds the
/// thread) or the thread being gone (`ESRCH`): neither is a fault of ours.
pub fn refused_or_gone(e: &HousekeepingError) -> bool {
    matches!(e, HousekeepingError::Affinity { source, .. }
        if matches!(source.raw_os_error(), Some(libc::EINVAL) | Some(libc::ESRCH)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(s: &str) -> CpuSet {
        CpuSet::parse(s).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn masks_are_written_in_the_kernels_format_and_read_back() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(read_mask(dir.path(), WORKQUEUE_MASK).unwrap_or_else(|e| panic!("{e}")), None);
        let file = dir.path().join(WORKQUEUE_MASK);
        std::fs::create_dir_all(file.parent().unwrap_or(dir.path())).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(&file, "f\n").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(read_mask(dir.path(), WORKQUEUE_MASK).unwrap_or_else(|e| panic!("{e}")), Some(set("0-3")));
        write_mask(dir.path(), WORKQUEUE_MASK, &set("0-1"), 4).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(std::fs::read_to_string(&file).unwrap_or_default(), "3\n");
        std::fs::write(&file, "zz\n").unwrap_or_else(|e| panic!("{e}"));
        let e = read_mask(dir.path(), WORKQUEUE_MASK).err().unwrap_or_else(|| panic!("parsed"));
        assert!(e.to_string().contains("workqueue/cpumask"), "{e}");
    }

    #[test]
    fn saved_masks_survive_and_go() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let mut s = Saved::load(dir.path());
        assert!(s.is_empty());
        *s.slot(WRITEBACK_MASK) = Some("f".into());
        s.save().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(*Saved::load(dir.path()), *s);
        *s = Saved::default();
        s.save().unwrap_or_else(|e| panic!("{e}"));
        assert!(!dir.path().join(MEMORY.name).exists());
    }

    #[test]
    fn a_damaged_record_falls_back_to_its_previous_copy_and_an_empty_one_takes_both_along() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let (file, prev) = (dir.path().join(MEMORY.name), dir.path().join(MEMORY.prev()));
        assert_eq!(prev, dir.path().join("housekeeping.json.prev"));
        let mut s = Saved::load(dir.path());
        *s.slot(WORKQUEUE_MASK) = Some("ff".into());
        s.save().unwrap_or_else(|e| panic!("{e}"));
        s.kthreads.insert(2, SavedThread { comm: "kthreadd".into(), start: 12, cpus: "0-3".into() });
        s.save().unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(&file, "{\"workqueue\": ").unwrap_or_else(|e| panic!("{e}"));
        let mut back = Saved::load(dir.path());
        assert_eq!(back.workqueue.as_deref(), Some("ff"), "the copy before the last save");
        assert!(back.kthreads.is_empty());
        // Nothing remembered any more: the file and its previous copy both go.
        *back.slot(WORKQUEUE_MASK) = None;
        back.save().unwrap_or_else(|e| panic!("{e}"));
        assert!(!file.exists() && !prev.exists());
    }

    #[test]
    fn kernel_isolation_from_cmdline_sysfs_and_cgroup() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let (p, s, c) = (dir.path().join("proc"), dir.path().join("sys"), dir.path().join("cg"));
        for d in [&p, &s.join("devices/system/cpu"), &c] {
            std::fs::create_dir_all(d).unwrap_or_else(|e| panic!("{e}"));
        }
        std::fs::write(p.join("cmdline"), "ro isolcpus=domain,3 nohz_full=3\n")
            .unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(s.join("devices/system/cpu/isolated"), "3\n").unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(s.join("devices/system/cpu/nohz_full"), "(null)\n").unwrap_or_else(|e| panic!("{e}"));
        let k = read_kernel(&p, &s, &c);
        assert_eq!(k.boot.isolcpus, set("3"));
        assert_eq!(k.boot.nohz_full, set("3"));
        assert_eq!(k.isolated, set("3"));
        assert_eq!(k.nohz_full, CpuSet::new());
        assert_eq!(k.partitions, None);
        std::fs::write(c.join("cpuset.cpus.isolated"), "2-3\n").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(read_kernel(&p, &s, &c).partitions, Some(set("2-3")));
    }

    #[test]
    fn saved_kthreads_survive_and_go() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let mut s = Saved::default();
        s.kthreads.insert(2, SavedThread { comm: "kthreadd".into(), start: 12, cpus: "0-3".into() });
        assert!(!s.is_empty());
        let mut kept = Saved::load(dir.path());
        *kept = s.clone();
        kept.save().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(*Saved::load(dir.path()), s);
        // A record from before kernel threads were remembered still loads.
        std::fs::write(dir.path().join(MEMORY.name), r#"{"workqueue":"f"}"#)
            .unwrap_or_else(|e| panic!("{e}"));
        let old = Saved::load(dir.path());
        assert!(old.kthreads.is_empty());
        assert_eq!(old.workqueue.as_deref(), Some("f"));
    }
}
