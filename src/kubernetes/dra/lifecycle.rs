//! The driver's life: a client of the API server first, then the two sockets served while some
//! pool is served by DRA, looked at every second and made again when the kubelet's directory
//! lost them.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::{prepare, serve, NeedsRestart, Options};
use crate::engine::{Handle, Server};
use crate::kubernetes::apiserver;

/// How often the sockets are looked at.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// Runs the driver until `stop` is set: waits for a client of the API server, then serves the
/// sockets while some pool is served by DRA. Refuses (logged) to serve beside the kubelet's
/// static CPU manager owning CPUs of those pools, as the device plugin does.
///
/// Under systemd, a kubelet directory made after the unit started is read-only to the daemon
/// (`ReadWritePaths=` take what exists at start): the error asks for a start anew, which
/// systemd makes (`RestartForceExitStatus=`), as the device plugin's does.
pub async fn run(
    handle: Handle,
    k8s: apiserver::Options,
    opts: Options,
    mut stop: watch::Receiver<bool>,
) -> Result<(), NeedsRestart> {
    if let Err(e) = handle.snapshot().static_policy(&opts.kubelet_dir, Server::Dra) {
        log::error!("DRA: the kubelet plugin is not started: {e}");
        return Ok(());
    }
    let Some(client) = apiserver::client_when_ready(&k8s, &mut stop).await else {
        return Ok(());
    };
    let driver = Arc::new(prepare::Driver::new(handle.clone(), client, opts.clone()));
    driver.recover().await;
    let mut serving: Option<serve::Serving> = None;
    let mut failing = false;
    let mut tick = tokio::time::interval(LOOK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = apiserver::stopped(&mut stop) => break,
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
