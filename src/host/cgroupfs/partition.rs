//! Partitions: making a cgroup an `isolated` or `root` partition (or a member again), and
//! reading back what the kernel made of it (`cpuset.cpus.partition`, `cpuset.cpus.exclusive`).

use std::fs;

use super::{CgroupFs, HostError};
use crate::core::cpuset::CpuSet;
use crate::core::plan::Partition;
use crate::core::state::CgroupPath;

impl CgroupFs {
    /// Makes a cgroup a partition or a member again. `cpuset.cpus.exclusive` is written where
    /// the kernel has it (6.7+); without it, the parent of isolated partitions becomes a
    /// `root` partition itself, as older kernels require.
    ///
    /// A cgroup outside `cpupool.slice` (a container's) is a remote partition: its ancestors,
    /// which the planner does not manage (the kubelet's slices), are granted its CPUs in their
    /// `cpuset.cpus.exclusive` first, outermost first; when it goes back to member (or is gone
    /// already, with its container), each ancestor keeps only what its children still hold.
    pub fn set_partition(&self, path: &CgroupPath, partition: &Partition) -> Result<(), HostError> {
        let dir = self.dir(path);
        let exclusive = dir.join("cpuset.cpus.exclusive");
        let file = dir.join("cpuset.cpus.partition");
        let remote = path.outside_pools();
        match partition {
            Partition::Member => {
                // A partition is gone with its cgroup.
                if self.exists(path) {
                    self.write_file(&file, "member")?;
                    if exclusive.exists() {
                        self.write_file(&exclusive, "")?;
                    }
                }
                if remote {
                    self.regrant(path)?;
                }
                Ok(())
            }
            Partition::Parent(cpus) if exclusive.exists() => self.write_file(&exclusive, &cpus.to_string()),
            Partition::Parent(_) => self.write_file(&file, "root"),
            // A container's cgroup that is gone: nothing to make a partition of.
            Partition::Isolated(_) if self.vanished(path) => Ok(()),
            Partition::Isolated(cpus) => {
                // CPUs idle when they leave the scheduler's domains stay its idle balancer for
                // good (settle.rs): kept busy until the partition is written. A container's
                // cgroup (remote) holds its processes and no child; it is left as it is.
                let already = self.partition_status(path).as_deref() == Some("isolated");
                let _busy = (!remote && !already).then(|| self.procs.keep_busy(self, path, cpus));
                if exclusive.exists() {
                    if remote {
                        self.grant(path, cpus)?;
                    }
                    self.write_file(&exclusive, &cpus.to_string())?;
                }
                self.write_file(&file, "isolated")
            }
        }
    }

    /// Adds `cpus` to the `cpuset.cpus.exclusive` of every ancestor of `path` below the root,
    /// outermost first (a cgroup's exclusive CPUs must be its parent's).
    fn grant(&self, path: &CgroupPath, cpus: &CpuSet) -> Result<(), HostError> {
        for up in path.ancestors() {
            let held = self.list_file(&up, "cpuset.cpus.exclusive")?;
            if !cpus.is_subset(&held) {
                let file = self.dir(&up).join("cpuset.cpus.exclusive");
                self.write_file(&file, &held.union(cpus).to_string())?;
            }
        }
        Ok(())
    }

    /// Leaves each ancestor of `path` below the root, innermost first, only the exclusive
    /// CPUs its children hold. Ancestors that do not exist, or have no such file, are skipped.
    fn regrant(&self, path: &CgroupPath) -> Result<(), HostError> {
        for up in path.ancestors().into_iter().rev() {
            let file = self.dir(&up).join("cpuset.cpus.exclusive");
            if !file.exists() {
                continue;
            }
            let held = self.list_file(&up, "cpuset.cpus.exclusive")?;
            if held.is_empty() {
                continue;
            }
            let mut want = CpuSet::new();
            for child in self.children(&up) {
                want = want.union(&self.list_file(&child, "cpuset.cpus.exclusive")?);
            }
            if want != held {
                self.write_file(&file, &want.to_string())?;
            }
        }
        Ok(())
    }

    /// The first line of `cpuset.cpus.partition`, `None` if there is none. Read afresh (the
    /// kernel changes it by itself too); replaces what [`CgroupFs::kept_partition_status`] kept.
    pub fn partition_status(&self, path: &CgroupPath) -> Option<String> {
        let at = self.cache.stamp();
        let status = crate::host::read_small(&self.dir(path).join("cpuset.cpus.partition"))
            .ok()
            .map(|text| text.lines().next().unwrap_or("").trim().to_owned());
        self.cache.update_status(at, path, &status);
        status
    }

    /// [`CgroupFs::partition_status`] as last read, unless a write through this backend may
    /// have changed it since (see `cache`): what every published snapshot shows, without
    /// reading each pool's file at every Assign.
    pub fn kept_partition_status(&self, path: &CgroupPath) -> Option<String> {
        if let Some(kept) = self.cache.status(path) {
            return kept;
        }
        let at = self.cache.stamp();
        let status = self.partition_status(path);
        self.cache.keep_status(at, path, &status);
        status
    }

    /// The partition a cgroup is now, as the planner would have written it: a valid
    /// `isolated` one on its CPUs; a parent granting `cpuset.cpus.exclusive`, or a valid
    /// `root` one granting the CPUs of its isolated children.
    pub fn read_partition(&self, path: &CgroupPath) -> Result<Partition, HostError> {
        if !self.exists(path) {
            return Ok(Partition::Member);
        }
        self.partition_of(path, || self.read_cpus(path).map(Option::unwrap_or_default))
    }

    /// [`CgroupFs::read_partition`] of a cgroup known to exist, whose `cpuset.cpus` `cpus`
    /// gives (read only if it is needed, or already read by the caller).
    pub(super) fn partition_of(
        &self,
        path: &CgroupPath,
        cpus: impl FnOnce() -> Result<CpuSet, HostError>,
    ) -> Result<Partition, HostError> {
        let status = self.partition_status(path).unwrap_or_default();
        let exclusive = self.list_file(path, "cpuset.cpus.exclusive")?;
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
}
