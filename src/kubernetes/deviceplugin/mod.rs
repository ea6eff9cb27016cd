//! The kubelet device plugin: every pool offered to the kubelet (`kubelet = true`, all but the
//! reserved pool by default) becomes the extended resource `<resource_prefix>/<pool>`, served
//! by its own `v1beta1.DevicePlugin` endpoint `cpupoold-<pool>.sock` in the kubelet's
//! device-plugin directory.
//!
//! ```text
//! kubelet ──Register◄── registrar.rs ──binds──► cpupoold-<pool>.sock ── plugin.rs
//!    │ inotify on device-plugins/: kubelet.sock re-created or our socket removed → re-bind,
//!    │ re-register (backoff, never gives up)
//!    └─ PodResources List ──► reconcile.rs: which container holds which devices → CRI
//!       ListContainers → the container's cgroup → engine.retarget(cgroup:…); devices no
//!       container holds any more → engine.release after the grace period
//! ```
//!
//! The wing keeps no state of its own but the reconciler's memory between rounds (since when an
//! allocation has had no container, what it logged), and decides nothing: the engine's snapshot
//! answers its questions with the pure device model ([`crate::engine::view`],
//! [`crate::core::devices`]),
//! the node's files are read by [`crate::host::kubelet`], the kubelet's PodResources and the
//! runtime's CRI are spoken by [`crate::kubernetes::grpc`] (the NRI wing asks PodResources
//! through the same clients), the device plugin API by `proto.rs` beside it, and what the device lists depend on (the state, the CPUs online, the devices
//! the kubelet holds) is in the engine's snapshot. Allocate is one engine call
//! ([`Handle::assign_all`]): all the containers of a request get their CPUs, or none do.
//!
//! Allocate records an assignment `kubelet-<first device id>` with the target
//! `kubelet:<first device id>` (CPUs held, nothing restricted yet); reconciliation points it at
//! the container's cgroup, where the engine's normal plan applies the CPUs (`cpuset.cpus` with
//! the cgroupfs backend, `AllowedCPUs` on the `.scope` with systemd's).
#![deny(missing_docs)]

pub mod plugin;
pub mod proto;
mod reconcile;
mod registrar;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::config::Settings;
use crate::core::container::ContainerSource;
use crate::engine::{Handle, Server};
use crate::host;
use plugin::Shared;

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
    /// Connections the device-plugin sockets hold at once, every pool's together; one more is
    /// closed at accept ([`crate::fds::Budgets`] sizes it from the descriptor limit).
    pub max_connections: usize,
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
            max_connections: crate::fds::Budgets::DEVICE_PLUGIN,
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
        host::kubelet::pod_resources_socket(&self.kubelet_dir)
    }
}

/// Why the plugin did not start.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// The kubelet's static CPU manager owns pool CPUs.
    #[error("the device plugin is not started")]
    StaticPolicy(#[source] host::kubelet::StaticConflict),
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

/// Runs the plugin until `shutdown` is true: refuses to start (returning the reason) when
/// the kubelet's static CPU manager owns pool CPUs.
pub async fn run(handle: Handle, opts: Options, shutdown: watch::Receiver<bool>) -> Result<(), PluginError> {
    handle
        .snapshot()
        .static_policy(&opts.kubelet_dir, Server::DevicePlugin)
        .map_err(PluginError::StaticPolicy)?;
    let _ = handle.set_poll(opts.reconcile_interval).await;
    let shared = Shared {
        handle: handle.clone(),
        millis_per_device: opts.millis_per_device,
        resource_prefix: opts.resource_prefix.clone(),
        pod_resources: opts.pod_resources_socket(),
    };
    // Reconciliation asks the kubelet and the runtime, each up to 5 s: on a task of its own, so
    // a kubelet slow to answer cannot hold up re-registration.
    let _reconciling = {
        let (mut reconciler, handle) = (reconcile::Reconciler::new(opts.clone()), handle.clone());
        let interval = opts.reconcile_interval;
        AbortOnDrop(tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                reconciler.refresh_online(&handle).await;
                reconciler.reconcile(&handle).await;
            }
        }))
    };
    registrar::Registrar::new(opts, shared).run(shutdown).await
}

/// Ends a task when the plugin returns, whichever way.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
