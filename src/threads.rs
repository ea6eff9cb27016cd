//! Threads the daemon starts, where the system may refuse one.
//!
//! A unit's `TasksMax=` (the cgroup's `pids.max`) or `RLIMIT_NPROC` can leave no thread to
//! start. `std::thread::spawn` and tokio's `spawn_blocking` panic then (the latter when its pool
//! has no thread left to take the work), which ended the periodic drift check for good and
//! made a start die with a backtrace. Here a refused thread is an error the caller logs or
//! returns:
//! - [`run_blocking`]: blocking work (the drift read, the reclaimer's stats, the engine's start)
//!   on a thread of its own, awaited; per call, as those calls are seconds apart;
//! - [`probe`]: before the tokio runtime is built (its builder panics when it cannot start its
//!   workers), whether that many threads can be started now.
#![deny(missing_docs)]

use std::io;

/// A thread that could not be started, or that died.
#[derive(Debug, thiserror::Error)]
pub enum ThreadError {
    /// The system refused the thread (a `pids.max` or `RLIMIT_NPROC` reached, most likely).
    #[error("starting a thread for {what} (the unit's TasksMax= or RLIMIT_NPROC reached?)")]
    Spawn {
        /// What the thread was for.
        what: &'static str,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The thread panicked before it answered.
    #[error("the thread for {what} ended without an answer")]
    Died {
        /// What the thread was for.
        what: &'static str,
    },
}

/// Runs `f` on a thread of its own and awaits its result; a thread the system refuses is
/// [`ThreadError::Spawn`], not a panic.
pub async fn run_blocking<T, F>(what: &'static str, f: F) -> Result<T, ThreadError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    run_blocking_with(what, f, |name, job| std::thread::Builder::new().name(name).spawn(job).map(drop)).await
}

/// [`run_blocking`] with the thread started by `spawn` (tests refuse it).
async fn run_blocking_with<T, F>(
    what: &'static str,
    f: F,
    spawn: impl FnOnce(String, Box<dyn FnOnce() + Send>) -> io::Result<()>,
) -> Result<T, ThreadError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    let job = Box::new(move || {
        let _ = tx.send(f());
    });
    spawn("cpupoold-work".into(), job).map_err(|source| ThreadError::Spawn { what, source })?;
    rx.await.map_err(|_| ThreadError::Died { what })
}

/// Whether `n` more threads can be started now: starts them, lets them end, and waits until
/// the kernel has counted them out again (their `/proc/self/task` entries gone), so that what
/// is started next has their room. A best effort: something else may take the room meanwhile.
pub fn probe(what: &'static str, n: usize) -> Result<(), ThreadError> {
    let before = tasks();
    let (release, wait) = std::sync::mpsc::channel::<()>();
    let wait = std::sync::Arc::new(std::sync::Mutex::new(wait));
    let mut started = Vec::with_capacity(n);
    let mut refused = None;
    for _ in 0..n {
        let wait = wait.clone();
        // Each holds its room until released, so that all n are there at once.
        match std::thread::Builder::new().name("cpupoold-probe".into()).spawn(move || {
            let _ = wait.lock().map(|w| w.recv());
        }) {
            Ok(t) => started.push(t),
            Err(source) => {
                refused = Some(ThreadError::Spawn { what, source });
                break;
            }
        }
    }
    drop(release);
    for t in started {
        let _ = t.join();
    }
    // A joined thread is counted out (pids.max, RLIMIT_NPROC) a moment after join returns,
    // when the kernel releases it; it leaves /proc/self/task then too.
    if let Some(before) = before {
        for _ in 0..100_000 {
            if tasks().is_none_or(|now| now <= before) {
                break;
            }
            std::thread::yield_now();
        }
    }
    refused.map_or(Ok(()), Err)
}

/// The threads of this process, if `/proc` says.
fn tasks() -> Option<usize> {
    std::fs::read_dir("/proc/self/task").ok().map(Iterator::count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_refused_thread_is_an_error_naming_what_it_was_for() {
        let refused =
            |_: String, _: Box<dyn FnOnce() + Send>| Err(io::Error::from_raw_os_error(libc_eagain()));
        let e = run_blocking_with("the drift read", || 1, refused).await.err();
        let text = e.as_ref().map(|e| crate::error_chain(e)).unwrap_or_default();
        assert!(matches!(e, Some(ThreadError::Spawn { what: "the drift read", .. })), "{text}");
        assert!(text.contains("starting a thread for the drift read"), "{text}");
    }

    #[tokio::test]
    async fn work_on_its_own_thread_answers() {
        let r = run_blocking("a test", || std::thread::current().name().map(str::to_owned)).await;
        assert_eq!(r.ok().flatten().as_deref(), Some("cpupoold-work"));
    }

    #[test]
    fn a_probe_of_a_few_threads_passes_and_leaves_none_behind() {
        assert!(probe("a test", 3).is_ok());
    }

    fn libc_eagain() -> i32 {
        nix::errno::Errno::EAGAIN as i32
    }
}
