//! The varlink API: interface `org.cpupool.Manager` on `<runtime_dir>/org.cpupool.Manager`.
//!
//! A small server on tokio's `UnixListener` (see `docs/decisions/0001-varlink-crate.md`): each
//! connection is one task that reads NUL-terminated JSON calls, answers reads from the engine's
//! latest [`Snapshot`](crate::engine::Snapshot), sends `Assign`/`Release` to the engine through
//! the [`Handle`] and streams `Monitor` from the engine's event channel. Calls on one
//! connection are answered in order. `ListPools` and `ListAssignments` are encoded once per
//! snapshot and written to every caller from that one buffer ([`methods::list`]).
//!
//! Reads are open to everyone. Mutations are checked with the peer's `SO_PEERCRED` credentials
//! by the [`Authorizer`]. The same credentials decide which connection budget a peer draws on
//! ([`Limits`]): unprivileged users share a small one and cannot crowd out root or the admin
//! group; idle connections are closed, calls are bounded in size, and a connection's read
//! buffer is given back between calls.
//!
//! Under socket activation (`LISTEN_FDS`, e.g. a `.socket` unit or `systemd-socket-activate`)
//! the first listening unix socket passed in is served instead of binding one ([`listen`]);
//! turning the descriptor into a listener is left to the `listenfd` crate, since this crate
//! forbids `unsafe`.

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{broadcast, watch};
use tokio::task::JoinSet;

pub use crate::api::auth::{Authorizer, Peer};
use crate::api::budget::{AdminCache, Budget, Class, Full, Shares, Slot};
use crate::engine::Handle;
use crate::fds::Refusals;

pub mod methods;
pub mod wire;

use cpupool_wire::methods::MethodId;
use cpupool_wire::varlink::params;
use methods::{Method, MethodError};

use crate::api::handlers;
use wire::{Call, FrameError, FrameReader, Reply};

/// The socket's file name, and the interface name.
pub const SOCKET_NAME: &str = cpupool_wire::names::VARLINK_SOCKET_NAME;

/// The socket path under `runtime_dir`.
pub fn socket_path(runtime_dir: &Path) -> PathBuf {
    runtime_dir.join(SOCKET_NAME)
}

/// Binds `<runtime_dir>/org.cpupool.Manager`, mode 0666 (reads are open; mutations are
/// checked per call). A stale socket left by a previous run is removed; a live one (another
/// daemon answers) is an `AddrInUse` error ([`crate::host::socket::bind_unix`]). Must be
/// called within a tokio runtime.
pub fn bind(runtime_dir: &Path) -> io::Result<UnixListener> {
    let listener = crate::host::socket::bind_unix(&socket_path(runtime_dir), 0o666)?;
    listener.set_nonblocking(true)?;
    UnixListener::from_std(listener)
}

/// The listener to serve, and its path: the socket systemd passed (socket activation), or
/// `<runtime_dir>/org.cpupool.Manager` bound here (see [`bind`]).
pub fn listen(runtime_dir: &Path) -> io::Result<(UnixListener, PathBuf)> {
    listen_from(runtime_dir, &mut listenfd::ListenFd::from_env())
}

/// [`listen`] with the sockets passed already taken from the environment (reading them clears
/// it): the daemon reads them once for every listener it serves.
pub fn listen_from(
    runtime_dir: &Path,
    passed: &mut listenfd::ListenFd,
) -> io::Result<(UnixListener, PathBuf)> {
    for i in 0..passed.len() {
        if let Ok(Some(listener)) = passed.take_unix_listener(i) {
            let path = listener
                .local_addr()
                .ok()
                .and_then(|a| a.as_pathname().map(Path::to_owned))
                .unwrap_or_else(|| PathBuf::from(format!("(socket activation, descriptor {})", 3 + i)));
            listener.set_nonblocking(true)?;
            log::info!("varlink: serving the socket passed by the service manager, `{}`", path.display());
            return Ok((UnixListener::from_std(listener)?, path));
        }
    }
    Ok((bind(runtime_dir)?, socket_path(runtime_dir)))
}

/// What one peer, and all peers together, may hold of the server.
///
/// The socket is open to everyone (mode 0666: reads are public), so without these an
/// unprivileged user could take every connection or fill the daemon's memory. Peers are told
/// apart by their `SO_PEERCRED` uid and gid at accept:
/// - *privileged* peers (those the [`Authorizer`] lets mutate: root, the admin group, the
///   sandbox's owner) have room of their own, which unprivileged connections never use;
/// - every other uid has at most [`Limits::per_uid`] connections, and all of them together at
///   most [`Limits::unprivileged`].
///
/// A connection over its budget is answered `Busy` and closed. Each connection waits at most
/// [`Limits::idle_timeout`] for its peer (see there), and a call may be at most
/// [`Limits::max_message`] bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once from privileged peers.
    pub privileged: usize,
    /// Connections open at once from all unprivileged peers together.
    pub unprivileged: usize,
    /// Connections open at once from one unprivileged uid.
    pub per_uid: usize,
    /// How long a connection may keep the daemon waiting: from the end of one reply until the
    /// next call has arrived whole (so an idle connection and one that sends half a call and
    /// stalls end alike), and for the peer to take a reply off the socket. A call being
    /// answered and a `Monitor` subscription are not idle.
    pub idle_timeout: Duration,
    /// Largest call, in bytes (NUL excluded).
    pub max_message: usize,
}

impl Limits {
    /// Room kept for privileged peers. This and the two below are the budgets' full size; the
    /// daemon serves with what its descriptor limit allows ([`crate::fds::Budgets`]), at most
    /// these.
    pub const PRIVILEGED: usize = crate::fds::Budgets::PRIVILEGED;
    /// All unprivileged peers together.
    pub const UNPRIVILEGED: usize = crate::fds::Budgets::UNPRIVILEGED;
    /// One unprivileged uid.
    pub const PER_UID: usize = crate::fds::Budgets::PER_UID;
    /// 30 s: well beyond any pause of a working client between calls; clients that keep a
    /// connection for longer without using it connect again.
    pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            privileged: Limits::PRIVILEGED,
            unprivileged: Limits::UNPRIVILEGED,
            per_uid: Limits::PER_UID,
            idle_timeout: Limits::IDLE_TIMEOUT,
            max_message: wire::MAX_MESSAGE,
        }
    }
}

/// Group-database lookups (is this uid in the admin group?) running at once. A peer is looked
/// up only when its uid alone does not make it privileged, an admin group is configured, and
/// the unprivileged budget has no room for it; the answer is kept for
/// [`ADMIN_CACHE_TTL`](crate::api::budget::ADMIN_CACHE_TTL), so a flood from one uid costs one
/// lookup.
const MAX_LOOKUPS: usize = 4;

/// Fills in the peer's supplementary groups, off the async workers. `false`: they could not be
/// looked up (no thread could be started), so the peer counts as unprivileged this time.
async fn look_up(stream: UnixStream, mut peer: Peer) -> (UnixStream, Peer, bool) {
    match crate::api::auth::groups_of(peer.uid, peer.gid).await {
        Ok(groups) => {
            peer.groups = groups;
            (stream, peer, true)
        }
        Err(e) => {
            log::warn!("varlink: the groups of uid {}: {}", peer.uid, crate::error_chain(&e));
            (stream, peer, false)
        }
    }
}

/// `org.cpupool.Manager.MessageTooLarge`: a call longer than the limit.
pub fn message_too_large(limit: usize) -> MethodError {
    MethodError {
        name: cpupool_wire::ErrorKind::MessageTooLarge.varlink_name(),
        parameters: serde_json::json!({ "limit": limit }),
    }
}

struct Ctx {
    handle: Handle,
    auth: Authorizer,
    started: Instant,
    limits: Limits,
    /// `ListPools` and `ListAssignments` replies of the latest snapshot, shared by every
    /// connection.
    lists: methods::Lists,
}

/// A connection to serve: its peer as far as known, and its place in the budget.
struct Admitted {
    stream: UnixStream,
    peer: Option<Peer>,
    /// The peer's supplementary groups were looked up already.
    looked_up: bool,
    slot: Slot,
}

/// [`serve_with`] with the default [`Limits`].
pub async fn serve(
    listener: UnixListener,
    handle: Handle,
    auth: Authorizer,
    shutdown: impl Future<Output = ()>,
) {
    serve_with(listener, handle, auth, Limits::default(), shutdown).await
}

/// Serves connections on `listener` within `limits` until `shutdown` completes; then lets
/// each connection finish the call it is answering, closes them all and returns. Every
/// [`Handle`] clone it made is dropped by then, so the engine can stop.
pub async fn serve_with(
    listener: UnixListener,
    handle: Handle,
    auth: Authorizer,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) {
    let ctx = Arc::new(Ctx { handle, auth, started: Instant::now(), limits, lists: Default::default() });
    let mut gate = Gate {
        ctx: ctx.clone(),
        budget: Budget::new(Shares {
            privileged: limits.privileged,
            unprivileged: limits.unprivileged,
            per_uid: limits.per_uid,
        }),
        lookups: JoinSet::new(),
        admins: AdminCache::default(),
        refusals: Refusals::new("varlink"),
    };
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let admitted = tokio::select! {
            _ = &mut shutdown => break,
            Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                if let Err(e) = done {
                    log::error!("varlink: a connection task failed: {e}");
                }
                None
            }
            Some(done) = gate.lookups.join_next(), if !gate.lookups.is_empty() => {
                done.ok().and_then(|(stream, peer, known)| gate.looked_up(stream, peer, known))
            }
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => gate.accepted(stream),
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    log::warn!("varlink: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    None
                }
            },
        };
        if let Some(a) = admitted {
            tasks.spawn(connection(a, ctx.clone(), stop_rx.clone()));
        }
    }
    gate.lookups.abort_all();
    let _ = stop_tx.send(true);
    while let Some(done) = tasks.join_next().await {
        if let Err(e) = done {
            log::error!("varlink: a connection task failed: {e}");
        }
    }
}

/// Admission: which connections are served, within the [`Budget`].
struct Gate {
    ctx: Arc<Ctx>,
    budget: Arc<Budget>,
    /// Peers waiting for the group database, with their connections.
    lookups: JoinSet<(UnixStream, Peer, bool)>,
    admins: AdminCache,
    refusals: Refusals,
}

impl Gate {
    /// A new connection: admitted, refused, or (when only the group database can tell whether
    /// the peer is privileged and its budget is full) looked up first.
    fn accepted(&mut self, stream: UnixStream) -> Option<Admitted> {
        let peer = stream.peer_cred().ok().map(|c| Peer { uid: c.uid(), gid: c.gid(), groups: Vec::new() });
        let class = match &peer {
            Some(p) if self.ctx.auth.allows_by_ids(p) || self.admins.get(p.uid) == Some(true) => {
                Class::Privileged
            }
            Some(p) => Class::Unprivileged(p.uid),
            // No credentials: counted as a stranger, and mutations are refused.
            None => Class::Unprivileged(u32::MAX),
        };
        match self.budget.admit(class) {
            Ok(slot) => Some(Admitted { stream, peer, looked_up: false, slot }),
            Err(full) => {
                match peer {
                    // A member of the admin group by a supplementary group only is privileged
                    // after all.
                    Some(p)
                        if self.ctx.auth.admin_gid.is_some()
                            && self.admins.get(p.uid).is_none()
                            && self.lookups.len() < MAX_LOOKUPS =>
                    {
                        self.lookups.spawn(look_up(stream, p));
                    }
                    _ => self.refuse(stream, full),
                }
                None
            }
        }
    }

    /// A peer back from the group database (`known`: it answered).
    fn looked_up(&mut self, stream: UnixStream, peer: Peer, known: bool) -> Option<Admitted> {
        let admin = self.ctx.auth.allows(&peer);
        if known {
            self.admins.insert(peer.uid, admin);
        }
        let class = if admin { Class::Privileged } else { Class::Unprivileged(peer.uid) };
        match self.budget.admit(class) {
            Ok(slot) => Some(Admitted { stream, peer: Some(peer), looked_up: known, slot }),
            Err(full) => {
                self.refuse(stream, full);
                None
            }
        }
    }

    /// Answers `Busy` and closes.
    fn refuse(&mut self, stream: UnixStream, full: Full) {
        self.refusals.note(&format!("the connections of {full} at their limit"));
        // Best effort, never waiting: the peer reads it as the answer to its call.
        let _ = stream.try_write(&error_reply(&methods::busy()).encode());
    }
}

fn error_reply(e: &MethodError) -> Reply {
    Reply { error: Some(e.name.clone()), parameters: e.parameters.clone(), continues: false }
}

fn reply(parameters: Value, continues: bool) -> Reply {
    Reply { error: None, parameters, continues }
}

/// A successful call's answer.
enum Answer {
    /// Its parameters, to encode.
    Parameters(Value),
    /// The whole message already encoded, shared with other callers ([`methods::list`]).
    Encoded(Arc<Vec<u8>>),
}

/// Why a connection ended early.
enum End {
    /// The peer left, misbehaved, or we are stopping.
    Close,
}

async fn connection(admitted: Admitted, ctx: Arc<Ctx>, mut stop: watch::Receiver<bool>) {
    // Held until the connection ends, however it ends.
    let Admitted { stream, mut peer, mut looked_up, slot: _slot } = admitted;
    let (rd, mut wr) = stream.into_split();
    let mut reader = FrameReader::with_limit(rd, ctx.limits.max_message);
    loop {
        // The whole next call must arrive in time, not just some bytes of it.
        let deadline = tokio::time::Instant::now() + ctx.limits.idle_timeout;
        let frame = tokio::select! {
            biased;
            _ = stop.changed() => break,
            f = tokio::time::timeout_at(deadline, reader.next()) => f,
        };
        let bytes = match frame {
            Ok(Ok(Some(b))) => b,
            Ok(Ok(None)) => break,
            Ok(Err(e @ FrameError::TooLong { limit })) => {
                log::debug!("varlink: dropping a connection: {e}");
                let _ = send(&ctx, &mut wr, error_reply(&message_too_large(limit))).await;
                break;
            }
            Ok(Err(e)) => {
                log::debug!("varlink: dropping a connection: {}", crate::error_chain(&e));
                break;
            }
            Err(_) => {
                log::debug!(
                    "varlink: closing a connection idle for {} ms",
                    ctx.limits.idle_timeout.as_millis()
                );
                break;
            }
        };
        let call: Call = match serde_json::from_slice(&bytes) {
            Ok(c) => c,
            Err(e) => {
                // Not a call at all: there is nothing sensible to answer.
                log::debug!("varlink: dropping a connection: malformed message: {e}");
                break;
            }
        };
        drop(bytes);
        let result = answer(&call, &ctx, &mut peer, &mut looked_up, &mut reader, &mut wr, &mut stop).await;
        if result.is_err() {
            break;
        }
    }
}

/// Answers one call. `Err` ends the connection.
async fn answer(
    call: &Call,
    ctx: &Ctx,
    peer: &mut Option<Peer>,
    looked_up: &mut bool,
    reader: &mut FrameReader<OwnedReadHalf>,
    wr: &mut OwnedWriteHalf,
    stop: &mut watch::Receiver<bool>,
) -> Result<(), End> {
    let start = Instant::now();
    let mut name = "unknown";
    let outcome = async {
        let method = Method::parse(&call.method)?;
        // Parsed: one of a fixed set of names, fit for a label.
        name = call.method.rsplit('.').next().unwrap_or("unknown");
        if call.upgrade {
            return Err(methods::not_implemented(&call.method));
        }
        if method.mutates() {
            ctx.auth.check(peer, looked_up).await.map_err(methods::api)?;
        }
        let params = call.parameters.as_ref();
        match method {
            Method::GetInfo => {
                methods::decode::<params::NoParameters>(params)?;
                Ok(Some(Answer::Parameters(methods::info())))
            }
            Method::GetInterfaceDescription => {
                methods::describe(methods::decode(params)?).map(|v| Some(Answer::Parameters(v)))
            }
            Method::Ours(m) if m.streams() => {
                // Refused like any call's unknown parameters, before its streaming is considered.
                methods::decode::<params::NoParameters>(params)?;
                if call.more {
                    Ok(None)
                } else {
                    Err(methods::expected_more())
                }
            }
            Method::Ours(m @ (MethodId::ListPools | MethodId::ListAssignments)) => {
                methods::list(m, params, &ctx.handle.snapshot(), &ctx.lists)
                    .await
                    .map(|m| Some(Answer::Encoded(m)))
            }
            Method::Ours(m) => {
                let uid = peer.as_ref().map_or(u32::MAX, |p| p.uid);
                let hand_over = |pid| ctx.auth.check_process(pid, uid);
                let cx =
                    handlers::Ctx { handle: &ctx.handle, started: ctx.started, may_hand_over: &hand_over };
                methods::call(m, params, &cx).await.map(|v| Some(Answer::Parameters(v)))
            }
        }
    }
    .await;
    let error = outcome.as_ref().err().map(|e| e.name.as_str());
    crate::counters::counters().api_call("varlink", name, error, start.elapsed());
    match outcome {
        Ok(Some(_)) | Err(_) if call.oneway => Ok(()),
        Ok(Some(Answer::Parameters(params))) => send(ctx, wr, reply(params, false)).await,
        Ok(Some(Answer::Encoded(message))) => write(ctx, wr, &message).await,
        Err(e) => send(ctx, wr, error_reply(&e)).await,
        Ok(None) => monitor(ctx, reader, wr, stop, call.oneway).await,
    }
}

/// Writes a reply; a peer that does not take it within the idle timeout (its socket buffer
/// stays full) is dropped rather than holding its connection forever.
async fn send(ctx: &Ctx, wr: &mut OwnedWriteHalf, r: Reply) -> Result<(), End> {
    write(ctx, wr, &r.encode()).await
}

/// Writes a whole message, NUL included, like [`send`]. Straight from `message` to the socket:
/// a shared list reply is not copied per connection.
async fn write(ctx: &Ctx, wr: &mut OwnedWriteHalf, message: &[u8]) -> Result<(), End> {
    match tokio::time::timeout(ctx.limits.idle_timeout, wr.write_all(message)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => {
            log::debug!("varlink: dropping a connection: {e}");
            Err(End::Close)
        }
        Err(_) => {
            log::debug!("varlink: dropping a connection that does not read its replies");
            Err(End::Close)
        }
    }
}

/// Streams events until the peer hangs up or we stop. Always ends the connection: the call
/// never completes, so nothing after it could be answered in order.
async fn monitor(
    ctx: &Ctx,
    reader: &mut FrameReader<OwnedReadHalf>,
    wr: &mut OwnedWriteHalf,
    stop: &mut watch::Receiver<bool>,
    oneway: bool,
) -> Result<(), End> {
    if oneway {
        return Ok(());
    }
    // Subscribe before reading the snapshot, so no change falls between the two.
    let mut events = ctx.handle.subscribe();
    for e in methods::current_events(&ctx.handle.snapshot()) {
        send(ctx, wr, reply(serde_json::json!({ "event": e }), true)).await?;
    }
    loop {
        tokio::select! {
            biased;
            _ = stop.changed() => return Err(End::Close),
            // Anything the peer sends now (or its hang-up) ends the stream.
            _ = reader.next() => return Err(End::Close),
            ev = events.recv() => match ev {
                Ok(e) => {
                    let event = serde_json::json!({ "event": methods::event_json(&e) });
                    send(ctx, wr, reply(event, true)).await?
                }
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    log::warn!("varlink: a monitor fell {n} events behind; replaying the pools");
                    for e in methods::current_events(&ctx.handle.snapshot()) {
                        send(ctx, wr, reply(serde_json::json!({ "event": e }), true)).await?;
                    }
                }
                Err(broadcast::error::RecvError::Closed) => {
                    send(ctx, wr, error_reply(&methods::shutting_down())).await?;
                    return Err(End::Close);
                }
            },
        }
    }
}

#[cfg(test)]
mod tests;
