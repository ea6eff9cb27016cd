//! The ledger: the one owner of the state, the store and the backend, and the commit path. A
//! mutation is decided on a copy of the state, planned, applied (taking CPUs before the save
//! and giving them after it), saved, read back, and undone on any failure; the ledger returns
//! the events of what it made, and the engine publishes them.

use std::sync::Arc;

use super::observe::{outside, verify_on};
use super::{error_chain, Change, EngineError, Event};
use crate::core::cpuset::CpuSet;
use crate::core::plan::LayoutOptions;
use crate::core::plan::{self, Effect, Key, Layout};
use crate::core::state::{self, AssignSpec, Assignment, CgroupPath, Changes, Outcome, State, Target};
use crate::core::topology::Topology;
use crate::host::store::Store;
use crate::host::Backend;

/// The state with what it takes to change it: the topology it is laid out on, the layout
/// options, the store that makes it durable and the backend that applies it. It alone changes
/// the state, and only by a commit.
pub(super) struct Ledger {
    /// The committed state.
    pub(super) state: Arc<State>,
    /// The topology the state is laid out on.
    pub(super) topo: Arc<Topology>,
    /// The state directory.
    pub(super) store: Store,
    /// Shared with the drift reader ([`super::Handle::check_drift`]), which reads the host off
    /// the engine thread.
    pub(super) backend: Arc<dyn Backend>,
    /// What the layout depends on besides the state.
    pub(super) opts: LayoutOptions,
}

/// A change made, with the events to publish for it.
pub(super) type Made<T> = (T, Vec<Event>);

impl Ledger {
    /// The placements `state` implies, laid out as this ledger lays them out.
    pub(super) fn layout(&self, state: &State) -> Layout {
        plan::layout(state, &self.topo, &self.opts)
    }

    /// Records when a pid target's process started; refuses a process that does not exist.
    pub(super) fn stamp(&self, mut spec: AssignSpec) -> Result<AssignSpec, state::Error> {
        if let Target::Pid(pid) = spec.target {
            spec.process_start = Some(self.process_start(pid)?);
        }
        Ok(spec)
    }

    /// When process `pid` started, from the host; refuses a process that does not exist.
    fn process_start(&self, pid: u32) -> Result<u64, state::Error> {
        self.backend.process_start(pid).ok_or_else(|| state::Error::InvalidArgument {
            arg: "target",
            reason: format!("process {pid} does not exist"),
        })
    }

    /// Admits an assignment read from the state files at start as [`Engine::decide`] and
    /// [`Engine::stamp`] admit a new one: the same target rules ([`Engine::check_protected`]
    /// against `next`, which holds it and those admitted before it), and for a process the same
    /// look-up of when it started, which must be the start the assignment recorded (else the
    /// pid names another process now, or none). Where the target sits is not asked: before
    /// start's reconcile the host shows the last run's layout, and the read-back after it
    /// (the drift check) reports a target not confined.
    pub(super) fn admit_loaded(&self, next: &State, a: &Assignment) -> Result<(), state::Error> {
        self.check_protected(next, a)?;
        if let Target::Pid(pid) = a.target {
            let now = self.process_start(pid)?;
            if a.process_start != Some(now) {
                let recorded =
                    a.process_start.map_or_else(|| "no start time".to_owned(), |s| format!("start time {s}"));
                return Err(state::Error::TargetNotAllowed {
                    target: a.target.to_string(),
                    reason: format!(
                        "process {pid} started at {now} (clock ticks since boot) but the assignment records {recorded}: it is not the process the CPUs were assigned to"
                    ),
                });
            }
        }
        Ok(())
    }

    /// Reads back the assignments a grouped commit made: those the kernel does not enforce are
    /// taken back out, together, and their callers told why; if even that fails, the state
    /// `before` the group is committed again.
    pub(super) fn take_back_unenforced(
        &mut self,
        decided: &mut [Decided],
        before: &State,
        changes: &Changes,
    ) {
        let refused: Vec<(usize, EngineError)> = decided
            .iter()
            .enumerate()
            .filter_map(|(i, d)| match d {
                Decided::Assign(Ok(Outcome::Changed(a))) => self.verify(a).err().map(|e| (i, e)),
                _ => None,
            })
            .collect();
        if refused.is_empty() {
            return;
        }
        let mut fixed = (*self.state).clone();
        for (i, _) in &refused {
            if let Decided::Assign(Ok(Outcome::Changed(a))) = &decided[*i] {
                let _ = fixed.release(a.id.as_str());
            }
        }
        if let Err(e) = self.commit(fixed) {
            log::error!("taking back assignments the kernel does not enforce failed: {}", error_chain(&e));
            let mut before = before.clone();
            before.mark(changes);
            let _ = self.commit(before);
        }
        for (i, e) in refused {
            decided[i] = Decided::Assign(Err(e));
        }
    }

    /// [`super::Handle::run`]: where systemd runs, the assignment's target is a new scope
    /// `cpupool-run-<pid>-<start>.scope` in the pool's slice that holds the process; elsewhere
    /// the process itself.
    pub(super) fn run_process(&mut self, spec: AssignSpec) -> Result<Made<Outcome<Assignment>>, EngineError> {
        let spec = self.stamp(spec)?;
        let (Target::Pid(pid), Some(start)) = (&spec.target, spec.process_start) else {
            return Err(
                state::Error::InvalidArgument { arg: "pid", reason: "must name a process".into() }.into()
            );
        };
        let pid = *pid;
        if !self.backend.runs_scopes() {
            return self.assign(&spec);
        }
        let pool = self.state.pool(&spec.pool)?.clone();
        let scope = Target::run_scope(pid, start);
        let target = Target::Unit(scope.clone());
        let mut next = (*self.state).clone();
        let scoped = AssignSpec { target, process_start: None, ..spec };
        let out = next.assign(&self.topo, &scoped)?;
        let Outcome::Changed(a) = &out else { return Ok((out, Vec::new())) };
        // The scope does not exist yet: where it sits is read back once it does.
        self.check_protected(&next, a)?;
        let slice = plan::pool_slice(&pool.name);
        let slice_unit = slice.as_str().rsplit('/').next().unwrap_or_default().to_owned();
        // The scope starts with the pool slice's CPUs only; its own (exclusive ones) are set by
        // the commit, after the save, like any assignment's: a crash in between leaves no
        // CPU given away that the saved state does not name. The process waits meanwhile.
        self.backend.start_scope(&scope, &slice_unit, pid, &CpuSet::new()).map_err(EngineError::Apply)?;
        let before = self.state.clone();
        let changes = self.commit(next)?;
        self.verify_or_undo(&before, &changes, a)?;
        let events = assigned(a);
        Ok((out, events))
    }

    /// Decides, commits and reads back one assignment; a difference undoes it.
    pub(super) fn assign(&mut self, spec: &AssignSpec) -> Result<Made<Outcome<Assignment>>, EngineError> {
        let mut next = (*self.state).clone();
        let out = self.decide(&mut next, spec)?;
        let mut events = Vec::new();
        if let Outcome::Changed(a) = &out {
            let before = self.state.clone();
            let changes = self.commit(next)?;
            self.verify_or_undo(&before, &changes, a)?;
            events = assigned(a);
        }
        Ok((out, events))
    }

    /// Releases one assignment and commits.
    pub(super) fn release(&mut self, id: &str) -> Result<Made<Assignment>, EngineError> {
        let mut next = (*self.state).clone();
        let a = next.release(id)?;
        self.commit(next)?;
        let events = released(&a);
        Ok((a, events))
    }

    /// Keeps exactly `cgroups` (those an assignment could target) off the exclusive CPUs.
    pub(super) fn set_unpooled(
        &mut self,
        mut cgroups: std::collections::BTreeSet<CgroupPath>,
    ) -> Result<usize, EngineError> {
        // The adapters leave out what they may not confine; whatever else asks, cpupoold writes
        // no cgroup an assignment could not target (a host slice, a pool's slice, an ancestor).
        cgroups.retain(|p| match self.state.check_container_cgroup(p, &self.opts.host_cgroups) {
            Ok(()) => true,
            Err(e) => {
                log::warn!("not keeping `{p}` off the exclusive CPUs: {e}");
                false
            }
        });
        if cgroups == self.opts.unpooled {
            return Ok(0);
        }
        self.relayout(|o| o.unpooled = cgroups)
    }

    /// Decides an assignment on `next` and admits its target: on refusal `next` is as it was.
    pub(super) fn decide(
        &self,
        next: &mut State,
        spec: &AssignSpec,
    ) -> Result<Outcome<Assignment>, state::Error> {
        let out = next.assign(&self.topo, spec)?;
        if let Outcome::Changed(a) = &out {
            if let Err(e) = self.admit_target(next, a) {
                let _ = next.release(a.id.as_str());
                return Err(e);
            }
        }
        Ok(out)
    }

    /// Refuses a new assignment's target before anything is applied: targets that would
    /// defeat the pools ([`state::check_target`]), and targets whose place gives them fewer
    /// CPUs than assigned (the kernel would enforce the intersection, and the books would not
    /// match it).
    pub(super) fn admit_target(&self, next: &State, a: &Assignment) -> Result<(), state::Error> {
        self.check_protected(next, a)?;
        let Some(key) = Key::of(&a.target) else { return Ok(()) };
        match self.backend.confinement(&key) {
            Ok(Some(c)) if !a.cpus.is_subset(&c.cpus) => Err(outside(a, &c.parent, &c.cpus)),
            Ok(_) => Ok(()),
            // Unknown is not a refusal: the read-back after applying decides.
            Err(e) => {
                log::debug!("cannot tell where {} sits: {}", a.target, error_chain(&e));
                Ok(())
            }
        }
    }

    /// [`state::check_target`] for `a` against the host cgroups and `next`'s other assignments
    /// (looked up in `next`'s index of target cgroups, not walked one by one).
    pub(super) fn check_protected(&self, next: &State, a: &Assignment) -> Result<(), state::Error> {
        next.check_target(&a.target, &self.opts.host_cgroups, &a.id)
    }

    /// Reads back what the kernel enforces on `a`'s target; a difference is a refusal, a
    /// read-back that fails is a failure to apply ([`verify_on`]).
    pub(super) fn verify(&self, a: &Assignment) -> Result<(), EngineError> {
        verify_on(&*self.backend, a)?;
        // A container of an isolated pool: its cgroup must be a valid isolated partition.
        let Target::Cgroup(path) = &a.target else { return Ok(()) };
        let wanted = plan::layout_of(&self.state, &self.topo, &self.opts, a)
            .is_some_and(|p| p.partition != plan::Partition::Member);
        if !wanted {
            return Ok(());
        }
        match self.backend.partition_status(path) {
            Some(status) if status == "isolated" => Ok(()),
            status => Err(EngineError::State(state::Error::TargetNotAllowed {
                target: a.target.to_string(),
                reason: format!(
                    "the kernel did not make {path} an isolated partition on CPUs {} (cpuset.cpus.partition reads `{}`)",
                    a.cpus,
                    status.as_deref().unwrap_or("nothing")
                ),
            })),
        }
    }

    /// [`Engine::verify`] after the commit that made `changes`; on a difference the commit is
    /// undone (applied and saved back to `before`), so nothing stays booked. `before` is the
    /// state the commit replaced, shared: it is copied only to undo.
    pub(super) fn verify_or_undo(
        &mut self,
        before: &Arc<State>,
        changes: &Changes,
        a: &Assignment,
    ) -> Result<(), EngineError> {
        if let Err(e) = self.verify(a) {
            log::warn!(
                TARGET = a.target.to_string().as_str();
                "refusing assignment {} of CPUs {} to {}: {}", a.id, a.cpus, a.target, error_chain(&e)
            );
            let mut before = (**before).clone();
            before.mark(changes);
            if let Err(undo) = self.commit(before) {
                log::error!("taking back assignment {} failed: {}", a.id, error_chain(&undo));
            }
            return Err(e);
        }
        Ok(())
    }

    /// Changes what the layout depends on besides the state and applies the difference; on
    /// failure puts both back as they were, so that the next call tries again. Returns the
    /// number of effects.
    pub(super) fn relayout(
        &mut self,
        change: impl FnOnce(&mut plan::LayoutOptions),
    ) -> Result<usize, EngineError> {
        let before = self.layout(&self.state);
        let previous = self.opts.clone();
        change(&mut self.opts);
        let after = self.layout(&self.state);
        let effects = plan::plan(&before, &after).len();
        if let Err(failed) = self.apply_plan(&before, &after) {
            self.undo(&after, &before, &failed.unchanged);
            self.opts = previous;
            return Err(*failed.error);
        }
        Ok(effects)
    }

    /// Applies and saves `next`, returning what it changed; on failure undoes what was applied.
    ///
    /// `next.changes()` must name everything that differs from the current state: a state
    /// derived from the current one by mutations records this itself; going back to an earlier
    /// state, mark it with the changes of the step being undone ([`State::mark`]).
    ///
    /// Only the placements those changes touch are built and planned
    /// ([`plan::partial_layouts`]), so a mutation costs the same whatever the number of
    /// assignments; replaced pools (a reload, rare) plan over the whole layouts.
    pub(super) fn commit(&mut self, mut next: State) -> Result<Changes, EngineError> {
        let (before, after) = if next.changes().pools {
            (self.layout(&self.state), self.layout(&next))
        } else {
            let ids = &next.changes().assignments;
            plan::mutation_layouts(&self.state, &next, &self.topo, &self.opts, ids)
        };
        self.commit_layouts(&before, &after, &next)?;
        // The engine's state records no pending change: each commit starts a fresh record.
        let changes = next.take_changes();
        self.state = Arc::new(next);
        Ok(changes)
    }

    /// Takes CPUs away (`plan::kept`) before the save and gives them only after it, so that a
    /// crash at any point leaves no target holding CPUs the saved state does not give it.
    pub(super) fn commit_layouts(
        &mut self,
        before: &Layout,
        after: &Layout,
        next: &State,
    ) -> Result<(), EngineError> {
        let kept = plan::kept(before, after);
        if let Err(failed) = self.apply_plan(before, &kept) {
            self.undo(&kept, before, &failed.unchanged);
            return Err(*failed.error);
        }
        // One durable write: the change as a journal record, or the whole state when the files
        // no longer replay to the engine's state.
        let saving = std::time::Instant::now();
        let whole = self.store.snapshot_needed();
        let saved =
            if whole { self.store.save(next.data()) } else { self.store.append(&next.delta(next.changes())) };
        crate::counters::counters().state_saved(saving.elapsed());
        if let Err(e) = saved {
            log::error!("saving the state failed: {}; rolling back", error_chain(&e));
            self.undo(&kept, before, &Unchanged::new());
            // A failed append cuts its own record; a snapshot may be in place already (a failed
            // directory fsync).
            if whole {
                self.resave_previous(next);
            }
            return Err(EngineError::Store(e));
        }
        if let Err(mut failed) = self.apply_plan(&kept, after) {
            // What the first half changed is to be undone like the rest.
            for effect in plan::plan(before, &kept) {
                failed.unchanged.remove(&subject(&effect));
            }
            self.undo(after, before, &failed.unchanged);
            self.resave_previous(next);
            return Err(*failed.error);
        }
        if self.store.compact_due() {
            // The change is durable already: a compaction that fails is tried again after the
            // next commit.
            if let Err(e) = self.store.save(next.data()) {
                log::warn!("compacting the state journal failed: {}", error_chain(&e));
            }
        }
        Ok(())
    }

    /// Applies the effects that take `from` to `to`, in order, up to the first that fails.
    pub(super) fn apply_plan(&self, from: &Layout, to: &Layout) -> Result<(), PlanFailed> {
        let mut touched = Unchanged::new();
        for effect in plan::plan(from, to) {
            if let Err(e) = self.backend.apply(&effect) {
                log::warn!("{} failed: {}; rolling back", describe(&effect), error_chain(&e));
                let what = subject(&effect);
                let unchanged =
                    if touched.contains(&what) { Unchanged::new() } else { Unchanged::from([what]) };
                return Err(PlanFailed { error: Box::new(EngineError::Apply(e)), unchanged });
            }
            touched.insert(subject(&effect));
        }
        Ok(())
    }

    /// Puts the current state back on disk after `next` failed to apply (its record or snapshot
    /// may be durable already): `next`'s record taken back, or a record of what `next` touched
    /// as the current state has it, or the whole state when a record will not do. If that fails
    /// too, the next write is a whole snapshot.
    pub(super) fn resave_previous(&self, next: &State) {
        let saved = if self.store.snapshot_needed() {
            self.store.save(self.state.data())
        } else {
            // Cutting `next`'s record off leaves the files as they were; if that cannot be
            // done, a record of the way back.
            self.store.retract().or_else(|e| {
                log::warn!("taking back the state journal's last record failed: {}", error_chain(&e));
                self.store.append(&self.state.delta(next.changes()))
            })
        };
        if let Err(e) = saved {
            log::error!("re-saving the previous state failed too: {}", error_chain(&e));
            self.store.mark_stale();
        }
    }

    /// Takes `applied` back to `back_to`. A step on something in `unchanged` (whose change
    /// failed before anything was applied to it) is tried too, in case the failure left part
    /// of it behind, but its failure is no error: there was nothing to roll back.
    pub(super) fn undo(&self, applied: &Layout, back_to: &Layout, unchanged: &Unchanged) {
        for effect in plan::plan(applied, back_to) {
            if let Err(e) = self.backend.apply(&effect) {
                if unchanged.contains(&subject(&effect)) {
                    log::info!(
                        "rollback: nothing to undo on {}, whose change did not apply ({})",
                        subject(&effect),
                        error_chain(&e)
                    );
                } else {
                    log::error!("rollback: {} failed: {}", describe(&effect), error_chain(&e));
                }
            }
        }
    }
}

/// What an effect changes: `cgroup PATH`, `unit NAME` or `pid N`.
fn subject(effect: &Effect) -> String {
    match effect {
        Effect::SetCpus { key, .. } | Effect::SetQuota { key, .. } => key.to_string(),
        Effect::CreateCgroup(path)
        | Effect::RemoveCgroup(path)
        | Effect::SetMems { path, .. }
        | Effect::SetPartition { path, .. } => Key::Cgroup(path.clone()).to_string(),
    }
}

/// The subjects ([`subject`]) a failed plan left as they were.
pub(super) type Unchanged = std::collections::BTreeSet<String>;

/// A plan that stopped at an effect that failed.
pub(super) struct PlanFailed {
    /// Why.
    pub(super) error: Box<EngineError>,
    /// The failed effect's subject, unless an effect before it changed the same one.
    pub(super) unchanged: Unchanged,
}

/// The most mutations decided and saved together.
pub(super) const MAX_GROUP: usize = 256;

/// What the core decided for one mutation of a group.
pub(super) enum Decided {
    Assign(Result<Outcome<Assignment>, EngineError>),
    Release(Result<Assignment, state::Error>),
}

/// Logs a new assignment and returns its events.
pub(super) fn assigned(a: &Assignment) -> Vec<Event> {
    log::info!(
        POOL = a.pool.as_str(), ASSIGNMENT = a.id.as_str(), TARGET = a.target.to_string().as_str();
        "assigned CPUs {} ({} millicpus) from pool {} to {}", a.cpus, a.millicpus, a.pool, a.target
    );
    vec![
        Event::AssignmentChanged { id: a.id.clone(), change: Change::Added },
        Event::PoolChanged(a.pool.clone()),
    ]
}

/// Logs a release and returns its events.
pub(super) fn released(a: &Assignment) -> Vec<Event> {
    log::info!(
        POOL = a.pool.as_str(), ASSIGNMENT = a.id.as_str(), TARGET = a.target.to_string().as_str();
        "released CPUs {} of pool {} from {}", a.cpus, a.pool, a.target
    );
    vec![
        Event::AssignmentChanged { id: a.id.clone(), change: Change::Removed },
        Event::PoolChanged(a.pool.clone()),
    ]
}

/// A human description of an effect, for logs.
pub fn describe(effect: &Effect) -> String {
    match effect {
        Effect::CreateCgroup(p) => format!("create cgroup {p}"),
        Effect::RemoveCgroup(p) => format!("remove cgroup {p}"),
        Effect::SetCpus { key, cpus, .. } if cpus.is_empty() => format!("lift the CPU restriction of {key}"),
        Effect::SetCpus { key, cpus, .. } => format!("set CPUs of {key} to {cpus}"),
        Effect::SetMems { path, mems, .. } => format!("set memory nodes of cgroup {path} to {mems}"),
        Effect::SetPartition { path, partition } => match partition {
            plan::Partition::Member => format!("make cgroup {path} a member (no partition)"),
            plan::Partition::Parent(cpus) => {
                format!("let cgroup {path} grant CPUs {cpus} to isolated partitions")
            }
            plan::Partition::Isolated(cpus) => {
                format!("make cgroup {path} an isolated partition on CPUs {cpus}")
            }
        },
        Effect::SetQuota { key, millis: Some(m) } => format!("limit the CPU time of {key} to {m} millicpus"),
        Effect::SetQuota { key, millis: None } => format!("lift the CPU time limit of {key}"),
    }
}
