//! The D-Bus transport: `org.cpupool.Manager1` at `/org/cpupool/Manager1` on the system bus,
//! the session bus or a given address (the sandbox's private bus).
//!
//! zbus is async; the CLI is not. The client owns a tokio current-thread runtime and blocks on
//! each call, bounded by the timeout. A call of a method of the table
//! ([`cpupool_wire::methods`]) is written from the introspection XML, not per method
//! ([`cpupool_wire::dbus::member`]): the parameter struct's fields (absent optionals left out)
//! go into the arguments of the same names of the first of the method's D-Bus members that
//! takes them all (`Assign`, or `AssignEx` when `reclaim` is given); an absent one is its
//! type's zero (`""`, `0`: D-Bus has no optionals), and an `a{sv}` argument takes the fields no
//! other argument names. The reply's arguments become the fields of the same names of the
//! reply view, a D-Bus structure the view's fields in order (through JSON, which serde reads
//! the same way). Error replies `org.cpupool.Manager1.Error.<Kind>` become the same
//! [`crate::error::DaemonError`] kinds the varlink client produces; a daemon that is not on the
//! bus, a bus that cannot be reached and a call without a reply are "unreachable".

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use futures_core::Stream;
use serde_json::{Map, Value};
use zbus::zvariant::{Structure, StructureBuilder, Value as Variant};
use zbus::DBusError as _;

use cpupool_wire::dbus::{member, Arg, Member};
use cpupool_wire::methods::{self as m, Method};
use cpupool_wire::varlink::params;
use cpupool_wire::views::Event;

use crate::error::{DaemonError, Error};

/// Its interface.
pub use cpupool_wire::names::DBUS_INTERFACE as INTERFACE;
/// The daemon's well-known name.
pub use cpupool_wire::names::DBUS_NAME as NAME;
/// Its object.
pub use cpupool_wire::names::DBUS_OBJECT as PATH;

/// Which bus to talk to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bus {
    /// The system bus (where the packaged daemon lives).
    System,
    /// The user's session bus.
    Session,
    /// A D-Bus address, e.g. `unix:path=/tmp/sb/run/bus.sock`.
    Address(String),
}

impl std::str::FromStr for Bus {
    type Err = String;

    fn from_str(s: &str) -> Result<Bus, String> {
        Ok(match s {
            "system" => Bus::System,
            "session" => Bus::Session,
            a if a.contains(':') => Bus::Address(a.to_owned()),
            other => {
                return Err(format!(
                    "`{other}`: expected system, session or a D-Bus address such as unix:path=/run/bus.sock"
                ))
            }
        })
    }
}

impl fmt::Display for Bus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Bus::System => f.write_str("the system bus"),
            Bus::Session => f.write_str("the session bus"),
            Bus::Address(a) => f.write_str(a),
        }
    }
}

/// A connection to the daemon over D-Bus.
pub struct Client {
    // Dropped before the runtime it runs on (fields drop in order).
    proxy: zbus::Proxy<'static>,
    runtime: tokio::runtime::Runtime,
    bus: Bus,
    timeout: Option<Duration>,
    hint: String,
}

impl Client {
    /// Connects to `bus`. `timeout` bounds the connect and each call; `hint` tells the user what
    /// to do when the daemon cannot be reached.
    pub fn connect(bus: &Bus, timeout: Option<Duration>, hint: &str) -> Result<Client, Error> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|source| Error::Local { what: "starting the D-Bus client's runtime".into(), source })?;
        let unreachable =
            |reason: String| Error::Unreachable { address: bus.to_string(), reason, hint: hint.to_owned() };
        let connect = async {
            let builder = match bus {
                Bus::System => zbus::connection::Builder::system()?,
                Bus::Session => zbus::connection::Builder::session()?,
                Bus::Address(a) => zbus::connection::Builder::address(a.as_str())?,
            };
            let conn = builder.build().await?;
            zbus::proxy::Builder::<zbus::Proxy<'static>>::new(&conn)
                .destination(NAME)?
                .path(PATH)?
                .interface(INTERFACE)?
                .cache_properties(zbus::proxy::CacheProperties::No)
                .build()
                .await
        };
        let proxy = match runtime.block_on(with_timeout(timeout, connect)) {
            None => return Err(unreachable(format!("no connection within {}s", secs(timeout)))),
            Some(Err(e)) => return Err(unreachable(e.to_string())),
            Some(Ok(p)) => p,
        };
        Ok(Client { proxy, runtime, bus: bus.clone(), timeout, hint: hint.to_owned() })
    }

    /// The bus, for messages.
    pub fn bus(&self) -> &Bus {
        &self.bus
    }

    fn protocol(&self, reason: String) -> Error {
        Error::Protocol { address: self.bus.to_string(), reason }
    }

    fn map_error(&self, e: zbus::Error) -> Error {
        let unreachable = |reason: String| Error::Unreachable {
            address: self.bus.to_string(),
            reason,
            hint: self.hint.clone(),
        };
        let (name, detail) = match e {
            zbus::Error::MethodError(name, detail, _) => (name.to_string(), detail),
            zbus::Error::FDO(e) => (e.name().to_string(), e.description().map(str::to_owned)),
            zbus::Error::InputOutput(e) => return unreachable(format!("the connection failed: {e}")),
            zbus::Error::Connection(e, _) => return unreachable(e.to_string()),
            other => return Error::Protocol { address: self.bus.to_string(), reason: other.to_string() },
        };
        match name.as_str() {
            "org.freedesktop.DBus.Error.ServiceUnknown" | "org.freedesktop.DBus.Error.NameHasNoOwner" => {
                unreachable(format!("{NAME} is not on the bus"))
            }
            "org.freedesktop.DBus.Error.NoReply"
            | "org.freedesktop.DBus.Error.Timeout"
            | "org.freedesktop.DBus.Error.TimedOut"
            | "org.freedesktop.DBus.Error.Disconnected" => {
                unreachable(format!("no reply: {}", detail.unwrap_or(name)))
            }
            // The bus policy refused the call before the daemon saw it: the same advice applies.
            "org.freedesktop.DBus.Error.AccessDenied" => {
                Error::Daemon(DaemonError { kind: "AccessDenied".into(), parameters: Map::new(), detail })
            }
            _ => Error::Daemon(DaemonError::from_name(&name, Map::new(), detail)),
        }
    }

    /// Calls the table's method `M` with `params` and returns its reply.
    pub fn call_method<M: Method>(&self, params: &M::Params) -> Result<M::Reply, Error> {
        self.runtime.block_on(self.call_async::<M>(params))
    }

    /// [`Client::call_method`] for code already running on the runtime.
    async fn call_async<M: Method>(&self, params: &M::Params) -> Result<M::Reply, Error> {
        let given = match serde_json::to_value(params) {
            Ok(Value::Object(fields)) => fields,
            _ => Map::new(),
        };
        let (member, args) = call_args(M::ID.dbus(), &given).map_err(|r| self.protocol(r))?;
        let call = async {
            if args.is_empty() {
                return self.proxy.call_method(member.name, &()).await;
            }
            let body =
                args.into_iter().fold(StructureBuilder::new(), StructureBuilder::append_field).build()?;
            self.proxy.call_method(member.name, &body).await
        };
        let reply = match with_timeout(self.timeout, call).await {
            None => return Err(self.no_reply()),
            Some(r) => r.map_err(|e| self.map_error(e))?,
        };
        let body = reply.body();
        let outs = match member.outs.as_slice() {
            [] => Vec::new(),
            // One structure: the body's signature is the structure's own, so it is the body.
            [one] if one.signature.starts_with('(') => {
                vec![Variant::from(body.deserialize::<Structure<'_>>().map_err(|e| self.map_error(e))?)]
            }
            _ => body.deserialize::<Structure<'_>>().map_err(|e| self.map_error(e))?.into_fields(),
        };
        let fields = reply_fields(&member, &outs).map_err(|r| self.protocol(r))?;
        serde_json::from_value(fields).map_err(|e| self.protocol(format!("{} reply: {e}", member.name)))
    }

    fn no_reply(&self) -> Error {
        Error::Unreachable {
            address: self.bus.to_string(),
            reason: format!("no reply within {}s", secs(self.timeout)),
            hint: self.hint.clone(),
        }
    }

    /// Subscribes to PoolChanged and AssignmentChanged, then replays every pool with change
    /// `current` (as varlink's Monitor does, so the output is the same), then forwards signals
    /// until the daemon leaves the bus.
    pub fn monitor(&mut self, each: &mut dyn FnMut(Event) -> Result<(), Error>) -> Result<(), Error> {
        self.runtime.block_on(self.monitor_async(each))
    }

    /// The monitor loop; see [`Client::monitor`]. zbus removes a
    /// subscription's match rules on drop by spawning a task, which needs the runtime's
    /// context: so the loop runs entirely on the runtime, and subscribes through a proxy of
    /// its own that is dropped here too.
    async fn monitor_async(&self, each: &mut dyn FnMut(Event) -> Result<(), Error>) -> Result<(), Error> {
        let subscribe = async {
            let proxy = zbus::proxy::Builder::<zbus::Proxy<'static>>::new(self.proxy.connection())
                .destination(NAME)?
                .path(PATH)?
                .interface(INTERFACE)?
                .cache_properties(zbus::proxy::CacheProperties::No)
                .build()
                .await?;
            let signals = proxy.receive_all_signals().await?;
            let owner = proxy.receive_owner_changed().await?;
            Ok::<_, zbus::Error>((signals, owner))
        };
        let (mut signals, mut owner) = match with_timeout(self.timeout, subscribe).await {
            None => return Err(self.no_reply()),
            Some(r) => r.map_err(|e| self.map_error(e))?,
        };
        for p in self.call_async::<m::ListPools>(&params::NoParameters {}).await?.pools {
            each(Event::pool(&p.name, "current"))?;
        }
        loop {
            let got = tokio::select! {
                m = next(&mut signals) => Ok(m),
                o = next(&mut owner) => Err(o.flatten().is_none()),
            };
            let msg = match got {
                Ok(Some(m)) => m,
                // The daemon left the bus, or the connection ended.
                Ok(None) | Err(true) => {
                    return Err(Error::Unreachable {
                        address: self.bus.to_string(),
                        reason: format!("{NAME} left the bus"),
                        hint: self.hint.clone(),
                    })
                }
                // A new owner (a restarted daemon): signals keep coming from it.
                Err(false) => continue,
            };
            let header = msg.header();
            let event = match header.member().map(|m| m.as_str()) {
                Some("PoolChanged") => {
                    msg.body().deserialize::<(String,)>().ok().map(|(n,)| Event::pool(&n, "changed"))
                }
                Some("AssignmentChanged") => msg
                    .body()
                    .deserialize::<(String, String)>()
                    .ok()
                    .map(|(id, c)| Event::assignment(&id, &c)),
                _ => None,
            };
            if let Some(e) = event {
                each(e)?;
            }
        }
    }
}

fn secs(timeout: Option<Duration>) -> f64 {
    timeout.map(|t| t.as_secs_f64()).unwrap_or_default()
}

/// Runs `fut`, giving up (`None`) after `timeout`.
async fn with_timeout<F: Future>(timeout: Option<Duration>, fut: F) -> Option<F::Output> {
    match timeout {
        Some(t) => tokio::time::timeout(t, fut).await.ok(),
        None => Some(fut.await),
    }
}

/// The next item of a stream, without a combinator crate.
async fn next<S: Stream + Unpin>(s: &mut S) -> Option<S::Item> {
    std::future::poll_fn(|cx| Pin::new(&mut *s).poll_next(cx)).await
}

/// The first of `members` (D-Bus methods) that takes every field of `given` (a parameter
/// struct's), with `given` as its arguments.
fn call_args(
    members: &[&str],
    given: &Map<String, Value>,
) -> Result<(Member, Vec<Variant<'static>>), String> {
    for m in members.iter().filter_map(|name| member(name)) {
        let named = |key: &str| m.ins.iter().any(|a| a.name == key);
        let options = m.ins.iter().any(|a| a.signature == "a{sv}");
        if !options && !given.keys().all(|k| named(k)) {
            continue;
        }
        let args = m.ins.iter().map(|a| match a.signature {
            "a{sv}" => {
                let rest = given.iter().filter(|(k, _)| !named(k));
                let options: HashMap<String, Variant<'static>> =
                    rest.map(|(k, v)| Ok((k.clone(), option(k, v)?))).collect::<Result<_, String>>()?;
                Ok(Variant::Dict(options.into()))
            }
            _ => argument(a, given.get(a.name)),
        });
        let args = args.collect::<Result<Vec<_>, String>>()?;
        return Ok((m, args));
    }
    Err(format!("no D-Bus method of {members:?} takes {:?}", given.keys().collect::<Vec<_>>()))
}

/// An argument of signature `a.signature` from a parameter's value; absent is the type's zero.
fn argument(a: &Arg, value: Option<&Value>) -> Result<Variant<'static>, String> {
    let value = value.filter(|v| !v.is_null());
    let wrong = || format!("argument {} ({}): {value:?} does not fit", a.name, a.signature);
    let number = || value.map_or(Some(0), Value::as_u64).ok_or_else(wrong);
    Ok(match a.signature {
        "s" => Variant::from(value.map_or(Some(""), Value::as_str).ok_or_else(wrong)?.to_owned()),
        "u" => Variant::from(u32::try_from(number()?).map_err(|_| wrong())?),
        "t" => Variant::from(number()?),
        "b" => Variant::from(value.map_or(Some(false), Value::as_bool).ok_or_else(wrong)?),
        _ => return Err(wrong()),
    })
}

/// An `a{sv}` option from a parameter's value: a string `s`, a bool `b`, a number `u`.
fn option(key: &str, value: &Value) -> Result<Variant<'static>, String> {
    let wrong = || format!("option {key}: {value} does not fit");
    Ok(match value {
        Value::String(s) => Variant::from(s.clone()),
        Value::Bool(b) => Variant::from(*b),
        Value::Number(n) => Variant::from(n.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(wrong)?),
        _ => return Err(wrong()),
    })
}

/// A reply's arguments `outs` as the JSON object of `m`'s out arguments by name.
fn reply_fields(m: &Member, outs: &[Variant<'_>]) -> Result<Value, String> {
    if outs.len() != m.outs.len() {
        return Err(format!("{} reply: {} arguments, not {}", m.name, outs.len(), m.outs.len()));
    }
    Ok(Value::Object(m.outs.iter().zip(outs).map(|(a, v)| (a.name.to_owned(), json(v))).collect()))
}

/// A D-Bus value as JSON: a structure as the array of its fields.
fn json(v: &Variant<'_>) -> Value {
    match v {
        Variant::U8(n) => Value::from(*n),
        Variant::Bool(b) => Value::from(*b),
        Variant::I16(n) => Value::from(*n),
        Variant::U16(n) => Value::from(*n),
        Variant::I32(n) => Value::from(*n),
        Variant::U32(n) => Value::from(*n),
        Variant::I64(n) => Value::from(*n),
        Variant::U64(n) => Value::from(*n),
        Variant::F64(n) => Value::from(*n),
        Variant::Str(s) => Value::from(s.as_str()),
        Variant::ObjectPath(p) => Value::from(p.as_str()),
        Variant::Signature(s) => Value::from(s.to_string()),
        Variant::Value(inner) => json(inner),
        Variant::Array(a) => a.inner().iter().map(json).collect(),
        Variant::Structure(s) => s.fields().iter().map(json).collect(),
        Variant::Dict(d) => Value::Object(
            d.iter()
                .map(|(k, v)| {
                    (
                        k.downcast_ref::<&str>().map(str::to_owned).unwrap_or_else(|_| json(k).to_string()),
                        json(v),
                    )
                })
                .collect(),
        ),
        _ => Value::Null,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::client::{
        assign_params, create_params, resize_params, Amount, AssignRequest, CpuSource, CreatePoolRequest,
    };

    #[test]
    fn buses() {
        assert_eq!("system".parse::<Bus>(), Ok(Bus::System));
        assert_eq!("session".parse::<Bus>(), Ok(Bus::Session));
        assert_eq!("unix:path=/x".parse::<Bus>(), Ok(Bus::Address("unix:path=/x".into())));
        assert!("systen".parse::<Bus>().is_err());
        assert_eq!(Bus::Address("unix:path=/x".into()).to_string(), "unix:path=/x");
    }

    /// The arguments a call of `M` with `params` sends, and to which member.
    fn sent<M: Method>(params: &M::Params) -> (&'static str, Vec<Variant<'static>>) {
        let Ok(Value::Object(given)) = serde_json::to_value(params) else { panic!("not an object") };
        let (m, args) = call_args(M::ID.dbus(), &given).unwrap();
        (m.name, args)
    }

    #[test]
    fn optionals_are_encoded_as_dbus_wants() {
        let req = AssignRequest {
            pool: "web".into(),
            target: "unit:a.service".into(),
            amount: Amount::Millicpus(250),
            id: None,
            reclaim: true,
        };
        let s = |v: &str| Variant::from(v.to_owned());
        let (member, args) = sent::<m::Assign>(&assign_params(&req));
        assert_eq!(member, "Assign");
        assert_eq!(args, [s("web"), s("unit:a.service"), Variant::U32(0), Variant::U64(250), s("")]);
        let req = AssignRequest { amount: Amount::Cpus(2), id: Some("x".into()), ..req };
        let (_, args) = sent::<m::Assign>(&assign_params(&req));
        assert_eq!(args, [s("web"), s("unit:a.service"), Variant::U32(2), Variant::U64(0), s("x")]);
        // Keeping the assignment takes AssignEx, the member with `reclaim`.
        let (member, args) = sent::<m::Assign>(&assign_params(&AssignRequest { reclaim: false, ..req }));
        assert_eq!((member, args.last()), ("AssignEx", Some(&Variant::Bool(false))));

        let create = CreatePoolRequest {
            name: "p".into(),
            kind: "exclusive".into(),
            source: CpuSource::Count { count: 4, numa: Some(1) },
            smt: Some("threads".into()),
            isolate: Some(true),
            kubelet: None,
            dra: None,
        };
        let (_, args) = sent::<m::CreatePool>(&create_params(&create));
        assert_eq!(args[..2], [s("p"), s("exclusive")]);
        let o: HashMap<String, Variant<'_>> = args[2].try_clone().unwrap().try_into().unwrap();
        let mut keys: Vec<_> = o.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["count", "isolate", "numa", "smt"]);
        assert_eq!(o["count"], Variant::U32(4));
        assert_eq!(o["numa"], Variant::U32(1));
        assert_eq!(o["isolate"], Variant::Bool(true));
        assert_eq!(o["smt"], Variant::from("threads"));
        let (_, args) = sent::<m::ResizePool>(&resize_params("p", &CpuSource::List("8-15".into())));
        let o: HashMap<String, Variant<'_>> = args[1].try_clone().unwrap().try_into().unwrap();
        assert_eq!(o.len(), 1);
        assert_eq!(o["cpus"], Variant::from("8-15"));
    }

    /// `outs` as the reply of `M`'s first D-Bus member.
    fn received<M: Method>(outs: &[Variant<'_>]) -> M::Reply {
        let member = member(M::ID.dbus()[0]).unwrap();
        serde_json::from_value(reply_fields(&member, outs).unwrap()).unwrap()
    }

    #[test]
    fn structures_convert() {
        let p = ("dp", "exclusive", "2-3", "3", 1000u64, 2000u64, true, 1u32, "isolated");
        let p = received::<m::GetPool>(&[Variant::from(
            StructureBuilder::new()
                .add_field(p.0)
                .add_field(p.1)
                .add_field(p.2)
                .add_field(p.3)
                .add_field(p.4)
                .add_field(p.5)
                .add_field(p.6)
                .add_field(p.7)
                .add_field(p.8)
                .build()
                .unwrap(),
        )])
        .pool
        .unwrap();
        assert_eq!(
            (p.assignments, p.free_cpus.as_str(), p.isolated, p.partition.as_str()),
            (1, "3", true, "isolated")
        );
        let a = ("a", "dp", "2", 1000u64, "pid:1", false, "", "applied", "");
        let a = Variant::from(
            StructureBuilder::new()
                .add_field(a.0)
                .add_field(a.1)
                .add_field(a.2)
                .add_field(a.3)
                .add_field(a.4)
                .add_field(a.5)
                .add_field(a.6)
                .add_field(a.7)
                .add_field(a.8)
                .build()
                .unwrap(),
        );
        let a = received::<m::Release>(&[a]).assignment;
        assert_eq!((a.id.as_str(), a.millicpus, a.target.as_str(), a.reclaim), ("a", 1000, "pid:1", false));
        let cpu = StructureBuilder::new()
            .add_field(1u32)
            .add_field(2u32)
            .add_field(3u32)
            .add_field(4u32)
            .add_field(5u32)
            .add_field(6u32)
            .build()
            .unwrap();
        let cpus = Variant::Array(vec![Variant::from(cpu)].try_into().unwrap());
        let t =
            received::<m::GetTopology>(&[Variant::from("0-1"), Variant::from(""), Variant::from(""), cpus]);
        assert_eq!((t.online.as_str(), t.cpus[0].l3), ("0-1", 6));
        // D-Bus's "" is no configuration error; its counts are `u`.
        let status = [
            Variant::from("1"),
            Variant::U64(5),
            Variant::U32(2),
            Variant::U32(3),
            Variant::from("/s"),
            Variant::from(""),
            Variant::U32(0),
        ];
        let st = received::<m::Status>(&status);
        assert_eq!((st.pools, st.assignments, st.config_error, st.containers), (2, 3, None, None));
        assert!(reply_fields(&member("Status").unwrap(), &status[1..]).is_err());
    }

    #[test]
    fn an_unreachable_bus_is_unreachable() {
        let dir = tempfile::tempdir().unwrap();
        let bus = Bus::Address(format!("unix:path={}", dir.path().join("bus.sock").display()));
        let e = Client::connect(&bus, Some(Duration::from_secs(5)), "start it").err().unwrap();
        assert_eq!(e.exit_code(), 3, "{e}");
        assert!(e.to_string().contains("bus.sock"), "{e}");
    }
}
