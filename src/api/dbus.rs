//! The D-Bus API: `org.cpupool.Manager1` at `/org/cpupool/Manager1`, served with zbus.
//!
//! Every method of the table ([`cpupool_wire::methods`]) is served by one implementation of
//! zbus's `Interface` ([`interface`]): a call's arguments, named by the introspection XML,
//! become the method's parameters ([`encode`]; [`args`] decodes option dicts with serde), the
//! method's handler runs ([`crate::api::handlers`], the same varlink runs) through
//! [`Manager::call_as`], and the reply view becomes the XML's out arguments. A task forwards
//! the engine's events as the `PoolChanged` and `AssignmentChanged` signals and
//! `PropertiesChanged` for `Pools`.
//!
//! Every call asks who the caller is: the bus's answer to `GetConnectionUnixUser` (it took the
//! uid from the kernel when the client connected), kept per unique name for the connection's
//! life ([`Callers`]). The uid decides which budget of calls in flight the call draws on
//! ([`CallLimits`], the same rule as varlink's connections, kept in [`callers`]): an unprivileged uid's calls beyond
//! its share are answered `Busy` at once, so a flood cannot take root's room. Mutations apply
//! the same [`Authorizer`] rules as varlink. Errors are `org.cpupool.Manager1.Error.<kind>`, one name per kind, with a message naming the
//! argument at fault.
//!
//! The interface as served is the XML's own, which a test compares with what busctl sees.
#![deny(missing_docs)]

use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use cpupool_wire::dbus::AssignmentStruct;
use cpupool_wire::methods::{self as m, Auth, Method};
use tokio::sync::broadcast;
use zbus::message::{Header, Message};
use zbus::names::ErrorName;
use zbus::object_server::SignalEmitter;
use zbus::{Connection, DBusError};

use crate::api::auth::Authorizer;
use crate::api::error::ApiError;
use crate::api::handlers::{Ctx, Handler};
use crate::api::per_snapshot::PerSnapshot;
use crate::api::views::AssignmentView;
use crate::engine::{EngineError, Event, Handle};

pub mod args;
mod callers;
mod encode;
mod interface;
mod refusals;

pub use callers::CallLimits;
use callers::{Caller, Callers};

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
        e.to_api().into()
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

/// The object served at [`OBJECT_PATH`]: its [`Core`] is shared with the tasks that answer its
/// calls, which zbus's dispatcher does not wait for ([`interface`]).
pub struct Manager(Arc<Core>);

impl std::ops::Deref for Manager {
    type Target = Core;
    fn deref(&self) -> &Core {
        &self.0
    }
}

/// What answering a call needs: the engine, the rules, and who calls.
pub struct Core {
    handle: Handle,
    auth: Authorizer,
    started: Instant,
    /// The bus, to ask who a caller is; set once the connection is up.
    bus: std::sync::OnceLock<zbus::fdo::DBusProxy<'static>>,
    callers: Callers,
    /// `Busy` answers waiting for privileged calls.
    refusals: Arc<refusals::Refusals>,
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

impl Core {
    /// The caller's uid: kept from an earlier call of the same connection, or asked of the bus.
    /// `u32::MAX`: unknown (no sender, or the bus did not say).
    async fn uid_of(&self, hdr: &Header<'_>) -> u32 {
        let (Some(bus), Some(sender)) = (self.bus.get(), hdr.sender()) else { return u32::MAX };
        let asked = self
            .callers
            .sender(sender)
            .uid
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

    /// Runs one call of `method` within the caller's budget (`admitted`: a place the dispatcher
    /// took already, see [`Callers::gate`]; else one is asked for here), metered.
    async fn admitted<T, F>(
        &self,
        hdr: &Header<'_>,
        admitted: Option<Caller>,
        method: &str,
        f: impl FnOnce(Caller) -> F,
    ) -> Result<T, Error>
    where
        F: std::future::Future<Output = Result<T, Error>>,
    {
        metered(method, async {
            let caller = match admitted {
                Some(caller) => caller,
                None => self.admit(hdr).await?,
            };
            f(caller).await
        })
        .await
    }

    /// Runs `M`'s handler for a caller admitted within its budget, authorized when the table
    /// says `M` needs it, with `params` (or the error converting the arguments gave), metered
    /// under the D-Bus member called (`AssignEx` runs `Assign`).
    async fn call_as<M: Handler>(
        &self,
        hdr: &Header<'_>,
        admitted: Option<Caller>,
        member: &str,
        params: Result<M::Params, ApiError>,
    ) -> Result<M::Reply, Error> {
        self.admitted(hdr, admitted, member, |caller| async move {
            let uid = match M::ID.auth() {
                Auth::Admin => caller.authorize()?,
                Auth::Anyone => caller.uid,
            };
            let params = params?;
            let hand_over = |pid| self.auth.check_process(pid, uid);
            let cx = Ctx { handle: &self.handle, started: self.started, may_hand_over: &hand_over };
            Ok(M::handle(&cx, params).await?)
        })
        .await
    }
}

impl Core {
    /// `ListAssignments`, not through the handler: the list is built once per snapshot and
    /// shared by every caller of it.
    async fn list_assignments(
        &self,
        hdr: &Header<'_>,
        admitted: Option<Caller>,
        pool: &str,
    ) -> Result<SharedAssignments, Error> {
        self.admitted(hdr, admitted, m::ListAssignments::NAME, |_| async {
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
}

/// Records one call of `method` (see [`crate::api::metrics`]) with its error's name.
async fn metered<T>(
    method: &str,
    f: impl std::future::Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    crate::counters::timed("dbus", method, |r: &Result<T, Error>| r.as_ref().err().map(|e| e.name.clone()), f)
        .await
}

/// The running D-Bus service; [`Service::stop`] lets go of the engine.
pub struct Service {
    conn: Connection,
    forwarder: tokio::task::JoinHandle<()>,
    /// Sends the `Busy` answers ([`refusals`]).
    refuser: tokio::task::JoinHandle<()>,
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
        self.refuser.abort();
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
    let manager = Manager(Arc::new(Core {
        handle: handle.clone(),
        auth,
        started: Instant::now(),
        bus: std::sync::OnceLock::new(),
        callers: Callers::new(),
        refusals: Arc::default(),
        assignments: PerSnapshot::default(),
    }));
    let refuser = tokio::spawn(manager.refusals.clone().answer(manager.callers.priority.clone()));
    let conn = builder.serve_at(OBJECT_PATH, manager)?.build().await?;
    let proxy = zbus::fdo::DBusProxy::builder(&conn)
        .cache_properties(zbus::proxy::CacheProperties::No)
        .build()
        .await?;
    {
        let iface = conn.object_server().interface::<_, Manager>(OBJECT_PATH).await?;
        // Set once: this is the only place.
        let _ = iface.get().await.bus.set(proxy);
    }
    // The name last: once a client can find us, every method works.
    conn.request_name(BUS_NAME).await?;
    let forwarder = tokio::spawn(forward_events(conn.clone(), handle, events));
    Ok(Service { conn, forwarder, refuser })
}

/// Emits `PoolChanged` for pool `name`.
async fn pool_changed(emitter: &SignalEmitter<'_>, name: &str) -> zbus::Result<()> {
    emitter.emit(INTERFACE, "PoolChanged", &(name,)).await
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
                    pool_changed(emitter, name.as_str()).await?;
                    iface.get().await.pools_changed(emitter).await
                }
                .await
            }
            Ok(Event::AssignmentChanged { id, change }) => {
                emitter.emit(INTERFACE, "AssignmentChanged", &(id.as_str(), change.as_str())).await
            }
            Err(broadcast::error::RecvError::Lagged(n)) => {
                // Events were missed: say every pool may have changed.
                log::warn!("D-Bus signals fell {n} events behind; announcing every pool");
                let mut r = Ok(());
                for name in handle.snapshot().state.pools().keys() {
                    r = r.and(pool_changed(emitter, name.as_str()).await);
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
        for kind in cpupool_wire::ErrorKind::ALL.iter().copied().filter(|k| k.on_dbus()) {
            let e = Error::from(ApiError { kind, params: serde_json::json!({}), message: "m".into() });
            assert_eq!(e.name(), format!("{ERROR_PREFIX}.{kind}"));
            assert!(ErrorName::try_from(e.name()).is_ok(), "{}", e.name());
            assert!(INTROSPECTION_XML.contains(&format!(".{kind}")), "{kind} is not in the XML file");
        }
    }
}
