//! The varlink API of the real `cpupoold` binary on a sandbox host, driven by the reference
//! third-party client (`python3 -m varlink.cli`, PyPI package `varlink`): introspection, reads,
//! an assignment applied to a cgroup and released, typed errors, authorization of an
//! unprivileged caller, and a monitor stream. Each test stops the daemon with SIGTERM and
//! expects a clean exit.
//!
//! The tests need the PyPI `varlink` package (`test_support::needs`: they fail without it, or skip
//! with `CPUPOOL_TESTS_MAY_SKIP=1`).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

mod common;

use common::{Daemon, Varlink};
use serde_json::{json, Value};

const IFACE: &str = "org.cpupool.Manager";

fn have_python_varlink() -> bool {
    test_support::needs::python_varlink()
}

/// Runs `python3 -m varlink.cli ARGS`, optionally under another command (`setpriv ...`).
fn cli(wrapper: &[&str], python: &str, env: &[(&str, &str)], args: &[&str]) -> Output {
    let (prog, rest) = match wrapper.split_first() {
        Some((p, r)) => (*p, r),
        None => (python, &[][..]),
    };
    let mut cmd = Command::new(prog);
    cmd.args(rest);
    if !wrapper.is_empty() {
        cmd.arg(python);
    }
    cmd.args(["-m", "varlink.cli"]).args(args).envs(env.iter().copied());
    cmd.output().unwrap_or_else(|e| panic!("running the varlink cli: {e}"))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Calls a method; `Ok(reply parameters)` or `Err(the client's stderr)`, which names the error.
fn call_as(
    d: &Daemon,
    wrapper: &[&str],
    python: &str,
    env: &[(&str, &str)],
    method: &str,
    params: Value,
) -> Result<Value, String> {
    let target = format!("{}/{IFACE}.{method}", d.address());
    let out = cli(wrapper, python, env, &["call", &target, &params.to_string()]);
    let stdout = text(&out.stdout);
    if stdout.trim().is_empty() {
        Err(format!("{}{}", text(&out.stderr), stdout))
    } else {
        serde_json::from_str(&stdout).map_err(|e| panic!("{method}: {e}: {stdout}"))
    }
}

fn call(d: &Daemon, method: &str, params: Value) -> Result<Value, String> {
    call_as(d, &[], "python3", &[], method, params)
}

fn ok(d: &Daemon, method: &str, params: Value) -> Value {
    call(d, method, params).unwrap_or_else(|e| panic!("{method}: {e}\n{}", d.logs()))
}

fn pools(d: &Daemon) -> Value {
    ok(d, "ListPools", json!({}))["pools"].clone()
}

fn pool<'a>(pools: &'a Value, name: &str) -> &'a Value {
    pools
        .as_array()
        .and_then(|a| a.iter().find(|p| p["name"] == name))
        .unwrap_or_else(|| panic!("no pool {name} in {pools}"))
}

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn introspection_reads_assign_release_and_errors() {
    if !have_python_varlink() {
        return;
    }
    let dir = tempdir();
    let d = Daemon::start_sample(dir.path(), &["--bus", "none"]);

    let info = cli(&[], "python3", &[], &["info", &d.address()]);
    let info_text = text(&info.stdout);
    assert!(
        info_text.contains("Product: cpupoold") && info_text.contains(IFACE),
        "{info_text}{}",
        text(&info.stderr)
    );

    // The client fetches and parses the IDL; it prints it back.
    let help = cli(&[], "python3", &[], &["help", &format!("{}/{IFACE}", d.address())]);
    let help_text = text(&help.stdout);
    assert!(help_text.contains("interface org.cpupool.Manager"), "{help_text}{}", text(&help.stderr));
    assert!(help_text.contains("method Assign(") && help_text.contains("error NoSuchPool"), "{help_text}");

    let before = pools(&d);
    assert_eq!(before.as_array().map(Vec::len), Some(3), "{before}");
    let dp = pool(&before, "dp");
    assert_eq!(
        (dp["kind"].as_str(), dp["free_millicpus"].as_u64(), dp["isolated"].as_bool()),
        (Some("exclusive"), Some(2000), Some(true))
    );
    assert_eq!(pool(&before, "reserved")["cpus"], "0,4");
    let topo = ok(&d, "GetTopology", json!({}));
    assert_eq!((topo["online"].as_str(), topo["cpus"].as_array().map(Vec::len)), (Some("0-7"), Some(8)));
    let status = ok(&d, "Status", json!({}));
    assert_eq!((status["pools"].as_u64(), status["assignments"].as_u64()), (Some(3), Some(0)), "{status}");
    assert!(
        status["state_file"].as_str().is_some_and(|s| s.starts_with(&*d.sb.to_string_lossy())),
        "{status}"
    );

    // Assign a core of dp to a cgroup; the daemon writes its cpuset.cpus.
    let cg = d.sb.join("cgroup/cpupool.slice/cpupool-dp.slice/app");
    fs::create_dir_all(&cg).unwrap_or_else(|e| panic!("{e}"));
    let a = ok(&d, "Assign", json!({ "pool": "dp", "target": "cgroup:cpupool.slice/cpupool-dp.slice/app", "cpus": 2, "id": "app-1" }))
        ["assignment"]
        .clone();
    assert_eq!(
        (a["id"].as_str(), a["pool"].as_str(), a["millicpus"].as_u64()),
        (Some("app-1"), Some("dp"), Some(2000)),
        "{a}"
    );
    assert_eq!(a["target"], "cgroup:cpupool.slice/cpupool-dp.slice/app");
    let cpus = a["cpus"].as_str().unwrap_or_default().to_owned();
    assert_eq!(fs::read_to_string(cg.join("cpuset.cpus")).unwrap_or_default().trim(), cpus);
    // An idempotent repeat answers the same assignment.
    let again = ok(
        &d,
        "Assign",
        json!({ "pool": "dp", "target": "cgroup:cpupool.slice/cpupool-dp.slice/app", "cpus": 2, "id": "app-1" }),
    );
    assert_eq!(again["assignment"], a);
    let listed = ok(&d, "ListAssignments", json!({ "pool": "dp" }));
    assert_eq!(listed["assignments"], json!([a]));
    assert_eq!(ok(&d, "GetAssignment", json!({ "id": "app-1" }))["assignment"], a);
    let after = pools(&d);
    assert_eq!(
        (pool(&after, "dp")["free_millicpus"].as_u64(), pool(&after, "dp")["assignments"].as_u64()),
        (Some(0), Some(1))
    );

    // Errors come back by name, and change nothing.
    let e = call(
        &d,
        "Assign",
        json!({ "pool": "nope", "target": "cgroup:cpupool.slice/cpupool-dp.slice/other", "cpus": 1 }),
    );
    assert!(
        e.as_ref().is_err_and(|e| e.contains("org.cpupool.Manager.NoSuchPool") && e.contains("nope")),
        "{e:?}"
    );
    let e = call(
        &d,
        "Assign",
        json!({ "pool": "dp", "target": "cgroup:cpupool.slice/cpupool-dp.slice/other", "cpus": 2 }),
    );
    assert!(e.as_ref().is_err_and(|e| e.contains("org.cpupool.Manager.InsufficientCapacity")), "{e:?}");
    let e = call(&d, "GetPool", json!({ "name": "nope" }));
    assert!(e.as_ref().is_err_and(|e| e.contains("org.cpupool.Manager.NoSuchPool")), "{e:?}");
    let e = call(&d, "Release", json!({ "id": "nope" }));
    assert!(e.as_ref().is_err_and(|e| e.contains("org.cpupool.Manager.NoSuchAssignment")), "{e:?}");
    let e =
        call(&d, "Assign", json!({ "pool": "dp", "target": "cgroup:cpupool.slice/cpupool-dp.slice/other" }));
    assert!(e.as_ref().is_err_and(|e| e.contains("org.cpupool.Manager.InvalidArgument")), "{e:?}");
    assert_eq!(pools(&d), after);
    assert_eq!(ok(&d, "Status", json!({}))["assignments"], 1);

    let released = ok(&d, "Release", json!({ "id": "app-1" }));
    assert_eq!(released["assignment"], a);
    assert_eq!(pools(&d), before);
    assert_eq!(ok(&d, "ListAssignments", json!({}))["assignments"], json!([]));
    assert_ne!(
        fs::read_to_string(cg.join("cpuset.cpus")).unwrap_or_default().trim(),
        cpus,
        "the cgroup kept the exclusive CPUs"
    );

    d.stop();
}

/// A python interpreter and `PYTHONPATH` with which `nobody` can run the varlink client:
/// the package is copied into `dir` (the installed one may sit under root's home).
fn python_for_nobody(dir: &Path, setpriv: &[&str]) -> Option<(String, PathBuf)> {
    let out = Command::new("python3")
        .args([
            "-c",
            "import sys, os, varlink; print(sys.executable); print(os.path.dirname(varlink.__file__))",
        ])
        .output()
        .ok()?;
    let out = text(&out.stdout);
    let mut lines = out.lines();
    let (exe, pkg) = (lines.next()?.to_owned(), PathBuf::from(lines.next()?));
    let lib = dir.join("pylib");
    let dest = lib.join("varlink");
    fs::create_dir_all(&dest).ok()?;
    for entry in fs::read_dir(&pkg).ok()? {
        let p = entry.ok()?.path();
        if p.is_file() {
            fs::copy(&p, dest.join(p.file_name()?)).ok()?;
        }
    }
    for python in [exe.as_str(), "/usr/bin/python3", "/bin/python3"] {
        let works = Command::new(setpriv[0])
            .args(&setpriv[1..])
            .args([python, "-c", "import varlink"])
            .env("PYTHONPATH", &lib)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if works {
            return Some((python.to_owned(), lib));
        }
    }
    None
}

#[test]
fn unprivileged_callers_may_read_but_not_assign() {
    if !have_python_varlink() {
        return;
    }
    if !test_support::needs::root("to run a client as another user with setpriv") {
        return;
    }
    let dir = tempdir();
    // nobody must reach the socket through the temp dir.
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap_or_else(|e| panic!("{e}"));
    let setpriv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"];
    let Some((python, lib)) = python_for_nobody(dir.path(), &setpriv) else {
        test_support::needs::unavailable(
            "a python3 with the varlink package that user nobody can run",
            "install varlink for the system python3 (`python3 -m pip install --break-system-packages varlink`)",
        );
        return;
    };
    let d = Daemon::start_sample(dir.path(), &["--bus", "none"]);
    let lib = lib.to_string_lossy().into_owned();
    let env = [("PYTHONPATH", lib.as_str())];

    let read = call_as(&d, &setpriv, &python, &env, "ListPools", json!({}));
    assert_eq!(read.as_ref().ok().map(|r| r["pools"].as_array().map(Vec::len)), Some(Some(3)), "{read:?}");
    let before = pools(&d);
    let denied = call_as(
        &d,
        &setpriv,
        &python,
        &env,
        "Assign",
        json!({ "pool": "web", "target": "cgroup:cpupool.slice/cpupool-web.slice/denied", "millicpus": 500 }),
    );
    assert!(
        denied.as_ref().is_err_and(|e| e.contains("org.cpupool.Manager.AccessDenied") && e.contains("65534")),
        "{denied:?}"
    );
    let denied = call_as(&d, &setpriv, &python, &env, "Release", json!({ "id": "whatever" }));
    assert!(denied.as_ref().is_err_and(|e| e.contains("org.cpupool.Manager.AccessDenied")), "{denied:?}");
    assert_eq!(pools(&d), before);
    assert_eq!(ok(&d, "Status", json!({}))["assignments"], 0);

    d.stop();
}

#[test]
fn monitor_streams_changes() {
    if !have_python_varlink() {
        return;
    }
    let dir = tempdir();
    let d = Daemon::start_sample(dir.path(), &["--bus", "none"]);
    // Killed and reaped however the test ends.
    let mut mon = test_support::daemon::Reaped(
        Command::new("python3")
            .args([
                "-u",
                "-m",
                "varlink.cli",
                "call",
                "--more",
                &format!("{}/{IFACE}.Monitor", d.address()),
                "{}",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{e}")),
    );
    let stdout = mon.stdout.take().unwrap_or_else(|| panic!("no stdout"));
    let (tx, rx) = mpsc::channel::<Value>();
    // The client prints each reply as a JSON document as it arrives.
    let reader = std::thread::spawn(move || {
        for v in serde_json::Deserializer::from_reader(stdout).into_iter::<Value>() {
            let Ok(v) = v else { break };
            if tx.send(v).is_err() {
                break;
            }
        }
    });
    let next = |what: &str| {
        rx.recv_timeout(test_support::wait::PATIENCE)
            .unwrap_or_else(|e| panic!("waiting for {what}: {e}\n{}", d.logs()))
    };
    // The replay of the current pools says the subscription is live.
    let mut replay = Vec::new();
    for _ in 0..3 {
        let ev = next("the replay")["event"].clone();
        assert_eq!((ev["kind"].as_str(), ev["change"].as_str()), (Some("pool"), Some("current")), "{ev}");
        replay.push(ev["pool"].as_str().unwrap_or_default().to_owned());
    }
    assert_eq!(replay, ["dp", "reserved", "web"]);

    fs::create_dir_all(d.sb.join("cgroup/cpupool.slice/cpupool-web.slice/mon"))
        .unwrap_or_else(|e| panic!("{e}"));
    let a = ok(
        &d,
        "Assign",
        json!({ "pool": "web", "target": "cgroup:cpupool.slice/cpupool-web.slice/mon", "millicpus": 250, "id": "mon-1" }),
    );
    assert_eq!(a["assignment"]["millicpus"], 250);
    assert_eq!(
        next("assignment added")["event"],
        json!({ "kind": "assignment", "id": "mon-1", "change": "added" })
    );
    assert_eq!(next("pool changed")["event"], json!({ "kind": "pool", "pool": "web", "change": "changed" }));
    ok(&d, "Release", json!({ "id": "mon-1" }));
    assert_eq!(
        next("assignment removed")["event"],
        json!({ "kind": "assignment", "id": "mon-1", "change": "removed" })
    );
    assert_eq!(next("pool changed")["event"], json!({ "kind": "pool", "pool": "web", "change": "changed" }));

    // Stopping the daemon with a monitor attached still exits cleanly.
    d.stop();
    let _ = mon.kill();
    let _ = mon.wait();
    let _ = reader.join();
}

/// Socket activation: `systemd-socket-activate` (from systemd) binds the socket and starts the
/// daemon on the first connection, passing the listener; the daemon serves it and binds none.
#[test]
fn socket_activation_serves_the_passed_socket() {
    use std::io::{BufRead, BufReader};
    let dir = tempdir();
    let sock = dir.path().join("activated.sock");
    let sb = dir.path().join("sb");
    let mut child = test_support::daemon::Reaped(
        Command::new("systemd-socket-activate")
            .arg("--listen")
            .arg(&sock)
            .arg(env!("CARGO_BIN_EXE_cpupoold"))
            .arg("--sandbox")
            .arg(&sb)
            .args(["--topology", "1x4x2:1", "--bus", "none"])
            .env_remove("NOTIFY_SOCKET")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("systemd-socket-activate (package systemd): {e}")),
    );
    // It listens before it forks: wait for the socket by connecting, as a client would.
    let mut client = loop {
        if let Ok(c) = std::os::unix::net::UnixStream::connect(&sock) {
            break c;
        }
        assert!(child.try_wait().ok().flatten().is_none(), "systemd-socket-activate exited");
        std::thread::yield_now();
    };
    use std::io::{Read, Write};
    client
        .write_all(b"{\"method\":\"org.cpupool.Manager.Status\",\"parameters\":{}}\0")
        .unwrap_or_else(|e| panic!("{e}"));
    let mut reply = Vec::new();
    let mut byte = [0u8; 1];
    while client.read(&mut byte).unwrap_or(0) == 1 && byte[0] != 0 {
        reply.push(byte[0]);
    }
    let reply: Value = serde_json::from_slice(&reply).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(reply["parameters"]["pools"], 3, "{reply}");
    let mut banner = String::new();
    for line in BufReader::new(child.stdout.take().unwrap_or_else(|| panic!("stdout"))).lines() {
        let line = line.unwrap_or_else(|e| panic!("{e}"));
        banner.push_str(&line);
        banner.push('\n');
        if line == "READY" {
            break;
        }
    }
    assert!(banner.contains(&format!("varlink   unix:{}", sock.display())), "{banner}");
    assert!(!sb.join("run/org.cpupool.Manager").exists(), "no socket of its own");
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap_or_else(|e| panic!("{e}"));
    let status = child.wait().unwrap_or_else(|e| panic!("{e}"));
    assert!(status.success(), "{status}");
}

/// Past `Limits::PRIVILEGED` (128) open connections of privileged peers (the test runs as root or
/// the sandbox's owner), another one is answered `Busy` and closed; once one closes, a new
/// connection is served again. (Unprivileged peers' budgets: tests/dos.rs.)
#[test]
fn too_many_connections_get_busy_and_the_daemon_recovers() {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;
    fn call(s: &mut UnixStream) -> Value {
        // A refused connection is answered Busy and closed at once, possibly before the request
        // is written (EPIPE): the answer is still there to read.
        let _ = s.write_all(b"{\"method\":\"org.varlink.service.GetInfo\",\"parameters\":{}}\0");
        let mut reply = Vec::new();
        let mut byte = [0u8; 1];
        while s.read(&mut byte).unwrap_or(0) == 1 && byte[0] != 0 {
            reply.push(byte[0]);
        }
        serde_json::from_slice(&reply).unwrap_or(Value::Null)
    }
    let dir = tempdir();
    let d = Daemon::start_sample(dir.path(), &["--bus", "none"]);
    // Each answered call proves its connection was accepted and counted.
    let mut open: Vec<UnixStream> = (0..cpupoold::api::varlink::Limits::PRIVILEGED)
        .map(|i| {
            let mut s = UnixStream::connect(&d.varlink).unwrap_or_else(|e| panic!("{i}: {e}"));
            assert_eq!(call(&mut s)["parameters"]["product"], "cpupoold", "connection {i}");
            s
        })
        .collect();
    let mut extra = UnixStream::connect(&d.varlink).unwrap_or_else(|e| panic!("{e}"));
    let reply = call(&mut extra);
    assert_eq!(reply["error"], "org.cpupool.Manager.Busy", "{reply}");
    open.pop();
    // The server notices the closed connection when it reads EOF; retry until it has.
    let served = (0..1000).find_map(|_| {
        let mut s = UnixStream::connect(&d.varlink).ok()?;
        let r = call(&mut s);
        (r["parameters"]["product"] == "cpupoold").then_some(r)
    });
    assert!(served.is_some(), "never served again after a connection closed");
    drop(open);
    d.stop();
}

/// Makes the sandbox's IRQ 32 fire `n` more times on CPU 1 (`DIR/proc/interrupts`).
fn fire_irq_32_on_cpu_1(sb: &Path, total: u64) {
    let counts = std::collections::BTreeMap::from([(("32", 1u32), total)]);
    let text = cpupoold::sim::machine::interrupts_text(&(0..8).collect::<Vec<u32>>(), &counts);
    fs::write(sb.join("proc/interrupts"), text).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn get_isolation_through_the_third_party_client() {
    if !have_python_varlink() {
        return;
    }
    let dir = tempdir();
    // The sample: reserved 0,4; dp 1,5 isolated; web the rest.
    let d = Daemon::start_sample(dir.path(), &["--bus", "none", "--health-interval", "1"]);
    let reply = ok(&d, "GetIsolation", json!({}));
    assert_eq!(reply["housekeeping"], "0,4", "{reply}");
    assert_eq!(reply["isolcpus"], "", "{reply}");
    // Unbound work leaves the isolated CPUs only.
    assert_eq!(reply["workqueue"], "0,2-4,6-7 (cpupoold)", "{reply}");
    let pools = reply["pools"].as_array().cloned().unwrap_or_default();
    assert_eq!(pools.len(), 1, "only dp is isolated: {reply}");
    let dp = &pools[0];
    assert_eq!((dp["pool"].as_str(), dp["cpus"].as_str()), (Some("dp"), Some("1,5")), "{dp}");
    // The sandbox's eight movable IRQs and seven movable kernel threads left 1,5; IRQ 41 is
    // managed and sits on CPU 1.
    assert_eq!(dp["irqs"], "8 moved off 1,5 (1, 8, 9, 24, 25, ...); 1 placed by the kernel (41)", "{dp}");
    assert_eq!(dp["kthreads"], "7 moved off 1,5", "{dp}");
    let on_reserved = fs::read_dir(d.sb.join("proc/irq"))
        .unwrap_or_else(|e| panic!("{e}"))
        .filter_map(Result::ok)
        .filter(|e| fs::read_to_string(e.path().join("smp_affinity_list")).is_ok_and(|t| t.trim() == "0,4"))
        .count();
    assert_eq!(on_reserved, 8, "the count is what the files hold");
    // The same pool by name; a pool that is not isolated has none; an unknown one is an error.
    // Only what does not come from the health sample is compared: a sample (every second
    // here) may land between the two calls and change state, summary and the rates.
    let placement = |v: &serde_json::Value| {
        let p = &v["pools"][0];
        (p["pool"].clone(), p["cpus"].clone(), p["irqs"].clone(), p["kthreads"].clone())
    };
    let by_name = ok(&d, "GetIsolation", json!({ "pool": "dp" }));
    assert_eq!(by_name["pools"].as_array().map(Vec::len), Some(1), "{by_name}");
    assert_eq!(placement(&by_name), placement(&reply), "{by_name}");
    assert_eq!(ok(&d, "GetIsolation", json!({ "pool": "web" }))["pools"], json!([]));
    let e = call(&d, "GetIsolation", json!({ "pool": "nope" })).err().unwrap_or_default();
    assert!(e.contains("NoSuchPool"), "{e}");

    // IRQ 32 fires on CPU 1 (someone pinned it there): the next samples name it.
    let mut total = 0;
    let deadline = std::time::Instant::now() + test_support::wait::PATIENCE;
    let dp = loop {
        total += 500;
        fire_irq_32_on_cpu_1(&d.sb, total);
        let dp = ok(&d, "GetIsolation", json!({ "pool": "dp" }))["pools"][0].clone();
        if dp["state"] == "leaks" {
            break dp;
        }
        assert!(std::time::Instant::now() < deadline, "never measured a leak: {dp}\n{}", d.logs());
        std::thread::sleep(Duration::from_millis(100));
    };
    let summary = dp["summary"].as_str().unwrap_or_default();
    assert!(summary.contains("IRQ/s from irq 32 virtio1-requests on CPU 1"), "{dp}");
    let cpu1 = &dp["per_cpu"][0];
    assert_eq!(cpu1["cpu"], 1, "{dp}");
    assert!(cpu1["device_irqs_per_sec"].as_f64().unwrap_or(0.0) > 0.0, "{dp}");
    assert!(cpu1["sources"].as_str().unwrap_or_default().starts_with("32 virtio1-requests "), "{dp}");
    assert_eq!(dp["per_cpu"][1]["device_irqs_per_sec"], 0.0, "CPU 5: {dp}");
    d.stop();
}

/// The sandbox's noise counters as the kernel would print them after `n` rounds: CPU 1 takes
/// RCU softirqs and function-call IPIs, CPU 5 switches tasks in; nothing else moves.
fn noise_moves(sb: &Path, n: u64) {
    let cpus: Vec<u32> = (0..8).collect();
    let soft = std::collections::BTreeMap::from([(("RCU", 1u32), 70 * n)]);
    fs::write(sb.join("proc/softirqs"), cpupoold::sim::machine::softirqs_text(&cpus, &soft))
        .unwrap_or_else(|e| panic!("{e}"));
    let switches = std::collections::BTreeMap::from([(5u32, 3 * n)]);
    fs::write(sb.join("proc/schedstat"), cpupoold::sim::machine::schedstat_text(&cpus, &switches))
        .unwrap_or_else(|e| panic!("{e}"));
    let irqs = std::collections::BTreeMap::from([(("CAL", 1u32), 200 * n)]);
    fs::write(sb.join("proc/interrupts"), cpupoold::sim::machine::interrupts_text(&cpus, &irqs))
        .unwrap_or_else(|e| panic!("{e}"));
}

/// Each isolated CPU's interruptions by source, and the boot isolation against the pools, as
/// the third-party client reads them: the kernel was booted with `nohz_full=1,3 rcu_nocbs=1
/// isolcpus=managed_irq,1`, so the isolated pool dp (1,5) is covered on CPU 1 only and CPU 3
/// (the shared pool's) is isolated for nothing.
#[test]
fn get_isolation_reports_noise_by_source_and_the_boot_coverage() {
    if !have_python_varlink() {
        return;
    }
    let dir = tempdir();
    fs::create_dir_all(dir.path().join("sb/proc")).unwrap_or_else(|e| panic!("{e}"));
    fs::write(
        dir.path().join("sb/proc/cmdline"),
        "BOOT_IMAGE=/boot/vmlinuz-6.12.0-0.deb12.1-amd64 root=/dev/vda1 ro nohz_full=1,3 rcu_nocbs=1 isolcpus=managed_irq,1 quiet\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let d = Daemon::start_sample(
        dir.path(),
        &["--bus", "none", "--health-interval", "1", "--check-interval", "1"],
    );
    let reply = ok(&d, "GetIsolation", json!({}));
    assert_eq!(reply["boot_line"], "nohz_full=1,5 rcu_nocbs=1,5 isolcpus=managed_irq,1,5", "{reply}");
    assert_eq!(
        (reply["nohz_full"].as_str(), reply["rcu_nocbs"].as_str()),
        (Some("1,3"), Some("1")),
        "{reply}"
    );
    assert_eq!(reply["boot_unused"], "3", "{reply}");
    assert_eq!(
        reply["pools"][0]["boot"], "nohz_full= misses 5; rcu_nocbs= misses 5; isolcpus=managed_irq misses 5",
        "{reply}"
    );
    let logs = d.logs();
    assert!(logs.contains("boot isolation: isolated pool dp (1,5): nohz_full= misses 5;"), "{logs}");
    assert!(logs.contains("boot isolation: CPUs 3 are isolated at boot"), "{logs}");
    // A reload says it again, though nothing changed: at the next pass that reads the layout
    // (the drift check, every second here).
    let said = |logs: &str| logs.matches("boot isolation: isolated pool dp (1,5)").count();
    assert_eq!(said(&logs), 1, "{logs}");
    ok(&d, "Reload", json!({}));
    let deadline = std::time::Instant::now() + test_support::wait::PATIENCE;
    while said(&d.logs()) < 2 {
        assert!(std::time::Instant::now() < deadline, "not said again after the reload:\n{}", d.logs());
        std::thread::sleep(Duration::from_millis(100));
    }

    // The counters move; the first interval that saw them is read whole.
    let deadline = std::time::Instant::now() + test_support::wait::PATIENCE;
    let mut n = 0;
    let dp = loop {
        n += 1;
        noise_moves(&d.sb, n);
        let dp = ok(&d, "GetIsolation", json!({ "pool": "dp" }))["pools"][0].clone();
        // The files are written one after the other and read so too: wait for an interval
        // that saw all three move.
        let moved = |cpu: usize, source: &str| {
            let noise = dp["per_cpu"][cpu]["noise"].as_array().cloned().unwrap_or_default();
            noise.iter().any(|x| x["source"] == source && x["per_sec"].as_f64() > Some(0.0))
        };
        if moved(0, "softirq:RCU") && moved(0, "ipi:CAL") && moved(1, "sched:switched_in") {
            break dp;
        }
        assert!(std::time::Instant::now() < deadline, "never measured the softirqs: {dp}\n{}", d.logs());
        std::thread::sleep(Duration::from_millis(100));
    };
    let rates = |i: usize| -> std::collections::BTreeMap<String, f64> {
        let noise = dp["per_cpu"][i]["noise"].as_array().cloned().unwrap_or_default();
        noise
            .iter()
            .map(|x| (x["source"].as_str().unwrap_or("?").to_owned(), x["per_sec"].as_f64().unwrap_or(-1.0)))
            .collect()
    };
    let (one, five) = (rates(0), rates(1));
    assert_eq!(
        (dp["per_cpu"][0]["cpu"].as_u64(), dp["per_cpu"][1]["cpu"].as_u64()),
        (Some(1), Some(5)),
        "{dp}"
    );
    let mut sources: Vec<String> =
        cpupoold::sim::machine::SOFTIRQS.iter().map(|s| format!("softirq:{s}")).collect();
    sources.extend(["device", "ipi:CAL", "sched:switched_in", "timer:LOC"].map(str::to_owned));
    sources.sort();
    assert_eq!(one.keys().cloned().collect::<Vec<_>>(), sources, "every source, zeros included: {dp}");
    assert_eq!(five.keys().cloned().collect::<Vec<_>>(), sources, "{dp}");
    // What moved on one CPU is not seen on the other.
    assert!(dp["per_cpu"][0]["ipis_per_sec"].as_f64() > Some(0.0), "{dp}");
    assert_eq!((five["softirq:RCU"], five["ipi:CAL"], one["sched:switched_in"]), (0.0, 0.0, 0.0), "{dp}");
    for (source, rate) in one.iter().chain(five.iter()) {
        if !["softirq:RCU", "ipi:CAL", "sched:switched_in"].contains(&source.as_str()) {
            assert_eq!(*rate, 0.0, "{source}: {dp}");
        }
    }
    d.stop();
}

/// 64 clients calling `ListAssignments` at once all get the whole reply, the same one (it is
/// encoded once per snapshot and written to each client from one buffer), and the third-party
/// client parses it; a list made right after an `Assign` or `Release` returns shows it.
#[test]
fn concurrent_lists_are_whole_and_identical_and_follow_each_change() {
    let dir = tempdir();
    let d = Daemon::start(dir.path(), &[]);
    let mut v = Varlink::connect(&d.varlink);
    // Targets of ~2.8 KB make the reply (~290 KB) larger than a unix socket's send buffer, so
    // the writes to the 64 clients are partial and interleave.
    let deep: Vec<String> = (0..11).map(|i| format!("{i}{}", "d".repeat(249))).collect();
    let deep = format!("lists/{}", deep.join("/"));
    let target = |i: usize| format!("{deep}/a{i}");
    let mut expected = std::collections::BTreeMap::new();
    for i in 0..100 {
        fs::create_dir_all(d.sb.join("cgroup").join(target(i))).unwrap_or_else(|e| panic!("{e}"));
        let params = json!({ "pool": "web", "target": format!("cgroup:{}", target(i)), "millicpus": 10, "id": format!("l{i:03}") });
        let a = v.call("Assign", params).unwrap_or_else(|e| panic!("{e:?}\n{}", d.logs()));
        expected.insert(format!("l{i:03}"), a["assignment"].clone());
    }
    let whole = |list: &Value| -> std::collections::BTreeMap<String, Value> {
        let list = list["assignments"].as_array().cloned().unwrap_or_default();
        list.into_iter().map(|a| (a["id"].as_str().unwrap_or_default().to_owned(), a)).collect()
    };

    let start = std::sync::Arc::new(std::sync::Barrier::new(64));
    let clients: Vec<_> = (0..64)
        .map(|_| {
            let (mut c, start) = (Varlink::connect(&d.varlink), start.clone());
            std::thread::spawn(move || {
                start.wait();
                c.call("ListAssignments", json!({})).unwrap_or_else(|e| panic!("{e:?}"))
            })
        })
        .collect();
    let replies: Vec<Value> =
        clients.into_iter().map(|t| t.join().unwrap_or_else(|_| panic!("a client failed"))).collect();
    assert!(replies.iter().all(|r| *r == replies[0]), "every client got the same reply");
    assert_eq!(whole(&replies[0]), expected, "the reply holds every assignment, whole");

    if have_python_varlink() {
        let target = format!("{}/{IFACE}.ListAssignments", d.address());
        let pythons: Vec<_> = (0..4)
            .map(|_| {
                Command::new("python3")
                    .args(["-m", "varlink.cli", "call", &target, "{}"])
                    .stdout(Stdio::piped())
                    .spawn()
                    .unwrap_or_else(|e| panic!("{e}"))
            })
            .collect();
        for p in pythons {
            let out = p.wait_with_output().unwrap_or_else(|e| panic!("{e}"));
            let parsed: Value =
                serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out.stdout)));
            assert_eq!(parsed, replies[0], "the third-party client reads the same reply");
        }
    }

    // Right after each change returns, the whole list and the pool's list show it.
    let params =
        json!({ "pool": "web", "target": format!("cgroup:{}", target(0)), "millicpus": 10, "id": "l000" });
    assert_eq!(v.call("Assign", params).ok().map(|a| a["assignment"].clone()).as_ref(), expected.get("l000"));
    fs::create_dir_all(d.sb.join("cgroup/lists/new")).unwrap_or_else(|e| panic!("{e}"));
    let new = v
        .call("Assign", json!({ "pool": "web", "target": "cgroup:lists/new", "millicpus": 10, "id": "new" }))
        .unwrap_or_else(|e| panic!("{e:?}"));
    expected.insert("new".into(), new["assignment"].clone());
    assert_eq!(whole(&v.call("ListAssignments", json!({})).unwrap_or_else(|e| panic!("{e:?}"))), expected);
    let web = v.call("ListAssignments", json!({ "pool": "web" })).unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(whole(&web), expected);
    assert_eq!(ok(&d, "ListAssignments", json!({ "pool": "web" })), web);
    v.call("Release", json!({ "id": "l050" })).unwrap_or_else(|e| panic!("{e:?}"));
    expected.remove("l050");
    assert_eq!(whole(&v.call("ListAssignments", json!({})).unwrap_or_else(|e| panic!("{e:?}"))), expected);
    let web = v.call("ListAssignments", json!({ "pool": "web" })).unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(whole(&web), expected);
    let dp = v.call("ListAssignments", json!({ "pool": "dp" })).unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(dp, json!({ "assignments": [] }));
    drop(v);
    d.stop();
}
