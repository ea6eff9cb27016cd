//! Round trips of the management APIs against floors measured in the same run.
//!
//! `cargo bench --bench api` starts the real daemon (bench profile) on a sandbox host attached
//! to a private `dbus-daemon`, then measures:
//!
//! - a read (`ListPools`) over varlink and over D-Bus, against a raw unix-socket echo of the same
//!   request as the floor;
//! - a mutation (`Assign` then `Release` of one shared assignment, each applied to the cgroup
//!   file and saved durably) over varlink, against a bare write + fsync + rename + directory
//!   fsync of a file the size of the state file, twice, as the floor.
//!
//! Each figure is the median and the 99th percentile of 2000 sequential calls (500 mutations),
//! and the ratio of the medians to the floor's. No figure is asserted: this prints, tests
//! assert. `cargo test --all-targets` runs it too, without `--bench`, as a 20-call smoke test
//! so that it keeps working. `CPUPOOL_BENCH_DIR` chooses where the sandbox lives (the
//! durable-write figures depend on that file system).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "support/timing.rs"]
mod timing;

use std::fs;
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};

use common::{Daemon, PrivateBus, Varlink};
use serde_json::json;
use timing::{measure, Stats};

fn row(name: &str, s: &Stats, floor: &Stats) {
    println!(
        "{name:<44} p50 {:>9.1} µs  p99 {:>9.1} µs  ×{:.1} the floor",
        s.p50.as_secs_f64() * 1e6,
        s.p99.as_secs_f64() * 1e6,
        s.p50.as_secs_f64() / floor.p50.as_secs_f64()
    );
}

/// A NUL-framed echo server on a unix socket: the cost of the transport alone.
fn echo_floor(dir: &std::path::Path, request: &[u8], n: usize) -> Stats {
    let path = dir.join("echo.sock");
    let listener = UnixListener::bind(&path).unwrap();
    std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = vec![0u8; 65536];
        let mut pending = Vec::new();
        loop {
            let n = match s.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            pending.extend_from_slice(&buf[..n]);
            while let Some(end) = pending.iter().position(|b| *b == 0) {
                let frame: Vec<u8> = pending.drain(..=end).collect();
                if s.write_all(&frame).is_err() {
                    return;
                }
            }
        }
    });
    let mut c = UnixStream::connect(&path).unwrap();
    let mut buf = vec![0u8; 65536];
    measure(n, |_| {
        c.write_all(request).unwrap();
        let mut got = 0;
        while got < request.len() {
            got += c.read(&mut buf).unwrap();
        }
    })
}

/// write + fsync + rename + directory fsync of `size` bytes: what one durable save costs.
fn durable_write_floor(dir: &std::path::Path, size: usize, n: usize) -> Stats {
    let data = vec![b'x'; size];
    let (tmp, dst) = (dir.join("floor.tmp"), dir.join("floor"));
    measure(n, |_| {
        for _ in 0..2 {
            let mut f = fs::File::create(&tmp).unwrap();
            f.write_all(&data).unwrap();
            f.sync_all().unwrap();
            fs::rename(&tmp, &dst).unwrap();
            fs::File::open(dir).unwrap().sync_all().unwrap();
        }
    })
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test` does not.
    let n_calls = if std::env::args().any(|a| a == "--bench") { 2000 } else { 20 };
    let base = std::env::var_os("CPUPOOL_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let dir = tempfile::tempdir_in(base).unwrap();
    let bus = PrivateBus::start(dir.path());
    let d = Daemon::start(dir.path(), &["--bus", &bus.address, "--log-level", "warn"]);
    println!(
        "cpupoold API round trips, {n_calls} sequential calls each, sandbox 1x4x2 in {}",
        dir.path().display()
    );

    let request = br#"{"method":"org.cpupool.Manager.ListPools","parameters":{}}"#;
    let mut framed = request.to_vec();
    framed.push(0);
    let floor = echo_floor(dir.path(), &framed, n_calls);
    row("floor: unix-socket echo of the request", &floor, &floor);

    let mut v = Varlink::connect(&d.varlink);
    let varlink = measure(n_calls, |_| {
        v.call("ListPools", json!({})).unwrap();
    });
    row("varlink ListPools", &varlink, &floor);

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let conn = rt.block_on(async {
        zbus::connection::Builder::address(bus.address.as_str()).unwrap().build().await.unwrap()
    });
    let dbus = measure(n_calls, |_| {
        rt.block_on(conn.call_method(
            Some("org.cpupool.Manager1"),
            "/org/cpupool/Manager1",
            Some("org.cpupool.Manager1"),
            "ListPools",
            &(),
        ))
        .unwrap();
    });
    row("D-Bus ListPools (through dbus-daemon)", &dbus, &floor);

    fs::create_dir_all(d.sb.join("cgroup/bench")).unwrap();
    let n = n_calls / 4;
    let mutation = measure(n, |i| {
        let id = format!("b{i}");
        v.call("Assign", json!({ "pool": "web", "target": "cgroup:bench", "millicpus": 100, "id": id }))
            .unwrap();
        v.call("Release", json!({ "id": id })).unwrap();
    });
    let size = fs::metadata(d.sb.join("state/state.json")).map(|m| m.len() as usize).unwrap_or(512);
    let write_floor = durable_write_floor(dir.path(), size, n);
    row(&format!("floor: 2 × durable write of {size} bytes"), &write_floor, &write_floor);
    row("varlink Assign + Release (applied, durable)", &mutation, &write_floor);
    drop(conn);
    d.stop();
}
