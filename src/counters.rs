//! The daemon's counters and histograms: API calls, durable saves, group commits, reclaims,
//! drift corrections, the device plugin. On the ground floor, so every room (the engine in a
//! commit, the reclaimer, the kubelet wing, the API adapters) adds to them with one atomic
//! operation each and nothing waits; the metrics endpoint (`api::metrics`, an adapter) only
//! reads them at a scrape, beside the gauges it computes from the engine's snapshot.
#![deny(missing_docs)]

use std::sync::{LazyLock, Mutex, PoisonError};
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

/// Which kubelet socket the device plugin registered with (device, inode, change time): another
/// one is a kubelet restart.
pub type KubeletSocket = (u64, i64, i64);

/// Labels of an API call.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    transport: &'static str,
    method: String,
}

/// Labels of a failed API call: the error's kind (the last part of its name).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    transport: &'static str,
    method: String,
    error: String,
}

/// A pool's label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabel {
    pool: String,
}

/// The daemon's counters and histograms (see the [module docs](self)).
#[derive(Debug)]
pub struct Counters {
    api_requests: Family<CallLabels, Counter>,
    api_errors: Family<ErrorLabels, Counter>,
    api_duration: Family<CallLabels, Histogram>,
    save_duration: Histogram,
    batch_size: Histogram,
    reclaims: Family<PoolLabel, Counter>,
    drift_corrected: Counter,
    drift_failed: Counter,
    registrations: Family<PoolLabel, Counter>,
    allocate_requests: Family<PoolLabel, Counter>,
    allocate_errors: Family<PoolLabel, Counter>,
    allocate_duration: Family<PoolLabel, Histogram>,
    kubelet_restarts: Counter,
    /// The identity of the kubelet socket last registered with: another one is a restart.
    kubelet_seen: Mutex<Option<KubeletSocket>>,
}

/// Latency buckets: 50 µs to about 3.3 s, doubling (an API read answers in tens of µs, a
/// durable save in ms, an engine call that waits behind a reload in up to seconds).
fn latency() -> Histogram {
    Histogram::new(exponential_buckets(0.000_05, 2.0, 17))
}

impl Counters {
    fn new() -> Counters {
        Counters {
            api_requests: Family::default(),
            api_errors: Family::default(),
            api_duration: Family::new_with_constructor(latency),
            save_duration: latency(),
            // 1 to 1024 mutations per save.
            batch_size: Histogram::new(exponential_buckets(1.0, 2.0, 11)),
            reclaims: Family::default(),
            drift_corrected: Counter::default(),
            drift_failed: Counter::default(),
            registrations: Family::default(),
            allocate_requests: Family::default(),
            allocate_errors: Family::default(),
            allocate_duration: Family::new_with_constructor(latency),
            kubelet_restarts: Counter::default(),
            kubelet_seen: Mutex::new(None),
        }
    }

    /// One API call answered over `transport` (`varlink`, `dbus`) in `took`; `error` is the
    /// error's name when it failed (only its last part is kept, a bounded set).
    pub fn api_call(&self, transport: &'static str, method: &str, error: Option<&str>, took: Duration) {
        let labels = CallLabels { transport, method: method.to_owned() };
        self.api_requests.get_or_create(&labels).inc();
        self.api_duration.get_or_create(&labels).observe(took.as_secs_f64());
        if let Some(e) = error {
            let error = e.rsplit('.').next().unwrap_or(e).to_owned();
            self.api_errors.get_or_create(&ErrorLabels { transport, method: labels.method, error }).inc();
        }
    }

    /// One durable save of the state took `took`.
    pub fn state_saved(&self, took: Duration) {
        self.save_duration.observe(took.as_secs_f64());
    }

    /// The engine decided `n` mutations together (one save for all of them).
    pub fn batch(&self, n: usize) {
        self.batch_size.observe(n as f64);
    }

    /// An assignment of `pool` was released because its target went away.
    pub fn reclaimed(&self, pool: &str) {
        self.reclaims.get_or_create(&PoolLabel { pool: pool.to_owned() }).inc();
    }

    /// A drift check, a restart or the re-apply after a systemd reload corrected `corrected`
    /// differences and failed to correct `failed`.
    pub fn drift(&self, corrected: usize, failed: usize) {
        self.drift_corrected.inc_by(corrected as u64);
        self.drift_failed.inc_by(failed as u64);
    }

    /// `pool` registered with the kubelet whose socket is `kubelet`; a kubelet socket other than
    /// the one registered with before counts as a kubelet restart.
    pub fn registered(&self, pool: &str, kubelet: Option<KubeletSocket>) {
        self.registrations.get_or_create(&PoolLabel { pool: pool.to_owned() }).inc();
        let mut seen = self.kubelet_seen.lock().unwrap_or_else(PoisonError::into_inner);
        if kubelet.is_some() && *seen != kubelet {
            if seen.is_some() {
                self.kubelet_restarts.inc();
            }
            *seen = kubelet;
        }
    }

    /// One Allocate call for `pool`, answered in `took`.
    pub fn allocate(&self, pool: &str, ok: bool, took: Duration) {
        let labels = PoolLabel { pool: pool.to_owned() };
        self.allocate_requests.get_or_create(&labels).inc();
        self.allocate_duration.get_or_create(&labels).observe(took.as_secs_f64());
        if !ok {
            self.allocate_errors.get_or_create(&labels).inc();
        }
    }

    /// Registers every family with `registry` (clones share the values).
    pub fn register(&self, r: &mut Registry) {
        r.register("api_requests", "API calls answered, by transport and method", self.api_requests.clone());
        r.register(
            "api_errors",
            "API calls answered with an error, by transport, method and error kind",
            self.api_errors.clone(),
        );
        r.register_with_unit(
            "api_request_duration",
            "Time to answer an API call (streaming Monitor calls: until the stream starts)",
            Unit::Seconds,
            self.api_duration.clone(),
        );
        r.register_with_unit(
            "state_save_duration",
            "Time of one durable save of the state (write, fsync, rename, fsync of the directory)",
            Unit::Seconds,
            self.save_duration.clone(),
        );
        r.register(
            "group_commit_batch_size",
            "Mutations the engine decided together and saved once",
            self.batch_size.clone(),
        );
        r.register(
            "reclaims",
            "Assignments released because their target went away, by pool",
            self.reclaims.clone(),
        );
        r.register(
            "drift_corrections",
            "Differences between the state and the host corrected by drift checks, at a restart and after systemd reloaded",
            self.drift_corrected.clone(),
        );
        r.register(
            "drift_correction_failures",
            "Differences between the state and the host that could not be corrected",
            self.drift_failed.clone(),
        );
        r.register(
            "kubelet_registrations",
            "Device plugin registrations with the kubelet, by pool",
            self.registrations.clone(),
        );
        r.register(
            "kubelet_allocate_requests",
            "Allocate calls from the kubelet, by pool",
            self.allocate_requests.clone(),
        );
        r.register(
            "kubelet_allocate_errors",
            "Allocate calls refused, by pool",
            self.allocate_errors.clone(),
        );
        r.register_with_unit(
            "kubelet_allocate_duration",
            "Time to answer an Allocate call, by pool",
            Unit::Seconds,
            self.allocate_duration.clone(),
        );
        r.register(
            "kubelet_restarts",
            "Kubelet restarts seen (a new kubelet socket to register with)",
            self.kubelet_restarts.clone(),
        );
    }
}

static COUNTERS: LazyLock<Counters> = LazyLock::new(Counters::new);

/// The process's metrics. One per process, like the log: the code paths that count (deep in
/// the engine, the reclaimer, the device plugin) reach it without a handle threaded through
/// every constructor.
pub fn counters() -> &'static Counters {
    &COUNTERS
}

/// Times `f` and records it as an API call over `transport`; `error` names the error of a failed
/// outcome.
pub async fn timed<T>(
    transport: &'static str,
    method: &str,
    error: impl FnOnce(&T) -> Option<String>,
    f: impl std::future::Future<Output = T>,
) -> T {
    let start = Instant::now();
    let out = f.await;
    counters().api_call(transport, method, error(&out).as_deref(), start.elapsed());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_kubelet_socket_counts_as_a_restart_once() {
        let m = Counters::new();
        m.registered("a", Some((1, 2, 3)));
        m.registered("b", Some((1, 2, 3)));
        assert_eq!(m.kubelet_restarts.get(), 0);
        m.registered("a", Some((1, 2, 4)));
        m.registered("b", Some((1, 2, 4)));
        assert_eq!(m.kubelet_restarts.get(), 1);
    }
}
