//! What each request does: the dispatch of the owner loop ([`Engine::handle`]) and, per
//! request kind, the parts it drives (the ledger, the keepers, the drift judge, the kubelet
//! view) and the events it publishes. A new request kind is a [`Request`] variant with its
//! [`super::Handle`] method (handle.rs), and its arm here.

use tokio::sync::oneshot;

use super::keeper::Pass;
use super::ledger::{assigned, released, Decided, Ledger, Made};
use super::observe::Found;
use super::{error_chain, Change, DriftReport, Engine, EngineError, Event, KubeletUpdate, Request};
use crate::core::state::{self, AssignSpec, Assignment, Outcome};

/// An Assign or Release waiting in a group.
pub(super) enum Mutation {
    Assign(AssignSpec, oneshot::Sender<Result<Outcome<Assignment>, EngineError>>),
    Release(String, oneshot::Sender<Result<Assignment, EngineError>>),
}

impl Engine {
    /// Carries out one request (the owner loop groups Assign and Release first, see
    /// [`Engine::mutate`]).
    pub(super) fn handle(&mut self, req: Request) {
        match req {
            Request::Assign(spec, reply) => self.one(Mutation::Assign(spec, reply)),
            Request::Release(id, reply) => self.one(Mutation::Release(id, reply)),
            Request::Reload(settings, reply) => {
                let _ = reply.send(self.reload(settings));
            }
            Request::ReloadFromDisk(reply) => {
                let result = match &self.config {
                    Some(src) => {
                        let settings = src.load(None).map(Box::new);
                        self.reload(settings)
                    }
                    None => Err(EngineError::NoConfigFiles),
                };
                let _ = reply.send(result);
            }
            Request::EditPool(edit, reply) => {
                let _ = reply.send(self.edit_pool(&edit));
            }
            Request::Run(spec, reply) => {
                let made = self.booking(|ledger| ledger.run_process(spec.clone()));
                let _ = reply.send(self.published(made));
            }
            Request::Reapply(reply) => {
                let (done, failed) = self.reconcile();
                let events = self.keep_host(Pass::Layout);
                self.publish(events);
                if done > 0 || failed > 0 {
                    log::info!(
                        "read back the host and re-applied the state: {done} corrections, {failed} failed"
                    );
                }
                let _ = reply.send(Ok(done));
            }
            Request::Ping(reply) => {
                let _ = reply.send(());
            }
            Request::SampleIsolation(reply) => {
                self.sample_isolation();
                self.publish(Vec::new());
                let _ = reply.send(());
            }
            Request::CheckDrift(found, reply) => {
                let _ = reply.send(Ok(self.correct_drift(*found)));
            }
            Request::Retarget(r, reply) => {
                let _ = reply.send(self.retarget(r));
            }
            Request::SetUnpooled(cgroups, reply) => {
                let _ = reply.send(self.ledger.set_unpooled(cgroups));
            }
            Request::AssignAll(specs, reply) => {
                let made = self.booking(|ledger| ledger.assign_all(specs.clone()));
                let _ = reply.send(self.published(made));
            }
            Request::Kubelet(update, reply) => {
                let _ = reply.send(Ok(self.update_kubelet(update)));
            }
            Request::PrepareClaim(p, reply) => {
                let made = self.ledger.prepare_claim(*p, &self.claims);
                let _ = reply.send(self.published(made));
            }
            Request::UnprepareClaim(uid, reply) => {
                let made = self.ledger.unprepare_claim(&uid, &self.claims);
                let _ = reply.send(self.published(made));
            }
        }
    }

    /// One Assign or Release on its own.
    fn one(&mut self, m: Mutation) {
        match m {
            Mutation::Assign(spec, reply) => {
                let made = self.booking(|ledger| {
                    ledger.stamp(spec.clone()).map_err(EngineError::from).and_then(|s| ledger.assign(&s))
                });
                let _ = reply.send(self.published(made));
            }
            Mutation::Release(id, reply) => {
                let made = self.ledger.release(&id);
                let _ = reply.send(self.published(made));
            }
        }
    }

    /// Decides a group of mutations in order on one copy of the state, then applies and saves
    /// the result once. If that fails, nothing of the group was kept, and each is done again on
    /// its own, so every caller gets the answer it would have had alone.
    pub(super) fn mutate(&mut self, group: Vec<Mutation>) {
        if !group.is_empty() {
            crate::counters::counters().batch(group.len());
        }
        if group.len() <= 1 {
            for m in group {
                self.one(m);
            }
            return;
        }
        let (mut next, mut decided) = self.decide_group(&group);
        // A booking refused for want of capacity a process that ended still holds is decided
        // again once that is released (see `exited`).
        let short: std::collections::BTreeSet<String> = decided
            .iter()
            .filter_map(|d| match d {
                Decided::Assign(r) => short_pool(r),
                Decided::Release(_) => None,
            })
            .collect();
        // Every short pool's ended processes, not only the first that frees something.
        let mut freed = false;
        for pool in &short {
            freed |= self.release_ended(pool);
        }
        if freed {
            (next, decided) = self.decide_group(&group);
        }
        let changed = decided
            .iter()
            .any(|d| matches!(d, Decided::Assign(Ok(Outcome::Changed(_))) | Decided::Release(Ok(_))));
        if changed {
            let before = self.ledger.state.clone();
            let changes = match self.ledger.commit(next) {
                Ok(changes) => changes,
                Err(e) => {
                    log::warn!(
                        "applying {} grouped changes failed ({}); doing them one by one",
                        group.len(),
                        error_chain(&e)
                    );
                    for m in group {
                        self.one(m);
                    }
                    return;
                }
            };
            self.ledger.take_back_unenforced(&mut decided, &before, &changes);
        }
        let mut events = Vec::new();
        for d in &decided {
            match d {
                Decided::Assign(Ok(Outcome::Changed(a))) => events.extend(assigned(a)),
                Decided::Release(Ok(a)) => events.extend(released(a)),
                _ => {}
            }
        }
        // Publish before answering: a caller that reads right after its reply must see its
        // change (tests/load.rs caught GetAssignment missing a just-acknowledged Assign).
        self.publish(events);
        for (m, d) in group.into_iter().zip(decided) {
            match (m, d) {
                (Mutation::Assign(_, reply), Decided::Assign(r)) => {
                    let _ = reply.send(r);
                }
                (Mutation::Release(_, reply), Decided::Release(r)) => {
                    let _ = reply.send(r.map_err(EngineError::from));
                }
                // `decided` was made from `group` in order.
                _ => {}
            }
        }
    }

    /// Decides `group` in order on one copy of the state.
    fn decide_group(&self, group: &[Mutation]) -> (state::State, Vec<Decided>) {
        let mut next = (*self.ledger.state).clone();
        let decided = group
            .iter()
            .map(|m| match m {
                Mutation::Assign(spec, _) => Decided::Assign(
                    self.ledger
                        .stamp(spec.clone())
                        .and_then(|s| self.ledger.decide(&mut next, &s))
                        .map_err(EngineError::from),
                ),
                Mutation::Release(id, _) => Decided::Release(next.release(id)),
            })
            .collect();
        (next, decided)
    }

    /// Makes a booking with `book`; refused for want of capacity, once more after the pool's
    /// assignments whose process ended are released (and published), if there were any.
    fn booking<T>(
        &mut self,
        mut book: impl FnMut(&mut Ledger) -> Result<T, EngineError>,
    ) -> Result<T, EngineError> {
        let made = book(&mut self.ledger);
        match short_pool(&made) {
            Some(pool) if self.release_ended(&pool) => book(&mut self.ledger),
            _ => made,
        }
    }

    /// Releases (and publishes) `pool`'s assignments whose process ended; whether there were any.
    fn release_ended(&mut self, pool: &str) -> bool {
        let (n, events) = self.ledger.release_ended(pool);
        if n > 0 {
            self.publish(events);
        }
        n > 0
    }

    pub(super) fn retarget(
        &mut self,
        r: super::handle::Retarget,
    ) -> Result<Outcome<Assignment>, EngineError> {
        let mut next = (*self.ledger.state).clone();
        let out = next.retarget(&r.id, r.target, r.container)?;
        if let Outcome::Changed(a) = &out {
            // The rules a new assignment's target passes: a container's cgroup that names a
            // host slice or a pool's slice is not written.
            self.ledger.check_protected(&next, a)?;
            let before = self.ledger.state.clone();
            let changes = self.ledger.commit(next)?;
            let mut events = Vec::new();
            if r.verify {
                self.ledger.verify_or_undo(&before, &changes, a)?;
            } else if let Err(e) = self.ledger.verify(a) {
                // Kept (the target runs already, and taking it back would leave it
                // unconfined), but degraded at once rather than counted as applied until the
                // next drift checks find it.
                let why = error_chain(&e);
                log::warn!(ASSIGNMENT = a.id.as_str(); "assignment {} is degraded: {why}", a.id);
                self.drift.health.insert(a.id.clone(), why);
                events.push(Event::AssignmentChanged { id: a.id.clone(), change: Change::Degraded });
            }
            log::info!(
                POOL = a.pool.as_str(), ASSIGNMENT = a.id.as_str(), TARGET = a.target.to_string().as_str();
                "assignment {} (CPUs {}) now applies to {}", a.id, a.cpus, a.target
            );
            // Bound to a container (read back: applied), or held for none again (allocated);
            // degraded says itself. What an earlier target was found to lack is not this one's.
            if events.is_empty() {
                self.drift.health.remove(&a.id);
            }
            let running = self.kubelet.running.contains_key(&a.id);
            let change = match a.phase(None, running) {
                state::phase::Phase::Allocated => Some(Change::Allocated),
                _ if events.is_empty() => Some(Change::Applied),
                _ => None,
            };
            events.extend(change.map(|change| Event::AssignmentChanged { id: a.id.clone(), change }));
            self.publish(events);
        }
        Ok(out)
    }

    /// Corrects what a drift reading found, judged against the current state, passes the
    /// keepers, and publishes the assignments' health changes (see [`super::drift`]).
    fn correct_drift(&mut self, found: Found) -> DriftReport {
        let (corrected, failed) = self.drift.correct(&self.ledger, &found);
        // Published after the assignments' events, as they came when housekeeping passed last.
        let kept = self.keep_host(Pass::Pools);
        let (mut events, degraded) = self.drift.judge(&self.ledger, &found);
        events.extend(kept);
        let report = DriftReport { corrected, failed, degraded };
        if corrected > 0 || failed > 0 || !events.is_empty() {
            log::info!("drift check: {corrected} corrections, {failed} failed, {} degraded", report.degraded);
        }
        self.publish(events);
        report
    }

    /// Records what the kubelet wing observed ([`super::kubelet`]); publishes (and answers
    /// `true`) only when it changed the view, or for a container started, whether the
    /// read-back holds. A pod cgroup come or gone moves the isolated partitions, and the
    /// keepers that read the layout back pass.
    fn update_kubelet(&mut self, update: KubeletUpdate) -> bool {
        let seen = super::kubelet::update(&mut self.kubelet, &self.ledger, update);
        let mut events = seen.publish;
        if seen.follow_pods {
            let moved = super::kubelet::follow_pods(&mut self.ledger);
            // The isolated pools' reports say what became of their partitions.
            events = Some(if moved { self.keep_host(Pass::Layout) } else { Vec::new() });
        }
        if let Some(events) = events {
            self.publish(events);
        }
        seen.answer
    }

    /// Publishes what a part made, and answers with its value.
    fn published<T>(&self, made: Result<Made<T>, EngineError>) -> Result<T, EngineError> {
        made.map(|(value, events)| {
            self.publish(events);
            value
        })
    }
}

/// The pool a refusal was for want of capacity in.
fn short_pool<T>(r: &Result<T, EngineError>) -> Option<String> {
    match r {
        Err(EngineError::State(state::Error::InsufficientCapacity { pool, .. })) => Some(pool.clone()),
        _ => None,
    }
}
