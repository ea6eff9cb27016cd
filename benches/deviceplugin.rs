//! Allocate latency over the plugin's unix socket, against a floor measured in the same run.
//!
//! `cargo bench --bench deviceplugin` starts the real daemon (bench profile) on a 1x4x2 sandbox
//! host and a kubelet-shaped peer (a `Registration` server), then measures:
//!
//! - the floor: `GetDevicePluginOptions` on the same socket, a gRPC round trip that asks the
//!   engine nothing;
//! - `Allocate` of one shared-pool device, then `Release` of the assignment over varlink (so the
//!   next Allocate makes a new one): each Allocate is decided by the engine, applied and saved
//!   durably before it answers.
//!
//! Median and 99th percentile of 1000 sequential calls (20 under `cargo test`, as a smoke test).
//! No figure is asserted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::{Daemon, Varlink};
use cpupoold::kubernetes::deviceplugin::proto::v1beta1 as dp;
use cpupoold::kubernetes::grpc::clients::unix_channel;
use serde_json::json;

struct Registration;

#[tonic::async_trait]
impl dp::registration_server::Registration for Registration {
    async fn register(
        &self,
        _: tonic::Request<dp::RegisterRequest>,
    ) -> Result<tonic::Response<dp::Empty>, tonic::Status> {
        Ok(tonic::Response::new(dp::Empty {}))
    }
}

fn stats(mut t: Vec<Duration>) -> (Duration, Duration) {
    t.sort();
    (t[t.len() / 2], t[t.len() * 99 / 100])
}

fn row(name: &str, (p50, p99): (Duration, Duration), floor: Duration) {
    println!(
        "{name:<48} p50 {:>8.1} µs  p99 {:>8.1} µs  ×{:.1} the floor",
        p50.as_secs_f64() * 1e6,
        p99.as_secs_f64() * 1e6,
        p50.as_secs_f64() / floor.as_secs_f64()
    );
}

fn main() {
    let n = if std::env::args().any(|a| a == "--bench") { 1000 } else { 20 };
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "{}\n[kubelet]\nmillicpus_per_device = 10\nrelease_grace_ms = 3600000\n",
        include_str!("../tests/fixtures/1x4x2.toml")
    );
    let d =
        Daemon::start_shaped(dir.path(), "1x4x2:1", Some(&config), &["--bus", "none", "--log-level", "warn"]);
    let plugins = d.sb.join("kubelet/device-plugins");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    rt.block_on(async {
        let listener = tokio::net::UnixListener::bind(plugins.join("kubelet.sock")).unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(dp::registration_server::RegistrationServer::new(Registration))
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
        );
    });
    let sock = plugins.join("cpupoold-web.sock");
    // The plugin binds its socket before registering; wait for it with a connect loop.
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::os::unix::net::UnixStream::connect(&sock).is_err() {
        assert!(Instant::now() < deadline, "the plugin did not bind {}:\n{}", sock.display(), d.logs());
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut c = rt.block_on(async {
        dp::device_plugin_client::DevicePluginClient::new(unix_channel(sock).await.unwrap())
    });
    println!("cpupoold device plugin, {n} sequential calls each, sandbox 1x4x2 in {}", dir.path().display());
    let mut floor = Vec::new();
    for i in 0..n + n / 10 {
        let t = Instant::now();
        rt.block_on(c.get_device_plugin_options(dp::Empty {})).unwrap();
        if i >= n / 10 {
            floor.push(t.elapsed());
        }
    }
    let floor = stats(floor);
    row("floor: GetDevicePluginOptions (same socket)", floor, floor.0);
    let mut v = Varlink::connect(&d.varlink);
    let mut alloc = Vec::new();
    for i in 0..n + n / 10 {
        let req = dp::AllocateRequest {
            container_requests: vec![dp::ContainerAllocateRequest {
                devices_ids: vec![format!("milli-web-{:05}", i % 100)],
            }],
        };
        let t = Instant::now();
        rt.block_on(c.allocate(req)).unwrap();
        if i >= n / 10 {
            alloc.push(t.elapsed());
        }
        v.call("Release", json!({ "id": format!("kubelet-milli-web-{:05}", i % 100) })).unwrap();
    }
    row("Allocate, 1 shared device (applied, durable)", stats(alloc), floor.0);
    drop(c);
    drop(rt);
    d.stop();
}
