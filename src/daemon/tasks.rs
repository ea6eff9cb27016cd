//! The daemon's served sockets and adapter tasks, each started on the daemon's [`TaskTracker`]
//! and stopped by its [`CancellationToken`]: the varlink server, the metrics endpoint, the device
//! plugin with its NRI wing, and the cluster integration. Each takes the engine's [`Handle`] and
//! talks to the engine only through it.

use std::sync::{Arc, OnceLock};

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::api::varlink;
use crate::config::Settings;
#[cfg(feature = "k8s")]
use crate::engine::ConfigSource;
use crate::engine::Handle;
use crate::kubernetes::deviceplugin;

use super::RunOptions;

/// Serves the varlink API on `listener` within the descriptor `budgets`.
pub(super) fn serve_varlink(
    listener: tokio::net::UnixListener,
    handle: &Handle,
    auth: varlink::Authorizer,
    budgets: &crate::fds::Budgets,
    tasks: &TaskTracker,
    stop: &CancellationToken,
) {
    let limits = varlink::Limits {
        privileged: budgets.privileged,
        unprivileged: budgets.unprivileged,
        per_uid: budgets.per_uid,
        ..Default::default()
    };
    let api = tasks.spawn(varlink::serve_with(
        listener,
        handle.clone(),
        auth,
        limits,
        stop.clone().cancelled_owned(),
    ));
    watch_task(tasks, "the varlink server", api);
}

/// Starts the adapters `settings` enable: the device plugin (`device_plugin` connections at
/// most) with its NRI wing, and the cluster integration. Returns where the device plugin puts
/// why the daemon needs a start anew, if it does.
pub(super) fn spawn_adapters(
    opts: &RunOptions,
    settings: &Settings,
    handle: &Handle,
    device_plugin: usize,
    tasks: &TaskTracker,
    stop: &CancellationToken,
) -> Arc<OnceLock<String>> {
    let restart = Arc::new(OnceLock::new());
    #[cfg(feature = "k8s")]
    let pod_index = settings.k8s.enabled.then(crate::kubernetes::cluster::pods::PodIndex::new);
    if settings.kubelet.enabled {
        let mut plugin_opts = deviceplugin::Options::from_settings(settings);
        plugin_opts.max_connections = device_plugin;
        #[cfg(feature = "k8s")]
        if let Some(index) = &pod_index {
            plugin_opts.containers = Some(Arc::new(index.clone()));
        }
        let plugin = spawn_plugin(tasks, stop, handle.clone(), plugin_opts, restart.clone());
        watch_task(tasks, "the device plugin", plugin);
        if settings.kubelet.nri {
            let (h, nri_opts, stopped) = (
                handle.clone(),
                crate::kubernetes::nri::Options::from_settings(settings),
                stop_flag(tasks, stop),
            );
            let nri = tasks.spawn(crate::kubernetes::nri::run(h, nri_opts, stopped));
            watch_task(tasks, "the NRI plugin", nri);
        }
    }
    #[cfg(feature = "k8s")]
    if let (Some(pods), Some(path)) = (&pod_index, &opts.dirs.cluster) {
        let source = super::config_source(opts);
        if let Some(cluster) = spawn_cluster(tasks, stop, handle, source, path, settings, pods) {
            watch_task(tasks, "the cluster integration", cluster);
        }
        if settings.kubelet.enabled {
            spawn_dra(tasks, stop, handle, settings, restart.clone());
        }
    }
    #[cfg(not(feature = "k8s"))]
    let _ = opts;
    restart
}

/// Says what the descriptor limit allows each served socket (docs/behaviour.md, "Descriptors").
pub(super) fn log_budgets(b: &crate::fds::Budgets) {
    let line = format!(
        "descriptors: limit {}, {} kept for the daemon; connections: varlink {} privileged, {} \
         unprivileged ({} per uid), device plugin {}, metrics {}",
        b.limit,
        b.reserve,
        b.privileged,
        b.unprivileged,
        b.per_uid,
        b.device_plugin,
        crate::fds::Budgets::METRICS
    );
    if b.cut {
        log::warn!(
            "{line}: below the full budgets (a limit of {} or more gives them; LimitNOFILE= in the unit)",
            crate::fds::Budgets::FULL_AT
        );
    } else {
        log::info!("{line}");
    }
}

/// Serves the metrics endpoint when `[metrics]` enables it; returns where it listens, or why it
/// does not. A listener that cannot be had (the port taken, an address family the unit does not
/// allow) is logged and the daemon runs on without metrics: they observe the pools, and losing
/// them must not cost the pools' management.
pub(super) fn serve_metrics(
    settings: &Settings,
    handle: &Handle,
    tasks: &TaskTracker,
    stop: &CancellationToken,
    passed: &mut listenfd::ListenFd,
) -> Result<crate::config::Listen, String> {
    use crate::api::metrics;
    if !settings.metrics.enabled {
        return Err("off (metrics.enabled = false)".into());
    }
    let bound = metrics::listen(&settings.metrics.listen, passed).and_then(|l| Ok((l.local()?, l)));
    let (at, listener) = bound.map_err(|e| {
        log::error!("metrics: cannot listen on {}: {e}; serving no metrics", settings.metrics.listen);
        format!("off (cannot listen on {}: {e})", settings.metrics.listen)
    })?;
    log::info!("metrics: serving {at}");
    let exporter = std::sync::Arc::new(metrics::Exporter::new(handle.watch()));
    let server = tasks.spawn(metrics::serve(listener, exporter, stop.clone().cancelled_owned()));
    watch_task(tasks, "the metrics endpoint", server);
    Ok(at)
}

/// Logs `task`'s end if it panicked (tracked, so the stop waits for it).
fn watch_task(tasks: &TaskTracker, what: &'static str, task: JoinHandle<()>) {
    tasks.spawn(async move {
        if let Err(e) = task.await {
            log::error!("{what} failed: {e}");
        }
    });
}

/// `stop` as the `true` of a watch channel, for the tasks that take their stop that way (the
/// device plugin, the cluster integration).
fn stop_flag(tasks: &TaskTracker, stop: &CancellationToken) -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(false);
    let stop = stop.clone();
    tasks.spawn(async move {
        stop.cancelled().await;
        let _ = tx.send(true);
    });
    rx
}

/// The device plugin: it waits for a kubelet, and refuses (logged) to run beside the kubelet's
/// static CPU manager owning pool CPUs. When only a start anew can serve it, it records why in
/// `restart` and stops the daemon.
fn spawn_plugin(
    tasks: &TaskTracker,
    stop: &CancellationToken,
    handle: Handle,
    opts: deviceplugin::Options,
    restart: Arc<OnceLock<String>>,
) -> JoinHandle<()> {
    let (stopped, stop) = (stop_flag(tasks, stop), stop.clone());
    tasks.spawn(async move {
        match deviceplugin::run(handle, opts, stopped).await {
            Err(e @ deviceplugin::PluginError::NeedsRestart { .. }) => {
                let _ = restart.set(crate::error_chain(&e));
                stop.cancel();
            }
            Err(e) => log::error!("{}", crate::error_chain(&e)),
            Ok(()) => {}
        }
    })
}

/// The cluster integration: configuration from ConfigMaps, the pod watch, the node report, the
/// ResourceSlices of the pools served by DRA.
#[cfg(feature = "k8s")]
fn spawn_cluster(
    tasks: &TaskTracker,
    stop: &CancellationToken,
    handle: &Handle,
    source: ConfigSource,
    path: &std::path::Path,
    settings: &Settings,
    pods: &crate::kubernetes::cluster::pods::PodIndex,
) -> Option<JoinHandle<()>> {
    match crate::kubernetes::apiserver::Options::from_settings(&settings.k8s, &settings.paths.procfs_root) {
        Ok(k8s_opts) => {
            let (h, path, pods, stopped) =
                (handle.clone(), path.to_owned(), pods.clone(), stop_flag(tasks, stop));
            let slices = crate::kubernetes::cluster::slices::Target::new(&k8s_opts.node, &settings.kubelet);
            Some(tasks.spawn(async move {
                if let Err(e) =
                    crate::kubernetes::cluster::run(h, source, path, k8s_opts, slices, pods, stopped).await
                {
                    log::error!("k8s: {}; the local configuration files alone apply", crate::error_chain(&e));
                }
            }))
        }
        Err(e) => {
            log::error!("k8s: {}; the local configuration files alone apply", crate::error_chain(&e));
            None
        }
    }
}

/// The DRA driver's kubelet plugin (k8s and the kubelet wing enabled): it serves while some
/// pool is served by DRA.
#[cfg(feature = "k8s")]
fn spawn_dra(
    tasks: &TaskTracker,
    stop: &CancellationToken,
    handle: &Handle,
    settings: &Settings,
    restart: Arc<OnceLock<String>>,
) {
    // spawn_cluster logged why the options cannot be had.
    let Ok(k8s_opts) =
        crate::kubernetes::apiserver::Options::from_settings(&settings.k8s, &settings.paths.procfs_root)
    else {
        return;
    };
    let opts = crate::kubernetes::dra::Options::from_settings(settings, &k8s_opts.node);
    let (stopped, stop) = (stop_flag(tasks, stop), stop.clone());
    let driver = crate::kubernetes::dra::run(handle.clone(), k8s_opts, opts, stopped);
    let task = tasks.spawn(async move {
        if let Err(e) = driver.await {
            let _ = restart.set(e.to_string());
            stop.cancel();
        }
    });
    watch_task(tasks, "the DRA plugin", task);
}
