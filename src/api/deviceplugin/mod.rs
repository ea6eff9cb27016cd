//! The kubelet device plugin: every pool offered to the kubelet (`kubelet = true`, all but the
//! reserved pool by default) becomes the extended resource `<resource_prefix>/<pool>`, served
//! by its own `v1beta1.DevicePlugin` endpoint `cpupoold-<pool>.sock` in the kubelet's
//! device-plugin directory.
//!
//! ```text
//! kubelet ──Register◄── manager (this module) ──binds──► cpupoold-<pool>.sock ── server.rs
//!    │ inotify on device-plugins/: kubelet.sock re-created or our socket removed → re-bind,
//!    │ re-register (backoff, never gives up)
//!    └─ PodResources List ──► reconcile.rs: which container holds which devices → CRI
//!       ListContainers → the container's cgroup → engine.retarget(cgroup:…); devices no
//!       container holds any more → engine.release after the grace period
//! ```
//!
//! Allocate records an assignment `kubelet-<first device id>` with the target
//! `kubelet:<first device id>` (CPUs held, nothing restricted yet); reconciliation points it at
//! the container's cgroup, where the engine's normal plan applies the CPUs (`cpuset.cpus` with
//! the cgroupfs backend, `AllowedCPUs` on the `.scope` with systemd's).
#![deny(missing_docs)]

mod containers;
pub mod devices;
pub mod host;
pub mod proto;
mod reconcile;
pub mod server;

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{watch, Notify};
use tokio_stream::wrappers::UnixListenerStream;
use tokio_stream::StreamExt;

use crate::config::Settings;
use crate::core::pool::{PoolKind, PoolName};
use crate::engine::{Event, Handle};
use proto::v1beta1;
use server::{PoolPlugin, Shared};

pub use containers::{ContainerRef, ContainerSource};

/// The API version registered.
pub const VERSION: &str = "v1beta1";

/// The kubelet's registration socket in the device-plugin directory.
const KUBELET_SOCKET: &str = "kubelet.sock";

/// How the plugin runs; from the settings.
#[derive(Debug, Clone)]
pub struct Options {
    /// The kubelet's root directory (`paths.kubelet_dir`).
    pub kubelet_dir: PathBuf,
    /// The cgroup root (`paths.cgroup_root`), where container cgroups are found.
    pub cgroup_root: PathBuf,
    /// The sysfs root (`paths.sysfs_root`), where CPU hotplug is noticed.
    pub sysfs_root: PathBuf,
    /// `kubelet.resource_prefix`.
    pub resource_prefix: String,
    /// `kubelet.millicpus_per_device`.
    pub millis_per_device: u64,
    /// `kubelet.release_grace_ms`.
    pub release_grace: Duration,
    /// `kubelet.reconcile_interval_ms`.
    pub reconcile_interval: Duration,
    /// `kubelet.runtime_endpoint`.
    pub runtime_endpoint: PathBuf,
    /// `kubelet.confine_unpooled`.
    pub confine_unpooled: bool,
    /// Consulted before the CRI for a container's pod UID and id (the `k8s` pod watch).
    pub containers: Option<Arc<dyn ContainerSource>>,
}

impl Options {
    /// The plugin's options from the settings.
    pub fn from_settings(s: &Settings) -> Options {
        Options {
            kubelet_dir: s.paths.kubelet_dir.clone(),
            cgroup_root: s.paths.cgroup_root.clone(),
            sysfs_root: s.paths.sysfs_root.clone(),
            resource_prefix: s.kubelet.resource_prefix.clone(),
            millis_per_device: s.kubelet.millicpus_per_device,
            release_grace: s.kubelet.release_grace,
            reconcile_interval: s.kubelet.reconcile_interval,
            runtime_endpoint: s.kubelet.runtime_endpoint.clone(),
            confine_unpooled: s.kubelet.confine_unpooled,
            containers: None,
        }
    }

    /// `<kubelet dir>/device-plugins`.
    pub fn plugin_dir(&self) -> PathBuf {
        self.kubelet_dir.join("device-plugins")
    }

    /// The kubelet's registration socket.
    pub fn kubelet_socket(&self) -> PathBuf {
        self.plugin_dir().join(KUBELET_SOCKET)
    }

    /// The kubelet's PodResources socket.
    pub fn pod_resources_socket(&self) -> PathBuf {
        self.kubelet_dir.join("pod-resources/kubelet.sock")
    }
}

/// Why the plugin did not start.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// The kubelet's static CPU manager owns pool CPUs.
    #[error("the device plugin is not started")]
    StaticPolicy(#[source] host::StaticConflict),
    /// The device-plugin directory was made after the daemon started, and the service's mount
    /// namespace has it read-only: systemd's `ReadWritePaths=` takes only what exists at start.
    /// Only a new start (with the directory there) can serve it.
    #[error(
        "the kubelet's directory `{}` was made after cpupoold started, and this service's mount \
         namespace has it read-only (ReadWritePaths= takes only what exists at start)",
        dir.display()
    )]
    NeedsRestart {
        /// The device-plugin directory.
        dir: PathBuf,
    },
}

/// Whether a start anew would see the device-plugin directory writable: systemd runs us (it
/// sets `INVOCATION_ID`) and sets up the unit's mount namespace again at every start.
fn restart_helps() -> bool {
    std::env::var_os("INVOCATION_ID").is_some()
}

/// A gRPC channel over a unix socket (tonic needs a URI; it is not used).
pub async fn unix_channel(path: PathBuf) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
}

/// One running pool endpoint.
struct Running {
    stop: watch::Sender<bool>,
    /// The socket's identity: a different one (or none) means the kubelet removed it.
    ino: Option<FileId>,
    /// The identity of the kubelet socket it registered with.
    registered: Option<FileId>,
}

/// A file's inode number and change time. The inode number alone does not tell a re-created
/// socket from the old one: ext4 hands a freed inode number to the next file created.
type FileId = (u64, i64, i64);

fn inode(p: &Path) -> Option<FileId> {
    std::fs::symlink_metadata(p).ok().map(|m| (m.ino(), m.ctime(), m.ctime_nsec()))
}

/// Runs the plugin until `shutdown` is true: refuses to start (returning the reason) when
/// the kubelet's static CPU manager owns pool CPUs.
pub async fn run(
    handle: Handle,
    opts: Options,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), PluginError> {
    let snap = handle.snapshot();
    let pools: Vec<(String, crate::core::cpuset::CpuSet)> = snap
        .state
        .pools()
        .values()
        .filter(|p| p.kubelet && p.kind != PoolKind::Reserved)
        .map(|p| (p.name.to_string(), p.cpus.clone()))
        .collect();
    host::check_cpu_manager(&opts.kubelet_dir.join("cpu_manager_state"), &pools)
        .map_err(PluginError::StaticPolicy)?;
    let shared = Arc::new(Shared {
        handle: handle.clone(),
        millis_per_device: opts.millis_per_device,
        resource_prefix: opts.resource_prefix.clone(),
        pod_resources: opts.pod_resources_socket(),
        held: Mutex::new(BTreeMap::new()),
        online: Mutex::new(None),
        health_changed: Notify::new(),
    });
    let mut mgr = Manager {
        opts: opts.clone(),
        shared: shared.clone(),
        running: BTreeMap::new(),
        failures: 0,
        waiting: false,
        seen_missing: false,
    };
    let mut events = handle.subscribe();
    // Reconciliation asks the kubelet and the runtime, each up to 5 s: on a task of its own, so
    // a kubelet slow to answer cannot hold up re-registration.
    let _reconciling = {
        let (mut reconciler, handle, shared) =
            (reconcile::Reconciler::new(opts.clone(), shared.clone()), handle.clone(), shared.clone());
        let (interval, sysfs_root) = (opts.reconcile_interval, opts.sysfs_root.clone());
        AbortOnDrop(tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                shared.refresh_online(&sysfs_root);
                reconciler.reconcile(&handle).await;
            }
        }))
    };
    let mut watcher: Option<inotify::EventStream<Vec<u8>>> = None;
    // The directory exists but cannot be watched (logged once).
    let mut unwatched = false;
    let mut retry_at: Option<tokio::time::Instant> = Some(tokio::time::Instant::now());
    log::info!("device plugin: serving pools in `{}`", opts.plugin_dir().display());
    loop {
        if *shutdown.borrow() {
            break;
        }
        if watcher.is_none() {
            match watch_dir(&opts.plugin_dir()) {
                Ok(w) => {
                    watcher = Some(w);
                    unwatched = false;
                }
                // Without inotify (its limits reached), a sync every few seconds still notices a
                // new kubelet.sock or a removed socket of ours, by their identities.
                Err(e) if opts.plugin_dir().is_dir() => {
                    if !unwatched {
                        log::warn!(
                            "device plugin: cannot watch `{}` ({e}); looking for kubelet restarts every {} s instead",
                            opts.plugin_dir().display(),
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
                    mgr.forget_registrations();
                    retry_at.get_or_insert_with(|| tokio::time::Instant::now() + Duration::from_millis(100));
                }
                DirEvent::Changed { kubelet_created } => {
                    if kubelet_created {
                        // A new kubelet: it knows none of us, and its socket may look just like
                        // the old one's.
                        mgr.forget_registrations();
                    }
                    retry_at = mgr.sync().await?;
                }
            },
            e = events.recv() => {
                if matches!(e, Ok(Event::PoolChanged(_)) | Err(_)) {
                    retry_at = mgr.sync().await?;
                }
            }
            _ = retry => retry_at = mgr.sync().await?,
        }
    }
    mgr.stop_all();
    Ok(())
}

/// Ends a task when the plugin returns, whichever way.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
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

struct Manager {
    opts: Options,
    shared: Arc<Shared>,
    running: BTreeMap<PoolName, Running>,
    /// Consecutive failed syncs, for the backoff.
    failures: u32,
    /// The device-plugin directory is missing (logged once).
    waiting: bool,
    /// The directory was missing at some time since the start.
    seen_missing: bool,
}

/// How often a missing device-plugin directory is looked for.
const DIR_POLL: Duration = Duration::from_secs(2);

impl Manager {
    /// Makes every offered pool served and registered with the current kubelet; returns when
    /// to try again if something failed (backoff: 20 ms doubling to 30 s, never giving up). The
    /// first retries come soon: inotify reports a new kubelet.sock at bind(), and a connection
    /// before the kubelet's listen() is refused.
    ///
    /// Fails only when the directory, made since the start, is read-only to this service and a
    /// start anew would fix that ([`PluginError::NeedsRestart`]).
    async fn sync(&mut self) -> Result<Option<tokio::time::Instant>, PluginError> {
        let snap = self.shared.handle.snapshot();
        let wanted: Vec<PoolName> = snap
            .state
            .pools()
            .values()
            .filter(|p| p.kubelet && p.kind != PoolKind::Reserved)
            .map(|p| p.name.clone())
            .collect();
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
            self.failures = self.failures.saturating_add(1);
            let ms = 10u64.saturating_mul(1 << self.failures.min(12)).min(30_000);
            Some(tokio::time::Instant::now() + Duration::from_millis(ms))
        } else {
            self.failures = 0;
            None
        })
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
        self.failures = 0;
        Some(tokio::time::Instant::now() + DIR_POLL)
    }

    /// Logs with backoff: the 1st, 2nd, 4th, 8th... failure in a row, then every 64th.
    fn log_failure(&self, what: &str) {
        let n = self.failures + 1;
        if n.is_power_of_two() || n.is_multiple_of(64) {
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
        match std::fs::remove_file(sock) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let listener = UnixListener::bind(sock)?;
        let ino = inode(sock);
        let (stop, stopped) = watch::channel(false);
        let svc = PoolPlugin { pool: pool.clone(), shared: self.shared.clone(), stopped: stopped.clone() };
        let mut until = stopped;
        let name = pool.clone();
        tokio::spawn(async move {
            let result = tonic::transport::Server::builder()
                .add_service(v1beta1::device_plugin_server::DevicePluginServer::new(svc))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
                    let _ = until.wait_for(|s| *s).await;
                })
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
        self.failures = 0;
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

/// Registers `pool` with the kubelet.
async fn register(opts: &Options, pool: &PoolName) -> Result<(), String> {
    let call = async {
        let channel =
            unix_channel(opts.kubelet_socket()).await.map_err(|e| crate::engine::error_chain(&e))?;
        let mut client = v1beta1::registration_client::RegistrationClient::new(channel);
        client
            .register(v1beta1::RegisterRequest {
                version: VERSION.into(),
                endpoint: devices::socket_name(pool.as_str()),
                resource_name: devices::resource_name(&opts.resource_prefix, pool.as_str()),
                options: Some(server::options()),
            })
            .await
            .map_err(|s| format!("{}: {}", s.code(), s.message()))?;
        Ok(())
    };
    tokio::time::timeout(Duration::from_secs(5), call).await.map_err(|_| "no answer within 5 s".to_owned())?
}
