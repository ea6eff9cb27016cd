//! The NRI plugin: containers get their pool's CPUs when the runtime creates them, not after
//! they started.
//!
//! ```text
//! containerd / CRI-O ──/var/run/nri/nri.sock──► mux.rs (frames: conn id, length)
//!     conn 1: the runtime calls us ── ttrpc.rs ──► plugin.rs (decode → engine → encode)
//!     conn 2: we call the runtime  ◄── RegisterPlugin
//!
//! Configure      → the events we follow
//! Synchronize    → every running container bound again (its assignment at its cgroup, or
//!                  kept off the exclusive CPUs), on every (re)connect
//! CreateContainer→ the adjustment: the CPUs and memory nodes of the assignment `Allocate`
//!                  made for the devices the kubelet says the container holds (its
//!                  PodResources; never the container's own environment, which a pod's author
//!                  writes), or the CPUs no exclusive pool holds for a container without one
//!                  (or, for a container whose DRA claim's CDI spec set CPUPOOL_CLAIM, the
//!                  claim's CPUs when its pod is one the claim is reserved for: claim.rs)
//! StartContainer → the assignment's target becomes the container's cgroup, read back before
//!                  the container's first instruction (a difference fails the start): bind.rs;
//!                  `allocated` until then, `applied` from then on; a claim's, by its first
//!                  container; the others sharing it are read back; a claim of several devices
//!                  is recorded running in the container once the engine has read it back
//! Stop/Remove    → released at once (a claim's: bound to another started container of the
//!                  claim, else held for no container, `allocated`, until unprepared)
//! ```
//!
//! What plugin.rs, bind.rs and claim.rs share (a call's context, the record of a container
//! seen alive) is context.rs; NRI's messages, generated from its api.proto, are proto.rs.
//!
//! The wing decides nothing itself: which CPUs a container gets, the engine's snapshot answers
//! ([`crate::engine::view`]); the writes and read-backs are the engine's. It keeps one
//! thing of its own, the containers it has seen alive, which every Synchronize rebuilds.
//! While it is connected, the device plugin's PodResources poll neither retargets nor confines
//! (it still releases allocations no container ever used).
#![deny(missing_docs)]

mod bind;
mod claim;
mod context;
pub mod mux;
mod plugin;
pub mod proto;
pub mod ttrpc;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::backoff::{worth_logging, Backoff};
use crate::engine::Handle;

/// The plugin's name, as the runtime logs it (`90-cpupoold`).
pub const PLUGIN_NAME: &str = "cpupoold";
/// The plugin's index: plugins are called in its order, and two that set the same field of a
/// container fail its creation whatever their order.
pub const PLUGIN_INDEX: &str = "90";
/// The runtime's service.
pub const RUNTIME_SERVICE: &str = "nri.pkg.api.v1alpha1.Runtime";
/// Our service.
pub const PLUGIN_SERVICE: &str = "nri.pkg.api.v1alpha1.Plugin";
/// The runtime's request timeout when it does not say (NRI before v0.7 does not).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// How the plugin runs; from the settings.
#[derive(Debug, Clone)]
pub struct Options {
    /// `kubelet.nri_socket`.
    pub socket: PathBuf,
    /// How long a runtime that went away is waited for before trying again, at most.
    pub retry_cap: Duration,
    /// The kubelet's PodResources socket: which container holds which of our devices.
    pub pod_resources: PathBuf,
    /// `kubelet.resource_prefix`.
    pub resource_prefix: String,
    /// `kubelet.millicpus_per_device`.
    pub millis_per_device: u64,
}

impl Options {
    /// From the settings.
    pub fn from_settings(s: &crate::config::Settings) -> Options {
        Options {
            socket: s.kubelet.nri_socket.clone(),
            retry_cap: Duration::from_secs(5),
            pod_resources: crate::host::kubelet::pod_resources_socket(&s.paths.kubelet_dir),
            resource_prefix: s.kubelet.resource_prefix.clone(),
            millis_per_device: s.kubelet.millicpus_per_device,
        }
    }
}

/// Connects to the runtime, registers and serves it until `shutdown`; connects again (with
/// backoff) whenever the runtime goes away, and waits for its socket while there is none.
pub async fn run(handle: Handle, opts: Options, mut shutdown: watch::Receiver<bool>) {
    let mut backoff = Backoff::new(Duration::from_millis(100), opts.retry_cap);
    let mut said_absent = false;
    loop {
        if *shutdown.borrow() {
            break;
        }
        let outcome = if opts.socket.exists() {
            said_absent = false;
            Some(session(&handle, &opts, &mut shutdown).await)
        } else {
            if !said_absent {
                log::info!(
                    "NRI: no runtime socket at `{}` (no runtime yet, or NRI not enabled in it); until \
                     there is, a container gets its CPUs only after it starts",
                    opts.socket.display()
                );
                said_absent = true;
            }
            None
        };
        let _ = handle.set_nri(None).await;
        let pause = match outcome {
            Some(Ok(true)) => {
                backoff.reset();
                log::warn!("NRI: the runtime closed the connection; connecting again");
                backoff.fail()
            }
            Some(Ok(false)) => {
                let pause = backoff.fail();
                if worth_logging(backoff.failures()) {
                    log::warn!(
                        "NRI: the runtime closed the connection before it synchronized (did it refuse the \
                         plugin? its log says why); trying again in {pause:?}"
                    );
                }
                pause
            }
            Some(Err(e)) => {
                let pause = backoff.fail();
                if worth_logging(backoff.failures()) {
                    log::warn!("NRI: {}; trying again in {pause:?}", crate::error_chain(&e));
                }
                pause
            }
            None => opts.retry_cap,
        };
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = shutdown.wait_for(|s| *s) => break,
        }
    }
    let _ = handle.set_nri(None).await;
}

/// Why a session ended before it served.
#[derive(Debug, thiserror::Error)]
enum SessionError {
    #[error("connecting to `{}`", path.display())]
    Connect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("registering with the runtime")]
    Register(#[source] ttrpc::CallError),
}

/// One connection: `Ok(true)` when it was registered and synchronized before it ended.
async fn session(
    handle: &Handle,
    opts: &Options,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<bool, SessionError> {
    let stream = tokio::net::UnixStream::connect(&opts.socket)
        .await
        .map_err(|source| SessionError::Connect { path: opts.socket.clone(), source })?;
    let plugin = Arc::new(plugin::Plugin::new(handle.clone(), opts.clone()));
    let (conn, mut task) = ttrpc::Connection::start(stream, plugin.clone());
    let req = proto::RegisterPluginRequest {
        plugin_name: PLUGIN_NAME.into(),
        plugin_idx: PLUGIN_INDEX.into(),
        nri_version: String::new(),
    };
    let registered: Result<proto::Empty, _> =
        conn.call(RUNTIME_SERVICE, "RegisterPlugin", &req, DEFAULT_REQUEST_TIMEOUT).await;
    if let Err(e) = registered {
        task.abort();
        return Err(SessionError::Register(e));
    }
    tokio::select! {
        r = &mut task => {
            if let Ok(Err(e)) = r {
                log::debug!("NRI: the connection broke: {e}");
            }
        }
        _ = shutdown.wait_for(|s| *s) => task.abort(),
    }
    Ok(plugin.synchronized())
}
