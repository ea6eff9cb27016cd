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
            return Ok(simhost::effective_cpus(&self.root, path));
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
    pub fn nearest(&self, path: Option<&CgroupPath>) -> Result<Option<Confinement>, HostError> {
        let mut chain: Vec<CgroupPath> = path.map(|p| p.ancestors()).unwrap_or_default();
        chain.extend(path.cloned());
        let found = chain.into_iter().rev().find(|a| self.exists(a));
        let cpus = match &found {
            Some(p) => self.effective(p)?,
            None if self.kernel => self.effective_at(&self.root)?,
            None => Some(simhost::root_effective(&self.root)),
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
