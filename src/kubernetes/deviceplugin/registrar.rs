//! Registration with the kubelet: every offered pool is served on its own socket in the
//! device-plugin directory and registered with the kubelet listening there. An inotify watch on
//! the directory notices a new kubelet (its `kubelet.sock` made again) and a socket of ours
//! removed; both are served and registered again, with a backoff while it fails (never giving
//! up). Without the directory (no kubelet yet) it is looked for every few seconds.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use tokio::sync::watch;
use tokio_stream::StreamExt;

use super::plugin::{self, PoolPlugin, Shared};
use super::proto::v1beta1;
use super::{Options, PluginError, KUBELET_SOCKET, VERSION};
use crate::backoff::Backoff;
use crate::core::devices;
use crate::core::pool::PoolName;
use crate::engine::{Event, Server};
use crate::host::kubelet::{file_id as inode, FileId};
use crate::kubernetes::grpc::{clients, incoming};

/// One running pool endpoint.
struct Running {
    stop: watch::Sender<bool>,
    /// The socket's identity: a different one (or none) means the kubelet removed it.
    ino: Option<FileId>,
    /// The identity of the kubelet socket it registered with.
    registered: Option<FileId>,
}

/// Whether a start anew would see the device-plugin directory writable: systemd runs us (it
/// sets `INVOCATION_ID`) and sets up the unit's mount namespace again at every start.
fn restart_helps() -> bool {
    std::env::var_os("INVOCATION_ID").is_some()
}

/// How often a missing device-plugin directory is looked for.
const DIR_POLL: Duration = Duration::from_secs(2);

/// The first retries come soon: inotify reports a new kubelet.sock at bind(), and a connection
/// before the kubelet's listen() is refused; never more than 30 s apart.
const RETRY: Backoff = Backoff::new(Duration::from_millis(20), Duration::from_secs(30));

pub(super) struct Registrar {
    opts: Options,
    shared: Shared,
    running: BTreeMap<PoolName, Running>,
    /// Consecutive failed syncs.
    backoff: Backoff,
    /// The device-plugin directory is missing (logged once).
    waiting: bool,
    /// The directory was missing at some time since the start.
    seen_missing: bool,
    /// The connections every pool's socket may hold together ([`Options::max_connections`]).
    slots: std::sync::Arc<tokio::sync::Semaphore>,
}

impl Registrar {
    pub(super) fn new(opts: Options, shared: Shared) -> Registrar {
        let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(opts.max_connections.max(1)));
        Registrar {
            slots,
            opts,
            shared,
            running: BTreeMap::new(),
            backoff: RETRY,
            waiting: false,
            seen_missing: false,
        }
    }

    /// Serves and registers the pools until `shutdown` is true.
    pub(super) async fn run(mut self, mut shutdown: watch::Receiver<bool>) -> Result<(), PluginError> {
        let mut events = self.shared.handle.subscribe();
        let mut watcher: Option<inotify::EventStream<Vec<u8>>> = None;
        // The directory exists but cannot be watched (logged once).
        let mut unwatched = false;
        let mut retry_at: Option<tokio::time::Instant> = Some(tokio::time::Instant::now());
        log::info!("device plugin: serving pools in `{}`", self.opts.plugin_dir().display());
        loop {
            if *shutdown.borrow() {
                break;
            }
            if watcher.is_none() {
                match watch_dir(&self.opts.plugin_dir()) {
                    Ok(w) => {
                        watcher = Some(w);
                        unwatched = false;
                    }
                    // Without inotify (its limits reached), a sync every few seconds still notices a
                    // new kubelet.sock or a removed socket of ours, by their identities.
                    Err(e) if self.opts.plugin_dir().is_dir() => {
                        if !unwatched {
                            log::warn!(
                                "device plugin: cannot watch `{}` ({e}); looking for kubelet restarts every {} s instead",
                                self.opts.plugin_dir().display(),
                                DIR_POLL.as_secs()
                            );
                            unwatched = true;
                        }
                        retry_at.get_or_insert_with(|| tokio::time::Instant::now() + DIR_POLL);
                    }
                    Err(_) => {}
                }
            }
            let retry = async {
                match retry_at {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                r = shutdown.changed() => if r.is_err() || *shutdown.borrow() { break },
                ev = next_event(&mut watcher) => match ev {
                    DirEvent::Gone => {
                        // The directory went away (or the watch broke): watch again once it is back,
                        // and register anew then, whatever the kubelet socket looks like.
                        watcher = None;
                        self.forget_registrations();
                        retry_at.get_or_insert_with(|| tokio::time::Instant::now() + Duration::from_millis(100));
                    }
                    DirEvent::Changed { kubelet_created } => {
                        if kubelet_created {
                            // A new kubelet: it knows none of us, and its socket may look just like
                            // the old one's.
                            self.forget_registrations();
                        }
                        retry_at = self.sync().await?;
                    }
                },
                e = events.recv() => {
                    // Every Assign and Release changes a pool (its free capacity); only a change
                    // of which pools are offered (a reload, a pool made, deleted or taken from
                    // the kubelet) needs a sync. Missed events (lagged) may have held one.
                    let offered_changed = match e {
                        Ok(Event::PoolChanged(_)) => !self.serving_what_is_offered(),
                        Ok(_) => false,
                        Err(_) => true,
                    };
                    if offered_changed {
                        retry_at = self.sync().await?;
                    }
                }
                _ = retry => retry_at = self.sync().await?,
            }
        }
        self.stop_all();
        Ok(())
    }

    /// Makes every offered pool served and registered with the current kubelet; returns when
    /// to try again if something failed (backoff: 20 ms doubling to 30 s, never giving up). The
    /// first retries come soon: inotify reports a new kubelet.sock at bind(), and a connection
    /// before the kubelet's listen() is refused.
    ///
    /// Fails only when the directory, made since the start, is read-only to this service and a
    /// start anew would fix that ([`PluginError::NeedsRestart`]).
    async fn sync(&mut self) -> Result<Option<tokio::time::Instant>, PluginError> {
        let wanted = self.offered();
        if !self.opts.plugin_dir().is_dir() {
            return Ok(self.wait_for_dir());
        }
        self.waiting = false;
        let gone: Vec<PoolName> = self.running.keys().filter(|p| !wanted.contains(p)).cloned().collect();
        for p in gone {
            if let Some(r) = self.running.remove(&p) {
                let _ = r.stop.send(true);
                let sock = self.opts.plugin_dir().join(devices::socket_name(p.as_str()));
                if r.ino.is_some() && inode(&sock) == r.ino {
                    let _ = std::fs::remove_file(&sock);
                }
                log::info!(POOL = p.as_str(); "device plugin: pool {p} no longer offered to the kubelet");
            }
        }
        let mut failed = false;
        let kubelet = inode(&self.opts.kubelet_socket());
        for pool in wanted {
            let sock = self.opts.plugin_dir().join(devices::socket_name(pool.as_str()));
            let fresh = self.running.get(&pool).is_some_and(|r| r.ino.is_some() && inode(&sock) == r.ino);
            if !fresh {
                if let Some(old) = self.running.remove(&pool) {
                    let _ = old.stop.send(true);
                    log::info!(POOL = pool.as_str(); "device plugin: the socket of pool {pool} was removed; serving it again");
                }
                match self.serve(&pool, &sock) {
                    Ok(r) => {
                        self.running.insert(pool.clone(), r);
                    }
                    Err(_) if !self.opts.plugin_dir().is_dir() => return Ok(self.wait_for_dir()),
                    Err(e)
                        if e.kind() == std::io::ErrorKind::ReadOnlyFilesystem
                            && self.seen_missing
                            && restart_helps() =>
                    {
                        self.stop_all();
                        return Err(PluginError::NeedsRestart { dir: self.opts.plugin_dir() });
                    }
                    Err(e) => {
                        failed = true;
                        self.log_failure(&format!("binding `{}`: {e}", sock.display()));
                        continue;
                    }
                }
            }
            let Some(r) = self.running.get_mut(&pool) else { continue };
            if kubelet.is_none() || r.registered == kubelet {
                continue;
            }
            match register(&self.opts, &pool).await {
                Ok(()) => {
                    crate::counters::counters().registered(pool.as_str(), kubelet);
                    r.registered = kubelet;
                    log::info!(POOL = pool.as_str(); "device plugin: registered {} with the kubelet",
                        devices::resource_name(&self.opts.resource_prefix, pool.as_str()));
                }
                Err(e) => {
                    failed = true;
                    self.log_failure(&format!("registering pool {pool} with the kubelet: {e}"));
                }
            }
        }
        Ok(if failed {
            Some(tokio::time::Instant::now() + self.backoff.fail())
        } else {
            self.backoff.reset();
            None
        })
    }

    /// The pools offered to the kubelet now, in name order: every pool but the reserved one,
    /// unless its configuration says `kubelet = false`.
    fn offered(&self) -> Vec<PoolName> {
        let snap = self.shared.handle.snapshot();
        snap.offered(Server::DevicePlugin).map(|p| p.name.clone()).collect()
    }

    /// Whether the pools served are the pools offered: then a pool event changed nothing the
    /// registrar must act on. A pool whose serving failed is not served, so this is false and
    /// the next event syncs too, as the pending retry would.
    fn serving_what_is_offered(&self) -> bool {
        let snap = self.shared.handle.snapshot();
        snap.offered(Server::DevicePlugin).map(|p| &p.name).eq(self.running.keys())
    }

    /// No kubelet on this host (yet), or its directory was just removed: not a failure.
    /// inotify cannot watch what does not exist, so look again every few seconds, quietly.
    fn wait_for_dir(&mut self) -> Option<tokio::time::Instant> {
        if !self.waiting {
            log::info!(
                "device plugin: waiting for the kubelet's directory `{}`",
                self.opts.plugin_dir().display()
            );
            self.waiting = true;
        }
        self.seen_missing = true;
        self.stop_all();
        self.backoff.reset();
        Some(tokio::time::Instant::now() + DIR_POLL)
    }

    /// Logs with backoff: the 1st, 2nd, 4th, 8th... failure in a row, then every 64th.
    fn log_failure(&self, what: &str) {
        if self.backoff.next_worth_logging() {
            let n = self.backoff.failures() + 1;
            log::warn!("device plugin: {what} (attempt {n}; retrying with backoff)");
        }
    }

    fn serve(&self, pool: &PoolName, sock: &Path) -> std::io::Result<Running> {
        if let Some(dir) = sock.parent() {
            if !dir.is_dir() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "the device-plugin directory does not exist",
                ));
            }
        }
        let listener = incoming::bind_private(sock)?;
        let ino = inode(sock);
        let (stop, stopped) = watch::channel(false);
        let svc = PoolPlugin { pool: pool.clone(), shared: self.shared.clone(), stopped: stopped.clone() };
        let mut until = stopped;
        let name = pool.clone();
        let slots = self.slots.clone();
        tokio::spawn(async move {
            let result = tonic::transport::Server::builder()
                .add_service(v1beta1::device_plugin_server::DevicePluginServer::new(svc))
                .serve_with_incoming_shutdown(
                    incoming::capped(listener, slots, &incoming::REFUSALS),
                    async move {
                        let _ = until.wait_for(|s| *s).await;
                    },
                )
                .await;
            if let Err(e) = result {
                log::error!(POOL = name.as_str(); "device plugin: the endpoint of pool {name} failed: {e}");
            }
        });
        Ok(Running { stop, ino, registered: None })
    }

    /// Makes the next sync register every pool again, with a fresh backoff: the failures so
    /// far were against the kubelet that went away (while its socket file stays, connecting
    /// to it is refused, and every event in the directory counts one more), and carrying them
    /// over would make the new kubelet wait out their backoff (1.3 s was seen).
    fn forget_registrations(&mut self) {
        for r in self.running.values_mut() {
            r.registered = None;
        }
        self.backoff.reset();
    }

    fn stop_all(&mut self) {
        for (pool, r) in std::mem::take(&mut self.running) {
            let _ = r.stop.send(true);
            let sock = self.opts.plugin_dir().join(devices::socket_name(pool.as_str()));
            if r.ino.is_some() && inode(&sock) == r.ino {
                let _ = std::fs::remove_file(&sock);
            }
        }
    }
}

/// An inotify watch on the device-plugin directory: creations (kubelet.sock) and removals
/// (our sockets).
fn watch_dir(dir: &Path) -> std::io::Result<inotify::EventStream<Vec<u8>>> {
    let ino = inotify::Inotify::init()?;
    ino.watches().add(
        dir,
        inotify::WatchMask::CREATE
            | inotify::WatchMask::DELETE
            | inotify::WatchMask::MOVED_TO
            | inotify::WatchMask::MOVED_FROM
            | inotify::WatchMask::DELETE_SELF
            | inotify::WatchMask::MOVE_SELF,
    )?;
    ino.into_event_stream(vec![0u8; 4096])
}

/// What happened in the device-plugin directory.
enum DirEvent {
    /// A file came or went; `kubelet_created` when it was the kubelet's socket appearing.
    Changed { kubelet_created: bool },
    /// The directory itself (or the watch on it) is gone.
    Gone,
}

/// The next event in the directory.
async fn next_event(w: &mut Option<inotify::EventStream<Vec<u8>>>) -> DirEvent {
    let Some(stream) = w else { return std::future::pending().await };
    match stream.next().await {
        Some(Ok(e)) => {
            use inotify::EventMask as M;
            if e.mask.intersects(M::DELETE_SELF | M::MOVE_SELF | M::IGNORED | M::Q_OVERFLOW) {
                return DirEvent::Gone;
            }
            let kubelet_created = e.mask.intersects(M::CREATE | M::MOVED_TO)
                && e.name.as_deref() == Some(std::ffi::OsStr::new(KUBELET_SOCKET));
            DirEvent::Changed { kubelet_created }
        }
        _ => DirEvent::Gone,
    }
}

/// Registers `pool` with the kubelet, waited for at most 5 s.
async fn register(opts: &Options, pool: &PoolName) -> Result<(), String> {
    let request = v1beta1::RegisterRequest {
        version: VERSION.into(),
        endpoint: devices::socket_name(pool.as_str()),
        resource_name: devices::resource_name(&opts.resource_prefix, pool.as_str()),
        options: Some(plugin::options()),
    };
    let call = async {
        let channel = clients::channel(&opts.kubelet_socket()).await?;
        let mut client = v1beta1::registration_client::RegistrationClient::new(channel);
        clients::answer(client.register(request)).await.map(drop)
    };
    tokio::time::timeout(clients::ANSWER_WITHIN, call).await.map_err(|_| "no answer within 5 s".to_owned())?
}
