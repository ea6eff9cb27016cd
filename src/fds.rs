//! File descriptors: the soft `RLIMIT_NOFILE` raised to the hard limit at start, and the
//! connection budgets of the served sockets sized from it.
//!
//! Every connection a peer opens costs the daemon one descriptor, and so does every file the
//! engine reads (cgroupfs, procfs, sysfs), every save of the state store, every pidfd of a
//! `pid:` target. With budgets that ignore the limit, idle connections could take the last
//! descriptors: then `accept` fails with EMFILE for everyone, root included, and so do the
//! drift check's reads. So the budgets are cut from what the limit leaves after a reserve for
//! the daemon's own use ([`Budgets::for_limit`], the formula in `docs/behaviour.md`), and each
//! class of peer has its own: unprivileged peers, privileged ones (root, the admin group) and
//! the device-plugin sockets cannot take each other's room or the reserve.
#![deny(missing_docs)]

use std::io;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

/// When the hard limit is unlimited: the kernel's default `fs.nr_open`, above which the soft
/// limit cannot go anyway.
const NR_OPEN: u64 = 1 << 20;

/// The soft limit before and after [`raise_nofile`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Raised {
    /// The soft limit found at start.
    pub before: u64,
    /// The soft limit now (the hard limit, when it could be raised).
    pub soft: u64,
    /// The hard limit.
    pub hard: Option<u64>,
}

/// The soft limit could not be raised.
#[derive(Debug, thiserror::Error)]
#[error("raising the soft RLIMIT_NOFILE from {before} to {to} (the hard limit)")]
pub struct RaiseError {
    /// The soft limit, unchanged.
    pub before: u64,
    /// The value asked for.
    pub to: u64,
    /// Why.
    #[source]
    pub source: io::Error,
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (systemd's `LimitNOFILE=`; the soft limit
/// stays 1024 by default so that programs using `select` keep working, which this one does not
/// use). Raising to the hard limit needs no privilege.
pub fn raise_nofile() -> Result<Raised, RaiseError> {
    let now = getrlimit(Resource::Nofile);
    let before = now.current.unwrap_or(u64::MAX);
    let to = now.maximum.unwrap_or(NR_OPEN);
    if before >= to {
        return Ok(Raised { before, soft: before, hard: now.maximum });
    }
    setrlimit(Resource::Nofile, Rlimit { current: Some(to), maximum: now.maximum })
        .map_err(|e| RaiseError { before, to, source: e.into() })?;
    Ok(Raised { before, soft: to, hard: now.maximum })
}

/// The soft `RLIMIT_NOFILE` now.
pub fn soft_limit() -> u64 {
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}

/// How many connections each served socket may hold at once; see [`Budgets::for_limit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budgets {
    /// The soft limit they were cut from.
    pub limit: u64,
    /// Descriptors kept for the daemon's own use.
    pub reserve: u64,
    /// varlink: connections of privileged peers (root, the admin group, the sandbox's owner).
    pub privileged: usize,
    /// varlink: connections of all unprivileged peers together.
    pub unprivileged: usize,
    /// varlink: connections of one unprivileged uid.
    pub per_uid: usize,
    /// The device-plugin sockets, every pool's together.
    pub device_plugin: usize,
    /// Whether the limit leaves less than the budgets' full size (see [`Budgets::FULL_AT`]).
    pub cut: bool,
}

impl Budgets {
    /// The fixed part of the reserve: standard streams, the runtime's epoll and wakers, the
    /// listening sockets, the bus connections (D-Bus, systemd), inotify instances, the
    /// engine's reads (a file or two open at a time) and the state store's save (the temporary
    /// file and the directory).
    pub const RESERVE_BASE: u64 = 64;
    /// The part of the limit added to the reserve: one pidfd per `pid:` target, and headroom
    /// for what grows with the host (the bus's and the kubelet's connections to us, watches).
    pub const RESERVE_SHARE: u64 = 8;
    /// The metrics endpoint's connection slots (`api::metrics`), its own budget.
    pub const METRICS: u64 = 16;
    /// varlink connections held while the group database is asked about their peer.
    pub const LOOKUPS: u64 = 4;
    /// varlink, privileged peers, at full size: far more than `cpupoolctl` runs and monitors
    /// need.
    pub const PRIVILEGED: usize = 128;
    /// varlink, all unprivileged peers together, at full size: reads are for monitoring tools
    /// and users checking their pools, a handful of connections each.
    pub const UNPRIVILEGED: usize = 64;
    /// varlink, one unprivileged uid, at full size: so that one user cannot take the whole
    /// unprivileged budget alone.
    pub const PER_UID: usize = 16;
    /// The device-plugin sockets' budget at full size: the kubelet holds one connection per
    /// pool (ListAndWatch and every call share it), plus one while it registers again.
    pub const DEVICE_PLUGIN: usize = 64;
    /// The smallest soft limit that leaves every budget its full size.
    pub const FULL_AT: u64 = 388;

    /// The budgets a soft limit of `limit` descriptors allows:
    ///
    /// ```text
    /// reserve    = 64 + limit / 8
    /// room       = limit - reserve - 16 (metrics slots) - 4 (group lookups)
    /// privileged = clamp(room / 2, 1, 128)
    /// unpriv.    = clamp(room / 4, 1, 64),  per uid = clamp(unpriv. / 4, 1, 16)
    /// dev.plugin = clamp(room / 4, 1, 64)
    /// ```
    ///
    /// so that their sum never exceeds `room` while it is at least 4: the reserve is never
    /// drawn on by connections, and privileged peers always have room that nobody else can take.
    pub fn for_limit(limit: u64) -> Budgets {
        let reserve = Budgets::RESERVE_BASE + limit / Budgets::RESERVE_SHARE;
        let room = limit.saturating_sub(reserve + Budgets::METRICS + Budgets::LOOKUPS);
        let share = |d: u64, max: usize| usize::try_from(room / d).unwrap_or(usize::MAX).clamp(1, max);
        let privileged = share(2, Budgets::PRIVILEGED);
        let unprivileged = share(4, Budgets::UNPRIVILEGED);
        let per_uid = (unprivileged / 4).clamp(1, Budgets::PER_UID);
        let device_plugin = share(4, Budgets::DEVICE_PLUGIN);
        let cut = privileged < Budgets::PRIVILEGED
            || unprivileged < Budgets::UNPRIVILEGED
            || device_plugin < Budgets::DEVICE_PLUGIN;
        Budgets { limit, reserve, privileged, unprivileged, per_uid, device_plugin, cut }
    }

    /// The budgets of the soft limit now.
    pub fn current() -> Budgets {
        Budgets::for_limit(soft_limit())
    }
}

/// Refusals are logged at most once per this period, with a count, so that a flood of
/// connections does not become a flood of log lines.
pub const REFUSAL_LOG_PERIOD: Duration = Duration::from_secs(10);

/// Logs refused connections of one socket (or family of sockets), at most once per
/// [`REFUSAL_LOG_PERIOD`], with how many there were.
#[derive(Debug)]
pub struct Refusals {
    what: &'static str,
    unit: &'static str,
    seen: Mutex<(u64, Option<Instant>)>,
}

impl Refusals {
    /// Refusals of `what` ("device plugin", ...), which starts the log line.
    pub const fn new(what: &'static str) -> Refusals {
        Refusals { what, unit: "connection(s)", seen: Mutex::new((0, None)) }
    }

    /// Refused calls of `what` ("D-Bus"), which starts the log line.
    pub const fn calls(what: &'static str) -> Refusals {
        Refusals { what, unit: "call(s)", seen: Mutex::new((0, None)) }
    }

    /// Counts a refusal; logs when the period since the last line is over. Returns whether
    /// it logged.
    pub fn note(&self, why: &str) -> bool {
        let mut seen = self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        seen.0 += 1;
        if seen.1.is_some_and(|t| t.elapsed() < REFUSAL_LOG_PERIOD) {
            return false;
        }
        log::warn!(
            "{}: refused {} {} in the last {} s; latest: {why}",
            self.what,
            seen.0,
            self.unit,
            REFUSAL_LOG_PERIOD.as_secs()
        );
        *seen = (0, Some(Instant::now()));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum(b: &Budgets) -> u64 {
        (b.privileged + b.unprivileged + b.device_plugin) as u64
            + b.reserve
            + Budgets::METRICS
            + Budgets::LOOKUPS
    }

    #[test]
    fn the_budgets_and_the_reserve_fit_in_the_limit() {
        for limit in [32, 64, 100, 128, 256, 399, 400, 1024, 4096, 65536, 1 << 20] {
            let b = Budgets::for_limit(limit);
            assert!(b.privileged >= 1 && b.unprivileged >= 1 && b.per_uid >= 1 && b.device_plugin >= 1);
            assert!(b.per_uid <= b.unprivileged, "{b:?}");
            // Below the point where every budget is 1, the sum fits.
            if limit >= Budgets::RESERVE_BASE + limit / Budgets::RESERVE_SHARE + 24 {
                assert!(sum(&b) <= limit, "{limit}: {b:?}");
            }
        }
    }

    #[test]
    fn the_default_limit_gives_the_full_budgets_and_a_large_one_no_more() {
        for limit in [Budgets::FULL_AT, 1024, 65536, 1 << 20] {
            let b = Budgets::for_limit(limit);
            assert_eq!(
                (b.privileged, b.unprivileged, b.per_uid, b.device_plugin, b.cut),
                (Budgets::PRIVILEGED, Budgets::UNPRIVILEGED, Budgets::PER_UID, Budgets::DEVICE_PLUGIN, false),
                "{limit}"
            );
        }
        assert!(Budgets::for_limit(Budgets::FULL_AT - 1).cut);
    }

    #[test]
    fn a_low_limit_keeps_room_for_privileged_peers() {
        // `ulimit -n 64`, as in the attack test that found root without replies.
        let b = Budgets::for_limit(64);
        assert!(b.cut);
        assert!(b.privileged >= 1);
        let b = Budgets::for_limit(256);
        assert!(b.privileged >= b.unprivileged, "{b:?}");
        assert!(sum(&b) <= 256, "{b:?}");
    }

    #[test]
    fn the_reserve_counts_the_metrics_endpoints_slots() {
        assert_eq!(Budgets::METRICS, crate::api::metrics::MAX_CONNECTIONS as u64);
    }

    #[test]
    fn raising_reaches_the_hard_limit() {
        let r = raise_nofile().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(soft_limit(), r.soft);
        assert!(r.soft >= r.before);
        if let Some(hard) = r.hard {
            assert_eq!(r.soft, hard);
        }
    }

    #[test]
    fn refusals_are_logged_once_per_period() {
        let r = Refusals::new("test");
        assert!(r.note("one"));
        assert!(!r.note("two"));
        assert!(!r.note("three"));
    }
}
