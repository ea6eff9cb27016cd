//! The books match the kernel: what the daemon reports as assigned is what the kernel
//! enforces, read back, over both interfaces; and the sandbox never changes a real process.
//!
//! The sandbox's cgroupfs is a tree of plain files whose effective CPUs the daemon computes as
//! the kernel documents them (a simulated kernel: `sim::cgroup::effective_cpus`); the guest
//! suite (`tests/vm/checks/56-books.sh`) checks the same refusals on real cgroup v2 and systemd.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{Daemon, PrivateBus, Varlink};
use serde_json::{json, Value};

/// reserved 0,4; exclusive `dp` 1-2,5-6, an isolated partition; shared `web` 3,7.
const CONFIG: &str = "[pools.sys]\nkind = \"reserved\"\ncpus = \"0,4\"\n\n\
    [pools.dp]\nkind = \"exclusive\"\ncpus = \"1-2,5-6\"\nisolate = true\n\n\
    [pools.web]\nkind = \"shared\"\ncpus = \"3,7\"\n";

const PATH: &str = "/org/cpupool/Manager1";
const IFACE: &str = "org.cpupool.Manager1";

fn start(dir: &Path, args: &[&str]) -> (PrivateBus, Daemon) {
    let bus = PrivateBus::start(dir);
    let mut all = vec!["--bus", bus.address.as_str()];
    all.extend_from_slice(args);
    let d = Daemon::start_shaped(dir, "1x4x2:1", Some(CONFIG), &all);
    (bus, d)
}

fn busctl(bus: &PrivateBus, args: &[&str]) -> Output {
    Command::new("busctl")
        .arg(format!("--address={}", bus.address))
        .args(["--json=short", "call", "org.cpupool.Manager1", PATH, IFACE])
        .args(args)
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The varlink error name and parameters of a call that must fail.
fn refused(v: &mut Varlink, method: &str, params: Value) -> (String, Value) {
    match v.call(method, params) {
        Ok(reply) => panic!("{method} was accepted: {reply}"),
        Err(e) => e,
    }
}

fn assignments(v: &mut Varlink) -> Vec<Value> {
    v.call("ListAssignments", json!({})).unwrap()["assignments"].as_array().cloned().unwrap_or_default()
}

/// `Cpus_allowed_list` of a real process.
fn allowed(pid: u32) -> String {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status.lines().find(|l| l.starts_with("Cpus_allowed_list")).unwrap().to_owned()
}

/// Waits (up to `PATIENCE`) for `cond`, checking every 50 ms (the daemon's drift check runs every
/// second here); panics with `what` when it never holds.
fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + test_support::wait::PATIENCE;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A cgroup outside its pool's slice, whose parent lacks the pool's CPUs, is refused over
/// both interfaces with the parent and its effective CPUs named; nothing is booked or written.
#[test]
fn a_target_outside_its_pool_is_refused_and_nothing_is_booked() {
    let dir = tempfile::tempdir().unwrap();
    let (bus, d) = start(dir.path(), &[]);
    let mut v = Varlink::connect(&d.varlink);
    fs::create_dir_all(d.sb.join("cgroup/work/app")).unwrap();
    let state_before = d.state_file();

    let (name, params) =
        refused(&mut v, "Assign", json!({ "pool": "dp", "target": "cgroup:work/app", "cpus": 2 }));
    assert_eq!(name, "org.cpupool.Manager.TargetOutsidePool", "{params}");
    assert_eq!(params["target"], "cgroup:work/app");
    assert_eq!(params["parent"], "work");
    // Without cpuset.cpus.exclusive (the sandbox models Linux 6.1), cpupool.slice is a root
    // partition holding every pool CPU: the root (and so work) keeps the reserved ones.
    assert_eq!(params["parent_cpus"], "0,4", "{params}");
    assert!(params["hint"].as_str().unwrap().contains("cpupool.slice/cpupool-dp.slice"), "{params}");

    let out = busctl(&bus, &["Assign", "ssuts", "dp", "cgroup:work/app", "2", "0", ""]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("cannot run on CPUs") && err.contains("`work`"), "{err}");
    let named = Command::new("dbus-send")
        .arg(format!("--bus={}", bus.address))
        .args(["--print-reply", "--dest=org.cpupool.Manager1", PATH, "org.cpupool.Manager1.Assign"])
        .args(["string:dp", "string:cgroup:work/app", "uint32:2", "uint64:0", "string:"])
        .output()
        .unwrap();
    assert!(
        text(&named.stderr).contains("org.cpupool.Manager1.Error.TargetOutsidePool"),
        "{}",
        text(&named.stderr)
    );

    assert!(assignments(&mut v).is_empty());
    assert!(!d.sb.join("cgroup/work/app/cpuset.cpus").exists(), "the refused target was written");
    assert_eq!(d.state_file(), state_before, "a refused assignment changed the state file");
    let pool = v.call("GetPool", json!({ "name": "dp" })).unwrap();
    assert_eq!(pool["pool"]["free_cpus"], "1-2,5-6", "a refused assignment kept CPUs booked");

    // Inside the pool's slice the same request is accepted, and what is read back is it.
    fs::create_dir_all(d.sb.join("cgroup/cpupool.slice/cpupool-dp.slice/app")).unwrap();
    let a = v
        .call(
            "Assign",
            json!({ "pool": "dp", "target": "cgroup:cpupool.slice/cpupool-dp.slice/app", "cpus": 2 }),
        )
        .unwrap();
    assert_eq!(a["assignment"]["state"], "applied", "{a}");
    let cpus = a["assignment"]["cpus"].as_str().unwrap().to_owned();
    assert_eq!(d.cgroup("cpupool.slice/cpupool-dp.slice/app/cpuset.cpus").as_deref(), Some(cpus.as_str()));
}

/// Targets that would defeat the pools: cpupoold's own slices, host slices and their
/// ancestors, and cgroups nested in (or holding) another assignment's target.
#[test]
fn targets_that_would_defeat_the_pools_are_refused_over_both_interfaces() {
    let dir = tempfile::tempdir().unwrap();
    let (bus, d) = start(dir.path(), &[]);
    let mut v = Varlink::connect(&d.varlink);
    for target in [
        "cgroup:cpupool.slice",
        "cgroup:cpupool.slice/cpupool-dp.slice",
        "unit:cpupool-dp.slice",
        "cgroup:system.slice",
        "unit:system.slice",
        "unit:user.slice",
        "unit:init.scope",
        "unit:-.slice",
    ] {
        let (name, params) =
            refused(&mut v, "Assign", json!({ "pool": "web", "target": target, "millicpus": 100 }));
        assert_eq!(name, "org.cpupool.Manager.TargetNotAllowed", "{target}: {params}");
        assert_eq!(params["target"], target);
        let out = busctl(&bus, &["Assign", "ssuts", "web", target, "0", "100", ""]);
        assert!(!out.status.success(), "{target}");
        assert!(text(&out.stderr).contains("cannot be assigned"), "{target}: {}", text(&out.stderr));
    }
    // dp's partition is still isolated: the refused shared assignment never touched it.
    assert_eq!(d.cgroup("cpupool.slice/cpupool-dp.slice/cpuset.cpus.partition").as_deref(), Some("isolated"));

    // Nested: a child of an exclusive assignment's target, and a parent of it.
    fs::create_dir_all(d.sb.join("cgroup/cpupool.slice/cpupool-dp.slice/app/sub")).unwrap();
    v.call(
        "Assign",
        json!({ "pool": "dp", "target": "cgroup:cpupool.slice/cpupool-dp.slice/app", "cpus": 2, "id": "app" }),
    )
    .unwrap();
    let (name, params) = refused(
        &mut v,
        "Assign",
        json!({ "pool": "dp", "target": "cgroup:cpupool.slice/cpupool-dp.slice/app/sub", "cpus": 2 }),
    );
    assert_eq!(name, "org.cpupool.Manager.TargetNotAllowed", "{params}");
    assert!(params["reason"].as_str().unwrap().contains("assignment `app`"), "{params}");
    let out = busctl(
        &bus,
        &["Assign", "ssuts", "dp", "cgroup:cpupool.slice/cpupool-dp.slice/app/sub", "2", "0", ""],
    );
    assert!(text(&out.stderr).contains("lies inside"), "{}", text(&out.stderr));
    assert_eq!(assignments(&mut v).len(), 1);
    assert!(!d.sb.join("cgroup/cpupool.slice/cpupool-dp.slice/app/sub/cpuset.cpus").exists());
}

/// Drift: a rewritten file is restored; a target the kernel confines elsewhere (its parent was
/// narrowed behind the daemon's back) is degraded, shown in the assignment, the status and
/// the Monitor stream, and restored when the parent is fixed.
#[test]
fn drift_is_corrected_or_reported_degraded_and_restored() {
    let dir = tempfile::tempdir().unwrap();
    let (bus, d) = start(dir.path(), &["--check-interval", "1"]);
    let mut v = Varlink::connect(&d.varlink);
    let mut monitor = Varlink::connect(&d.varlink);
    monitor.monitor().unwrap();
    fs::create_dir_all(d.sb.join("cgroup/cpupool.slice/cpupool-web.slice/mid/app")).unwrap();
    v.call(
        "Assign",
        json!({ "pool": "web", "target": "cgroup:cpupool.slice/cpupool-web.slice/mid/app", "millicpus": 500, "id": "w" }),
    )
    .unwrap();
    let file = d.sb.join("cgroup/cpupool.slice/cpupool-web.slice/mid/app/cpuset.cpus");
    // Rewritten by someone: restored by the next check.
    fs::write(&file, "3\n").unwrap();
    wait_until("the rewritten cpuset.cpus to be restored", || {
        fs::read_to_string(&file).unwrap_or_default().trim() == "3,7"
    });
    // The parent narrowed by someone else: the target cannot have 3,7 and is degraded.
    let mid = d.sb.join("cgroup/cpupool.slice/cpupool-web.slice/mid/cpuset.cpus");
    fs::write(&mid, "3\n").unwrap();
    wait_until("the assignment to be degraded", || {
        v.call("GetAssignment", json!({ "id": "w" })).unwrap()["assignment"]["state"] == "degraded"
    });
    let a = v.call("GetAssignment", json!({ "id": "w" })).unwrap();
    assert!(a["assignment"]["reason"].as_str().unwrap().contains("mid"), "{a}");
    assert_eq!(v.call("Status", json!({})).unwrap()["degraded_assignments"], 1);
    let out = busctl(&bus, &["ListAssignments", "s", ""]);
    assert!(text(&out.stdout).contains("degraded"), "{}", text(&out.stdout));
    fs::write(&mid, "\n").unwrap();
    wait_until("the assignment to be restored", || {
        v.call("GetAssignment", json!({ "id": "w" })).unwrap()["assignment"]["state"] == "applied"
    });
    // Monitor said so, in order.
    let mut changes = Vec::new();
    while !changes.contains(&"restored".to_owned()) {
        let ev = monitor.read().unwrap();
        if ev["parameters"]["event"]["id"] == "w" {
            changes.push(ev["parameters"]["event"]["change"].as_str().unwrap_or_default().to_owned());
        }
    }
    assert_eq!(changes, ["added", "degraded", "restored"]);
    assert_eq!(v.call("Status", json!({})).unwrap()["degraded_assignments"], 0);
}

/// The sandbox never changes a real process: a pid target and `Run` (over both interfaces)
/// record the simulated CPUs under DIR/proc, and the affinity of PID 1 and of this process
/// is what it was.
#[test]
fn the_sandbox_never_changes_a_real_process() {
    let dir = tempfile::tempdir().unwrap();
    let (bus, d) = start(dir.path(), &[]);
    let mut v = Varlink::connect(&d.varlink);
    let me = std::process::id();
    let (init_before, me_before) = (allowed(1), allowed(me));

    v.call("Assign", json!({ "pool": "web", "target": "pid:1", "millicpus": 100, "id": "init" })).unwrap();
    let out = busctl(&bus, &["Run", "suuts", "web", &me.to_string(), "0", "200", "me"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = busctl(&bus, &["Release", "s", "me"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    v.call("Run", json!({ "pool": "web", "pid": me, "millicpus": 200, "id": "me2" })).unwrap();

    assert_eq!(allowed(1), init_before, "the sandbox changed PID 1's affinity");
    assert_eq!(allowed(me), me_before, "the sandbox changed the test process's affinity");
    let recorded = fs::read_to_string(d.sb.join("proc/1/status")).unwrap();
    assert_eq!(recorded, "Cpus_allowed_list:\t3,7\n");
    let recorded = fs::read_to_string(d.sb.join(format!("proc/{me}/status"))).unwrap();
    assert_eq!(recorded, "Cpus_allowed_list:\t3,7\n");
    let a = v.call("GetAssignment", json!({ "id": "me2" })).unwrap();
    assert_eq!(a["assignment"]["state"], "applied", "{a}");
}
