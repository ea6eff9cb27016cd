//! The cgroupfs backend: executes planned effects by writing cgroup v2 files under a root, and
//! process affinity through `sched_setaffinity` (tasks listed under a procfs root).
//!
//! This file creates, removes and writes cgroups and executes effects; `partition` makes and
//! reads partitions (`settle` keeps the CPUs it isolates busy meanwhile), `effective` reads back
//! what the kernel enforces, `procs` handles processes,
//! `kernel` defines the kernel's part ([`CgroupKernel`], [`ProcessKernel`]) and the host's.
//!
//! It decides nothing: the planner chose the order, this only writes. Every error carries the
//! path and the data written, e.g. "writing `2-3` to `/sys/fs/cgroup/x/cpuset.cpus`".

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::IoError;
use crate::core::cpuset::CpuSet;
use crate::core::plan::{Effect, Key};
use crate::core::state::CgroupPath;

mod cache;
mod effective;
mod kernel;
mod partition;
mod procs;
pub mod settle;

pub use cache::Partitions;
pub use kernel::{CgroupKernel, HostCgroups, ProcessKernel};
pub use procs::HostProcesses;

/// A host operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// Reading or writing a file failed.
    #[error(transparent)]
    Io(#[from] IoError),
    /// A file held something unexpected.
    #[error("`{}` holds `{text}`, not a CPU list", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// What it held.
        text: String,
    },
    /// Creating or removing a cgroup failed.
    #[error("{op} cgroup `{}`", path.display())]
    Dir {
        /// `creating` or `removing`.
        op: &'static str,
        /// The directory.
        path: PathBuf,
        /// Why it failed.
        #[source]
        source: io::Error,
    },
    /// Setting a thread's affinity failed.
    #[error("setting CPU affinity of thread {tid} (process {pid}) to `{cpus}`")]
    Affinity {
        /// The process.
        pid: u32,
        /// The thread.
        tid: u32,
        /// The CPUs.
        cpus: String,
        /// Why it failed.
        #[source]
        source: nix::Error,
    },
    /// A systemd unit was targeted but no systemd connection exists.
    #[error("unit `{0}`: unit targets need systemd (this daemon runs the cgroupfs backend)")]
    NoSystemd(String),
    /// A call to systemd failed.
    #[error("systemd: {what}")]
    Systemd {
        /// What was asked, e.g. "setting AllowedCPUs=2-3 on cpupool-dp.slice".
        what: String,
        /// Why it failed.
        #[source]
        source: Box<zbus::Error>,
    },
    /// A systemd job did not finish as asked.
    #[error("systemd: {what}: job {result}")]
    Job {
        /// What the job was for.
        what: String,
        /// systemd's result (`failed`, `timeout`, ...).
        result: String,
    },
    /// A cgroup to be written does not exist.
    #[error("no cgroup `{}`", path.display())]
    NoSuchCgroup {
        /// The cgroup's directory.
        path: PathBuf,
    },
    /// A cgroup has no `cpuset.cpus` because its parent does not enable the cpuset controller
    /// for its children.
    #[error(
        "cgroup `{}` has no cpuset.cpus: the cpuset controller is not enabled in `{}/cgroup.subtree_control` (cpupoold enables it only below cpupool.slice; `echo +cpuset > {}/cgroup.subtree_control` there, or use a cgroup inside a pool's slice)",
        path.display(), parent.display(), parent.display()
    )]
    CpusetNotEnabled {
        /// The cgroup's directory.
        path: PathBuf,
        /// Its parent's directory.
        parent: PathBuf,
    },
    /// A cgroup to be removed still holds processes.
    #[error("cgroup `{}` still holds processes", path.display())]
    Populated {
        /// The cgroup.
        path: PathBuf,
    },
}

/// Where cgroups are written and processes' thread lists are read from.
#[derive(Debug, Clone)]
pub struct CgroupFs {
    root: PathBuf,
    proc_root: PathBuf,
    /// The kernel's part in the tree: the host's cgroup2, or a simulated one (the sandbox's, a
    /// tree of plain files whose effective CPUs are computed and whose files the first write
    /// creates).
    kernel: &'static dyn CgroupKernel,
    /// The kernel's part in processes' affinities: `sched_setaffinity`, or the sandbox's record
    /// of what would have been set.
    procs: std::sync::Arc<dyn ProcessKernel>,
    /// Reads kept between writes (see `cache`); clones share it, as they share the tree.
    cache: std::sync::Arc<cache::ReadCache>,
}

impl CgroupFs {
    /// A backend writing under `root` (normally `/sys/fs/cgroup`) and finding threads under
    /// `proc_root` (normally `/proc`), on the host's kernel.
    pub fn new(root: impl Into<PathBuf>, proc_root: impl Into<PathBuf>) -> Self {
        CgroupFs {
            root: root.into(),
            proc_root: proc_root.into(),
            kernel: &HostCgroups,
            procs: std::sync::Arc::new(HostProcesses),
            cache: Default::default(),
        }
    }

    /// The same tree, answered by `part`, the chosen kernel's part in this surface
    /// ([`Kernel`](super::kernel::Kernel) bundles the parts and hands each over, `with_kernel`).
    pub fn answered_by(self, part: &'static dyn CgroupKernel) -> CgroupFs {
        CgroupFs { kernel: part, ..self }
    }

    /// The same tree, with processes' affinities set (and read back) by `procs`: the sandbox
    /// records them instead of changing a real process.
    pub fn with_processes(self, procs: std::sync::Arc<dyn ProcessKernel>) -> Self {
        CgroupFs { procs, ..self }
    }

    /// The cgroup root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The procfs root processes are looked up under.
    pub fn proc_root(&self) -> &Path {
        &self.proc_root
    }

    /// The directory of cgroup `path`.
    pub fn dir(&self, path: &CgroupPath) -> PathBuf {
        // CgroupPath has no `..`, no leading `/` and no empty component: this stays under root.
        self.root.join(path.as_str())
    }

    /// Whether a cgroup exists.
    pub fn exists(&self, path: &CgroupPath) -> bool {
        self.dir(path).is_dir()
    }

    /// Creates a cgroup and any missing parents, enabling the cpuset controller in each
    /// parent's `cgroup.subtree_control` first (starting at the root).
    pub fn create(&self, path: &CgroupPath) -> Result<(), HostError> {
        // A new cgroup may be where a target was found to sit, or a partition's sibling.
        self.cache.clear();
        let mut parents = vec![self.root.clone()];
        parents.extend(path.ancestors().iter().map(|a| self.dir(a)));
        let mut dirs = path.ancestors();
        dirs.push(path.clone());
        for (parent, dir) in parents.iter().zip(dirs) {
            self.enable_cpuset(parent)?;
            match self.fs().create_dir(dir.as_str(), 0o755) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(HostError::Dir { op: "creating", path: e.path, source: e.source }),
            }
        }
        Ok(())
    }

    fn enable_cpuset(&self, dir: &Path) -> Result<(), HostError> {
        let file = dir.join("cgroup.subtree_control");
        let current = match fs::read_to_string(&file) {
            Ok(s) => s,
            Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
            Err(source) => return Err(HostError::Io(IoError::Read { path: file, source })),
        };
        if current.split_whitespace().any(|c| c == "cpuset") {
            return Ok(());
        }
        self.write_file(&file, "+cpuset")
    }

    /// Removes a cgroup the daemon created (it must hold no process).
    pub fn remove(&self, path: &CgroupPath) -> Result<(), HostError> {
        self.cache.clear();
        match self.kernel.remove(&self.fs(), path.as_str()) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(HostError::Dir { op: "removing", path: e.path, source: e.source }),
        }
    }

    /// Reads a cgroup's configured `cpuset.cpus`; `None` if the cgroup does not exist.
    pub fn read_cpus(&self, path: &CgroupPath) -> Result<Option<CpuSet>, HostError> {
        self.read_list(path, "cpuset.cpus")
    }

    /// Reads a cgroup's configured `cpuset.mems`; `None` if the cgroup does not exist.
    pub fn read_mems(&self, path: &CgroupPath) -> Result<Option<CpuSet>, HostError> {
        self.read_list(path, "cpuset.mems")
    }

    fn read_list(&self, path: &CgroupPath, name: &str) -> Result<Option<CpuSet>, HostError> {
        if !self.exists(path) {
            return Ok(None);
        }
        self.list_file(path, name).map(Some)
    }

    /// A list file of a cgroup known to exist; a missing file is an empty list.
    pub(super) fn list_file(&self, path: &CgroupPath, name: &str) -> Result<CpuSet, HostError> {
        let file = self.dir(path).join(name);
        let text = match super::read_small(&file) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(CpuSet::new()),
            Err(source) => return Err(HostError::Io(IoError::Read { path: file, source })),
        };
        CpuSet::parse(&text).map_err(|_| HostError::Parse { path: file, text })
    }

    /// Whether a cgroup or any cgroup below it holds a process (`cgroup.events`). A cgroup
    /// without the file (the sandbox) holds none.
    pub fn populated(&self, path: &CgroupPath) -> bool {
        self.events_populated(path) == Some(true)
    }

    /// Whether the kernel says a cgroup and every cgroup below it hold no process
    /// (`populated 0` in `cgroup.events`); `false` where it cannot be read.
    pub fn emptied(&self, path: &CgroupPath) -> bool {
        self.events_populated(path) == Some(false)
    }

    /// The `populated` line of a cgroup's `cgroup.events`; `None` where it cannot be read.
    fn events_populated(&self, path: &CgroupPath) -> Option<bool> {
        let text = fs::read_to_string(self.dir(path).join("cgroup.events")).ok()?;
        text.lines().find_map(|l| match l.trim() {
            "populated 1" => Some(true),
            "populated 0" => Some(false),
            _ => None,
        })
    }

    /// Writes `cpu.max` for a CPU time limit of `millis` millicpus (`None`: no limit).
    pub fn set_quota(&self, path: &CgroupPath, millis: Option<u64>) -> Result<(), HostError> {
        if !self.exists(path) {
            return Ok(());
        }
        let data = match millis {
            // cpu.max is "QUOTA PERIOD" in microseconds; 1000 millicpus = the whole period.
            Some(m) => format!("{} {PERIOD_USEC}", (m * PERIOD_USEC / 1000).max(1000)),
            None => format!("max {PERIOD_USEC}"),
        };
        self.write_file(&self.dir(path).join("cpu.max"), &data)
    }

    /// Lists the pool slices that exist under `top` (to find stale ones).
    pub fn children(&self, top: &CgroupPath) -> Vec<CgroupPath> {
        let Ok(entries) = fs::read_dir(self.dir(top)) else { return Vec::new() };
        entries
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| e.file_name().to_str().and_then(|n| top.join(n).ok()))
            .collect()
    }

    /// Writes a cgroup's `cpuset.cpus`. Emptying it lets the cgroup go (it then follows its
    /// parent), but cgroup v2 refuses to empty a populated cgroup's cpuset (ENOSPC): such a
    /// cgroup gets everything its parent has instead.
    pub fn set_cpus(&self, path: &CgroupPath, cpus: &CpuSet) -> Result<(), HostError> {
        let file = self.dir(path).join("cpuset.cpus");
        self.ensure_cpuset_file(path, &file)?;
        match self.write_file(&file, &cpus.to_string()) {
            Err(HostError::Io(IoError::Write { source, .. }))
                if cpus.is_empty() && source.raw_os_error() == Some(libc::ENOSPC) =>
            {
                let parent = self.dir(path).parent().map(|d| d.join("cpuset.cpus.effective"));
                let Some(parent) = parent else { return Ok(()) };
                let text = fs::read_to_string(&parent)
                    .map_err(|source| HostError::Io(IoError::Read { path: parent.clone(), source }))?;
                self.write_file(&file, text.trim())
            }
            r => r,
        }
    }

    /// Makes sure `file` (a cgroup's `cpuset.cpus`) is there to write: kernfs answers a missing
    /// one with EACCES on open, which would read as "Permission denied". A missing cgroup is
    /// said so; a parent that does not enable the cpuset controller gets it enabled where
    /// cpupoold owns the subtree (below `cpupool.slice`), and is named otherwise. A simulated
    /// tree creates its files on first write, unless the parent's `cgroup.subtree_control`
    /// exists and lacks cpuset.
    fn ensure_cpuset_file(&self, path: &CgroupPath, file: &Path) -> Result<(), HostError> {
        if file.exists() {
            return Ok(());
        }
        let dir = self.dir(path);
        if !dir.is_dir() {
            return Err(HostError::NoSuchCgroup { path: dir });
        }
        let parent = dir.parent().map(Path::to_owned).unwrap_or_else(|| self.root.clone());
        if !self.kernel.cpuset_enabled(&parent) {
            let top = self.root.join(crate::core::plan::TOP_SLICE);
            if !parent.starts_with(&top) {
                return Err(HostError::CpusetNotEnabled { path: dir, parent });
            }
            // Ours: enable it from cpupool.slice down to the parent.
            let mut chain: Vec<PathBuf> =
                parent.ancestors().take_while(|a| a.starts_with(&top)).map(Path::to_owned).collect();
            chain.reverse();
            for d in chain {
                self.enable_cpuset(&d)?;
            }
        }
        if !self.kernel.cpuset_file_ready(file) {
            return Err(HostError::CpusetNotEnabled { path: dir, parent });
        }
        Ok(())
    }

    /// Whether the kubelet's pod cgroup exists (`kubepods.slice`, or `kubepods` with the
    /// cgroupfs driver).
    pub fn kubelet_pods(&self) -> bool {
        super::kubelet::POD_CGROUPS.iter().any(|p| self.root.join(p).is_dir())
    }

    /// Whether `path` is a cgroup outside `cpupool.slice` (a container's, which the runtime
    /// makes and removes) that is gone from the kernel's tree: there is nothing left to
    /// confine, so a write to it is skipped rather than failed and retried. The simulated tree
    /// has no one else to remove cgroups, and makes them on the first write.
    pub fn vanished(&self, path: &CgroupPath) -> bool {
        self.kernel.vanished(self, path)
    }

    /// Executes one planned effect.
    pub fn apply(&self, effect: &Effect) -> Result<(), HostError> {
        match effect {
            Effect::CreateCgroup(path) => self.create(path),
            Effect::RemoveCgroup(path) => self.remove(path),
            Effect::SetCpus { key: Key::Cgroup(path), cpus, optional } => {
                if (*optional && !self.exists(path)) || self.vanished(path) {
                    return Ok(());
                }
                self.set_cpus(path, cpus)
            }
            Effect::SetMems { path, mems, optional } => {
                if (*optional && !self.exists(path)) || self.vanished(path) {
                    return Ok(());
                }
                self.write_file(&self.dir(path).join("cpuset.mems"), &mems.to_string())
            }
            Effect::SetCpus { key: Key::Pid(pid), cpus, optional } => {
                self.set_affinity(*pid, cpus, *optional)
            }
            Effect::SetCpus { key: Key::Unit(unit), .. } => Err(HostError::NoSystemd(unit.clone())),
            Effect::SetPartition { path, partition } => self.set_partition(path, partition),
            Effect::SetQuota { key: Key::Cgroup(path), millis } => self.set_quota(path, *millis),
            Effect::SetQuota { key: Key::Unit(unit), .. } => Err(HostError::NoSystemd(unit.clone())),
            // A process has no CPU time limit of its own: its cgroup has.
            Effect::SetQuota { key: Key::Pid(_), .. } => Ok(()),
        }
    }

    /// What `key` holds now. A cgroup's directory is looked up once and each of its files read
    /// once: a start reads every target cgroup this way.
    pub fn observe(&self, key: &Key) -> Result<Option<super::Observed>, HostError> {
        Ok(match key {
            Key::Cgroup(path) => {
                // Read first, and look for the directory only when the file is missing (a
                // plain directory of the simulated tree has none until it is written).
                let file = self.dir(path).join("cpuset.cpus");
                let cpus = match super::read_small(&file) {
                    Ok(text) => CpuSet::parse(&text).map_err(|_| HostError::Parse { path: file, text })?,
                    Err(e) if e.kind() == io::ErrorKind::NotFound && !self.exists(path) => return Ok(None),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => CpuSet::new(),
                    Err(source) => return Err(HostError::Io(IoError::Read { path: file, source })),
                };
                let mems = self.list_file(path, "cpuset.mems")?;
                let partition = self.partition_of(path, || Ok(cpus.clone()))?;
                Some(super::Observed { cpus, mems, partition })
            }
            Key::Pid(pid) => self.affinity(*pid).map(|cpus| super::Observed { cpus, ..Default::default() }),
            Key::Unit(_) => None,
        })
    }
}

/// The `cpu.max` period: the kernel's default, 100 ms.
const PERIOD_USEC: u64 = 100_000;

impl super::Backend for CgroupFs {
    fn name(&self) -> &'static str {
        "cgroupfs"
    }
    fn apply(&self, effect: &Effect) -> Result<(), HostError> {
        CgroupFs::apply(self, effect)
    }
    fn observe(&self, key: &Key) -> Result<Option<super::Observed>, HostError> {
        CgroupFs::observe(self, key)
    }
    fn children(&self, top: &CgroupPath) -> Vec<CgroupPath> {
        CgroupFs::children(self, top)
    }
    fn partition_status(&self, path: &CgroupPath) -> Option<String> {
        CgroupFs::partition_status(self, path)
    }
    fn kept_partition_status(&self, path: &CgroupPath) -> Option<String> {
        CgroupFs::kept_partition_status(self, path)
    }
    fn remote_partitions(&self) -> bool {
        self.has_exclusive_file()
    }
    fn vanished(&self, path: &CgroupPath) -> bool {
        CgroupFs::vanished(self, path)
    }
    fn kubelet_pods(&self) -> bool {
        CgroupFs::kubelet_pods(self)
    }
    fn process_start(&self, pid: u32) -> Option<u64> {
        CgroupFs::process_start(self, pid)
    }
    fn enforced(&self, key: &Key) -> Result<Option<CpuSet>, HostError> {
        CgroupFs::enforced(self, key)
    }
    fn confinement(&self, key: &Key) -> Result<Option<super::Confinement>, HostError> {
        CgroupFs::confinement(self, key)
    }
    fn can_read_units(&self) -> bool {
        false
    }
    fn refresh(&self) {
        self.forget_reads();
    }
}

impl CgroupFs {
    /// The cgroup root as the one way to write below it: a symbolic link anywhere below the
    /// root (planted by whoever may create cgroups) is refused, never followed.
    fn fs(&self) -> super::fsutil::Root {
        super::fsutil::Root::new(&self.root)
    }

    /// Writes `data` to `path` (a file below the root) in one write(2), as cgroupfs expects. An
    /// empty value is written as a newline: a write of nothing never reaches the kernel, which
    /// would leave a cgroup file as it was. The kernel makes every cgroup file itself, so on a
    /// real cgroupfs a missing file is an error; a simulated one (the sandbox, tests) is plain
    /// files that the first write creates ([`CgroupKernel::write`]).
    fn write_file(&self, path: &Path, data: &str) -> Result<(), HostError> {
        let err =
            |source| HostError::Io(IoError::Write { path: path.to_owned(), data: data.to_owned(), source });
        let rel =
            path.strip_prefix(&self.root).map_err(|_| err(io::Error::from(io::ErrorKind::InvalidInput)))?;
        let bytes = if data.is_empty() { b"\n".as_slice() } else { data.as_bytes() };
        let written = self.kernel.write(&self.fs(), rel, bytes);
        self.wrote(path);
        written.map_err(|e| err(e.source))
    }

    /// Forgets the reads a write of `file` can change (a failed write too: it may have been
    /// taken in part).
    fn wrote(&self, file: &Path) {
        let cgroup = file
            .parent()
            .and_then(|d| d.strip_prefix(&self.root).ok())
            .and_then(Path::to_str)
            .and_then(|r| CgroupPath::new(r).ok());
        match (file.file_name().and_then(|n| n.to_str()), cgroup) {
            // Memory nodes and CPU time change no CPU set and no partition.
            (Some("cpuset.mems" | "cpu.max"), _) => {}
            (Some("cpuset.cpus"), Some(cgroup)) => self.cache.wrote_cpus(&cgroup),
            _ => self.cache.clear(),
        }
    }

    /// Forgets what `effect` can change when someone applied it on this tree's behalf (systemd
    /// setting a unit's properties).
    pub fn forget_after(&self, effect: &Effect) {
        match effect {
            Effect::SetCpus { key: Key::Cgroup(path), .. } => self.cache.wrote_cpus(path),
            Effect::SetCpus { key: Key::Unit(unit), .. } => self.cache.wrote_unit(unit),
            Effect::SetCpus { key: Key::Pid(_), .. } | Effect::SetMems { .. } | Effect::SetQuota { .. } => {}
            Effect::CreateCgroup(_) | Effect::RemoveCgroup(_) | Effect::SetPartition { .. } => {
                self.cache.clear()
            }
        }
    }

    /// Forgets every kept read (the drift check reads the host afresh).
    pub fn forget_reads(&self) {
        self.cache.clear();
    }
}

#[cfg(test)]
mod tests;
