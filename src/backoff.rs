//! One backoff for every loop that retries something that keeps failing (registration with
//! the kubelet, the node report, re-applying what systemd refused, watches of the API server).
//!
//! Pure: it counts failures and says how long to pause; the caller owns the clock and the
//! sleeping. The pause doubles from a floor to a cap and never gives up; a success resets it.
#![deny(missing_docs)]

use std::time::Duration;

/// Failures in a row, and the pause they earn: `floor`, `2 × floor`, `4 × floor`... up to `cap`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backoff {
    floor: Duration,
    cap: Duration,
    failures: u32,
}

impl Backoff {
    /// No failure yet; the first failure earns `floor`, none ever more than `cap`.
    pub const fn new(floor: Duration, cap: Duration) -> Backoff {
        Backoff { floor, cap, failures: 0 }
    }

    /// Counts one more failure and returns the pause it earns.
    pub fn fail(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        self.pause()
    }

    /// The pause the failures so far earn: zero without any.
    pub fn pause(&self) -> Duration {
        match self.failures {
            0 => Duration::ZERO,
            // 2^31 times any floor is past every cap worth having: the shift cannot overflow.
            n => self.floor.saturating_mul(1u32 << (n - 1).min(31)).min(self.cap),
        }
    }

    /// A success: the next failure earns the floor again.
    pub fn reset(&mut self) {
        self.failures = 0;
    }

    /// Failures in a row so far.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// Whether the failure that would come next (attempt `failures() + 1`) is worth a log line:
    /// see [`worth_logging`].
    pub fn next_worth_logging(&self) -> bool {
        worth_logging(self.failures.saturating_add(1))
    }
}

/// Whether the `attempt`-th failure in a row is worth a log line: the 1st, 2nd, 4th, 8th...,
/// then every 64th, so an outage that lasts shows in the log without filling it.
pub fn worth_logging(attempt: u32) -> bool {
    attempt.is_power_of_two() || (attempt > 0 && attempt.is_multiple_of(64))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn doubles_from_the_floor_to_the_cap_and_resets() {
        let mut b = Backoff::new(20 * MS, 30_000 * MS);
        assert_eq!(b.pause(), Duration::ZERO);
        let pauses: Vec<u128> = (0..14).map(|_| b.fail().as_millis()).collect();
        assert_eq!(pauses, [20, 40, 80, 160, 320, 640, 1280, 2560, 5120, 10240, 20480, 30000, 30000, 30000]);
        assert_eq!(b.failures(), 14);
        b.reset();
        assert_eq!((b.failures(), b.pause()), (0, Duration::ZERO));
        assert_eq!(b.fail(), 20 * MS);
    }

    #[test]
    fn never_overflows_however_long_it_fails() {
        let mut b = Backoff::new(Duration::from_secs(u64::MAX / 2), Duration::from_secs(60));
        for _ in 0..100 {
            assert!(b.fail() <= Duration::from_secs(60));
        }
        let mut b = Backoff { failures: u32::MAX - 1, ..Backoff::new(MS, 2 * MS) };
        assert_eq!(b.fail(), 2 * MS);
        assert_eq!(b.fail(), 2 * MS);
        assert_eq!(b.failures(), u32::MAX);
    }

    #[test]
    fn logs_the_1st_2nd_4th_then_every_64th() {
        let logged: Vec<u32> = (0..=200).filter(|n| worth_logging(*n)).collect();
        assert_eq!(logged, [1, 2, 4, 8, 16, 32, 64, 128, 192]);
        let mut b = Backoff::new(MS, MS);
        assert!(b.next_worth_logging());
        b.fail();
        b.fail();
        assert!(!b.next_worth_logging(), "the 3rd");
        b.fail();
        assert!(b.next_worth_logging(), "the 4th");
    }
}
