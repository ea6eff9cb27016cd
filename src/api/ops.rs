//! What both management interfaces share: the error kinds and the decoding of arguments into
//! engine requests.
//!
//! varlink and D-Bus differ only in framing: an [`ApiError`] becomes the varlink error
//! `org.cpupool.Manager.<kind>` with its parameters, or the D-Bus error
//! `org.cpupool.Manager1.Error.<kind>` with its message ([`ErrorKind`] names both). Arguments
//! are decoded here once, so the two interfaces accept and refuse exactly the same input, and
//! replies are built here as the wire contract's views ([`cpupool_wire::views`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use cpupool_wire::views::{self, CpuHealth, PoolIsolation};
pub use cpupool_wire::ErrorKind;
use serde_json::{json, Value};

use crate::core::cpuset::CpuSet;
use crate::core::edit::{PoolEdit, Source};
use crate::core::pool::{Pool, PoolKind, PoolName, Smt};
use crate::core::state::{self, AssignSpec, Assignment, AssignmentId, Size, State, Target};
use crate::core::topology::Topology;
use crate::engine::{EngineError, Handle, Snapshot};
use crate::error_chain;

/// A pool as both interfaces show it (the varlink `Pool` type, the D-Bus `(ssssttbus)`), and
/// the lists of them.
pub struct PoolView;

// The views are the wire contract's types; these unit structs only name their builders.
#[allow(clippy::new_ret_no_self)]
impl PoolView {
    /// `p` with its use and partition in `snap`.
    pub fn new(snap: &Snapshot, p: &Pool) -> views::Pool {
        let state = &snap.state;
        views::Pool {
            name: p.name.to_string(),
            kind: p.kind.to_string(),
            cpus: p.cpus.to_string(),
            free_cpus: state.free_cpus(p).to_string(),
            free_millicpus: state.free_millis(p),
            capacity_millicpus: p.capacity_millis(),
            isolated: p.isolate,
            assignments: u32::try_from(state.usage(&p.name).count).unwrap_or(u32::MAX),
            partition: snap.partitions.get(&p.name).cloned().unwrap_or_default(),
        }
    }

    /// Every pool, in name order.
    pub fn all(snap: &Snapshot) -> Vec<views::Pool> {
        snap.state.pools().values().map(|p| PoolView::new(snap, p)).collect()
    }

    /// The pool called `name`.
    pub fn find(snap: &Snapshot, name: &str) -> Result<views::Pool, ApiError> {
        Ok(PoolView::new(snap, pool_named(&snap.state, name)?))
    }
}

fn pool_named<'a>(state: &'a State, name: &str) -> Result<&'a Pool, ApiError> {
    state
        .pools()
        .values()
        .find(|p| p.name.as_str() == name)
        .ok_or_else(|| state_error(&state::Error::NoSuchPool { pool: crate::core::echo(name) }))
}

/// An assignment as both interfaces show it: varlink `Assignment`, D-Bus `(ssstsbsss)`.
pub struct AssignmentView;

// The views are the wire contract's types; these unit structs only name their builders.
#[allow(clippy::new_ret_no_self)]
impl AssignmentView {
    /// `a` as recorded (applied).
    pub fn from(a: &Assignment) -> views::Assignment {
        views::Assignment {
            id: a.id.to_string(),
            pool: a.pool.to_string(),
            cpus: a.cpus.to_string(),
            millicpus: a.millicpus,
            target: a.target.to_string(),
            reclaim: a.reclaim,
            container: a.container.as_ref().map(|c| c.to_string()).unwrap_or_default(),
            state: "applied".into(),
            reason: String::new(),
        }
    }

    /// `a` with its health in `snap`.
    pub fn new(snap: &Snapshot, a: &Assignment) -> views::Assignment {
        let mut v = AssignmentView::from(a);
        if let Some(why) = snap.assignment_health.get(&a.id) {
            v.state = "degraded".into();
            v.reason = why.clone();
        }
        v
    }

    /// All assignments, or those of `pool` (which must exist).
    pub fn list(snap: &Snapshot, pool: Option<&str>) -> Result<Vec<views::Assignment>, ApiError> {
        Ok(AssignmentView::iter(snap, pool)?.collect())
    }

    /// Like [`AssignmentView::list`], one at a time: for encoders that write each as it comes
    /// rather than holding them all.
    pub fn iter<'a>(
        snap: &'a Snapshot,
        pool: Option<&'a str>,
    ) -> Result<impl Iterator<Item = views::Assignment> + 'a, ApiError> {
        if let Some(name) = pool {
            pool_named(&snap.state, name)?;
        }
        Ok(snap
            .state
            .assignments()
            .values()
            .filter(move |a| pool.is_none_or(|p| a.pool.as_str() == p))
            .map(|a| AssignmentView::new(snap, a)))
    }

    /// The assignment `id`.
    pub fn find(snap: &Snapshot, id: &str) -> Result<views::Assignment, ApiError> {
        AssignmentId::new(id)
            .ok()
            .and_then(|k| snap.state.assignments().get(&k))
            .map(|a| AssignmentView::new(snap, a))
            .ok_or_else(|| state_error(&state::Error::NoSuchAssignment { id: crate::core::echo(id) }))
    }
}

/// What list replies are built from, held so that it can be recognized in a later snapshot.
///
/// A list of assignments depends on the state and on the assignments' health, a list of pools
/// on the state and on the partitions. The engine publishes a new `Arc<State>` for every new
/// state and never changes a state behind an `Arc` others hold (this holds one), so the same
/// pointer is the same state. Health and partitions are rebuilt at every publish, even when
/// they did not change (a drift check that found nothing), so those are compared by value;
/// they are small (degraded assignments, one entry per pool).
struct Basis {
    state: Arc<State>,
    health: Arc<BTreeMap<AssignmentId, String>>,
    partitions: Arc<BTreeMap<PoolName, String>>,
}

impl Basis {
    fn of(snap: &Snapshot) -> Basis {
        Basis {
            state: snap.state.clone(),
            health: snap.assignment_health.clone(),
            partitions: snap.partitions.clone(),
        }
    }

    fn matches(&self, snap: &Snapshot) -> bool {
        fn same<T: PartialEq>(a: &Arc<T>, b: &Arc<T>) -> bool {
            Arc::ptr_eq(a, b) || **a == **b
        }
        Arc::ptr_eq(&self.state, &snap.state)
            && same(&self.health, &snap.assignment_health)
            && same(&self.partitions, &snap.partitions)
    }
}

/// Replies built once per snapshot and shared by every caller reading that snapshot.
///
/// A list of 10,000 assignments is about 1 MB of JSON; building it for each caller, as a tree
/// of values first, made 64 concurrent callers cost the daemon hundreds of MiB. Here the first
/// caller after a change builds the reply (`key` tells apart the lists of one snapshot: all
/// assignments, one pool's, the pools), later and concurrent callers wait for it and get the
/// same `Arc`, and a new snapshot drops what the old one built. What is kept is bounded by the
/// keys callers can ask for: a list per pool that exists plus the whole lists.
pub struct PerSnapshot<T> {
    slot: tokio::sync::Mutex<Built<T>>,
}

struct Built<T> {
    basis: Option<Basis>,
    replies: HashMap<String, Arc<T>>,
}

impl<T> Default for PerSnapshot<T> {
    fn default() -> Self {
        PerSnapshot { slot: tokio::sync::Mutex::new(Built { basis: None, replies: HashMap::new() }) }
    }
}

impl<T> PerSnapshot<T> {
    /// The reply `key` for `snap`: built by `build` unless a caller of the same snapshot built
    /// it already. A failed build is not kept.
    pub async fn get_or_build<E>(
        &self,
        snap: &Snapshot,
        key: &str,
        build: impl FnOnce() -> Result<T, E>,
    ) -> Result<Arc<T>, E> {
        // Held while building, so that callers arriving meanwhile wait for this build instead of
        // each making their own.
        let mut built = self.slot.lock().await;
        if !built.basis.as_ref().is_some_and(|b| b.matches(snap)) {
            built.basis = Some(Basis::of(snap));
            built.replies.clear();
        }
        if let Some(reply) = built.replies.get(key) {
            return Ok(reply.clone());
        }
        let reply = Arc::new(build()?);
        built.replies.insert(key.to_owned(), reply.clone());
        Ok(reply)
    }
}

/// The online CPUs: varlink `Cpu`, D-Bus `(uuuuuu)`.
pub struct CpuView;

impl CpuView {
    /// Every online CPU of `topo`.
    pub fn all(topo: &Topology) -> Vec<views::Cpu> {
        topo.data()
            .cpus
            .iter()
            .map(|(&cpu, p)| views::Cpu {
                cpu,
                core: p.core,
                package: p.package,
                die: p.die,
                node: p.node,
                l3: p.l3,
            })
            .collect()
    }
}

/// A refused or failed call, independent of the interface.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// The error's kind: `NoSuchPool`, `InvalidArgument`, ...
    pub kind: ErrorKind,
    /// Its fields (varlink error parameters).
    pub params: Value,
    /// A sentence for people, naming the argument at fault (the D-Bus error message).
    pub message: String,
}

impl ApiError {
    fn new(kind: ErrorKind, params: Value, message: impl Into<String>) -> ApiError {
        ApiError { kind, params, message: message.into() }
    }
}

/// `InvalidArgument` naming `argument`.
pub fn invalid_argument(argument: &str, reason: &str) -> ApiError {
    ApiError::new(
        ErrorKind::InvalidArgument,
        json!({ "argument": argument, "reason": reason }),
        format!("invalid {argument}: {reason}"),
    )
}

/// `AccessDenied` for `uid`.
pub fn access_denied(uid: u32) -> ApiError {
    ApiError::new(
        ErrorKind::AccessDenied,
        json!({ "uid": uid }),
        format!("uid {uid} may not change pools or assignments: it takes root or the daemon's admin group"),
    )
}

/// `AccessDenied` for `uid`, which could not be told allowed: `why`.
pub fn access_denied_because(uid: u32, why: &str) -> ApiError {
    ApiError::new(
        ErrorKind::AccessDenied,
        json!({ "uid": uid }),
        format!("uid {uid} may not change pools or assignments now: {why}"),
    )
}

/// `ShuttingDown`.
pub fn shutting_down() -> ApiError {
    ApiError::new(ErrorKind::ShuttingDown, json!({}), "the daemon is shutting down")
}

/// `Busy`: too many connections.
pub fn busy() -> ApiError {
    ApiError::new(ErrorKind::Busy, json!({}), "too many connections; try again later")
}

/// `Busy`: too many calls in flight (D-Bus) from `whom` ("uid 65534", "unprivileged peers").
pub fn busy_calls(whom: &str) -> ApiError {
    ApiError::new(
        ErrorKind::Busy,
        json!({}),
        format!("too many calls in flight from {whom}; wait for their answers and try again"),
    )
}

/// Each state error to its own kind.
pub fn state_error(e: &state::Error) -> ApiError {
    use state::Error as E;
    let (kind, params) = match e {
        E::NoSuchPool { pool } => (ErrorKind::NoSuchPool, json!({ "pool": pool })),
        E::PoolExists { pool } => (ErrorKind::PoolExists, json!({ "pool": pool })),
        E::PoolInUse { pool, assignments } => {
            (ErrorKind::PoolInUse, json!({ "pool": pool, "assignments": assignments }))
        }
        E::NoSuchAssignment { id } => (ErrorKind::NoSuchAssignment, json!({ "id": id })),
        E::InsufficientCapacity { pool, requested, free, unit } => (
            ErrorKind::InsufficientCapacity,
            json!({ "pool": pool, "requested": requested, "free": free, "unit": unit }),
        ),
        E::DuplicateId { id } => (ErrorKind::DuplicateId, json!({ "id": id })),
        E::TargetBusy { target, id, pool } => {
            (ErrorKind::TargetBusy, json!({ "target": target, "id": id, "pool": pool }))
        }
        E::TargetNotAllowed { target, reason } => {
            (ErrorKind::TargetNotAllowed, json!({ "target": target, "reason": reason }))
        }
        E::TargetOutsidePool { target, cpus, parent, parent_cpus, hint } => (
            ErrorKind::TargetOutsidePool,
            json!({ "target": target, "cpus": cpus, "parent": parent, "parent_cpus": parent_cpus, "hint": hint }),
        ),
        E::InvalidArgument { arg, reason } => return invalid_argument(arg, reason),
        E::ReservedPool { pool } => (ErrorKind::ReservedPool, json!({ "pool": pool })),
        E::NotWholeCores { pool, requested } => {
            (ErrorKind::NotWholeCores, json!({ "pool": pool, "requested": requested }))
        }
    };
    ApiError::new(kind, params, e.to_string())
}

/// Each engine error to its own kind; the reason is the whole cause chain.
pub fn engine_error(e: &EngineError) -> ApiError {
    let kind = match e {
        EngineError::State(s) => return state_error(s),
        EngineError::Apply(_) | EngineError::Thread(_) => ErrorKind::ApplyFailed,
        EngineError::Store(_) | EngineError::Dropin(_) => ErrorKind::NotDurable,
        EngineError::Config(_) | EngineError::Overridden { .. } | EngineError::NoConfigFiles => {
            ErrorKind::ConfigRejected
        }
        EngineError::Stranded(_) => ErrorKind::AssignmentsStranded,
        EngineError::Topology(_) => ErrorKind::TopologyFailed,
        EngineError::Stopped => return shutting_down(),
    };
    // The kind already says what failed and that nothing changed (clients word it their own
    // way, cpupoolctl: "applying the change to the host failed, and it was rolled back: ..."),
    // so the reason is the cause alone; the D-Bus message, which has no kind to lean on, is
    // the whole chain.
    let reason = match (e, std::error::Error::source(e)) {
        (EngineError::Stranded(misfits), _) => misfits.clone(),
        (_, Some(cause)) => error_chain(cause),
        (_, None) => e.to_string(),
    };
    ApiError::new(kind, json!({ "reason": reason }), error_chain(e))
}

/// Reads the configuration files again and applies them: SIGHUP, and `Reload` over varlink and
/// D-Bus. Tells systemd (`RELOADING=1`, then `READY=1` with the new `STATUS=`) and logs the
/// outcome. `Ok(false)`: the files say what already runs.
pub async fn reload(handle: &Handle) -> Result<bool, EngineError> {
    use sd_notify::NotifyState;
    let notify = |states: &[NotifyState<'_>]| {
        if let Err(e) = sd_notify::notify(false, states) {
            log::warn!("sd_notify failed: {e}");
        }
    };
    // systemd 253+ (Type=notify-reload) wants the time with RELOADING=1; older ones ignore it.
    match NotifyState::monotonic_usec_now() {
        Ok(now) => notify(&[NotifyState::Reloading, now]),
        Err(_) => notify(&[NotifyState::Reloading]),
    }
    let result = handle.reload_from_disk().await;
    match &result {
        Ok(true) => log::info!("configuration reloaded: {}", handle.snapshot().summary()),
        Ok(false) => log::info!("configuration reloaded: nothing changed"),
        Err(e) => log::error!("reload: {}", error_chain(e)),
    }
    notify(&[NotifyState::Ready, NotifyState::Status(&handle.snapshot().summary())]);
    result
}

/// Decodes `Assign`'s arguments. `cpus` and `millicpus`: exactly one is given.
pub fn assign_spec(
    pool: String,
    target: &str,
    cpus: Option<i64>,
    millicpus: Option<i64>,
    id: Option<&str>,
) -> Result<AssignSpec, ApiError> {
    let target = Target::parse(target).map_err(|e| state_error(&e))?;
    let size = match (cpus, millicpus) {
        (Some(n), None) => Size::Cpus(
            u32::try_from(n).map_err(|_| invalid_argument("cpus", "must be between 0 and 4294967295"))?,
        ),
        (None, Some(m)) => Size::Millicpus(
            u64::try_from(m).map_err(|_| invalid_argument("millicpus", "must not be negative"))?,
        ),
        (Some(_), Some(_)) => {
            return Err(invalid_argument("cpus", "give either cpus or millicpus, not both"))
        }
        (None, None) => return Err(invalid_argument("cpus", "give cpus or millicpus")),
    };
    let id = id.map(|id| AssignmentId::new(id).map_err(|e| state_error(&e))).transpose()?;
    Ok(AssignSpec::new(pool, target, size, id))
}

/// Decodes `Run`'s arguments: an assignment for process `pid`.
pub fn run_spec(
    pool: String,
    pid: i64,
    cpus: Option<i64>,
    millicpus: Option<i64>,
    id: Option<&str>,
) -> Result<AssignSpec, ApiError> {
    let pid = u32::try_from(pid)
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| invalid_argument("pid", "must be a process id (1-4194304)"))?;
    assign_spec(pool, &format!("pid:{pid}"), cpus, millicpus, id).map_err(|e| match e.kind {
        ErrorKind::InvalidArgument if e.params.get("argument") == Some(&json!("target")) => {
            invalid_argument("pid", "must be a process id (1-4194304)")
        }
        _ => e,
    })
}

/// Decides whether the caller `uid` may hand process `pid` to the daemon: root may; anyone
/// else only their own processes. `owner` is the process's owner as procfs says
/// ([`crate::host::procfs::process_owner`]); `None` when there is no such process.
pub fn check_process_owner(owner: Option<u32>, pid: u32, uid: u32) -> Result<(), ApiError> {
    match owner {
        _ if uid == 0 => Ok(()),
        Some(o) if o == uid => Ok(()),
        Some(_) => Err(access_denied(uid)),
        None => Err(invalid_argument("pid", &format!("process {pid} does not exist"))),
    }
}

fn pool_name(name: &str) -> Result<PoolName, ApiError> {
    PoolName::new(name).map_err(|e| invalid_argument("name", &e.to_string()))
}

fn source(cpus: Option<&str>, count: Option<i64>, numa: Option<i64>) -> Result<Source, ApiError> {
    let u32_arg = |arg: &str, v: i64| {
        u32::try_from(v).map_err(|_| invalid_argument(arg, "must be between 0 and 4294967295"))
    };
    match (cpus, count) {
        (Some(list), None) => {
            if numa.is_some() {
                return Err(invalid_argument("numa", "only applies to count (a list names its CPUs)"));
            }
            let set = CpuSet::parse(list).map_err(|e| invalid_argument("cpus", &e.to_string()))?;
            if set.is_empty() {
                return Err(invalid_argument("cpus", "is empty"));
            }
            Ok(Source::Cpus(set))
        }
        (None, Some(n)) => {
            let count = u32_arg("count", n)?;
            if count == 0 {
                return Err(invalid_argument("count", "must be at least 1"));
            }
            Ok(Source::Count { count, numa: numa.map(|n| u32_arg("numa", n)).transpose()? })
        }
        (Some(_), Some(_)) => Err(invalid_argument("cpus", "give either cpus or count, not both")),
        (None, None) => Err(invalid_argument("cpus", "give cpus or count")),
    }
}

/// The optional settings of a new pool, as both interfaces take them.
#[derive(Debug, Default, Clone)]
pub struct PoolOptions<'a> {
    /// `cpus`.
    pub cpus: Option<&'a str>,
    /// `count`.
    pub count: Option<i64>,
    /// `numa`.
    pub numa: Option<i64>,
    /// `smt`.
    pub smt: Option<&'a str>,
    /// `isolate`.
    pub isolate: Option<bool>,
    /// `kubelet`.
    pub kubelet: Option<bool>,
}

/// Decodes `CreatePool`'s arguments.
pub fn create_pool(name: &str, kind: &str, o: &PoolOptions<'_>) -> Result<PoolEdit, ApiError> {
    let name = pool_name(name)?;
    let kind = match kind {
        "reserved" => PoolKind::Reserved,
        "exclusive" => PoolKind::Exclusive,
        "shared" => PoolKind::Shared,
        other => {
            return Err(invalid_argument(
                "kind",
                &format!(
                    "`{}` is not one of reserved, exclusive, shared",
                    crate::core::echo(other).escape_debug()
                ),
            ))
        }
    };
    let smt = match o.smt {
        None => None,
        Some("full-cores") => Some(Smt::FullCores),
        Some("threads") => Some(Smt::Threads),
        Some(other) => {
            return Err(invalid_argument(
                "smt",
                &format!("`{}` is not one of full-cores, threads", crate::core::echo(other).escape_debug()),
            ))
        }
    };
    let source = source(o.cpus, o.count, o.numa)?;
    Ok(PoolEdit::Create { name, kind, source, smt, isolate: o.isolate, kubelet: o.kubelet })
}

/// Decodes `ResizePool`'s arguments.
pub fn resize_pool(name: &str, o: &PoolOptions<'_>) -> Result<PoolEdit, ApiError> {
    for (arg, given) in
        [("smt", o.smt.is_some()), ("isolate", o.isolate.is_some()), ("kubelet", o.kubelet.is_some())]
    {
        if given {
            return Err(invalid_argument(arg, "ResizePool changes only cpus, count and numa"));
        }
    }
    Ok(PoolEdit::Resize { name: pool_name(name)?, source: source(o.cpus, o.count, o.numa)? })
}

/// Decodes `DeletePool`'s argument.
pub fn delete_pool(name: &str) -> Result<PoolEdit, ApiError> {
    Ok(PoolEdit::Delete { name: pool_name(name)? })
}

/// The reply of `GetClasses`.
pub struct ClassesReply;

#[allow(clippy::new_ret_no_self)]
impl ClassesReply {
    /// The class rows of the pool `name` (`(idle)` for the CPUs in no pool), or of every pool
    /// when `name` is empty. A pool without classes has none.
    pub fn new(snap: &Snapshot, name: &str) -> Result<views::Classes, ApiError> {
        if !name.is_empty() && name != crate::core::classes::IDLE_CPUS {
            pool_named(&snap.state, name)?;
        }
        let classes = snap
            .classes
            .iter()
            .filter(|r| name.is_empty() || r.pool == name)
            .map(|r| views::ClassSetting {
                pool: r.pool.clone(),
                class: r.class.as_str().to_owned(),
                key: r.key.clone(),
                wanted: r.wanted.clone(),
                in_force: r.in_force.clone(),
                scope: r.scope.clone(),
                state: r.state.as_str().to_owned(),
                reason: r.state.why().to_owned(),
            })
            .collect();
        Ok(views::Classes { classes })
    }
}

/// The reply of `GetIsolation`.
pub struct IsolationReply;

// The views are the wire contract's types; these unit structs only name their builders.
#[allow(clippy::new_ret_no_self)]
impl IsolationReply {
    /// Isolation of the pool `name`, or of every isolated pool when `name` is empty. A pool
    /// that is not isolated has an empty list.
    pub fn new(snap: &Snapshot, name: &str) -> Result<views::Isolation, ApiError> {
        if !name.is_empty() {
            pool_named(&snap.state, name)?;
        }
        let iso = &snap.isolation;
        let pools = iso
            .pools
            .iter()
            .filter(|(n, _)| name.is_empty() || n.as_str() == name)
            .map(|(n, p)| PoolIsolation {
                pool: n.to_string(),
                cpus: p.cpus.to_string(),
                state: p.state().to_owned(),
                summary: p.summary(),
                reason: p.invalid.clone().unwrap_or_default(),
                foreign_percent: p.health.as_ref().and_then(|h| h.foreign_percent).unwrap_or(-1.0),
                per_cpu: p
                    .health
                    .iter()
                    .flat_map(|h| &h.cpus)
                    .map(|c| CpuHealth {
                        cpu: c.cpu,
                        device_irqs_per_sec: c.device_per_sec,
                        ipis_per_sec: c.ipi_per_sec,
                        timer_per_sec: c.timer_per_sec,
                        sources: c
                            .sources
                            .iter()
                            .map(|s| {
                                format!(
                                    "{} {} {}/s",
                                    s.irq,
                                    s.name,
                                    crate::core::housekeeping::rate(s.per_sec)
                                )
                            })
                            .collect::<Vec<_>>()
                            .join(", "),
                    })
                    .collect(),
                irqs: snap.irq.summary(),
                kthreads: iso.kthreads.summary(),
            })
            .collect();
        let workqueue = iso
            .masks
            .iter()
            .find(|m| m.file == crate::host::housekeeping::WORKQUEUE_MASK)
            .map(|m| format!("{} ({})", m.mask, m.by))
            .unwrap_or_default();
        Ok(views::Isolation {
            isolcpus: iso.kernel.boot.isolcpus.to_string(),
            nohz_full: iso.kernel.boot.nohz_full.union(&iso.kernel.nohz_full).to_string(),
            housekeeping: iso.housekeeping.to_string(),
            workqueue,
            pools,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// The reason is the cause alone (clients say what the kind means); the D-Bus message says
    /// each part once.
    #[test]
    fn engine_errors_say_each_phrase_once() {
        let config = EngineError::Config(Box::new(crate::config::ConfigError::Invalid {
            file: "/etc/cpupoold/config.toml".into(),
            key: "pools.dp.count".into(),
            reason: "must be at least 1".into(),
        }));
        let e = engine_error(&config);
        assert_eq!(e.kind, "ConfigRejected");
        assert_eq!(
            e.params,
            json!({ "reason": "`/etc/cpupoold/config.toml`: pools.dp.count: must be at least 1" })
        );
        assert_eq!(
            e.message,
            "the new configuration is invalid; the running one stays: \
             `/etc/cpupoold/config.toml`: pools.dp.count: must be at least 1"
        );
        let apply = EngineError::Apply(crate::host::cgroupfs::HostError::Io(crate::host::IoError::Write {
            path: "/sys/fs/cgroup/a/cpuset.cpus".into(),
            data: "2".into(),
            source: std::io::Error::from_raw_os_error(16),
        }));
        let e = engine_error(&apply);
        assert_eq!(e.kind, "ApplyFailed");
        let reason = e.params["reason"].as_str().unwrap_or_default().to_owned();
        assert!(reason.starts_with("writing `2` to `/sys/fs/cgroup/a/cpuset.cpus`: "), "{reason}");
        assert_eq!(e.message, format!("applying the change failed and was rolled back: {reason}"));
        let stranded = EngineError::Stranded("assignment `a` of pool `dp` holds CPU 3".into());
        let e = engine_error(&stranded);
        assert_eq!(e.params, json!({ "reason": "assignment `a` of pool `dp` holds CPU 3" }));
        assert_eq!(e.message.matches("the running one stays").count(), 1, "{}", e.message);
    }

    #[test]
    fn every_state_error_has_a_documented_kind() {
        let errors = state::every_error();
        for e in &errors {
            let a = state_error(e);
            assert!(ErrorKind::ALL.contains(&a.kind), "{}", a.kind);
            assert!(!a.message.is_empty());
        }
    }

    #[test]
    fn pool_arguments_name_the_argument() {
        let o = |cpus: Option<&'static str>, count: Option<i64>| PoolOptions {
            cpus,
            count,
            ..Default::default()
        };
        let arg =
            |r: Result<PoolEdit, ApiError>| r.unwrap_err().params["argument"].as_str().unwrap().to_owned();
        assert_eq!(arg(create_pool("Web", "shared", &o(Some("1"), None))), "name");
        assert_eq!(arg(create_pool("web", "sharde", &o(Some("1"), None))), "kind");
        assert_eq!(arg(create_pool("web", "shared", &o(Some("1-"), None))), "cpus");
        assert_eq!(arg(create_pool("web", "shared", &o(Some("1"), Some(2)))), "cpus");
        assert_eq!(arg(create_pool("web", "shared", &o(None, None))), "cpus");
        assert_eq!(arg(create_pool("web", "shared", &o(None, Some(0)))), "count");
        assert_eq!(arg(create_pool("web", "shared", &o(None, Some(-1)))), "count");
        let bad_smt = PoolOptions { count: Some(1), smt: Some("half"), ..Default::default() };
        assert_eq!(arg(create_pool("web", "shared", &bad_smt)), "smt");
        let numa_with_list = PoolOptions { cpus: Some("1"), numa: Some(0), ..Default::default() };
        assert_eq!(arg(resize_pool("web", &numa_with_list)), "numa");
        let isolate = PoolOptions { count: Some(1), isolate: Some(true), ..Default::default() };
        assert_eq!(arg(resize_pool("web", &isolate)), "isolate");
        assert!(create_pool("web", "shared", &o(None, Some(2))).is_ok());
    }

    #[test]
    fn assign_arguments_name_the_argument() {
        let arg =
            |r: Result<AssignSpec, ApiError>| r.unwrap_err().params["argument"].as_str().unwrap().to_owned();
        assert_eq!(arg(assign_spec("p".into(), "pid:1", None, None, None)), "cpus");
        assert_eq!(arg(assign_spec("p".into(), "pid:1", Some(1), Some(1), None)), "cpus");
        assert_eq!(arg(assign_spec("p".into(), "pid:1", Some(-1), None, None)), "cpus");
        assert_eq!(arg(assign_spec("p".into(), "pid:1", None, Some(-5), None)), "millicpus");
        assert_eq!(
            assign_spec("p".into(), "cgroup:../../etc", Some(1), None, None).unwrap_err().kind,
            "InvalidArgument"
        );
    }
}
