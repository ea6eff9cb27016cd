//! Root's D-Bus latency while an unprivileged user floods the daemon's one bus connection.
//!
//! `cargo bench --bench dbus_flood` starts the real daemon (bench profile) on a sandbox host
//! attached to a private `dbus-daemon`, measures root's `Status` over D-Bus (sequential calls,
//! one connection), then runs this binary again as nobody (uid 65534): [`FLOOD_CONNECTIONS`]
//! connections each keeping [`FLOOD_IN_FLIGHT`] `Assign` calls in flight (refused
//! `AccessDenied`, or `Busy` beyond nobody's budget), and measures root's `Status` again, with
//! the bus's own `GetId` under the flood beside it. Figures: p50 and p99 of each, and the ratios
//! of root's flooded figures to its unloaded ones from the same run. No figure is asserted:
//! tests/dbus_flood.rs asserts the bound. `cargo test --all-targets` runs it without `--bench`
//! as a smoke test of 20 calls and a small flood.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "support/timing.rs"]
mod timing;

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use common::{Daemon, PrivateBus};
use timing::{measure, Stats};

const DEST: &str = "org.cpupool.Manager1";
const PATH: &str = "/org/cpupool/Manager1";
/// Set in the flooding copy of this binary: the bus address, and the flood's shape.
const FLOOD_BUS: &str = "CPUPOOL_BENCH_FLOOD_BUS";
const FLOOD_SHAPE: &str = "CPUPOOL_BENCH_FLOOD_SHAPE";
/// The flood of issue 34: 16 connections × 128 calls in flight (the `dbus-daemon`'s default
/// limit of calls awaiting a reply per connection).
const FLOOD_CONNECTIONS: usize = 16;
const FLOOD_IN_FLIGHT: usize = 128;

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn row(name: &str, s: &Stats, base: &Stats) {
    println!(
        "{name:<46} p50 {:>8.3} ms  p99 {:>8.3} ms  p50 ×{:.1}  p99 ×{:.1}",
        ms(s.p50),
        ms(s.p99),
        s.p50.as_secs_f64() / base.p50.as_secs_f64(),
        s.p99.as_secs_f64() / base.p99.as_secs_f64()
    );
}

/// The flooding copy: keeps `in_flight` `Assign` calls in flight on each of `connections`
/// connections until stdin closes, then prints what its calls got.
fn flood(address: &str, connections: usize, in_flight: usize) {
    let stop = Arc::new(AtomicBool::new(false));
    let stopper = stop.clone();
    std::thread::spawn(move || {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        stopper.store(true, Ordering::SeqCst);
    });
    let counts: Arc<[AtomicU64; 4]> = Arc::new(Default::default());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let mut tasks = tokio::task::JoinSet::new();
        for c in 0..connections {
            let conn = zbus::connection::Builder::address(address).unwrap().build().await.unwrap();
            for i in 0..in_flight {
                let (conn, stop, counts) = (conn.clone(), stop.clone(), counts.clone());
                let id = format!("flood-{c}-{i}");
                tasks.spawn(async move {
                    while !stop.load(Ordering::SeqCst) {
                        let args = ("web", "cgroup:flood", 0u32, 100u64, id.as_str());
                        let r = conn.call_method(Some(DEST), PATH, Some(DEST), "Assign", &args).await;
                        let slot = match &r {
                            Ok(_) => 0,
                            Err(zbus::Error::MethodError(n, _, _)) if n.ends_with("AccessDenied") => 1,
                            Err(zbus::Error::MethodError(n, _, _)) if n.ends_with("Busy") => 2,
                            Err(_) => 3,
                        };
                        counts[slot].fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
        }
        println!("flood: started");
        while tasks.join_next().await.is_some() {}
    });
    let [ok, denied, busy, other] = &*counts;
    println!(
        "flood: ended: {} answered ({} AccessDenied, {} Busy), {} other errors",
        ok.load(Ordering::Relaxed) + denied.load(Ordering::Relaxed) + busy.load(Ordering::Relaxed),
        denied.load(Ordering::Relaxed),
        busy.load(Ordering::Relaxed),
        other.load(Ordering::Relaxed)
    );
}

fn main() {
    if let Ok(address) = std::env::var(FLOOD_BUS) {
        let shape = std::env::var(FLOOD_SHAPE).unwrap_or_default();
        let (c, n) = shape.split_once('x').unwrap();
        return flood(&address, c.parse().unwrap(), n.parse().unwrap());
    }
    // `cargo bench` passes `--bench`; `cargo test` does not.
    let bench = std::env::args().any(|a| a == "--bench");
    let (n_calls, connections, in_flight) =
        if bench { (1000, FLOOD_CONNECTIONS, FLOOD_IN_FLIGHT) } else { (20, 2, 8) };
    let dir = tempfile::tempdir().unwrap();
    let bus = PrivateBus::start(dir.path());
    let d = Daemon::start(dir.path(), &["--bus", &bus.address, "--log-level", "error"]);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let conn = rt.block_on(async {
        zbus::connection::Builder::address(bus.address.as_str()).unwrap().build().await.unwrap()
    });
    let bus_proxy = rt.block_on(zbus::fdo::DBusProxy::new(&conn)).unwrap();
    let status = |_| {
        rt.block_on(conn.call_method(Some(DEST), PATH, Some(DEST), "Status", &())).unwrap();
    };
    let get_id = |_| {
        rt.block_on(bus_proxy.get_id()).unwrap();
    };
    println!(
        "root's D-Bus Status, {n_calls} sequential calls, unloaded and while uid 65534 keeps \
         {connections} connections × {in_flight} Assign calls in flight (sandbox 1x4x2)"
    );
    let quiet = measure(n_calls, status);
    let quiet_bus = measure(n_calls, get_id);

    let mut flooder = Command::new(std::env::current_exe().unwrap())
        .env(FLOOD_BUS, &bus.address)
        .env(FLOOD_SHAPE, format!("{connections}x{in_flight}"))
        .uid(65534)
        .gid(65534)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("the flood: {e}"));
    let mut out = BufReader::new(flooder.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("flood: started") {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the flood ended before it started");
    }
    let flooded = measure(n_calls, status);
    let flooded_bus = measure(n_calls, get_id);
    drop(flooder.stdin.take());
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    let _ = flooder.wait();

    row("root Status, unloaded", &quiet, &quiet);
    row("root Status, flooded (× unloaded)", &flooded, &quiet);
    row("bus GetId, unloaded (× root Status unloaded)", &quiet_bus, &quiet);
    row("bus GetId, flooded (× root Status unloaded)", &flooded_bus, &quiet);
    println!("{}", rest.lines().find(|l| l.contains("flood: ended")).unwrap_or("flood: no report"));
    drop(conn);
    d.stop();
}
