//! The daemon where the system gives it few threads: `RLIMIT_NPROC` for a uid of its own, which
//! counts its threads as a unit's `TasksMax=` (`pids.max`) does. Whatever the limit, a start
//! either comes up or fails with an error saying which thread could not be started: never a
//! panic with a backtrace (tokio's runtime builder and `spawn_blocking`, `std::thread::spawn`),
//! never a hang.
//!
//! Needs root (to run as that uid): see `test_support::needs`.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// A uid no other test runs as: `RLIMIT_NPROC` counts every thread of the uid.
const UID: u32 = 64321;

/// Starts the sandbox daemon as [`UID`] with at most `nproc` threads; `(ready, exit status,
/// stderr)`. A daemon that neither gets ready nor exits within a minute is killed and reported
/// as hung (a start takes well under a second).
fn start_limited(dir: &Path, nproc: usize) -> (bool, Option<std::process::ExitStatus>, String) {
    let log = dir.join("daemon.log");
    let mut child = Command::new("prlimit")
        .arg(format!("--nproc={nproc}"))
        .args(["setpriv", "--reuid", &UID.to_string(), "--regid", &UID.to_string(), "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_cpupoold"))
        .arg("--sandbox")
        .arg(dir.join("sb"))
        .args(["--topology", "1x4x2:1", "--bus", "none"])
        .env("RUST_BACKTRACE", "1")
        .env_remove("NOTIFY_SOCKET")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap_or_else(|e| panic!("{e}")))
        .spawn()
        .unwrap_or_else(|e| panic!("prlimit, setpriv (util-linux): {e}"));
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
    let (done, watchdog) = std::sync::mpsc::channel::<()>();
    let guard = std::thread::spawn(move || {
        let hung = watchdog.recv_timeout(Duration::from_secs(60)).is_err();
        if hung {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        }
        hung
    });
    let stdout = child.stdout.take().unwrap_or_else(|| panic!("stdout"));
    let ready = BufReader::new(stdout).lines().map_while(Result::ok).any(|l| l == "READY");
    if ready {
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    }
    let status = child.wait().ok();
    let _ = done.send(());
    let hung = guard.join().unwrap_or(true);
    let logs = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!hung, "with {nproc} threads the daemon neither got ready nor exited:\n{logs}");
    (ready, status, logs)
}

#[test]
fn a_start_short_of_threads_fails_with_an_error_not_a_panic() {
    if !test_support::needs::root("to run the daemon as a uid of its own") {
        return;
    }
    let mut came_up = false;
    for nproc in 1..=8 {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        std::os::unix::fs::chown(dir.path(), Some(UID), Some(UID)).unwrap_or_else(|e| panic!("{e}"));
        let (ready, status, logs) = start_limited(dir.path(), nproc);
        assert!(!logs.contains("panicked"), "with {nproc} threads the daemon panicked:\n{logs}");
        if ready {
            came_up = true;
            continue;
        }
        assert!(status.is_some_and(|s| !s.success()), "with {nproc} threads: {status:?}\n{logs}");
        assert!(
            logs.contains("starting a thread for") && logs.contains("Resource temporarily unavailable"),
            "with {nproc} threads the error does not say which thread was refused:\n{logs}"
        );
    }
    assert!(came_up, "with 8 threads the daemon should come up");
}
