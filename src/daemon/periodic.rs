//! The daemon's periodic jobs: the drift check, the isolation health sample and systemd's
//! watchdog, each on a task of its own (a [`Schedule`] says how often, [`Jobs`] what each does), so
//! a slow one never holds up another. `serve` (in the parent module) starts them; they end on the
//! daemon's stop token.

use std::future::Future;
use std::time::Duration;

use sd_notify::NotifyState;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::engine::{self, Handle};

/// How often each periodic job runs; `None` turns it off.
#[derive(Debug, Clone, Copy)]
pub(super) struct Schedule {
    /// `--check-interval`: the drift check.
    pub(super) drift: Option<Duration>,
    /// `--health-interval`: the isolation health sample.
    pub(super) health: Option<Duration>,
    /// Half of `WATCHDOG_USEC`, when systemd asks for a watchdog.
    pub(super) watchdog: Option<Duration>,
}

/// The periodic jobs' work, apart from their timing.
pub(super) trait Jobs: Clone + Send + 'static {
    /// Looks for drift.
    fn drift(&self) -> impl Future<Output = ()> + Send;
    /// Samples isolation health.
    fn health(&self) -> impl Future<Output = ()> + Send;
    /// Feeds the watchdog if the engine is alive.
    fn watchdog(&self) -> impl Future<Output = ()> + Send;
}

/// The jobs, done by the engine.
#[derive(Clone)]
pub(super) struct EngineJobs(pub(super) Handle);

impl Jobs for EngineJobs {
    async fn drift(&self) {
        match self.0.check_drift().await {
            Ok(r) => crate::counters::counters().drift(r.corrected, r.failed),
            Err(e) => log::warn!("drift check: {}", crate::error_chain(&e)),
        }
    }

    async fn health(&self) {
        let _ = self.0.sample_isolation().await;
    }

    async fn watchdog(&self) {
        // Only a live engine keeps the watchdog fed: a stuck one gets us restarted.
        match engine::ping_within(&self.0, engine::PING_TIMEOUT).await {
            Some(_) => super::notify(&[NotifyState::Watchdog]),
            None => log::error!(
                "the engine did not answer within {:?}; not feeding the watchdog",
                engine::PING_TIMEOUT
            ),
        }
    }
}

/// Starts each scheduled job on a task of its own, until `stop`. A drift check waits for the
/// engine (seconds, behind a slow systemd); sharing one loop, it kept the watchdog from being fed
/// until systemd killed a healthy daemon.
pub(super) fn spawn_periodic(
    tasks: &TaskTracker,
    stop: &CancellationToken,
    schedule: Schedule,
    jobs: impl Jobs,
) {
    // Start has just reconciled and sampled: drift and health wait one period; the watchdog is
    // fed at once.
    if let Some(period) = schedule.drift {
        let j = jobs.clone();
        tasks.spawn(every(period, true, stop.clone(), move || {
            let j = j.clone();
            async move { j.drift().await }
        }));
    }
    if let Some(period) = schedule.health {
        let j = jobs.clone();
        tasks.spawn(every(period, true, stop.clone(), move || {
            let j = j.clone();
            async move { j.health().await }
        }));
    }
    if let Some(period) = schedule.watchdog {
        tasks.spawn(every(period, false, stop.clone(), move || {
            let j = jobs.clone();
            async move { j.watchdog().await }
        }));
    }
}

/// Runs `job` every `period` (a late one delays the next, never bunches them) until `stop`.
async fn every<F, Fut>(period: Duration, skip_first: bool, stop: CancellationToken, mut job: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let mut ticks = tokio::time::interval(period.max(Duration::from_millis(10)));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    if skip_first {
        ticks.tick().await;
    }
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = ticks.tick() => {}
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = job() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;

    /// Jobs whose drift check never ends (one waiting behind a stuck systemd call) and whose
    /// health and watchdog jobs count their runs.
    #[derive(Clone, Default)]
    struct StuckDrift {
        health: Arc<AtomicUsize>,
        fed: Arc<AtomicUsize>,
        notify: Arc<tokio::sync::Notify>,
    }

    impl Jobs for StuckDrift {
        async fn drift(&self) {
            std::future::pending::<()>().await
        }
        async fn health(&self) {
            self.health.fetch_add(1, Ordering::SeqCst);
            self.notify.notify_waiters();
        }
        async fn watchdog(&self) {
            self.fed.fetch_add(1, Ordering::SeqCst);
            self.notify.notify_waiters();
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_watchdog_is_fed_while_a_drift_check_hangs() {
        let (tasks, stop) = (TaskTracker::new(), CancellationToken::new());
        let jobs = StuckDrift::default();
        let ms = Duration::from_millis;
        let schedule = Schedule { drift: Some(ms(10)), health: Some(ms(10)), watchdog: Some(ms(10)) };
        spawn_periodic(&tasks, &stop, schedule, jobs.clone());
        let enough = || jobs.fed.load(Ordering::SeqCst) >= 5 && jobs.health.load(Ordering::SeqCst) >= 5;
        // A bound for a hang, not a timing assertion: 5 runs take 50 ms.
        let waited = tokio::time::timeout(Duration::from_secs(30), async {
            while !enough() {
                let notified = jobs.notify.notified();
                if enough() {
                    break;
                }
                let _ = tokio::time::timeout(ms(100), notified).await;
            }
        })
        .await;
        assert!(
            waited.is_ok(),
            "fed {} times, sampled {} times with a drift check hanging",
            jobs.fed.load(Ordering::SeqCst),
            jobs.health.load(Ordering::SeqCst)
        );
        // The stop ends every job, the hanging one too.
        stop.cancel();
        tasks.close();
        let ended = tokio::time::timeout(Duration::from_secs(30), tasks.wait()).await;
        assert!(ended.is_ok(), "the periodic jobs did not end at the stop");
    }
}
