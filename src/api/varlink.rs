//! The varlink API: interface `org.cpupool.Manager` on `<runtime_dir>/org.cpupool.Manager`.
//!
//! A small server on tokio's `UnixListener` (see `docs/decisions/0001-varlink-crate.md`): each
//! connection is one task that reads NUL-terminated JSON calls, answers reads from the engine's
//! latest [`Snapshot`](crate::engine::Snapshot), sends `Assign`/`Release` to the engine through
//! the [`Handle`] and streams `Monitor` from the engine's event channel. Calls on one
//! connection are answered in order.
//!
//! Reads are open to everyone. Mutations are checked with the peer's `SO_PEERCRED` credentials
//! by the [`Authorizer`].
//!
//! Under socket activation (`LISTEN_FDS`, e.g. a `.socket` unit or `systemd-socket-activate`)
//! the first listening unix socket passed in is served instead of binding one ([`listen`]);
//! turning the descriptor into a listener is left to the `listenfd` crate, since this crate
//! forbids `unsafe`.

use std::future::Future;
use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{broadcast, watch};
use tokio::task::JoinSet;

pub use crate::api::auth::{Authorizer, Peer};
use crate::engine::Handle;

pub mod methods;
pub mod wire;

use methods::{Method, MethodError, Params};
use wire::{Call, FrameReader, Reply};

/// The socket's file name, and the interface name.
pub const SOCKET_NAME: &str = "org.cpupool.Manager";

/// Connections served at once; more are answered `Busy` and closed.
pub const MAX_CONNECTIONS: usize = 256;

/// The socket path under `runtime_dir`.
pub fn socket_path(runtime_dir: &Path) -> PathBuf {
    runtime_dir.join(SOCKET_NAME)
}

/// Binds `<runtime_dir>/org.cpupool.Manager`, mode 0666 (reads are open; mutations are
/// checked per call). A stale socket left by a previous run is removed; a live one (another
/// daemon answers) is an `AddrInUse` error. Must be called within a tokio runtime.
pub fn bind(runtime_dir: &Path) -> io::Result<UnixListener> {
    std::fs::create_dir_all(runtime_dir)?;
    let path = socket_path(runtime_dir);
    match std::fs::symlink_metadata(&path) {
        Ok(m) if m.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(&path).is_ok() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("`{}` is served by another process", path.display()),
                ));
            }
            std::fs::remove_file(&path)?;
        }
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("`{}` exists and is not a socket", path.display()),
            ))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = std::os::unix::net::UnixListener::bind(&path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))?;
    listener.set_nonblocking(true)?;
    UnixListener::from_std(listener)
}

/// The listener to serve, and its path: the socket systemd passed (socket activation), or
/// `<runtime_dir>/org.cpupool.Manager` bound here (see [`bind`]).
pub fn listen(runtime_dir: &Path) -> io::Result<(UnixListener, PathBuf)> {
    let mut passed = listenfd::ListenFd::from_env();
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

struct Ctx {
    handle: Handle,
    auth: Authorizer,
    started: Instant,
}

/// Serves connections on `listener` until `shutdown` completes; then lets each connection
/// finish the call it is answering, closes them all and returns. Every [`Handle`] clone it
/// made is dropped by then, so the engine can stop.
pub async fn serve(
    listener: UnixListener,
    handle: Handle,
    auth: Authorizer,
    shutdown: impl Future<Output = ()>,
) {
    let ctx = Arc::new(Ctx { handle, auth, started: Instant::now() });
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                if let Err(e) = done {
                    log::error!("varlink: a connection task failed: {e}");
                }
            }
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) if tasks.len() >= MAX_CONNECTIONS => {
                    log::warn!("varlink: {MAX_CONNECTIONS} connections open; refusing another");
                    // Best effort, never waiting: the peer reads it as the answer to its call.
                    let _ = stream.try_write(&error_reply(&methods::busy()).encode());
                }
                Ok((stream, _)) => {
                    tasks.spawn(connection(stream, ctx.clone(), stop_rx.clone()));
                }
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    log::warn!("varlink: accept: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            },
        }
    }
    let _ = stop_tx.send(true);
    while let Some(done) = tasks.join_next().await {
        if let Err(e) = done {
            log::error!("varlink: a connection task failed: {e}");
        }
    }
}

fn error_reply(e: &MethodError) -> Reply {
    Reply { error: Some(e.name.clone()), parameters: e.parameters.clone(), continues: false }
}

fn reply(parameters: Value, continues: bool) -> Reply {
    Reply { error: None, parameters, continues }
}

/// Why a connection ended early.
enum End {
    /// The peer left, misbehaved, or we are stopping.
    Close,
}

async fn connection(stream: UnixStream, ctx: Arc<Ctx>, mut stop: watch::Receiver<bool>) {
    let mut peer = stream.peer_cred().ok().map(|c| Peer { uid: c.uid(), gid: c.gid(), groups: Vec::new() });
    let mut looked_up = false;
    let (rd, mut wr) = stream.into_split();
    let mut reader = FrameReader::new(rd);
    loop {
        let frame = tokio::select! {
            biased;
            _ = stop.changed() => break,
            f = reader.next() => f,
        };
        let bytes = match frame {
            Ok(Some(b)) => b,
            Ok(None) => break,
            Err(e) => {
                log::debug!("varlink: dropping a connection: {e}");
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
    reader: &mut FrameReader<tokio::net::unix::OwnedReadHalf>,
    wr: &mut OwnedWriteHalf,
    stop: &mut watch::Receiver<bool>,
) -> Result<(), End> {
    let outcome = async {
        let method = Method::parse(&call.method)?;
        if call.upgrade {
            return Err(methods::not_implemented(&call.method));
        }
        if method.mutates() {
            ctx.auth.check(peer, looked_up).await.map_err(methods::api)?;
        }
        let params = Params::new(call.parameters.clone(), methods::arguments(method))?;
        match method {
            Method::Monitor if !call.more => Err(methods::expected_more()),
            Method::Monitor => Ok(None),
            m if m.mutates() => {
                let uid = peer.as_ref().map_or(u32::MAX, |p| p.uid);
                methods::mutate(m, &params, &ctx.handle, &|pid| ctx.auth.check_process(pid, uid))
                    .await
                    .map(Some)
            }
            m => methods::read(m, &params, &ctx.handle.snapshot(), ctx.started.elapsed().as_secs()).map(Some),
        }
    }
    .await;
    match outcome {
        Ok(Some(_)) | Err(_) if call.oneway => Ok(()),
        Ok(Some(params)) => send(wr, reply(params, false)).await,
        Err(e) => send(wr, error_reply(&e)).await,
        Ok(None) => monitor(ctx, reader, wr, stop, call.oneway).await,
    }
}

async fn send(wr: &mut OwnedWriteHalf, r: Reply) -> Result<(), End> {
    wr.write_all(&r.encode()).await.map_err(|e| {
        log::debug!("varlink: dropping a connection: {e}");
        End::Close
    })
}

/// Streams events until the peer hangs up or we stop. Always ends the connection: the call
/// never completes, so nothing after it could be answered in order.
async fn monitor(
    ctx: &Ctx,
    reader: &mut FrameReader<tokio::net::unix::OwnedReadHalf>,
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
        send(wr, reply(serde_json::json!({ "event": e }), true)).await?;
    }
    loop {
        tokio::select! {
            biased;
            _ = stop.changed() => return Err(End::Close),
            // Anything the peer sends now (or its hang-up) ends the stream.
            _ = reader.next() => return Err(End::Close),
            ev = events.recv() => match ev {
                Ok(e) => send(wr, reply(serde_json::json!({ "event": methods::event_json(&e) }), true)).await?,
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    log::warn!("varlink: a monitor fell {n} events behind; replaying the pools");
                    for e in methods::current_events(&ctx.handle.snapshot()) {
                        send(wr, reply(serde_json::json!({ "event": e }), true)).await?;
                    }
                }
                Err(broadcast::error::RecvError::Closed) => {
                    send(wr, error_reply(&methods::shutting_down())).await?;
                    return Err(End::Close);
                }
            },
        }
    }
}

#[cfg(test)]
mod tests;
