//! The cluster objects (the `k8s` cargo feature): the daemon as a Kubernetes node agent, through
//! the API server's client ([`crate::kubernetes::apiserver`]).
//!
//! ```text
//!                 ┌─ config.rs: node label + ConfigMaps cpupoold-config.{node.N,group.G,default}
//! API server ◄────┤     → <runtime_dir>/cluster.toml → handle.reload_from_disk() (like SIGHUP)
//! (kube client,   ├─ pods.rs: pods with spec.nodeName=N → PodIndex → the device plugin's
//!  rustls)        │     container identity (pod UID, QoS class, container id)
//!                 ├─ report.rs: engine events → CpuPoolNode/N status (server-side apply,
//!                 │     field manager cpupoold, at most one write per report_interval)
//!                 └─ slices.rs: engine snapshots → this node's ResourceSlices (the pools
//!                       served by DRA; server-side apply, written only when they change)
//! ```
//!
//! Every task keeps going when the API server is away (watches retry with backoff, all in
//! [`watch`]'s one loop; the report is written again when it answers); the local files stay the
//! configuration meanwhile. The CRD is generated from [`crd`] and shipped as `deploy/crd.yaml`,
//! the DRA pools' DeviceClasses from [`classes`] as `deploy/deviceclasses.yaml`.
#![deny(missing_docs)]

pub mod classes;
pub mod config;
pub mod crd;
pub mod pods;
pub mod report;
pub mod slices;
pub mod watch;

use std::path::{Path, PathBuf};

use crate::engine::{ConfigSource, Handle};
use crate::kubernetes::apiserver::{client_when_ready, K8sError, Options};

/// The cluster fragment's file in the runtime directory.
pub fn cluster_file(runtime_dir: &Path) -> PathBuf {
    runtime_dir.join("cluster.toml")
}

/// The cluster configuration's state, for the node report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterStatus {
    /// `<ConfigMap>@<resourceVersion>` last applied.
    pub generation: Option<String>,
    /// Why the chosen ConfigMap was rejected (naming the key), while it is.
    pub rejected: Option<String>,
}

/// Runs the four tasks (configuration, pods, report, this node's ResourceSlices for `slices`)
/// until `stop` is set. `source` must read [`cluster_file`] as its cluster fragment.
pub async fn run(
    handle: Handle,
    source: ConfigSource,
    cluster_path: PathBuf,
    opts: Options,
    slices: slices::Target,
    pods: pods::PodIndex,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Result<(), K8sError> {
    let Some(client) = client_when_ready(&opts, &mut stop).await else { return Ok(()) };
    log::info!(
        "k8s: node {} in namespace {}: following ConfigMaps {} and the node's pods; reporting to CpuPoolNode/{}",
        opts.node,
        opts.namespace,
        config::candidates(&opts.node, Some("<group>")).join(", "),
        opts.node
    );
    let (status_tx, status_rx) = tokio::sync::watch::channel(ClusterStatus::default());
    let applier = config::Applier::new(handle.clone(), source, cluster_path, status_tx);
    let config_task = tokio::spawn(config::run(
        client.clone(),
        opts.node.clone(),
        opts.namespace.clone(),
        applier,
        stop.clone(),
    ));
    let pods_task = tokio::spawn(pods::run(client.clone(), opts.node.clone(), pods.clone(), stop.clone()));
    let slices_task = tokio::spawn(slices::run(client.clone(), slices, handle.clone(), stop.clone()));
    let report_task = tokio::spawn(report::run(
        client,
        opts.node.clone(),
        handle,
        status_rx,
        pods,
        opts.report_interval,
        stop,
    ));
    let tasks = [
        ("configuration", config_task),
        ("pods", pods_task),
        ("report", report_task),
        ("ResourceSlice", slices_task),
    ];
    for (name, task) in tasks {
        if let Err(e) = task.await {
            log::error!("k8s: the {name} task failed: {e}");
        }
    }
    Ok(())
}

impl crate::core::container::ContainerSource for pods::PodIndex {
    fn container(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
    ) -> Option<crate::core::container::ContainerRef> {
        self.lookup(namespace, pod, container).map(|i| crate::core::container::ContainerRef {
            pod_uid: i.pod_uid,
            container_id: i.container_id,
            qos_class: i.qos_class,
        })
    }
}

#[cfg(test)]
mod deploy_tests;
