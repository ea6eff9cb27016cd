//! Decoding arguments, calling the engine, encoding replies, and the error mapping.
//!
//! Each method's parameters are decoded into its struct of [`cpupool_wire::varlink::params`]
//! (unknown names refused), with the parameter at fault named in `InvalidParameter`. No CPU
//! arithmetic lives here: every number comes from the snapshot or the engine's reply.

use std::cell::RefCell;
use std::sync::Arc;

use cpupool_wire::varlink::params;
use cpupool_wire::views;
use serde::de::DeserializeOwned;
use serde::{Serialize, Serializer};
use serde_json::{json, Map, Value};

use crate::api::ops::{
    self, ApiError, AssignmentView, CpuView, ErrorKind, PerSnapshot, PoolOptions, PoolView,
};
use crate::core::edit::PoolEdit;
use crate::core::pool::Pool;
use crate::core::state::{self, AssignSpec, Assignment};
use crate::engine::{EngineError, Event, Handle, Snapshot};

/// The interface this service implements.
pub const INTERFACE: &str = cpupool_wire::names::VARLINK_INTERFACE;
/// The standard service interface.
pub const SERVICE: &str = cpupool_wire::names::VARLINK_SERVICE;
/// The interface description, served verbatim by `GetInterfaceDescription`.
pub const IDL: &str = cpupool_wire::varlink::IDL;

/// A failed call: the error name (fully qualified) and its parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct MethodError {
    /// E.g. `org.cpupool.Manager.NoSuchPool`.
    pub name: String,
    /// The error's fields.
    pub parameters: Value,
}

fn ours(kind: ErrorKind, parameters: Value) -> MethodError {
    MethodError { name: kind.varlink_name(), parameters }
}

fn service(name: &str, parameters: Value) -> MethodError {
    MethodError { name: format!("{SERVICE}.{name}"), parameters }
}

/// `org.varlink.service.InvalidParameter`.
pub fn invalid_parameter(parameter: &str) -> MethodError {
    service("InvalidParameter", json!({ "parameter": parameter }))
}

/// `org.varlink.service.ExpectedMore`: a streaming method called without `more`.
pub fn expected_more() -> MethodError {
    service("ExpectedMore", json!({}))
}

/// `org.varlink.service.MethodNotImplemented` (used for `upgrade`, which nothing here supports).
pub fn not_implemented(method: &str) -> MethodError {
    service("MethodNotImplemented", json!({ "method": method }))
}

/// An interface-independent error as a varlink error of this interface.
pub fn api(e: ApiError) -> MethodError {
    ours(e.kind, e.params)
}

/// `AccessDenied`.
pub fn access_denied(uid: u32) -> MethodError {
    api(ops::access_denied(uid))
}

/// `ShuttingDown`.
pub fn shutting_down() -> MethodError {
    api(ops::shutting_down())
}

/// `Busy`.
pub fn busy() -> MethodError {
    api(ops::busy())
}

/// Each state error to its own varlink error.
pub fn state_error(e: &state::Error) -> MethodError {
    api(ops::state_error(e))
}

/// Each engine error to its own varlink error; the reason is the whole cause chain.
pub fn engine_error(e: &EngineError) -> MethodError {
    api(ops::engine_error(e))
}

/// The methods this service answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// `org.varlink.service.GetInfo`.
    GetInfo,
    /// `org.varlink.service.GetInterfaceDescription`.
    GetInterfaceDescription,
    /// `ListPools`.
    ListPools,
    /// `GetPool`.
    GetPool,
    /// `GetTopology`.
    GetTopology,
    /// `ListAssignments`.
    ListAssignments,
    /// `GetAssignment`.
    GetAssignment,
    /// `Status`.
    Status,
    /// `GetIsolation`.
    GetIsolation,
    /// `GetClasses`.
    GetClasses,
    /// `Assign` (mutating).
    Assign,
    /// `Run` (mutating).
    Run,
    /// `Release` (mutating).
    Release,
    /// `CreatePool` (mutating).
    CreatePool,
    /// `ResizePool` (mutating).
    ResizePool,
    /// `DeletePool` (mutating).
    DeletePool,
    /// `Reload` (mutating).
    Reload,
    /// `Monitor` (streaming).
    Monitor,
}

impl Method {
    /// Resolves `interface.Method`.
    pub fn parse(full: &str) -> Result<Method, MethodError> {
        let Some((iface, name)) = full.rsplit_once('.') else {
            return Err(service("InterfaceNotFound", json!({ "interface": full })));
        };
        let m = match (iface, name) {
            (SERVICE, "GetInfo") => Method::GetInfo,
            (SERVICE, "GetInterfaceDescription") => Method::GetInterfaceDescription,
            (INTERFACE, "ListPools") => Method::ListPools,
            (INTERFACE, "GetPool") => Method::GetPool,
            (INTERFACE, "GetTopology") => Method::GetTopology,
            (INTERFACE, "ListAssignments") => Method::ListAssignments,
            (INTERFACE, "GetAssignment") => Method::GetAssignment,
            (INTERFACE, "Status") => Method::Status,
            (INTERFACE, "GetIsolation") => Method::GetIsolation,
            (INTERFACE, "GetClasses") => Method::GetClasses,
            (INTERFACE, "Assign") => Method::Assign,
            (INTERFACE, "Run") => Method::Run,
            (INTERFACE, "Release") => Method::Release,
            (INTERFACE, "CreatePool") => Method::CreatePool,
            (INTERFACE, "ResizePool") => Method::ResizePool,
            (INTERFACE, "DeletePool") => Method::DeletePool,
            (INTERFACE, "Reload") => Method::Reload,
            (INTERFACE, "Monitor") => Method::Monitor,
            (SERVICE | INTERFACE, _) => return Err(service("MethodNotFound", json!({ "method": full }))),
            _ => return Err(service("InterfaceNotFound", json!({ "interface": iface }))),
        };
        Ok(m)
    }

    /// Whether the method changes anything (and so needs authorization).
    pub fn mutates(self) -> bool {
        matches!(
            self,
            Method::Assign
                | Method::Run
                | Method::Release
                | Method::CreatePool
                | Method::ResizePool
                | Method::DeletePool
                | Method::Reload
        )
    }
}

/// A call's parameters decoded into `T`, one of [`params`]. Absent parameters are an empty
/// set. A name the method does not take, a required one missing, or one of the wrong type is
/// `InvalidParameter` naming it.
pub fn decode<T: DeserializeOwned>(parameters: Option<&Map<String, Value>>) -> Result<T, MethodError> {
    let value = Value::Object(parameters.cloned().unwrap_or_default());
    serde_path_to_error::deserialize(value).map_err(|e| {
        let name = match e.path().iter().next() {
            Some(serde_path_to_error::Segment::Map { key }) => key.clone(),
            // A name the struct does not have, or one it needs and did not get, fails at the
            // top level; serde's message quotes the name: "unknown field `x`, expected ...",
            // "missing field `x`".
            _ => quoted(&e.inner().to_string()).unwrap_or_default(),
        };
        invalid_parameter(&name)
    })
}

/// The first name quoted in backticks in `message`.
fn quoted(message: &str) -> Option<String> {
    let (_, rest) = message.split_once('`')?;
    rest.split_once('`').map(|(name, _)| name.to_owned())
}

/// `GetInfo`'s reply.
pub fn info() -> Value {
    json!({
        "vendor": "cpupool",
        "product": "cpupoold",
        "version": env!("CARGO_PKG_VERSION"),
        "url": env!("CARGO_PKG_REPOSITORY"),
        "interfaces": [SERVICE, INTERFACE],
    })
}

/// `GetInterfaceDescription`'s reply.
pub fn describe(params: params::GetInterfaceDescription) -> Result<Value, MethodError> {
    let iface = params.interface;
    match iface.as_str() {
        INTERFACE => Ok(json!({ "description": IDL })),
        SERVICE => Ok(json!({ "description": cpupool_wire::varlink::SERVICE_IDL })),
        _ => Err(service("InterfaceNotFound", json!({ "interface": iface }))),
    }
}

/// A pool as the API shows it.
pub fn pool_json(snap: &Snapshot, p: &Pool) -> Value {
    to_json(&PoolView::new(snap, p))
}

/// An assignment as the API shows it.
pub fn assignment_json(a: &Assignment) -> Value {
    to_json(&AssignmentView::from(a))
}

fn to_json<T: serde::Serialize>(v: &T) -> Value {
    // Plain structs of strings and numbers always serialize.
    serde_json::to_value(v).unwrap_or_default()
}

/// An event as the API shows it.
pub fn event_json(e: &Event) -> Value {
    to_json(&match e {
        Event::PoolChanged(name) => views::Event::pool(name.as_str(), "changed"),
        Event::AssignmentChanged { id, change } => views::Event::assignment(id.as_str(), change.as_str()),
    })
}

/// The initial replay of a monitor: every pool, as `current`.
pub fn current_events(snap: &Snapshot) -> Vec<Value> {
    snap.state.pools().keys().map(|name| to_json(&views::Event::pool(name.as_str(), "current"))).collect()
}

/// Answers a read-only method from the current snapshot.
pub fn read(
    method: Method,
    params: Option<&Map<String, Value>>,
    snap: &Snapshot,
    uptime: u64,
) -> Result<Value, MethodError> {
    let state = &snap.state;
    let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
    match method {
        Method::ListPools => {
            decode::<params::NoParameters>(params)?;
            Ok(json!({ "pools": to_json(&PoolView::all(snap)) }))
        }
        Method::GetPool => {
            let p: params::GetPool = decode(params)?;
            Ok(json!({ "pool": to_json(&PoolView::find(snap, &p.name).map_err(api)?) }))
        }
        Method::GetTopology => {
            decode::<params::NoParameters>(params)?;
            let topo = &snap.topology;
            Ok(to_json(&views::Topology {
                online: topo.online().to_string(),
                offline: topo.offline().to_string(),
                isolated: topo.isolated().to_string(),
                cpus: CpuView::all(topo),
            }))
        }
        Method::ListAssignments => {
            let p: params::ListAssignments = decode(params)?;
            Ok(
                json!({ "assignments": to_json(&AssignmentView::list(snap, p.pool.as_deref()).map_err(api)?) }),
            )
        }
        Method::GetAssignment => {
            let p: params::GetAssignment = decode(params)?;
            Ok(json!({ "assignment": to_json(&AssignmentView::find(snap, &p.id).map_err(api)?) }))
        }
        Method::Status => {
            decode::<params::NoParameters>(params)?;
            Ok(to_json(&views::Status {
                version: env!("CARGO_PKG_VERSION").to_owned(),
                uptime_seconds: uptime,
                pools: count(state.pools().len()),
                assignments: count(state.assignments().len()),
                state_file: snap.state_path.display().to_string(),
                config_error: snap.config_error.clone(),
                degraded_assignments: count(snap.assignment_health.len()),
                containers: snap.kubelet.container_path(),
            }))
        }
        Method::GetIsolation => {
            let p: params::GetIsolation = decode(params)?;
            let name = p.pool.unwrap_or_default();
            Ok(to_json(&crate::api::ops::IsolationReply::new(snap, &name).map_err(api)?))
        }
        Method::GetClasses => {
            let p: params::GetClasses = decode(params)?;
            let name = p.pool.unwrap_or_default();
            Ok(to_json(&crate::api::ops::ClassesReply::new(snap, &name).map_err(api)?))
        }
        Method::GetInfo => {
            decode::<params::NoParameters>(params)?;
            Ok(info())
        }
        Method::GetInterfaceDescription => describe(decode(params)?),
        m @ (Method::Assign
        | Method::Run
        | Method::Release
        | Method::CreatePool
        | Method::ResizePool
        | Method::DeletePool
        | Method::Reload
        | Method::Monitor) => Err(not_implemented(&format!("{INTERFACE}.{m:?}"))),
    }
}

/// Whole reply messages (NUL included) shared by every caller of one snapshot.
pub type Lists = PerSnapshot<Vec<u8>>;

/// The reply of `ListPools` or `ListAssignments` as a whole message, NUL included: encoded
/// once per snapshot (and pool) into `lists`, straight from the views to bytes, and written to
/// every caller from the same buffer (see [`PerSnapshot`]).
pub async fn list(
    method: Method,
    params: Option<&Map<String, Value>>,
    snap: &Snapshot,
    lists: &Lists,
) -> Result<Arc<Vec<u8>>, MethodError> {
    match method {
        Method::ListPools => {
            decode::<params::NoParameters>(params)?;
            lists
                .get_or_build(snap, "pools", || {
                    Ok(message(&PoolsReply { pools: Seq::new(PoolView::all(snap)) }))
                })
                .await
        }
        Method::ListAssignments => {
            let p: params::ListAssignments = decode(params)?;
            let pool = p.pool.as_deref();
            // Assignment ids and pool names cannot contain a space, so the keys are distinct.
            let key = pool.map_or_else(|| "assignments".to_owned(), |p| format!("assignments of {p}"));
            lists
                .get_or_build(snap, &key, || {
                    let each = AssignmentView::iter(snap, pool).map_err(api)?;
                    Ok(message(&AssignmentsReply { assignments: Seq::new(each) }))
                })
                .await
        }
        other => Err(not_implemented(&format!("{INTERFACE}.{other:?}"))),
    }
}

/// A reply's message, as [`wire::Reply::encode`](cpupool_wire::varlink::Reply::encode) frames
/// it: `{"parameters":...}` and the NUL.
fn message(parameters: &impl Serialize) -> Vec<u8> {
    #[derive(Serialize)]
    struct Envelope<'a, P> {
        parameters: &'a P,
    }
    // Views are strings, numbers and booleans: serializing them cannot fail.
    let mut out = serde_json::to_vec(&Envelope { parameters }).unwrap_or_else(|_| b"{}".to_vec());
    out.push(0);
    out.shrink_to_fit();
    out
}

#[derive(Serialize)]
struct PoolsReply<S> {
    pools: S,
}

#[derive(Serialize)]
struct AssignmentsReply<S> {
    assignments: S,
}

/// A JSON array written item by item as the iterator yields them, so a list is never held
/// twice (as views and as bytes). Serializes once.
struct Seq<I>(RefCell<Option<I>>);

impl<I> Seq<I> {
    fn new(items: impl IntoIterator<IntoIter = I>) -> Seq<I> {
        Seq(RefCell::new(Some(items.into_iter())))
    }
}

impl<I: Iterator> Serialize for Seq<I>
where
    I::Item: Serialize,
{
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.borrow_mut().take().into_iter().flatten())
    }
}

/// Decodes `Assign`'s arguments.
pub fn assign_spec(p: params::Assign) -> Result<AssignSpec, MethodError> {
    ops::assign_spec(p.pool, &p.target, p.cpus, p.millicpus, p.id.as_deref())
        .map_err(api)
        .map(|spec| AssignSpec { reclaim: p.reclaim.unwrap_or(true), ..spec })
}

/// Decodes the arguments of `CreatePool`, `ResizePool` or `DeletePool`.
pub fn pool_edit(method: Method, params: Option<&Map<String, Value>>) -> Result<PoolEdit, MethodError> {
    match method {
        Method::CreatePool => {
            let p: params::CreatePool = decode(params)?;
            let options = PoolOptions {
                cpus: p.cpus.as_deref(),
                count: p.count,
                numa: p.numa,
                smt: p.smt.as_deref(),
                isolate: p.isolate,
                kubelet: p.kubelet,
            };
            ops::create_pool(&p.name, &p.kind, &options)
        }
        Method::ResizePool => {
            let p: params::ResizePool = decode(params)?;
            let options =
                PoolOptions { cpus: p.cpus.as_deref(), count: p.count, numa: p.numa, ..Default::default() };
            ops::resize_pool(&p.name, &options)
        }
        Method::DeletePool => ops::delete_pool(&decode::<params::DeletePool>(params)?.name),
        other => return Err(not_implemented(&format!("{INTERFACE}.{other:?}"))),
    }
    .map_err(api)
}

/// Runs a mutating method on the engine.
/// `may_hand_over` checks that the caller may hand a process to `Run`.
pub async fn mutate(
    method: Method,
    params: Option<&Map<String, Value>>,
    handle: &Handle,
    may_hand_over: &(dyn Fn(u32) -> Result<(), ops::ApiError> + Sync),
) -> Result<Value, MethodError> {
    let engine = |e: EngineError| engine_error(&e);
    let a = match method {
        Method::Run => {
            let p: params::Run = decode(params)?;
            let spec = ops::run_spec(p.pool, p.pid, p.cpus, p.millicpus, p.id.as_deref()).map_err(api)?;
            if let state::Target::Pid(pid) = spec.target {
                may_hand_over(pid).map_err(api)?;
            }
            handle.run(spec).await.map_err(engine)?.into_inner()
        }
        Method::Assign => {
            let spec = assign_spec(decode(params)?)?;
            handle.assign(spec).await.map_err(engine)?.into_inner()
        }
        Method::Release => {
            let p: params::Release = decode(params)?;
            handle.release(&p.id).await.map_err(engine)?
        }
        Method::Reload => {
            decode::<params::NoParameters>(params)?;
            let changed = ops::reload(handle).await.map_err(engine)?;
            return Ok(json!({ "changed": changed }));
        }
        Method::CreatePool | Method::ResizePool | Method::DeletePool => {
            let pool = handle.edit_pool(pool_edit(method, params)?).await.map_err(engine)?;
            let snap = handle.snapshot();
            return Ok(match pool {
                Some(p) => json!({ "pool": pool_json(&snap, &p) }),
                None => json!({}),
            });
        }
        other => return Err(not_implemented(&format!("{INTERFACE}.{other:?}"))),
    };
    Ok(json!({ "assignment": assignment_json(&a) }))
}
