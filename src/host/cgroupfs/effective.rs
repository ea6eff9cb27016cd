//! Reading back what the kernel enforces: a cgroup's `cpuset.cpus.effective` (or its nearest
//! ancestor's), and where a cgroup or process sits and the CPUs it may use there.

use std::fs;
use std::io;
use std::path::Path;

use super::{CgroupFs, HostError};
use crate::core::cpuset::CpuSet;
use crate::core::plan::Key;
use crate::core::state::CgroupPath;
use crate::host::{simhost, Confinement};

impl CgroupFs {
    /// The CPUs the kernel lets cgroup `path` use (`cpuset.cpus.effective`; a cgroup without
    /// the file uses its parent's). `None` if the cgroup does not exist, or the cpuset
    /// controller is not on this hierarchy at all.
    pub fn effective(&self, path: &CgroupPath) -> Result<Option<CpuSet>, HostError> {
        if !self.kernel {
            return Ok(self.sim_effective(path));
        }
        let dir = self.dir(path);
        if !dir.is_dir() {
            return Ok(None);
        }
        self.effective_at(&dir)
    }

    /// [`simhost::effective_cpus`], from the kept partitions and parent: a cgroup that is not a
    /// partition has its own `cpuset.cpus` within its parent's effective CPUs, so only its own
    /// file is read (its parent's were read when it was admitted, and are kept until a write).
    fn sim_effective(&self, path: &CgroupPath) -> Option<CpuSet> {
        if !self.exists(path) {
            return None;
        }
        let partitions = self.sim_partitions();
        if partitions.contains(path) {
            return Some(simhost::effective_in(&self.root, Some(path), &partitions));
        }
        let parent = match self.nearest(path.ancestors().last()) {
            Ok(Some(c)) => c.cpus,
            _ => return Some(simhost::effective_in(&self.root, Some(path), &partitions)),
        };
        let own = crate::host::read_small(&self.dir(path).join("cpuset.cpus"))
            .ok()
            .and_then(|t| CpuSet::parse(t.trim()).ok())
            .unwrap_or_default();
        Some(simhost::below(&parent, &own))
    }

    /// A simulated tree's partitions, kept until a write can change them.
    fn sim_partitions(&self) -> std::sync::Arc<simhost::Partitions> {
        if let Some(kept) = self.cache.partitions() {
            return kept;
        }
        let at = self.cache.stamp();
        let read = std::sync::Arc::new(simhost::partitions(&self.root));
        self.cache.keep_partitions(at, read.clone());
        read
    }

    fn effective_at(&self, dir: &Path) -> Result<Option<CpuSet>, HostError> {
        for d in dir.ancestors().take_while(|d| d.starts_with(&self.root)) {
            let file = d.join("cpuset.cpus.effective");
            match crate::host::read_small(&file) {
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
    pub fn confinement(&self, key: &Key) -> Result<Option<Confinement>, HostError> {
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
                Ok(cpus.map(|cpus| Confinement { parent: name, cpus }))
            }
            _ => Ok(None),
        }
    }

    /// The nearest cgroup that exists at or above `path` (`None`: the root) and its effective
    /// CPUs: where something in `path` would sit.
    ///
    /// Kept until a write can change it (see `cache`) when `path` exists (a cgroup created
    /// later below what was found would be missed otherwise).
    pub fn nearest(&self, path: Option<&CgroupPath>) -> Result<Option<Confinement>, HostError> {
        if let Some(kept) = self.cache.nearest(path) {
            return Ok(kept);
        }
        let at = self.cache.stamp();
        let found = self.find_nearest(path)?;
        let exists = match (path, &found) {
            (None, _) => true,
            (Some(p), Some(c)) => c.parent == p.as_str(),
            (Some(_), None) => false,
        };
        if exists {
            self.cache.keep_nearest(at, path, &found);
        }
        Ok(found)
    }

    fn find_nearest(&self, path: Option<&CgroupPath>) -> Result<Option<Confinement>, HostError> {
        let mut chain: Vec<CgroupPath> = path.map(|p| p.ancestors()).unwrap_or_default();
        chain.extend(path.cloned());
        let found = chain.into_iter().rev().find(|a| self.exists(a));
        let cpus = match &found {
            Some(p) => self.effective(p)?,
            None if self.kernel => self.effective_at(&self.root)?,
            None => Some(simhost::effective_in(&self.root, None, &self.sim_partitions())),
        };
        let name = found.map_or_else(|| "/".to_owned(), |p| p.to_string());
        Ok(cpus.map(|cpus| Confinement { parent: name, cpus }))
    }

    /// What the kernel enforces on `key` now: a cgroup's effective CPUs, a process's affinity.
    pub fn enforced(&self, key: &Key) -> Result<Option<CpuSet>, HostError> {
        match key {
            Key::Cgroup(path) => self.effective(path),
            Key::Pid(pid) => Ok(self.affinity(*pid)),
            Key::Unit(_) => Ok(None),
        }
    }
}
