//! One watch loop for every resource the daemon follows (ConfigMaps, the node, pods).
//!
//! `kube::runtime::watcher` lists, then watches from the list's `resourceVersion`; when the
//! stream ends or the connection drops it watches again from the last version it saw, and an
//! `ERROR` event with `410 Gone` (the version is too old) makes it list again, which shows here
//! as [`watcher::Event::Init`]. Errors come back with the default backoff (0.8 s doubling to 30 s).
//! This loop adds what the watcher leaves to its caller: a `410` answered to the watch request
//! itself (not inside the stream) would make it retry the same version forever, so the watcher
//! is started afresh (after a pause that doubles while the watch keeps answering 410, so a
//! server that always does cannot drive a list-and-watch loop at full speed); and every outage
//! is logged once, in words that say what to fix.

use std::fmt::Debug;

use crate::backoff::Backoff;
use futures_util::StreamExt;
use kube::runtime::watcher;
use kube::runtime::WatchStreamExt;
use kube::{Api, Resource};
use serde::de::DeserializeOwned;

/// Follows `api` until `stop` resolves, handing every event to `on_event`.
pub async fn follow<K, F>(
    what: &str,
    api: Api<K>,
    config: watcher::Config,
    mut on_event: F,
    stop: &mut tokio::sync::watch::Receiver<bool>,
) where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    F: FnMut(watcher::Event<K>),
{
    let mut failing = false;
    // Watches started afresh after a 410 on the watch request, since a watch last delivered.
    // The first relist comes at once, the second after RELIST_PAUSE, each further one after
    // twice the last (the floor is half the first pause: one failure earns no pause).
    let mut relists = Backoff::new(RELIST_PAUSE / 2, RELIST_PAUSE_MAX);
    'restart: loop {
        if relists.failures() > 1 {
            let pause = relists.pause();
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = crate::kubernetes::apiserver::stopped(stop) => return,
            }
        }
        let stream = watcher(api.clone(), config.clone()).default_backoff();
        futures_util::pin_mut!(stream);
        loop {
            let next = tokio::select! {
                n = stream.next() => n,
                _ = crate::kubernetes::apiserver::stopped(stop) => return,
            };
            match next {
                None => continue 'restart,
                Some(Ok(event)) => {
                    if matches!(event, watcher::Event::Apply(_) | watcher::Event::Delete(_)) {
                        // A watch event (not the list's): the watch itself works.
                        relists.reset();
                    }
                    if failing {
                        log::info!("k8s: watching {what} again");
                        failing = false;
                    }
                    on_event(event);
                }
                Some(Err(e)) => {
                    // kube 2 reports the watch request's own 410 as WatchFailed (it reads the
                    // answer as the first item of the stream), older ones as WatchStartFailed.
                    let gone = matches!(&e,
                        watcher::Error::WatchStartFailed(kube::Error::Api(r))
                        | watcher::Error::WatchFailed(kube::Error::Api(r)) if r.code == 410);
                    if !failing {
                        log::warn!("k8s: watching {what}: {}; retrying", describe_watch(&e));
                    } else {
                        log::debug!("k8s: watching {what}: {}", describe_watch(&e));
                    }
                    failing = true;
                    if gone {
                        relists.fail();
                        continue 'restart;
                    }
                }
            }
        }
    }
}

/// The pause before the second list in a row that a 410 on the watch request forces, doubling
/// up to [`RELIST_PAUSE_MAX`]; the first list comes at once.
const RELIST_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);
const RELIST_PAUSE_MAX: std::time::Duration = std::time::Duration::from_secs(30);

/// A watch error in words: the cause first (credentials, permissions, the server's own words).
fn describe_watch(e: &watcher::Error) -> String {
    match e {
        watcher::Error::InitialListFailed(c)
        | watcher::Error::WatchStartFailed(c)
        | watcher::Error::WatchFailed(c) => crate::kubernetes::apiserver::describe(c),
        watcher::Error::WatchError(r) => crate::kubernetes::apiserver::describe_status(r),
        watcher::Error::NoResourceVersion => e.to_string(),
    }
}
