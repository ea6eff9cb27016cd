//! The daemon where the system gives it few threads: `RLIMIT_NPROC` for a uid of its own, which
//! counts its threads as a unit's `TasksMax=` (`pids.max`) does. Whatever the limit, a start
//! either comes up or fails with an error saying which thread could not be started: never a
//! panic with a backtrace (tokio's runtime builder and `spawn_blocking`, `std::thread::spawn`),
//! never a hang.
//!
//! Needs root (to run as that uid): see `test_support::needs`.

mod common;

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

/// Whether a D-Bus caller is in the admin group is looked up on a thread of its own: when none
/// can be started (the daemon at its `RLIMIT_NPROC`), the caller gets a typed
/// `AccessDenied` saying why, reads are still answered, and nothing panics (tokio's
/// `spawn_blocking` panicked when its pool had no thread left).
#[test]
fn a_refused_lookup_thread_is_a_typed_error() {
    if !test_support::needs::root("to run the daemon as a uid of its own") {
        return;
    }
    // The daemon runs as uid 2 (`bin`: the bus lets known users connect, and nothing else runs
    // as it), the caller as uid 1 (`daemon`): neither root nor the sandbox's owner, so only the
    // admin group could allow it.
    const OWNER: u32 = 2;
    const NPROC: usize = 64;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let bus = common::PrivateBus::start(dir.path());
    let sb = dir.path().join("sb");
    std::fs::create_dir_all(sb.join("etc/cpupoold")).unwrap_or_else(|e| panic!("{e}"));
    // An admin group that exists, so that a caller of another uid must be looked up.
    let config = format!("{}\n[daemon]\nadmin_group = \"root\"\n", common::CONFIG);
    std::fs::write(sb.join("etc/cpupoold/config.toml"), config).unwrap_or_else(|e| panic!("{e}"));
    for d in [dir.path(), sb.as_path()] {
        std::os::unix::fs::chown(d, Some(OWNER), Some(OWNER)).unwrap_or_else(|e| panic!("{e}"));
    }
    std::os::unix::fs::chown(sb.join("etc/cpupoold/config.toml"), Some(OWNER), Some(OWNER))
        .unwrap_or_else(|e| panic!("{e}"));
    std::os::unix::fs::chown(sb.join("etc/cpupoold"), Some(OWNER), Some(OWNER))
        .unwrap_or_else(|e| panic!("{e}"));
    std::os::unix::fs::chown(sb.join("etc"), Some(OWNER), Some(OWNER)).unwrap_or_else(|e| panic!("{e}"));
    let log = dir.path().join("daemon.log");
    let mut child = test_support::daemon::Reaped(
        Command::new("prlimit")
            .arg(format!("--nproc={NPROC}"))
            .arg("setpriv")
            .args(["--reuid", &OWNER.to_string(), "--regid", &OWNER.to_string(), "--clear-groups"])
            .arg(env!("CARGO_BIN_EXE_cpupoold"))
            .arg("--sandbox")
            .arg(&sb)
            .args(["--topology", "1x4x2:1", "--bus", &bus.address])
            .env("RUST_BACKTRACE", "1")
            .env_remove("NOTIFY_SOCKET")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap_or_else(|e| panic!("{e}")))
            .spawn()
            .unwrap_or_else(|e| panic!("setpriv (util-linux): {e}")),
    );
    let stdout = child.stdout.take().unwrap_or_else(|| panic!("stdout"));
    let ready = BufReader::new(stdout).lines().map_while(Result::ok).any(|l| l == "READY");
    let logs = || std::fs::read_to_string(&log).unwrap_or_default();
    assert!(ready, "the daemon did not start:\n{}", logs());
    // From now on the daemon may start no thread: its uid runs NPROC processes besides it.
    let _fillers = Fillers(
        (0..NPROC)
            .map(|_| {
                Command::new("setpriv")
                    .args(["--reuid", &OWNER.to_string(), "--regid", &OWNER.to_string(), "--clear-groups"])
                    .args(["sleep", "600"])
                    .spawn()
                    .unwrap_or_else(|e| panic!("setpriv sleep: {e}"))
            })
            .collect(),
    );

    let as_caller = |args: &[&str]| {
        let out = Command::new("setpriv")
            .args(["--reuid=1", "--regid=1", "--clear-groups", "dbus-send"])
            .arg(format!("--bus={}", bus.address))
            .args([
                "--print-reply",
                "--reply-timeout=20000",
                "--dest=org.cpupool.Manager1",
                "/org/cpupool/Manager1",
            ])
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("dbus-send: {e}"));
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
    };
    let said = as_caller(&["org.cpupool.Manager1.Release", "string:x"]);
    assert!(
        said.contains("org.cpupool.Manager1.Error.AccessDenied") && said.contains("starting a thread for"),
        "uid 1's Release: {said}\n{}",
        logs()
    );
    let said = as_caller(&["org.cpupool.Manager1.ListPools"]);
    assert!(said.contains("method return"), "uid 1's ListPools: {said}\n{}", logs());
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX)),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = child.wait();
    assert!(!logs().contains("panicked"), "{}", logs());
}

/// Processes that hold their uid's room, killed when dropped (however the test ends).
struct Fillers(Vec<std::process::Child>);

impl Drop for Fillers {
    fn drop(&mut self) {
        for f in &mut self.0 {
            let _ = f.kill();
            let _ = f.wait();
        }
    }
}
