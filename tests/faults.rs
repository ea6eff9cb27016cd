//! The state directory fails under the daemon: a full file system (a small tmpfs mounted on it)
//! and a read-only one (a read-only bind mount; root ignores mode bits). Every mutating call,
//! over varlink and over D-Bus, must fail with `NotDurable` and change nothing (state file,
//! pools, assignments, cgroup files, runtime drop-in), reads must keep working, and once the
//! file system recovers the next mutation succeeds without a restart.
//!
//! Needs root (to mount): fails where mounting is impossible, saying why, or skips with
//! `CPUPOOL_TESTS_MAY_SKIP=1` (`test_support::needs`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{Daemon, PrivateBus, Varlink};
use serde_json::{json, Value};
use zbus::zvariant::{OwnedValue, Str};

/// A mount that is undone when dropped.
struct Mount(PathBuf);

impl Mount {
    fn run(args: &[&str]) -> Result<(), String> {
        let out = Command::new("mount").args(args).output().map_err(|e| format!("mount: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!("mount {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
        }
    }

    fn tmpfs(dir: &Path, size: &str) -> Result<Mount, String> {
        fs::create_dir_all(dir).unwrap();
        Mount::run(&["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs", dir.to_str().unwrap()])?;
        Ok(Mount(dir.to_owned()))
    }

    fn read_only(dir: &Path) -> Result<Mount, String> {
        let d = dir.to_str().unwrap();
        Mount::run(&["--bind", d, d])?;
        let m = Mount(dir.to_owned());
        Mount::run(&["-o", "remount,bind,ro", d])?;
        Ok(m)
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn skip(why: &str) {
    test_support::needs::unavailable(
        &format!("to mount a file system for the state directory ({why})"),
        "run the tests as root, as CI does",
    );
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// A D-Bus call: `Ok(())` or the error name.
fn dbus<B>(rt: &tokio::runtime::Runtime, conn: &zbus::Connection, method: &str, body: B) -> Result<(), String>
where
    B: serde::Serialize + zbus::zvariant::DynamicType,
{
    rt.block_on(conn.call_method(
        Some("org.cpupool.Manager1"),
        "/org/cpupool/Manager1",
        Some("org.cpupool.Manager1"),
        method,
        &body,
    ))
    .map(|_| ())
    .map_err(|e| match e {
        zbus::Error::MethodError(name, _, _) => name.to_string(),
        other => panic!("{method}: {other}"),
    })
}

/// Everything a refused mutation must leave alone.
fn observed(d: &Daemon, v: &mut Varlink) -> Vec<Value> {
    let mut cgroups = json!({});
    for rel in
        ["k/a", "k/b", "cpupool.slice", "cpupool.slice/cpupool-dp.slice", "cpupool.slice/cpupool-web.slice"]
    {
        cgroups[rel] = json!(d.cgroup(&format!("{rel}/cpuset.cpus")));
    }
    vec![
        json!(String::from_utf8_lossy(&d.state_file())),
        v.call("ListPools", json!({})).unwrap(),
        v.call("ListAssignments", json!({})).unwrap(),
        cgroups,
        json!(d.sb.join("etc/cpupoold/config.d/90-cpupoold-runtime.toml").exists()),
    ]
}

/// Every kind of mutation, over both interfaces, is refused `NotDurable` and changes nothing.
fn mutations_fail_typed_and_change_nothing(d: &Daemon, bus: &PrivateBus, what: &str) {
    let mut v = Varlink::connect(&d.varlink);
    let rt = rt();
    let conn = rt.block_on(async {
        zbus::connection::Builder::address(bus.address.as_str()).unwrap().build().await.unwrap()
    });
    let before = observed(d, &mut v);
    let not_durable = Some("org.cpupool.Manager.NotDurable".to_owned());
    let dbus_not_durable = Err("org.cpupool.Manager1.Error.NotDurable".to_owned());

    let calls: Vec<(&str, Value)> = vec![
        ("Assign", json!({ "pool": "web", "target": "cgroup:k/b", "millicpus": 100, "id": "new" })),
        ("Assign", json!({ "pool": "dp", "target": "cgroup:k/b", "cpus": 2 })),
        ("Release", json!({ "id": "held" })),
        ("ResizePool", json!({ "name": "web", "cpus": "3" })),
    ];
    for (method, params) in calls {
        let got = v.call(method, params.clone()).err().map(|(name, _)| name);
        assert_eq!(got, not_durable, "{what}: varlink {method} {params}");
        assert_eq!(observed(d, &mut v), before, "{what}: varlink {method} {params} changed something");
    }
    let options = |cpus: &str| {
        std::collections::BTreeMap::from([("cpus".to_owned(), OwnedValue::from(Str::from(cpus.to_owned())))])
    };
    assert_eq!(
        dbus(&rt, &conn, "Assign", ("web", "cgroup:k/b", 0u32, 100u64, "new")),
        dbus_not_durable,
        "{what}"
    );
    assert_eq!(observed(d, &mut v), before, "{what}: D-Bus Assign changed something");
    assert_eq!(dbus(&rt, &conn, "Release", ("held",)), dbus_not_durable, "{what}");
    assert_eq!(observed(d, &mut v), before, "{what}: D-Bus Release changed something");
    assert_eq!(dbus(&rt, &conn, "ResizePool", ("web", options("3"))), dbus_not_durable, "{what}");
    assert_eq!(observed(d, &mut v), before, "{what}: D-Bus ResizePool changed something");

    // Reads keep working on both interfaces.
    for m in ["ListPools", "ListAssignments", "Status", "GetTopology"] {
        v.call(m, json!({})).unwrap_or_else(|e| panic!("{what}: {m}: {e:?}"));
    }
    dbus(&rt, &conn, "ListPools", ()).unwrap();
    assert_eq!(v.call("GetAssignment", json!({ "id": "held" })).unwrap()["assignment"]["cpus"], "1,5");
}

/// The daemon with assignment `held` (dp, 2 CPUs on cgroup k/a) made while the disk was fine.
fn start(dir: &Path) -> (PrivateBus, Daemon) {
    let bus = PrivateBus::start(dir);
    let d = Daemon::start(dir, &["--bus", &bus.address, "--log-level", "warn"]);
    for cg in ["k/a", "k/b"] {
        fs::create_dir_all(d.sb.join("cgroup").join(cg)).unwrap();
    }
    let mut v = Varlink::connect(&d.varlink);
    v.call("Assign", json!({ "pool": "dp", "target": "cgroup:k/a", "cpus": 2, "id": "held" })).unwrap();
    (bus, d)
}

/// After the file system recovers, mutations work again and survive a restart.
fn recovers(d: Daemon, dir: &Path, bus: &PrivateBus) {
    let mut v = Varlink::connect(&d.varlink);
    v.call("Assign", json!({ "pool": "web", "target": "cgroup:k/b", "millicpus": 100, "id": "new" }))
        .unwrap();
    assert_eq!(d.cgroup("k/b/cpuset.cpus").as_deref(), Some("3,7"));
    d.stop();
    let d = Daemon::start(dir, &["--bus", &bus.address, "--log-level", "warn"]);
    let mut v = Varlink::connect(&d.varlink);
    let ids: Vec<String> = v.call("ListAssignments", json!({})).unwrap()["assignments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids, ["held", "new"]);
    d.stop();
}

#[test]
fn full_state_file_system_refuses_mutations_typed_and_keeps_serving_reads() {
    let dir = tempfile::tempdir().unwrap();
    let _mount = match Mount::tmpfs(&dir.path().join("sb/state"), "256k") {
        Ok(m) => m,
        Err(e) => return skip(&e),
    };
    let (bus, d) = start(dir.path());
    // Fill the file system to the last block.
    let filler = d.sb.join("state/filler");
    let mut f = fs::File::create(&filler).unwrap();
    let chunk = vec![0u8; 4096];
    while f.write_all(&chunk).is_ok() {}
    while f.write_all(&[0]).is_ok() {}
    drop(f);
    mutations_fail_typed_and_change_nothing(&d, &bus, "state dir full");
    assert!(d.logs().contains("No space left on device"), "the cause is logged:\n{}", d.logs());
    fs::remove_file(&filler).unwrap();
    recovers(d, dir.path(), &bus);
}

/// A restart on a full state file system (a reboot with /var full): the state loads but the
/// start cannot compact it. The daemon comes up with the saved assignment applied again, says
/// why it could not compact, refuses mutations `NotDurable`, and recovers once there is room.
/// Before, the start failed on `state.json.tmp` and no pool was applied.
#[test]
fn a_restart_on_a_full_state_file_system_applies_the_loaded_state() {
    let dir = tempfile::tempdir().unwrap();
    let _mount = match Mount::tmpfs(&dir.path().join("sb/state"), "256k") {
        Ok(m) => m,
        Err(e) => return skip(&e),
    };
    let (bus, d) = start(dir.path());
    let held = d.sb.join("cgroup/k/a/cpuset.cpus");
    let filler = d.sb.join("state/filler");
    d.stop();
    // As a reboot leaves it: the cgroup no longer confined to the assignment's CPUs.
    fs::write(&held, "0-7").unwrap();
    let mut f = fs::File::create(&filler).unwrap();
    let chunk = vec![0u8; 4096];
    while f.write_all(&chunk).is_ok() {}
    while f.write_all(&[0]).is_ok() {}
    drop(f);
    let d = Daemon::start(dir.path(), &["--bus", &bus.address, "--log-level", "warn"]);
    assert_eq!(fs::read_to_string(&held).unwrap().trim(), "1,5", "the saved assignment is applied again");
    assert!(
        d.logs().contains("could not be compacted") && d.logs().contains("No space left on device"),
        "the start says why it could not compact:\n{}",
        d.logs()
    );
    mutations_fail_typed_and_change_nothing(&d, &bus, "restarted with the state dir full");
    fs::remove_file(&filler).unwrap();
    recovers(d, dir.path(), &bus);
}

#[test]
fn read_only_state_dir_refuses_mutations_typed_and_keeps_serving_reads() {
    let dir = tempfile::tempdir().unwrap();
    let (bus, d) = start(dir.path());
    let mount = match Mount::read_only(&d.sb.join("state")) {
        Ok(m) => m,
        Err(e) => return skip(&e),
    };
    mutations_fail_typed_and_change_nothing(&d, &bus, "state dir read-only");
    assert!(d.logs().contains("Read-only file system"), "the cause is logged:\n{}", d.logs());
    drop(mount);
    recovers(d, dir.path(), &bus);
}
