//! The engine's contract: what adapters send ([`Request`] through a [`Handle`]) and what they
//! read ([`Snapshot`], [`Event`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{broadcast, mpsc, oneshot, watch};

use super::{DriftFound, EngineError, KubeletUpdate, KubeletView};
use crate::config::runtime::PoolEdit;
use crate::config::{ConfigError, Settings};
use crate::core::cpuset::CpuSet;
use crate::core::plan::LayoutOptions;
use crate::core::pool::{Pool, PoolName};
use crate::core::state::{self, AssignSpec, Assignment, AssignmentId, CgroupPath, Outcome, State};
use crate::core::topology::Topology;
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
    /// Its CPUs run its container now, as read back in the container's cgroup (it was
    /// allocated: booked for a container that did not run).
    Applied,
    /// Booked for a container that does not run (its container stopped, or it moved to no
    /// container): allocated again.
    Allocated,
}

impl Change {
    /// `added`, `removed`, `degraded`, `restored`, `applied` or `allocated`, as the APIs spell
    /// it.
    pub fn as_str(self) -> &'static str {
        match self {
            Change::Added => "added",
            Change::Removed => "removed",
            Change::Degraded => "degraded",
            Change::Restored => "restored",
            Change::Applied => "applied",
            Change::Allocated => "allocated",
        }
    }
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
    /// Assignments the state files held that start refused and dropped (each naming the file
    /// and record it came from, and why), until the daemon is started again.
    pub state_warnings: Arc<Vec<String>>,
    /// The kernel's word on each pool slice's partition (`member`, `isolated`,
    /// `isolated invalid (...)`), read after every change.
    pub partitions: Arc<std::collections::BTreeMap<PoolName, String>>,
    /// `cgroupfs` or `systemd`.
    pub backend: &'static str,
    /// What the layout depends on besides the state (host cgroups, lending, unpooled
    /// containers): the drift check builds the wanted layout from the snapshot.
    pub layout: Arc<LayoutOptions>,
    /// Assignments whose target the kernel does not confine to their CPUs, with the reason,
    /// found by the last drift check and not restored by it.
    pub assignment_health: Arc<std::collections::BTreeMap<AssignmentId, String>>,
    /// What the kubelet wing observed: the CPUs online, the devices the kubelet holds.
    pub kubelet: Arc<KubeletView>,
    /// What each keeper of host settings reported at its last pass, under the report's type
    /// ([`Snapshot::report`]): the contract names no keeper.
    pub reports: Arc<Reports>,
}

/// The keepers' reports, one per type: a keeper puts its report under its own type when a
/// snapshot is built ([`Reports::put`], or [`Reports::update`] where several keepers add to one
/// report), and a reader asks for the type it knows ([`Snapshot::report`]). Type-keyed, so a new
/// keeper adds a report without a new snapshot field.
#[derive(Clone, Default)]
pub struct Reports(Vec<(std::any::TypeId, &'static str, Arc<dyn std::any::Any + Send + Sync>)>);

impl Reports {
    /// Puts `report` under its type, replacing the one there.
    pub fn put<T: std::any::Any + Send + Sync>(&mut self, report: T) {
        let id = std::any::TypeId::of::<T>();
        let entry =
            (id, std::any::type_name::<T>(), Arc::new(report) as Arc<dyn std::any::Any + Send + Sync>);
        match self.0.iter_mut().find(|(t, _, _)| *t == id) {
            Some(slot) => *slot = entry,
            None => self.0.push(entry),
        }
    }

    /// Changes the report of type `T` (its default when none is there yet) in place: copied
    /// only if a published snapshot still shares it (one being built holds it alone).
    pub fn update<T: std::any::Any + Send + Sync + Clone + Default>(&mut self, change: impl FnOnce(&mut T)) {
        let id = std::any::TypeId::of::<T>();
        let mut report: Arc<T> = match self.0.iter().position(|(t, _, _)| *t == id) {
            Some(i) => self.0.swap_remove(i).2.downcast::<T>().unwrap_or_default(),
            None => Arc::default(),
        };
        change(Arc::make_mut(&mut report));
        self.0.push((id, std::any::type_name::<T>(), report));
    }

    /// The report of type `T`; its default when no keeper put one (a keeper that has not
    /// passed yet, or one not running in this daemon).
    pub fn get<T: std::any::Any + Send + Sync + Default>(&self) -> Arc<T> {
        let id = std::any::TypeId::of::<T>();
        self.0
            .iter()
            .find(|(t, _, _)| *t == id)
            .and_then(|(_, _, r)| r.clone().downcast::<T>().ok())
            .unwrap_or_default()
    }
}

impl std::fmt::Debug for Reports {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.iter().map(|(_, name, _)| name)).finish()
    }
}

impl Snapshot {
    /// The last report of type `T` a keeper published: `snap.report::<IsolationReport>()`,
    /// `snap.report::<IrqReport>()`, `snap.report::<Vec<ClassRow>>()` (the power and cache
    /// classes' rows). See [`Reports`].
    pub fn report<T: std::any::Any + Send + Sync + Default>(&self) -> Arc<T> {
        self.reports.get::<T>()
    }

    /// What `a`'s CPUs do now: allocated, applied or degraded ([`state::phase::Phase`]).
    pub fn phase(&self, a: &Assignment) -> state::phase::Phase<'_> {
        a.phase(
            self.assignment_health.get(&a.id).map(String::as_str),
            self.kubelet.running.contains_key(&a.id),
        )
    }

    /// The container `a` serves: the one recorded with it (the kubelet's word, or the one it is
    /// bound to), else the first read back running on its CPUs.
    pub fn container_of(&self, a: &Assignment) -> Option<String> {
        a.container.as_ref().map(|c| c.to_string()).or_else(|| {
            self.kubelet.running.get(&a.id).and_then(|m| m.values().next()).map(|c| c.to_string())
        })
    }

    /// The CPUs a kubelet container can be given ([`super::KubeletView::usable`]), with those
    /// an isolated pool's partition holds where containers get partitions of their own: they
    /// leave the pool's partition when the kubelet allocates them.
    pub fn container_cpus(&self) -> CpuSet {
        let usable = self.kubelet.usable(&self.topology);
        if self.layout.partitions != crate::core::plan::Partitions::Containers {
            return usable;
        }
        let online = self.kubelet.online(&self.topology);
        self.state
            .pools()
            .values()
            .filter(|p| p.isolate)
            .fold(usable, |acc, p| acc.union(&p.cpus.intersection(&online)))
    }

    /// The one-line summary for `STATUS=` and logs.
    pub fn summary(&self) -> String {
        let n = |n: usize, one: &str| state::counted(n as u64, one);
        let mut s = format!(
            "{}, {}",
            n(self.state.pools().len(), "pool"),
            n(self.state.assignments().len(), "assignment")
        );
        if !self.assignment_health.is_empty() {
            s.push_str(&format!("; {} degraded", self.assignment_health.len()));
        }
        if self.config_error.is_some() {
            s.push_str("; configuration on disk rejected, running the last good one");
        }
        if !self.state_warnings.is_empty() {
            s.push_str(&format!(
                "; {} dropped from the state at start (see the log)",
                n(self.state_warnings.len(), "assignment")
            ));
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
    Reload(Result<Box<Settings>, ConfigError>, oneshot::Sender<Result<super::Reloaded, EngineError>>),
    /// Read the configuration files again and apply them (SIGHUP).
    ReloadFromDisk(oneshot::Sender<Result<super::Reloaded, EngineError>>),
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
    /// Drift found by reading the host off the engine thread: correct what still differs from
    /// the state, then mark the assignments whose targets the kernel still does not confine to
    /// their CPUs degraded (see [`Handle::check_drift`]).
    CheckDrift(Box<DriftFound>, oneshot::Sender<Result<DriftReport, EngineError>>),
    /// Point an assignment at another target, keeping its CPUs, and record its container (the
    /// device plugin, once it knows the container of a kubelet allocation).
    Retarget(Retarget, oneshot::Sender<Result<Outcome<Assignment>, EngineError>>),
    /// Keep these container cgroups off the exclusive pools' CPUs, and no others (the device
    /// plugin, for the kubelet's containers that use no pool).
    SetUnpooled(std::collections::BTreeSet<CgroupPath>, oneshot::Sender<Result<usize, EngineError>>),
    /// Assign CPUs to several targets: all of them with one save, or none (see `batch`).
    AssignAll(Vec<AssignSpec>, oneshot::Sender<Result<Vec<Outcome<Assignment>>, EngineError>>),
    /// Record what the kubelet wing observed (see `kubelet`); answers whether it changed.
    Kubelet(KubeletUpdate, oneshot::Sender<Result<bool, EngineError>>),
    /// Prepare a DRA claim: book its assignments and record it in one commit, then write its
    /// CDI spec; a claim recorded already answers as recorded (see `claims`).
    PrepareClaim(Box<PrepareClaim>, oneshot::Sender<Result<Outcome<state::PreparedClaim>, EngineError>>),
    /// Unprepare a DRA claim: release its assignments and forget it in one commit, then
    /// remove its CDI spec; answers what was released.
    UnprepareClaim(String, oneshot::Sender<Result<Vec<Assignment>, EngineError>>),
}

/// What [`Request::PrepareClaim`] asks: the claim as it is to be recorded, and the bookings of
/// its assignments, in the order of `claim.assignments`.
#[derive(Debug, Clone)]
pub struct PrepareClaim {
    /// The claim.
    pub claim: state::PreparedClaim,
    /// One booking per assignment it names.
    pub specs: Vec<AssignSpec>,
}

/// What [`Request::Retarget`] asks.
#[derive(Debug, Clone)]
pub struct Retarget {
    /// The assignment.
    pub id: String,
    /// Its new target.
    pub target: state::Target,
    /// The container it serves, if any.
    pub container: Option<state::Container>,
    /// Read back what the kernel enforces on the new target: a difference is a refusal, and
    /// the assignment keeps its old target.
    pub verify: bool,
}

/// How adapters reach the engine.
#[derive(Clone)]
pub struct Handle {
    pub(super) tx: mpsc::Sender<Request>,
    pub(super) snapshots: watch::Receiver<Snapshot>,
    pub(super) events: broadcast::Sender<Event>,
    /// The engine's backend, for reading the host off the engine thread (the drift check).
    pub(super) backend: Arc<dyn Backend>,
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
    pub async fn reload(
        &self,
        settings: Result<Settings, ConfigError>,
    ) -> Result<super::Reloaded, EngineError> {
        self.call(|tx| Request::Reload(settings.map(Box::new), tx)).await
    }

    /// Reads the configuration files again and applies them, like [`Handle::reload`].
    pub async fn reload_from_disk(&self) -> Result<super::Reloaded, EngineError> {
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
        let r = Retarget { id: id.to_owned(), target, container, verify: false };
        self.call(|tx| Request::Retarget(r, tx)).await
    }

    /// [`Handle::retarget`], then reads back what the kernel enforces on the new target: the
    /// assignment is pointed there only if it holds its CPUs (the NRI path, as a container
    /// starts: it gets an error rather than CPUs the books do not show).
    pub async fn bind(
        &self,
        id: &str,
        target: state::Target,
        container: Option<state::Container>,
    ) -> Result<Outcome<Assignment>, EngineError> {
        let r = Retarget { id: id.to_owned(), target, container, verify: true };
        self.call(|tx| Request::Retarget(r, tx)).await
    }

    /// Keeps exactly these container cgroups off the exclusive pools' CPUs; returns how many
    /// cgroups were written. Not saved: the device plugin says it again after a restart.
    pub async fn set_unpooled(
        &self,
        cgroups: std::collections::BTreeSet<CgroupPath>,
    ) -> Result<usize, EngineError> {
        self.call(|tx| Request::SetUnpooled(cgroups, tx)).await
    }

    /// Looks for drift: reads the host against the current snapshot on a blocking task (every
    /// placement the state wants, every assignment's target), then has the engine correct and
    /// judge only what differs (see [`Request::CheckDrift`]). The engine keeps answering
    /// meanwhile.
    pub async fn check_drift(&self) -> Result<DriftReport, EngineError> {
        let snap = self.snapshot();
        let backend = self.backend.clone();
        // A thread of its own, not tokio's blocking pool, which panics when no thread can be
        // started (pids.max reached) and so ended the periodic check for good.
        let found = crate::threads::run_blocking("the drift read", move || {
            super::observe::read(&*backend, snap.state.clone(), &snap.topology, &snap.layout)
        })
        .await
        .map_err(EngineError::Thread)?;
        self.call(|tx| Request::CheckDrift(Box::new(found), tx)).await
    }

    /// What the kernel enforces on cgroup `path` now (its `cpuset.cpus.effective`), read
    /// through the backend on a thread of its own, as the drift check reads: the read-back of
    /// an adapter that changes nothing (a second container sharing a DRA claim). `None`: no
    /// such cgroup, or no cpuset controller to read.
    pub async fn enforced(&self, path: CgroupPath) -> Result<Option<CpuSet>, EngineError> {
        let backend = self.backend.clone();
        let key = crate::core::plan::Key::Cgroup(path);
        crate::threads::run_blocking("a cgroup read-back", move || backend.enforced(&key))
            .await
            .map_err(EngineError::Thread)?
            .map_err(EngineError::Apply)
    }

    /// Samples the isolation health counters (the daemon's health tick).
    pub async fn sample_isolation(&self) -> Result<(), EngineError> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(Request::SampleIsolation(tx)).await.map_err(|_| EngineError::Stopped)?;
        rx.await.map_err(|_| EngineError::Stopped)
    }

    /// Assigns every spec, all or nothing, with one save (see [`Request::AssignAll`]).
    pub async fn assign_all(&self, specs: Vec<AssignSpec>) -> Result<Vec<Outcome<Assignment>>, EngineError> {
        self.call(|tx| Request::AssignAll(specs, tx)).await
    }

    /// Prepares a DRA claim (see [`Request::PrepareClaim`]): the claim as recorded, changed
    /// now or recorded before.
    pub async fn prepare_claim(&self, p: PrepareClaim) -> Result<Outcome<state::PreparedClaim>, EngineError> {
        self.call(|tx| Request::PrepareClaim(Box::new(p), tx)).await
    }

    /// Unprepares DRA claim `uid` (see [`Request::UnprepareClaim`]).
    pub async fn unprepare_claim(&self, uid: &str) -> Result<Vec<Assignment>, EngineError> {
        let uid = uid.to_owned();
        self.call(|tx| Request::UnprepareClaim(uid, tx)).await
    }

    /// Publishes the runtime the NRI plugin serves (`None`: none); `true` when it changed.
    pub async fn set_nri(&self, runtime: Option<String>) -> Result<bool, EngineError> {
        self.call(|tx| Request::Kubelet(KubeletUpdate::Nri(runtime), tx)).await
    }

    /// Publishes the PodResources poll's interval (the device plugin runs).
    pub async fn set_poll(&self, every: Duration) -> Result<bool, EngineError> {
        self.call(|tx| Request::Kubelet(KubeletUpdate::Poll(every), tx)).await
    }

    /// Publishes the effective CPUs of the kubelet's pod cgroup; `true` when they changed.
    pub async fn set_pod_cpus(&self, cpus: Option<CpuSet>) -> Result<bool, EngineError> {
        self.call(|tx| Request::Kubelet(KubeletUpdate::PodCpus(cpus), tx)).await
    }

    /// Publishes the CPUs online now; `true` when they changed.
    pub async fn set_online(&self, cpus: CpuSet) -> Result<bool, EngineError> {
        self.call(|tx| Request::Kubelet(KubeletUpdate::Online(cpus), tx)).await
    }

    /// Publishes the devices the kubelet holds for `id`; `true` when they changed.
    pub async fn set_held(
        &self,
        id: AssignmentId,
        devices: Option<std::collections::BTreeSet<String>>,
    ) -> Result<bool, EngineError> {
        self.call(|tx| Request::Kubelet(KubeletUpdate::Held(id, devices), tx)).await
    }

    /// Records that the container `container` in `cgroup` runs on the CPUs of `ids` (a claim's
    /// assignments, none of which has the cgroup for target): only if the engine reads back
    /// that the kernel gives the cgroup exactly their CPUs; answers whether it did.
    pub async fn running(
        &self,
        ids: Vec<AssignmentId>,
        cgroup: CgroupPath,
        container: state::Container,
    ) -> Result<bool, EngineError> {
        self.call(|tx| Request::Kubelet(KubeletUpdate::Running { ids, cgroup, container }, tx)).await
    }

    /// The containers in these cgroups stopped (or were removed): they run on no assignment's
    /// CPUs any more.
    pub async fn stopped(
        &self,
        cgroups: std::collections::BTreeSet<CgroupPath>,
    ) -> Result<bool, EngineError> {
        self.call(|tx| Request::Kubelet(KubeletUpdate::Stopped(cgroups), tx)).await
    }

    /// Only the containers in these cgroups run (the runtime's Synchronize).
    pub async fn alive(&self, cgroups: std::collections::BTreeSet<CgroupPath>) -> Result<bool, EngineError> {
        self.call(|tx| Request::Kubelet(KubeletUpdate::Alive(cgroups), tx)).await
    }

    /// Every committed snapshot from now on, for a reader that follows them.
    pub fn watch(&self) -> watch::Receiver<Snapshot> {
        self.snapshots.clone()
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

/// How long the watchdog waits for the engine before it stops pinging.
pub const PING_TIMEOUT: Duration = Duration::from_secs(5);

/// Measures how long the engine takes to answer (used by the watchdog loop).
pub async fn ping_within(handle: &Handle, timeout: Duration) -> Option<Duration> {
    let start = Instant::now();
    tokio::time::timeout(timeout, handle.ping()).await.ok()?.ok()?;
    Some(start.elapsed())
}
