//! File descriptors: the soft `RLIMIT_NOFILE` raised to the hard limit at start.
//!
//! Every connection a peer opens costs the daemon one descriptor, and so does every file the
//! engine reads (cgroupfs, procfs, sysfs), every save of the state store, every pidfd of a
//! `pid:` target. The soft limit a service gets by default (1024) is kept low for programs
//! that use `select`; this one does not, and takes what the unit's `LimitNOFILE=` allows.
//!
//! [`Refusals`]: the log line of connections a socket refused, at most one per period.
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

/// Refusals are logged at most once per this period, with a count, so that a flood of
/// connections does not become a flood of log lines.
pub const REFUSAL_LOG_PERIOD: Duration = Duration::from_secs(10);

/// Logs refused connections of one socket (or family of sockets), at most once per
/// [`REFUSAL_LOG_PERIOD`], with how many there were.
#[derive(Debug)]
pub struct Refusals {
    what: &'static str,
    seen: Mutex<(u64, Option<Instant>)>,
}

impl Refusals {
    /// Refusals of `what` ("device plugin", ...), which starts the log line.
    pub const fn new(what: &'static str) -> Refusals {
        Refusals { what, seen: Mutex::new((0, None)) }
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
            "{}: refused {} connection(s) in the last {} s; latest: {why}",
            self.what,
            seen.0,
            REFUSAL_LOG_PERIOD.as_secs()
        );
        *seen = (0, Some(Instant::now()));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raising_reaches_the_hard_limit() {
        let r = raise_nofile().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(getrlimit(Resource::Nofile).current, Some(r.soft));
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
