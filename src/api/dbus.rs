//! The D-Bus API: `org.cpupool.Manager1` at `/org/cpupool/Manager1`, served with zbus.
//!
//! Each method decodes its arguments with the shared [`ops`] decoders, answers reads from the
//! engine's latest [`Snapshot`](crate::engine::Snapshot) and sends mutations to the engine
//! through the [`Handle`]. A task forwards the engine's events as the `PoolChanged` and
//! `AssignmentChanged` signals and `PropertiesChanged` for `Pools`.
//!
//! Every call asks who the caller is: the bus's answer to `GetConnectionUnixUser` (it took the
//! uid from the kernel when the client connected), kept per unique name for the connection's
//! life ([`Callers`]). The uid decides which budget of calls in flight the call draws on
//! ([`CallLimits`], the same rule as varlink's connections): an unprivileged uid's calls beyond
//! its share are answered `Busy` at once, so a flood cannot take root's room. Mutations apply
//! the same [`Authorizer`] rules as varlink. Errors are `org.cpupool.Manager1.Error.<kind>`, one name per kind, with a message naming the
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
use crate::api::budget::{AdminCache, Budget, Class, Shares, Slot};
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

/// How many calls may await their answer at once, per class of caller (see
/// [`crate::api::budget`]); a call beyond is answered `Busy`.
pub struct CallLimits;

impl CallLimits {
    /// Root, the admin group and the sandbox's owner, together: far more than `cpupoolctl` and
    /// monitors need.
    pub const PRIVILEGED: usize = 256;
    /// All unprivileged uids together.
    pub const UNPRIVILEGED: usize = 64;
    /// One unprivileged uid.
    pub const PER_UID: usize = 16;
    /// The shares of [`Budget`].
    pub const SHARES: Shares = Shares {
        privileged: CallLimits::PRIVILEGED,
        unprivileged: CallLimits::UNPRIVILEGED,
        per_uid: CallLimits::PER_UID,
    };
}

/// Callers' uids by unique name: a name is never given to another connection during the bus's
/// life, so an answer stays true. At most this many are kept; the oldest go first.
const SENDERS_KEPT: usize = 4096;

/// Unique names to uids (each asked of the bus once), and the names in the order they came.
type Senders = (HashMap<String, Arc<tokio::sync::OnceCell<u32>>>, std::collections::VecDeque<String>);

/// Who calls, and what their calls in flight hold.
struct Callers {
    budget: Arc<Budget>,
    /// Unique name to uid (asked of the bus once, however many calls of the connection arrive
    /// at once), and the names in the order they came.
    senders: std::sync::Mutex<Senders>,
    /// Whether uids are privileged; held while the user database is asked, so that a flood of
    /// one uid's calls asks once.
    admins: tokio::sync::Mutex<AdminCache>,
}

/// An admitted call: its caller and its place in the budget, held until it is answered.
struct Caller {
    uid: u32,
    /// `Err`: whether it is privileged could not be told (the reason).
    privileged: Result<bool, String>,
    _slot: Slot,
}

impl Callers {
    fn new() -> Callers {
        Callers {
            budget: Budget::new(CallLimits::SHARES),
            senders: std::sync::Mutex::new(Default::default()),
            admins: tokio::sync::Mutex::new(AdminCache::default()),
        }
    }

    /// A call of `uid` (`privileged`: whether it may mutate), within its budget, or `Busy`.
    fn admit(&self, uid: u32, privileged: Result<bool, String>) -> Result<Caller, Error> {
        let class = if privileged == Ok(true) { Class::Privileged } else { Class::Unprivileged(uid) };
        match self.budget.admit(class) {
            Ok(slot) => Ok(Caller { uid, privileged, _slot: slot }),
            Err(full) => {
                CALL_REFUSALS.note(&format!("the calls in flight of {full} at their limit"));
                Err(ops::busy_calls(&full.to_string()).into())
            }
        }
    }

    /// Where the uid of `sender` is, or will be once asked.
    fn sender(&self, sender: &str) -> Arc<tokio::sync::OnceCell<u32>> {
        let mut guard = self.senders.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (map, order) = &mut *guard;
        if let Some(cell) = map.get(sender) {
            return cell.clone();
        }
        let cell = Arc::new(tokio::sync::OnceCell::new());
        map.insert(sender.to_owned(), cell.clone());
        order.push_back(sender.to_owned());
        while order.len() > SENDERS_KEPT {
            if let Some(old) = order.pop_front() {
                map.remove(&old);
            }
        }
        cell
    }
}

/// The object served at [`OBJECT_PATH`].
pub struct Manager {
    handle: Handle,
    auth: Authorizer,
    started: Instant,
    bus: Option<zbus::fdo::DBusProxy<'static>>,
    callers: Callers,
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
    /// The caller's uid: kept from an earlier call of the same connection, or asked of the bus.
    /// `u32::MAX`: unknown (no sender, or the bus did not say).
    async fn uid_of(&self, hdr: &Header<'_>) -> u32 {
        let (Some(bus), Some(sender)) = (&self.bus, hdr.sender()) else { return u32::MAX };
        let asked = self
            .callers
            .sender(sender)
            .get_or_try_init(|| bus.get_connection_unix_user(sender.clone().into()))
            .await
            .copied();
        asked.unwrap_or_else(|e| {
            // Not kept: the next call asks again.
            log::warn!("asking the bus for the uid of `{sender}`: {e}");
            u32::MAX
        })
    }

    /// Whether `uid` may mutate (its class), as the user database said within the cache's time.
    async fn privileged(&self, uid: u32) -> Result<bool, String> {
        if uid == u32::MAX {
            return Ok(false);
        }
        let mut admins = self.callers.admins.lock().await;
        if let Some(known) = admins.get(uid) {
            return Ok(known);
        }
        match self.auth.allows_uid(uid).await {
            Ok(allowed) => {
                admins.insert(uid, allowed);
                Ok(allowed)
            }
            Err(e) => {
                let why = crate::error_chain(&e);
                log::warn!("D-Bus: whether uid {uid} is privileged: {why}");
                Err(why)
            }
        }
    }

    /// Admits a call within its caller's budget of calls in flight, or answers `Busy`.
    async fn admit(&self, hdr: &Header<'_>) -> Result<Caller, Error> {
        let uid = self.uid_of(hdr).await;
        let privileged = self.privileged(uid).await;
        self.callers.admit(uid, privileged)
    }

    /// Runs one call of `method` within the caller's budget, metered.
    async fn call<T, F>(
        &self,
        hdr: &Header<'_>,
        method: &str,
        f: impl FnOnce(Caller) -> F,
    ) -> Result<T, Error>
    where
        F: std::future::Future<Output = Result<T, Error>>,
    {
        metered(method, async {
            let caller = self.admit(hdr).await?;
            f(caller).await
        })
        .await
    }
}

/// Calls refused `Busy`, in a log line at most every 10 s.
static CALL_REFUSALS: crate::fds::Refusals = crate::fds::Refusals::calls("D-Bus");

impl Caller {
    /// Checks that the caller may mutate; its uid.
    fn authorize(&self) -> Result<u32, Error> {
        match &self.privileged {
            Ok(true) => Ok(self.uid),
            Ok(false) => Err(ops::access_denied(self.uid).into()),
            Err(why) => Err(ops::access_denied_because(
                self.uid,
                &format!("whether it is in the admin group could not be told: {why}"),
            )
            .into()),
        }
    }
}

impl Manager {
    #[allow(clippy::too_many_arguments)]
    async fn assign_with(
        &self,
        caller: Caller,
        pool: String,
        target: &str,
        cpus: u32,
        millicpus: u64,
        id: &str,
        reclaim: bool,
    ) -> Result<AssignmentStruct, Error> {
        caller.authorize()?;
        let id = Some(id).filter(|s| !s.is_empty());
        let mut spec =
            ops::assign_spec(pool, target, nonzero("cpus", cpus)?, nonzero("millicpus", millicpus)?, id)?;
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

/// `argument`'s value, `None` for 0 (absent); one beyond what the API takes (2^63-1) is refused
/// naming the argument, the value and the maximum.
fn nonzero<T: Default + PartialEq + Into<i128>>(argument: &str, v: T) -> Result<Option<i64>, ApiError> {
    if v == T::default() {
        return Ok(None);
    }
    let v = v.into();
    i64::try_from(v)
        .map(Some)
        .map_err(|_| ops::invalid_argument(argument, &format!("{v} is more than the maximum, {}", i64::MAX)))
}

#[zbus::interface(name = "org.cpupool.Manager1")]
impl Manager {
    #[zbus(out_args("pools"))]
    async fn list_pools(&self, #[zbus(header)] hdr: Header<'_>) -> Result<Vec<PoolStruct>, Error> {
        self.call(&hdr, "ListPools", |_| async {
            Ok(PoolView::all(&self.handle.snapshot()).into_iter().map(Into::into).collect())
        })
        .await
    }

    #[zbus(out_args("pool"))]
    async fn get_pool(&self, #[zbus(header)] hdr: Header<'_>, name: &str) -> Result<PoolStruct, Error> {
        self.call(&hdr, "GetPool", |_| async { Ok(PoolView::find(&self.handle.snapshot(), name)?.into()) })
            .await
    }

    #[zbus(out_args("online", "offline", "isolated", "cpus"))]
    async fn get_topology(
        &self,
        #[zbus(header)] hdr: Header<'_>,
    ) -> Result<(String, String, String, Vec<CpuStruct>), Error> {
        self.call(&hdr, "GetTopology", |_| async {
            let topo = self.handle.snapshot().topology;
            Ok((
                topo.online().to_string(),
                topo.offline().to_string(),
                topo.isolated().to_string(),
                CpuView::all(&topo).into_iter().map(Into::into).collect(),
            ))
        })
        .await
    }

    #[zbus(out_args("assignments"))]
    async fn list_assignments(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        pool: &str,
    ) -> Result<SharedAssignments, Error> {
        self.call(&hdr, "ListAssignments", |_| async {
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
    async fn get_assignment(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        id: &str,
    ) -> Result<AssignmentStruct, Error> {
        self.call(&hdr, "GetAssignment", |_| async {
            Ok(AssignmentView::find(&self.handle.snapshot(), id)?.into())
        })
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
    async fn status(
        &self,
        #[zbus(header)] hdr: Header<'_>,
    ) -> Result<(String, u64, u32, u32, String, String, u32), Error> {
        self.call(&hdr, "Status", |_| async {
            let snap = self.handle.snapshot();
            let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
            Ok((
                env!("CARGO_PKG_VERSION").to_owned(),
                self.started.elapsed().as_secs(),
                count(snap.state.pools().len()),
                count(snap.state.assignments().len()),
                snap.state_path.display().to_string(),
                snap.config_error.clone().unwrap_or_default(),
                count(snap.assignment_health.len()),
            ))
        })
        .await
    }

    #[zbus(out_args("isolcpus", "nohz_full", "housekeeping", "workqueue", "pools"))]
    async fn get_isolation(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        pool: &str,
    ) -> Result<(String, String, String, String, Vec<PoolIsolationStruct>), Error> {
        self.call(&hdr, "GetIsolation", |_| async {
            let r = crate::api::ops::IsolationReply::new(&self.handle.snapshot(), pool)?;
            let pools = r.pools.into_iter().map(Into::into).collect();
            Ok((r.isolcpus, r.nohz_full, r.housekeeping, r.workqueue, pools))
        })
        .await
    }

    #[zbus(out_args("classes"))]
    async fn get_classes(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        pool: &str,
    ) -> Result<Vec<ClassStruct>, Error> {
        self.call(&hdr, "GetClasses", |_| async {
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
        self.call(&hdr, "Assign", |c| self.assign_with(c, pool, target, cpus, millicpus, id, true)).await
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
        self.call(&hdr, "AssignEx", |c| self.assign_with(c, pool, target, cpus, millicpus, id, reclaim)).await
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
        self.call(&hdr, "Run", |c| async move {
            let uid = c.authorize()?;
            let id = Some(id).filter(|s| !s.is_empty());
            let spec = ops::run_spec(
                pool,
                i64::from(pid),
                nonzero("cpus", cpus)?,
                nonzero("millicpus", millicpus)?,
                id,
            )?;
            self.auth.check_process(pid, uid)?;
            let a = self.handle.run(spec).await?.into_inner();
            Ok(AssignmentView::from(&a).into())
        })
        .await
    }

    #[zbus(out_args("assignment"))]
    async fn release(&self, #[zbus(header)] hdr: Header<'_>, id: &str) -> Result<AssignmentStruct, Error> {
        self.call(&hdr, "Release", |c| async move {
            c.authorize()?;
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
        self.call(&hdr, "CreatePool", |c| async move {
            c.authorize()?;
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
        self.call(&hdr, "ResizePool", |c| async move {
            c.authorize()?;
            let o = self::options(&options, &["cpus", "count", "numa"])?;
            let edit = ops::resize_pool(name, &o.borrowed())?;
            self.pool_reply(edit).await
        })
        .await
    }

    async fn delete_pool(&self, #[zbus(header)] hdr: Header<'_>, name: &str) -> Result<(), Error> {
        self.call(&hdr, "DeletePool", |c| async move {
            c.authorize()?;
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
        self.call(&hdr, "Reload", |c| async move {
            c.authorize()?;
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
        callers: Callers::new(),
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
        for kind in ops::ErrorKind::ALL.iter().copied().filter(|k| k.on_dbus()) {
            let e = Error::from(ApiError { kind, params: serde_json::json!({}), message: "m".into() });
            assert_eq!(e.name(), format!("{ERROR_PREFIX}.{kind}"));
            assert!(ErrorName::try_from(e.name()).is_ok(), "{}", e.name());
            assert!(INTROSPECTION_XML.contains(&format!(".{kind}")), "{kind} is not in the XML file");
        }
    }

    #[test]
    fn calls_beyond_an_unprivileged_share_are_busy_and_root_keeps_its_room() {
        let callers = Callers::new();
        let nobody: Vec<Caller> = (0..CallLimits::PER_UID)
            .map(|_| callers.admit(65534, Ok(false)).unwrap_or_else(|e| panic!("{e}")))
            .collect();
        let e = callers.admit(65534, Ok(false)).err().unwrap_or_else(|| panic!("admitted beyond the share"));
        assert_eq!(e.name(), format!("{ERROR_PREFIX}.Busy"));
        assert!(e.message.contains("uid 65534"), "{e}");
        // Other uids fill the unprivileged budget; root and a caller whose privilege could not
        // be told are apart: root has its room, the other counts as unprivileged.
        let others: Vec<Caller> = (0..CallLimits::UNPRIVILEGED - CallLimits::PER_UID)
            .map(|i| callers.admit(1000 + (i % 4) as u32, Ok(false)).unwrap_or_else(|e| panic!("{e}")))
            .collect();
        assert!(callers.admit(2000, Err("no thread".into())).is_err());
        let root: Vec<Caller> = (0..CallLimits::PRIVILEGED)
            .map(|_| callers.admit(0, Ok(true)).unwrap_or_else(|e| panic!("root refused: {e}")))
            .collect();
        assert!(root[0].authorize().is_ok());
        assert_eq!(
            nobody[0].authorize().err().map(|e| e.name().to_owned()),
            Some(format!("{ERROR_PREFIX}.AccessDenied"))
        );
        // Answered calls give their room back.
        drop(nobody);
        assert!(callers.admit(65534, Ok(false)).is_ok());
        drop((others, root));
        assert_eq!(callers.budget.held(), (0, 0));
    }

    #[test]
    fn a_caller_whose_privilege_cannot_be_told_is_denied_with_the_reason() {
        let callers = Callers::new();
        let c =
            callers.admit(1000, Err("starting a thread: EAGAIN".into())).unwrap_or_else(|e| panic!("{e}"));
        let e = c.authorize().err().unwrap_or_else(|| panic!("allowed"));
        assert_eq!(e.name(), format!("{ERROR_PREFIX}.AccessDenied"));
        assert!(e.message.contains("EAGAIN"), "{e}");
    }

    #[test]
    fn zero_means_absent() {
        assert_eq!(nonzero("cpus", 0u32), Ok(None));
        assert_eq!(nonzero("cpus", 3u32), Ok(Some(3)));
        assert_eq!(nonzero("millicpus", i64::MAX as u64), Ok(Some(i64::MAX)));
        // What the caller sent, not 2^63-1.
        let e = nonzero("millicpus", u64::MAX).err().map(|e| e.message).unwrap_or_default();
        assert_eq!(
            e,
            "invalid millicpus: 18446744073709551615 is more than the maximum, 9223372036854775807"
        );
    }
}
