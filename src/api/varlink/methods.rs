//! Decoding arguments, calling the engine, encoding replies, and the error mapping.
//!
//! No CPU arithmetic lives here: every number comes from the snapshot or the engine's reply.

use serde_json::{json, Map, Value};

use crate::api::ops::{self, ApiError, AssignmentView, CpuView, PoolOptions, PoolView};
use crate::config::runtime::PoolEdit;
use crate::core::pool::Pool;
use crate::core::state::{self, AssignSpec, Assignment};
use crate::engine::{EngineError, Event, Handle, Snapshot};

/// The interface this service implements.
pub const INTERFACE: &str = "org.cpupool.Manager";
/// The standard service interface.
pub const SERVICE: &str = "org.varlink.service";
/// The interface description, served verbatim by `GetInterfaceDescription`.
pub const IDL: &str = include_str!("../org.cpupool.Manager.varlink");

/// A failed call: the error name (fully qualified) and its parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct MethodError {
    /// E.g. `org.cpupool.Manager.NoSuchPool`.
    pub name: String,
    /// The error's fields.
    pub parameters: Value,
}

fn ours(name: &str, parameters: Value) -> MethodError {
    MethodError { name: format!("{INTERFACE}.{name}"), parameters }
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

/// A call's arguments, checked against the names the method takes.
pub struct Params(Map<String, Value>);

impl Params {
    /// Rejects arguments the method does not take.
    pub fn new(map: Option<Map<String, Value>>, allowed: &[&str]) -> Result<Params, MethodError> {
        let map = map.unwrap_or_default();
        if let Some(k) = map.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(invalid_parameter(k));
        }
        Ok(Params(map))
    }

    fn get(&self, name: &str) -> Option<&Value> {
        self.0.get(name).filter(|v| !v.is_null())
    }

    /// A required string.
    pub fn string(&self, name: &str) -> Result<String, MethodError> {
        self.opt_string(name)?.ok_or_else(|| invalid_parameter(name))
    }

    /// An optional string (absent or `null`: none).
    pub fn opt_string(&self, name: &str) -> Result<Option<String>, MethodError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(invalid_parameter(name)),
        }
    }

    /// An optional boolean.
    pub fn opt_bool(&self, name: &str) -> Result<Option<bool>, MethodError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| invalid_parameter(name)),
        }
    }

    /// A required integer.
    pub fn int(&self, name: &str) -> Result<i64, MethodError> {
        self.opt_int(name)?.ok_or_else(|| invalid_parameter(name))
    }

    /// An optional integer.
    pub fn opt_int(&self, name: &str) -> Result<Option<i64>, MethodError> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => v.as_i64().map(Some).ok_or_else(|| invalid_parameter(name)),
        }
    }
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
pub fn describe(params: &Params) -> Result<Value, MethodError> {
    let iface = params.string("interface")?;
    match iface.as_str() {
        INTERFACE => Ok(json!({ "description": IDL })),
        SERVICE => Ok(json!({ "description": SERVICE_IDL })),
        _ => Err(service("InterfaceNotFound", json!({ "interface": iface }))),
    }
}

const SERVICE_IDL: &str = "\
# The Varlink Service Interface is provided by every varlink service.
interface org.varlink.service

method GetInfo() -> (
  vendor: string,
  product: string,
  version: string,
  url: string,
  interfaces: []string
)

method GetInterfaceDescription(interface: string) -> (description: string)

error InterfaceNotFound (interface: string)
error MethodNotFound (method: string)
error MethodNotImplemented (method: string)
error InvalidParameter (parameter: string)
error PermissionDenied ()
error ExpectedMore ()
";

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
    match e {
        Event::PoolChanged(name) => json!({ "kind": "pool", "pool": name.as_str(), "change": "changed" }),
        Event::AssignmentChanged { id, change } => {
            json!({ "kind": "assignment", "id": id.as_str(), "change": change.as_str() })
        }
    }
}

/// The initial replay of a monitor: every pool, as `current`.
pub fn current_events(snap: &Snapshot) -> Vec<Value> {
    snap.state
        .pools()
        .keys()
        .map(|name| json!({ "kind": "pool", "pool": name.as_str(), "change": "current" }))
        .collect()
}

/// Answers a read-only method from the current snapshot.
pub fn read(method: Method, params: &Params, snap: &Snapshot, uptime: u64) -> Result<Value, MethodError> {
    let state = &snap.state;
    match method {
        Method::ListPools => Ok(json!({ "pools": to_json(&PoolView::all(snap)) })),
        Method::GetPool => {
            Ok(json!({ "pool": to_json(&PoolView::find(snap, &params.string("name")?).map_err(api)?) }))
        }
        Method::GetTopology => {
            let topo = &snap.topology;
            Ok(json!({
                "online": topo.online().to_string(),
                "offline": topo.offline().to_string(),
                "isolated": topo.isolated().to_string(),
                "cpus": to_json(&CpuView::all(topo)),
            }))
        }
        Method::ListAssignments => {
            let pool = params.opt_string("pool")?;
            Ok(json!({ "assignments": to_json(&AssignmentView::list(snap, pool.as_deref()).map_err(api)?) }))
        }
        Method::GetAssignment => Ok(
            json!({ "assignment": to_json(&AssignmentView::find(snap, &params.string("id")?).map_err(api)?) }),
        ),
        Method::Status => Ok(json!({
            "version": env!("CARGO_PKG_VERSION"),
            "uptime_seconds": uptime,
            "pools": state.pools().len(),
            "assignments": state.assignments().len(),
            "state_file": snap.state_path.display().to_string(),
            "config_error": snap.config_error,
            "degraded_assignments": snap.assignment_health.len(),
        })),
        Method::GetIsolation => {
            let name = params.opt_string("pool")?.unwrap_or_default();
            Ok(to_json(&crate::api::ops::IsolationReply::new(snap, &name).map_err(api)?))
        }
        Method::GetInfo => Ok(info()),
        Method::GetInterfaceDescription => describe(params),
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

/// The argument names each method takes.
pub fn arguments(method: Method) -> &'static [&'static str] {
    match method {
        Method::GetInfo
        | Method::ListPools
        | Method::GetTopology
        | Method::Status
        | Method::Monitor
        | Method::Reload => &[],
        Method::GetInterfaceDescription => &["interface"],
        Method::GetIsolation => &["pool"],
        Method::GetPool | Method::DeletePool => &["name"],
        Method::CreatePool => &["name", "kind", "cpus", "count", "numa", "smt", "isolate", "kubelet"],
        Method::ResizePool => &["name", "cpus", "count", "numa"],
        Method::ListAssignments => &["pool"],
        Method::GetAssignment | Method::Release => &["id"],
        Method::Assign => &["pool", "target", "cpus", "millicpus", "id", "reclaim"],
        Method::Run => &["pool", "pid", "cpus", "millicpus", "id"],
    }
}

/// Decodes `Assign`'s arguments.
pub fn assign_spec(params: &Params) -> Result<AssignSpec, MethodError> {
    let id = params.opt_string("id")?;
    let reclaim = params.opt_bool("reclaim")?;
    ops::assign_spec(
        params.string("pool")?,
        &params.string("target")?,
        params.opt_int("cpus")?,
        params.opt_int("millicpus")?,
        id.as_deref(),
    )
    .map_err(api)
    .map(|spec| AssignSpec { reclaim: reclaim.unwrap_or(true), ..spec })
}

/// Decodes the arguments of `CreatePool`, `ResizePool` or `DeletePool`.
pub fn pool_edit(method: Method, params: &Params) -> Result<PoolEdit, MethodError> {
    let name = params.string("name")?;
    let (cpus, smt) = (params.opt_string("cpus")?, params.opt_string("smt")?);
    let options = PoolOptions {
        cpus: cpus.as_deref(),
        count: params.opt_int("count")?,
        numa: params.opt_int("numa")?,
        smt: smt.as_deref(),
        isolate: params.opt_bool("isolate")?,
        kubelet: params.opt_bool("kubelet")?,
    };
    match method {
        Method::CreatePool => ops::create_pool(&name, &params.string("kind")?, &options),
        Method::ResizePool => ops::resize_pool(&name, &options),
        Method::DeletePool => ops::delete_pool(&name),
        other => return Err(not_implemented(&format!("{INTERFACE}.{other:?}"))),
    }
    .map_err(api)
}

/// Runs a mutating method on the engine.
/// `may_hand_over` checks that the caller may hand a process to `Run`.
pub async fn mutate(
    method: Method,
    params: &Params,
    handle: &Handle,
    may_hand_over: &(dyn Fn(u32) -> Result<(), ops::ApiError> + Sync),
) -> Result<Value, MethodError> {
    let engine = |e: EngineError| engine_error(&e);
    let a = match method {
        Method::Run => {
            let id = params.opt_string("id")?;
            let spec = ops::run_spec(
                params.string("pool")?,
                params.int("pid")?,
                params.opt_int("cpus")?,
                params.opt_int("millicpus")?,
                id.as_deref(),
            )
            .map_err(api)?;
            if let state::Target::Pid(pid) = spec.target {
                may_hand_over(pid).map_err(api)?;
            }
            handle.run(spec).await.map_err(engine)?.into_inner()
        }
        Method::Assign => {
            let spec = assign_spec(params)?;
            handle.assign(spec).await.map_err(engine)?.into_inner()
        }
        Method::Release => {
            let id = params.string("id")?;
            handle.release(&id).await.map_err(engine)?
        }
        Method::Reload => {
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
