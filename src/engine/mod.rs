//! The engine: the one owner of the state.
//!
//! It runs on its own thread. Adapters send it [`Request`]s through a [`Handle`] and await the
//! reply; reads never wait for it, because every committed state is published as an immutable
//! [`Snapshot`] on a watch channel.
//!
//! A mutation is decided by the pure core on a copy of the state, turned into effects by the
//! planner, executed by the backend, made durable by the store, and only then published and
//! acknowledged. Effects that take CPUs away run before the save and those that give CPUs after
//! it ([`plan::kept`]), so a crash never leaves CPUs with a target the saved state lacks. If an effect or the save fails, the effects already executed are undone by
//! executing the reverse plan, and the caller is told.

mod irq;
pub use irq::IrqReport;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{broadcast, mpsc, oneshot, watch};

pub mod housekeeping;

use crate::config::runtime::{Dropin, DropinError, PoolEdit};
use crate::config::{self, ConfigDirs, ConfigError, Settings};
use crate::core::cpuset::CpuSet;
use crate::core::plan::{self, Effect, Key, Layout, LayoutOptions, Placement, Role};
use crate::core::pool::{Pool, PoolKind, PoolName};
use crate::core::state::{
    self, AssignSpec, Assignment, AssignmentId, CgroupPath, Outcome, State, StateData, Target,
};
use crate::core::topology::Topology;
use crate::host::cgroupfs::HostError;
use crate::host::store::{Loaded, PrevCopy, Store, StoreError};
use crate::host::sysfs::{self, SysfsError};
use crate::host::Backend;

/// A change other parties may want to hear about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A pool was added, removed, resized, or its free capacity changed.
    PoolChanged(PoolName),
    /// An assignment was added or removed.
    AssignmentChanged {
        /// The assignment.
        id: AssignmentId,
        /// What happened.
        change: Change,
    },
}

/// What happened to an assignment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Created.
    Added,
    /// Released.
    Removed,
    /// What the kernel enforces on its target no longer matches its CPUs, and reconciling
    /// could not restore it (the reason is in the snapshot's `assignment_health`).
    Degraded,
    /// Enforced as assigned again after being degraded.
    Restored,
}

impl Change {
    /// `added` or `removed`, as the APIs spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Change::Added => "added",
            Change::Removed => "removed",
            Change::Degraded => "degraded",
            Change::Restored => "restored",
        }
    }
}

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The request itself was refused; nothing changed.
    #[error(transparent)]
    State(#[from] state::Error),
    /// Applying the change to the host failed; it was rolled back.
    #[error("applying the change failed and was rolled back")]
    Apply(#[source] HostError),
    /// The change could not be made durable; it was rolled back.
    #[error("saving the state failed; the change was rolled back")]
    Store(#[source] StoreError),
    /// A new configuration is invalid; the running one stays.
    #[error("the new configuration is invalid; the running one stays")]
    Config(#[source] Box<ConfigError>),
    /// A new configuration would take CPUs from live assignments; the running one stays.
    #[error("the new configuration would strand assignments; the running one stays: {0}")]
    Stranded(String),
    /// Reading the topology failed.
    #[error("reading the CPU topology failed")]
    Topology(#[source] SysfsError),
    /// The runtime drop-in could not be written; nothing changed.
    #[error("writing the runtime drop-in failed; nothing changed")]
    Dropin(#[source] DropinError),
    /// A pool edit would not take effect: a file read after the runtime drop-in sets the key.
    #[error("`{key}` is set again by `{}`, which is read after `{}`; change it there", file.display(), dropin.display())]
    Overridden {
        /// The key.
        key: String,
        /// The file that wins.
        file: std::path::PathBuf,
        /// The runtime drop-in.
        dropin: std::path::PathBuf,
    },
    /// Pool edits need configuration files, and this engine has none.
    #[error("this daemon runs without configuration files, so pools cannot be changed at run time")]
    NoConfigFiles,
    /// The engine is gone (shutting down).
    #[error("the daemon is shutting down")]
    Stopped,
}

/// Where the engine reads its configuration: on a reload request and to check a pool edit.
pub struct ConfigSource {
    /// The configuration directories.
    pub dirs: ConfigDirs,
    /// Adjusts what was loaded (the sandbox confines every root to its directory).
    pub adjust: Box<dyn Fn(&mut Settings) + Send>,
}

impl ConfigSource {
    /// Loads the settings, with `replace` standing in for one file if given.
    pub fn load(&self, replace: Option<(&std::path::Path, Option<&str>)>) -> Result<Settings, ConfigError> {
        let mut settings = match replace {
            Some(r) => config::load_with(&self.dirs, r)?,
            None => config::load(&self.dirs)?,
        };
        (self.adjust)(&mut settings);
        Ok(settings)
    }
}

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

/// What the APIs read: one committed state, never torn.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// Pools and assignments.
    pub state: Arc<State>,
    /// The host topology.
    pub topology: Arc<Topology>,
    /// The state file.
    pub state_path: std::path::PathBuf,
    /// Why the configuration on disk is not the one running, if it is not.
    pub config_error: Option<String>,
    /// Pools whose cgroups could not all be applied at the last reconcile.
    pub degraded: Vec<String>,
    /// The kernel's word on each pool slice's partition (`member`, `isolated`,
    /// `isolated invalid (...)`), read after every change.
    pub partitions: Arc<std::collections::BTreeMap<PoolName, String>>,
    /// `cgroupfs` or `systemd`.
    pub backend: &'static str,
    /// Assignments whose target the kernel does not confine to their CPUs, with the reason,
    /// found by the last drift check and not restored by it.
    pub assignment_health: Arc<std::collections::BTreeMap<AssignmentId, String>>,
    /// Isolation: partition validity, workqueue masks, the kernel's own isolation and the
    /// health measured on each isolated pool.
    pub isolation: Arc<housekeeping::IsolationReport>,
    /// Interrupt affinity as the last pass left it (see [`irq`]).
    pub irq: Arc<IrqReport>,
}

impl Snapshot {
    /// The one-line summary for `STATUS=` and logs.
    pub fn summary(&self) -> String {
        let mut s =
            format!("{} pools, {} assignments", self.state.pools().len(), self.state.assignments().len());
        if !self.assignment_health.is_empty() {
            s.push_str(&format!("; {} degraded", self.assignment_health.len()));
        }
        if self.config_error.is_some() {
            s.push_str("; configuration on disk rejected, running the last good one");
        }
        s
    }
}

/// A request to the engine.
pub enum Request {
    /// Assign CPUs.
    Assign(AssignSpec, oneshot::Sender<Result<Outcome<Assignment>, EngineError>>),
    /// Release an assignment.
    Release(String, oneshot::Sender<Result<Assignment, EngineError>>),
    /// Apply a new configuration, or record why it could not be read.
    Reload(Result<Box<Settings>, ConfigError>, oneshot::Sender<Result<bool, EngineError>>),
    /// Read the configuration files again and apply them (SIGHUP).
    ReloadFromDisk(oneshot::Sender<Result<bool, EngineError>>),
    /// Create, resize or delete a pool, persisted in the runtime drop-in.
    EditPool(PoolEdit, oneshot::Sender<Result<Option<Pool>, EngineError>>),
    /// Assign CPUs to a process and start it a scope in the pool's slice (where systemd runs),
    /// or confine it in place (elsewhere). The target of the spec is `pid:N`.
    Run(AssignSpec, oneshot::Sender<Result<Outcome<Assignment>, EngineError>>),
    /// Read back the host and correct what differs from the state (after systemd reloaded).
    Reapply(oneshot::Sender<Result<usize, EngineError>>),
    /// Answer, to prove the engine thread is alive (watchdog).
    Ping(oneshot::Sender<()>),
    /// Sample the isolation health counters.
    SampleIsolation(oneshot::Sender<()>),
    /// Look for drift: correct what differs from the state, then read back what the kernel
    /// enforces on every assignment's target and mark those that differ degraded.
    CheckDrift(oneshot::Sender<Result<DriftReport, EngineError>>),
    /// Point an assignment at another target, keeping its CPUs, and record its container (the
    /// device plugin, once it knows the container of a kubelet allocation).
    Retarget(
        String,
        state::Target,
        Option<state::Container>,
        oneshot::Sender<Result<Outcome<Assignment>, EngineError>>,
    ),
    /// Keep these container cgroups off the exclusive pools' CPUs, and no others (the device
    /// plugin, for the kubelet's containers that use no pool).
    SetUnpooled(std::collections::BTreeSet<CgroupPath>, oneshot::Sender<Result<usize, EngineError>>),
}

/// How adapters reach the engine.
#[derive(Clone)]
pub struct Handle {
    tx: mpsc::Sender<Request>,
    snapshots: watch::Receiver<Snapshot>,
    events: broadcast::Sender<Event>,
}

impl Handle {
    async fn call<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T, EngineError>>) -> Request,
    ) -> Result<T, EngineError> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(make(tx)).await.map_err(|_| EngineError::Stopped)?;
        rx.await.map_err(|_| EngineError::Stopped)?
    }

    /// Assigns CPUs.
    pub async fn assign(&self, spec: AssignSpec) -> Result<Outcome<Assignment>, EngineError> {
        self.call(|tx| Request::Assign(spec, tx)).await
    }

    /// Assigns CPUs to process `pid:N` of `spec` and starts it a scope in the pool's slice
    /// where systemd runs (the assignment's target is then that scope); elsewhere confines the
    /// process itself.
    pub async fn run(&self, spec: AssignSpec) -> Result<Outcome<Assignment>, EngineError> {
        self.call(|tx| Request::Run(spec, tx)).await
    }

    /// Reads back the host and corrects what differs from the state; returns the corrections.
    pub async fn reapply(&self) -> Result<usize, EngineError> {
        self.call(Request::Reapply).await
    }

    /// Releases an assignment.
    pub async fn release(&self, id: &str) -> Result<Assignment, EngineError> {
        let id = id.to_owned();
        self.call(|tx| Request::Release(id, tx)).await
    }

    /// Applies a new configuration, or records that the one on disk could not be read (it
    /// shows in the status). `Ok(false)`: nothing changed.
    pub async fn reload(&self, settings: Result<Settings, ConfigError>) -> Result<bool, EngineError> {
        self.call(|tx| Request::Reload(settings.map(Box::new), tx)).await
    }

    /// Reads the configuration files again and applies them, like [`Handle::reload`].
    pub async fn reload_from_disk(&self) -> Result<bool, EngineError> {
        self.call(Request::ReloadFromDisk).await
    }

    /// Creates, resizes or deletes a pool; returns the pool as it now is (`None` once deleted).
    pub async fn edit_pool(&self, edit: PoolEdit) -> Result<Option<Pool>, EngineError> {
        self.call(|tx| Request::EditPool(edit, tx)).await
    }

    /// Points an assignment at another target, keeping its CPUs, records the container it
    /// serves, and applies it.
    pub async fn retarget(
        &self,
        id: &str,
        target: state::Target,
        container: Option<state::Container>,
    ) -> Result<Outcome<Assignment>, EngineError> {
        let id = id.to_owned();
        self.call(|tx| Request::Retarget(id, target, container, tx)).await
    }

    /// Keeps exactly these container cgroups off the exclusive pools' CPUs; returns how many
    /// cgroups were written. Not saved: the device plugin says it again after a restart.
    pub async fn set_unpooled(
        &self,
        cgroups: std::collections::BTreeSet<CgroupPath>,
    ) -> Result<usize, EngineError> {
        self.call(|tx| Request::SetUnpooled(cgroups, tx)).await
    }

    /// Corrects drift and reads back every assignment's target (see [`Request::CheckDrift`]).
    pub async fn check_drift(&self) -> Result<DriftReport, EngineError> {
        self.call(Request::CheckDrift).await
    }

    /// Samples the isolation health counters (the daemon's health tick).
    pub async fn sample_isolation(&self) -> Result<(), EngineError> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(Request::SampleIsolation(tx)).await.map_err(|_| EngineError::Stopped)?;
        rx.await.map_err(|_| EngineError::Stopped)
    }

    /// Waits until the engine thread answers.
    pub async fn ping(&self) -> Result<(), EngineError> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(Request::Ping(tx)).await.map_err(|_| EngineError::Stopped)?;
        rx.await.map_err(|_| EngineError::Stopped)
    }

    /// The current committed state.
    pub fn snapshot(&self) -> Snapshot {
        self.snapshots.borrow().clone()
    }

    /// A stream of committed changes.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }
}

/// `--restore-previous-state`: installs `state.json.prev` if it decodes and keeps the state's
/// rules; otherwise changes nothing.
fn restore_previous_state(store: &Store) -> Result<Loaded<StateData>, StartError> {
    let prev = store.previous::<StateData>().map_err(StartError::Store)?;
    if let Err(violations) = prev.validate() {
        let path = store.prev_path().to_owned();
        return Err(StartError::Inconsistent { path, violations, prev: PrevCopy::Itself });
    }
    let data = store.restore_previous::<StateData>().map_err(StartError::Store)?;
    log::warn!("state restored from the previous good copy `{}`", store.prev_path().display());
    Ok(Loaded::State(data))
}

/// What `--restore-previous-state` would find, for the error message.
fn previous_copy(store: &Store) -> PrevCopy {
    let path = store.prev_path().to_owned();
    match store.previous::<StateData>() {
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

/// What a drift check found and did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct DriftReport {
    /// Corrections made (a file rewritten, a property set again).
    pub corrected: usize,
    /// Corrections that failed.
    pub failed: usize,
    /// Assignments degraded after the check.
    pub degraded: usize,
}

/// The engine. Build it with [`Engine::start`], then [`Engine::spawn`] it.
pub struct Engine {
    state: Arc<State>,
    topo: Arc<Topology>,
    store: Store,
    backend: Box<dyn Backend>,
    /// `daemon.lend_idle` as configured; see [`Engine::layout_options`].
    lend_idle: bool,
    opts: LayoutOptions,
    config_error: Option<String>,
    degraded: Vec<String>,
    /// See [`Snapshot::assignment_health`].
    health: std::collections::BTreeMap<AssignmentId, String>,
    /// Assignments the last drift check found not enforced for the first time.
    suspects: std::collections::BTreeSet<AssignmentId>,
    events: broadcast::Sender<Event>,
    snapshots: watch::Sender<Snapshot>,
    config: Option<ConfigSource>,
    /// Workqueue masks, partition validity, isolation health; `None` until
    /// [`Engine::with_housekeeping`].
    hk: Option<housekeeping::Housekeeping>,
    irq: irq::IrqManager,
}

impl Engine {
    /// Lets the engine read the configuration files itself: for
    /// [`Handle::reload_from_disk`] and pool edits.
    pub fn with_config(mut self, source: ConfigSource) -> Engine {
        self.config = Some(source);
        self
    }

    /// Lets the engine keep kernel housekeeping off the isolated pools and measure them; fits
    /// the workqueue masks to the pools now.
    pub fn with_housekeeping(mut self, roots: housekeeping::Roots) -> Engine {
        self.hk = Some(housekeeping::Housekeeping::new(roots));
        let events = self.sync_housekeeping();
        self.sample_isolation();
        self.publish(events);
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
        housekeeping::check_housekeeping(settings, &pools).map_err(StartError::Config)?;
        let store = Store::open(&settings.paths.state_dir).map_err(StartError::Store)?;
        let mut report = StartReport::default();
        let mut config_error = None;
        // A file that is damaged or breaks the state's rules is evidence: it is left alone unless
        // the operator asked for the previous copy.
        let loaded = match store.load::<StateData>() {
            Ok(Loaded::State(data)) => match data.validate() {
                Ok(()) => Loaded::State(data),
                Err(_) if restore_previous => restore_previous_state(&store)?,
                Err(violations) => {
                    let prev = previous_copy(&store);
                    return Err(StartError::Inconsistent { path: store.path().to_owned(), violations, prev });
                }
            },
            Err(_) if restore_previous => restore_previous_state(&store)?,
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
                    .resolve_pools_keeping(&topo, &current_cpus(&state))
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
        let (events, _) = broadcast::channel(1024);
        let snapshot = Snapshot {
            state: Arc::new(state.clone()),
            topology: Arc::new(topo.clone()),
            state_path: store.path().to_owned(),
            config_error: config_error.clone(),
            degraded: Vec::new(),
            partitions: Arc::default(),
            backend: backend.name(),
            assignment_health: Arc::default(),
            isolation: Arc::default(),
            irq: Arc::default(),
        };
        let (snapshots, _) = watch::channel(snapshot);
        let mut engine = Engine {
            state: Arc::new(state),
            topo: Arc::new(topo),
            store,
            backend,
            lend_idle: settings.lend_idle,
            opts: LayoutOptions::default(),
            config_error,
            degraded: Vec::new(),
            health: std::collections::BTreeMap::new(),
            suspects: std::collections::BTreeSet::new(),
            events,
            snapshots,
            config: None,
            hk: None,
            irq: irq::IrqManager::new(settings),
        };
        engine.opts = engine.layout_options(&engine.state, &settings.host_cgroups);
        let (done, failed) = engine.reconcile();
        report.corrections = done;
        report.failed_corrections = failed;
        engine.store.save(engine.state.data()).map_err(StartError::Store)?;
        engine.apply_irqs();
        engine.publish(Vec::new());
        Ok((engine, report))
    }

    fn layout(&self, state: &State) -> Layout {
        plan::layout(state, &self.topo, &self.opts)
    }

    /// What the layout of `state` depends on. Lending needs the isolated pools to be remote
    /// partitions: on kernels without `cpuset.cpus.exclusive` the parent of isolated pools is a
    /// partition itself, and no CPU below it can be lent.
    fn layout_options(&self, state: &State, host_cgroups: &[CgroupPath]) -> LayoutOptions {
        let isolating = state.pools().values().any(|p| p.isolate);
        let lend_idle = self.lend_idle && (!isolating || self.backend.remote_partitions());
        if self.lend_idle && !lend_idle {
            log::warn!(
                "lend_idle is off while pools are isolated: this kernel has no cpuset.cpus.exclusive (Linux 6.7)"
            );
        }
        LayoutOptions { host_cgroups: host_cgroups.to_vec(), lend_idle, unpooled: self.opts.unpooled.clone() }
    }

    /// Makes the host match the state: reads what each placement holds now and applies the
    /// difference, logging each correction. Stale pool slices are removed.
    fn reconcile(&mut self) -> (usize, usize) {
        let desired = self.layout(&self.state);
        let mut observed = Layout::new();
        for (key, want) in &desired {
            let now = match self.backend.observe(key) {
                Ok(now) => now,
                Err(e) => {
                    log::warn!("reconcile: {}", error_chain(&e));
                    None
                }
            };
            let now = match (key, now) {
                (Key::Cgroup(_), now) => now,
                // Only cgroups report memory nodes and partitions.
                (_, Some(o)) => Some(crate::host::Observed { mems: want.mems.clone(), ..o }),
                // The cgroupfs backend cannot read units: take them as they should be.
                (Key::Unit(_), None) if !self.backend.can_read_units() => Some(crate::host::Observed {
                    cpus: want.cpus.clone(),
                    mems: want.mems.clone(),
                    ..Default::default()
                }),
                (_, None) => None,
            };
            if let Some(o) = now {
                let mut place = Placement::new(o.cpus, o.mems, want.role.clone());
                place.partition = o.partition;
                // Quotas are not read back: written again whenever they are wanted.
                observed.insert(key.clone(), place);
            }
        }
        if let Ok(top) = CgroupPath::new(plan::TOP_SLICE) {
            // No pool but the reserved one: a top slice left from before goes too.
            let top_key = Key::Cgroup(top.clone());
            if !desired.contains_key(&top_key) {
                if let Ok(Some(o)) = self.backend.observe(&top_key) {
                    let mut place = Placement::new(o.cpus, o.mems, Role::Parent);
                    place.partition = o.partition;
                    observed.insert(top_key, place);
                }
            }
            for child in self.backend.children(&top) {
                let key = Key::Cgroup(child.clone());
                let ours = child
                    .as_str()
                    .rsplit('/')
                    .next()
                    .is_some_and(|n| n.starts_with("cpupool-") && n.ends_with(".slice"));
                if ours && !desired.contains_key(&key) {
                    let o = self.backend.observe(&key).ok().flatten().unwrap_or_default();
                    let mut place = Placement::new(o.cpus, CpuSet::new(), Role::Pool(PoolKind::Shared));
                    place.partition = o.partition;
                    observed.insert(key, place);
                }
            }
        }
        let effects = plan::plan(&observed, &desired);
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

    /// Runs the engine on its own thread until every [`Handle`] is dropped.
    pub fn spawn(self) -> (Handle, std::thread::JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(256);
        let handle = Handle { tx, snapshots: self.snapshots.subscribe(), events: self.events.clone() };
        let thread = std::thread::Builder::new()
            .name("cpupoold-engine".into())
            .spawn(move || self.run(rx))
            .unwrap_or_else(|e| {
                log::error!("cannot start the engine thread: {e}");
                std::process::exit(1)
            });
        (handle, thread)
    }

    fn run(mut self, mut rx: mpsc::Receiver<Request>) {
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
        self.stop_irqs();
    }

    fn handle(&mut self, req: Request) {
        match req {
            Request::Assign(spec, reply) => {
                let result = self.stamp(spec).map_err(EngineError::from).and_then(|s| self.assign(&s));
                let _ = reply.send(result);
            }
            Request::Release(id, reply) => {
                let _ = reply.send(self.release(&id));
            }
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
                let _ = reply.send(self.run_process(spec));
            }
            Request::Reapply(reply) => {
                let (done, failed) = self.reconcile();
                let events = self.sync_housekeeping();
                self.publish(events);
                if done > 0 || failed > 0 {
                    log::info!("re-applied after systemd reloaded: {done} corrections, {failed} failed");
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
            Request::CheckDrift(reply) => {
                let _ = reply.send(Ok(self.check_drift()));
            }
            Request::Retarget(id, target, container, reply) => {
                let _ = reply.send(self.retarget(&id, target, container));
            }
            Request::SetUnpooled(cgroups, reply) => {
                let _ = reply.send(self.set_unpooled(cgroups));
            }
        }
    }

    /// Records when a pid target's process started; refuses a process that does not exist.
    fn stamp(&self, mut spec: AssignSpec) -> Result<AssignSpec, state::Error> {
        if let Target::Pid(pid) = spec.target {
            match self.backend.process_start(pid) {
                Some(start) => spec.process_start = Some(start),
                None => {
                    return Err(state::Error::InvalidArgument {
                        arg: "target",
                        reason: format!("process {pid} does not exist"),
                    })
                }
            }
        }
        Ok(spec)
    }

    /// [`Handle::run`]: where systemd runs, the assignment's target is a new scope
    /// `cpupool-run-<pid>-<start>.scope` in the pool's slice that holds the process; elsewhere
    /// the process itself.
    fn run_process(&mut self, spec: AssignSpec) -> Result<Outcome<Assignment>, EngineError> {
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
        let scope = format!("cpupool-run-{pid}-{start}.scope");
        let target = Target::parse(&format!("unit:{scope}"))?;
        let mut next = (*self.state).clone();
        let scoped = AssignSpec { target, process_start: None, ..spec };
        let out = next.assign(&self.topo, &scoped)?;
        let Outcome::Changed(a) = &out else { return Ok(out) };
        // The scope does not exist yet: where it sits is read back once it does.
        self.check_protected(&next, a)?;
        let slice = plan::pool_slice(&pool.name);
        let slice_unit = slice.as_str().rsplit('/').next().unwrap_or_default().to_owned();
        // The scope starts with the pool slice's CPUs only; its own (exclusive ones) are set by
        // the commit, after the save, like any assignment's: a crash in between leaves no
        // CPU given away that the saved state does not name. The process waits meanwhile.
        self.backend.start_scope(&scope, &slice_unit, pid, &CpuSet::new()).map_err(EngineError::Apply)?;
        let before = (*self.state).clone();
        self.commit(next)?;
        self.verify_or_undo(before, a)?;
        self.publish(assigned(a));
        Ok(out)
    }

    /// Decides a group of mutations in order on one copy of the state, then applies and saves
    /// the result once. If that fails, nothing of the group was kept, and each is done again on
    /// its own, so every caller gets the answer it would have had alone.
    fn mutate(&mut self, group: Vec<Mutation>) {
        if group.len() <= 1 {
            for m in group {
                self.handle(m.into_request());
            }
            return;
        }
        let mut next = (*self.state).clone();
        let mut decided: Vec<Decided> = group
            .iter()
            .map(|m| match m {
                Mutation::Assign(spec, _) => {
                    Decided::Assign(self.stamp(spec.clone()).and_then(|s| self.decide(&mut next, &s)))
                }
                Mutation::Release(id, _) => Decided::Release(next.release(id)),
            })
            .collect();
        let changed = decided
            .iter()
            .any(|d| matches!(d, Decided::Assign(Ok(Outcome::Changed(_))) | Decided::Release(Ok(_))));
        if changed {
            let before = (*self.state).clone();
            if let Err(e) = self.commit(next) {
                log::warn!(
                    "applying {} grouped changes failed ({}); doing them one by one",
                    group.len(),
                    error_chain(&e)
                );
                for m in group {
                    self.handle(m.into_request());
                }
                return;
            }
            // Read back: assignments the kernel does not enforce are taken back out, together.
            let refused: Vec<(usize, state::Error)> = decided
                .iter()
                .enumerate()
                .filter_map(|(i, d)| match d {
                    Decided::Assign(Ok(Outcome::Changed(a))) => self.verify(a).err().map(|e| (i, e)),
                    _ => None,
                })
                .collect();
            if !refused.is_empty() {
                let mut fixed = (*self.state).clone();
                for (i, _) in &refused {
                    if let Decided::Assign(Ok(Outcome::Changed(a))) = &decided[*i] {
                        let _ = fixed.release(a.id.as_str());
                    }
                }
                if let Err(e) = self.commit(fixed) {
                    log::error!(
                        "taking back assignments the kernel does not enforce failed: {}",
                        error_chain(&e)
                    );
                    let _ = self.commit(before);
                }
                for (i, e) in refused {
                    decided[i] = Decided::Assign(Err(e));
                }
            }
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
                    let _ = reply.send(r.map_err(EngineError::from));
                }
                (Mutation::Release(_, reply), Decided::Release(r)) => {
                    let _ = reply.send(r.map_err(EngineError::from));
                }
                // `decided` was made from `group` in order.
                _ => {}
            }
        }
    }

    fn assign(&mut self, spec: &AssignSpec) -> Result<Outcome<Assignment>, EngineError> {
        let mut next = (*self.state).clone();
        let out = self.decide(&mut next, spec)?;
        if let Outcome::Changed(a) = &out {
            let before = (*self.state).clone();
            self.commit(next)?;
            self.verify_or_undo(before, a)?;
            self.publish(assigned(a));
        }
        Ok(out)
    }

    /// Decides an assignment on `next` and admits its target: on refusal `next` is as it was.
    fn decide(&self, next: &mut State, spec: &AssignSpec) -> Result<Outcome<Assignment>, state::Error> {
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
    fn admit_target(&self, next: &State, a: &Assignment) -> Result<(), state::Error> {
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

    /// [`state::check_target`] for `a` against the host cgroups and `next`'s other assignments.
    fn check_protected(&self, next: &State, a: &Assignment) -> Result<(), state::Error> {
        let others = next.assignments().values().filter(|o| o.id != a.id);
        state::check_target(&a.target, &self.opts.host_cgroups, others)
    }

    /// Reads back what the kernel enforces on `a`'s target; a difference is a refusal.
    fn verify(&self, a: &Assignment) -> Result<(), state::Error> {
        let Some(key) = Key::of(&a.target) else { return Ok(()) };
        match self.backend.enforced(&key) {
            Ok(Some(now)) if now != a.cpus => {
                let (parent, cpus) = match self.backend.confinement(&key) {
                    Ok(Some(c)) => (c.parent, c.cpus),
                    _ => ("its cgroup".to_owned(), now),
                };
                Err(outside(a, &parent, &cpus))
            }
            Ok(_) => Ok(()),
            Err(e) => Err(state::Error::TargetOutsidePool {
                target: a.target.to_string(),
                cpus: a.cpus.to_string(),
                parent: "?".into(),
                parent_cpus: String::new(),
                hint: format!("reading back what the kernel enforces failed: {}", error_chain(&e)),
            }),
        }
    }

    /// [`Engine::verify`] after a commit; on a difference the commit is undone (applied and
    /// saved back to `before`), so nothing stays booked.
    fn verify_or_undo(&mut self, before: State, a: &Assignment) -> Result<(), EngineError> {
        if let Err(e) = self.verify(a) {
            log::warn!(
                TARGET = a.target.to_string().as_str();
                "refusing assignment {} of CPUs {} to {}: {e}", a.id, a.cpus, a.target
            );
            if let Err(undo) = self.commit(before) {
                log::error!("taking back assignment {} failed: {}", a.id, error_chain(&undo));
            }
            return Err(e.into());
        }
        Ok(())
    }

    /// Drift: reconciles (rewrites what someone changed), then reads back what the kernel
    /// enforces on every assignment's target. Those that still differ at two checks in a row
    /// are degraded, with the reason; changes of that are published as `degraded` / `restored`
    /// events.
    fn check_drift(&mut self) -> DriftReport {
        let (corrected, failed) = self.reconcile();
        self.apply_irqs();
        let mut health = std::collections::BTreeMap::new();
        let mut suspects = std::collections::BTreeSet::new();
        for a in self.state.assignments().values() {
            if let Err(e) = self.verify(a) {
                // Seen once, it may be a unit caught mid-restart: degraded when the next check
                // (after this one's corrections) still finds it so.
                if self.suspects.contains(&a.id) || self.health.contains_key(&a.id) {
                    health.insert(a.id.clone(), e.to_string());
                } else {
                    suspects.insert(a.id.clone());
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
        events.extend(self.sync_housekeeping());
        if corrected > 0 || failed > 0 || !events.is_empty() {
            log::info!("drift check: {corrected} corrections, {failed} failed, {} degraded", report.degraded);
        }
        self.publish(events);
        report
    }

    fn release(&mut self, id: &str) -> Result<Assignment, EngineError> {
        let mut next = (*self.state).clone();
        let a = next.release(id)?;
        self.commit(next)?;
        self.publish(released(&a));
        Ok(a)
    }

    fn retarget(
        &mut self,
        id: &str,
        target: state::Target,
        container: Option<state::Container>,
    ) -> Result<Outcome<Assignment>, EngineError> {
        let mut next = (*self.state).clone();
        let out = next.retarget(id, target, container)?;
        if let Outcome::Changed(a) = &out {
            self.commit(next)?;
            log::info!(
                POOL = a.pool.as_str(), ASSIGNMENT = a.id.as_str(), TARGET = a.target.to_string().as_str();
                "assignment {} (CPUs {}) now applies to {}", a.id, a.cpus, a.target
            );
            self.publish(vec![Event::AssignmentChanged { id: a.id.clone(), change: Change::Added }]);
        }
        Ok(out)
    }

    fn set_unpooled(
        &mut self,
        cgroups: std::collections::BTreeSet<CgroupPath>,
    ) -> Result<usize, EngineError> {
        if cgroups == self.opts.unpooled {
            return Ok(0);
        }
        let before = self.layout(&self.state);
        let previous = std::mem::replace(&mut self.opts.unpooled, cgroups);
        let after = self.layout(&self.state);
        let effects = plan::plan(&before, &after).len();
        if let Err(e) = self.apply_plan(&before, &after) {
            // Back as it was, so that the next call tries again.
            self.undo(&after, &before);
            self.opts.unpooled = previous;
            return Err(e);
        }
        Ok(effects)
    }

    fn reload(&mut self, settings: Result<Box<Settings>, ConfigError>) -> Result<bool, EngineError> {
        let result = settings.map_err(|e| EngineError::Config(Box::new(e))).and_then(|s| self.try_reload(&s));
        match &result {
            Ok(_) => self.config_error = None,
            Err(e) => self.config_error = Some(error_chain(e)),
        }
        self.publish(Vec::new());
        result
    }

    fn try_reload(&mut self, settings: &Settings) -> Result<bool, EngineError> {
        let (topo, next) = self.prepare(settings)?;
        self.install(settings, topo, next)
    }

    /// Checks new settings against the host and the live assignments, changing nothing.
    fn prepare(&self, settings: &Settings) -> Result<(Topology, State), EngineError> {
        let topo = sysfs::read_topology(&settings.paths.sysfs_root).map_err(EngineError::Topology)?;
        // Count pools keep their CPUs: editing one pool does not move the others.
        let pools = settings
            .resolve_pools_keeping(&topo, &current_cpus(&self.state))
            .map_err(|e| EngineError::Config(Box::new(e)))?;
        housekeeping::check_housekeeping(settings, &pools).map_err(EngineError::Config)?;
        let mut next = (*self.state).clone();
        next.set_pools(pools).map_err(|m| {
            EngineError::Stranded(m.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))
        })?;
        Ok((topo, next))
    }

    /// Applies and saves prepared settings; `Ok(false)` when nothing changed.
    fn install(&mut self, settings: &Settings, topo: Topology, next: State) -> Result<bool, EngineError> {
        let old_topo = std::mem::replace(&mut self.topo, Arc::new(topo));
        let old_lend = std::mem::replace(&mut self.lend_idle, settings.lend_idle);
        let new_opts = self.layout_options(&next, &settings.host_cgroups);
        let old_opts = std::mem::replace(&mut self.opts, new_opts);
        let before = plan::layout(&self.state, &old_topo, &old_opts);
        let after = self.layout(&next);
        if before == after && next == *self.state {
            // Interrupt settings alone may have changed.
            self.irq.configure(settings);
            self.apply_irqs();
            self.publish(Vec::new());
            return Ok(false);
        }
        let names: std::collections::BTreeSet<&PoolName> =
            self.state.pools().keys().chain(next.pools().keys()).collect();
        let changed: Vec<Event> = names
            .into_iter()
            .filter(|n| self.state.pools().get(*n) != next.pools().get(*n))
            .map(|n| Event::PoolChanged(n.clone()))
            .collect();
        if let Err(e) = self.commit_layouts(&before, &after, &next) {
            self.topo = old_topo;
            self.lend_idle = old_lend;
            self.opts = old_opts;
            return Err(e);
        }
        self.state = Arc::new(next);
        self.irq.configure(settings);
        self.apply_irqs();
        for p in self.state.pools().values() {
            log::info!(POOL = p.name.as_str(); "pool {} ({}): CPUs {}", p.name, p.kind, p.cpus);
        }
        let mut changed = changed;
        changed.extend(self.sync_housekeeping());
        self.publish(changed);
        Ok(true)
    }

    /// A pool edit: checked against the state, merged into the runtime drop-in, validated as a
    /// whole configuration, written durably, then applied like a reload. If applying fails, the
    /// previous drop-in is written back.
    fn edit_pool(&mut self, edit: &PoolEdit) -> Result<Option<Pool>, EngineError> {
        let name = edit.name();
        let current = self.state.pools().get(name);
        match (edit, current) {
            (PoolEdit::Create { .. }, Some(_)) => {
                return Err(state::Error::PoolExists { pool: name.to_string() }.into())
            }
            (PoolEdit::Resize { .. } | PoolEdit::Delete { .. }, None) => {
                return Err(state::Error::NoSuchPool { pool: name.to_string() }.into())
            }
            (PoolEdit::Delete { .. }, Some(p)) if p.kind == PoolKind::Reserved => {
                return Err(state::Error::InvalidArgument {
                    arg: "name",
                    reason: format!("`{name}` is the reserved pool, which every host needs"),
                }
                .into())
            }
            (PoolEdit::Delete { .. }, Some(p)) if self.state.usage(&p.name).count > 0 => {
                return Err(state::Error::PoolInUse {
                    pool: name.to_string(),
                    assignments: self.state.usage(&p.name).count,
                }
                .into())
            }
            _ => {}
        }
        let src = self.config.as_ref().ok_or(EngineError::NoConfigFiles)?;
        let old = Dropin::read(&src.dirs).map_err(|e| EngineError::Config(Box::new(e)))?;
        let mut new = old.clone();
        let load = |d: &Dropin| {
            let text = d.text();
            src.load(Some((d.path(), text.as_deref()))).map_err(|e| edit_error(name, d.path(), e))
        };
        let settings = match edit {
            PoolEdit::Delete { .. } => {
                // Without a table, unless another file defines the pool too.
                new.forget(name);
                let settings = load(&new)?;
                if settings.pools.iter().any(|p| &p.name == name) {
                    new.apply(edit);
                    load(&new)?
                } else {
                    settings
                }
            }
            _ => {
                new.apply(edit);
                let settings = load(&new)?;
                if settings.pools.iter().any(|p| &p.name == name) {
                    settings
                } else {
                    // An earlier file removes a pool of this name: bring it back.
                    new.restore(name);
                    load(&new)?
                }
            }
        };
        let wins = |key: &str| settings.origins.get(key).filter(|f| *f != new.path()).map(ToOwned::to_owned);
        match edit {
            PoolEdit::Delete { .. } => {
                if settings.pools.iter().any(|p| &p.name == name) {
                    let key = config::pool_key(name.as_str(), "removed");
                    let file = wins(&key).or_else(|| wins(&config::pool_key(name.as_str(), "")));
                    return Err(EngineError::Overridden {
                        key,
                        file: file.unwrap_or_default(),
                        dropin: new.path().to_owned(),
                    });
                }
            }
            _ => {
                if !settings.pools.iter().any(|p| &p.name == name) {
                    let key = config::pool_key(name.as_str(), "removed");
                    return Err(EngineError::Overridden {
                        key: key.clone(),
                        file: wins(&key).unwrap_or_default(),
                        dropin: new.path().to_owned(),
                    });
                }
                for field in edit.keys() {
                    let key = config::pool_key(name.as_str(), field);
                    if let Some(file) = wins(&key) {
                        return Err(EngineError::Overridden { key, file, dropin: new.path().to_owned() });
                    }
                }
            }
        }
        let (topo, next) = self.prepare(&settings).map_err(|e| match e {
            EngineError::Config(c) => edit_error(name, new.path(), *c),
            other => other,
        })?;
        if let Err(e) = new.write() {
            // The rename may have happened before a later step failed: put the old one back.
            if let Err(e2) = old.write() {
                log::error!("writing back the previous runtime drop-in failed: {}", error_chain(&e2));
            }
            return Err(EngineError::Dropin(e));
        }
        if let Err(e) = self.install(&settings, topo, next) {
            if let Err(e2) = old.write() {
                log::error!("writing back the previous runtime drop-in failed: {}", error_chain(&e2));
            }
            return Err(e);
        }
        self.config_error = None;
        self.publish(Vec::new());
        let verb = match edit {
            PoolEdit::Create { .. } => "created",
            PoolEdit::Resize { .. } => "resized",
            PoolEdit::Delete { .. } => "deleted",
        };
        log::info!(POOL = name.as_str(); "pool {name} {verb}; persisted in `{}`", new.path().display());
        Ok(self.state.pools().get(name).cloned())
    }

    /// Applies and saves `next`; on failure undoes what was applied.
    fn commit(&mut self, next: State) -> Result<(), EngineError> {
        let before = self.layout(&self.state);
        let after = self.layout(&next);
        self.commit_layouts(&before, &after, &next)?;
        self.state = Arc::new(next);
        Ok(())
    }

    /// Takes CPUs away (`plan::kept`) before the save and gives them only after it, so that a
    /// crash at any point leaves no target holding CPUs the saved state does not give it.
    fn commit_layouts(&mut self, before: &Layout, after: &Layout, next: &State) -> Result<(), EngineError> {
        let kept = plan::kept(before, after);
        self.apply_plan(before, &kept).inspect_err(|_| self.undo(&kept, before))?;
        if let Err(e) = self.store.save(next.data()) {
            log::error!("saving the state failed: {}; rolling back", error_chain(&e));
            self.undo(&kept, before);
            self.resave_previous();
            return Err(EngineError::Store(e));
        }
        if let Err(e) = self.apply_plan(&kept, after) {
            self.undo(after, before);
            self.resave_previous();
            return Err(e);
        }
        Ok(())
    }

    fn apply_plan(&self, from: &Layout, to: &Layout) -> Result<(), EngineError> {
        for effect in plan::plan(from, to) {
            if let Err(e) = self.backend.apply(&effect) {
                log::warn!("{} failed: {}; rolling back", describe(&effect), error_chain(&e));
                return Err(EngineError::Apply(e));
            }
        }
        Ok(())
    }

    /// Puts the current state back on disk after a failed change (the new file may be in
    /// place already: a failed directory fsync, or a failure applying after the save).
    fn resave_previous(&self) {
        if let Err(e) = self.store.save(self.state.data()) {
            log::error!("re-saving the previous state failed too: {}", error_chain(&e));
        }
    }

    fn undo(&self, applied: &Layout, back_to: &Layout) {
        for effect in plan::plan(applied, back_to) {
            if let Err(e) = self.backend.apply(&effect) {
                log::error!("rollback: {} failed: {}", describe(&effect), error_chain(&e));
            }
        }
    }

    fn publish(&self, mut events: Vec<Event>) {
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
        let partitions = self
            .state
            .pools()
            .values()
            .filter(|p| p.kind != PoolKind::Reserved)
            .filter_map(|p| {
                Some((p.name.clone(), self.backend.partition_status(&plan::pool_slice(&p.name))?))
            })
            .collect();
        let snap = Snapshot {
            state: self.state.clone(),
            topology: self.topo.clone(),
            state_path: self.store.path().to_owned(),
            config_error: self.config_error.clone(),
            degraded: self.degraded.clone(),
            partitions: Arc::new(partitions),
            backend: self.backend.name(),
            assignment_health: Arc::new(
                self.health
                    .iter()
                    .filter(|(id, _)| self.state.assignments().contains_key(*id))
                    .map(|(id, why)| (id.clone(), why.clone()))
                    .collect(),
            ),
            isolation: self.hk.as_ref().map(housekeeping::Housekeeping::report).unwrap_or_default(),
            irq: Arc::new(self.irq.report().clone()),
        };
        self.snapshots.send_replace(snap);
        for e in events {
            // Nobody listening is fine.
            let _ = self.events.send(e);
        }
    }
}

/// Each pool's CPUs, for resolving count pools where they are.
fn current_cpus(state: &State) -> std::collections::BTreeMap<PoolName, CpuSet> {
    state.pools().values().map(|p| (p.name.clone(), p.cpus.clone())).collect()
}

/// The most mutations decided and saved together.
const MAX_GROUP: usize = 256;

/// An Assign or Release waiting in a group.
enum Mutation {
    Assign(AssignSpec, oneshot::Sender<Result<Outcome<Assignment>, EngineError>>),
    Release(String, oneshot::Sender<Result<Assignment, EngineError>>),
}

impl Mutation {
    fn into_request(self) -> Request {
        match self {
            Mutation::Assign(spec, reply) => Request::Assign(spec, reply),
            Mutation::Release(id, reply) => Request::Release(id, reply),
        }
    }
}

/// What the core decided for one mutation of a group.
enum Decided {
    Assign(Result<Outcome<Assignment>, state::Error>),
    Release(Result<Assignment, state::Error>),
}

/// The refusal of `a`, whose target sits in `parent` with effective CPUs `cpus`.
fn outside(a: &Assignment, parent: &str, cpus: &CpuSet) -> state::Error {
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

/// Logs a new assignment and returns its events.
fn assigned(a: &Assignment) -> Vec<Event> {
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
fn released(a: &Assignment) -> Vec<Event> {
    log::info!(
        POOL = a.pool.as_str(), ASSIGNMENT = a.id.as_str(), TARGET = a.target.to_string().as_str();
        "released CPUs {} of pool {} from {}", a.cpus, a.pool, a.target
    );
    vec![
        Event::AssignmentChanged { id: a.id.clone(), change: Change::Removed },
        Event::PoolChanged(a.pool.clone()),
    ]
}

/// A configuration error caused by an edit: about one of the edit's own keys in the runtime
/// drop-in, it is an invalid argument of that name; otherwise the configuration is rejected.
fn edit_error(name: &PoolName, dropin: &std::path::Path, e: ConfigError) -> EngineError {
    const ARGS: [&str; 7] = ["cpus", "count", "numa", "kind", "smt", "isolate", "kubelet"];
    let prefix = config::pool_key(name.as_str(), "");
    let field = e.key().and_then(|k| k.strip_prefix(prefix.as_str())).and_then(|f| f.strip_prefix('.'));
    match field.and_then(|f| ARGS.into_iter().find(|a| *a == f)) {
        Some(arg) if e.file() == Some(dropin) => {
            let reason = error_chain(&e);
            EngineError::State(state::Error::InvalidArgument { arg, reason })
        }
        _ => EngineError::Config(Box::new(e)),
    }
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

/// An error and its causes on one line: "a: b: c".
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// How long the watchdog waits for the engine before it stops pinging.
pub const PING_TIMEOUT: Duration = Duration::from_secs(5);

/// Measures how long the engine takes to answer (used by the watchdog loop).
pub async fn ping_within(handle: &Handle, timeout: Duration) -> Option<Duration> {
    let start = Instant::now();
    tokio::time::timeout(timeout, handle.ping()).await.ok()?.ok()?;
    Some(start.elapsed())
}

#[cfg(test)]
mod tests;
