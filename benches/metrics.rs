//! The metrics endpoint: what a scrape costs, and what a scraper costs the engine.
//!
//! `cargo bench --bench metrics` starts the real daemon (bench profile) on a sandbox host with
//! 50 assignments, then measures:
//!
//! - a scrape (`GET /metrics`, a new connection each, as Prometheus does after an idle
//!   keep-alive), against a floor: the same request answered with a body of the same size by a
//!   bare HTTP responder on a thread of this process;
//! - the engine's call latency (`Assign` then `Release` of one shared assignment over varlink,
//!   applied and saved durably) without a scraper, and while a scraper runs every 100 ms.
//!
//! Each figure is the median and the 99th percentile, with its ratio to the floor (the engine
//! with a scraper: to the engine without one). No figure is asserted: this prints, tests
//! assert. `cargo test --all-targets` runs it too, without `--bench`, as a smoke test with a
//! few calls. `CPUPOOL_BENCH_DIR` chooses where the sandbox lives.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "support/timing.rs"]
mod timing;

use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Varlink, CONFIG};
use serde_json::json;
use timing::{measure, Stats};

fn row(name: &str, s: &Stats, floor: &Stats, what: &str) {
    println!(
        "{name:<46} p50 {:>9.1} µs  p99 {:>9.1} µs  ×{:.2} {what}",
        s.p50.as_secs_f64() * 1e6,
        s.p99.as_secs_f64() * 1e6,
        s.p50.as_secs_f64() / floor.p50.as_secs_f64()
    );
}

/// One `GET /metrics` on a new connection; the body's length.
fn scrape(addr: &str) -> usize {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes())
        .unwrap();
    let mut out = Vec::with_capacity(64 * 1024);
    s.read_to_end(&mut out).unwrap();
    assert!(out.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&out));
    out.len()
}

/// A bare HTTP responder: reads a request head and answers `size` bytes, one connection at a
/// time. Its address.
fn floor_server(size: usize) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let reply = {
        let mut r =
            format!("HTTP/1.1 200 OK\r\nContent-Length: {size}\r\nConnection: close\r\n\r\n").into_bytes();
        r.resize(r.len() + size, b'x');
        r
    };
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let mut head = Vec::new();
            let mut buf = [0u8; 4096];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let _ = s.write_all(&reply);
        }
    });
    addr
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test` does not.
    let bench = std::env::args().any(|a| a == "--bench");
    let (n_scrapes, n_calls) = if bench { (1000, 500) } else { (10, 10) };
    let base = std::env::var_os("CPUPOOL_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let dir = tempfile::tempdir_in(base).unwrap();
    let sb = dir.path().join("sb");
    fs::create_dir_all(sb.join("etc/cpupoold")).unwrap();
    fs::write(sb.join("etc/cpupoold/config.toml"), CONFIG).unwrap();
    let log = dir.path().join("daemon.log");
    let bin = Path::new(env!("CARGO_BIN_EXE_cpupoold"));
    let mut d =
        test_support::daemon::spawn(bin, &sb, "1x4x2:1", &["--bus", "none", "--log-level", "warn"], &log);
    assert!(d.ready, "no READY banner:\n{}", d.banner);
    let addr = d
        .banner
        .lines()
        .find_map(|l| l.trim().strip_prefix("metrics").and_then(|u| u.trim().strip_prefix("http://")))
        .and_then(|u| u.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("no metrics URL in the banner:\n{}", d.banner))
        .to_owned();
    let mut v = Varlink::connect(d.varlink.as_ref().unwrap());
    fs::create_dir_all(sb.join("cgroup/bench")).unwrap();
    // State to describe: 50 assignments of the shared pool.
    for i in 0..50 {
        fs::create_dir_all(sb.join(format!("cgroup/held/s{i}"))).unwrap();
        v.call(
            "Assign",
            json!({ "pool": "web", "target": format!("cgroup:held/s{i}"), "millicpus": 20, "id": format!("s{i}") }),
        )
        .unwrap();
    }
    let size = scrape(&addr);
    println!(
        "cpupoold metrics endpoint, sandbox 1x4x2 with 50 assignments in {} (a scrape is {size} bytes)",
        dir.path().display()
    );

    let floor_addr = floor_server(size);
    let floor = measure(n_scrapes, |_| {
        scrape(&floor_addr);
    });
    row("floor: GET answered by a bare responder", &floor, &floor, "the floor");
    let scrapes = measure(n_scrapes, |_| {
        scrape(&addr);
    });
    row("GET /metrics", &scrapes, &floor, "the floor");

    let mut call = |i: usize| {
        let id = format!("b{i}");
        v.call("Assign", json!({ "pool": "web", "target": "cgroup:bench", "millicpus": 100, "id": id }))
            .unwrap();
        v.call("Release", json!({ "id": id })).unwrap();
    };
    let quiet = measure(n_calls, &mut call);
    row("varlink Assign + Release, no scraper", &quiet, &quiet, "without a scraper");

    // A scraper every 100 ms, as a tight Prometheus job would (its default is 1 min).
    let stop = Arc::new(AtomicBool::new(false));
    let scraped = Arc::new(AtomicUsize::new(0));
    let scraper = {
        let (stop, scraped, addr) = (stop.clone(), scraped.clone(), addr.clone());
        std::thread::spawn(move || {
            let mut next = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                scrape(&addr);
                scraped.fetch_add(1, Ordering::Relaxed);
                next += Duration::from_millis(100);
                // Pacing a load generator, not waiting for readiness.
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
            }
        })
    };
    let started = Instant::now();
    let busy = measure(n_calls, |i| call(n_calls + i));
    let took = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    scraper.join().unwrap();
    row("varlink Assign + Release, scraper every 100 ms", &busy, &quiet, "without a scraper");
    println!("({} scrapes during {:.1} s of calls)", scraped.load(Ordering::Relaxed), took.as_secs_f64());
    drop(v);
    test_support::daemon::stop(&mut d.child, || fs::read_to_string(&log).unwrap_or_default());
}
