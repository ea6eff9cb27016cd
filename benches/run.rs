//! `cpupoolctl run -- true` against its floor, measured in the same run.
//!
//! `cargo bench --bench run` starts the real daemon (bench profile) on a sandbox host and
//! times, one after another:
//!
//! - `cpupoolctl --sandbox DIR pool list`: a process start, a connection and one read;
//! - one `Assign` + `Release` of 100 millicpus of `web` over a varlink connection already open
//!   (applied to the cgroup file and saved durably, each);
//! - `cpupoolctl --sandbox DIR run --pool web --millicpus 100 -- true` to its exit: the
//!   process, `GetPool`, `Run` (an assignment made), and cpupoolctl becoming `true`;
//! - the same until the daemon's own release is seen (its `removed` event, on a `Monitor`
//!   stream opened beforehand): the whole cycle, which the floor's `Release` stands for.
//!
//! The floor is the sum of the first two medians: what `run` cannot avoid (a CLI process and
//! a mutation round trip, and the release's); the target is within ×1.5 of it. Beside it, the
//! start of `true`: the one process `run` starts that the floor does not (COMMAND), which a
//! reader needs to tell design from overhead. `CPUPOOL_BENCH_BEFORE=PATH` times another
//! `cpupoolctl` binary's `run` too (an older build), against the same daemon. Each figure is
//! the median and the 99th percentile of 100 runs (30 for the CLI processes); no figure is
//! asserted. `cargo test --all-targets` runs it as a 3-run smoke test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "support/timing.rs"]
mod timing;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::{Daemon, Varlink};
use serde_json::json;
use timing::{measure, Stats};

/// `cpupoolctl` of this profile, next to this bench's directory (this bench belongs to the
/// cpupoold package: cargo does not build the CLI's binary for it). Under `cargo bench`
/// (`always`) it is built from this tree first: one an older build left there would be timed
/// in its place. The smoke test under `cargo test --all-targets` uses the workspace's, built
/// if missing.
fn cpupoolctl(always: bool) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(Path::parent).unwrap();
    let bin = dir.join("cpupoolctl");
    if bin.is_file() && !always {
        return bin;
    }
    let cargo = option_env!("CARGO").unwrap_or("cargo");
    let mut c = Command::new(cargo);
    c.args(["build", "--quiet", "-p", "cpupoolctl", "--manifest-path"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"));
    if dir.file_name().is_some_and(|n| n == "release") {
        c.arg("--release");
    }
    assert!(c.status().unwrap().success(), "building cpupoolctl");
    bin
}

fn row(name: &str, s: &Stats, floor: &Stats) {
    println!(
        "{name:<58} p50 {:>7.2} ms  p99 {:>7.2} ms  ×{:.2} the floor",
        s.p50.as_secs_f64() * 1e3,
        s.p99.as_secs_f64() * 1e3,
        s.p50.as_secs_f64() / floor.p50.as_secs_f64()
    );
}

/// Times `program ARGS` to its exit, checking that it succeeds.
fn started<S: AsRef<std::ffi::OsStr> + std::fmt::Debug>(n: usize, program: &Path, args: &[S]) -> Stats {
    measure(n, |_| {
        let st =
            Command::new(program).args(args).stdout(Stdio::null()).stderr(Stdio::null()).status().unwrap();
        assert!(st.success(), "{} {args:?}: {st}", program.display());
    })
}

/// `ctl --sandbox SB ARGS` (the daemon's sandbox), its output dropped.
fn ctl_command(ctl: &Path, sb: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(ctl);
    c.arg("--sandbox").arg(sb).args(args).stdout(Stdio::null()).stderr(Stdio::null());
    c
}

/// Times `ctl --sandbox SB ARGS` (the daemon's sandbox).
fn cli(n: usize, ctl: &Path, sb: &Path, args: &[&str]) -> Stats {
    measure(n, |_| {
        let st = ctl_command(ctl, sb, args).status().unwrap();
        assert!(st.success(), "{} {args:?}: {st}", ctl.display());
    })
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test` does not.
    let bench = std::env::args().any(|a| a == "--bench");
    let (n_cli, n_calls) = if bench { (30, 100) } else { (3, 3) };
    let ctl = cpupoolctl(bench);
    let base = std::env::var_os("CPUPOOL_BENCH_DIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    let dir = tempfile::tempdir_in(base).unwrap();
    let d = Daemon::start(dir.path(), &["--bus", "none", "--log-level", "warn"]);
    println!(
        "cpupoolctl run against its floor, {n_cli} runs of each command, {n_calls} round trips, sandbox 1x4x2 in {}",
        dir.path().display()
    );

    let list = cli(n_cli, &ctl, &d.sb, &["pool", "list"]);
    std::fs::create_dir_all(d.sb.join("cgroup/bench")).unwrap();
    let mut v = Varlink::connect(&d.varlink);
    let mutation = measure(n_calls, |i| {
        let id = format!("b{i}");
        v.call("Assign", json!({ "pool": "web", "target": "cgroup:bench", "millicpus": 100, "id": id }))
            .unwrap();
        v.call("Release", json!({ "id": id })).unwrap();
    });
    let floor = Stats { p50: list.p50 + mutation.p50, p99: list.p99 + mutation.p99 };
    // What `run` starts beyond the floor's one process: COMMAND. Not part of the floor; shown
    // so the rest can be told apart.
    let tru = started::<&str>(n_cli, Path::new("true"), &[]);
    let run = ["run", "--pool", "web", "--millicpus", "100", "--", "true"];
    let ran = cli(n_cli, &ctl, &d.sb, &run);
    // The whole cycle: until the daemon released the CPUs (every assignment here is a run's).
    let mut events = Varlink::connect(&d.varlink);
    events.monitor().unwrap();
    let cycle = measure(n_cli, |i| {
        let id = format!("cycle-{i}");
        let mut args = run.to_vec();
        args.splice(1..1, ["--id", id.as_str()]);
        let st = ctl_command(&ctl, &d.sb, &args).status().unwrap();
        assert!(st.success(), "{st}");
        loop {
            let e = events.read().unwrap();
            let e = &e["parameters"]["event"];
            if e["kind"] == "assignment" && e["id"] == id.as_str() && e["change"] == "removed" {
                break;
            }
        }
    });
    row("cpupoolctl pool list", &list, &floor);
    row("varlink Assign + Release (applied, durable)", &mutation, &floor);
    row("floor: pool list + Assign + Release", &floor, &floor);
    row("  true (COMMAND's start)", &tru, &floor);
    let processes = Stats { p50: floor.p50 + tru.p50, p99: floor.p99 + tru.p99 };
    row("  floor + COMMAND's start", &processes, &floor);
    row("cpupoolctl run --pool web --millicpus 100 -- true, to its exit", &ran, &floor);
    row("  the same, until the daemon's release is seen", &cycle, &floor);
    if let Some(before) = std::env::var_os("CPUPOOL_BENCH_BEFORE") {
        let before = cli(n_cli, Path::new(&before), &d.sb, &run);
        row("  the same, CPUPOOL_BENCH_BEFORE's cpupoolctl (to its exit)", &before, &floor);
    }
    test_support::wait::until(test_support::wait::PATIENCE, "every run's CPUs given back", || {
        let left = v.call("ListAssignments", json!({})).unwrap();
        match left["assignments"].as_array().map(Vec::len) {
            Some(0) => Ok(()),
            _ => Err(left.to_string()),
        }
    });
    d.stop();
}
