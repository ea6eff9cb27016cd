//! `cpupoolctl` end to end against the real `cpupoold` on a sandbox host, over varlink and over
//! D-Bus (the sandbox's private bus), with `--json` output parsed here.
//!
//! The daemon binary belongs to another package, so Cargo gives no `CARGO_BIN_EXE_cpupoold`
//! here: it is found next to this test's target directory (`target/debug/cpupoold`), which
//! `cargo test --workspace --all-targets` builds before running any test, or at
//! `$CPUPOOLD_BIN`. Each test starts its own daemon on a fresh 1x4x2 sandbox and waits for the
//! `READY` line of its banner (never a sleep): reserved 0,4; dp (exclusive, full cores, isolated)
//! 2 CPUs; web (shared) the 4 others.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod common;
use common::{bus_daemons, text, Ctl, Daemon, CTL};

fn pool<'a>(pools: &'a Value, name: &str) -> &'a Value {
    pools
        .as_array()
        .and_then(|a| a.iter().find(|p| p["name"] == name))
        .unwrap_or_else(|| panic!("no {name} in {pools}"))
}

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

/// Reads, assigns, lists, errors and releases; the same script for both transports.
fn reads_assign_release_and_errors(dbus: bool) {
    let dir = tempdir();
    let d = Daemon::start(dir.path());
    let ctl = Ctl::new(&d, dbus);

    let before = ctl.pools();
    assert_eq!(before.as_array().map(Vec::len), Some(3), "{before}");
    let dp = pool(&before, "dp");
    assert_eq!(
        (
            dp["kind"].as_str(),
            dp["free_millicpus"].as_u64(),
            dp["capacity_millicpus"].as_u64(),
            dp["isolated"].as_bool()
        ),
        (Some("exclusive"), Some(2000), Some(2000), Some(true))
    );
    assert_eq!(pool(&before, "reserved")["cpus"], "0,4");
    assert_eq!(ctl.ok(&["pool", "show", "dp"])["pool"], *dp);

    let (code, table, _) = ctl.human(&["pool", "list"]);
    assert_eq!(code, 0);
    let header = table.lines().next().unwrap_or_default();
    assert!(header.starts_with("NAME") && header.contains("ASSIGNMENTS"), "{table}");
    assert!(table.lines().any(|l| l.starts_with("dp ") && l.contains("exclusive")), "{table}");

    let topo = ctl.ok(&["topology"]);
    assert_eq!(
        (topo["online"].as_str(), topo["cpus"].as_array().map(Vec::len)),
        (Some("0-7"), Some(8)),
        "{topo}"
    );
    assert_eq!(topo["cpus"][1], json!({"cpu": 1, "core": 1, "package": 0, "die": 0, "node": 0, "l3": 0}));
    let status = ctl.ok(&["status"]);
    assert_eq!((status["pools"].as_u64(), status["assignments"].as_u64()), (Some(3), Some(0)), "{status}");
    assert_eq!(status["config_error"], Value::Null, "{status}");
    assert!(
        status["state_file"].as_str().is_some_and(|s| s.starts_with(&*d.sb.to_string_lossy())),
        "{status}"
    );

    // Assign a core of dp to a cgroup; the daemon writes its cpuset.cpus.
    let cg = d.cgroup("cpupool.slice/cpupool-dp.slice/app");
    let a = ctl.ok(&[
        "pool",
        "assign",
        "dp",
        "--cgroup",
        "cpupool.slice/cpupool-dp.slice/app",
        "--cpus",
        "2",
        "--id",
        "app-1",
    ])["assignment"]
        .clone();
    assert_eq!(
        (a["id"].as_str(), a["pool"].as_str(), a["millicpus"].as_u64(), a["target"].as_str()),
        (Some("app-1"), Some("dp"), Some(2000), Some("cgroup:cpupool.slice/cpupool-dp.slice/app")),
        "{a}"
    );
    let cpus = a["cpus"].as_str().unwrap_or_default().to_owned();
    assert_eq!(fs::read_to_string(cg.join("cpuset.cpus")).unwrap_or_default().trim(), cpus);
    // The same call again is a no-op answering the same assignment.
    let again = ctl.ok(&[
        "pool",
        "assign",
        "dp",
        "--cgroup",
        "cpupool.slice/cpupool-dp.slice/app",
        "--cpus",
        "2",
        "--id",
        "app-1",
    ]);
    assert_eq!(again["assignment"], a);
    assert_eq!(ctl.ok(&["assignments", "--pool", "dp"])["assignments"], json!([a]));
    assert_eq!(ctl.ok(&["assignments"])["assignments"], json!([a]));
    assert_eq!(ctl.ok(&["assignments", "--pool", "web"])["assignments"], json!([]));
    let (code, table, _) = ctl.human(&["assignments"]);
    assert_eq!(code, 0);
    assert!(
        table.contains("app-1") && table.contains("cgroup:cpupool.slice/cpupool-dp.slice/app"),
        "{table}"
    );
    // A shared assignment by millicpus.
    d.cgroup("cpupool.slice/cpupool-web.slice/web");
    let w = ctl.ok(&[
        "pool",
        "assign",
        "web",
        "--cgroup",
        "cpupool.slice/cpupool-web.slice/web",
        "--millicpus",
        "1500",
    ])["assignment"]
        .clone();
    assert_eq!((w["pool"].as_str(), w["millicpus"].as_u64()), (Some("web"), Some(1500)), "{w}");
    let wid = w["id"].as_str().unwrap_or_default().to_owned();
    assert!(!wid.is_empty(), "{w}");
    assert_eq!(pool(&ctl.pools(), "web")["free_millicpus"], 2500);
    ctl.ok(&["pool", "release", &wid]);
    let after = ctl.pools();
    assert_eq!(
        (pool(&after, "dp")["free_millicpus"].as_u64(), pool(&after, "dp")["assignments"].as_u64()),
        (Some(0), Some(1))
    );

    // Errors: named, with what to do, exit 1, and nothing changes.
    let (code, e) = ctl.err(&["pool", "show", "nope"]);
    assert_eq!(
        (code, e["error"].as_str(), e["parameters"]["pool"].as_str()),
        (1, Some("NoSuchPool"), Some("nope")),
        "{e}"
    );
    assert_eq!(e["message"], "no pool `nope`; `cpupoolctl pool list` shows the pools");
    let (code, _, stderr) = ctl.human(&["pool", "show", "nope"]);
    assert_eq!(code, 1);
    assert_eq!(
        stderr.trim(),
        "cpupoolctl: error NoSuchPool: no pool `nope`; `cpupoolctl pool list` shows the pools"
    );
    let (code, e) = ctl.err(&[
        "pool",
        "assign",
        "nope",
        "--cgroup",
        "cpupool.slice/cpupool-dp.slice/other",
        "--cpus",
        "1",
    ]);
    assert_eq!((code, e["error"].as_str()), (1, Some("NoSuchPool")), "{e}");
    d.cgroup("cpupool.slice/cpupool-dp.slice/other");
    let (code, e) =
        ctl.err(&["pool", "assign", "dp", "--cgroup", "cpupool.slice/cpupool-dp.slice/other", "--cpus", "2"]);
    assert_eq!(
        (code, e["error"].as_str(), e["parameters"]["pool"].as_str()),
        (1, Some("InsufficientCapacity"), Some("dp")),
        "{e}"
    );
    let (code, e) = ctl.err(&[
        "pool",
        "assign",
        "web",
        "--cgroup",
        "cpupool.slice/cpupool-dp.slice/app",
        "--millicpus",
        "100",
    ]);
    assert_eq!(
        (code, e["error"].as_str(), e["parameters"]["target"].as_str()),
        (1, Some("TargetBusy"), Some("cgroup:cpupool.slice/cpupool-dp.slice/app")),
        "{e}"
    );
    let (code, e) = ctl.err(&[
        "pool",
        "assign",
        "reserved",
        "--cgroup",
        "cpupool.slice/cpupool-dp.slice/other",
        "--cpus",
        "1",
    ]);
    assert_eq!((code, e["error"].as_str()), (1, Some("ReservedPool")), "{e}");
    let (code, e) = ctl.err(&["pool", "release", "nope"]);
    assert_eq!(
        (code, e["error"].as_str(), e["parameters"]["id"].as_str()),
        (1, Some("NoSuchAssignment"), Some("nope")),
        "{e}"
    );
    let (code, e) = ctl.err(&["pool", "assign", "dp", "--cgroup", "/abs", "--cpus", "2"]);
    assert_eq!((code, e["error"].as_str()), (1, Some("InvalidArgument")), "{e}");
    assert_eq!(ctl.pools(), after);
    assert_eq!(ctl.ok(&["status"])["assignments"], 1);

    let released = ctl.ok(&["pool", "release", "app-1"]);
    assert_eq!(released["assignment"], a);
    assert_eq!(ctl.pools(), before);
    assert_eq!(ctl.ok(&["assignments"])["assignments"], json!([]));
    let (code, out, _) = ctl.human(&["assignments"]);
    assert_eq!((code, out.as_str()), (0, "no assignments\n"));

    d.stop();
}

#[test]
fn varlink_reads_assign_release_and_errors() {
    reads_assign_release_and_errors(false);
}

#[test]
fn dbus_reads_assign_release_and_errors() {
    reads_assign_release_and_errors(true);
}

/// Both transports answer the same documents.
#[test]
fn both_transports_print_the_same() {
    let dir = tempdir();
    let d = Daemon::start(dir.path());
    let (v, b) = (Ctl::new(&d, false), Ctl::new(&d, true));
    d.cgroup("cpupool.slice/cpupool-dp.slice/app");
    v.ok(&[
        "pool",
        "assign",
        "dp",
        "--cgroup",
        "cpupool.slice/cpupool-dp.slice/app",
        "--cpus",
        "2",
        "--id",
        "same",
    ]);
    for args in [&["pool", "list"][..], &["pool", "show", "web"], &["assignments"], &["topology"]] {
        assert_eq!(v.ok(args), b.ok(args), "{args:?}");
        assert_eq!(v.human(args), b.human(args), "{args:?}");
    }
    for args in [&["pool", "show", "nope"][..], &["pool", "release", "nope"], &["pool", "delete", "nope"]] {
        assert_eq!(v.err(args), b.err(args), "{args:?}");
    }
    d.stop();
}

/// Runs `cpupoolctl monitor --json` and checks the replay and the events of an assign and a
/// release.
fn monitor_streams_changes(dbus: bool) {
    let dir = tempdir();
    let d = Daemon::start(dir.path());
    let ctl = Ctl::new(&d, dbus);
    let mut mon =
        ctl.command(&["--json", "monitor"]).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let stdout = mon.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let next = |what: &str| -> Value {
        let line = rx
            .recv_timeout(test_support::wait::PATIENCE)
            .unwrap_or_else(|e| panic!("waiting for {what}: {e}\n{}", d.logs()));
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{what}: {e}: {line}"))
    };
    // The replay says the subscription is live; one JSON object per line.
    let replay: Vec<Value> = (0..3).map(|_| next("the replay")).collect();
    assert_eq!(
        replay,
        ["dp", "reserved", "web"].map(|p| json!({"kind": "pool", "pool": p, "change": "current"}))
    );
    d.cgroup("cpupool.slice/cpupool-web.slice/mon");
    ctl.ok(&[
        "pool",
        "assign",
        "web",
        "--cgroup",
        "cpupool.slice/cpupool-web.slice/mon",
        "--millicpus",
        "250",
        "--id",
        "mon-1",
    ]);
    assert_eq!(next("assignment added"), json!({"kind": "assignment", "id": "mon-1", "change": "added"}));
    assert_eq!(next("pool changed"), json!({"kind": "pool", "pool": "web", "change": "changed"}));
    ctl.ok(&["pool", "release", "mon-1"]);
    assert_eq!(next("assignment removed"), json!({"kind": "assignment", "id": "mon-1", "change": "removed"}));
    assert_eq!(next("pool changed"), json!({"kind": "pool", "pool": "web", "change": "changed"}));

    // When the daemon stops, the monitor ends by itself: exit 3 (varlink: the connection
    // closes; D-Bus: the name leaves the bus) or 1 (ShuttingDown), never hanging.
    d.stop();
    let deadline = Instant::now() + test_support::wait::PATIENCE;
    let status = loop {
        if let Some(s) = mon.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = mon.kill();
            panic!("the monitor did not end after the daemon stopped");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(matches!(status.code(), Some(1 | 3)), "{status}");
    let _ = reader.join();
}

#[test]
fn varlink_monitor_streams_changes() {
    monitor_streams_changes(false);
}

#[test]
fn dbus_monitor_streams_changes() {
    monitor_streams_changes(true);
}

/// Pools created, resized and deleted at run time, with their errors.
fn pool_create_resize_delete(dbus: bool) {
    let dir = tempdir();
    let d = Daemon::start(dir.path());
    let ctl = Ctl::new(&d, dbus);

    // Every CPU is in a pool: make room by shrinking web (no assignments) to one core.
    let web = ctl.ok(&["pool", "resize", "web", "--count", "2"])["pool"].clone();
    assert_eq!(
        (web["name"].as_str(), web["capacity_millicpus"].as_u64()),
        (Some("web"), Some(2000)),
        "{web}"
    );
    let batch = ctl.ok(&["pool", "create", "batch", "--kind", "shared", "--count", "2", "--no-kubelet"])
        ["pool"]
        .clone();
    assert_eq!(
        (batch["name"].as_str(), batch["kind"].as_str(), batch["capacity_millicpus"].as_u64()),
        (Some("batch"), Some("shared"), Some(2000)),
        "{batch}"
    );
    assert_eq!(ctl.pools().as_array().map(Vec::len), Some(4));
    assert_eq!(ctl.ok(&["pool", "show", "batch"])["pool"], batch);
    let (code, e) = ctl.err(&["pool", "create", "batch", "--kind", "shared", "--count", "2"]);
    assert_eq!(
        (code, e["error"].as_str(), e["parameters"]["pool"].as_str()),
        (1, Some("PoolExists"), Some("batch")),
        "{e}"
    );
    let (code, e) = ctl.err(&["pool", "resize", "nope", "--count", "2"]);
    assert_eq!((code, e["error"].as_str()), (1, Some("NoSuchPool")), "{e}");
    // Taking CPUs the other pools need is the edit's fault: an invalid argument saying what it
    // breaks, not a rejected configuration blaming a key of config.toml nobody touched.
    let (code, e) = ctl.err(&["pool", "resize", "batch", "--cpus", "1-3,5-7"]);
    assert_eq!((code, e["error"].as_str()), (1, Some("InvalidArgument")), "{e}");
    // (D-Bus errors carry the message only.)
    if !dbus {
        assert_eq!(e["parameters"]["argument"].as_str(), Some("cpus"), "{e}");
    }
    let message = e["message"].as_str().unwrap_or_default();
    assert!(
        message
            .starts_with("invalid cpus: with CPUs 1-3,5-7 for pool `batch`, the other pools no longer fit: "),
        "{e}"
    );
    assert_eq!(ctl.ok(&["pool", "show", "batch"])["pool"], batch);

    // A pool with an assignment is not deleted, nor shrunk under it.
    d.cgroup("cpupool.slice/cpupool-dp.slice/app");
    ctl.ok(&[
        "pool",
        "assign",
        "dp",
        "--cgroup",
        "cpupool.slice/cpupool-dp.slice/app",
        "--cpus",
        "2",
        "--id",
        "app-1",
    ]);
    let (code, e) = ctl.err(&["pool", "delete", "dp"]);
    assert_eq!(
        (code, e["error"].as_str(), e["parameters"]["pool"].as_str()),
        (1, Some("PoolInUse"), Some("dp")),
        "{e}"
    );
    assert!(e["message"].as_str().is_some_and(|m| m.contains("cpupoolctl assignments --pool dp")), "{e}");
    let (code, e) = ctl.err(&["pool", "resize", "dp", "--cpus", "3"]);
    assert_eq!(code, 1, "{e}");
    ctl.ok(&["pool", "release", "app-1"]);

    let (code, out, _) = ctl.human(&["pool", "delete", "batch"]);
    assert_eq!((code, out.as_str()), (0, "deleted pool `batch`; its CPUs joined the reserved pool\n"));
    let (code, e) = ctl.err(&["pool", "delete", "batch"]);
    assert_eq!((code, e["error"].as_str()), (1, Some("NoSuchPool")), "{e}");
    assert_eq!(ctl.ok(&["status"])["pools"], 3);
    assert_eq!(ctl.ok(&["pool", "resize", "web", "--count", "4"])["pool"]["capacity_millicpus"], 4000);

    d.stop();
}

#[test]
fn varlink_pool_create_resize_delete() {
    pool_create_resize_delete(false);
}

#[test]
fn dbus_pool_create_resize_delete() {
    pool_create_resize_delete(true);
}

/// `reload` (what `systemctl reload cpupoold` runs): applies an edited configuration and says
/// whether anything changed; a rejected one exits 1 with the reason, and the running
/// configuration stays.
fn reload_applies_or_says_why_not(dbus: bool) {
    let dir = tempdir();
    let d = Daemon::start(dir.path());
    let ctl = Ctl::new(&d, dbus);
    let (code, out, err) = ctl.human(&["reload"]);
    assert_eq!((code, out.as_str()), (0, "configuration reloaded: nothing changed\n"), "{err}");
    assert_eq!(ctl.ok(&["reload"]), json!({ "changed": false, "summary": "nothing changed" }));

    // web: 4 CPUs -> 2.
    let cfg = d.sb.join("etc/cpupoold/config.toml");
    let good = fs::read_to_string(&cfg).unwrap();
    assert!(good.contains("[pools.web]\nkind = \"shared\"\ncount = 4\n"), "{good}");
    fs::write(&cfg, good.replace("count = 4", "count = 2")).unwrap();
    let (code, out, err) = ctl.human(&["reload"]);
    assert_eq!(
        (code, out.as_str()),
        (0, "configuration reloaded and applied: 1 key changed: pools.web.count\n"),
        "{err}"
    );
    let running = ctl.pools();
    assert_eq!(pool(&running, "web")["capacity_millicpus"], 2000, "{running}");

    // Rejected: exit 1, the reason once, and nothing changes.
    fs::write(&cfg, format!("{good}\n[pools.broken]\nkind = \"exclusive\"\n")).unwrap();
    let (code, out, err) = ctl.human(&["reload"]);
    assert_eq!((code, out.as_str()), (1, ""), "{err}");
    assert_eq!(
        err,
        format!(
            "cpupoolctl: error ConfigRejected: the new configuration is invalid; the running one stays: \
             `{}`: pools.broken: no CPU source: set one of cpus, count or isolcpus = true; fix what it names, then \
             `cpupoolctl reload`; `cpupoolctl pool list` and `cpupoolctl topology` show what there is\n",
            cfg.display()
        )
    );
    let (code, e) = ctl.err(&["reload"]);
    assert_eq!((code, e["error"].as_str()), (1, Some("ConfigRejected")), "{e}");
    assert_eq!(ctl.pools(), running);
    let status = ctl.ok(&["status"]);
    assert!(status["config_error"].as_str().is_some_and(|s| s.contains("pools.broken")), "{status}");
    assert!(
        d.logs().contains("reload: the new configuration is invalid; the running one stays: "),
        "{}",
        d.logs()
    );

    // Fixed: applied again (web back to 4), and the status is clean.
    fs::write(&cfg, &good).unwrap();
    assert_eq!(ctl.ok(&["reload"]), json!({ "changed": true, "summary": "1 key changed: pools.web.count" }));
    assert_eq!(pool(&ctl.pools(), "web")["capacity_millicpus"], 4000);
    assert_eq!(ctl.ok(&["status"])["config_error"], Value::Null);

    // A key the daemon reads only at start: nothing is applied, and the answer and the log
    // say that a restart applies it.
    let dropin = d.sb.join("etc/cpupoold/config.d/50-prefix.toml");
    fs::create_dir_all(dropin.parent().unwrap()).unwrap();
    fs::write(&dropin, "[kubelet]\nresource_prefix = \"example.com\"\n").unwrap();
    let (code, out, err) = ctl.human(&["reload"]);
    let said = "1 key changed: kubelet.resource_prefix; only a restart applies kubelet.resource_prefix";
    assert_eq!((code, out.as_str()), (0, format!("configuration reloaded: {said}\n").as_str()), "{err}");
    assert!(
        d.logs().contains(
            "configuration: only a restart applies kubelet.resource_prefix (systemctl restart cpupoold)"
        ),
        "{}",
        d.logs()
    );
    fs::remove_file(&dropin).unwrap();
    assert_eq!(ctl.ok(&["reload"]), json!({ "changed": false, "summary": said }));
    d.stop();
}

#[test]
fn varlink_reload_applies_or_says_why_not() {
    reload_applies_or_says_why_not(false);
}

#[test]
fn dbus_reload_applies_or_says_why_not() {
    reload_applies_or_says_why_not(true);
}

/// A harness dropped without `stop` (a test that ends early, or panics) leaves no
/// `dbus-daemon` of its sandbox running.
#[test]
fn no_bus_daemon_outlives_the_harness() {
    let dir = tempdir();
    let d = Daemon::start(dir.path());
    Ctl::new(&d, true).ok(&["status"]);
    assert_eq!(bus_daemons(dir.path()).len(), 1, "the sandbox's bus runs while the daemon does");
    drop(d);
    assert_eq!(bus_daemons(dir.path()), Vec::<i32>::new(), "a dbus-daemon outlived the harness");

    let panicked = std::panic::catch_unwind(|| {
        let d = Daemon::start(dir.path());
        Ctl::new(&d, true).ok(&["status"]);
        panic!("a failed assertion");
    });
    assert!(panicked.is_err());
    assert_eq!(bus_daemons(dir.path()), Vec::<i32>::new(), "a dbus-daemon outlived a panic");
}

/// An unprivileged caller (`nobody`) may read but not change anything.
fn unprivileged_callers_are_denied(dbus: bool) {
    if !test_support::needs::root("to run cpupoolctl as another user with setpriv") {
        return;
    }
    let dir = tempdir();
    // nobody must reach the binary and the sockets through the temp dir.
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let bin = dir.path().join("cpupoolctl");
    fs::copy(CTL, &bin).unwrap();
    fs::set_permissions(&bin, fs::Permissions::from_mode(0o755)).unwrap();
    let d = Daemon::start(dir.path());
    let root = Ctl::new(&d, dbus);
    let nobody = Ctl {
        bin,
        wrapper: ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"].map(String::from).to_vec(),
        ..root.clone()
    };
    let before = root.pools();
    assert_eq!(nobody.pools(), before);
    d.cgroup("cpupool.slice/cpupool-web.slice/denied");
    let (code, e) = nobody.err(&[
        "pool",
        "assign",
        "web",
        "--cgroup",
        "cpupool.slice/cpupool-web.slice/denied",
        "--millicpus",
        "500",
    ]);
    assert_eq!((code, e["error"].as_str()), (1, Some("AccessDenied")), "{e}");
    assert!(e["message"].as_str().is_some_and(|m| m.contains("daemon.admin_group")), "{e}");
    let (code, e) = nobody.err(&["pool", "release", "whatever"]);
    assert_eq!((code, e["error"].as_str()), (1, Some("AccessDenied")), "{e}");
    let (code, e) = nobody.err(&["reload"]);
    assert_eq!((code, e["error"].as_str()), (1, Some("AccessDenied")), "{e}");
    let (code, _, stderr) = nobody.human(&[
        "pool",
        "assign",
        "web",
        "--cgroup",
        "cpupool.slice/cpupool-web.slice/denied",
        "--millicpus",
        "500",
    ]);
    assert_eq!(code, 1);
    assert!(
        stderr.starts_with("cpupoolctl: error AccessDenied: ") && stderr.contains("run as root"),
        "{stderr}"
    );
    assert_eq!(root.pools(), before);
    assert_eq!(root.ok(&["status"])["assignments"], 0);
    d.stop();
}

#[test]
fn varlink_unprivileged_callers_are_denied() {
    unprivileged_callers_are_denied(false);
}

#[test]
fn dbus_unprivileged_callers_are_denied() {
    unprivileged_callers_are_denied(true);
}

/// No daemon: exit 3, naming the address tried and what to check; no daemon needed.
#[test]
fn an_unreachable_daemon_exits_3() {
    let dir = tempdir();
    let missing = dir.path().join("missing.sock");
    let dead = dir.path().join("dead.sock");
    drop(std::os::unix::net::UnixListener::bind(&dead).unwrap());
    let ctl = |via: Vec<String>| Ctl { bin: PathBuf::from(CTL), wrapper: Vec::new(), via };
    for sock in [&missing, &dead] {
        let c = ctl(vec!["--varlink-address".into(), format!("unix:{}", sock.display())]);
        let (code, e) = c.err(&["pool", "list"]);
        assert_eq!((code, e["error"].as_str()), (3, Some("Unreachable")), "{e}");
        assert_eq!(e["parameters"]["address"], format!("unix:{}", sock.display()));
        let msg = e["message"].as_str().unwrap_or_default();
        assert!(msg.contains("is cpupoold running?") && msg.contains("systemctl status cpupoold"), "{msg}");
        let (code, out, stderr) = c.human(&["status"]);
        assert_eq!((code, out.as_str()), (3, ""));
        assert!(
            stderr
                .starts_with(&format!("cpupoolctl: error: cannot reach cpupoold at unix:{}", sock.display())),
            "{stderr}"
        );
    }
    // A sandbox without a daemon, over both transports.
    let sb = dir.path().join("sb");
    for dbus in [false, true] {
        let mut via = vec!["--sandbox".to_owned(), sb.to_string_lossy().into_owned()];
        if dbus {
            via.push("--dbus".into());
        }
        let (code, e) = ctl(via).err(&["pool", "list"]);
        assert_eq!((code, e["error"].as_str()), (3, Some("Unreachable")), "{e}");
        let msg = e["message"].as_str().unwrap_or_default();
        assert!(msg.contains(&format!("is `cpupoold --sandbox {}` running?", sb.display())), "{msg}");
    }
    let (code, e) = ctl(vec!["--bus".into(), format!("unix:path={}", missing.display())]).err(&["status"]);
    assert_eq!((code, e["error"].as_str()), (3, Some("Unreachable")), "{e}");
}

#[test]
fn usage_errors_exit_2() {
    for args in [
        &["pool", "assign", "dp", "--cpus", "2"][..],
        &["pool", "assign", "dp", "--unit", "a", "--cpus", "1", "--millicpus", "5"],
        &["pool", "create", "x", "--kind", "shared"],
        &["frobnicate"],
        &["--varlink-address", "/x", "--dbus", "status"],
    ] {
        let out = Command::new(CTL).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out.stderr));
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    let out = Command::new(CTL).args(["--help"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out.stdout).contains("3  the daemon could not be reached"), "{}", text(&out.stdout));
}

/// The daemon's durable state: the snapshot, then the journal of changes since.
fn durable_state(d: &Daemon) -> Vec<u8> {
    let mut bytes = fs::read(d.sb.join("state/state.json")).unwrap();
    bytes.extend(fs::read(d.sb.join("state/state.journal")).unwrap_or_default());
    bytes
}

/// Bad arguments on the command line: the daemon's typed error naming the argument (exit 1),
/// or a usage error (exit 2) where the CLI itself can tell; nothing changes either way.
#[test]
fn bad_arguments_are_refused_by_name_and_change_nothing() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempdir();
    let d = Daemon::start(dir.path());
    for dbus in [false, true] {
        let ctl = Ctl::new(&d, dbus);
        let before = (ctl.pools(), ctl.ok(&["assignments"]), durable_state(&d));
        let long = "a".repeat(300);
        let long_target = format!("k/{long}");
        for (args, argument) in [
            (&["pool", "assign", "web", "--cgroup", "../../etc", "--millicpus", "100"][..], "target"),
            (&["pool", "assign", "web", "--cgroup", "/etc", "--millicpus", "100"], "target"),
            (&["pool", "assign", "web", "--cgroup", "k/../../x", "--millicpus", "100"], "target"),
            (&["pool", "assign", "web", "--cgroup", &long_target, "--millicpus", "100"], "target"),
            (&["pool", "assign", "web", "--unit", "..", "--millicpus", "100"], "target"),
            (&["pool", "assign", "web", "--cgroup", "k/b", "--millicpus", "100", "--id", &long], "id"),
            (&["pool", "create", &long, "--kind", "shared", "--cpus", "3"], "name"),
            (&["pool", "resize", "web", "--cpus", "3-"], "cpus"),
            (&["pool", "resize", "web", "--cpus", "99999999999"], "cpus"),
        ] {
            let (code, e) = ctl.err(args);
            assert_eq!((code, e["error"].as_str()), (1, Some("InvalidArgument")), "{args:?}: {e}");
            // Named in the parameters (varlink) or, where the transport carries only a
            // message (D-Bus), at the start of it.
            let named = e["parameters"]["argument"] == argument
                || e["message"].as_str().is_some_and(|m| m.starts_with(&format!("invalid {argument}")));
            assert!(named, "dbus={dbus} {args:?}: {e}");
        }
        let (code, e) = ctl.err(&["pool", "assign", "nope", "--cgroup", "k/b", "--cpus", "1"]);
        assert_eq!((code, e["error"].as_str()), (1, Some("NoSuchPool")), "{e}");
        let after = (ctl.pools(), ctl.ok(&["assignments"]), durable_state(&d));
        assert_eq!(after, before, "dbus={dbus}: a refused call changed something");
    }
    // What the CLI refuses itself: negative and huge sizes, non-numbers, non-UTF-8.
    let ctl = Ctl::new(&d, false);
    for args in [
        &["pool", "assign", "web", "--cgroup", "k/b", "--cpus", "-1"][..],
        &["pool", "assign", "web", "--cgroup", "k/b", "--cpus", "99999999999"],
        &["pool", "assign", "web", "--cgroup", "k/b", "--millicpus", "lots"],
        &["pool", "assign", "web", "--cgroup", "k/b", "--millicpus", "0"],
        &["pool", "create", "x", "--kind", "shared", "--count", "-2"],
    ] {
        let out = ctl.run(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out.stderr));
        assert!(text(&out.stderr).contains("--"), "{args:?} does not name the option: {}", text(&out.stderr));
    }
    let out = ctl
        .command(&["pool", "assign", "web", "--millicpus", "100", "--cgroup"])
        .arg(std::ffi::OsStr::from_bytes(b"k/\xff\xfe"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "non-UTF-8: {}", text(&out.stderr));
    assert!(ctl.ok(&["assignments"])["assignments"].as_array().unwrap().is_empty());
    d.stop();
}

#[test]
fn completions_and_manpage() {
    let out = Command::new(CTL).args(["completions", "bash"]).output().unwrap();
    assert!(out.status.success());
    assert!(text(&out.stdout).contains("cpupoolctl__pool__assign") || text(&out.stdout).contains("assign"));
    let out = Command::new(CTL).args(["manpage"]).output().unwrap();
    assert!(out.status.success());
    let page = text(&out.stdout);
    assert!(page.starts_with(".ie") || page.contains(".TH cpupoolctl 1"), "{page}");
    assert!(page.contains("EXIT STATUS"), "{page}");
    let dir = tempdir();
    let out = Command::new(CTL).arg("manpage").arg("--dir").arg(dir.path()).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(dir.path().join("cpupoolctl-pool-create.1").is_file());
}

/// Waits until the daemon has released every assignment (it does so for `run`'s when the
/// process ends, which it learns a moment after the shell does).
fn all_released(ctl: &Ctl, d: &Daemon) {
    test_support::wait::until(test_support::wait::PATIENCE, "the daemon to release run's assignment", || {
        let list = ctl.ok(&["assignments"]);
        if list["assignments"] == json!([]) {
            Ok(())
        } else {
            Err(format!("{list}\n{}", d.logs()))
        }
    });
}

/// `run`: COMMAND gets the pool's CPUs and environment before it starts, the exit status is
/// COMMAND's, and the daemon releases the assignment; a refused run never starts COMMAND.
fn run_confines_passes_the_environment_and_releases(dbus: bool) {
    let dir = tempdir();
    let d = Daemon::start(dir.path());
    let ctl = Ctl::new(&d, dbus);
    let dp = pool(&ctl.pools(), "dp").clone();
    let script = "echo \"$CPUPOOL_POOL $CPUPOOL_CPUS $EXCLUSIVE_CPUS\"; echo \"$CPUPOOL_ASSIGNMENT\"; exit 7";
    let (code, out, err) =
        ctl.human(&["run", "--pool", "dp", "--cpus", "2", "--id", "job", "--", "sh", "-c", script]);
    assert_eq!(code, 7, "{out}{err}\n{}", d.logs());
    let cpus = dp["cpus"].as_str().unwrap();
    assert_eq!(out, format!("dp {cpus} {cpus}\njob\n"));
    assert!(d.logs().contains("assigned CPUs"), "{}", d.logs());
    all_released(&ctl, &d);
    // The sandbox never touches a real process: the command keeps this machine's CPUs,
    // is told so, and the daemon records the simulated affinity in DIR/proc/PID/status.
    let mine = std::fs::read_to_string("/proc/self/status").unwrap();
    let mine = mine.lines().find(|l| l.starts_with("Cpus_allowed_list")).unwrap().to_owned();
    let script = "grep Cpus_allowed_list /proc/self/status; echo \"$CPUPOOL_SIMULATED\"; \
                  cat \"$SB/proc/$$/status\"";
    let out = ctl
        .command(&["run", "--pool", "dp", "--cpus", "2", "--", "sh", "-c", script])
        .env("SB", &d.sb)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines: Vec<String> = text(&out.stdout).lines().map(str::to_owned).collect();
    assert_eq!(lines.first(), Some(&mine), "{lines:?}");
    assert_eq!(lines.get(1).map(String::as_str), Some("1"), "{lines:?}");
    let recorded = lines.get(2).and_then(|l| l.split_whitespace().last()).unwrap_or_default().to_owned();
    let pool_cpus: Vec<&str> = cpus.split(',').collect();
    assert_eq!(recorded.split(',').count(), 2, "{lines:?}");
    for c in recorded.split(',') {
        assert!(pool_cpus.contains(&c), "CPU {c} of `{recorded}` is not in dp {cpus}");
    }
    assert!(text(&out.stderr).contains("belong to the simulated host"), "{}", text(&out.stderr));
    // One refusal, the same words over either transport (varlink's are made from its
    // parameters, D-Bus carries the daemon's).
    let (code, _, err) = ctl.human(&["run", "--pool", "dp", "--cpus", "1", "--", "true"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("pool `dp` hands out whole cores: 1 CPU is not a whole number of free cores"),
        "{err}"
    );
    // No runtime directory is needed (none that exists here, and /tmp unwritable for all
    // `run` knows), and COMMAND inherits no descriptor of cpupoolctl's (its connection to the
    // daemon): it has the ones the same command started directly has.
    let fds = "ls /proc/$$/fd";
    let out = ctl
        .command(&["run", "--pool", "dp", "--cpus", "2", "--", "sh", "-c", fds])
        .env("XDG_RUNTIME_DIR", dir.path().join("absent"))
        .env("TMPDIR", dir.path().join("absent"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let direct = Command::new("sh").args(["-c", fds]).output().unwrap();
    assert_eq!(text(&out.stdout), text(&direct.stdout));
    // Refused: COMMAND never runs.
    let marker = dir.path().join("ran");
    let touch = format!("touch {}", marker.display());
    let (code, _, err) = ctl.human(&["run", "--pool", "nope", "--cpus", "1", "--", "sh", "-c", &touch]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("NoSuchPool"), "{err}");
    let (code, _, err) = ctl.human(&["run", "--pool", "dp", "--cpus", "64", "--", "sh", "-c", &touch]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("InsufficientCapacity"), "{err}");
    assert!(!marker.exists(), "a refused run started its command");
    // A command that cannot be started: 127, and released by cpupoolctl before it exits (it
    // still runs, so the daemon could not have): nothing left assigned when it returns.
    all_released(&ctl, &d);
    let (code, _, err) = ctl.human(&["run", "--pool", "dp", "--cpus", "2", "--", "/nonexistent/cmd"]);
    assert_eq!(code, 127, "{err}");
    assert_eq!(ctl.ok(&["assignments"])["assignments"], json!([]));
    // The daemon released each run's assignment when its process exited; cpupoolctl asked for
    // one release only, the command it could not start, and never raced the daemon's own
    // (a NoSuchAssignment would count as an API error on the daemon's books).
    let release = ["method=\"Release\""];
    assert_eq!(d.metric_sum("cpupoold_api_requests_total{", &release), 1.0, "{}", d.metrics());
    assert_eq!(d.metric_sum("cpupoold_api_errors_total{", &release), 0.0, "{}", d.metrics());
    assert!(d.metric_sum("cpupoold_api_requests_total{", &["method=\"Run\""]) >= 3.0, "{}", d.metrics());
}

#[test]
fn varlink_run_confines_passes_the_environment_and_releases() {
    run_confines_passes_the_environment_and_releases(false);
}

#[test]
fn dbus_run_confines_passes_the_environment_and_releases() {
    run_confines_passes_the_environment_and_releases(true);
}

/// `reload` names every key that changed, a cache class's included (`l3 = "50%"` to `"25%"`
/// was applied, but answered and logged as "nothing changed"), and the file that wins over an
/// edit of `config.toml` (after `pool resize web`, the runtime drop-in's `count`: the edit
/// changed nothing, and was answered so with exit 0 and no word of why).
fn reload_names_what_changed_and_what_overrides(dbus: bool) {
    let dir = tempdir();
    let d = Daemon::start(dir.path());
    let ctl = Ctl::new(&d, dbus);
    let cfg = d.sb.join("etc/cpupoold/config.toml");
    let good = fs::read_to_string(&cfg).unwrap();
    assert!(good.contains("l3 = \"50%\""), "{good}");
    let schemata = || fs::read_to_string(d.sb.join("resctrl/cpupool-dp/schemata")).unwrap();
    let before = schemata();
    fs::write(&cfg, good.replace("l3 = \"50%\"", "l3 = \"25%\"")).unwrap();
    let (code, out, err) = ctl.human(&["reload"]);
    let said = "1 key changed: pools.dp.cache.l3";
    assert_eq!(
        (code, out.as_str()),
        (0, format!("configuration reloaded and applied: {said}\n").as_str()),
        "{err}"
    );
    assert_ne!(schemata(), before, "the class was applied");
    assert!(d.logs().contains(&format!("configuration reloaded: {said}")), "{}", d.logs());

    // The tour's resize: the runtime drop-in holds web's count from now on.
    let (code, _, err) = ctl.human(&["pool", "resize", "web", "--count", "2"]);
    assert_eq!(code, 0, "{err}");
    let dropin = d.sb.join("etc/cpupoold/config.d/90-cpupoold-runtime.toml");
    assert!(dropin.is_file());
    let edited = fs::read_to_string(&cfg).unwrap();
    let web = "[pools.web]\nkind = \"shared\"\ncount = 4\n";
    assert!(edited.contains(web), "{edited}");
    fs::write(&cfg, edited.replace(web, &web.replace("count = 4", "count = 3"))).unwrap();
    let (code, out, err) = ctl.human(&["reload"]);
    let said =
        format!("nothing changed; `{}` overrides pools.web.count of `{}`", dropin.display(), cfg.display());
    assert_eq!((code, out.as_str()), (0, format!("configuration reloaded: {said}\n").as_str()), "{err}");
    assert!(d.logs().contains(&format!("configuration reloaded: {said}")), "{}", d.logs());
    assert_eq!(pool(&ctl.pools(), "web")["capacity_millicpus"], 2000);
    d.stop();
}

#[test]
fn varlink_reload_names_what_changed_and_what_overrides() {
    reload_names_what_changed_and_what_overrides(false);
}

#[test]
fn dbus_reload_names_what_changed_and_what_overrides() {
    reload_names_what_changed_and_what_overrides(true);
}

/// `run` becomes COMMAND (issue 34 §6: it started a second cpupoolctl and waited for the
/// daemon's release, ×2.2 of its floor): COMMAND has cpupoolctl's pid, a signal that ends it
/// ends `run` with that signal (not an exit status made to look like one), and cpupoolctl asks
/// nothing beyond `GetPool` and `Run`. The daemon releases each assignment itself, and a run
/// right after one ends is not refused for the capacity it held (`dp` holds two whole cores:
/// the third run of two cores each comes while the first two may still be booked).
fn run_becomes_its_command(dbus: bool) {
    let dir = tempdir();
    let d = Daemon::start(dir.path());
    let ctl = Ctl::new(&d, dbus);
    let out = ctl
        .command(&["run", "--pool", "web", "--millicpus", "100", "--", "sh", "-c", "echo $$; exit 3"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = out.id();
    let out = out.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), pid.to_string(), "COMMAND is cpupoolctl's process");
    let status = ctl
        .command(&["run", "--pool", "web", "--millicpus", "100", "--", "sh", "-c", "kill -TERM $$"])
        .status()
        .unwrap();
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(15), "{status}");
    for _ in 0..3 {
        let (code, out, err) = ctl.human(&["run", "--pool", "dp", "--cpus", "2", "--", "true"]);
        assert_eq!(code, 0, "{out}{err}\n{}", d.logs());
    }
    all_released(&ctl, &d);
    let calls = |m: &str| d.metric_sum("cpupoold_api_requests_total{", &[&format!("method=\"{m}\"")]);
    assert_eq!((calls("GetPool"), calls("Run")), (5.0, 5.0), "{}", d.metrics());
    for asked in ["Monitor", "Release", "Assign"] {
        assert_eq!(calls(asked), 0.0, "{asked}: {}", d.metrics());
    }
    assert_eq!(d.metric_sum("cpupoold_api_errors_total{", &[]), 0.0, "{}", d.metrics());
    d.stop();
}

#[test]
fn varlink_run_becomes_its_command() {
    run_becomes_its_command(false);
}

#[test]
fn dbus_run_becomes_its_command() {
    run_becomes_its_command(true);
}

/// The value of the `key:` line of human output, `None` when there is none.
fn line_value(out: &str, key: &str) -> Option<String> {
    out.lines().find_map(|l| Some(l.strip_prefix(key)?.strip_prefix(':')?.trim().to_owned()))
}

/// `pool show` and `status` on the sandbox's isolated pool: the isolation line, and what left
/// its CPUs (the sample: reserved 0,4, dp 1,5 isolated; the sandbox has eight movable IRQs,
/// a managed one on CPU 1, and seven movable kernel threads).
fn isolation_is_shown(dbus: bool) {
    let dir = tempdir();
    let d = Daemon::start(dir.path());
    let ctl = Ctl::new(&d, dbus);
    let (code, out, err) = ctl.human(&["pool", "show", "dp"]);
    assert_eq!(code, 0, "{err}");
    let isolation = line_value(&out, "isolation").unwrap_or_else(|| panic!("no isolation line:\n{out}"));
    assert!(["not measured yet", "holds"].contains(&isolation.as_str()), "{out}");
    let irqs = "8 moved off 1,5 (1, 8, 9, 24, 25, ...); 1 placed by the kernel (41)";
    assert_eq!(line_value(&out, "irqs").as_deref(), Some(irqs), "{out}");
    assert_eq!(line_value(&out, "kernel threads").as_deref(), Some("7 moved off 1,5"), "{out}");
    let moved = (2..200)
        .filter(|pid| {
            fs::read_to_string(d.sb.join(format!("proc/{pid}/status")))
                .is_ok_and(|s| s.contains("Cpus_allowed_list:\t0,4\n"))
        })
        .count();
    assert_eq!(moved, 7, "the count is what the simulated threads hold");
    // A pool that is not isolated shows none of it.
    let (_, web, _) = ctl.human(&["pool", "show", "web"]);
    assert!(line_value(&web, "irqs").is_none() && line_value(&web, "isolation").is_none(), "{web}");

    let (code, out, err) = ctl.human(&["status"]);
    assert_eq!(code, 0, "{err}");
    assert!(line_value(&out, "isolation dp").is_some(), "{out}");
    assert_eq!(line_value(&out, "irqs").as_deref(), Some(irqs), "{out}");
    assert_eq!(line_value(&out, "kernel threads").as_deref(), Some("7 moved off 1,5"), "{out}");
    d.stop();
}

#[test]
fn varlink_isolation_is_shown() {
    isolation_is_shown(false);
}

#[test]
fn dbus_isolation_is_shown() {
    isolation_is_shown(true);
}

/// `pool show` and `status` on the sample's cache class (`[pools.dp.cache] l3 = "50%"`, applied
/// to the sandbox's simulated resctrl: 12 ways, so the top 6, `fc0`).
fn classes_are_shown(dbus: bool) {
    let dir = tempdir();
    let d = Daemon::start(dir.path());
    let ctl = Ctl::new(&d, dbus);
    let (code, out, err) = ctl.human(&["pool", "show", "dp"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("classes:\n  cache.l3 = 50%: applied (fc0 in cpupool-dp)\n"), "{out}");
    let (_, web, _) = ctl.human(&["pool", "show", "web"]);
    assert!(!web.contains("classes:"), "{web}");
    let json = ctl.ok(&["pool", "show", "dp"]);
    assert_eq!(json["pool"]["name"], "dp", "{json}");
    assert_eq!(
        json["classes"],
        serde_json::json!([{ "pool": "dp", "class": "cache", "key": "l3", "wanted": "50%", "in_force": "fc0",
                             "scope": "cpupool-dp", "state": "applied", "reason": "" }])
    );
    let (code, out, err) = ctl.human(&["status"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(line_value(&out, "classes").as_deref(), Some("dp cache"), "{out}");
    assert_eq!(ctl.ok(&["status"])["classes"], json["classes"]);
    d.stop();
}

#[test]
fn varlink_classes_are_shown() {
    classes_are_shown(false);
}

#[test]
fn dbus_classes_are_shown() {
    classes_are_shown(true);
}

/// An assign whose first step fails applies nothing, so its rollback has nothing to undo: the
/// daemon warns of the failure and logs no error-level rollback. The sandbox runs the cgroupfs
/// backend, where a unit target cannot be applied; a cgroup that does not exist fails the same
/// way.
#[test]
fn an_assign_that_never_applied_logs_no_rollback_error() {
    let dir = tempdir();
    let d = Daemon::start(dir.path());
    let ctl = Ctl::new(&d, false);
    for (target, why) in [
        (&["--unit", "nginx.service"][..], "unit targets need systemd"),
        (&["--cgroup", "cpupool.slice/cpupool-web.slice/none"][..], "no cgroup"),
    ] {
        let (code, e) = ctl.err(&[&["pool", "assign", "web", "--millicpus", "500"], target].concat());
        assert_eq!((code, e["error"].as_str()), (1, Some("ApplyFailed")), "{e}");
        assert!(e["message"].as_str().unwrap_or_default().contains(why), "{e}");
    }
    assert_eq!(ctl.ok(&["assignments"])["assignments"], json!([]));
    let logs = d.logs();
    assert!(logs.contains("failed: unit `nginx.service`: unit targets need systemd"), "{logs}");
    let errors: Vec<&str> = logs.lines().filter(|l| l.starts_with("cpupoold error")).collect();
    assert!(errors.is_empty(), "error-level lines for changes that never applied:\n{}", errors.join("\n"));
    d.stop();
}

/// `isolation boot-line` prints the line for the isolated pool alone on stdout, over both
/// transports alike, and says on stderr what the sandbox's kernel (booted without isolation
/// parameters) leaves uncovered; `--json` carries the same and nothing on stderr.
#[test]
fn isolation_boot_line_over_both_transports() {
    let dir = tempdir();
    let d = Daemon::start(dir.path());
    let (v, b) = (Ctl::new(&d, false), Ctl::new(&d, true));
    let dp = pool(&v.pools(), "dp")["cpus"].as_str().unwrap().to_owned();
    let line = format!("nohz_full={dp} rcu_nocbs={dp} isolcpus=managed_irq,{dp}\n");
    let (code, out, err) = v.human(&["isolation", "boot-line"]);
    assert_eq!((code, out.as_str()), (0, line.as_str()), "{err}");
    assert_eq!(
        err,
        format!("cpupoolctl: pool dp: nohz_full= misses {dp}; rcu_nocbs= misses {dp}; isolcpus=managed_irq misses {dp}\n")
    );
    assert_eq!(b.human(&["isolation", "boot-line"]), (code, out, err));
    let out = v.run(&["--json", "isolation", "boot-line"]);
    assert!(out.status.success() && out.stderr.is_empty(), "{}", text(&out.stderr));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["boot_line"], line.trim_end());
    assert_eq!(doc["pools"][0]["pool"], "dp");
    assert_eq!(doc, b.ok(&["isolation", "boot-line"]));
    d.stop();
}
