//! The drift check, in two halves so that the engine thread never reads the whole host.
//!
//! [`read`] runs off the engine thread (a blocking task of the daemon's drift timer): it takes a
//! published [`Snapshot`], builds the layout that snapshot implies, reads back every placement
//! and every assignment's target, and keeps only what differs. The engine then takes that
//! [`Found`] ([`Engine::correct_drift`]) and re-checks just those placements and assignments
//! against its *current* state: it may have committed changes since the snapshot, and what it
//! changed itself is not drift. At 10,000 assignments the reading is the long part (tens of
//! milliseconds); Assign and Release no longer wait behind it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::commit::verify_on;
use super::keeper::Pass;
use super::{describe, error_chain, Change, DriftReport, Engine, Event, Snapshot};
use crate::core::cpuset::CpuSet;
use crate::core::plan::{self, Key, Layout, Placement, Role};
use crate::core::pool::PoolKind;
use crate::core::state::{AssignmentId, CgroupPath, State};
use crate::host::{Backend, Observed};

/// What a reading of the host found to differ from a snapshot ([`read`]); the engine takes it
/// with [`crate::engine::Request::CheckDrift`].
#[derive(Debug)]
pub struct Found {
    /// The state the reading was made against.
    state: Arc<State>,
    /// Whether a pool-level placement (the top slice, a pool slice, a host cgroup, an unpooled
    /// container) differs: the engine then re-reads all of them, since partitions are torn
    /// down and set up together.
    frame: bool,
    /// Assignments whose target's placement differs.
    targets: BTreeSet<AssignmentId>,
    /// Pool slices (and the top slice) that exist but are not wanted.
    stale: Vec<CgroupPath>,
    /// Assignments whose target the kernel does not confine to their CPUs.
    unenforced: BTreeSet<AssignmentId>,
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

/// Reads the host against `snap` (off the engine thread): every placement its layout wants,
/// the stale slices, and what the kernel enforces on every assignment's target.
pub fn read(backend: &dyn Backend, snap: &Snapshot) -> Found {
    // What the backend remembers of pool-level cgroups is read afresh once per check.
    backend.refresh();
    let state = snap.state.clone();
    let desired = plan::layout(&state, &snap.topology, &snap.layout);
    let frame_keys = plan::partial_layouts(&state, &state, &snap.topology, &snap.layout, &BTreeSet::new()).1;
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

impl Engine {
    /// Corrects what [`read`] found, judged against the current state; then the assignments'
    /// health: those found unenforced and still so now, at two checks in a row, are degraded,
    /// with the reason; changes of that are published as `degraded` / `restored` events.
    pub(super) fn correct_drift(&mut self, found: Found) -> DriftReport {
        let (corrected, failed) = self.correct(&found);
        // Published after the assignments' events, as they came when housekeeping passed last.
        let kept = self.keep_host(Pass::Pools);
        let mut health = BTreeMap::new();
        let mut suspects = BTreeSet::new();
        for id in &found.unenforced {
            // Changed (or gone) since the reading: what the engine did itself is not drift.
            let Some(a) = self.state.assignments().get(id) else { continue };
            if found.state.assignments().get(id) != Some(a) {
                continue;
            }
            if let Err(e) = self.verify(a) {
                // Seen once, it may be a unit caught mid-restart: degraded when the next check
                // (after this one's corrections) still finds it so.
                if self.suspects.contains(id) || self.health.contains_key(id) {
                    health.insert(id.clone(), error_chain(&e));
                } else {
                    suspects.insert(id.clone());
                }
            }
        }
        self.suspects = suspects;
        let mut events = Vec::new();
        for (id, why) in &health {
            if self.health.get(id) != Some(why) {
                log::warn!(ASSIGNMENT = id.as_str(); "assignment {id} is degraded: {why}");
                events.push(Event::AssignmentChanged { id: id.clone(), change: Change::Degraded });
            }
        }
        for id in self.health.keys() {
            if !health.contains_key(id) && self.state.assignments().contains_key(id) {
                log::info!(ASSIGNMENT = id.as_str(); "assignment {id} is enforced as assigned again");
                events.push(Event::AssignmentChanged { id: id.clone(), change: Change::Restored });
            }
        }
        let report = DriftReport { corrected, failed, degraded: health.len() };
        self.health = health;
        events.extend(kept);
        if corrected > 0 || failed > 0 || !events.is_empty() {
            log::info!("drift check: {corrected} corrections, {failed} failed, {} degraded", report.degraded);
        }
        self.publish(events);
        report
    }

    /// Reconciles just the placements `found` names, read again now and planned against the
    /// current state: (corrections, failures).
    fn correct(&mut self, found: &Found) -> (usize, usize) {
        if !found.frame && found.targets.is_empty() && found.stale.is_empty() {
            self.degraded = Vec::new();
            return (0, 0);
        }
        // Only assignments the reading and the current state agree on: a target the engine
        // moved since was written by it.
        let ids: BTreeSet<AssignmentId> = found
            .targets
            .iter()
            .filter(|id| {
                let now = self.state.assignments().get(*id);
                now.is_some() && found.state.assignments().get(*id) == now
            })
            .cloned()
            .collect();
        // The pool level is read again too: it is small, and partitions are torn down and set
        // up together, so planning it whole gives the effects a full reconcile would.
        let (_, desired) = plan::partial_layouts(&self.state, &self.state, &self.topo, &self.opts, &ids);
        let mut observed = Layout::new();
        for (key, want) in &desired {
            if let Some(now) = observe(&*self.backend, key, want) {
                observed.insert(key.clone(), now);
            }
        }
        let full = self.layout_frame();
        for path in &found.stale {
            if full.contains_key(&Key::Cgroup(path.clone())) {
                continue;
            }
            if let Some(now) = observe_stale(&*self.backend, path) {
                observed.insert(Key::Cgroup(path.clone()), now);
            }
        }
        self.apply_corrections(&observed, &desired)
    }

    /// The pool-level placements of the current state.
    fn layout_frame(&self) -> Layout {
        plan::partial_layouts(&self.state, &self.state, &self.topo, &self.opts, &BTreeSet::new()).1
    }

    /// Applies the plan from `observed` to `desired`, logging each correction; failures are
    /// what [`Snapshot::degraded`] shows. (corrections, failures).
    pub(super) fn apply_corrections(&mut self, observed: &Layout, desired: &Layout) -> (usize, usize) {
        let effects = plan::plan(observed, desired);
        let mut failed = 0;
        let mut degraded = Vec::new();
        for effect in &effects {
            match self.backend.apply(effect) {
                Ok(()) => log::info!("reconcile: {}", describe(effect)),
                Err(e) => {
                    failed += 1;
                    degraded.push(format!("{}: {}", describe(effect), error_chain(&e)));
                    log::error!("reconcile: {} failed: {}", describe(effect), error_chain(&e));
                }
            }
        }
        self.degraded = degraded;
        (effects.len() - failed, failed)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Mutex;
    use std::time::Duration;

    use super::super::tests::{rt, spec, Fixture};
    use super::*;
    use crate::core::plan::Effect;
    use crate::core::state::Size;
    use crate::host::cgroupfs::{CgroupFs, HostError};
    use crate::host::Confinement;

    /// The sandbox's backend, whose drift reading (which starts with [`Backend::refresh`]) waits
    /// once, when armed, until the test lets it go: the reading is then under way for as long as
    /// the test needs.
    struct Gate {
        inner: CgroupFs,
        ctl: Arc<Ctl>,
    }

    /// The test's side of a [`Gate`].
    struct Ctl {
        armed: AtomicBool,
        entered: tokio::sync::mpsc::UnboundedSender<()>,
        release: Mutex<std::sync::mpsc::Receiver<()>>,
    }

    impl Backend for Gate {
        fn name(&self) -> &'static str {
            "cgroupfs"
        }
        fn apply(&self, effect: &Effect) -> Result<(), HostError> {
            self.inner.apply(effect)
        }
        fn observe(&self, key: &Key) -> Result<Option<Observed>, HostError> {
            self.inner.observe(key)
        }
        fn children(&self, top: &CgroupPath) -> Vec<CgroupPath> {
            self.inner.children(top)
        }
        fn partition_status(&self, path: &CgroupPath) -> Option<String> {
            self.inner.partition_status(path)
        }
        fn remote_partitions(&self) -> bool {
            self.inner.has_exclusive_file()
        }
        fn process_start(&self, pid: u32) -> Option<u64> {
            self.inner.process_start(pid)
        }
        fn enforced(&self, key: &Key) -> Result<Option<CpuSet>, HostError> {
            self.inner.enforced(key)
        }
        fn confinement(&self, key: &Key) -> Result<Option<Confinement>, HostError> {
            self.inner.confinement(key)
        }
        fn can_read_units(&self) -> bool {
            false
        }
        fn refresh(&self) {
            if self.ctl.armed.swap(false, Ordering::SeqCst) {
                let _ = self.ctl.entered.send(());
                let _ = self.ctl.release.lock().map(|r| r.recv());
            }
            Backend::refresh(&self.inner);
        }
    }

    /// Bounds a wait that never ends when the engine is stuck (the test then fails, naming it).
    async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
        tokio::time::timeout(Duration::from_secs(60), f).await.unwrap_or_else(|_| panic!("{what}"))
    }

    #[test]
    fn the_engine_answers_while_a_drift_check_reads_the_host_and_what_it_did_meanwhile_is_no_drift() {
        let f = Fixture::new();
        let (entered_tx, mut entered) = tokio::sync::mpsc::unbounded_channel();
        let (release, release_rx) = std::sync::mpsc::channel();
        let ctl = Arc::new(Ctl {
            armed: AtomicBool::new(false),
            entered: entered_tx,
            release: Mutex::new(release_rx),
        });
        let inner = crate::sim::cgroupfs(f.sb.cgroupfs(), "/proc").with_processes(f.sb.processes());
        let gate = Gate { inner, ctl: ctl.clone() };
        let (engine, _) = Engine::start(&f.settings(), Box::new(gate), false)
            .unwrap_or_else(|e| panic!("{}", error_chain(&e)));
        f.write("k/a/cpuset.cpus", "\n");
        f.write("k/b/cpuset.cpus", "\n");
        let (handle, thread) = engine.spawn().unwrap_or_else(|e| panic!("{e}"));
        rt().block_on(async {
            handle
                .assign(spec("dp", "cgroup:k/a", Size::Cpus(2), Some("a")))
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            // Drift behind the daemon's back, seen by the reading below.
            f.write("k/a/cpuset.cpus", "6\n");
            ctl.armed.store(true, Ordering::SeqCst);
            let h = handle.clone();
            let check = tokio::spawn(async move { h.check_drift().await });
            within("the drift reading to start", entered.recv()).await;
            // The reading is under way: the engine still takes requests, and what it does now
            // is newer than the snapshot the reading works from.
            within("the engine to answer during the drift reading", handle.release("a"))
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            within(
                "the engine to answer during the drift reading",
                handle.assign(spec("dp", "cgroup:k/b", Size::Cpus(2), Some("b"))),
            )
            .await
            .unwrap_or_else(|e| panic!("{e}"));
            let _ = release.send(());
            let report = check.await.unwrap_or_else(|e| panic!("{e}")).unwrap_or_else(|e| panic!("{e}"));
            // `a` was released meanwhile: its target is not written again.
            assert_eq!(report, DriftReport { corrected: 0, failed: 0, degraded: 0 });
            assert_eq!(f.read("k/a/cpuset.cpus"), "");
            assert_eq!(f.read("k/b/cpuset.cpus"), "1,5");
        });
        drop(handle);
        let _ = thread.join();
    }

    #[test]
    fn drift_is_corrected_then_degraded_at_the_second_check_and_restored() {
        let f = Fixture::new();
        let (engine, _) = f.start();
        f.write("k/mid/app/cpuset.cpus", "\n");
        let (handle, thread) = engine.spawn().unwrap_or_else(|e| panic!("{e}"));
        rt().block_on(async {
            handle
                .assign(spec("web", "cgroup:k/mid/app", Size::Millicpus(500), Some("w")))
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let check = || async { handle.check_drift().await.unwrap_or_else(|e| panic!("{e}")) };
            assert_eq!(check().await, DriftReport::default());
            f.write("k/mid/app/cpuset.cpus", "3\n");
            assert_eq!(check().await, DriftReport { corrected: 1, failed: 0, degraded: 0 });
            assert_eq!(f.read("k/mid/app/cpuset.cpus"), "3,7");
            // The parent narrowed: not enforced, degraded when the next check finds it so too.
            f.write("k/mid/cpuset.cpus", "3\n");
            assert_eq!(check().await.degraded, 0);
            let mut events = handle.subscribe();
            assert_eq!(check().await.degraded, 1);
            let w = AssignmentId::new("w").unwrap_or_else(|e| panic!("{e}"));
            let why = handle.snapshot().assignment_health.get(&w).cloned().unwrap_or_default();
            assert!(why.contains("k/mid"), "{why}");
            assert_eq!(
                events.recv().await.ok(),
                Some(Event::AssignmentChanged { id: w.clone(), change: Change::Degraded })
            );
            f.write("k/mid/cpuset.cpus", "\n");
            assert_eq!(check().await.degraded, 0);
            assert!(handle.snapshot().assignment_health.is_empty());
        });
        drop(handle);
        let _ = thread.join();
    }

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
