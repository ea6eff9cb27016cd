//! The NRI plugin's handling of the runtime's requests, against a floor measured in the same
//! run, on the real daemon (bench profile) and the fake runtime of `test_support::nri`.
//!
//! `cargo bench --bench nri` starts the daemon on a 1x4x2 sandbox host with a kubelet-shaped
//! peer, has the kubelet allocate one exclusive core, and measures, as the runtime sees them:
//!
//! - the floor: `Shutdown`, a ttRPC round trip through the multiplexer that asks the engine
//!   nothing; beside it, the kubelet's PodResources `List` on a kept connection, which the
//!   plugin asks at every creation (its part of the creation's cost); and, for the requests
//!   that change the state, the durable floor: one `fdatasync` of a ~200-byte record appended
//!   to a file beside the sandbox's state;
//! - `CreateContainer` of a container without a pool (a decision from the snapshot);
//! - the life of a pooled container, each request on its own: `CreateContainer` (its
//!   assignment, released by the previous container's stop, is held again: decided, applied
//!   and saved durably), `StartContainer` (bound to its cgroup and read back, saved) and
//!   `StopContainer` (released, saved).
//!
//! Median and 99th percentile of 500 cycles (10 under `cargo test`, as a smoke test), each as a
//! ratio of the floor's. No figure is asserted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "support/timing.rs"]
mod timing;

use std::time::{Duration, Instant};

use common::Daemon;
use cpupoold::kubernetes::nri::proto as api;
use test_support::nri::{self as fake, Node};
use timing::{percentiles, ratio_row};

fn main() {
    let n = if std::env::args().any(|a| a == "--bench") { 500 } else { 10 };
    let dir = tempfile::tempdir().unwrap();
    // The kubelet's sockets are served by tasks of a runtime of their own.
    let tokio = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let _serving = tokio.enter();
    let mut node = Node::serve(&dir.path().join("sb"));
    let config =
        format!("{}\n[kubelet]\nrelease_grace_ms = 3600000\n", include_str!("../tests/fixtures/1x4x2.toml"));
    let d =
        Daemon::start_shaped(dir.path(), "1x4x2:1", Some(&config), &["--bus", "none", "--log-level", "warn"]);
    let mut rt = node.runtime.accept(Duration::from_secs(30)).unwrap();
    rt.configure().unwrap();
    rt.synchronize(Vec::new(), Vec::new()).unwrap();
    let env = tokio.block_on(node.allocate("dp", &["core-1"], "default/bench/app"));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let pod = fake::pod("s", "uid-bench", "bench");

    let time = |f: &mut dyn FnMut()| {
        let t = Instant::now();
        f();
        t.elapsed()
    };
    let kubelet = cpupoold::kubernetes::grpc::clients::PodResources::new(
        node.sb.join("kubelet/pod-resources/kubelet.sock"),
    );
    let (mut floor, mut unpooled, mut create, mut start, mut stop) = (vec![], vec![], vec![], vec![], vec![]);
    let (mut asked, mut synced) = (vec![], vec![]);
    // A durable write's floor: a ~200-byte record appended and fdatasync'ed beside the state.
    let mut journal =
        std::fs::OpenOptions::new().create(true).append(true).open(node.sb.join("floor.journal")).unwrap();
    for i in 0..n + n / 10 {
        let warm = i < n / 10;
        let f = time(&mut || {
            let _: api::Empty = rt.call("Shutdown", &api::Empty {}).unwrap().unwrap();
        });
        let t_asked = time(&mut || {
            tokio.block_on(kubelet.list()).unwrap();
        });
        let t_synced = time(&mut || {
            use std::io::Write;
            journal.write_all(&[b'x'; 200]).unwrap();
            journal.sync_data().unwrap();
        });
        let u = fake::container(&pod, &format!("u{i}"), "side", &[]);
        let t_unpooled = time(&mut || {
            rt.create(&pod, &u).unwrap().unwrap();
        });
        let c = fake::container(&pod, &format!("c{i}"), "app", &env);
        let req = api::CreateContainerRequest { pod: Some(pod.clone()), container: Some(c.clone()) };
        let t_create = time(&mut || {
            let _: api::CreateContainerResponse =
                rt.call("CreateContainer", &req).unwrap().unwrap_or_else(|e| panic!("{e:?}\n{}", d.logs()));
        });
        node.runc_creates(&fake::cgroup(&pod, &c.id), "1,5");
        let ev = api::StateChangeEvent {
            event: api::Event::StartContainer as i32,
            pod: Some(pod.clone()),
            container: Some(c.clone()),
        };
        let t_start = time(&mut || {
            let _: api::Empty =
                rt.call("StateChange", &ev).unwrap().unwrap_or_else(|e| panic!("{e:?}\n{}", d.logs()));
        });
        let req = api::StopContainerRequest { pod: Some(pod.clone()), container: Some(c.clone()) };
        let t_stop = time(&mut || {
            let _: api::StopContainerResponse = rt.call("StopContainer", &req).unwrap().unwrap();
        });
        // The container's cgroup goes with it, as runc removes it.
        let _ = std::fs::remove_dir_all(node.sb.join("cgroup").join(fake::cgroup(&pod, &c.id)));
        if !warm {
            floor.push(f);
            asked.push(t_asked);
            synced.push(t_synced);
            unpooled.push(t_unpooled);
            create.push(t_create);
            start.push(t_start);
            stop.push(t_stop);
        }
    }
    let floor = percentiles(floor);
    println!(
        "NRI requests, {n} each, through the fake runtime's socket (ratios: against the floor's p50 / p99)"
    );
    ratio_row("floor: Shutdown (no engine)", floor, floor);
    ratio_row("PodResources List (asked at every creation)", percentiles(asked), floor);
    let synced = percentiles(synced);
    ratio_row("fdatasync of a 200-byte record (durable floor)", synced, floor);
    ratio_row("CreateContainer, no pool", percentiles(unpooled), floor);
    println!("saved requests, against the durable floor:");
    ratio_row("CreateContainer, pooled (held again, saved)", percentiles(create), synced);
    ratio_row("StartContainer (bound, read back, saved)", percentiles(start), synced);
    ratio_row("StopContainer (released, saved)", percentiles(stop), synced);
    d.stop();
}
