//! The varlink side of the table of methods: a call's name resolved to its method, its
//! parameters decoded into the method's struct of [`cpupool_wire::varlink::params`] (unknown
//! names refused, the parameter at fault named in `InvalidParameter`), its handler
//! ([`crate::api::handlers`]) run, and the reply or error encoded. Besides: the standard
//! `org.varlink.service` methods, and the list replies encoded once per snapshot.

use std::cell::RefCell;
use std::sync::Arc;

use cpupool_wire::methods::{self as m, Auth, MethodId};
use cpupool_wire::varlink::params;
use cpupool_wire::views;
use cpupool_wire::ApiError;
use serde::de::DeserializeOwned;
use serde::{Serialize, Serializer};
use serde_json::{json, Map, Value};

use crate::api::handlers::{Ctx, Handler};
use crate::api::per_snapshot::PerSnapshot;
use crate::api::views::{AssignmentView, PoolView};
use crate::engine::{Event, Snapshot};

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

fn ours(kind: cpupool_wire::ErrorKind, parameters: Value) -> MethodError {
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

/// `ShuttingDown`.
pub fn shutting_down() -> MethodError {
    api(ApiError::shutting_down())
}

/// `Busy`.
pub fn busy() -> MethodError {
    api(crate::api::error::busy())
}

/// What a call's name resolves to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// `org.varlink.service.GetInfo`.
    GetInfo,
    /// `org.varlink.service.GetInterfaceDescription`.
    GetInterfaceDescription,
    /// A method of `org.cpupool.Manager`: one of the table.
    Ours(MethodId),
}

impl Method {
    /// Resolves `interface.Method`.
    pub fn parse(full: &str) -> Result<Method, MethodError> {
        let Some((iface, name)) = full.rsplit_once('.') else {
            return Err(service("InterfaceNotFound", json!({ "interface": full })));
        };
        match (iface, name) {
            (SERVICE, "GetInfo") => Ok(Method::GetInfo),
            (SERVICE, "GetInterfaceDescription") => Ok(Method::GetInterfaceDescription),
            (INTERFACE, _) => MethodId::from_name(name)
                .map(Method::Ours)
                .ok_or_else(|| service("MethodNotFound", json!({ "method": full }))),
            (SERVICE, _) => Err(service("MethodNotFound", json!({ "method": full }))),
            _ => Err(service("InterfaceNotFound", json!({ "interface": iface }))),
        }
    }

    /// Whether the method changes anything (and so needs authorization).
    pub fn mutates(self) -> bool {
        matches!(self, Method::Ours(m) if m.auth() == Auth::Admin)
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

/// Runs `M`'s handler on a call's parameters; the reply's parameters.
async fn run<M: Handler>(params: Option<&Map<String, Value>>, cx: &Ctx<'_>) -> Result<Value, MethodError> {
    let p: M::Params = decode(params)?;
    Ok(to_json(&M::handle(cx, p).await.map_err(api)?))
}

macro_rules! dispatch {
    ($($name:ident),*) => {
        /// Answers a call of `id` with its handler. A stream (`Monitor`) is the server's: it
        /// has no single reply.
        pub async fn call(
            id: MethodId,
            params: Option<&Map<String, Value>>,
            cx: &Ctx<'_>,
        ) -> Result<Value, MethodError> {
            match id {
                $(MethodId::$name => run::<m::$name>(params, cx).await,)*
                other => Err(not_implemented(&format!("{INTERFACE}.{}", other.name()))),
            }
        }
    };
}

cpupool_wire::for_each_call!(dispatch);

/// Whole reply messages (NUL included) shared by every caller of one snapshot.
pub type Lists = PerSnapshot<Vec<u8>>;

/// The reply of `ListPools` or `ListAssignments` as a whole message, NUL included: encoded
/// once per snapshot (and pool) into `lists`, straight from the views to bytes, and written to
/// every caller from the same buffer (see [`PerSnapshot`]).
pub async fn list(
    method: MethodId,
    params: Option<&Map<String, Value>>,
    snap: &Snapshot,
    lists: &Lists,
) -> Result<Arc<Vec<u8>>, MethodError> {
    match method {
        MethodId::ListPools => {
            decode::<params::NoParameters>(params)?;
            lists
                .get_or_build(snap, "pools", || {
                    Ok(message(&PoolsReply { pools: Seq::new(PoolView::all(snap)) }))
                })
                .await
        }
        MethodId::ListAssignments => {
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
        other => Err(not_implemented(&format!("{INTERFACE}.{}", other.name()))),
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
