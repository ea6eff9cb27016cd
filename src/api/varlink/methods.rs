//! Decoding arguments, calling the engine, encoding replies, and the error mapping.
//!
//! No CPU arithmetic lives here: every number comes from the snapshot or the engine's reply.

use serde_json::{json, Map, Value};

use crate::core::pool::Pool;
use crate::core::state::{self, AssignSpec, Assignment, AssignmentId, Size, State, Target};
use crate::engine::{error_chain, EngineError, Event, Handle, Snapshot};

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

/// `AccessDenied`.
pub fn access_denied(uid: u32) -> MethodError {
    ours("AccessDenied", json!({ "uid": uid }))
}

/// `ShuttingDown`.
pub fn shutting_down() -> MethodError {
    ours("ShuttingDown", json!({}))
}

/// `Busy`.
pub fn busy() -> MethodError {
    ours("Busy", json!({}))
}

/// Each state error to its own varlink error.
pub fn state_error(e: &state::Error) -> MethodError {
    use state::Error as E;
    match e {
        E::NoSuchPool { pool } => ours("NoSuchPool", json!({ "pool": pool })),
        E::NoSuchAssignment { id } => ours("NoSuchAssignment", json!({ "id": id })),
        E::InsufficientCapacity { pool, requested, free, unit } => ours(
            "InsufficientCapacity",
            json!({ "pool": pool, "requested": requested, "free": free, "unit": unit }),
        ),
        E::DuplicateId { id } => ours("DuplicateId", json!({ "id": id })),
        E::TargetBusy { target, id, pool } => {
            ours("TargetBusy", json!({ "target": target, "id": id, "pool": pool }))
        }
        E::InvalidArgument { arg, reason } => {
            ours("InvalidArgument", json!({ "argument": arg, "reason": reason }))
        }
        E::ReservedPool { pool } => ours("ReservedPool", json!({ "pool": pool })),
        E::NotWholeCores { pool, requested } => {
            ours("NotWholeCores", json!({ "pool": pool, "requested": requested }))
        }
    }
}

/// Each engine error to its own varlink error; the reason is the whole cause chain.
pub fn engine_error(e: &EngineError) -> MethodError {
    let reason = || json!({ "reason": error_chain(e) });
    match e {
        EngineError::State(s) => state_error(s),
        EngineError::Apply(_) => ours("ApplyFailed", reason()),
        EngineError::Store(_) => ours("NotDurable", reason()),
        EngineError::Config(_) => ours("ConfigRejected", reason()),
        EngineError::Stranded(_) => ours("AssignmentsStranded", reason()),
        EngineError::Topology(_) => ours("TopologyFailed", reason()),
        EngineError::Stopped => shutting_down(),
    }
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
    /// `Assign` (mutating).
    Assign,
    /// `Release` (mutating).
    Release,
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
            (INTERFACE, "Assign") => Method::Assign,
            (INTERFACE, "Release") => Method::Release,
            (INTERFACE, "Monitor") => Method::Monitor,
            (SERVICE | INTERFACE, _) => return Err(service("MethodNotFound", json!({ "method": full }))),
            _ => return Err(service("InterfaceNotFound", json!({ "interface": iface }))),
        };
        Ok(m)
    }

    /// Whether the method changes anything (and so needs authorization).
    pub fn mutates(self) -> bool {
        matches!(self, Method::Assign | Method::Release)
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
pub fn pool_json(state: &State, p: &Pool) -> Value {
    json!({
        "name": p.name.as_str(),
        "kind": p.kind.to_string(),
        "cpus": p.cpus.to_string(),
        "free_cpus": state.free_cpus(p).to_string(),
        "free_millicpus": state.free_millis(p),
        "capacity_millicpus": p.capacity_millis(),
        "isolated": p.isolate,
        "assignments": state.usage(&p.name).count,
    })
}

/// An assignment as the API shows it.
pub fn assignment_json(a: &Assignment) -> Value {
    json!({
        "id": a.id.as_str(),
        "pool": a.pool.as_str(),
        "cpus": a.cpus.to_string(),
        "millicpus": a.millicpus,
        "target": a.target.to_string(),
    })
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

fn find_pool<'a>(state: &'a State, name: &str) -> Result<&'a Pool, MethodError> {
    state
        .pools()
        .values()
        .find(|p| p.name.as_str() == name)
        .ok_or_else(|| state_error(&state::Error::NoSuchPool { pool: name.to_owned() }))
}

/// Answers a read-only method from the current snapshot.
pub fn read(method: Method, params: &Params, snap: &Snapshot, uptime: u64) -> Result<Value, MethodError> {
    let state = &snap.state;
    match method {
        Method::ListPools => {
            let pools: Vec<Value> = state.pools().values().map(|p| pool_json(state, p)).collect();
            Ok(json!({ "pools": pools }))
        }
        Method::GetPool => {
            let name = params.string("name")?;
            Ok(json!({ "pool": pool_json(state, find_pool(state, &name)?) }))
        }
        Method::GetTopology => {
            let topo = &snap.topology;
            let cpus: Vec<Value> = topo
                .data()
                .cpus
                .iter()
                .map(|(cpu, p)| {
                    json!({ "cpu": cpu, "core": p.core, "package": p.package, "die": p.die, "node": p.node, "l3": p.l3 })
                })
                .collect();
            Ok(json!({
                "online": topo.online().to_string(),
                "offline": topo.offline().to_string(),
                "isolated": topo.isolated().to_string(),
                "cpus": cpus,
            }))
        }
        Method::ListAssignments => {
            let pool = params.opt_string("pool")?;
            if let Some(name) = &pool {
                find_pool(state, name)?;
            }
            let list: Vec<Value> = state
                .assignments()
                .values()
                .filter(|a| pool.as_deref().is_none_or(|p| a.pool.as_str() == p))
                .map(assignment_json)
                .collect();
            Ok(json!({ "assignments": list }))
        }
        Method::GetAssignment => {
            let id = params.string("id")?;
            let a = AssignmentId::new(&id)
                .ok()
                .and_then(|k| state.assignments().get(&k))
                .ok_or_else(|| state_error(&state::Error::NoSuchAssignment { id: id.clone() }))?;
            Ok(json!({ "assignment": assignment_json(a) }))
        }
        Method::Status => Ok(json!({
            "version": env!("CARGO_PKG_VERSION"),
            "uptime_seconds": uptime,
            "pools": state.pools().len(),
            "assignments": state.assignments().len(),
            "state_file": snap.state_path.display().to_string(),
            "config_error": snap.config_error,
        })),
        Method::GetInfo => Ok(info()),
        Method::GetInterfaceDescription => describe(params),
        Method::Assign | Method::Release | Method::Monitor => {
            Err(not_implemented(&format!("{INTERFACE}.{method:?}")))
        }
    }
}

/// The argument names each method takes.
pub fn arguments(method: Method) -> &'static [&'static str] {
    match method {
        Method::GetInfo | Method::ListPools | Method::GetTopology | Method::Status | Method::Monitor => &[],
        Method::GetInterfaceDescription => &["interface"],
        Method::GetPool => &["name"],
        Method::ListAssignments => &["pool"],
        Method::GetAssignment | Method::Release => &["id"],
        Method::Assign => &["pool", "target", "cpus", "millicpus", "id"],
    }
}

/// Decodes `Assign`'s arguments.
pub fn assign_spec(params: &Params) -> Result<AssignSpec, MethodError> {
    let pool = params.string("pool")?;
    let target = Target::parse(&params.string("target")?).map_err(|e| state_error(&e))?;
    let bad = |argument: &str, reason: &str| {
        ours("InvalidArgument", json!({ "argument": argument, "reason": reason }))
    };
    let size = match (params.opt_int("cpus")?, params.opt_int("millicpus")?) {
        (Some(n), None) => {
            Size::Cpus(u32::try_from(n).map_err(|_| bad("cpus", "must be between 0 and 4294967295"))?)
        }
        (None, Some(m)) => {
            Size::Millicpus(u64::try_from(m).map_err(|_| bad("millicpus", "must not be negative"))?)
        }
        (Some(_), Some(_)) => return Err(bad("cpus", "give either cpus or millicpus, not both")),
        (None, None) => return Err(bad("cpus", "give cpus or millicpus")),
    };
    let id = match params.opt_string("id")? {
        Some(id) => Some(AssignmentId::new(&id).map_err(|e| state_error(&e))?),
        None => None,
    };
    Ok(AssignSpec { pool, target, size, id })
}

/// Runs a mutating method on the engine.
pub async fn mutate(method: Method, params: &Params, handle: &Handle) -> Result<Value, MethodError> {
    let a = match method {
        Method::Assign => {
            let spec = assign_spec(params)?;
            handle.assign(spec).await.map_err(|e| engine_error(&e))?.into_inner()
        }
        Method::Release => {
            let id = params.string("id")?;
            handle.release(&id).await.map_err(|e| engine_error(&e))?
        }
        other => return Err(not_implemented(&format!("{INTERFACE}.{other:?}"))),
    };
    Ok(json!({ "assignment": assignment_json(&a) }))
}
