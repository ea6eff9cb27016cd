//! The owner loop: starting the engine from the saved state, the thread that takes requests
//! one at a time (grouping queued assigns and releases), reconciling the host with the state,
//! the drift check, and publishing snapshots.

use std::sync::Arc;

use tokio::sync::{broadcast, mpsc, watch};

use super::commands::Mutation;
use super::drift::Drift;
use super::keeper::Pass;
use super::ledger::{Ledger, MAX_GROUP};
use super::{ConfigSource, Engine, Event, Handle, Request, Snapshot};
use crate::config::ConfigError;
use crate::config::Settings;
use crate::core::plan::{self, LayoutOptions, Partitions};
use crate::core::pool::{Pool, PoolKind, PoolName};
use crate::core::state::{self, CgroupPath, Delta, State, StateData};
use crate::core::topology::Topology;
use crate::host::store::{Loaded, PrevCopy, RecordAt, Store, StoreError};
use crate::host::sysfs::{self, SysfsError};
use crate::host::Backend;

/// Why the engine could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Reading the topology failed.
    #[error("reading the CPU topology")]
    Topology(#[source] SysfsError),
    /// The configuration is invalid.
    #[error("the configuration is invalid")]
    Config(#[source] Box<ConfigError>),
    /// The state could not be opened, loaded or saved.
    #[error("the state in the state directory cannot be used")]
    Store(#[source] StoreError),
    /// The state file is intact but breaks the state's rules ([`StateData::validate`]): the
    /// daemon cannot tell which CPUs it really handed out, so it changes nothing.
    #[error(
        "`{}` has a valid checksum but its state is inconsistent: {}{prev}; {} the named assignments \
         by hand (see STATE RECOVERY in cpupoold(8))",
        path.display(),
        violations.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "),
        if matches!(prev, PrevCopy::Good(_)) { "or release" } else { "release" }
    )]
    Inconsistent {
        /// The state file.
        path: std::path::PathBuf,
        /// What is wrong, naming the assignments.
        violations: Vec<state::Violation>,
        /// The previous copy, and whether `--restore-previous-state` can use it.
        prev: PrevCopy,
    },
}

/// `--restore-previous-state`: installs what [`Store::restore_previous`] restores (the snapshot
/// and the journal's records before its damage, or `state.json.prev` and the journals after it)
/// if it keeps the state's rules; otherwise changes nothing.
///
/// A journal record whose change breaks the state's rules counts as damage of the journal
/// ([`replay_checked`]): the snapshot and the records before it are kept, as for a record that
/// does not check.
fn restore_previous_state(store: &Store) -> Result<Loaded<StateData>, StartError> {
    let prev = store.previous_checked(replay_checked).map(StateData::from).map_err(StartError::Store)?;
    if let Err(violations) = prev.validate() {
        let path = store.prev_path().to_owned();
        return Err(StartError::Inconsistent { path, violations, prev: PrevCopy::Itself });
    }
    let data =
        store.restore_previous_checked(replay_checked).map(StateData::from).map_err(StartError::Store)?;
    log::warn!("state restored from the previous good copy in `{}`", store.dir().display());
    Ok(Loaded::State(data))
}

/// Replays one journal record: the store knows nothing of states and their changes.
fn replay(state: &mut State, change: Delta) {
    state.apply(change);
}

/// Replays one journal record unless the change breaks the state's rules
/// ([`StateData::validate`]) on a state that kept them: then the record is refused, and the
/// store names it. A state that already breaks them (a bad snapshot) takes the change: the
/// fault is the snapshot's, and is reported against it. Checks the whole state at each record,
/// so it runs only once the quick load has found the state inconsistent, or to restore.
fn replay_checked(state: &mut State, change: Delta, _: &RecordAt) -> Result<(), String> {
    if state.check().is_err() {
        state.apply(change);
        return Ok(());
    }
    let mut next = state.clone();
    next.apply(change);
    match next.check() {
        Ok(()) => {
            *state = next;
            Ok(())
        }
        Err(violations) => Err(violations.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")),
    }
}

/// Where each assignment of a loaded state was last written: the journal record, or (absent)
/// the snapshot.
type Origins = std::collections::BTreeMap<state::AssignmentId, RecordAt>;

/// The snapshot with the journal replayed on it, and where each assignment came from.
fn load(store: &Store) -> Result<(Loaded<StateData>, Origins), StoreError> {
    let mut origins = Origins::new();
    let loaded = store.load_checked(|state: &mut State, change: Delta, at: &RecordAt| {
        for id in &change.remove {
            origins.remove(id);
        }
        for a in &change.upsert {
            origins.insert(a.id.clone(), at.clone());
        }
        state.apply(change);
        Ok(())
    })?;
    let loaded = match loaded {
        Loaded::Fresh => Loaded::Fresh,
        Loaded::State(state) => Loaded::State(StateData::from(state)),
    };
    Ok((loaded, origins))
}

/// The error for a loaded state that breaks the state's rules: the journal record that broke
/// them when the snapshot keeps them (found by loading again, checking each record), otherwise
/// the snapshot.
fn inconsistent(store: &Store, violations: Vec<state::Violation>) -> StartError {
    match store.load_checked(replay_checked) {
        Err(e @ StoreError::JournalRejected { .. }) => StartError::Store(e),
        _ => {
            StartError::Inconsistent { path: store.path().to_owned(), violations, prev: previous_copy(store) }
        }
    }
}

/// What `--restore-previous-state` would find, for the error message.
fn previous_copy(store: &Store) -> PrevCopy {
    let path = store.prev_path().to_owned();
    match store.previous(replay).map(StateData::from) {
        Ok(data) if data.validate().is_ok() => PrevCopy::Good(path),
        Ok(_) => PrevCopy::Inconsistent(path),
        Err(StoreError::NoPrevious { .. }) => PrevCopy::Absent,
        Err(_) => PrevCopy::Damaged(path),
    }
}

/// What starting found and did.
#[derive(Debug, Default)]
pub struct StartReport {
    /// Whether the state file was new.
    pub fresh: bool,
    /// Corrections made to the host to match the state.
    pub corrections: usize,
    /// Corrections that failed (logged).
    pub failed_corrections: usize,
}

impl Engine {
    /// Lets the engine read the configuration files itself: for
    /// [`Handle::reload_from_disk`] and pool edits.
    pub fn with_config(mut self, source: ConfigSource) -> Engine {
        self.config = Some(source);
        self
    }

    /// Reads the topology, resolves the pools, loads the state (or starts fresh), re-applies
    /// the state to the host and saves it.
    ///
    /// Persisted assignments that the configuration would strand are not dropped: the
    /// configuration is rejected, every stranded assignment is logged, and the persisted pools
    /// keep running until the configuration is fixed.
    pub fn start(
        settings: &Settings,
        backend: Box<dyn Backend>,
        restore_previous: bool,
    ) -> Result<(Engine, StartReport), StartError> {
        let topo = sysfs::read_topology(&settings.paths.sysfs_root).map_err(StartError::Topology)?;
        let pools = settings.resolve_pools(&topo).map_err(|e| StartError::Config(Box::new(e)))?;
        let checked = super::keepers::check(settings, &topo, &pools).map_err(StartError::Config)?;
        let store = Store::open(&settings.paths.state_dir).map_err(StartError::Store)?;
        // Before reading anything: a second daemon must not compact under a running one.
        store.lock_dir().map_err(StartError::Store)?;
        let mut report = StartReport::default();
        let (state, origins, config_error) =
            load_state(settings, &topo, pools, &store, restore_previous, &mut report)?;
        // Everything is applied from scratch at start: no change is pending.
        let mut state = state;
        state.take_changes();
        let (events, _) = broadcast::channel(1024);
        let snapshot = first_snapshot(&state, &topo, &store, config_error.clone(), backend.name());
        let (snapshots, _) = watch::channel(snapshot);
        let mut engine = Engine {
            ledger: Ledger {
                state: Arc::new(state),
                topo: Arc::new(topo),
                store,
                backend: Arc::from(backend),
                opts: LayoutOptions::default(),
            },
            lend_idle: settings.lend_idle,
            config_error,
            drift: Drift::default(),
            state_warnings: Vec::new(),
            events,
            snapshots,
            config: None,
            keepers: super::keepers::Keepers::new(settings, checked),
            kubelet: Arc::default(),
            slices: std::cell::RefCell::default(),
            origins: settings.origins.clone(),
            claims: super::claims::ClaimSpecs::new(settings),
        };
        engine.ledger.opts = engine.layout_options(&engine.ledger.state, &settings.host_cgroups);
        // What the files hold passes the checks a request passes before anything is applied;
        // what does not is dropped, and the save below makes that durable.
        engine.state_warnings = engine.admit_loaded_state(&origins);
        if !engine.state_warnings.is_empty() {
            engine.ledger.opts = engine.layout_options(&engine.ledger.state, &settings.host_cgroups);
        }
        let records = engine.ledger.take_records(&settings.paths.state_dir);
        let (done, failed) = engine.reconcile();
        report.corrections = done;
        report.failed_corrections = failed;
        let saved = engine.ledger.store.save(engine.ledger.state.data());
        if saved.is_ok() {
            super::claims::remove_records(&settings.paths.state_dir, &records);
        }
        engine.claims.restore(&engine.ledger.state);
        if let Err(e) = saved {
            // A state that was read is applied even when it cannot be compacted (a reboot with
            // /var full): the files still hold it, the next write must be a whole snapshot
            // (mutations are refused `NotDurable` until one succeeds). A fresh state that
            // cannot be written at all is an error.
            if report.fresh {
                return Err(StartError::Store(e));
            }
            log::warn!(
                "the state in `{}` was loaded and applied but could not be compacted; changes are refused until it can be written: {}",
                engine.ledger.store.dir().display(),
                super::error_chain(&e)
            );
            engine.ledger.store.mark_stale();
        }
        let events = engine.keep_host(Pass::Pools);
        // Nothing is served yet: irqbalance is told before the daemon says it is ready.
        engine.keepers.settle();
        engine.publish(events);
        Ok((engine, report))
    }

    /// Admits every assignment of the state just loaded as a request for it would be admitted
    /// ([`Engine::admit_loaded`]), in the order they were written (the snapshot's, then the
    /// journal's records), each against those admitted before it. One that is refused is
    /// dropped from the state, with an error naming the file and record it came from; returns
    /// those errors (the snapshot shows them).
    fn admit_loaded_state(&mut self, origins: &Origins) -> Vec<String> {
        let all = self.ledger.state.clone();
        let next_id = all.data().next_id;
        let delta = |upsert: Vec<state::Assignment>, remove: Vec<state::AssignmentId>| Delta {
            pools: None,
            upsert,
            remove,
            next_id,
            ..Delta::default()
        };
        let mut order: Vec<&state::Assignment> = all.assignments().values().collect();
        order.sort_by_key(|a| origins.get(&a.id).map_or(0, |at| at.seq));
        let mut next = (*all).clone();
        next.apply(delta(Vec::new(), all.assignments().keys().cloned().collect()));
        let mut dropped = Vec::new();
        for a in order {
            next.apply(delta(vec![a.clone()], Vec::new()));
            let Err(e) = self.ledger.admit_loaded(&next, a) else { continue };
            next.apply(delta(Vec::new(), vec![a.id.clone()]));
            let from = origins
                .get(&a.id)
                .map_or_else(|| format!("`{}`", self.ledger.store.path().display()), ToString::to_string);
            let what = format!(
                "assignment {} (CPUs {} of pool {} for {}) in {from} is refused: {e}",
                a.id, a.cpus, a.pool, a.target
            );
            log::error!(
                ASSIGNMENT = a.id.as_str();
                "{what}; it is dropped, not applied, and the state is saved without it"
            );
            dropped.push(what);
        }
        if !dropped.is_empty() {
            next.take_changes();
            self.ledger.state = Arc::new(next);
        }
        dropped
    }

    /// What the layout of `state` depends on. Lending needs the isolated pools to be remote
    /// partitions: on kernels without `cpuset.cpus.exclusive` the parent of isolated pools is a
    /// partition itself, and no CPU below it can be lent.
    pub(super) fn layout_options(&self, state: &State, host_cgroups: &[CgroupPath]) -> LayoutOptions {
        let isolating = state.pools().values().any(|p| p.isolate);
        let remote = self.ledger.backend.remote_partitions();
        let lend_idle = self.lend_idle && (!isolating || remote);
        if self.lend_idle && !lend_idle {
            log::warn!(
                "lend_idle is off while pools are isolated: this kernel has no cpuset.cpus.exclusive (Linux 6.7)"
            );
        }
        let partitions = plan::partitions(state, remote, self.ledger.backend.kubelet_pods());
        if partitions == Partitions::Off && isolating {
            log::warn!("{}", plan::no_partitions_reason(state));
        }
        LayoutOptions {
            host_cgroups: host_cgroups.to_vec(),
            lend_idle,
            unpooled: self.ledger.opts.unpooled.clone(),
            partitions,
        }
    }

    /// Makes the host match the state ([`super::drift::Drift::reconcile`]).
    pub(super) fn reconcile(&mut self) -> (usize, usize) {
        self.drift.reconcile(&self.ledger)
    }

    /// Runs the engine on its own thread until every [`Handle`] is dropped; an error when the
    /// system refuses the thread.
    pub fn spawn(self) -> Result<(Handle, std::thread::JoinHandle<()>), crate::threads::ThreadError> {
        let (tx, rx) = mpsc::channel(256);
        let handle = Handle {
            tx,
            snapshots: self.snapshots.subscribe(),
            events: self.events.clone(),
            backend: self.ledger.backend.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("cpupoold-engine".into())
            .spawn(move || self.run(rx))
            .map_err(|source| crate::threads::ThreadError::Spawn { what: "the engine", source })?;
        Ok((handle, thread))
    }

    pub(super) fn run(mut self, mut rx: mpsc::Receiver<Request>) {
        while let Some(first) = rx.blocking_recv() {
            // Group commit: Assign and Release requests already queued behind this one are
            // decided together and share one apply and one durable save.
            let mut group = Vec::new();
            let mut next = Some(first);
            while let Some(req) = next.take() {
                match req {
                    Request::Assign(spec, reply) => group.push(Mutation::Assign(spec, reply)),
                    Request::Release(id, reply) => group.push(Mutation::Release(id, reply)),
                    other => {
                        self.mutate(std::mem::take(&mut group));
                        self.handle(other);
                    }
                }
                if group.len() < MAX_GROUP {
                    next = rx.try_recv().ok();
                }
            }
            self.mutate(group);
        }
        self.keepers.stop();
    }

    pub(super) fn publish(&self, mut events: Vec<Event>) {
        // A group repeats a pool's event once per assignment: keep the last of each, which
        // still follows every assignment event of that pool.
        let mut seen = std::collections::HashSet::new();
        let mut keep: Vec<bool> = events
            .iter()
            .rev()
            .map(|e| match e {
                Event::PoolChanged(p) => seen.insert(p.clone()),
                Event::AssignmentChanged { .. } => true,
            })
            .collect();
        keep.reverse();
        let mut keep = keep.into_iter();
        events.retain(|_| keep.next().unwrap_or(true));
        let mut slices = self.slices.borrow_mut();
        let pools = self.ledger.state.pools().values().filter(|p| p.kind != PoolKind::Reserved);
        if !pools.clone().map(|p| &p.name).eq(slices.iter().map(|(n, _)| n)) {
            *slices = pools.map(|p| (p.name.clone(), plan::pool_slice(&p.name))).collect();
        }
        let statuses: Vec<(&PoolName, Option<String>)> = slices
            .iter()
            .map(|(name, slice)| (name, self.ledger.backend.kept_partition_status(slice)))
            .collect();
        let previous = self.snapshots.borrow().partitions.clone();
        let same = statuses.iter().filter(|(_, s)| s.is_some()).count() == previous.len()
            && statuses.iter().all(|(name, s)| s.is_none() || previous.get(*name) == s.as_ref());
        let partitions = if same {
            previous
        } else {
            Arc::new(statuses.into_iter().filter_map(|(name, s)| Some((name.clone(), s?))).collect())
        };
        drop(slices);
        // The drift reader builds the layout from these: a new Arc only when they changed.
        let layout = match &self.snapshots.borrow().layout {
            same if **same == self.ledger.opts => same.clone(),
            _ => Arc::new(self.ledger.opts.clone()),
        };
        let snap = Snapshot {
            state: self.ledger.state.clone(),
            topology: self.ledger.topo.clone(),
            state_path: self.ledger.store.path().to_owned(),
            config_error: self.config_error.clone(),
            degraded: self.drift.degraded.clone(),
            state_warnings: Arc::new(self.state_warnings.clone()),
            partitions,
            backend: self.ledger.backend.name(),
            layout,
            assignment_health: Arc::new(
                self.drift
                    .health
                    .iter()
                    .filter(|(id, _)| self.ledger.state.assignments().contains_key(*id))
                    .map(|(id, why)| (id.clone(), why.clone()))
                    .collect(),
            ),
            kubelet: self.kubelet.clone(),
            reports: Arc::new(self.keepers.reports()),
        };
        self.snapshots.send_replace(snap);
        for e in events {
            // Nobody listening is fine.
            let _ = self.events.send(e);
        }
    }
}

/// The state `store` holds (or, with `restore_previous`, its previous copy, or a fresh one with
/// `pools`), with the configuration's pools set on it; the files' origins; and why the
/// configuration was not taken, when it would strand saved assignments.
fn load_state(
    settings: &Settings,
    topo: &Topology,
    pools: Vec<Pool>,
    store: &Store,
    restore_previous: bool,
    report: &mut StartReport,
) -> Result<(State, Origins, Option<String>), StartError> {
    let mut config_error = None;
    // A file that is damaged or breaks the state's rules is evidence: it is left alone unless
    // the operator asked for the previous copy.
    let (loaded, origins) = match load(store) {
        Ok((Loaded::State(data), origins)) => match data.validate() {
            Ok(()) => (Loaded::State(data), origins),
            Err(_) if restore_previous => (restore_previous_state(store)?, Origins::new()),
            Err(violations) => return Err(inconsistent(store, violations)),
        },
        Err(_) if restore_previous => (restore_previous_state(store)?, Origins::new()),
        other => other.map_err(StartError::Store)?,
    };
    let state = match loaded {
        Loaded::Fresh => {
            report.fresh = true;
            State::with_pools(pools)
        }
        Loaded::State(data) => {
            let mut state = State::from(data);
            // Count pools keep the CPUs saved for them (a pool created at run time took
            // CPUs others did not hold, which a fresh resolution would not give it again).
            let pools = settings
                .resolve_pools_keeping(topo, &plan::pool_cpus(&state))
                .map_err(|e| StartError::Config(Box::new(e)))?;
            if let Err(misfits) = state.set_pools(pools) {
                for m in &misfits {
                    log::error!(
                        POOL = m.pool.as_str(), ASSIGNMENT = m.id.as_str();
                        "configuration rejected: {m}"
                    );
                }
                let reasons: Vec<String> = misfits.iter().map(ToString::to_string).collect();
                config_error = Some(format!(
                    "the configuration would strand assignments ({}); running the pools from the state file",
                    reasons.join("; ")
                ));
            }
            state
        }
    };
    Ok((state, origins, config_error))
}

/// The snapshot published until start has applied the state: the state as loaded, nothing
/// read back yet.
fn first_snapshot(
    state: &State,
    topo: &Topology,
    store: &Store,
    config_error: Option<String>,
    backend: &'static str,
) -> Snapshot {
    Snapshot {
        state: Arc::new(state.clone()),
        topology: Arc::new(topo.clone()),
        state_path: store.path().to_owned(),
        config_error,
        degraded: Vec::new(),
        state_warnings: Arc::default(),
        partitions: Arc::default(),
        backend,
        layout: Arc::default(),
        assignment_health: Arc::default(),
        kubelet: Arc::default(),
        reports: Arc::default(),
    }
}
