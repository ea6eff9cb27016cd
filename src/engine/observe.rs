//! Reading the host against what a state wants, off the engine thread: the first half of the
//! drift check, so that the engine thread never reads the whole host.
//!
//! [`read`] runs on a thread of its own (the daemon's drift timer, through
//! [`super::Handle::check_drift`]): it takes a published state with its topology and layout
//! options, builds the layout they imply, reads back every placement and every assignment's
//! target, and keeps only what differs ([`Found`]); the engine then judges that against its
//! current state ([`super::drift`]). At 10,000 assignments the reading is the long part (tens
//! of milliseconds); Assign and Release do not wait behind it. The same reads serve the
//! engine's reconcile and its commit path's read-back ([`verify_on`]). Nothing here changes the
//! host.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::{error_chain, EngineError};
use crate::core::cpuset::CpuSet;
use crate::core::plan::{self, Key, Layout, LayoutOptions, Placement, Role};
use crate::core::pool::PoolKind;
use crate::core::state::{self, Assignment, AssignmentId, CgroupPath, State, Target};
use crate::core::topology::Topology;
use crate::host::{Backend, Observed};

/// What a reading of the host found to differ from a published state ([`read`]); the engine
/// takes it with [`crate::engine::Request::CheckDrift`].
#[derive(Debug)]
pub struct Found {
    /// The state the reading was made against.
    pub(super) state: Arc<State>,
    /// Whether a pool-level placement (the top slice, a pool slice, a host cgroup, an unpooled
    /// container) differs: the engine then re-reads all of them, since partitions are torn
    /// down and set up together.
    pub(super) frame: bool,
    /// Assignments whose target's placement differs.
    pub(super) targets: BTreeSet<AssignmentId>,
    /// Pool slices (and the top slice) that exist but are not wanted.
    pub(super) stale: Vec<CgroupPath>,
    /// Assignments whose target the kernel does not confine to their CPUs.
    pub(super) unenforced: BTreeSet<AssignmentId>,
}

/// What the host holds for `key`, as the planner compares it with `want`; `None` where it does
/// not exist.
pub(super) fn observe(backend: &dyn Backend, key: &Key, want: &Placement) -> Option<Placement> {
    let now = match backend.observe(key) {
        Ok(now) => now,
        Err(e) => {
            log::warn!("reconcile: {}", error_chain(&e));
            None
        }
    };
    let now = match (key, now) {
        (Key::Cgroup(_), now) => now,
        // Only cgroups report memory nodes and partitions.
        (_, Some(o)) => Some(Observed { mems: want.mems.clone(), ..o }),
        // The cgroupfs backend cannot read units: take them as they should be.
        (Key::Unit(_), None) if !backend.can_read_units() => {
            Some(Observed { cpus: want.cpus.clone(), mems: want.mems.clone(), ..Default::default() })
        }
        (_, None) => None,
    }?;
    let mut place = Placement::new(now.cpus, now.mems, want.role.clone());
    place.partition = now.partition;
    // Quotas are not read back: written again whenever they are wanted.
    Some(place)
}

/// [`observe`] for every entry of `layout`, in its order. At a restart with 10,000 targets that
/// is 40,000 small files read: with many entries, the reads of cgroups and processes are spread
/// over a few threads (the kernel serves them in parallel); units are asked on this thread,
/// since their backend calls systemd.
pub(super) fn observe_all(backend: &dyn Backend, layout: &Layout) -> Vec<(Key, Option<Placement>)> {
    /// Below this many entries one thread reads them as fast.
    const SPREAD_FROM: usize = 1024;
    let entries: Vec<(&Key, &Placement)> = layout.iter().collect();
    let threads = std::thread::available_parallelism().map_or(1, usize::from).min(4);
    let read = |part: &[(&Key, &Placement)]| -> Vec<Option<Placement>> {
        part.iter()
            .map(|(k, w)| if matches!(k, Key::Unit(_)) { None } else { observe(backend, k, w) })
            .collect()
    };
    let mut found: Vec<Option<Placement>> = if threads > 1 && entries.len() >= SPREAD_FROM {
        let chunk = entries.len().div_ceil(threads);
        std::thread::scope(|s| {
            // A part whose thread the system refuses (pids.max reached) is read on this one.
            let parts: Vec<_> = entries
                .chunks(chunk)
                .map(|part| {
                    std::thread::Builder::new()
                        .name("cpupoold-drift".into())
                        .spawn_scoped(s, move || read(part))
                        .map_err(|_| part)
                })
                .collect();
            // A reader that panicked panics here, as the same read on this thread would.
            parts
                .into_iter()
                .flat_map(|p| match p {
                    Ok(t) => t.join().unwrap_or_else(|e| std::panic::resume_unwind(e)),
                    Err(part) => read(part),
                })
                .collect()
        })
    } else {
        read(&entries)
    };
    for (i, (k, w)) in entries.iter().enumerate() {
        if matches!(k, Key::Unit(_)) {
            found[i] = observe(backend, k, w);
        }
    }
    entries.into_iter().map(|(k, _)| k.clone()).zip(found).collect()
}

/// A stale pool slice (or top slice) as it is now, to be planned away. A pool slice that cannot
/// be read is removed all the same; a top slice that is gone is `None`.
pub(super) fn observe_stale(backend: &dyn Backend, path: &CgroupPath) -> Option<Placement> {
    let key = Key::Cgroup(path.clone());
    let place = if path.as_str() == plan::TOP_SLICE {
        let o = backend.observe(&key).ok().flatten()?;
        let mut place = Placement::new(o.cpus, o.mems, Role::Parent);
        place.partition = o.partition;
        place
    } else {
        let o = backend.observe(&key).ok().flatten().unwrap_or_default();
        let mut place = Placement::new(o.cpus, CpuSet::new(), Role::Pool(PoolKind::Shared));
        place.partition = o.partition;
        place
    };
    Some(place)
}

/// The slices below the top slice (and the top slice itself) that `desired` does not want.
pub(super) fn stale_slices(backend: &dyn Backend, desired: &Layout) -> Vec<CgroupPath> {
    let Ok(top) = CgroupPath::new(plan::TOP_SLICE) else { return Vec::new() };
    let mut out = Vec::new();
    for child in backend.children(&top) {
        let ours = child
            .as_str()
            .rsplit('/')
            .next()
            .is_some_and(|n| n.starts_with("cpupool-") && n.ends_with(".slice"));
        if ours && !desired.contains_key(&Key::Cgroup(child.clone())) {
            out.push(child);
        }
    }
    // No pool but the reserved one: a top slice left from before goes too.
    if !desired.contains_key(&Key::Cgroup(top.clone()))
        && matches!(backend.observe(&Key::Cgroup(top.clone())), Ok(Some(_)))
    {
        out.push(top);
    }
    out
}

/// Whether the host's `now` for one placement needs any effect to become `want`.
fn differs(key: &Key, now: Option<Placement>, want: &Placement) -> bool {
    let before: Layout = now.into_iter().map(|p| (key.clone(), p)).collect();
    let after: Layout = [(key.clone(), want.clone())].into();
    !plan::plan(&before, &after).is_empty()
}

/// Reads the host against `state` laid out on `topo` with `opts` (off the engine thread): every
/// placement its layout wants, the stale slices, and what the kernel enforces on every
/// assignment's target.
pub fn read(backend: &dyn Backend, state: Arc<State>, topo: &Topology, opts: &LayoutOptions) -> Found {
    // What the backend remembers of pool-level cgroups is read afresh once per check.
    backend.refresh();
    let desired = plan::layout(&state, topo, opts);
    let frame_keys = plan::partial_layouts(&state, &state, topo, opts, &BTreeSet::new()).1;
    let mut frame = false;
    let mut differing = BTreeSet::new();
    for (key, want) in &desired {
        let now = observe(backend, key, want);
        // A container's cgroup that is gone is not drift: its assignment goes with the
        // container (NRI's StopContainer, or the kubelet's PodResources), not by a write.
        if now.is_none() && matches!(key, Key::Cgroup(p) if backend.vanished(p)) {
            continue;
        }
        if differs(key, now, want) {
            if frame_keys.contains_key(key) {
                frame = true;
            }
            differing.insert(key.clone());
        }
    }
    let mut targets = BTreeSet::new();
    let mut unenforced = BTreeSet::new();
    for a in state.assignments().values() {
        if Key::of(&a.target).is_some_and(|k| differing.contains(&k)) {
            targets.insert(a.id.clone());
        }
        if verify_on(backend, a).is_err() {
            unenforced.insert(a.id.clone());
        }
    }
    let stale = stale_slices(backend, &desired);
    Found { state, frame, targets, stale, unenforced }
}

/// Reads back what the kernel enforces on `a`'s target through `backend`; a difference is a
/// refusal ([`state::Error::TargetOutsidePool`]). A read-back that fails (the file is gone, the
/// process is out of descriptors) is no answer about the target: [`EngineError::ReadBack`], a
/// failure to apply naming the file and the kernel's error, never a refusal of the target.
/// The commit path's read-back, and the drift reader's off the engine thread.
pub(super) fn verify_on(backend: &dyn Backend, a: &Assignment) -> Result<(), EngineError> {
    let Some(key) = Key::of(&a.target) else { return Ok(()) };
    match backend.enforced(&key) {
        Ok(Some(now)) if now != a.cpus => {
            let (parent, cpus) = match backend.confinement(&key) {
                Ok(Some(c)) => (c.parent, c.cpus),
                _ => ("its cgroup".to_owned(), now),
            };
            Err(outside(a, &parent, &cpus).into())
        }
        Ok(_) => Ok(()),
        Err(source) => Err(EngineError::ReadBack { target: a.target.to_string(), source }),
    }
}

/// The refusal of `a`, whose target sits in `parent` with effective CPUs `cpus`.
pub(super) fn outside(a: &Assignment, parent: &str, cpus: &CpuSet) -> state::Error {
    let hint = match &a.target {
        Target::Unit(_) => format!(
            "start the unit in the pool's slice (`Slice=cpupool-{0}.slice`, or `systemd-run --slice=cpupool-{0}.slice`), or use `cpupoolctl run --pool {0}`",
            a.pool
        ),
        Target::Cgroup(_) => format!(
            "use a cgroup inside the pool's slice (`cpupool.slice/cpupool-{}.slice/NAME`), or give its parent these CPUs first",
            a.pool
        ),
        Target::Pid(_) => format!("start the process with `cpupoolctl run --pool {}`, which puts it where the CPUs are", a.pool),
        Target::Kubelet(_) => String::new(),
    };
    state::Error::TargetOutsidePool {
        target: a.target.to_string(),
        cpus: a.cpus.to_string(),
        parent: parent.to_owned(),
        parent_cpus: cpus.to_string(),
        hint,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Many entries are read on a few threads: the same placements, in the layout's order, as
    /// reading them one by one; units (which the cgroupfs backend cannot read) stay `None`.
    #[test]
    fn reading_many_placements_at_once_reads_what_reading_them_one_by_one_does() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let fs = crate::sim::cgroupfs(tmp.path(), "/proc");
        let mut layout = Layout::new();
        for i in 0..1500u32 {
            let path = CgroupPath::new(&format!("k/c{i}")).unwrap_or_else(|e| panic!("{e}"));
            let cpus = CpuSet::from_iter([i % 8]);
            // Every third cgroup missing, the others holding their own CPUs.
            if i % 3 != 0 {
                let dir = tmp.path().join(path.as_str());
                std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
                std::fs::write(dir.join("cpuset.cpus"), cpus.to_string()).unwrap_or_else(|e| panic!("{e}"));
            }
            layout.insert(Key::Cgroup(path), Placement::new(cpus, CpuSet::new(), Role::Shared));
        }
        layout.insert(
            Key::Unit("a.service".into()),
            Placement::new(CpuSet::new(), CpuSet::new(), Role::Shared),
        );
        let all = observe_all(&fs, &layout);
        let one_by_one: Vec<(Key, Option<Placement>)> =
            layout.iter().map(|(k, w)| (k.clone(), observe(&fs, k, w))).collect();
        assert_eq!(all, one_by_one);
        assert_eq!(all.iter().filter(|(_, p)| p.is_some()).count(), 1000 + 1);
    }
}
