//! Idle connections cannot take the daemon's file descriptors: the real `cpupoold` on a sandbox
//! host, started under a low `RLIMIT_NOFILE` (`prlimit`), flooded with connections that send
//! nothing. However many there are, root's calls are answered, the drift check still reads and
//! restores the cgroup files, and nothing fails with EMFILE ("Too many open files").
//!
//! - the device-plugin sockets: 600 idle connections under a limit of 256 (the attack test's
//!   1,100 under 1024, scaled down); those beyond the sockets' budget are closed at once;
//! - varlink, root's own connections: 100 idle ones under a limit of 64 (as in the attack
//!   test); those beyond root's budget are answered `Busy` and closed;
//! - varlink, four unprivileged uids holding 100 idle connections each under a limit of 64:
//!   root's own budget stays free, so root's call is answered, not even `Busy` (needs root).
//!
//! Every wait has a generous deadline; no time is asserted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{ErrorKind, Read};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use common::{Daemon, Varlink};
use serde_json::json;

const WAIT: Duration = test_support::wait::PATIENCE;

/// Room for the test's own connections: the soft limit raised to the hard one.
fn raise_own_limit(need: u64) {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let l = getrlimit(Resource::Nofile);
    setrlimit(Resource::Nofile, Rlimit { current: l.maximum, maximum: l.maximum }).unwrap();
    let soft = getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX);
    assert!(soft >= need, "the test needs {need} descriptors; its hard limit allows {soft}");
}

/// The sandbox daemon under `prlimit --nofile=LIMIT:LIMIT`, drift checked every second, with an
/// assignment (`w`: a cgroup of the shared pool `web`, CPUs 3,7) whose file the test rewrites.
fn start(dir: &Path, limit: u64) -> Daemon {
    let nofile = format!("--nofile={limit}:{limit}");
    let d = Daemon::start_wrapped(
        dir,
        &["prlimit", &nofile],
        "1x4x2:1",
        Some(common::CONFIG),
        &["--bus", "none", "--check-interval", "1"],
        &[],
    );
    std::fs::create_dir_all(d.sb.join("cgroup/cpupool.slice/cpupool-web.slice/app")).unwrap();
    let mut v = Varlink::connect(&d.varlink);
    v.call("Assign", json!({ "pool": "web", "target": "cgroup:cpupool.slice/cpupool-web.slice/app", "millicpus": 500, "id": "w" }))
        .unwrap_or_else(|e| panic!("{e:?}\n{}", d.logs()));
    d
}

/// Root's call on a new connection: its answer (or error name), or why none came in [`WAIT`].
fn root_call(d: &Daemon) -> Result<Result<serde_json::Value, String>, String> {
    let v = Varlink::try_connect(&d.varlink).map_err(|e| format!("connect: {e}"))?;
    let mut v = v;
    v.set_timeout(WAIT);
    match v.try_call("Status", json!({})) {
        Ok(r) => Ok(r.map_err(|(name, _)| name)),
        Err(e) => Err(format!("no answer: {e}")),
    }
}

/// The drift check still reads and writes: a rewritten `cpuset.cpus` is restored.
fn drift_check_works(d: &Daemon, what: &str) {
    let file = d.sb.join("cgroup/cpupool.slice/cpupool-web.slice/app/cpuset.cpus");
    std::fs::write(&file, "3\n").unwrap();
    test_support::wait::until(
        WAIT,
        &format!("{what}: the drift check to restore `{}`", file.display()),
        || {
            if std::fs::read_to_string(&file).unwrap_or_default().trim() == "3,7" {
                Ok(())
            } else {
                Err(d.logs())
            }
        },
    );
}

fn no_emfile(d: &Daemon, what: &str) {
    let logs = d.logs();
    assert!(!logs.contains("Too many open files"), "{what}: the daemon ran out of descriptors:\n{logs}");
}

/// Whether the daemon closed `s` (its end reads as the end of the stream, or reset).
fn closed(mut s: &UnixStream) -> bool {
    let mut b = [0u8; 64];
    match s.read(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) if e.kind() == ErrorKind::WouldBlock => false,
        Err(_) => true,
    }
}

#[test]
fn idle_device_plugin_connections_cannot_take_the_descriptors() {
    const LIMIT: u64 = 256;
    const FLOOD: usize = 600;
    raise_own_limit(FLOOD as u64 + 64);
    let dir = tempfile::tempdir().unwrap();
    let d = start(dir.path(), LIMIT);
    let sock = d.sb.join("kubelet/device-plugins/cpupoold-dp.sock");
    test_support::wait::until(WAIT, "the device-plugin socket", || {
        if sock.exists() {
            Ok(())
        } else {
            Err(d.logs())
        }
    });

    // Idle: connected, nothing sent (not even HTTP/2's preface). The listen backlog (1024)
    // holds what the daemon has not accepted, so every connect returns.
    let flood: Vec<UnixStream> = (0..FLOOD)
        .map(|i| UnixStream::connect(&sock).unwrap_or_else(|e| panic!("connection {i}: {e}")))
        .collect();
    for s in &flood {
        s.set_nonblocking(true).unwrap();
    }

    match root_call(&d) {
        Ok(Ok(_)) => {}
        other => panic!("root's call during the flood: {other:?}\n{}", d.logs()),
    }
    drift_check_works(&d, "device-plugin flood");
    // Those beyond the budget (at most 64, whatever the limit) are closed, not left waiting.
    let open = test_support::wait::until(WAIT, "connections beyond the budget to be closed", || {
        let open = flood.iter().filter(|s| !closed(s)).count();
        if open <= 64 {
            Ok(open)
        } else {
            Err(format!("{open} of {FLOOD} still open\n{}", d.logs()))
        }
    });
    no_emfile(&d, "device-plugin flood");
    let logs = d.logs();
    assert!(logs.contains("device plugin: refused"), "no line about the refused connections:\n{logs}");
    eprintln!("device-plugin flood under RLIMIT_NOFILE {LIMIT}: {open} of {FLOOD} idle connections kept");
    drop(flood);
    d.stop();
}

#[test]
fn idle_root_connections_cannot_take_the_descriptors() {
    const LIMIT: u64 = 64;
    const FLOOD: usize = 100;
    raise_own_limit(FLOOD as u64 + 64);
    let dir = tempfile::tempdir().unwrap();
    let d = start(dir.path(), LIMIT);

    let flood: Vec<UnixStream> = (0..FLOOD)
        .map(|i| UnixStream::connect(&d.varlink).unwrap_or_else(|e| panic!("connection {i}: {e}")))
        .collect();
    for s in &flood {
        s.set_nonblocking(true).unwrap();
    }
    // Root's own flood takes root's budget: a new call is answered, if only with `Busy`.
    match root_call(&d) {
        Ok(Ok(_)) => {}
        Ok(Err(name)) if name == "org.cpupool.Manager.Busy" => {}
        other => panic!("root's call during the flood: {other:?}\n{}", d.logs()),
    }
    drift_check_works(&d, "varlink flood");
    let open = test_support::wait::until(WAIT, "connections beyond root's budget to be closed", || {
        let open = flood.iter().filter(|s| !closed(s)).count();
        if open < FLOOD / 2 {
            Ok(open)
        } else {
            Err(format!("{open} of {FLOOD} still open\n{}", d.logs()))
        }
    });
    no_emfile(&d, "varlink flood");
    drop(flood);
    // Once the flood is gone, root is served again.
    test_support::wait::until(WAIT, "root's call to be answered after the flood", || match root_call(&d) {
        Ok(Ok(_)) => Ok(()),
        other => Err(format!("{other:?}")),
    });
    eprintln!("root varlink flood under RLIMIT_NOFILE {LIMIT}: {open} of {FLOOD} idle connections kept");
    no_emfile(&d, "after the varlink flood");
    d.stop();
}

/// Unprivileged uids (65534 is nobody; the others need not exist) holding idle connections.
const UIDS: [u32; 4] = [65534, 65533, 65532, 65531];

/// Opens COUNT idle connections to SOCKET (each connect waits at most 30 s), prints how many it
/// opened, and holds them until its stdin closes.
const HOLDER_PY: &str = r#"
import socket, sys
path, count = sys.argv[1], int(sys.argv[2])
held = []
for _ in range(count):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    try:
        s.connect(path)
    except OSError:
        break
    held.append(s)
print(len(held), flush=True)
sys.stdin.read()
"#;

/// A process of `uid` holding up to `count` idle connections to `socket`, until dropped.
struct Holder(std::process::Child);

impl Holder {
    fn start(uid: u32, socket: &Path, count: usize) -> Holder {
        use std::io::BufRead;
        use std::process::{Command, Stdio};
        let mut child = Command::new("setpriv")
            .args([format!("--reuid={uid}"), format!("--regid={uid}"), "--clear-groups".to_owned()])
            .args(["/usr/bin/python3", "-c", HOLDER_PY])
            .arg(socket)
            .arg(count.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("setpriv python3: {e}"));
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert!(!line.trim().is_empty(), "uid {uid}: the holder said nothing");
        Holder(child)
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        drop(self.0.stdin.take());
        let _ = self.0.wait();
    }
}

#[test]
fn idle_unprivileged_connections_cannot_take_what_root_needs() {
    if !test_support::needs::root("to hold connections as other uids") {
        return;
    }
    const LIMIT: u64 = 64;
    let dir = tempfile::tempdir().unwrap();
    let d = start(dir.path(), LIMIT);
    // 4 uids x 100: the old budgets let them hold 64, all the limit left.
    let holders: Vec<Holder> = UIDS.iter().map(|uid| Holder::start(*uid, &d.varlink, 100)).collect();
    // Root's budget is its own: answered, not Busy.
    match root_call(&d) {
        Ok(Ok(_)) => {}
        other => panic!("root's call during the unprivileged flood: {other:?}\n{}", d.logs()),
    }
    drift_check_works(&d, "unprivileged flood");
    no_emfile(&d, "unprivileged flood");
    drop(holders);
    d.stop();
}
