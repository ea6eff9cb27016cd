//! The drift part, on the engine thread: it takes what the reading off the thread found
//! ([`super::observe::read`]) and re-checks just those placements and assignments against the
//! ledger's *current* state ([`Drift::correct`], then [`Drift::judge`]): the ledger may have
//! committed changes since the reading, and what it changed itself is not drift. It also makes
//! the host match the whole state ([`Drift::reconcile`], at start and on reapply), and keeps
//! what the checks found for the snapshot (assignments' health, failed corrections).

use std::collections::{BTreeMap, BTreeSet};

use super::ledger::Ledger;
use super::observe::{observe, observe_all, observe_stale, stale_slices, Found};
use super::{describe, error_chain, Change, Event};
use crate::core::plan::{self, Key, Layout};
use crate::core::state::AssignmentId;

/// The drift part: what the last checks found (assignments degraded, suspected, pool-level
/// corrections that failed), and the corrections themselves, made through the ledger's backend.
#[derive(Default)]
pub(super) struct Drift {
    /// See [`super::Snapshot::assignment_health`].
    pub(super) health: BTreeMap<AssignmentId, String>,
    /// Assignments the last check found not enforced for the first time.
    suspects: BTreeSet<AssignmentId>,
    /// The corrections of the last reconcile that failed ([`super::Snapshot::degraded`]).
    pub(super) degraded: Vec<String>,
}

impl Drift {
    /// Judges the assignments' health after [`Drift::correct`]: those `found` unenforced and
    /// still so now, at two checks in a row, are degraded, with the reason; changes of that are
    /// the events returned, with the number degraded.
    pub(super) fn judge(&mut self, ledger: &Ledger, found: &Found) -> (Vec<Event>, usize) {
        let mut health = BTreeMap::new();
        let mut suspects = BTreeSet::new();
        for id in &found.unenforced {
            // Changed (or gone) since the reading: what the engine did itself is not drift.
            let Some(a) = ledger.state.assignments().get(id) else { continue };
            if found.state.assignments().get(id) != Some(a) {
                continue;
            }
            if let Err(e) = ledger.verify(a) {
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
            if !health.contains_key(id) && ledger.state.assignments().contains_key(id) {
                log::info!(ASSIGNMENT = id.as_str(); "assignment {id} is enforced as assigned again");
                events.push(Event::AssignmentChanged { id: id.clone(), change: Change::Restored });
            }
        }
        let degraded = health.len();
        self.health = health;
        (events, degraded)
    }

    /// Makes the host match the state: reads what each placement holds now and applies the
    /// difference, logging each correction. Stale pool slices are removed.
    pub(super) fn reconcile(&mut self, ledger: &Ledger) -> (usize, usize) {
        // Read the host afresh: someone (systemd reloading) may have changed the pool level.
        ledger.backend.refresh();
        let desired = ledger.layout(&ledger.state);
        let mut observed: Layout = observe_all(&*ledger.backend, &desired)
            .into_iter()
            .filter_map(|(key, now)| Some((key, now?)))
            .collect();
        for path in stale_slices(&*ledger.backend, &desired) {
            if let Some(now) = observe_stale(&*ledger.backend, &path) {
                observed.insert(Key::Cgroup(path), now);
            }
        }
        self.apply_corrections(ledger, &observed, &desired)
    }

    /// Reconciles just the placements `found` names, read again now and planned against the
    /// current state: (corrections, failures).
    pub(super) fn correct(&mut self, ledger: &Ledger, found: &Found) -> (usize, usize) {
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
                let now = ledger.state.assignments().get(*id);
                now.is_some() && found.state.assignments().get(*id) == now
            })
            .cloned()
            .collect();
        // The pool level is read again too: it is small, and partitions are torn down and set
        // up together, so planning it whole gives the effects a full reconcile would.
        let (_, desired) =
            plan::partial_layouts(&ledger.state, &ledger.state, &ledger.topo, &ledger.opts, &ids);
        let mut observed = Layout::new();
        for (key, want) in &desired {
            if let Some(now) = observe(&*ledger.backend, key, want) {
                observed.insert(key.clone(), now);
            }
        }
        let full = Self::layout_frame(ledger);
        for path in &found.stale {
            if full.contains_key(&Key::Cgroup(path.clone())) {
                continue;
            }
            if let Some(now) = observe_stale(&*ledger.backend, path) {
                observed.insert(Key::Cgroup(path.clone()), now);
            }
        }
        self.apply_corrections(ledger, &observed, &desired)
    }

    /// The pool-level placements of the current state.
    fn layout_frame(ledger: &Ledger) -> Layout {
        plan::partial_layouts(&ledger.state, &ledger.state, &ledger.topo, &ledger.opts, &BTreeSet::new()).1
    }

    /// Applies the plan from `observed` to `desired`, logging each correction; failures are
    /// what [`Snapshot::degraded`] shows. (corrections, failures).
    pub(super) fn apply_corrections(
        &mut self,
        ledger: &Ledger,
        observed: &Layout,
        desired: &Layout,
    ) -> (usize, usize) {
        let effects = plan::plan(observed, desired);
        let mut failed = 0;
        let mut degraded = Vec::new();
        for effect in &effects {
            match ledger.backend.apply(effect) {
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

    use std::sync::Arc;

    use super::super::tests::{rt, spec, Fixture};
    use super::super::{DriftReport, Engine};
    use super::*;
    use crate::core::cpuset::CpuSet;
    use crate::core::plan::Effect;
    use crate::core::state::CgroupPath;
    use crate::core::state::Size;
    use crate::host::cgroupfs::{CgroupFs, HostError};
    use crate::host::Confinement;
    use crate::host::{Backend, Observed};

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
}
