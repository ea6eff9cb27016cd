//! Reclaim on the real `cpupoold` in a sandbox: assignments made while it runs are released
//! when their target goes (a cgroup removed, a process exited), and one released by its owner
//! meanwhile is forgotten without disturbing the others. The reclaimer looks only at the
//! assignment each event names, so these must all be picked up from their own events.

use std::fs;
use std::process::Command;

use serde_json::{json, Value};

mod common;
use common::{Daemon, Varlink};

/// The ids the daemon serves.
fn ids(v: &mut Varlink) -> Vec<String> {
    let r = v.call("ListAssignments", json!({})).unwrap_or_else(|e| panic!("ListAssignments: {e:?}"));
    r["assignments"]
        .as_array()
        .unwrap_or_else(|| panic!("{r}"))
        .iter()
        .filter_map(|a| a["id"].as_str().map(str::to_owned))
        .collect()
}

fn assign(v: &mut Varlink, target: &str, id: &str) -> Value {
    v.call("Assign", json!({ "pool": "web", "target": target, "millicpus": 100, "id": id }))
        .unwrap_or_else(|e| panic!("Assign {id} to {target}: {e:?}"))
}

#[test]
fn targets_that_go_away_are_reclaimed_and_a_release_by_the_owner_is_forgotten() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let d = Daemon::start(dir.path(), &[]);
    let mut v = Varlink::connect(&d.varlink);
    let slice = "cpupool.slice/cpupool-web.slice";
    for n in ["a", "b", "c", "m"] {
        fs::create_dir_all(d.sb.join("cgroup").join(slice).join(n)).unwrap_or_else(|e| panic!("{e}"));
        assign(&mut v, &format!("cgroup:{slice}/{n}"), n);
    }
    let mut child = Command::new("sleep").arg("600").spawn().unwrap_or_else(|e| panic!("{e}"));
    assign(&mut v, &format!("pid:{}", child.id()), "p");
    v.call("Release", json!({ "id": "b" })).unwrap_or_else(|e| panic!("Release b: {e:?}"));

    // The daemon's own cgroup writes are files in the sandbox's plain directory: empty it first.
    let a = d.sb.join("cgroup").join(slice).join("a");
    fs::remove_dir_all(&a).unwrap_or_else(|e| panic!("{}: {e}", a.display()));
    // A cgroup moved away is gone from its path too (cgroup v2 renames within a parent).
    let m = d.sb.join("cgroup").join(slice).join("m");
    fs::rename(&m, m.with_file_name("m-old")).unwrap_or_else(|e| panic!("{}: {e}", m.display()));
    let _ = child.kill();
    let _ = child.wait();
    let left = test_support::wait::until(test_support::wait::PATIENCE, "a, m and p to be reclaimed", || {
        let left = ids(&mut v);
        if left.iter().any(|i| i == "a" || i == "p" || i == "m") {
            Err(format!("still assigned: {left:?}"))
        } else {
            Ok(left)
        }
    });
    assert_eq!(left, ["c"], "c's cgroup is still there: it keeps its assignment");
    let logs = d.logs();
    for id in ["a", "m", "p"] {
        assert!(logs.contains(&format!("reclaimed assignment {id} ")), "{logs}");
    }
    assert!(
        !logs.contains("reclaiming assignment b"),
        "b, released by its owner, was not forgotten:\n{logs}"
    );
    d.stop();
}
