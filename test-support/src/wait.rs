//! Polling against a deadline, for conditions that have no ready signal of their own.

use std::time::{Duration, Instant};

/// How long a test waits for something that is going to happen (a daemon's readiness, a
/// registration, a drift check's repair): a guard against a hang, never a measurement. A busy
/// 2-core CI machine runs a debug daemon ten times slower than an idle one; a wait that is
/// only long enough on an idle machine makes a test fail by timing alone.
pub const PATIENCE: Duration = Duration::from_secs(180);

/// How often a condition is looked at again.
const POLL: Duration = Duration::from_millis(20);

/// One look at `cond`: its value, or `None` to look again; past `deadline`, a panic naming
/// `what` and the last thing `cond` said.
fn look<T>(deadline: Instant, what: &str, cond: &mut impl FnMut() -> Result<T, String>) -> Option<T> {
    match cond() {
        Ok(v) => Some(v),
        Err(last) => {
            assert!(Instant::now() < deadline, "timed out waiting for {what}; last: {last}");
            None
        }
    }
}

/// Polls `cond` until it gives a value or `within` passes; then panics naming `what` and the
/// last thing `cond` said.
pub fn until<T>(within: Duration, what: &str, mut cond: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + within;
    loop {
        match look(deadline, what, &mut cond) {
            Some(v) => return v,
            None => std::thread::sleep(POLL),
        }
    }
}

/// [`until`] for async tests: the runtime's other tasks (a peer's servers) keep running while
/// it waits.
#[cfg(feature = "kubelet")]
pub async fn until_async<T>(within: Duration, what: &str, mut cond: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + within;
    loop {
        match look(deadline, what, &mut cond) {
            Some(v) => return v,
            None => tokio::time::sleep(POLL).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_the_value_once_the_condition_holds() {
        let mut n = 0;
        let got = until(Duration::from_secs(5), "the third look", || {
            n += 1;
            if n == 3 {
                Ok(n)
            } else {
                Err(format!("look {n}"))
            }
        });
        assert_eq!(got, 3);
    }

    #[test]
    #[should_panic(expected = "timed out waiting for never; last: still no")]
    fn names_what_and_the_last_answer_at_the_deadline() {
        until::<()>(Duration::ZERO, "never", || Err("still no".into()));
    }
}
