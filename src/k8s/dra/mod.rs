//! The kubelet's half of the DRA driver: the `v1.DRAPlugin` service the kubelet calls to prepare
//! the ResourceClaims of the pools served by DRA (`dra = true`), registered through the
//! kubelet's plugin watcher.
//!
//! ```text
//! kubelet plugin watcher ──dial──► <kubelet_dir>/plugins_registry/<driver>-reg.sock
//!    GetInfo → {DRAPlugin, <driver>, endpoint, [v1.DRAPlugin]}; NotifyRegistrationStatus
//! kubelet ──NodePrepareResources──► <kubelet_dir>/plugins/<driver>/dra.sock ── serve.rs
//!    per claim (prepare.rs): recorded in the engine's state? → the same devices; else GET the
//!    ResourceClaim → its results of our driver on this node's pool → snapshot.dra_wanted →
//!    engine.prepare_claim (booked and recorded in one durable commit; the engine writes the
//!    CDI spec) → devices with CDI ids
//! kubelet ──NodeUnprepareResources──► engine.unprepare_claim (released and forgotten in one
//!    commit; the CDI spec removed)
//! container runtime ──CreateContainer (env CPUPOOL_CLAIM)──► nri: the claim's CPUs
//! ```
//!
//! The sockets are looked at every second: when the kubelet's directory was wiped (a kubelet
//! reinstalled or restarted onto a fresh root), both are made again and the plugin watcher
//! finds the registration socket anew; when no pool is served by DRA any more, both go. They
//! are mode 0600, and a peer of another uid than root's or the daemon's is closed at accept
//! (the device plugin's [`crate::node::incoming`]).
#![deny(missing_docs)]

mod prepare;
mod serve;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::config::Settings;
use crate::engine::{Handle, Server};

/// The plugin watcher's type for DRA drivers.
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// The service versions the endpoint serves, as the kubelet names them.
pub const VERSIONS: [&str; 1] = ["v1.DRAPlugin"];
/// How often the sockets are looked at.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// How the driver runs; from the settings.
#[derive(Debug, Clone)]
pub struct Options {
    /// The driver's name (`dra.<kubelet.resource_prefix>`).
    pub driver: String,
    /// This node's name: the ResourceSlice pool the driver's devices are in.
    pub node: String,
    /// `paths.kubelet_dir`.
    pub kubelet_dir: PathBuf,
    /// `paths.cdi_dir`.
    pub cdi_dir: PathBuf,
    /// `kubelet.millicpus_per_device`: a shared pool's step.
    pub millis_per_device: u64,
}

impl Options {
    /// The options for `settings` on node `node`.
    pub fn from_settings(settings: &Settings, node: &str) -> Options {
        Options {
            driver: crate::core::dra::driver_name(&settings.kubelet.resource_prefix),
            node: node.to_owned(),
            kubelet_dir: settings.paths.kubelet_dir.clone(),
            cdi_dir: settings.paths.cdi_dir.clone(),
            millis_per_device: settings.kubelet.millicpus_per_device,
        }
    }

    /// The DRA service's socket: `<kubelet_dir>/plugins/<driver>/dra.sock`.
    pub fn endpoint(&self) -> PathBuf {
        self.kubelet_dir.join("plugins").join(&self.driver).join("dra.sock")
    }

    /// The registration socket: `<kubelet_dir>/plugins_registry/<driver>-reg.sock`.
    pub fn registration(&self) -> PathBuf {
        self.kubelet_dir.join("plugins_registry").join(format!("{}-reg.sock", self.driver))
    }
}

/// The driver's directories are read-only to this process (see [`run`]): a start anew makes
/// them writable.
#[derive(Debug, thiserror::Error)]
#[error("DRA: {0}; the kubelet's directory was made after cpupoold started, so the unit's ReadWritePaths= do not cover it: starting anew")]
pub struct NeedsRestart(pub String);

/// Runs the driver until `stop` is set: waits for a client of the API server, then serves the
/// sockets while some pool is served by DRA. Refuses (logged) to serve beside the kubelet's
/// static CPU manager owning CPUs of those pools, as the device plugin does.
///
/// Under systemd, a kubelet directory made after the unit started is read-only to the daemon
/// (`ReadWritePaths=` take what exists at start): the error asks for a start anew, which
/// systemd makes (`RestartForceExitStatus=`), as the device plugin's does.
pub async fn run(
    handle: Handle,
    k8s: crate::k8s::Options,
    opts: Options,
    mut stop: watch::Receiver<bool>,
) -> Result<(), NeedsRestart> {
    if let Err(e) = handle.snapshot().static_policy(&opts.kubelet_dir, Server::Dra) {
        log::error!("DRA: the kubelet plugin is not started: {e}");
        return Ok(());
    }
    let Some(client) = crate::k8s::client_when_ready(&k8s, &mut stop).await else { return Ok(()) };
    let driver = Arc::new(prepare::Driver::new(handle.clone(), client, opts.clone()));
    driver.recover().await;
    let mut serving: Option<serve::Serving> = None;
    let mut failing = false;
    let mut tick = tokio::time::interval(LOOK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = crate::k8s::stopped(&mut stop) => break,
            _ = tick.tick() => {}
        }
        let wanted = handle.snapshot().offered(Server::Dra).next().is_some();
        if !wanted {
            if serving.take().is_some() {
                log::info!("DRA: no pool is served by DRA any more; the kubelet plugin stops");
            }
            continue;
        }
        if serving.as_ref().is_some_and(serve::Serving::intact) {
            continue;
        }
        let again = serving.take().is_some();
        match serve::Serving::start(&opts, driver.clone()) {
            Ok(s) => {
                log::info!(
                    "DRA: driver {} {}serving {} and registering through {}",
                    opts.driver,
                    if again { "(its sockets were removed) " } else { "" },
                    opts.endpoint().display(),
                    opts.registration().display()
                );
                serving = Some(s);
                failing = false;
            }
            Err(e) if e.read_only && std::env::var_os("INVOCATION_ID").is_some() => {
                return Err(NeedsRestart(e.message));
            }
            Err(e) if !failing => {
                log::warn!("DRA: {e} (trying again every {} s)", LOOK_EVERY.as_secs());
                failing = true;
            }
            Err(e) => log::debug!("DRA: {e}"),
        }
    }
    Ok(())
}
