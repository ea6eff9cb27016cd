//! NodePrepareResources and NodeUnprepareResources over the real gRPC socket, against floors
//! measured in the same run, on the real daemon (bench profile, `k8s` feature) with the
//! kubelet-shaped peer of `test_support::dra` and the fake API server of the tests.
//!
//! `cargo bench --features k8s --bench dra` starts the daemon on a 2x8x1:2 sandbox host with an
//! exclusive pool `dp` served by DRA, registers the driver as the kubelet's plugin watcher does,
//! and measures, per cycle:
//!
//! - the floors: `NodeUnprepareResources` of a claim never prepared (a gRPC round trip that
//!   asks the engine nothing and removes nothing), and one `fdatasync` of a ~200-byte record
//!   appended to a file beside the sandbox's state (a durable write's cost on this disk);
//! - `NodePrepareResources` of a fresh claim for 1 CPU (read from the fake API server, booked
//!   in one engine transaction saved durably, CDI spec and record written durably);
//! - `NodePrepareResources` of the same claim again (answered from its record);
//! - `NodeUnprepareResources` of it (released and saved, CDI spec and record removed).
//!
//! Median and 99th percentile of 200 cycles (5 under `cargo test`, as a smoke test), each as a
//! ratio of a floor's. No figure is asserted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/fake_apiserver/mod.rs"]
mod fake_apiserver;
#[path = "support/timing.rs"]
mod timing;

use std::time::Instant;

use common::Daemon;
use fake_apiserver::claims::{claim, Result as Res};
use fake_apiserver::Fake;
use test_support::dra as peer;
use timing::{percentiles, ratio_row};

fn main() {
    let n = if std::env::args().any(|a| a == "--bench") { 200 } else { 5 };
    let dir = tempfile::tempdir().unwrap();
    let tokio = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let fake = Fake::start();
    fake.write_kubeconfig(&dir.path().join("kubeconfig"));
    let config = format!(
        "[pools.sys]\nkind = \"reserved\"\ncpus = \"0,8\"\n\n[pools.dp]\nkind = \"exclusive\"\ncpus = \"1-7,9-15\"\n\
         dra = true\n\n[k8s]\nenabled = true\nkubeconfig = \"{}\"\nnode_name = \"node-a\"\n",
        dir.path().join("kubeconfig").display()
    );
    let d =
        Daemon::start_shaped(dir.path(), "2x8x1:2", Some(&config), &["--bus", "none", "--log-level", "warn"]);
    let sock = d.sb.join("kubelet/plugins_registry/dra.cpupool.io-reg.sock");
    fake_apiserver::wait_for(60, "the registration socket", || {
        sock.exists().then_some(()).ok_or_else(|| d.logs())
    });
    let k = tokio.block_on(peer::register(&sock)).unwrap_or_else(|e| panic!("{e}\n{}", d.logs()));

    let time = |f: &mut dyn FnMut()| {
        let t = Instant::now();
        f();
        t.elapsed()
    };
    let mut journal =
        std::fs::OpenOptions::new().create(true).append(true).open(d.sb.join("floor.journal")).unwrap();
    let never = vec![peer::claim("bench", "never", &test_support::apiserver::uid())];
    let (mut floor, mut synced, mut fresh, mut again, mut unprepare) =
        (vec![], vec![], vec![], vec![], vec![]);
    for i in 0..n + n / 10 {
        let warm = i < n / 10;
        let name = format!("c{i}");
        // Uids as the API server makes them: random version-4 UUIDs (10 in 16 digit-first).
        let uid = test_support::apiserver::uid();
        let results = [Res {
            driver: "dra.cpupool.io",
            pool: "node-a",
            device: "dp-numa1",
            request: "cpus",
            cpu: Some("1"),
        }];
        fake.put_claim(claim("bench", &name, &uid, &results, &[("pod", &test_support::apiserver::uid())]));
        let c = vec![peer::claim("bench", &name, &uid)];
        let f = time(&mut || {
            tokio.block_on(k.unprepare(never.clone())).unwrap();
        });
        let s = time(&mut || {
            use std::io::Write;
            journal.write_all(&[b'x'; 200]).unwrap();
            journal.sync_data().unwrap();
        });
        let mut prepare = || {
            let r = tokio.block_on(k.prepare(c.clone())).unwrap();
            assert_eq!(r.claims[&uid].error, "", "{}", d.logs());
        };
        let p = time(&mut prepare);
        let p2 = time(&mut prepare);
        let u = time(&mut || {
            let r = tokio.block_on(k.unprepare(c.clone())).unwrap();
            assert_eq!(r.claims[&uid].error, "");
        });
        if !warm {
            floor.push(f);
            synced.push(s);
            fresh.push(p);
            again.push(p2);
            unprepare.push(u);
        }
    }
    let (floor, synced) = (percentiles(floor), percentiles(synced));
    println!(
        "DRA plugin calls, {n} each, over the plugin's unix socket (ratios: against a floor's p50 / p99)"
    );
    ratio_row("floor: NodeUnprepareResources, unknown claim", floor, floor);
    ratio_row("fdatasync of a 200-byte record (durable floor)", synced, floor);
    ratio_row("NodePrepareResources, prepared claim (record)", percentiles(again), floor);
    println!("saved calls, against the durable floor:");
    ratio_row("NodePrepareResources, 1 CPU (GET, book, save, CDI)", percentiles(fresh), synced);
    ratio_row("NodeUnprepareResources (release, save, remove)", percentiles(unprepare), synced);
    d.stop();
}
