//! Reading back what the kernel enforces: a cgroup's `cpuset.cpus.effective` (or its nearest
//! ancestor's), and where a cgroup or process sits and the CPUs it may use there.

use std::io;
use std::path::Path;

use std::sync::Arc;

use super::{CgroupFs, HostError, Partitions};
use crate::core::cpuset::CpuSet;
use crate::core::plan::Key;
use crate::core::state::CgroupPath;
use crate::host::{Confinement, IoError};

impl CgroupFs {
    /// The CPUs the kernel lets cgroup `path` use (`cpuset.cpus.effective`; a cgroup without
    /// the file uses its parent's). `None` if the cgroup does not exist, or the cpuset
    /// controller is not on this hierarchy at all.
    pub fn effective(&self, path: &CgroupPath) -> Result<Option<CpuSet>, HostError> {
        self.kernel.effective(self, path)
    }

    /// A tree's partitions as its kernel computes them (`read`), kept until a write can change
    /// them: for a simulated kernel, which has no `cpuset.cpus.effective` files to read.
    pub fn kept_partitions(&self, read: impl FnOnce() -> Partitions) -> Arc<Partitions> {
        if let Some(kept) = self.cache.partitions() {
            return kept;
        }
        let at = self.cache.stamp();
        let read = Arc::new(read());
        self.cache.keep_partitions(at, read.clone());
        read
    }

    /// The effective CPUs the host's kernel shows at `dir` or its nearest ancestor below the
    /// root that has the file.
    pub(super) fn effective_at(&self, dir: &Path) -> Result<Option<CpuSet>, HostError> {
        for d in dir.ancestors().take_while(|d| d.starts_with(&self.root)) {
            let file = d.join("cpuset.cpus.effective");
            match crate::host::read_small(&file) {
                Ok(text) => {
                    return CpuSet::parse(text.trim())
                        .map(Some)
                        .map_err(|_| HostError::Parse { path: file, text })
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(source) => return Err(HostError::Io(IoError::Read { path: file, source })),
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
            Key::Pid(pid) => {
                let Some(rel) = self.procs.cgroup(self, *pid) else { return Ok(None) };
                let cpus = match CgroupPath::new(&rel) {
                    Ok(p) => self.effective(&p)?,
                    Err(_) => self.kernel.root_effective(self)?,
                };
                let name = if rel.is_empty() { "/".to_owned() } else { rel };
                Ok(cpus.map(|cpus| Confinement { parent: name, cpus }))
            }
            Key::Unit(_) => Ok(None),
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
            None => self.kernel.root_effective(self)?,
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
