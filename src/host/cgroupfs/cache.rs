//! What the backend remembers of the cgroup tree between its own writes: where a target's
//! parent sits and the CPUs it has (admission), the kernel's word on partitions (published after
//! every change), and a simulated tree's partitions. These change when a commit, a reload or a
//! drift correction writes the pool level, or when someone else changes the host; so every
//! write through the backend forgets what it can change, and the drift check forgets it all
//! before it reads ([`crate::host::Backend::refresh`]). A target's own effective CPUs are never
//! kept: every read-back reads them.
//!
//! Without it, an Assign walked the tree from the root twice (admission, read-back) and read
//! each pool's partition file to publish: ~38 files opened per Assign on the sandbox, ~10 of
//! them missing.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::core::cpuset::CpuSet;
use crate::core::plan::TOP_SLICE;
use crate::core::state::CgroupPath;
use crate::host::Confinement;

/// The valid partitions of a tree, by path relative to its root, with the CPUs granted to each:
/// what a simulated kernel computes effective CPUs from ([`super::CgroupFs::kept_partitions`]).
/// They change only when a partition file, a `cpuset.cpus.exclusive` or the `cpuset.cpus` of a
/// partition is written, or a cgroup in the first two levels comes or goes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Partitions(pub Vec<(String, CpuSet)>);

impl Partitions {
    /// Whether `path` is one of them.
    pub fn contains(&self, path: &CgroupPath) -> bool {
        self.0.iter().any(|(p, _)| p == path.as_str())
    }
}

/// The remembered reads, shared by clones of one backend (they write the same tree).
#[derive(Debug, Default)]
pub(super) struct ReadCache {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Bumped by every forgetting: a read that began before it is not kept (it may have seen
    /// the tree before a write).
    generation: u64,
    /// [`super::CgroupFs::nearest`] of an existing cgroup, by its path (`""`: the root). In
    /// order, so that what is at or below a path is one range.
    nearest: BTreeMap<String, Option<Confinement>>,
    /// [`super::CgroupFs::kept_partition_status`], by path.
    status: BTreeMap<String, Option<String>>,
    /// A simulated tree's partitions.
    partitions: Option<Arc<Partitions>>,
}

/// Where a read began, to keep its result only if nothing was forgotten since.
#[derive(Debug, Clone, Copy)]
pub(super) struct Stamp(u64);

impl ReadCache {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Plain maps: a panic elsewhere leaves nothing half-done that matters.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn stamp(&self) -> Stamp {
        Stamp(self.lock().generation)
    }

    pub(super) fn nearest(&self, path: Option<&CgroupPath>) -> Option<Option<Confinement>> {
        self.lock().nearest.get(key(path)).cloned()
    }

    pub(super) fn keep_nearest(&self, at: Stamp, path: Option<&CgroupPath>, value: &Option<Confinement>) {
        let mut c = self.lock();
        if c.generation == at.0 {
            c.nearest.insert(key(path).to_owned(), value.clone());
        }
    }

    pub(super) fn status(&self, path: &CgroupPath) -> Option<Option<String>> {
        self.lock().status.get(path.as_str()).cloned()
    }

    pub(super) fn keep_status(&self, at: Stamp, path: &CgroupPath, value: &Option<String>) {
        let mut c = self.lock();
        if c.generation == at.0 {
            c.status.insert(path.as_str().to_owned(), value.clone());
        }
    }

    /// A fresh read of a status: replaces the kept one, if one is kept (only those published
    /// are: the drift check reads every target's, which would make the map as large as the
    /// state, and every write walk it).
    pub(super) fn update_status(&self, at: Stamp, path: &CgroupPath, value: &Option<String>) {
        let mut c = self.lock();
        if c.generation == at.0 {
            if let Some(kept) = c.status.get_mut(path.as_str()) {
                kept.clone_from(value);
            }
        }
    }

    pub(super) fn partitions(&self) -> Option<Arc<Partitions>> {
        self.lock().partitions.clone()
    }

    pub(super) fn keep_partitions(&self, at: Stamp, value: Arc<Partitions>) {
        let mut c = self.lock();
        if c.generation == at.0 {
            c.partitions = Some(value);
        }
    }

    /// Forgets everything.
    pub(super) fn clear(&self) {
        let mut c = self.lock();
        c.generation += 1;
        c.nearest.clear();
        c.status.clear();
        c.partitions = None;
    }

    /// `cpuset.cpus` of `path` was written. A cgroup that is not a partition changes only its
    /// own effective CPUs and those below it; the pool level (where cpupoold makes partitions)
    /// or a known partition changes its parent's and its siblings' too, so all is forgotten.
    pub(super) fn wrote_cpus(&self, path: &CgroupPath) {
        let pool_level =
            path.as_str() == TOP_SLICE || path.ancestors().last().is_some_and(|p| p.as_str() == TOP_SLICE);
        let mut c = self.lock();
        let partition = c.partitions.as_ref().is_some_and(|p| p.contains(path))
            || c.status.get(path.as_str()).is_some_and(|s| {
                s.as_deref()
                    .and_then(|s| s.split_whitespace().next())
                    .is_some_and(|w| matches!(w, "root" | "isolated"))
            });
        if pool_level || partition {
            drop(c);
            self.clear();
            return;
        }
        c.generation += 1;
        // Only existing cgroups are kept, each under its own path: what the write can change
        // is what is kept at or below `path`, one range of each map.
        forget_below(&mut c.nearest, path.as_str());
        forget_below(&mut c.status, path.as_str());
    }

    /// systemd set the CPUs of unit `unit`. A slice may be the pool level: all is forgotten;
    /// another unit's cgroup (`.../UNIT`) changes only itself and what is below it.
    pub(super) fn wrote_unit(&self, unit: &str) {
        if unit.ends_with(".slice") {
            self.clear();
            return;
        }
        let mut c = self.lock();
        c.generation += 1;
        let inside = |p: &String| p.split('/').any(|n| n == unit);
        c.nearest.retain(|k, _| !inside(k));
        c.status.retain(|k, _| !inside(k));
    }
}

/// The key of `path` in the maps (`""`: the root).
fn key(path: Option<&CgroupPath>) -> &str {
    path.map_or("", CgroupPath::as_str)
}

/// Removes `path` and every path below it from `map`.
fn forget_below<V>(map: &mut BTreeMap<String, V>, path: &str) {
    map.remove(path);
    let below = format!("{path}/");
    let gone: Vec<String> = map
        .range(below.clone()..)
        .take_while(|(k, _)| k.starts_with(&below))
        .map(|(k, _)| k.clone())
        .collect();
    for k in gone {
        map.remove(&k);
    }
}
