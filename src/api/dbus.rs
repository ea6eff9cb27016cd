//! The D-Bus API: `org.cpupool.Manager1` at `/org/cpupool/Manager1`, served with zbus.
//!
//! Each method decodes its arguments with the shared [`ops`] decoders, answers reads from the
//! engine's latest [`Snapshot`](crate::engine::Snapshot) and sends mutations to the engine
//! through the [`Handle`]. A task forwards the engine's events as the `PoolChanged` and
//! `AssignmentChanged` signals and `PropertiesChanged` for `Pools`.
//!
//! Mutations ask the bus who the caller is (`GetConnectionUnixUser`: the bus took the uid from
//! the kernel when the client connected) and apply the same [`Authorizer`] rules as varlink.
//! Errors are `org.cpupool.Manager1.Error.<kind>`, one name per kind, with a message naming the
//! argument at fault.
//!
//! The interface as served is kept equal to `dbus/org.cpupool.Manager1.xml` by a test.
// The methods are documented in that file; `zbus::interface` also generates helpers without
// docs (`pools_changed`, ...) in an impl block of its own, where no attribute of ours reaches.
#![allow(missing_docs)]

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use cpupool_wire::dbus::{AssignmentStruct, ClassStruct, CpuStruct, PoolIsolationStruct, PoolStruct};

use tokio::sync::broadcast;
use zbus::message::{Header, Message};
use zbus::names::ErrorName;
use zbus::object_server::SignalEmitter;
use zbus::{Connection, DBusError};
use zvariant::OwnedValue;

use crate::api::auth::Authorizer;
use crate::api::ops::{self, ApiError, AssignmentView, CpuView, PerSnapshot, PoolOptions, PoolView};
use crate::core::edit::PoolEdit;
use crate::engine::{EngineError, Event, Handle};

/// The well-known name.
pub const BUS_NAME: &str = cpupool_wire::names::DBUS_NAME;
/// The object.
pub const OBJECT_PATH: &str = cpupool_wire::names::DBUS_OBJECT;
/// The interface.
pub const INTERFACE: &str = cpupool_wire::names::DBUS_INTERFACE;
/// The prefix of every error name.
pub const ERROR_PREFIX: &str = cpupool_wire::names::DBUS_ERROR_PREFIX;
/// The interface description this module must serve.
pub const INTROSPECTION_XML: &str = cpupool_wire::dbus::INTROSPECTION_XML;

/// Which bus to serve on (it lives with the host side, which connects to systemd through it).
pub use crate::host::bus::Bus;

/// A D-Bus error reply: `org.cpupool.Manager1.Error.<kind>` and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    name: String,
    message: String,
}

impl From<ApiError> for Error {
    fn from(e: ApiError) -> Error {
        Error { name: e.kind.dbus_name(), message: e.message }
    }
}

impl From<EngineError> for Error {
    fn from(e: EngineError) -> Error {
        ops::engine_error(&e).into()
    }
}

impl From<zbus::Error> for Error {
    fn from(e: zbus::Error) -> Error {
        Error { name: "org.freedesktop.DBus.Error.Failed".into(), message: e.to_string() }
    }
}

impl Error {
    /// The full error name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl DBusError for Error {
    fn create_reply(&self, call: &Header<'_>) -> zbus::Result<Message> {
        Message::error(call, self.name.as_str())?.build(&(self.message.as_str(),))
    }

    fn name(&self) -> ErrorName<'_> {
        // Every name is an `ErrorKind`'s D-Bus name, or a standard one.
        ErrorName::from_str_unchecked(&self.name)
    }

    fn description(&self) -> Option<&str> {
        Some(&self.message)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.name, self.message)
    }
}

impl std::error::Error for Error {}

/// The object served at [`OBJECT_PATH`].
pub struct Manager {
    handle: Handle,
    auth: Authorizer,
    started: Instant,
    bus: Option<zbus::fdo::DBusProxy<'static>>,
    /// `ListAssignments` replies of the latest snapshot, shared by every caller.
    assignments: PerSnapshot<Vec<AssignmentStruct>>,
}

/// A list of assignments shared by every caller of one snapshot, serialized from where it is
/// (zbus still encodes a message body per caller, but the list is not rebuilt for each).
pub struct SharedAssignments(Arc<Vec<AssignmentStruct>>);

impl serde::Serialize for SharedAssignments {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl zvariant::Type for SharedAssignments {
    const SIGNATURE: &'static zvariant::Signature = <Vec<AssignmentStruct> as zvariant::Type>::SIGNATURE;
}

impl Manager {
    /// Asks the bus for the caller's uid and checks it.
    async fn authorize(&self, hdr: &Header<'_>) -> Result<(), Error> {
        self.authorize_uid(hdr).await.map(|_| ())
    }

    /// [`Manager::authorize`], returning the caller's uid.
    async fn authorize_uid(&self, hdr: &Header<'_>) -> Result<u32, Error> {
        let (Some(bus), Some(sender)) = (&self.bus, hdr.sender()) else {
            return Err(ops::access_denied(u32::MAX).into());
        };
        let uid = bus.get_connection_unix_user(sender.clone().into()).await.map_err(|e| {
            log::warn!("asking the bus for the uid of `{sender}`: {e}");
            Error::from(ops::access_denied(u32::MAX))
        })?;
        self.auth.check_uid(uid).await.map_err(Error::from)?;
        Ok(uid)
    }

    #[allow(clippy::too_many_arguments)]
    async fn assign_with(
        &self,
        hdr: &Header<'_>,
        pool: String,
        target: &str,
        cpus: u32,
        millicpus: u64,
        id: &str,
        reclaim: bool,
    ) -> Result<AssignmentStruct, Error> {
        self.authorize(hdr).await?;
        let id = Some(id).filter(|s| !s.is_empty());
        let mut spec = ops::assign_spec(pool, target, nonzero(cpus), nonzero(millicpus), id)?;
        spec.reclaim = reclaim;
        let a = self.handle.assign(spec).await?.into_inner();
        Ok(AssignmentView::from(&a).into())
    }

    async fn pool_reply(&self, edit: PoolEdit) -> Result<PoolStruct, Error> {
        let pool = self.handle.edit_pool(edit).await?;
        let snap = self.handle.snapshot();
        // Create and Resize return the pool; it is there unless a later edit already removed it.
        let name = pool.map(|p| p.name.to_string()).unwrap_or_default();
        Ok(PoolView::find(&snap, &name)?.into())
    }
}

/// Records one call of `method` (see [`crate::api::metrics`]) with its error's name.
async fn metered<T>(
    method: &str,
    f: impl std::future::Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    crate::counters::timed("dbus", method, |r: &Result<T, Error>| r.as_ref().err().map(|e| e.name.clone()), f)
        .await
}

/// [`metered`] for a method that cannot fail.
async fn metered_ok<T>(method: &str, f: impl std::future::Future<Output = T>) -> T {
    crate::counters::timed("dbus", method, |_| None, f).await
}

fn options(map: &HashMap<String, OwnedValue>, allowed: &[&str]) -> Result<Options, Error> {
    let mut o = Options::default();
    for (key, value) in map {
        let bad =
            |want: &str| ops::invalid_argument(&format!("options.{key}"), &format!("must be of type {want}"));
        let int = || -> Result<i64, ApiError> {
            match &**value {
                zvariant::Value::U8(n) => Ok(i64::from(*n)),
                zvariant::Value::U16(n) => Ok(i64::from(*n)),
                zvariant::Value::I16(n) => Ok(i64::from(*n)),
                zvariant::Value::U32(n) => Ok(i64::from(*n)),
                zvariant::Value::I32(n) => Ok(i64::from(*n)),
                zvariant::Value::I64(n) => Ok(*n),
                zvariant::Value::U64(n) => i64::try_from(*n).map_err(|_| bad("u")),
                _ => Err(bad("u")),
            }
        };
        let string = || match &**value {
            zvariant::Value::Str(s) => Ok(s.to_string()),
            _ => Err(bad("s")),
        };
        let boolean = || match &**value {
            zvariant::Value::Bool(b) => Ok(*b),
            _ => Err(bad("b")),
        };
        if !allowed.contains(&key.as_str()) {
            return Err(ops::invalid_argument(
                &format!("options.{key}"),
                &format!("unknown option; the options are {}", allowed.join(", ")),
            )
            .into());
        }
        match key.as_str() {
            "cpus" => o.cpus = Some(string()?),
            "count" => o.count = Some(int()?),
            "numa" => o.numa = Some(int()?),
            "smt" => o.smt = Some(string()?),
            "isolate" => o.isolate = Some(boolean()?),
            _ => o.kubelet = Some(boolean()?),
        }
    }
    Ok(o)
}

#[derive(Default)]
struct Options {
    cpus: Option<String>,
    count: Option<i64>,
    numa: Option<i64>,
    smt: Option<String>,
    isolate: Option<bool>,
    kubelet: Option<bool>,
}

impl Options {
    fn borrowed(&self) -> PoolOptions<'_> {
        PoolOptions {
            cpus: self.cpus.as_deref(),
            count: self.count,
            numa: self.numa,
            smt: self.smt.as_deref(),
            isolate: self.isolate,
            kubelet: self.kubelet,
        }
    }
}

fn nonzero<T: Default + PartialEq + Into<i128>>(v: T) -> Option<i64> {
    if v == T::default() {
        None
    } else {
        i64::try_from(v.into()).ok().or(Some(i64::MAX))
    }
}

#[zbus::interface(name = "org.cpupool.Manager1")]
impl Manager {
    #[zbus(out_args("pools"))]
    async fn list_pools(&self) -> Vec<PoolStruct> {
        metered_ok("ListPools", async {
            PoolView::all(&self.handle.snapshot()).into_iter().map(Into::into).collect()
        })
        .await
    }

    #[zbus(out_args("pool"))]
    async fn get_pool(&self, name: &str) -> Result<PoolStruct, Error> {
        metered("GetPool", async { Ok(PoolView::find(&self.handle.snapshot(), name)?.into()) }).await
    }

    #[zbus(out_args("online", "offline", "isolated", "cpus"))]
    async fn get_topology(&self) -> (String, String, String, Vec<CpuStruct>) {
        metered_ok("GetTopology", async {
            let topo = self.handle.snapshot().topology;
            (
                topo.online().to_string(),
                topo.offline().to_string(),
                topo.isolated().to_string(),
                CpuView::all(&topo).into_iter().map(Into::into).collect(),
            )
        })
        .await
    }

    #[zbus(out_args("assignments"))]
    async fn list_assignments(&self, pool: &str) -> Result<SharedAssignments, Error> {
        metered("ListAssignments", async {
            let snap = self.handle.snapshot();
            let filter = Some(pool).filter(|p| !p.is_empty());
            let list = self
                .assignments
                .get_or_build(&snap, pool, || {
                    AssignmentView::iter(&snap, filter).map(|each| each.map(Into::into).collect())
                })
                .await?;
            Ok(SharedAssignments(list))
        })
        .await
    }

    #[zbus(out_args("assignment"))]
    async fn get_assignment(&self, id: &str) -> Result<AssignmentStruct, Error> {
        metered("GetAssignment", async { Ok(AssignmentView::find(&self.handle.snapshot(), id)?.into()) })
            .await
    }

    #[zbus(out_args(
        "version",
        "uptime_seconds",
        "pools",
        "assignments",
        "state_file",
        "config_error",
        "degraded_assignments"
    ))]
    async fn status(&self) -> (String, u64, u32, u32, String, String, u32) {
        metered_ok("Status", async {
            let snap = self.handle.snapshot();
            let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
            (
                env!("CARGO_PKG_VERSION").to_owned(),
                self.started.elapsed().as_secs(),
                count(snap.state.pools().len()),
                count(snap.state.assignments().len()),
                snap.state_path.display().to_string(),
                snap.config_error.clone().unwrap_or_default(),
                count(snap.assignment_health.len()),
            )
        })
        .await
    }

    #[zbus(out_args("isolcpus", "nohz_full", "housekeeping", "workqueue", "pools"))]
    async fn get_isolation(
        &self,
        pool: &str,
    ) -> Result<(String, String, String, String, Vec<PoolIsolationStruct>), Error> {
        metered("GetIsolation", async {
            let r = crate::api::ops::IsolationReply::new(&self.handle.snapshot(), pool)?;
            let pools = r.pools.into_iter().map(Into::into).collect();
            Ok((r.isolcpus, r.nohz_full, r.housekeeping, r.workqueue, pools))
        })
        .await
    }

    #[zbus(out_args("classes"))]
    async fn get_classes(&self, pool: &str) -> Result<Vec<ClassStruct>, Error> {
        metered("GetClasses", async {
            let r = crate::api::ops::ClassesReply::new(&self.handle.snapshot(), pool)?;
            Ok(r.classes.into_iter().map(Into::into).collect())
        })
        .await
    }

    #[zbus(out_args("assignment"))]
    async fn assign(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        pool: String,
        target: &str,
        cpus: u32,
        millicpus: u64,
        id: &str,
    ) -> Result<AssignmentStruct, Error> {
        metered("Assign", self.assign_with(&hdr, pool, target, cpus, millicpus, id, true)).await
    }

    /// Assign with options: `reclaim` false keeps the assignment when the target goes away.
    #[zbus(out_args("assignment"))]
    #[allow(clippy::too_many_arguments)]
    async fn assign_ex(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        pool: String,
        target: &str,
        cpus: u32,
        millicpus: u64,
        id: &str,
        reclaim: bool,
    ) -> Result<AssignmentStruct, Error> {
        metered("AssignEx", self.assign_with(&hdr, pool, target, cpus, millicpus, id, reclaim)).await
    }

    /// Assigns CPUs to process `pid` (the caller's own; root: any) and confines it: in a new
    /// scope in the pool's slice where systemd runs, in place elsewhere.
    #[zbus(out_args("assignment"))]
    async fn run(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        pool: String,
        pid: u32,
        cpus: u32,
        millicpus: u64,
        id: &str,
    ) -> Result<AssignmentStruct, Error> {
        metered("Run", async {
            let uid = self.authorize_uid(&hdr).await?;
            let id = Some(id).filter(|s| !s.is_empty());
            let spec = ops::run_spec(pool, i64::from(pid), nonzero(cpus), nonzero(millicpus), id)?;
            self.auth.check_process(pid, uid)?;
            let a = self.handle.run(spec).await?.into_inner();
            Ok(AssignmentView::from(&a).into())
        })
        .await
    }

    #[zbus(out_args("assignment"))]
    async fn release(&self, #[zbus(header)] hdr: Header<'_>, id: &str) -> Result<AssignmentStruct, Error> {
        metered("Release", async {
            self.authorize(&hdr).await?;
            let a = self.handle.release(id).await?;
            Ok(AssignmentView::from(&a).into())
        })
        .await
    }

    #[zbus(out_args("pool"))]
    async fn create_pool(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        name: &str,
        kind: &str,
        options: HashMap<String, OwnedValue>,
    ) -> Result<PoolStruct, Error> {
        metered("CreatePool", async {
            self.authorize(&hdr).await?;
            let o = self::options(&options, &["cpus", "count", "numa", "smt", "isolate", "kubelet"])?;
            let edit = ops::create_pool(name, kind, &o.borrowed())?;
            self.pool_reply(edit).await
        })
        .await
    }

    #[zbus(out_args("pool"))]
    async fn resize_pool(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        name: &str,
        options: HashMap<String, OwnedValue>,
    ) -> Result<PoolStruct, Error> {
        metered("ResizePool", async {
            self.authorize(&hdr).await?;
            let o = self::options(&options, &["cpus", "count", "numa"])?;
            let edit = ops::resize_pool(name, &o.borrowed())?;
            self.pool_reply(edit).await
        })
        .await
    }

    async fn delete_pool(&self, #[zbus(header)] hdr: Header<'_>, name: &str) -> Result<(), Error> {
        metered("DeletePool", async {
            self.authorize(&hdr).await?;
            let edit = ops::delete_pool(name)?;
            self.handle.edit_pool(edit).await?;
            Ok(())
        })
        .await
    }

    /// `changed` is false when the files say what already runs; a rejected configuration is
    /// an error (ConfigRejected, AssignmentsStranded) and the running one stays.
    #[zbus(out_args("changed"))]
    async fn reload(&self, #[zbus(header)] hdr: Header<'_>) -> Result<bool, Error> {
        metered("Reload", async {
            self.authorize(&hdr).await?;
            Ok(ops::reload(&self.handle).await?)
        })
        .await
    }

    /// How the kubelet's containers get their CPUs (`cpupoolctl status`'s `containers:`);
    /// empty without the device plugin. Read on demand: no change signal.
    #[zbus(property(emits_changed_signal = "false"))]
    async fn containers(&self) -> String {
        self.handle.snapshot().kubelet.container_path().unwrap_or_default()
    }

    #[zbus(property)]
    async fn pools(&self) -> Vec<PoolStruct> {
        PoolView::all(&self.handle.snapshot()).into_iter().map(Into::into).collect()
    }

    #[zbus(property(emits_changed_signal = "const"))]
    async fn version(&self) -> String {
        env!("CARGO_PKG_VERSION").to_owned()
    }

    #[zbus(signal)]
    async fn pool_changed(emitter: &SignalEmitter<'_>, name: &str) -> zbus::Result<()>;

    #[zbus(signal)]
    async fn assignment_changed(emitter: &SignalEmitter<'_>, id: &str, change: &str) -> zbus::Result<()>;
}

/// The running D-Bus service; [`Service::stop`] lets go of the engine.
pub struct Service {
    conn: Connection,
    forwarder: tokio::task::JoinHandle<()>,
}

impl Service {
    /// The connection (for its unique name, in logs and tests).
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// Gives up the name and removes the object, dropping its engine handle, so that the
    /// engine can stop.
    pub async fn stop(self) {
        self.forwarder.abort();
        match self.conn.release_name(BUS_NAME).await {
            Ok(_) => {}
            // The bus went first (the sandbox's private bus gets the same Ctrl-C as the
            // daemon): with it went the name, so there is nothing left to release.
            Err(e) if bus_gone(&e) => {
                log::debug!("releasing the D-Bus name {BUS_NAME}: the bus is gone ({e})")
            }
            Err(e) => log::warn!("releasing the D-Bus name {BUS_NAME}: {e}"),
        }
        let _ = self.conn.object_server().remove::<Manager, _>(OBJECT_PATH).await;
    }
}

/// Whether `e` says the connection to the bus is closed: the bus daemon exited or closed it.
fn bus_gone(e: &zbus::Error) -> bool {
    use std::io::ErrorKind as K;
    match e {
        zbus::Error::InputOutput(io) => {
            matches!(
                io.kind(),
                K::BrokenPipe
                    | K::ConnectionReset
                    | K::ConnectionAborted
                    | K::NotConnected
                    | K::UnexpectedEof
            )
        }
        _ => false,
    }
}

/// Connects to `bus`, serves the manager object and takes the well-known name, then forwards the
/// engine's events as signals until stopped.
pub async fn serve(bus: &Bus, handle: Handle, auth: Authorizer) -> zbus::Result<Service> {
    let builder = bus.builder()?;
    let events = handle.subscribe();
    let manager = Manager {
        handle: handle.clone(),
        auth,
        started: Instant::now(),
        bus: None,
        assignments: PerSnapshot::default(),
    };
    let conn = builder.serve_at(OBJECT_PATH, manager)?.build().await?;
    let proxy = zbus::fdo::DBusProxy::builder(&conn)
        .cache_properties(zbus::proxy::CacheProperties::No)
        .build()
        .await?;
    {
        let iface = conn.object_server().interface::<_, Manager>(OBJECT_PATH).await?;
        iface.get_mut().await.bus = Some(proxy);
    }
    // The name last: once a client can find us, every method works.
    conn.request_name(BUS_NAME).await?;
    let forwarder = tokio::spawn(forward_events(conn.clone(), handle, events));
    Ok(Service { conn, forwarder })
}

/// Emits a signal per engine event, and `PropertiesChanged` for `Pools` when a pool changed.
async fn forward_events(conn: Connection, handle: Handle, mut events: broadcast::Receiver<Event>) {
    let Ok(iface) = conn.object_server().interface::<_, Manager>(OBJECT_PATH).await else {
        return;
    };
    let emitter = iface.signal_emitter();
    loop {
        let result = match events.recv().await {
            Ok(Event::PoolChanged(name)) => {
                async {
                    Manager::pool_changed(emitter, name.as_str()).await?;
                    iface.get().await.pools_changed(emitter).await
                }
                .await
            }
            Ok(Event::AssignmentChanged { id, change }) => {
                Manager::assignment_changed(emitter, id.as_str(), change.as_str()).await
            }
            Err(broadcast::error::RecvError::Lagged(n)) => {
                // Events were missed: say every pool may have changed.
                log::warn!("D-Bus signals fell {n} events behind; announcing every pool");
                let mut r = Ok(());
                for name in handle.snapshot().state.pools().keys() {
                    r = r.and(Manager::pool_changed(emitter, name.as_str()).await);
                }
                r.and(iface.get().await.pools_changed(emitter).await)
            }
            Err(broadcast::error::RecvError::Closed) => return,
        };
        if let Err(e) = result {
            log::warn!("emitting a D-Bus signal: {e}");
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn error_names_follow_the_prefix_and_are_documented() {
        // `Busy` is varlink's answer to too many connections; the bus does that job for D-Bus.
        for kind in ops::ErrorKind::ALL.iter().copied().filter(|k| k.on_dbus()) {
            let e = Error::from(ApiError { kind, params: serde_json::json!({}), message: "m".into() });
            assert_eq!(e.name(), format!("{ERROR_PREFIX}.{kind}"));
            assert!(ErrorName::try_from(e.name()).is_ok(), "{}", e.name());
            assert!(INTROSPECTION_XML.contains(&format!(".{kind}")), "{kind} is not in the XML file");
        }
    }

    #[test]
    fn zero_means_absent() {
        assert_eq!(nonzero(0u32), None);
        assert_eq!(nonzero(3u32), Some(3));
        assert_eq!(nonzero(u64::MAX), Some(i64::MAX));
    }
}
