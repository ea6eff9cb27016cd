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
//! The kubelet's DRA plugin API and its plugin watcher's registration, generated from their
//! published api.proto files, are `proto.rs`, built with or without the `k8s` feature (the
//! kubelet-shaped peer of the tests speaks them); the driver itself needs the feature, and
//! reaches the API server through `crate::kubernetes::apiserver`.
//!
//! The sockets are looked at every second (lifecycle.rs): when the kubelet's directory was wiped (a kubelet
//! reinstalled or restarted onto a fresh root), both are made again and the plugin watcher
//! finds the registration socket anew; when no pool is served by DRA any more, both go. They
//! are mode 0600, and a peer of another uid than root's or the daemon's is closed at accept
//! (the device plugin's [`crate::kubernetes::grpc::incoming`]).
#![deny(missing_docs)]

#[cfg(feature = "k8s")]
mod lifecycle;
#[cfg(feature = "k8s")]
mod prepare;
pub mod proto;
#[cfg(feature = "k8s")]
mod serve;

#[cfg(feature = "k8s")]
pub use lifecycle::run;

use std::path::PathBuf;

use crate::config::Settings;

/// The plugin watcher's type for DRA drivers.
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// The service versions the endpoint serves, as the kubelet names them.
pub const VERSIONS: [&str; 1] = ["v1.DRAPlugin"];

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

/// The driver's directories are read-only to this process (see `run`): a start anew makes
/// them writable.
#[derive(Debug, thiserror::Error)]
#[error("DRA: {0}; the kubelet's directory was made after cpupoold started, so the unit's ReadWritePaths= do not cover it: starting anew")]
pub struct NeedsRestart(pub String);
