//! `org.cpupool.Manager1` as zbus serves it: zbus's [`Interface`] written once, for every
//! method of the table, instead of one Rust fn per D-Bus member (which `#[zbus::interface]`
//! needs).
//!
//! Data flow: zbus's object server hands a call to [`Interface::call`]; its member resolves to
//! a method of the table ([`MethodId::dbus`]) and to its arguments in the introspection XML
//! ([`cpupool_wire::dbus::member`]); a body of another signature is refused with
//! `InvalidArgs`, as zbus refuses one. The arguments become the method's parameters
//! ([`encode::params`]), [`Manager::call_as`] admits, authorizes and runs its handler, and the
//! reply view becomes the XML's out arguments ([`encode::reply`]). Properties are read here
//! too; the introspection served is the XML's own `<interface>` element.
//!
//! zbus calls this trait unstable: it changed in 5.15 (`DispatchResult2`), which is why the
//! workspace holds zbus to `~5.19`; a zbus that changes it again fails to compile here.

use std::borrow::Cow;
use std::collections::HashMap;

use cpupool_wire::dbus::{member, Member};
use cpupool_wire::methods::{self as m, MethodId};
use zbus::message::{Flags, Header, Message};
use zbus::names::{InterfaceName, MemberName};
use zbus::object_server::{DispatchResult2, Interface, SignalEmitter};
use zbus::{fdo, Connection, ObjectServer};
use zvariant::{OwnedValue, Signature, Structure, Value};

use super::callers::{Caller, Gate};
use super::encode::{self, Unencodable};
use super::{Core, Error, Manager, SharedAssignments, INTERFACE, INTROSPECTION_XML};
use crate::api::handlers::Handler;
use crate::api::views::PoolView;

/// The properties, all read-only.
const PROPERTIES: [&str; 3] = ["Containers", "Pools", "Version"];

/// What a call answers.
enum Body {
    /// The XML's out arguments (none for `DeletePool`).
    Args(Option<Structure<'static>>),
    /// `ListAssignments`' list, shared by the callers of one snapshot.
    Assignments(SharedAssignments),
}

impl Core {
    /// Property `name`'s value; `None` when there is no such property.
    fn property(&self, name: &str) -> Option<Result<OwnedValue, zvariant::Error>> {
        let value = match name {
            "Containers" => Value::from(self.handle.snapshot().kubelet.container_path().unwrap_or_default()),
            "Pools" => {
                let pools: Vec<cpupool_wire::dbus::PoolStruct> =
                    PoolView::all(&self.handle.snapshot()).into_iter().map(Into::into).collect();
                Value::from(pools)
            }
            "Version" => Value::from(env!("CARGO_PKG_VERSION")),
            _ => return None,
        };
        Some(OwnedValue::try_from(value))
    }

    /// Sends `PropertiesChanged` with the `Pools` property's new value.
    pub(super) async fn pools_changed(&self, emitter: &SignalEmitter<'_>) -> zbus::Result<()> {
        let Some(pools) = self.property("Pools") else { return Ok(()) };
        let pools = Value::from(pools?);
        let changed = HashMap::from([("Pools", pools)]);
        fdo::Properties::properties_changed(emitter, Manager::name(), changed, Cow::Borrowed(&[])).await
    }

    /// Answers a call of `id` through `member`.
    async fn dispatch(
        &self,
        id: MethodId,
        member: &Member,
        msg: &Message,
        admitted: Option<Caller>,
    ) -> Result<Body, Error> {
        let hdr = msg.header();
        let body = msg.body();
        let expected: String = member.ins.iter().map(|a| a.signature).collect();
        let matches = Signature::try_from(expected.as_str()).is_ok_and(|s| &s == body.signature());
        if !matches {
            return Err(Error {
                name: "org.freedesktop.DBus.Error.InvalidArgs".into(),
                message: format!("{} takes ({expected}), not ({})", member.name, body.signature()),
            });
        }
        let values = match member.ins.is_empty() {
            true => Vec::new(),
            false => body.deserialize::<Structure<'_>>()?.into_fields(),
        };
        if id == MethodId::ListAssignments {
            let pool = values.first().and_then(|v| v.downcast_ref::<&str>().ok()).unwrap_or_default();
            return self.list_assignments(&hdr, admitted, pool).await.map(Body::Assignments);
        }
        macro_rules! dispatch {
            ($($name:ident),*) => {
                match id {
                    $(MethodId::$name => self.serve::<m::$name>(&hdr, admitted, member, &values).await,)*
                    // A stream has no D-Bus member.
                    other => Err(Error { name: "org.freedesktop.DBus.Error.UnknownMethod".into(), message: other.name().into() }),
                }
            };
        }
        cpupool_wire::for_each_call!(dispatch)
    }

    /// Runs `M`'s handler on the arguments `values` of `member`, and encodes its reply.
    async fn serve<M: Handler>(
        &self,
        hdr: &Header<'_>,
        admitted: Option<Caller>,
        member: &Member,
        values: &[Value<'_>],
    ) -> Result<Body, Error> {
        let params = encode::params::<M::Params>(member, values);
        let reply = self.call_as::<M>(hdr, admitted, member.name, params).await?;
        match encode::reply(member, &reply) {
            Ok(args) => Ok(Body::Args(args)),
            // An edit whose pool is gone already.
            Err(Unencodable::Missing(_)) => {
                Err(crate::core::state::Error::NoSuchPool { pool: String::new() }.to_api().into())
            }
            Err(Unencodable::Shape(why)) => {
                log::error!("D-Bus: encoding a reply: {why}");
                Err(Error { name: "org.freedesktop.DBus.Error.Failed".into(), message: why })
            }
        }
    }
}

/// Sends error `e` as the answer to the call `msg`, unless it wants none.
pub(super) async fn refuse(conn: &Connection, msg: &Message, e: Error) -> zbus::Result<()> {
    answer_with(conn, msg, Err(e)).await
}

/// Sends `answer` to the call `msg`, unless it wants none.
async fn answer_with(conn: &Connection, msg: &Message, answer: Result<Body, Error>) -> zbus::Result<()> {
    let hdr = msg.header();
    if hdr.primary().flags().contains(Flags::NoReplyExpected) {
        return Ok(());
    }
    match answer {
        Ok(Body::Args(Some(args))) => conn.reply(&hdr, &args).await,
        Ok(Body::Args(None)) => conn.reply(&hdr, &()).await,
        Ok(Body::Assignments(list)) => conn.reply(&hdr, &list).await,
        Err(e) => conn.reply_dbus_error(&hdr, e).await,
    }
    .map(|_| ())
}

#[async_trait::async_trait]
impl Interface for Manager {
    fn name() -> InterfaceName<'static> {
        InterfaceName::from_static_str_unchecked(INTERFACE)
    }

    async fn get(
        &self,
        property: &str,
        _: &ObjectServer,
        _: &Connection,
        _: Option<&Header<'_>>,
        _: &SignalEmitter<'_>,
    ) -> Option<fdo::Result<OwnedValue>> {
        self.property(property).map(|v| v.map_err(|e| fdo::Error::Failed(e.to_string())))
    }

    async fn get_all(
        &self,
        _: &ObjectServer,
        _: &Connection,
        _: Option<&Header<'_>>,
        _: &SignalEmitter<'_>,
    ) -> fdo::Result<HashMap<String, OwnedValue>> {
        let mut all = HashMap::new();
        for name in PROPERTIES {
            if let Some(value) = self.property(name) {
                all.insert(name.to_owned(), value.map_err(|e| fdo::Error::Failed(e.to_string()))?);
            }
        }
        Ok(all)
    }

    async fn set_mut(
        &mut self,
        property: &str,
        _: &Value<'_>,
        _: &ObjectServer,
        _: &Connection,
        _: Option<&Header<'_>>,
        _: &SignalEmitter<'_>,
    ) -> Option<fdo::Result<()>> {
        PROPERTIES
            .contains(&property)
            .then(|| Err(fdo::Error::PropertyReadOnly(format!("Property `{property}` is read-only"))))
    }

    /// Runs inline in zbus's dispatcher ([`Interface::spawn_tasks_for_methods`] is false): it
    /// decides whether the call may run ([`Callers::gate`](super::callers::Callers::gate))
    /// without waiting, queues the `Busy` answer of a call beyond the caller's budget
    /// ([`super::refusals`]), and answers every other call on a task of its own. So the dispatcher reads the connection as fast as it can decide, and
    /// a privileged call queued behind a flood of unprivileged ones starts once it is read,
    /// not after them.
    fn call<'call>(
        &'call self,
        _: &'call ObjectServer,
        conn: &'call Connection,
        msg: &'call Message,
        name: MemberName<'call>,
    ) -> DispatchResult2<'call> {
        let Some(id) = MethodId::ALL.iter().copied().find(|m| m.dbus().contains(&name.as_str())) else {
            return DispatchResult2::NotFound;
        };
        let hdr = msg.header();
        let admitted = match self.callers.gate(&self.auth, hdr.sender().map(|s| s.as_str())) {
            Gate::Refused(e) => {
                return DispatchResult2::Async(Box::pin(async move {
                    let Err(e) = super::metered(name.as_str(), async { Err::<(), _>(e) }).await else {
                        return Ok(());
                    };
                    // Answered after privileged calls, or here when too many wait already.
                    let Err((_, _, e)) = self.refusals.push((conn.clone(), msg.clone(), e)) else {
                        return Ok(());
                    };
                    answer_with(conn, msg, Err(e)).await.map_err(|e| fdo::Error::Failed(e.to_string()))
                }));
            }
            Gate::Admitted(caller) => (Some(caller), None),
            Gate::Unknown(waiting) => (None, Some(waiting)),
        };
        // Counted before the task starts, so that unprivileged tasks not started yet wait.
        let ahead = admitted.0.as_ref().filter(|c| c.is_privileged()).map(|_| self.callers.priority.ahead());
        let (core, conn, msg) = (self.0.clone(), conn.clone(), msg.clone());
        let member_name = name.to_string();
        tokio::spawn(async move {
            let (admitted, _waiting) = admitted;
            if ahead.is_none() && admitted.is_some() {
                core.callers.priority.after_privileged().await;
            }
            let answer = match member(&member_name) {
                Some(member) => core.dispatch(id, &member, &msg, admitted).await,
                None => Err(Error {
                    name: "org.freedesktop.DBus.Error.UnknownMethod".into(),
                    message: format!("no member {member_name} in the interface description"),
                }),
            };
            if let Err(e) = answer_with(&conn, &msg, answer).await {
                log::debug!("D-Bus: answering a call of {member_name}: {e}");
            }
            drop(ahead);
        });
        DispatchResult2::Async(Box::pin(std::future::ready(Ok(()))))
    }

    fn spawn_tasks_for_methods(&self) -> bool {
        false
    }

    fn call_mut<'call>(
        &'call mut self,
        _: &'call ObjectServer,
        _: &'call Connection,
        _: &'call Message,
        _: MemberName<'call>,
    ) -> DispatchResult2<'call> {
        DispatchResult2::NotFound
    }

    /// The XML's `<interface>` element, indented to `level`.
    fn introspect_to_writer(&self, writer: &mut dyn std::fmt::Write, level: usize) {
        let start = INTROSPECTION_XML.find("<interface ").unwrap_or_default();
        let end = INTROSPECTION_XML.find("</interface>").map_or(start, |e| e + "</interface>".len());
        // The file indents the element by 2.
        let indent = INTROSPECTION_XML[..start].rsplit('\n').next().map_or(0, str::len);
        for line in INTROSPECTION_XML[start..end].lines() {
            let line = line.get(indent.min(line.len() - line.trim_start().len())..).unwrap_or(line);
            // A writer into a String does not fail.
            let _ = writeln!(writer, "{:level$}{line}", "");
        }
    }
}
