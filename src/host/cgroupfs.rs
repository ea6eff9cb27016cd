//! The cgroupfs backend: executes planned effects by writing cgroup v2 files under a root, and
//! process affinity through `sched_setaffinity` (tasks listed under a procfs root).
//!
//! It decides nothing: the planner chose the order, this only writes. Every error carries the
//! path and the data written, e.g. "writing `2-3` to `/sys/fs/cgroup/x/cpuset.cpus`".

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::core::cpuset::CpuSet;
use crate::core::plan::{Effect, Key, Partition};
use crate::core::state::CgroupPath;

/// A host operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// Writing a file failed.
    #[error("writing `{data}` to `{}`", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// What was written.
        data: String,
        /// Why it failed.
        #[source]
        source: io::Error,
    },
    /// Reading a file failed.
    #[error("reading `{}`", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why it failed.
        #[source]
        source: io::Error,
    },
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
    /// Whether `root` is a real cgroup2 mount. Otherwise it is a tree of plain files (the
    /// sandbox, tests), whose effective CPUs are computed by [`simhost::effective_cpus`] and
    /// whose files are created on first write.
    kernel: bool,
    /// The sandbox's simulated process attributes: affinities are recorded in
    /// `DIR/PID/status` (`Cpus_allowed_list:`) instead of being set on the real process.
    sim_procs: Option<PathBuf>,
}

impl CgroupFs {
    /// A backend writing under `root` (normally `/sys/fs/cgroup`) and finding threads under
    /// `proc_root` (normally `/proc`).
    pub fn new(root: impl Into<PathBuf>, proc_root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        let kernel = is_cgroupfs(&root);
        CgroupFs { root, proc_root: proc_root.into(), kernel, sim_procs: None }
    }

    /// Never changes a real process: affinities are recorded under `dir` (the sandbox's
    /// `proc/`) as `DIR/PID/status`, in the kernel's `Cpus_allowed_list:` format, and read
    /// back from there. Processes are still looked up (read-only) under the procfs root.
    pub fn simulated_processes(mut self, dir: impl Into<PathBuf>) -> Self {
        self.sim_procs = Some(dir.into());
        self
    }

    /// The cgroup root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn dir(&self, path: &CgroupPath) -> PathBuf {
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
            Err(source) => return Err(HostError::Read { path: file, source }),
        };
        if current.split_whitespace().any(|c| c == "cpuset") {
            return Ok(());
        }
        self.write_file(&file, "+cpuset")
    }

    /// Removes a cgroup the daemon created (it must hold no process).
    pub fn remove(&self, path: &CgroupPath) -> Result<(), HostError> {
        let dir = self.dir(path);
        let failed =
            |e: super::fsutil::FsError| HostError::Dir { op: "removing", path: e.path, source: e.source };
        match self.fs().remove_dir(path.as_str()) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            // A simulated cgroupfs (the sandbox) holds plain files that the kernel would not
            // let anyone create: remove them too.
            Err(e) if e.kind() == io::ErrorKind::DirectoryNotEmpty && !is_cgroupfs(&dir) => {
                self.fs().remove_dir_all(path.as_str()).map_err(failed)
            }
            Err(e) => Err(failed(e)),
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
        let file = self.dir(path).join(name);
        let text = match fs::read_to_string(&file) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Some(CpuSet::new())),
            Err(source) => return Err(HostError::Read { path: file, source }),
        };
        CpuSet::parse(&text).map(Some).map_err(|_| HostError::Parse { path: file, text })
    }

    /// Whether a cgroup or any cgroup below it holds a process (`cgroup.events`). A cgroup
    /// without the file (the sandbox) holds none.
    pub fn populated(&self, path: &CgroupPath) -> bool {
        fs::read_to_string(self.dir(path).join("cgroup.events"))
            .is_ok_and(|t| t.lines().any(|l| l.trim() == "populated 1"))
    }

    /// Makes a cgroup a partition or a member again. `cpuset.cpus.exclusive` is written where
    /// the kernel has it (6.7+); without it, the parent of isolated partitions becomes a
    /// `root` partition itself, as older kernels require.
    pub fn set_partition(&self, path: &CgroupPath, partition: &Partition) -> Result<(), HostError> {
        let dir = self.dir(path);
        let exclusive = dir.join("cpuset.cpus.exclusive");
        let file = dir.join("cpuset.cpus.partition");
        match partition {
            Partition::Member => {
                self.write_file(&file, "member")?;
                if exclusive.exists() {
                    self.write_file(&exclusive, "")?;
                }
                Ok(())
            }
            Partition::Parent(cpus) if exclusive.exists() => self.write_file(&exclusive, &cpus.to_string()),
            Partition::Parent(_) => self.write_file(&file, "root"),
            Partition::Isolated(cpus) => {
                if exclusive.exists() {
                    self.write_file(&exclusive, &cpus.to_string())?;
                }
                self.write_file(&file, "isolated")
            }
        }
    }

    /// The first line of `cpuset.cpus.partition`, `None` if there is none.
    pub fn partition_status(&self, path: &CgroupPath) -> Option<String> {
        let text = fs::read_to_string(self.dir(path).join("cpuset.cpus.partition")).ok()?;
        Some(text.lines().next().unwrap_or("").trim().to_owned())
    }

    /// The partition a cgroup is now, as the planner would have written it: a valid
    /// `isolated` one on its CPUs; a parent granting `cpuset.cpus.exclusive`, or a valid
    /// `root` one granting the CPUs of its isolated children.
    pub fn read_partition(&self, path: &CgroupPath) -> Result<Partition, HostError> {
        let status = self.partition_status(path).unwrap_or_default();
        let cpus = || self.read_cpus(path).map(Option::unwrap_or_default);
        let exclusive = self.read_list(path, "cpuset.cpus.exclusive")?.unwrap_or_default();
        Ok(match status.as_str() {
            "isolated" => Partition::Isolated(if exclusive.is_empty() { cpus()? } else { exclusive }),
            "root" => {
                let mut granted = CpuSet::new();
                for child in self.children(path) {
                    if self.partition_status(&child).as_deref() == Some("isolated") {
                        granted = granted.union(&self.read_cpus(&child)?.unwrap_or_default());
                    }
                }
                Partition::Parent(granted)
            }
            _ if !exclusive.is_empty() => Partition::Parent(exclusive),
            _ => Partition::Member,
        })
    }

    /// Whether the kernel has `cpuset.cpus.exclusive`: some cgroup directly below the root
    /// that has `cpuset.cpus` has it too.
    pub fn has_exclusive_file(&self) -> bool {
        let Ok(entries) = fs::read_dir(&self.root) else { return false };
        entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|d| d.join("cpuset.cpus").exists())
            .is_some_and(|d| d.join("cpuset.cpus.exclusive").exists())
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

    /// When process `pid` started: field 22 of `/proc/PID/stat`, in clock ticks since boot.
    pub fn process_start(&self, pid: u32) -> Option<u64> {
        let stat = fs::read_to_string(self.proc_root.join(pid.to_string()).join("stat")).ok()?;
        // The command name (field 2) is in parentheses and may hold spaces or `)`: fields
        // after it are counted from the last `)`.
        let rest = &stat[stat.rfind(')')? + 1..];
        rest.split_whitespace().nth(19)?.parse().ok()
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
            Err(HostError::Write { source, .. })
                if cpus.is_empty() && source.raw_os_error() == Some(libc::ENOSPC) =>
            {
                let parent = self.dir(path).parent().map(|d| d.join("cpuset.cpus.effective"));
                let Some(parent) = parent else { return Ok(()) };
                let text = fs::read_to_string(&parent)
                    .map_err(|source| HostError::Read { path: parent.clone(), source })?;
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
        let enabled = |p: &Path| match fs::read_to_string(p.join("cgroup.subtree_control")) {
            Ok(t) => t.split_whitespace().any(|c| c.trim_start_matches('+') == "cpuset"),
            // A plain directory of a simulated tree: nothing says the controller is off.
            Err(_) => !self.kernel,
        };
        if !enabled(&parent) {
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
        if self.kernel && !file.exists() {
            return Err(HostError::CpusetNotEnabled { path: dir, parent });
        }
        Ok(())
    }

    /// The CPUs the kernel lets cgroup `path` use (`cpuset.cpus.effective`; a cgroup without
    /// the file uses its parent's). `None` if the cgroup does not exist, or the cpuset
    /// controller is not on this hierarchy at all.
    pub fn effective(&self, path: &CgroupPath) -> Result<Option<CpuSet>, HostError> {
        if !self.kernel {
            return Ok(super::simhost::effective_cpus(&self.root, path));
        }
        let dir = self.dir(path);
        if !dir.is_dir() {
            return Ok(None);
        }
        self.effective_at(&dir)
    }

    fn effective_at(&self, dir: &Path) -> Result<Option<CpuSet>, HostError> {
        for d in dir.ancestors().take_while(|d| d.starts_with(&self.root)) {
            let file = d.join("cpuset.cpus.effective");
            match fs::read_to_string(&file) {
                Ok(text) => {
                    return CpuSet::parse(text.trim())
                        .map(Some)
                        .map_err(|_| HostError::Parse { path: file, text })
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(source) => return Err(HostError::Read { path: file, source }),
            }
        }
        Ok(None)
    }

    /// Where `key` sits and the CPUs the kernel lets it use there: a cgroup's parent (the
    /// nearest that exists), a process's own cgroup. `None` where that cannot be known (units,
    /// the sandbox's processes, a host without the cpuset controller).
    pub fn confinement(&self, key: &Key) -> Result<Option<super::Confinement>, HostError> {
        match key {
            Key::Cgroup(path) => self.nearest(path.ancestors().last()),
            Key::Pid(pid) if self.sim_procs.is_none() => {
                let file = self.proc_root.join(pid.to_string()).join("cgroup");
                let Ok(text) = fs::read_to_string(&file) else { return Ok(None) };
                // cgroup v2: the one line "0::/path".
                let Some(rel) = text.lines().find_map(|l| l.strip_prefix("0::")) else { return Ok(None) };
                let rel = rel.trim().trim_start_matches('/');
                let cpus = match CgroupPath::new(rel) {
                    Ok(p) => self.effective(&p)?,
                    Err(_) if self.kernel => self.effective_at(&self.root)?,
                    Err(_) => None,
                };
                let name = if rel.is_empty() { "/".to_owned() } else { rel.to_owned() };
                Ok(cpus.map(|cpus| super::Confinement { parent: name, cpus }))
            }
            _ => Ok(None),
        }
    }

    /// The nearest cgroup that exists at or above `path` (`None`: the root) and its effective
    /// CPUs: where something in `path` would sit.
    pub fn nearest(&self, path: Option<&CgroupPath>) -> Result<Option<super::Confinement>, HostError> {
        let mut chain: Vec<CgroupPath> = path.map(|p| p.ancestors()).unwrap_or_default();
        chain.extend(path.cloned());
        let found = chain.into_iter().rev().find(|a| self.exists(a));
        let cpus = match &found {
            Some(p) => self.effective(p)?,
            None if self.kernel => self.effective_at(&self.root)?,
            None => Some(super::simhost::root_effective(&self.root)),
        };
        let name = found.map_or_else(|| "/".to_owned(), |p| p.to_string());
        Ok(cpus.map(|cpus| super::Confinement { parent: name, cpus }))
    }

    /// What the kernel enforces on `key` now: a cgroup's effective CPUs, a process's affinity.
    pub fn enforced(&self, key: &Key) -> Result<Option<CpuSet>, HostError> {
        match key {
            Key::Cgroup(path) => self.effective(path),
            Key::Pid(pid) => Ok(self.affinity(*pid)),
            Key::Unit(_) => Ok(None),
        }
    }

    /// Executes one planned effect.
    pub fn apply(&self, effect: &Effect) -> Result<(), HostError> {
        match effect {
            Effect::CreateCgroup(path) => self.create(path),
            Effect::RemoveCgroup(path) => self.remove(path),
            Effect::SetCpus { key: Key::Cgroup(path), cpus, optional } => {
                if *optional && !self.exists(path) {
                    return Ok(());
                }
                self.set_cpus(path, cpus)
            }
            Effect::SetMems { path, mems, optional } => {
                if *optional && !self.exists(path) {
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

    /// What `key` holds now.
    pub fn observe(&self, key: &Key) -> Result<Option<super::Observed>, HostError> {
        Ok(match key {
            Key::Cgroup(path) => match self.read_cpus(path)? {
                None => None,
                Some(cpus) => Some(super::Observed {
                    cpus,
                    mems: self.read_mems(path)?.unwrap_or_default(),
                    partition: self.read_partition(path)?,
                }),
            },
            Key::Pid(pid) => self.affinity(*pid).map(|cpus| super::Observed { cpus, ..Default::default() }),
            Key::Unit(_) => None,
        })
    }

    /// Sets the affinity of every thread of `pid`. Empty `cpus` means every CPU (the kernel
    /// still confines the threads to their cpuset). A process that is gone is not an error
    /// when `optional`.
    pub fn set_affinity(&self, pid: u32, cpus: &CpuSet, optional: bool) -> Result<(), HostError> {
        if let Some(dir) = &self.sim_procs {
            return self.set_sim_affinity(dir, pid, cpus, optional);
        }
        let mut set = nix::sched::CpuSet::new();
        let all = CpuSet::range(0, (nix::sched::CpuSet::count() as u32).saturating_sub(1));
        let cpus = if cpus.is_empty() { &all } else { cpus };
        for cpu in cpus.iter() {
            // Beyond what the kernel's mask holds there is nothing to set.
            let _ = set.set(cpu as usize);
        }
        let task_dir = self.proc_root.join(pid.to_string()).join("task");
        let tids: Vec<u32> = match fs::read_dir(&task_dir) {
            Ok(entries) => {
                entries.filter_map(Result::ok).filter_map(|e| e.file_name().to_str()?.parse().ok()).collect()
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound && optional => return Ok(()),
            Err(source) => return Err(HostError::Read { path: task_dir, source }),
        };
        for tid in tids {
            let tid_i = i32::try_from(tid).unwrap_or(i32::MAX);
            match nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(tid_i), &set) {
                Ok(()) => {}
                // A thread that exited between listing and setting is fine.
                Err(nix::Error::ESRCH) => {}
                Err(source) => return Err(HostError::Affinity { pid, tid, cpus: cpus.to_string(), source }),
            }
        }
        Ok(())
    }

    /// The sandbox's `sched_setaffinity`: records `cpus` (empty: every simulated CPU) as the
    /// process's `Cpus_allowed_list` under `dir`, after checking that the process exists.
    fn set_sim_affinity(&self, dir: &Path, pid: u32, cpus: &CpuSet, optional: bool) -> Result<(), HostError> {
        let proc_dir = self.proc_root.join(pid.to_string());
        if !proc_dir.is_dir() {
            if optional {
                return Ok(());
            }
            return Err(HostError::Read { path: proc_dir, source: io::Error::from(io::ErrorKind::NotFound) });
        }
        let all = self.effective_at_root();
        let cpus = if cpus.is_empty() { &all } else { cpus };
        // Inside the sandbox only, and never through a link planted there.
        let root = super::fsutil::Root::new(dir);
        let data = format!("Cpus_allowed_list:\t{cpus}\n");
        let status = dir.join(pid.to_string()).join("status");
        let err = |e: super::fsutil::FsError| HostError::Write {
            path: status.clone(),
            data: data.clone(),
            source: e.source,
        };
        root.create_dir_all(pid.to_string(), 0o755).map_err(err)?;
        root.write_or_create(format!("{pid}/status"), data.as_bytes(), 0o644).map_err(err)
    }

    fn effective_at_root(&self) -> CpuSet {
        fs::read_to_string(self.root.join("cpuset.cpus.effective"))
            .ok()
            .and_then(|t| CpuSet::parse(t.trim()).ok())
            .unwrap_or_default()
    }

    /// The affinity of `pid`'s main thread, `None` if it is gone.
    pub fn affinity(&self, pid: u32) -> Option<CpuSet> {
        if let Some(dir) = &self.sim_procs {
            if !self.proc_root.join(pid.to_string()).is_dir() {
                return None;
            }
            let text = fs::read_to_string(dir.join(pid.to_string()).join("status")).unwrap_or_default();
            let listed = text.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:"));
            return Some(
                listed.and_then(|l| CpuSet::parse(l.trim()).ok()).unwrap_or_else(|| self.effective_at_root()),
            );
        }
        let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).ok()?);
        let set = nix::sched::sched_getaffinity(pid).ok()?;
        Some(
            (0..nix::sched::CpuSet::count())
                .filter(|c| set.is_set(*c).unwrap_or(false))
                .map(|c| c as u32)
                .collect(),
        )
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
    fn remote_partitions(&self) -> bool {
        self.has_exclusive_file()
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
}

fn is_cgroupfs(dir: &Path) -> bool {
    nix::sys::statfs::statfs(dir)
        .map(|s| s.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC)
        .unwrap_or(false)
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
    /// files that the first write creates.
    fn write_file(&self, path: &Path, data: &str) -> Result<(), HostError> {
        let err = |source| HostError::Write { path: path.to_owned(), data: data.to_owned(), source };
        let rel =
            path.strip_prefix(&self.root).map_err(|_| err(io::Error::from(io::ErrorKind::InvalidInput)))?;
        let bytes = if data.is_empty() { b"\n".as_slice() } else { data.as_bytes() };
        let written = if self.kernel {
            self.fs().write(rel, bytes)
        } else {
            self.fs().write_or_create(rel, bytes, 0o644)
        };
        written.map_err(|e| err(e.source))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cg(s: &str) -> CgroupPath {
        CgroupPath::new(s).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn creates_with_cpuset_enabled_along_the_path_and_writes_files() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let fs_ = CgroupFs::new(dir.path(), "/proc");
        let p = cg("cpupool.slice/cpupool-dp.slice");
        fs_.apply(&Effect::CreateCgroup(p.clone())).unwrap_or_else(|e| panic!("{e}"));
        for sub in ["", "cpupool.slice"] {
            let ctl =
                fs::read_to_string(dir.path().join(sub).join("cgroup.subtree_control")).unwrap_or_default();
            assert_eq!(ctl, "+cpuset", "{sub}");
        }
        let set = CpuSet::parse("2-3").unwrap_or_default();
        fs_.apply(&Effect::SetCpus { key: Key::Cgroup(p.clone()), cpus: set.clone(), optional: false })
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            fs::read_to_string(dir.path().join(p.as_str()).join("cpuset.cpus")).unwrap_or_default(),
            "2-3"
        );
        assert_eq!(fs_.read_cpus(&p).ok().flatten(), Some(set));
        assert_eq!(fs_.read_cpus(&cg("nope")).ok().flatten(), None);
        assert_eq!(fs_.children(&cg("cpupool.slice")), vec![p.clone()]);
        // Optional writes to missing cgroups are skipped; required ones fail naming path+data.
        fs_.apply(&Effect::SetCpus {
            key: Key::Cgroup(cg("machine.slice")),
            cpus: CpuSet::range(0, 0),
            optional: true,
        })
        .unwrap_or_else(|e| panic!("{e}"));
        let err = fs_
            .apply(&Effect::SetCpus {
                key: Key::Cgroup(cg("missing/x")),
                cpus: CpuSet::range(0, 1),
                optional: false,
            })
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.starts_with("no cgroup `") && err.ends_with("missing/x`"), "{err}");
        fs_.apply(&Effect::RemoveCgroup(p.clone())).unwrap_or_else(|e| panic!("{e}"));
        assert!(!fs_.exists(&p));
    }

    /// A missing cpuset.cpus is said as what it is: no cgroup, or a parent without the cpuset
    /// controller (enabled by cpupoold below cpupool.slice only), never "Permission denied".
    #[test]
    fn a_missing_cpuset_file_names_the_cgroup_or_the_parent_without_the_controller() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let fs_ = CgroupFs::new(dir.path(), "/proc");
        let two = CpuSet::range(2, 2);
        let err = fs_.set_cpus(&cg("nope/x"), &two).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.starts_with("no cgroup `") && err.ends_with("nope/x`"), "{err}");
        // Outside cpupool.slice: the parent's subtree_control lacks cpuset; named, not enabled.
        fs::create_dir_all(dir.path().join("work/app")).unwrap_or_else(|e| panic!("{e}"));
        fs::write(dir.path().join("work/cgroup.subtree_control"), "cpu\n").unwrap_or_else(|e| panic!("{e}"));
        let err = fs_.set_cpus(&cg("work/app"), &two).err();
        assert!(matches!(err, Some(HostError::CpusetNotEnabled { .. })), "{err:?}");
        let text = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(text.contains("work/cgroup.subtree_control"), "{text}");
        assert!(!dir.path().join("work/app/cpuset.cpus").exists());
        assert_eq!(
            fs::read_to_string(dir.path().join("work/cgroup.subtree_control")).unwrap_or_default(),
            "cpu\n"
        );
        // Inside cpupool.slice (ours): enabled along the way, then written.
        fs_.create(&cg("cpupool.slice/cpupool-dp.slice")).unwrap_or_else(|e| panic!("{e}"));
        let slice = dir.path().join("cpupool.slice/cpupool-dp.slice");
        fs::create_dir_all(slice.join("app")).unwrap_or_else(|e| panic!("{e}"));
        fs::write(slice.join("cgroup.subtree_control"), "\n").unwrap_or_else(|e| panic!("{e}"));
        fs_.set_cpus(&cg("cpupool.slice/cpupool-dp.slice/app"), &two).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(fs::read_to_string(slice.join("cgroup.subtree_control")).unwrap_or_default(), "+cpuset");
        assert_eq!(fs::read_to_string(slice.join("app/cpuset.cpus")).unwrap_or_default(), "2");
    }

    #[test]
    fn partitions_on_kernels_with_and_without_cpuset_cpus_exclusive() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let fs_ = CgroupFs::new(dir.path(), "/proc");
        let top = cg("cpupool.slice");
        let dp = cg("cpupool.slice/cpupool-dp.slice");
        fs_.create(&dp).unwrap_or_else(|e| panic!("{e}"));
        let two_three = CpuSet::range(2, 3);
        for p in [&top, &dp] {
            fs::write(dir.path().join(p.as_str()).join("cpuset.cpus"), "2-3\n")
                .unwrap_or_else(|e| panic!("{e}"));
        }
        // Without cpuset.cpus.exclusive (6.1): the parent becomes a root partition.
        fs_.set_partition(&top, &Partition::Parent(two_three.clone())).unwrap_or_else(|e| panic!("{e}"));
        fs_.set_partition(&dp, &Partition::Isolated(two_three.clone())).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(fs_.partition_status(&top).as_deref(), Some("root"));
        assert_eq!(fs_.partition_status(&dp).as_deref(), Some("isolated"));
        assert_eq!(fs_.read_partition(&top).ok(), Some(Partition::Parent(two_three.clone())));
        assert_eq!(fs_.read_partition(&dp).ok(), Some(Partition::Isolated(two_three.clone())));
        // An invalid partition reads as a member, so the plan writes it again.
        fs::write(
            dir.path().join(dp.as_str()).join("cpuset.cpus.partition"),
            "isolated invalid (Cpu list in cpuset.cpus not exclusive)\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(fs_.read_partition(&dp).ok(), Some(Partition::Member));
        // With it (6.7+): the parent only grants the CPUs.
        for p in [&top, &dp] {
            fs::write(dir.path().join(p.as_str()).join("cpuset.cpus.exclusive"), "\n")
                .unwrap_or_else(|e| panic!("{e}"));
            fs_.set_partition(p, &Partition::Member).unwrap_or_else(|e| panic!("{e}"));
        }
        fs_.set_partition(&top, &Partition::Parent(two_three.clone())).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(fs_.partition_status(&top).as_deref(), Some("member"));
        assert_eq!(fs_.read_partition(&top).ok(), Some(Partition::Parent(two_three.clone())));
        fs_.set_partition(&dp, &Partition::Isolated(two_three.clone())).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            fs::read_to_string(dir.path().join(dp.as_str()).join("cpuset.cpus.exclusive"))
                .unwrap_or_default(),
            "2-3"
        );
        assert!(fs_.has_exclusive_file());
    }

    #[test]
    fn process_start_time_survives_odd_command_names() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        fs::create_dir_all(dir.path().join("42")).unwrap_or_else(|e| panic!("{e}"));
        // From proc(5): pid (comm) state ppid ... starttime is field 22.
        let fields: Vec<String> = (4..=52).map(|i| i.to_string()).collect();
        let stat = format!("42 (a) b (c)) S {}\n", fields.join(" "));
        fs::write(dir.path().join("42/stat"), stat).unwrap_or_else(|e| panic!("{e}"));
        let fs_ = CgroupFs::new(dir.path(), dir.path());
        assert_eq!(fs_.process_start(42), Some(22));
        assert_eq!(fs_.process_start(43), None);
        let me = CgroupFs::new("/nonexistent", "/proc");
        assert!(me.process_start(std::process::id()).is_some());
    }

    #[test]
    fn affinity_of_a_child_process() {
        let fs_ = CgroupFs::new("/nonexistent", "/proc");
        let mut child =
            std::process::Command::new("sleep").arg("30").spawn().unwrap_or_else(|e| panic!("{e}"));
        let pid = child.id();
        let before = fs_.affinity(pid).unwrap_or_default();
        let first = before.first().unwrap_or(0);
        let one = CpuSet::range(first, first);
        fs_.set_affinity(pid, &one, false).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(fs_.affinity(pid), Some(one));
        // Empty lifts the restriction: back to every CPU the process may use.
        fs_.set_affinity(pid, &CpuSet::new(), false).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(fs_.affinity(pid), Some(before));
        let _ = child.kill();
        let _ = child.wait();
        assert!(fs_.set_affinity(pid, &CpuSet::range(0, 0), true).is_ok());
        assert!(fs_.set_affinity(pid, &CpuSet::range(0, 0), false).is_err());
    }
}
