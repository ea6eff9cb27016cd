//! The daemon at scale: a simulated 1024-CPU host (8 sockets × 64 cores × 2 threads, 8 NUMA
//! nodes), 64 pools and 10,000 persisted assignments.
//!
//! `cargo bench --bench scale` prepares the sandbox, builds the 10,000 assignments in process
//! with the daemon's own `State` and saves them with its own `Store` (so the file is exactly what
//! the daemon writes), creates their 10,000 target cgroups, then runs the real daemon (bench
//! profile, `--bus none`) and measures:
//!
//! - start → `READY=1` (through a `NOTIFY_SOCKET`, as systemd sees it): first with every target
//!   cgroup still to be written, then a restart with the cgroups already right, and the same
//!   host with no assignment as the baseline;
//! - one `Assign` and one `Release` over varlink (p50/p99), against a bare durable write
//!   (write + fsync + rename + directory fsync) of the state file's size as the floor, and the
//!   same calls with no other assignment as the baseline;
//! - `ListPools` and `ListAssignments`: reply size and time;
//! - the daemon's RSS (`VmRSS` of `/proc/PID/status`): with no assignment, idle with 10,000, and
//!   after 64 concurrent clients made mixed calls;
//! - the state file's size.
//!
//! No figure is asserted. `cargo test --all-targets` runs it too, without `--bench`, with 200
//! assignments and a few calls, so that it keeps working. `CPUPOOL_BENCH_DIR` chooses where the
//! sandbox lives (the durable-write figures depend on that file system).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::fs;
use std::io::Write;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::Varlink;
use cpupoold::core::pool::PoolKind;
use cpupoold::core::state::{AssignSpec, Size, State, Target};
use cpupoold::host::store::Store;
use cpupoold::sandbox::Sandbox;
use serde_json::json;

const SHAPE: &str = "8x64x2:8";
const POOLS: usize = 64;
/// Exclusive pools are p01..p31, shared ones p32..p63; each has 16 CPUs, the reserved p00 too.
const EXCLUSIVE: std::ops::Range<usize> = 1..32;
/// Exclusive assignments per exclusive pool (1 CPU each), leaving 4 CPUs free for the bench.
const PER_EXCLUSIVE: usize = 12;

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
    let topo = sandbox.shape().topology();
    let settings = cpupoold::config::load_str(&text, "config.toml").unwrap();
    let mut state = State::with_pools(settings.resolve_pools(&topo).unwrap());
    let shared: Vec<String> =
        state.pools().values().filter(|p| p.kind == PoolKind::Shared).map(|p| p.name.to_string()).collect();
    let mut made = 0;
    'exclusive: for i in EXCLUSIVE {
        for k in 0..PER_EXCLUSIVE {
            if made == n {
                break 'exclusive;
            }
            assign(&mut state, &topo, &sandbox, &format!("p{i:02}"), &format!("x{i}-{k}"), Size::Cpus(1));
            made += 1;
        }
    }
    for k in 0..n - made {
        let pool = &shared[k % shared.len()];
        assign(&mut state, &topo, &sandbox, pool, &format!("s{k}"), Size::Millicpus(50));
    }
    Store::open(&sandbox.state()).unwrap().save(state.data()).unwrap();
    sandbox
}

fn assign(
    state: &mut State,
    topo: &cpupoold::core::topology::Topology,
    sb: &Sandbox,
    pool: &str,
    id: &str,
    size: Size,
) {
    fs::create_dir_all(sb.cgroupfs().join("scale").join(id)).unwrap();
    let spec = AssignSpec::new(
        pool,
        Target::parse(&format!("cgroup:scale/{id}")).unwrap(),
        size,
        Some(cpupoold::core::state::AssignmentId::new(id).unwrap()),
    );
    state.assign(topo, &spec).unwrap();
}

struct Running {
    child: Child,
    /// Kept open so that the daemon's later notifications (STOPPING=1) have a reader.
    _notify: UnixDatagram,
    varlink: PathBuf,
    ready: Duration,
}

impl Running {
    /// Starts the daemon on `sb` and waits for `READY=1` on a notify socket of its own.
    fn start(sb: &Sandbox) -> Running {
        let sock = sb.root().with_extension("notify");
        let _ = fs::remove_file(&sock);
        let notify = UnixDatagram::bind(&sock).unwrap();
        notify.set_read_timeout(Some(Duration::from_secs(600))).unwrap();
        let t0 = Instant::now();
        let child = Command::new(env!("CARGO_BIN_EXE_cpupoold"))
            .arg("--sandbox")
            .arg(sb.root())
            .args(["--bus", "none", "--log-level", "warn"])
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

    fn rss_kib(&self) -> u64 {
        let status = fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
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

fn percentiles(mut times: Vec<Duration>) -> (f64, f64) {
    times.sort();
    let n = times.len();
    (times[n / 2].as_secs_f64() * 1e3, times[(n * 99 / 100).min(n - 1)].as_secs_f64() * 1e3)
}

/// Assign then Release, `n` times, of one CPU in exclusive pool p01 and of 50 millicpus in
/// shared pool p63, alternately: (Assign times, Release times).
fn assign_release(v: &mut Varlink, sb: &Sandbox, n: usize) -> (Vec<Duration>, Vec<Duration>) {
    fs::create_dir_all(sb.cgroupfs().join("bench")).unwrap();
    let (mut assigns, mut releases) = (Vec::new(), Vec::new());
    for i in 0..n {
        let (pool, size) =
            if i % 2 == 0 { ("p01", json!({"cpus": 1})) } else { ("p63", json!({"millicpus": 50})) };
        let mut params = json!({ "pool": pool, "target": "cgroup:bench", "id": format!("bench{i}") });
        params.as_object_mut().unwrap().extend(size.as_object().unwrap().clone());
        let t = Instant::now();
        v.call("Assign", params).unwrap();
        assigns.push(t.elapsed());
        let t = Instant::now();
        v.call("Release", json!({ "id": format!("bench{i}") })).unwrap();
        releases.push(t.elapsed());
    }
    (assigns, releases)
}

/// One durable save of `size` bytes, `n` times.
fn durable_write(dir: &Path, size: usize, n: usize) -> Vec<Duration> {
    let data = vec![b'x'; size];
    let (tmp, dst) = (dir.join("floor.tmp"), dir.join("floor"));
    (0..n)
        .map(|_| {
            let t = Instant::now();
            let mut f = fs::File::create(&tmp).unwrap();
            f.write_all(&data).unwrap();
            f.sync_all().unwrap();
            fs::rename(&tmp, &dst).unwrap();
            fs::File::open(dir).unwrap().sync_all().unwrap();
            t.elapsed()
        })
        .collect()
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

/// 64 clients at once, each making `calls` rounds of ListPools, ListAssignments, and an
/// Assign + Release of 50 millicpus in a shared pool of its own.
fn load(sb: &Sandbox, path: &Path, calls: usize) -> Duration {
    let t = Instant::now();
    let threads: Vec<_> = (0..64)
        .map(|c| {
            let (path, cg) = (path.to_owned(), sb.cgroupfs().join(format!("load/{c}")));
            std::thread::spawn(move || {
                fs::create_dir_all(&cg).unwrap();
                let mut v = Varlink::connect(&path);
                for i in 0..calls {
                    v.call("ListPools", json!({})).unwrap();
                    v.call("ListAssignments", json!({})).unwrap();
                    let id = format!("load{c}-{i}");
                    let pool = format!("p{:02}", 32 + c % 32);
                    let target = format!("cgroup:load/{c}");
                    v.call("Assign", json!({ "pool": pool, "target": target, "millicpus": 50, "id": id }))
                        .unwrap();
                    v.call("Release", json!({ "id": id })).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    t.elapsed()
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let (n, calls, load_calls) = if bench { (10_000, 100, 10) } else { (200, 4, 1) };
    let base = std::env::var_os("CPUPOOL_BENCH_DIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    let dir = tempfile::tempdir_in(base).unwrap();
    println!(
        "cpupoold at scale: {SHAPE} (1024 CPUs, 8 NUMA nodes, SMT-2), {POOLS} pools, in {}",
        dir.path().display()
    );

    // The baseline: the same host and pools, no assignment.
    let empty = prepare(&dir.path().join("empty"), 0);
    let d = Running::start(&empty);
    let empty_ready = d.ready;
    let empty_rss = d.rss_kib();
    let mut v = Varlink::connect(&d.varlink);
    let (a0, r0) = assign_release(&mut v, &empty, calls);
    let (pools_size0, _) = read_call(&mut v, "ListPools", 1);
    drop(v);
    d.stop();

    let t = Instant::now();
    let sb = prepare(&dir.path().join("full"), n);
    let prepared = t.elapsed();
    let state_size = fs::metadata(sb.state().join("state.json")).unwrap().len();
    let first = Running::start(&sb);
    let first_ready = first.ready;
    first.stop();
    let d = Running::start(&sb);
    let idle_rss = d.rss_kib();
    let mut v = Varlink::connect(&d.varlink);
    let (a, r) = assign_release(&mut v, &sb, calls);
    let floor = durable_write(dir.path(), state_size as usize, calls);
    let (pools_size, pools_ms) = read_call(&mut v, "ListPools", calls);
    let (list_size, list_ms) = read_call(&mut v, "ListAssignments", calls.min(20));
    let load_time = load(&sb, &d.varlink, load_calls);
    let loaded_rss = d.rss_kib();
    let status = v.call("Status", json!({})).unwrap();
    assert_eq!(status["assignments"], json!(n), "the daemon lost or gained assignments");
    drop(v);

    let mib = |kib: u64| kib as f64 / 1024.0;
    let (a50, a99) = percentiles(a);
    let (r50, r99) = percentiles(r);
    let (f50, f99) = percentiles(floor);
    let (a050, a099) = percentiles(a0);
    let (r050, _) = percentiles(r0);
    println!("{n} assignments built and saved in process in {:.1} s", prepared.as_secs_f64());
    println!(
        "state file                          {:>10.2} MiB ({state_size} bytes)",
        state_size as f64 / 1048576.0
    );
    println!("start -> READY=1, no assignment     {:>10.0} ms", empty_ready.as_secs_f64() * 1e3);
    println!(
        "start -> READY=1, {n} assignments, writing {n} target cgroups {:>8.0} ms",
        first_ready.as_secs_f64() * 1e3
    );
    println!(
        "restart -> READY=1, {n} assignments (cgroups already right) {:>8.0} ms",
        d.ready.as_secs_f64() * 1e3
    );
    println!("Assign, no other assignment         p50 {a050:>8.2} ms  p99 {a099:>8.2} ms  (Release p50 {r050:.2} ms)");
    println!(
        "Assign, {n} assignments        p50 {a50:>8.2} ms  p99 {a99:>8.2} ms  ×{:.1} the empty daemon's, ×{:.1} the floor",
        a50 / a050,
        a50 / f50
    );
    println!(
        "Release, {n} assignments       p50 {r50:>8.2} ms  p99 {r99:>8.2} ms  ×{:.1} the floor",
        r50 / f50
    );
    println!("floor: durable write of {state_size} bytes p50 {f50:>8.2} ms  p99 {f99:>8.2} ms");
    println!("ListPools reply                     {pools_size:>10} bytes  p50 {pools_ms:.2} ms  (empty daemon: {pools_size0} bytes)");
    println!("ListAssignments reply               {list_size:>10} bytes  p50 {list_ms:.2} ms");
    println!(
        "RSS: no assignment {:.1} MiB; {n} assignments idle {:.1} MiB; after 64 clients × {load_calls} rounds of ListPools + ListAssignments + Assign + Release ({:.1} s) {:.1} MiB",
        mib(empty_rss),
        mib(idle_rss),
        load_time.as_secs_f64(),
        mib(loaded_rss)
    );
    d.stop();
}
