//! The real `cpupoold` binary on a sandbox host: readiness through a real `NOTIFY_SOCKET`
//! datagram socket (as systemd provides it), reload on SIGHUP, a clean stop on SIGTERM, and a
//! restart that re-applies the state.

use std::fs;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Daemon {
    child: Child,
    notify: UnixDatagram,
}

impl Daemon {
    fn start(sandbox: &Path, extra: &[&str]) -> Daemon {
        let sock = sandbox.with_extension("notify");
        let _ = fs::remove_file(&sock);
        let notify = UnixDatagram::bind(&sock).unwrap_or_else(|e| panic!("{e}"));
        notify.set_read_timeout(Some(test_support::wait::PATIENCE)).unwrap_or_else(|e| panic!("{e}"));
        let child = Command::new(env!("CARGO_BIN_EXE_cpupoold"))
            .arg("--sandbox")
            .arg(sandbox)
            .args(extra)
            // These tests are about the service manager protocol, not D-Bus.
            .args(["--bus", "none"])
            .env("NOTIFY_SOCKET", &sock)
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{e}"));
        Daemon { child, notify }
    }

    /// Waits for a notification containing `what`; returns everything received until then.
    fn wait_for(&self, what: &str) -> String {
        let mut seen = String::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = self
                .notify
                .recv(&mut buf)
                .unwrap_or_else(|e| panic!("waiting for {what}: {e}; got {seen:?}"));
            let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
            seen.push_str(&msg);
            seen.push('\n');
            if msg.lines().any(|l| l == what) {
                return seen;
            }
        }
    }

    fn signal(&self, sig: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, sig).unwrap_or_else(|e| panic!("{e}"));
    }

    fn wait_exit(mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + test_support::wait::PATIENCE;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status;
            }
            assert!(Instant::now() < deadline, "daemon did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // After a failed assertion: do not leave the daemon behind.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn read(p: &Path) -> String {
    fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn ready_reload_stop_and_restart() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let sb = dir.path().join("sb");
    let d = Daemon::start(&sb, &["--topology", "2x8x2:2"]);
    let ready = d.wait_for("READY=1");
    assert!(ready.contains("STATUS=3 pools, 0 assignments"), "{ready}");
    let dp = sb.join("cgroup/cpupool.slice/cpupool-dp.slice/cpuset.cpus");
    assert_eq!(read(&dp), "8-14,24-30");

    // Reload: shrink dp by one core; the CPUs go back to the reserved pool.
    let cfg = sb.join("etc/cpupoold/config.toml");
    fs::write(&cfg, read(&cfg).replace("count = 14", "count = 12")).unwrap_or_else(|e| panic!("{e}"));
    d.signal(nix::sys::signal::Signal::SIGHUP);
    let reload = d.wait_for("READY=1");
    assert!(reload.contains("RELOADING=1"), "{reload}");
    assert_eq!(read(&dp), "8-13,24-29");

    // A broken config is rejected whole; the running pools stay.
    fs::write(&cfg, "[pools.x]\nkind = \"exclusive\"\n").unwrap_or_else(|e| panic!("{e}"));
    d.signal(nix::sys::signal::Signal::SIGHUP);
    let rejected = d.wait_for("READY=1");
    assert!(rejected.contains("configuration on disk rejected"), "{rejected}");
    assert_eq!(read(&dp), "8-13,24-29");

    d.signal(nix::sys::signal::Signal::SIGTERM);
    let stop = d.wait_for("STOPPING=1");
    assert!(stop.contains("STOPPING=1"));
    assert!(d.wait_exit().success());

    // Restart on the same sandbox with the broken config: it refuses to start with an error
    // naming the file and key, and changes nothing.
    let before = read(&dp);
    let out = Command::new(env!("CARGO_BIN_EXE_cpupoold"))
        .arg("--sandbox")
        .arg(&sb)
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("config.toml") && err.contains("pools.x"), "{err}");
    assert_eq!(read(&dp), before);

    // Fixed config, and a cgroup file changed behind the daemon's back: restored at start.
    fs::write(&cfg, "[pools.reserved]\nkind = \"reserved\"\ncount = 2\n\n[pools.dp]\nkind = \"exclusive\"\ncount = 12\nnuma = 1\n")
        .unwrap_or_else(|e| panic!("{e}"));
    fs::write(&dp, "0-31").unwrap_or_else(|e| panic!("{e}"));
    let d = Daemon::start(&sb, &[]);
    d.wait_for("READY=1");
    assert_eq!(read(&dp), "8-13,24-29");
    assert!(!sb.join("cgroup/cpupool.slice/cpupool-web.slice").exists(), "the removed pool's slice is gone");
    d.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(d.wait_exit().success());
}

#[test]
fn damaged_state_refuses_to_start_until_told_to_restore() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let sb = dir.path().join("sb");
    let d = Daemon::start(&sb, &["--topology", "1x4x2:1"]);
    d.wait_for("READY=1");
    d.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(d.wait_exit().success());
    // Second run writes state.json.prev.
    let d = Daemon::start(&sb, &[]);
    d.wait_for("READY=1");
    d.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(d.wait_exit().success());

    let state = sb.join("state/state.json");
    let mut bytes = fs::read(&state).unwrap_or_default();
    let last = bytes.len() - 2;
    bytes[last] ^= 0x20;
    fs::write(&state, &bytes).unwrap_or_else(|e| panic!("{e}"));
    let out = Command::new(env!("CARGO_BIN_EXE_cpupoold")).arg("--sandbox").arg(&sb).output();
    let out = out.unwrap_or_else(|e| panic!("{e}"));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("state.json") && err.contains("--restore-previous-state"), "{err}");
    assert_eq!(fs::read(&state).unwrap_or_default(), bytes, "the damaged file is left alone");

    let d = Daemon::start(&sb, &["--restore-previous-state"]);
    d.wait_for("READY=1");
    assert!(sb.join("state/state.json.corrupt").exists());
    d.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(d.wait_exit().success());
}

/// `Reload` over varlink (what `cpupoolctl reload` calls) tells the service manager as SIGHUP
/// does: RELOADING=1 with the time, then READY=1 with the new status, before the reply.
#[test]
fn reload_over_varlink_notifies_reloading_then_ready() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let sb = dir.path().join("sb");
    let d = Daemon::start(&sb, &["--topology", "1x4x2:1"]);
    d.wait_for("READY=1");
    let mut conn = std::os::unix::net::UnixStream::connect(sb.join("run/org.cpupool.Manager"))
        .unwrap_or_else(|e| panic!("{e}"));
    conn.write_all(b"{\"method\":\"org.cpupool.Manager.Reload\",\"parameters\":{}}\0")
        .unwrap_or_else(|e| panic!("{e}"));
    let mut reply = Vec::new();
    let mut byte = [0u8; 1];
    while conn.read(&mut byte).unwrap_or_else(|e| panic!("{e}")) == 1 && byte[0] != 0 {
        reply.push(byte[0]);
    }
    assert_eq!(
        String::from_utf8_lossy(&reply),
        "{\"parameters\":{\"changed\":false,\"summary\":\"nothing changed\"}}"
    );
    let seen = d.wait_for("READY=1");
    let reloading = seen.find("RELOADING=1").unwrap_or_else(|| panic!("no RELOADING=1: {seen}"));
    assert!(seen[reloading..].contains("MONOTONIC_USEC="), "{seen}");
    assert!(seen.contains("STATUS=3 pools, 0 assignments"), "{seen}");
    d.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(d.wait_exit().success());
}

/// An assignment made behind the core's back, as a hand edit or a faulty release would.
fn crafted(id: &str, cpus: &str) -> cpupoold::core::state::Assignment {
    use cpupoold::core::state::{Assignment, AssignmentId, Target};
    let cpus = cpupoold::core::cpuset::CpuSet::parse(cpus).unwrap_or_else(|e| panic!("{e}"));
    Assignment {
        id: AssignmentId::new(id).unwrap_or_else(|e| panic!("{e}")),
        pool: cpupoold::core::pool::PoolName::new("dp").unwrap_or_else(|e| panic!("{e}")),
        kind: cpupoold::core::pool::PoolKind::Exclusive,
        target: Target::parse(&format!("cgroup:{id}")).unwrap_or_else(|e| panic!("{e}")),
        millicpus: cpus.len() as u64 * 1000,
        cpus,
        reclaim: true,
        process_start: None,
        container: None,
    }
}

#[test]
fn inconsistent_state_refuses_to_start_naming_file_and_assignments() {
    use cpupoold::core::state::{Delta, State, StateData};
    use cpupoold::host::store::{Loaded, Store};
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let sb = dir.path().join("sb");
    let d = Daemon::start(&sb, &["--topology", "1x4x2:1"]);
    d.wait_for("READY=1");
    d.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(d.wait_exit().success());

    // Two exclusive assignments owning the same core, in a file with a valid checksum (the
    // store's own save writes it); the state before it becomes the previous good copy.
    let store = Store::open(&sb.join("state")).unwrap_or_else(|e| panic!("{e}"));
    let loaded = store.load(|s: &mut State, d: Delta| s.apply(d));
    let Ok(Loaded::State(state)) = loaded else { panic!("no state") };
    let mut data = StateData::from(state);
    let dp = data.pools.keys().find(|p| p.as_str() == "dp").cloned();
    let cpus = dp.and_then(|p| data.pools.get(&p)).map(|p| p.cpus.to_string()).unwrap_or_default();
    let first_core = cpus.split([',', '-']).next().unwrap_or_default().to_owned();
    for a in [crafted("app-x", &first_core), crafted("app-y", &first_core)] {
        data.assignments.insert(a.id.clone(), a);
    }
    store.save(&data).unwrap_or_else(|e| panic!("{e}"));
    let state = sb.join("state/state.json");
    let bytes = fs::read(&state).unwrap_or_default();

    let out = Command::new(env!("CARGO_BIN_EXE_cpupoold")).arg("--sandbox").arg(&sb).output();
    let out = out.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("`{}` has a valid checksum", state.display())), "{err}");
    assert!(err.contains(&format!("assignments `app-x` and `app-y` both own CPUs {first_core}")), "{err}");
    assert!(err.contains("--restore-previous-state") && err.contains("cpupoold(8)"), "{err}");
    assert_eq!(fs::read(&state).unwrap_or_default(), bytes, "the file is left alone");

    let d = Daemon::start(&sb, &["--restore-previous-state"]);
    let ready = d.wait_for("READY=1");
    assert!(ready.contains("0 assignments"), "{ready}");
    assert_eq!(fs::read(sb.join("state/state.json.corrupt")).unwrap_or_default(), bytes);
    d.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(d.wait_exit().success());
}

/// Ctrl-C in the sandbox's terminal goes to its whole process group: the daemon and the private
/// bus it started. The bus may be gone before the daemon lets go of its name, and with the bus
/// went the name: the daemon stops cleanly without a warning about it. The bus is killed first
/// here, so that the daemon always finds it gone.
#[test]
fn ctrl_c_on_the_sandbox_stops_without_blaming_the_bus() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let sb = dir.path().join("sb");
    let log = dir.path().join("daemon.log");
    let logs = || fs::read_to_string(&log).unwrap_or_default();
    // `setsid`: a process group of its own, as a shell gives a foreground job.
    let test_support::daemon::Spawned { mut child, ready, banner, .. } = test_support::daemon::spawn_wrapped(
        &["setsid"],
        Path::new(env!("CARGO_BIN_EXE_cpupoold")),
        &sb,
        "1x4x2:1",
        &[],
        &[],
        &log,
    );
    let group = Pid::from_raw(-i32::try_from(child.id()).unwrap_or(i32::MAX));
    let _stop = Group(group);
    assert!(ready, "no READY:\n{banner}\n{}", logs());
    assert!(banner.contains("dbus      unix:path="), "{banner}");
    let bus = test_support::daemon::bus_daemons(&sb);
    assert_eq!(bus.len(), 1, "{bus:?}");
    kill(Pid::from_raw(bus[0]), Signal::SIGKILL).unwrap_or_else(|e| panic!("{e}"));
    test_support::wait::until(test_support::wait::PATIENCE, "the bus to be gone", || {
        match std::os::unix::net::UnixStream::connect(sb.join("run/bus.sock")) {
            Ok(_) => Err("the bus still accepts".to_owned()),
            Err(_) => Ok(()),
        }
    });
    kill(group, Signal::SIGINT).unwrap_or_else(|e| panic!("{e}"));
    let deadline = Instant::now() + test_support::wait::PATIENCE;
    let status = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break status;
        }
        assert!(Instant::now() < deadline, "the daemon did not stop on SIGINT:\n{}", logs());
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}:\n{}", logs());
    let logged = logs();
    assert!(logged.contains("SIGINT: stopping"), "{logged}");
    // zbus itself may warn that the bus closed under it: that is the bus's death, said as it
    // happened. The daemon's own stop has nothing to add.
    let complaints: Vec<&str> = logged
        .lines()
        .filter(|l| (l.contains("warning") || l.contains("error")) && !l.contains("[zbus::"))
        .collect();
    assert!(complaints.is_empty(), "a clean stop complained:\n{}", complaints.join("\n"));
}

/// Kills what is left of a process group when a test ends early.
struct Group(nix::unistd::Pid);

impl Drop for Group {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(self.0, nix::sys::signal::Signal::SIGKILL);
    }
}
