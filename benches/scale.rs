//! The daemon at scale: a simulated 1024-CPU host (8 sockets × 64 cores × 2 threads, 8 NUMA
//! nodes), 64 pools, and 0, 1,000 and 10,000 persisted assignments: the figures issue 17 asks
//! for, each against a floor or baseline measured in the same run, with the goal beside it.
//!
//! `cargo bench --bench scale` prepares one sandbox per size, builds the assignments in process
//! with the daemon's own `State` and saves them with its own `Store` ([`persist`], so the file is
//! exactly what the daemon writes), creates their target cgroups, then runs the real daemon
//! (bench profile, `--bus none`) and measures:
//!
//! - the floor: one `fdatasync` (`File::sync_data`) of a ~200-byte record appended to a file in
//!   the same directory, p50/p99 (what one durable journal record costs on this disk);
//! - `Assign` and `Release` over varlink, p50/p99 of 500 each, with 0, 1,000 and 10,000 other
//!   assignments, as ratios of the 0 figures and of the floor. The three daemons run side by
//!   side and the calls and floor samples are interleaved ([`interleaved`]), so that the load of
//!   a shared machine falls on every figure alike; each daemon checks for drift every 10 s (the
//!   default), so a check or two falls within the calls;
//! - start → `READY=1` (through a `NOTIFY_SOCKET`, as systemd sees it) with no assignment, with
//!   10,000 whose target cgroups must all be written, and a restart with them already right;
//! - `ListPools` and `ListAssignments`: reply size and p50;
//! - the daemon's RSS idle with 10,000 assignments (`VmRSS`), and its peak while 64 clients call
//!   `ListAssignments` at once (`VmHWM` after resetting it with `5 > /proc/PID/clear_refs`, or
//!   `VmRSS` sampled by a thread where the kernel refuses the reset);
//! - the state file's size.
//!
//! No figure is asserted. `cargo test --all-targets` runs it too, without `--bench`, with 20 and
//! 200 assignments and a few calls, so that it keeps working. `CPUPOOL_BENCH_DIR` chooses where
//! the sandbox lives (the durable-write figures depend on that file system).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::fs;
use std::io::Write;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::Varlink;
use cpupoold::sandbox::Sandbox;
use serde_json::json;

const SHAPE: &str = "8x64x2:8";
const POOLS: usize = 64;
/// Exclusive pools are p01..p31, shared ones p32..p63; each has 16 CPUs, the reserved p00 too.
const EXCLUSIVE: std::ops::Range<usize> = 1..32;
/// Exclusive assignments per exclusive pool (1 CPU each), leaving 4 CPUs free for the bench.
const PER_EXCLUSIVE: usize = 12;
/// Clients calling `ListAssignments` at once for the peak RSS.
const LIST_CLIENTS: usize = 64;

fn config() -> String {
    let mut c = String::from("[pools.p00]\nkind = \"reserved\"\ncount = 16\n");
    for i in 1..POOLS {
        let kind = if EXCLUSIVE.contains(&i) { "exclusive\"\nsmt = \"threads" } else { "shared" };
        c.push_str(&format!("\n[pools.p{i:02}]\nkind = \"{kind}\"\ncount = 16\n"));
    }
    c
}

/// Makes the sandbox in `sb` with `n` persisted assignments and their target cgroups.
fn prepare(sb: &Path, n: usize) -> Sandbox {
    let sandbox = Sandbox::prepare(sb, Some(SHAPE)).unwrap();
    let text = config();
    fs::write(sandbox.etc().join("config.toml"), &text).unwrap();
    let ids = persist(&sandbox, &text, n);
    for id in ids {
        // As the kernel makes a cgroup: the directory with its (empty) cpuset files. The
        // daemon's first start then writes into them, as it does on a host; creating 20,000
        // inodes on the disk under the sandbox is the simulation's cost, not the daemon's.
        let dir = sandbox.cgroupfs().join("scale").join(id);
        fs::create_dir_all(&dir).unwrap();
        for file in ["cpuset.cpus", "cpuset.mems"] {
            fs::write(dir.join(file), b"").unwrap();
        }
    }
    sandbox
}

/// Builds `n` assignments of targets `cgroup:scale/ID` with the daemon's own `State` and saves
/// them with its `Store`; returns their ids. The only place the bench uses the state's API
/// (kept in one function so that changes to that API touch only this).
fn persist(sandbox: &Sandbox, config: &str, n: usize) -> Vec<String> {
    use cpupoold::core::pool::PoolKind;
    use cpupoold::core::state::{AssignSpec, AssignmentId, Size, State, Target};
    let topo = sandbox.shape().topology();
    let settings = cpupoold::config::load_str(config, "config.toml").unwrap();
    let mut state = State::with_pools(settings.resolve_pools(&topo).unwrap());
    let shared: Vec<String> =
        state.pools().values().filter(|p| p.kind == PoolKind::Shared).map(|p| p.name.to_string()).collect();
    let exclusive = EXCLUSIVE.flat_map(|i| (0..PER_EXCLUSIVE).map(move |k| (i, k)));
    let mut wanted: Vec<(String, String, Size)> =
        exclusive.map(|(i, k)| (format!("p{i:02}"), format!("x{i}-{k}"), Size::Cpus(1))).take(n).collect();
    for k in 0..n - wanted.len() {
        wanted.push((shared[k % shared.len()].clone(), format!("s{k}"), Size::Millicpus(50)));
    }
    for (pool, id, size) in &wanted {
        let target = Target::parse(&format!("cgroup:scale/{id}")).unwrap();
        let spec = AssignSpec::new(pool, target, size.clone(), Some(AssignmentId::new(id).unwrap()));
        state.assign(&topo, &spec).unwrap();
    }
    cpupoold::host::store::Store::open(&sandbox.state()).unwrap().save(state.data()).unwrap();
    wanted.into_iter().map(|(_, id, _)| id).collect()
}

struct Running {
    child: Child,
    /// Kept open so that the daemon's later notifications (STOPPING=1) have a reader.
    _notify: UnixDatagram,
    varlink: PathBuf,
    ready: Duration,
}

impl Running {
    /// Starts the daemon on `sb` and waits for `READY=1` on a notify socket of its own; `args`
    /// are added to its command line.
    fn start(sb: &Sandbox, args: &[&str]) -> Running {
        let sock = sb.root().with_extension("notify");
        let _ = fs::remove_file(&sock);
        let notify = UnixDatagram::bind(&sock).unwrap();
        notify.set_read_timeout(Some(Duration::from_secs(600))).unwrap();
        let t0 = Instant::now();
        let child = Command::new(env!("CARGO_BIN_EXE_cpupoold"))
            .arg("--sandbox")
            .arg(sb.root())
            .args(["--bus", "none", "--log-level", "warn"])
            .args(args)
            .env("NOTIFY_SOCKET", &sock)
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let mut buf = [0u8; 4096];
        loop {
            let n = notify.recv(&mut buf).expect("READY=1 within 600 s");
            if String::from_utf8_lossy(&buf[..n]).lines().any(|l| l == "READY=1") {
                break;
            }
        }
        let ready = t0.elapsed();
        Running { child, _notify: notify, varlink: sb.run().join("org.cpupool.Manager"), ready }
    }

    fn status_kib(&self, field: &str) -> u64 {
        status_kib(self.child.id(), field)
    }

    fn stop(mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let status = self.child.wait().unwrap();
        assert!(status.success(), "daemon exited with {status}");
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `field` (`VmRSS`, `VmHWM`) of `/proc/PID/status`, in KiB.
fn status_kib(pid: u32, field: &str) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.split(':').next() == Some(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// (p50, p99) in ms.
fn percentiles(mut times: Vec<Duration>) -> (f64, f64) {
    times.sort();
    let n = times.len();
    (times[n / 2].as_secs_f64() * 1e3, times[(n * 99 / 100).min(n - 1)].as_secs_f64() * 1e3)
}

/// One daemon in the interleaved loop: its connection, and its Assign and Release times.
struct Subject {
    v: Varlink,
    assigns: Vec<Duration>,
    releases: Vec<Duration>,
}

impl Subject {
    /// Connects to `d`, running on `sb`, and makes the target cgroup.
    fn new(d: &Running, sb: &Sandbox) -> Subject {
        fs::create_dir_all(sb.cgroupfs().join("bench")).unwrap();
        Subject { v: Varlink::connect(&d.varlink), assigns: Vec::new(), releases: Vec::new() }
    }

    /// Assign then Release of one CPU in exclusive pool p01 (even `i`) or of 50 millicpus in
    /// shared pool p63 (odd `i`).
    fn assign_release(&mut self, i: usize) {
        let (pool, size) =
            if i.is_multiple_of(2) { ("p01", json!({"cpus": 1})) } else { ("p63", json!({"millicpus": 50})) };
        let mut params = json!({ "pool": pool, "target": "cgroup:bench", "id": format!("bench{i}") });
        params.as_object_mut().unwrap().extend(size.as_object().unwrap().clone());
        let t = Instant::now();
        self.v.call("Assign", params).unwrap();
        self.assigns.push(t.elapsed());
        let t = Instant::now();
        self.v.call("Release", json!({ "id": format!("bench{i}") })).unwrap();
        self.releases.push(t.elapsed());
    }
}

/// `n` rounds, each of one floor sample (a ~200-byte record appended to a file in `dir` and
/// `fdatasync`ed: what one durable journal record costs on this disk) and one Assign + Release
/// on every subject, in an order that turns each round. Interleaved so that a shared machine's
/// load (other builds, other disks' writes) falls on every figure alike: the ratios compare
/// like with like. Returns the floor's (p50, p99).
fn interleaved(subjects: &mut [Subject], dir: &Path, n: usize) -> (f64, f64) {
    let record = format!("{}\n", "x".repeat(199));
    let path = dir.join("floor.journal");
    let mut f = fs::OpenOptions::new().create(true).append(true).open(&path).unwrap();
    let mut floor = Vec::new();
    let k = subjects.len();
    for i in 0..n {
        let t = Instant::now();
        f.write_all(record.as_bytes()).unwrap();
        f.sync_data().unwrap();
        floor.push(t.elapsed());
        for j in 0..k {
            subjects[(i + j) % k].assign_release(i);
        }
    }
    drop(f);
    fs::remove_file(&path).unwrap();
    percentiles(floor)
}

/// (reply bytes, p50 ms) of `n` calls of `method`.
fn read_call(v: &mut Varlink, method: &str, n: usize) -> (usize, f64) {
    let size = serde_json::to_vec(&v.call(method, json!({})).unwrap()).unwrap().len();
    let times = (0..n)
        .map(|_| {
            let t = Instant::now();
            v.call(method, json!({})).unwrap();
            t.elapsed()
        })
        .collect();
    (size, percentiles(times).0)
}

/// The daemon's RSS before, and its peak while [`LIST_CLIENTS`] clients, all connected first,
/// call `ListAssignments` `rounds` times each at once, in KiB; and how the peak was taken.
fn peak_under_lists(d: &Running, rounds: usize, expect: usize) -> (u64, u64, &'static str) {
    let pid = d.child.id();
    let clients: Vec<Varlink> = (0..LIST_CLIENTS).map(|_| Varlink::connect(&d.varlink)).collect();
    let before = status_kib(pid, "VmRSS");
    // `5` resets VmHWM to the current RSS (proc(5)); where that is refused, a thread samples.
    let reset = fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok();
    let (done, sampled) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let sampler = (!reset).then(|| {
        let (done, sampled) = (done.clone(), sampled.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                sampled.fetch_max(status_kib(pid, "VmRSS"), Ordering::Relaxed);
                std::thread::yield_now();
            }
        })
    });
    let start = Arc::new(Barrier::new(LIST_CLIENTS));
    let threads: Vec<_> = clients
        .into_iter()
        .map(|mut v| {
            let start = start.clone();
            std::thread::spawn(move || {
                start.wait();
                for _ in 0..rounds {
                    let list = v.call("ListAssignments", json!({})).unwrap();
                    assert_eq!(list["assignments"].as_array().map(Vec::len), Some(expect));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    done.store(true, Ordering::Relaxed);
    match sampler {
        Some(s) => {
            s.join().unwrap();
            (before, sampled.load(Ordering::Relaxed), "VmRSS sampled")
        }
        None => (before, status_kib(pid, "VmHWM"), "VmHWM after clear_refs"),
    }
}

/// One line of the table: a figure, what it is set against, and the goal with pass/miss.
fn row(what: &str, value: String, against: String, goal: Option<(&str, bool)>) {
    let goal = goal.map_or(String::new(), |(g, ok)| format!("{g:<9} {}", if ok { "pass" } else { "MISS" }));
    println!("{what:<46} {value:>22}  {against:<44} {goal}");
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let (mid, n, calls, list_rounds) = if bench { (1_000, 10_000, 500, 3) } else { (20, 200, 4, 1) };
    let base = std::env::var_os("CPUPOOL_BENCH_DIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    let dir = tempfile::tempdir_in(base).unwrap();
    println!(
        "cpupoold at scale: {SHAPE} (1024 CPUs, 8 NUMA nodes, SMT-2), {POOLS} pools, in {}",
        dir.path().display()
    );

    // Every sandbox first, so that the daemons measured below run side by side.
    let empty = prepare(&dir.path().join("empty"), 0);
    let mid_sb = prepare(&dir.path().join("mid"), mid);
    let t = Instant::now();
    let sb = prepare(&dir.path().join("full"), n);
    let prepared = t.elapsed();
    let state_size = fs::metadata(sb.state().join("state.json")).unwrap().len();

    // The default drift interval (10 s): a check or two falls within the measured calls, on every
    // daemon alike (at 10,000 assignments one reads back every target, about a second of CPU on
    // the sandbox: shorter intervals measure that CPU, not the engine).
    let args: &[&str] = &[];
    let d0 = Running::start(&empty, args);
    let empty_ready = d0.ready;
    let empty_rss = d0.status_kib("VmRSS");
    let first = Running::start(&sb, args);
    let first_ready = first.ready;
    first.stop();
    let d = Running::start(&sb, args);
    let restart_ready = d.ready;
    let idle_rss = d.status_kib("VmRSS");
    let d1 = Running::start(&mid_sb, args);

    let mut subjects = [Subject::new(&d0, &empty), Subject::new(&d1, &mid_sb), Subject::new(&d, &sb)];
    let floor = interleaved(&mut subjects, dir.path(), calls);
    let [s0, s1, s] = subjects;
    let (a0, r0) = (percentiles(s0.assigns), percentiles(s0.releases));
    let (a1, r1) = (percentiles(s1.assigns), percentiles(s1.releases));
    let (a, r) = (percentiles(s.assigns), percentiles(s.releases));
    let mut v0 = s0.v;
    let (pools_size0, _) = read_call(&mut v0, "ListPools", 1);
    drop(v0);
    drop(s1.v);
    d0.stop();
    d1.stop();

    let mut v = s.v;
    let (pools_size, pools_ms) = read_call(&mut v, "ListPools", calls);
    let (list_size, list_ms) = read_call(&mut v, "ListAssignments", calls.min(20));
    drop(v);
    let (before_lists, peak_rss, how) = peak_under_lists(&d, list_rounds, n);
    // A connection of its own: the one above would have been idle through the lists.
    let status = Varlink::connect(&d.varlink).call("Status", json!({})).unwrap();
    assert_eq!(status["assignments"], json!(n), "the daemon lost or gained assignments");
    d.stop();

    let ms = |v: f64| format!("{v:.2} ms");
    let pair = |(p50, p99): (f64, f64)| format!("p50 {p50:.2} p99 {p99:.2} ms");
    let ratio = |(p50, p99): (f64, f64), (b50, b99): (f64, f64)| (p50 / b50, p99 / b99);
    let mib = |kib: u64| kib as f64 / 1024.0;
    println!("{n} assignments built and saved in process in {:.1} s", prepared.as_secs_f64());
    println!("{:<46} {:>22}  {:<44} goal", "figure", "value", "against");
    row("floor: fdatasync of a 200-byte appended record", pair(floor), String::new(), None);
    row("Assign, 0 assignments", pair(a0), String::new(), None);
    let (x50, x99) = ratio(a1, a0);
    row(
        &format!("Assign, {mid} assignments"),
        pair(a1),
        format!("×{x50:.2} / ×{x99:.2} the 0 figures"),
        None,
    );
    let (x50, x99) = ratio(a, a0);
    let at_n = format!("×{x50:.2} / ×{x99:.2} the 0 figures");
    row(&format!("Assign, {n} assignments"), pair(a), at_n, Some(("≤1.5×", x50 <= 1.5 && x99 <= 1.5)));
    let x = a.1 / floor.1;
    let against = format!("p99 ×{x:.2} the floor's p99");
    row(&format!("Assign p99, {n} assignments"), ms(a.1), against, Some(("≤2×", x <= 2.0)));
    row("Release, 0 assignments", pair(r0), String::new(), None);
    let (x50, x99) = ratio(r1, r0);
    row(
        &format!("Release, {mid} assignments"),
        pair(r1),
        format!("×{x50:.2} / ×{x99:.2} the 0 figures"),
        None,
    );
    let (x50, x99) = ratio(r, r0);
    let against = format!("×{x50:.2} / ×{x99:.2} the 0 figures, p99 ×{:.2} the floor", r.1 / floor.1);
    row(&format!("Release, {n} assignments"), pair(r), against, None);
    let secs = |d: Duration| d.as_secs_f64() * 1e3;
    row("start -> READY=1, 0 assignments", ms(secs(empty_ready)), String::new(), None);
    let x = first_ready.as_secs_f64() / empty_ready.as_secs_f64();
    row(
        &format!("start -> READY=1, {n}, writing every cgroup"),
        ms(secs(first_ready)),
        format!("×{x:.1} the 0 figure"),
        Some(("<2 s", first_ready < Duration::from_secs(2))),
    );
    let x = restart_ready.as_secs_f64() / empty_ready.as_secs_f64();
    row(
        &format!("restart -> READY=1, {n}, cgroups already right"),
        ms(secs(restart_ready)),
        format!("×{x:.1} the 0 figure"),
        Some(("<200 ms", restart_ready < Duration::from_millis(200))),
    );
    row("RSS, 0 assignments", format!("{:.1} MiB", mib(empty_rss)), String::new(), None);
    let x = idle_rss as f64 / empty_rss as f64;
    row(
        &format!("RSS, {n} assignments, idle"),
        format!("{:.1} MiB", mib(idle_rss)),
        format!("×{x:.1} the 0 figure"),
        Some(("<40 MiB", mib(idle_rss) < 40.0)),
    );
    let (x, before) = (peak_rss as f64 / idle_rss as f64, mib(before_lists));
    row(
        &format!("RSS peak, {LIST_CLIENTS} concurrent ListAssignments"),
        format!("{:.1} MiB", mib(peak_rss)),
        format!("×{x:.1} idle; {before:.1} MiB before ({how}, {list_rounds} each)"),
        Some(("<96 MiB", mib(peak_rss) < 96.0)),
    );
    row("ListPools, 0 assignments", format!("{pools_size0} bytes"), String::new(), None);
    row(
        &format!("ListPools, {n} assignments"),
        format!("{pools_size} bytes"),
        format!("p50 {pools_ms:.2} ms"),
        None,
    );
    row(
        &format!("ListAssignments, {n} assignments"),
        format!("{list_size} bytes"),
        format!("p50 {list_ms:.2} ms"),
        None,
    );
    row(
        "state file",
        format!("{:.2} MiB", state_size as f64 / 1048576.0),
        format!("{state_size} bytes"),
        None,
    );
}
