//! The D-Bus transport: `org.cpupool.Manager1` at `/org/cpupool/Manager1` on the system bus,
//! the session bus or a given address (the sandbox's private bus).
//!
//! zbus is async; the CLI is not. The client owns a tokio current-thread runtime and blocks on
//! each call, bounded by the timeout. Replies arrive as the D-Bus structures of
//! `dbus/org.cpupool.Manager1.xml` (tuples here) and are converted to the [`cpupool_wire::views`]
//! types, turning D-Bus's "no optionals" encodings back into options (`""` and `0` mean
//! absent); the method names are the table's ([`cpupool_wire::methods`]). Error replies
//! `org.cpupool.Manager1.Error.<Kind>` become the same [`crate::error::DaemonError`] kinds the
//! varlink client produces; a daemon that is not on the bus, a bus that cannot be reached and a
//! call without a reply are "unreachable".

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use futures_core::Stream;
use serde_json::Map;
use zbus::zvariant::Value as Variant;
use zbus::DBusError as _;

use cpupool_wire::dbus::{AssignmentStruct, ClassStruct, CpuStruct, PoolIsolationStruct, PoolStruct};
use cpupool_wire::methods::{self as m, Method as _};
use cpupool_wire::views::{Assignment, ClassSetting, Event, Isolation, Pool, Status, Topology};

use crate::client::{Amount, AssignRequest, CpuSource, CreatePoolRequest, RunRequest};
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

fn pool(t: PoolStruct) -> Pool {
    t.into()
}

fn assignment(t: AssignmentStruct) -> Assignment {
    t.into()
}

/// The `a{sv}` options of CreatePool and ResizePool, with the config file's keys.
fn source_options(source: &CpuSource, options: &mut HashMap<&'static str, Variant<'static>>) {
    match source {
        CpuSource::List(cpus) => {
            options.insert("cpus", Variant::from(cpus.clone()));
        }
        CpuSource::Count { count, numa } => {
            options.insert("count", Variant::from(*count));
            if let Some(n) = numa {
                options.insert("numa", Variant::from(*n));
            }
        }
    }
}

fn create_options(req: &CreatePoolRequest) -> HashMap<&'static str, Variant<'static>> {
    let mut options = HashMap::new();
    source_options(&req.source, &mut options);
    if let Some(smt) = &req.smt {
        options.insert("smt", Variant::from(smt.clone()));
    }
    if let Some(isolate) = req.isolate {
        options.insert("isolate", Variant::from(isolate));
    }
    if let Some(kubelet) = req.kubelet {
        options.insert("kubelet", Variant::from(kubelet));
    }
    options
}

/// Assign's arguments: D-Bus has no optionals, so an absent size is 0 and an absent id "".
fn assign_args(req: &AssignRequest) -> (String, String, u32, u64, String) {
    let (cpus, millicpus) = match req.amount {
        Amount::Cpus(n) => (n, 0),
        Amount::Millicpus(m) => (0, m),
    };
    (req.pool.clone(), req.target.clone(), cpus, millicpus, req.id.clone().unwrap_or_default())
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

    /// Calls `method` with `body` and decodes the reply as `R`.
    fn call<B, R>(&self, method: &'static str, body: &B) -> Result<R, Error>
    where
        B: serde::Serialize + zbus::zvariant::DynamicType,
        R: for<'d> zbus::zvariant::DynamicDeserialize<'d>,
    {
        self.runtime.block_on(self.call_async(method, body))
    }

    /// [`Client::call`] for code already running on the runtime.
    async fn call_async<B, R>(&self, method: &'static str, body: &B) -> Result<R, Error>
    where
        B: serde::Serialize + zbus::zvariant::DynamicType,
        R: for<'d> zbus::zvariant::DynamicDeserialize<'d>,
    {
        match with_timeout(self.timeout, self.proxy.call::<_, B, R>(method, body)).await {
            None => Err(self.no_reply()),
            Some(r) => r.map_err(|e| self.map_error(e)),
        }
    }

    fn no_reply(&self) -> Error {
        Error::Unreachable {
            address: self.bus.to_string(),
            reason: format!("no reply within {}s", secs(self.timeout)),
            hint: self.hint.clone(),
        }
    }

    /// The monitor loop; see [`crate::client::Manager::monitor`]. zbus removes a
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
        let pools: Vec<PoolStruct> = self.call_async(m::ListPools::NAME, &()).await?;
        for p in pools {
            each(Event::pool(&p.0, "current"))?;
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

impl crate::client::Manager for Client {
    fn list_pools(&mut self) -> Result<Vec<Pool>, Error> {
        let pools: Vec<PoolStruct> = self.call(m::ListPools::NAME, &())?;
        Ok(pools.into_iter().map(pool).collect())
    }

    fn get_pool(&mut self, name: &str) -> Result<Pool, Error> {
        self.call(m::GetPool::NAME, &(name,)).map(pool)
    }

    fn topology(&mut self) -> Result<Topology, Error> {
        let (online, offline, isolated, cpus): (String, String, String, Vec<CpuStruct>) =
            self.call(m::GetTopology::NAME, &())?;
        Ok(Topology { online, offline, isolated, cpus: cpus.into_iter().map(Into::into).collect() })
    }

    fn list_assignments(&mut self, pool: Option<&str>) -> Result<Vec<Assignment>, Error> {
        let list: Vec<AssignmentStruct> = self.call(m::ListAssignments::NAME, &(pool.unwrap_or(""),))?;
        Ok(list.into_iter().map(assignment).collect())
    }

    fn isolation(&mut self, pool: &str) -> Result<Isolation, Error> {
        let (isolcpus, nohz_full, housekeeping, workqueue, pools): (
            String,
            String,
            String,
            String,
            Vec<PoolIsolationStruct>,
        ) = self.call(m::GetIsolation::NAME, &(pool,))?;
        let pools = pools.into_iter().map(Into::into).collect();
        Ok(Isolation { isolcpus, nohz_full, housekeeping, workqueue, pools })
    }

    fn classes(&mut self, pool: &str) -> Result<Vec<ClassSetting>, Error> {
        let rows: Vec<ClassStruct> = self.call(m::GetClasses::NAME, &(pool,))?;
        Ok(rows.into_iter().map(Into::into).collect())
    }

    fn status(&mut self) -> Result<Status, Error> {
        let (version, uptime_seconds, pools, assignments, state_file, config_error, degraded): (
            String,
            u64,
            u32,
            u32,
            String,
            String,
            u32,
        ) = self.call(m::Status::NAME, &())?;
        Ok(Status {
            version,
            uptime_seconds,
            pools: pools.into(),
            assignments: assignments.into(),
            state_file,
            config_error: Some(config_error).filter(|e| !e.is_empty()),
            degraded_assignments: degraded.into(),
            // Not in D-Bus Status's signature (kept as clients know it); varlink has it.
            containers: None,
        })
    }

    fn assign(&mut self, req: &AssignRequest) -> Result<Assignment, Error> {
        if req.reclaim {
            self.call(m::Assign::NAME, &assign_args(req)).map(assignment)
        } else {
            let (pool, target, cpus, millicpus, id) = assign_args(req);
            self.call("AssignEx", &(pool, target, cpus, millicpus, id, false)).map(assignment)
        }
    }

    fn run(&mut self, req: &RunRequest) -> Result<Assignment, Error> {
        let (cpus, millicpus) = match req.amount {
            Amount::Cpus(n) => (n, 0),
            Amount::Millicpus(m) => (0, m),
        };
        let args = (req.pool.as_str(), req.pid, cpus, millicpus, req.id.clone().unwrap_or_default());
        self.call(m::Run::NAME, &args).map(assignment)
    }

    fn release(&mut self, id: &str) -> Result<Assignment, Error> {
        self.call(m::Release::NAME, &(id,)).map(assignment)
    }

    fn create_pool(&mut self, req: &CreatePoolRequest) -> Result<Pool, Error> {
        self.call(m::CreatePool::NAME, &(req.name.as_str(), req.kind.as_str(), create_options(req))).map(pool)
    }

    fn resize_pool(&mut self, name: &str, source: &CpuSource) -> Result<Pool, Error> {
        let mut options = HashMap::new();
        source_options(source, &mut options);
        self.call(m::ResizePool::NAME, &(name, options)).map(pool)
    }

    fn delete_pool(&mut self, name: &str) -> Result<(), Error> {
        self.call(m::DeletePool::NAME, &(name,))
    }

    fn reload(&mut self) -> Result<bool, Error> {
        self.call(m::Reload::NAME, &())
    }

    /// Subscribes to PoolChanged and AssignmentChanged, then replays every pool with change
    /// `current` (as varlink's Monitor does, so the output is the same), then forwards signals
    /// until the daemon leaves the bus.
    fn monitor(&mut self, each: &mut dyn FnMut(Event) -> Result<(), Error>) -> Result<(), Error> {
        self.runtime.block_on(self.monitor_async(each))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::client::Manager;

    #[test]
    fn buses() {
        assert_eq!("system".parse::<Bus>(), Ok(Bus::System));
        assert_eq!("session".parse::<Bus>(), Ok(Bus::Session));
        assert_eq!("unix:path=/x".parse::<Bus>(), Ok(Bus::Address("unix:path=/x".into())));
        assert!("systen".parse::<Bus>().is_err());
        assert_eq!(Bus::Address("unix:path=/x".into()).to_string(), "unix:path=/x");
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
        assert_eq!(assign_args(&req), ("web".into(), "unit:a.service".into(), 0, 250, String::new()));
        let req = AssignRequest { amount: Amount::Cpus(2), id: Some("x".into()), ..req };
        assert_eq!(assign_args(&req), ("web".into(), "unit:a.service".into(), 2, 0, "x".into()));

        let create = CreatePoolRequest {
            name: "p".into(),
            kind: "exclusive".into(),
            source: CpuSource::Count { count: 4, numa: Some(1) },
            smt: Some("threads".into()),
            isolate: Some(true),
            kubelet: None,
        };
        let o = create_options(&create);
        let mut keys: Vec<_> = o.keys().copied().collect();
        keys.sort_unstable();
        assert_eq!(keys, ["count", "isolate", "numa", "smt"]);
        assert_eq!(o["count"], Variant::U32(4));
        assert_eq!(o["numa"], Variant::U32(1));
        assert_eq!(o["isolate"], Variant::Bool(true));
        assert_eq!(o["smt"], Variant::from("threads"));
        let mut o = HashMap::new();
        source_options(&CpuSource::List("8-15".into()), &mut o);
        assert_eq!(o.len(), 1);
        assert_eq!(o["cpus"], Variant::from("8-15"));
    }

    #[test]
    fn structures_convert() {
        let p = pool((
            "dp".into(),
            "exclusive".into(),
            "2-3".into(),
            "3".into(),
            1000,
            2000,
            true,
            1,
            "isolated".into(),
        ));
        assert_eq!(
            (p.assignments, p.free_cpus.as_str(), p.isolated, p.partition.as_str()),
            (1, "3", true, "isolated")
        );
        let a = assignment((
            "a".into(),
            "dp".into(),
            "2".into(),
            1000,
            "pid:1".into(),
            false,
            String::new(),
            "applied".into(),
            String::new(),
        ));
        assert_eq!((a.id.as_str(), a.millicpus, a.target.as_str(), a.reclaim), ("a", 1000, "pid:1", false));
        assert_eq!(cpupool_wire::views::Cpu::from((1, 2, 3, 4, 5, 6)).l3, 6);
    }

    #[test]
    fn an_unreachable_bus_is_unreachable() {
        let dir = tempfile::tempdir().unwrap();
        let bus = Bus::Address(format!("unix:path={}", dir.path().join("bus.sock").display()));
        let e = Client::connect(&bus, Some(Duration::from_secs(5)), "start it").err().unwrap();
        assert_eq!(e.exit_code(), 3, "{e}");
        assert!(e.to_string().contains("bus.sock"), "{e}");
        // The trait is implemented (compile-time check that both transports fit it).
        fn _is_manager(c: Client) -> Box<dyn Manager> {
            Box::new(c)
        }
    }
}
