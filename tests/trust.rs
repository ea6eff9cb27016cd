//! What the sandbox daemon reads back from its state directory is held to the checks a live
//! request passes: journal records with valid checksums that a request would be refused for
//! are dropped at start (and stay dropped), a record that breaks the state's rules is named by
//! its file and record and `--restore-previous-state` keeps the records before it, and state
//! files others may write are warned about or, writable by every user, not trusted.
//!
//! The records are written with the store's own append, so their checksums are valid: only
//! what they hold is wrong. Host 1x4x2 (tests/fixtures/1x4x2.toml): reserved 0,4; exclusive
//! `dp` 1-2,5-6 in whole cores; shared `web` 3,7.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use common::{Daemon, Varlink};
use cpupoold::core::cpuset::CpuSet;
use cpupoold::core::pool::{PoolKind, PoolName};
use cpupoold::core::state::{Assignment, AssignmentId, Delta, State, StateData, Target};
use cpupoold::host::store::{Loaded, Store};
use serde_json::json;

/// The state the files in `sb` hold.
fn saved(sb: &Path) -> StateData {
    let store = Store::open(&sb.join("state")).unwrap();
    match store.load(|s: &mut State, d: Delta| s.apply(d)).unwrap() {
        Loaded::State(s) => StateData::from(s),
        Loaded::Fresh => panic!("no state in {}", sb.display()),
    }
}

/// Appends, with the store's own append (a valid checksum), a record that adds `a`.
fn append(sb: &Path, a: Assignment) {
    let next_id = saved(sb).next_id;
    let store = Store::open(&sb.join("state")).unwrap();
    store.append(&Delta { upsert: vec![a], next_id, ..Delta::default() }).unwrap();
}

fn assignment(id: &str, pool: &str, target: &str, cpus: &str, process_start: Option<u64>) -> Assignment {
    let cpus = CpuSet::parse(cpus).unwrap();
    let kind = if pool == "dp" { PoolKind::Exclusive } else { PoolKind::Shared };
    let millicpus = if kind == PoolKind::Exclusive { cpus.len() as u64 * 1000 } else { 100 };
    Assignment {
        id: AssignmentId::new(id).unwrap(),
        pool: PoolName::new(pool).unwrap(),
        kind,
        target: Target::parse(target).unwrap(),
        cpus,
        millicpus,
        reclaim: false,
        process_start,
        container: None,
    }
}

fn ids(d: &Daemon) -> Vec<String> {
    let list = Varlink::connect(&d.varlink).call("ListAssignments", json!({})).unwrap();
    list["assignments"].as_array().unwrap().iter().map(|a| a["id"].as_str().unwrap().to_owned()).collect()
}

/// `cpupoold --sandbox SB` run to its end (it refuses to start): its stderr.
fn refused(sb: &Path, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_cpupoold"))
        .arg("--sandbox")
        .arg(sb)
        .args(["--bus", "none"])
        .args(args)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{err}");
    err
}

#[test]
fn journal_records_a_request_would_be_refused_for_are_dropped_at_start_for_good() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), &["--bus", "none"]);
    let sb = d.sb.clone();
    fs::create_dir_all(sb.join("cgroup/app")).unwrap();
    let good = json!({ "pool": "web", "target": "cgroup:app", "millicpus": 100, "id": "good" });
    Varlink::connect(&d.varlink).call("Assign", good).unwrap();
    d.stop();

    // A host slice, and PID 1 with a start time that is not its own: a request for either is
    // refused (the slice by the target rules, the process by its start time).
    append(&sb, assignment("host", "web", "cgroup:system.slice", "3,7", None));
    append(&sb, assignment("init", "web", "pid:1", "3,7", Some(u64::MAX - 1)));
    let system_slice = sb.join("cgroup/system.slice/cpuset.cpus");
    let before = fs::read_to_string(&system_slice).ok();

    let d = Daemon::start(dir.path(), &["--bus", "none"]);
    let logs = d.logs();
    let journal = sb.join("state/state.journal").display().to_string();
    for (id, why) in [("host", "`system.slice` is `system.slice`"), ("init", "process 1 started at")] {
        let line = logs
            .lines()
            .find(|l| l.contains(&format!("assignment {id} (")))
            .unwrap_or_else(|| panic!("no refusal of {id}:\n{logs}"));
        assert!(line.contains("cpupoold error: "), "{line}");
        assert!(line.contains(&format!("`{journal}` record ")) && line.contains(" (byte "), "{line}");
        assert!(line.contains(why) && line.contains("it is dropped, not applied"), "{line}");
    }
    assert!(logs.contains("2 assignments dropped from the state at start (see the log)"), "{logs}");
    assert_eq!(ids(&d), ["good"]);
    assert_eq!(fs::read_to_string(&system_slice).ok(), before, "the host slice was confined");
    d.stop();

    // Durable: the files no longer hold them, and the next start has nothing to drop.
    let kept: Vec<String> = saved(&sb).assignments.keys().map(ToString::to_string).collect();
    assert_eq!(kept, ["good"]);
    let d = Daemon::start(dir.path(), &["--bus", "none"]);
    assert!(!d.logs().contains("dropped"), "{}", d.logs());
    assert_eq!(ids(&d), ["good"]);
    d.stop();
}

#[test]
fn a_journal_record_that_breaks_the_rules_is_named_and_restore_keeps_the_records_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), &["--bus", "none"]);
    let sb = d.sb.clone();
    d.stop();
    // Two exclusive assignments owning the same core, the second in a record of its own.
    append(&sb, assignment("app-x", "dp", "cgroup:app-x", "1,5", None));
    append(&sb, assignment("app-y", "dp", "cgroup:app-y", "1,5", None));
    let journal = sb.join("state/state.journal");
    let bytes = fs::read(&journal).unwrap();

    let err = refused(&sb, &[]);
    let offset = String::from_utf8_lossy(&bytes).rfind("\nr ").unwrap() + 1;
    let named = format!("`{}` has an intact checksum on record ", journal.display());
    assert!(err.contains(&named) && err.contains(&format!(" at byte {offset} ")), "{err}");
    assert!(err.contains("assignments `app-x` and `app-y` both own CPUs 1,5"), "{err}");
    assert!(err.contains("--restore-previous-state to keep the snapshot and the journal's records"), "{err}");
    assert!(!err.contains("state.json`"), "{err}");
    assert_eq!(fs::read(&journal).unwrap(), bytes, "the journal is left alone");

    // What the error promised: the snapshot and the records before the bad one.
    let d = Daemon::start(dir.path(), &["--bus", "none", "--restore-previous-state"]);
    assert_eq!(ids(&d), ["app-x"], "{}", d.logs());
    assert_eq!(fs::read(sb.join("state/state.journal.corrupt")).unwrap(), bytes);
    d.stop();
}

#[test]
fn state_files_others_may_write_are_warned_about_and_not_trusted_when_everyone_may() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), &["--bus", "none"]);
    let sb = d.sb.clone();
    d.stop();
    let state = sb.join("state/state.json");
    let journal = sb.join("state/state.journal");

    // Another owner, and writable by the group: read, with a warning naming file, owner, mode.
    std::os::unix::fs::chown(&state, Some(4242), None).unwrap();
    fs::set_permissions(&journal, fs::Permissions::from_mode(0o664)).unwrap();
    let d = Daemon::start(dir.path(), &["--bus", "none"]);
    let logs = d.logs();
    let me = nix::unistd::geteuid();
    let owned = format!("`{}` is owned by uid 4242, not by cpupoold's uid {me} (mode 0600)", state.display());
    assert!(logs.contains(&owned), "{logs}");
    let group = format!("`{}` is writable by its group (mode 0664", journal.display());
    assert!(logs.contains(&group), "{logs}");
    d.stop();

    // Writable by every user: not trusted, and the daemon does not start on it. (The start
    // above wrote the snapshot afresh, as its own.)
    fs::set_permissions(&state, fs::Permissions::from_mode(0o666)).unwrap();
    let err = refused(&sb, &[]);
    assert!(err.contains(&state.display().to_string()), "{err}");
    assert!(err.contains(&format!("writable by every user (mode 0666, owner uid {me})")), "{err}");
}
