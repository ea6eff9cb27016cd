//! The device plugin against a kubelet-shaped peer written here: a `v1beta1.Registration`
//! server on `kubelet.sock`, a `v1.PodResourcesLister` and a CRI `RuntimeService` (the part the
//! plugin asks), all on unix sockets in the sandbox's kubelet directory, speaking the real
//! protobuf. The daemon is the real binary on a simulated 2-socket, 4-core, SMT-2, 2-NUMA host
//! (CPU c and c+8 are siblings; cores 0-3 on node 0, 4-7 on node 1).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{Daemon, Varlink};
use cpupoold::kubernetes::deviceplugin::proto::v1beta1 as dp;
use cpupoold::kubernetes::grpc::clients::unix_channel;
use cpupoold::kubernetes::grpc::proto::{cri, podresources as pr};
use serde_json::json;
use test_support::kubelet::{self, MemoryPods};
use tokio::sync::mpsc;

/// reserved 0,8; dp: cores 1-3 (node 0) and 6-7 (node 1), whole cores; th: CPUs 4,12 as
/// threads; web: shared 5,13 in 500-millicpu devices.
const CONFIG: &str = r#"
[pools.sys]
kind = "reserved"
cpus = "0,8"

[pools.dp]
kind = "exclusive"
cpus = "1-3,9-11,6-7,14-15"

[pools.th]
kind = "exclusive"
cpus = "4,12"
smt = "threads"

[pools.web]
kind = "shared"
cpus = "5,13"

[kubelet]
millicpus_per_device = 500
release_grace_ms = 500
reconcile_interval_ms = 50
"#;

const WAIT: Duration = test_support::wait::PATIENCE;

/// The kubelet's registration socket, each Register sent to `tx`.
struct Kubelet;

impl Kubelet {
    fn serve(plugins: &Path, tx: mpsc::UnboundedSender<dp::RegisterRequest>) -> kubelet::Kubelet {
        let registration = kubelet::Registration::new(move |r| {
            let _ = tx.send(r);
        });
        kubelet::Kubelet::serve(plugins, registration).unwrap()
    }
}

async fn plugin(sock: PathBuf) -> dp::device_plugin_client::DevicePluginClient<tonic::transport::Channel> {
    dp::device_plugin_client::DevicePluginClient::new(unix_channel(sock).await.unwrap())
}

/// Whether a plugin endpoint answers GetDevicePluginOptions.
async fn answers(sock: PathBuf) -> bool {
    match unix_channel(sock).await {
        Ok(ch) => dp::device_plugin_client::DevicePluginClient::new(ch)
            .get_device_plugin_options(dp::Empty {})
            .await
            .is_ok(),
        Err(_) => false,
    }
}

/// Id, health and NUMA nodes of each device.
type Devices = Vec<(String, String, Vec<i64>)>;

fn devices(m: dp::ListAndWatchResponse) -> Devices {
    m.devices
        .into_iter()
        .map(|d| {
            (
                d.id,
                d.health,
                d.topology.map(|t| t.nodes.into_iter().map(|n| n.id).collect()).unwrap_or_default(),
            )
        })
        .collect()
}

fn dev(id: &str, health: &str, node: i64) -> (String, String, Vec<i64>) {
    (id.to_owned(), health.to_owned(), vec![node])
}

async fn first_list(sock: PathBuf) -> Devices {
    let mut c = plugin(sock).await;
    let mut s = c.list_and_watch(dp::Empty {}).await.unwrap().into_inner();
    devices(tokio::time::timeout(WAIT, s.message()).await.unwrap().unwrap().unwrap())
}

/// Waits (polling, with a deadline) until `f` holds.
/// Waits until `f` holds; on timeout, fails with the daemon's log.
async fn until(d: &Daemon, what: &str, mut f: impl FnMut() -> bool) {
    test_support::wait::until_async(WAIT, what, || if f() { Ok(()) } else { Err(d.logs()) }).await
}

/// A container's `devices` as the kubelet's PodResources lists them: one entry per device
/// (and NUMA node, here at most one).
fn listed(resource: &str, devices: &[&str], node: Option<i64>) -> Vec<pr::ContainerDevices> {
    devices
        .iter()
        .map(|id| pr::ContainerDevices {
            resource_name: resource.into(),
            device_ids: ids(&[id]),
            topology: node.map(|id| pr::TopologyInfo { nodes: vec![pr::NumaNode { id }] }),
        })
        .collect()
}

fn ids(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

/// The kubelet-shaped peer in the sandbox `sb`: its registration socket, PodResources and the
/// runtime's CRI, served before the daemon starts.
struct Peer {
    plugins: PathBuf,
    kubelet: kubelet::Kubelet,
    tx: mpsc::UnboundedSender<dp::RegisterRequest>,
    registered: mpsc::UnboundedReceiver<dp::RegisterRequest>,
    pods: MemoryPods,
    runtime: MemoryPods,
}

fn serve_peer(sb: &Path) -> Peer {
    let plugins = sb.join("kubelet/device-plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    std::fs::create_dir_all(sb.join("kubelet/pod-resources")).unwrap();
    std::fs::create_dir_all(sb.join("run")).unwrap();
    let (tx, registered) = mpsc::unbounded_channel();
    let kubelet = Kubelet::serve(&plugins, tx.clone());
    let pods = MemoryPods::default();
    kubelet::serve_pod_resources(&sb.join("kubelet/pod-resources/kubelet.sock"), pods.clone()).unwrap();
    let runtime = pods.clone();
    kubelet::serve_runtime(&sb.join("run/containerd.sock"), runtime.clone()).unwrap();
    Peer { plugins, kubelet, tx, registered, pods, runtime }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_peer_end_to_end() {
    let tmp = tempfile::tempdir().unwrap();
    let sb = tmp.path().join("sb");
    let Peer { plugins, mut kubelet, tx, mut registered, pods, runtime } = serve_peer(&sb);
    let d = Daemon::start_shaped(tmp.path(), "2x4x2:2", Some(CONFIG), &["--bus", "none"]);

    // Register: one per pool offered to the kubelet, never the reserved one.
    let mut got = Vec::new();
    for _ in 0..3 {
        let r = tokio::time::timeout(WAIT, registered.recv())
            .await
            .unwrap_or_else(|_| panic!("no registration within {WAIT:?}\n{}", d.logs()))
            .unwrap();
        assert_eq!(r.version, "v1beta1");
        assert!(r.options.as_ref().unwrap().get_preferred_allocation_available);
        assert!(plugins.join(&r.endpoint).exists());
        got.push((r.resource_name, r.endpoint));
    }
    got.sort();
    assert_eq!(
        got,
        [
            ("cpupool.io/dp".to_owned(), "cpupoold-dp.sock".to_owned()),
            ("cpupool.io/th".to_owned(), "cpupoold-th.sock".to_owned()),
            ("cpupool.io/web".to_owned(), "cpupoold-web.sock".to_owned()),
        ]
    );
    let sock = |pool: &str| plugins.join(format!("cpupoold-{pool}.sock"));

    // ListAndWatch: devices, health and NUMA nodes of the simulated topology.
    let h = "Healthy";
    let all_dp = first_list(sock("dp")).await;
    assert_eq!(
        all_dp,
        [
            dev("core-1", h, 0),
            dev("core-2", h, 0),
            dev("core-3", h, 0),
            dev("core-6", h, 1),
            dev("core-7", h, 1)
        ]
    );
    assert_eq!(first_list(sock("th")).await, [dev("cpu-4", h, 1), dev("cpu-12", h, 1)]);
    let web: Vec<String> = first_list(sock("web")).await.into_iter().map(|d| d.0).collect();
    assert_eq!(web, ["milli-web-00000", "milli-web-00001", "milli-web-00002", "milli-web-00003"]);
    let mut c = plugin(sock("dp")).await;
    let opts = c.get_device_plugin_options(dp::Empty {}).await.unwrap().into_inner();
    assert!(opts.get_preferred_allocation_available && !opts.pre_start_required);

    // A non-kubelet assignment makes its core Unhealthy, promptly, on the open stream.
    let mut stream = c.list_and_watch(dp::Empty {}).await.unwrap().into_inner();
    assert_eq!(devices(stream.message().await.unwrap().unwrap()), all_dp);
    let mut v = Varlink::connect(&d.varlink);
    std::fs::create_dir_all(sb.join("cgroup/work/app")).unwrap();
    v.call("Assign", json!({"pool": "dp", "target": "cgroup:work/app", "cpus": 2, "id": "app"})).unwrap();
    let next = devices(tokio::time::timeout(WAIT, stream.message()).await.unwrap().unwrap().unwrap());
    let sick: Vec<&str> = next.iter().filter(|d| d.1 == "Unhealthy").map(|d| d.0.as_str()).collect();
    assert_eq!(sick.len(), 1, "{next:?}");
    v.call("Release", json!({"id": "app"})).unwrap();
    assert_eq!(
        devices(tokio::time::timeout(WAIT, stream.message()).await.unwrap().unwrap().unwrap()),
        all_dp
    );

    // CPU hotplug: CPU 15 goes offline, and core 7 (7,15) turns Unhealthy on the open stream
    // within a reconcile tick; it comes back when the CPU does.
    let online = sb.join("sys/devices/system/cpu/online");
    assert_eq!(std::fs::read_to_string(&online).unwrap().trim(), "0-15");
    std::fs::write(&online, "0-14\n").unwrap();
    let next = devices(tokio::time::timeout(WAIT, stream.message()).await.unwrap().unwrap().unwrap());
    let sick: Vec<&str> = next.iter().filter(|d| d.1 == "Unhealthy").map(|d| d.0.as_str()).collect();
    assert_eq!(sick, ["core-7"], "{next:?}");
    std::fs::write(&online, "0-15\n").unwrap();
    assert_eq!(
        devices(tokio::time::timeout(WAIT, stream.message()).await.unwrap().unwrap().unwrap()),
        all_dp
    );

    // GetPreferredAllocation: whole cores, packed on one NUMA node, must_include honoured.
    let ids_dp: Vec<String> = all_dp.iter().map(|d| d.0.clone()).collect();
    let prefer = |must: Vec<String>, size| dp::PreferredAllocationRequest {
        container_requests: vec![dp::ContainerPreferredAllocationRequest {
            available_device_i_ds: ids_dp.clone(),
            must_include_device_i_ds: must,
            allocation_size: size,
        }],
    };
    let r = c.get_preferred_allocation(prefer(vec![], 2)).await.unwrap().into_inner();
    assert_eq!(r.container_responses[0].device_i_ds, ["core-6", "core-7"]); // node 1 fits exactly
    let r = c.get_preferred_allocation(prefer(ids(&["core-2"]), 2)).await.unwrap().into_inner();
    assert_eq!(r.container_responses[0].device_i_ds, ["core-1", "core-2"]);
    let e = c.get_preferred_allocation(prefer(ids(&["core-9"]), 2)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("must_include_deviceIDs"), "{}", e.message());

    // Allocate: the envs, and an assignment held for the kubelet until the container is known.
    // The pod's uid as the API server makes it, beginning with a digit (10 in 16 do).
    let uid = test_support::apiserver::uid_digit_first();
    let scope =
        format!("kubepods.slice/kubepods-pod{}.slice/cri-containerd-abc.scope", uid.replace('-', "_"));
    std::fs::create_dir_all(sb.join("cgroup").join(&scope)).unwrap();
    *pods.pods.lock().unwrap() = vec![pr::PodResources {
        name: "p1".into(),
        namespace: "default".into(),
        containers: vec![pr::ContainerResources {
            name: "c1".into(),
            devices: listed("cpupool.io/dp", &["core-7", "core-6"], Some(1)),
            ..Default::default()
        }],
    }];
    let alloc = |devs: Vec<Vec<&str>>| dp::AllocateRequest {
        container_requests: devs
            .into_iter()
            .map(|d| dp::ContainerAllocateRequest { devices_ids: ids(&d) })
            .collect(),
    };
    let r = c.allocate(alloc(vec![vec!["core-7", "core-6"]])).await.unwrap().into_inner();
    let envs: HashMap<String, String> = r.container_responses[0].envs.clone().into_iter().collect();
    assert_eq!(envs["CPUPOOL_CPUS"], "6-7,14-15");
    assert_eq!(envs["EXCLUSIVE_CPUS"], "6-7,14-15");
    assert_eq!(envs["CPUPOOL_POOL"], "dp");
    let a = v.call("GetAssignment", json!({"id": "kubelet-core-6"})).unwrap();
    assert_eq!(a["assignment"]["cpus"], "6-7,14-15");
    // A repeated Allocate (container restart) answers the same.
    let again = c.allocate(alloc(vec![vec!["core-6", "core-7"]])).await.unwrap().into_inner();
    assert_eq!(again.container_responses[0].envs["CPUPOOL_CPUS"], "6-7,14-15");
    let r =
        plugin(sock("web")).await.allocate(alloc(vec![vec!["milli-web-00001"]])).await.unwrap().into_inner();
    assert_eq!(r.container_responses[0].envs["SHARED_CPUS"], "5,13");
    assert_eq!(r.container_responses[0].envs["CPUPOOL_POOL"], "web");

    // A failing Allocate is a gRPC error naming the field, and changes nothing. The web
    // allocation, which no container holds, is left out of the comparison: the grace period
    // (500 ms) releases it at a time of its own, which a loaded machine reaches within the loop.
    let settled = |v: &mut Varlink| {
        let mut all = v.call("ListAssignments", json!({})).unwrap();
        if let Some(list) = all["assignments"].as_array_mut() {
            list.retain(|a| a["id"] != "kubelet-milli-web-00001");
        }
        all
    };
    let before = settled(&mut v);
    for (req, code, says) in [
        (alloc(vec![vec!["core-1"], vec!["bogus"]]), tonic::Code::InvalidArgument, "devices_ids"),
        (alloc(vec![vec![]]), tonic::Code::InvalidArgument, "devices_ids"),
        (
            alloc(vec![vec!["core-1"], vec!["core-6"]]),
            tonic::Code::FailedPrecondition,
            "`kubelet-core-6` already exists",
        ),
        (
            alloc(vec![vec!["core-1"], vec!["core-2", "core-7"]]),
            tonic::Code::InvalidArgument,
            "held by assignment `kubelet-core-6`",
        ),
        // One device for two containers (the kubelet never asks it): they would share the
        // exclusive CPUs, here of the existing allocation.
        (
            alloc(vec![vec!["core-6", "core-7"], vec!["core-7", "core-6"], vec!["core-6", "core-7"]]),
            tonic::Code::InvalidArgument,
            "device `core-7` is listed for container requests 0 and 1",
        ),
        (alloc(vec![vec!["core-1"], vec!["core-1"]]), tonic::Code::InvalidArgument, "`core-1`"),
        // A 1 MB device id is repeated cut short.
        (alloc(vec![vec![&"x".repeat(1 << 20)]]), tonic::Code::InvalidArgument, "… (1048576 bytes)"),
        // Far more containers than one call carries.
        (
            alloc(vec![vec!["core-6", "core-7"]; 20_000]),
            tonic::Code::InvalidArgument,
            "20000 container requests",
        ),
    ] {
        let e = c.allocate(req).await.unwrap_err();
        assert!(e.message().len() <= 512, "a {} byte message", e.message().len());
        assert_eq!(e.code(), code, "{}", e.message());
        assert!(e.message().contains(says), "{}", e.message());
        assert_eq!(settled(&mut v), before);
    }

    // The container shows up in the runtime: its scope gets the CPUs, and the assignment names
    // it. Its sidecar, which holds no devices, is kept off the exclusive pools' CPUs (dp and
    // th): it may use the reserved 0,8 and the shared 5,13.
    let side = scope.replace("-abc.scope", "-def.scope");
    std::fs::create_dir_all(sb.join("cgroup").join(&side)).unwrap();
    let ctr = |id: &str, name: &str| cri::Container {
        id: id.into(),
        state: cri::ContainerState::ContainerRunning as i32,
        labels: HashMap::from([
            ("io.kubernetes.pod.namespace".to_owned(), "default".to_owned()),
            ("io.kubernetes.pod.name".to_owned(), "p1".to_owned()),
            ("io.kubernetes.pod.uid".to_owned(), uid.clone()),
            ("io.kubernetes.container.name".to_owned(), name.to_owned()),
        ]),
        ..Default::default()
    };
    *runtime.containers.lock().unwrap() = vec![ctr("abc", "c1"), ctr("def", "side")];
    until(&d, "the container's scope has the CPUs", || {
        d.cgroup(&format!("{scope}/cpuset.cpus")).as_deref() == Some("6-7,14-15")
    })
    .await;
    until(&d, "the sidecar is kept off the exclusive CPUs", || {
        d.cgroup(&format!("{side}/cpuset.cpus")).as_deref() == Some("0,5,8,13")
    })
    .await;
    let a = v.call("GetAssignment", json!({"id": "kubelet-core-6"})).unwrap();
    assert_eq!(a["assignment"]["target"], format!("cgroup:{scope}"));
    assert_eq!(a["assignment"]["container"], "default/p1/c1");

    // The web allocation no container holds is released after the grace period; so is the
    // dp one once its container is gone.
    until(&d, "the unheld web allocation is released", || {
        v.call("GetAssignment", json!({"id": "kubelet-milli-web-00001"})).is_err()
    })
    .await;
    pods.pods.lock().unwrap().clear();
    runtime.containers.lock().unwrap().clear();
    until(&d, "the dp allocation is released", || {
        v.call("GetAssignment", json!({"id": "kubelet-core-6"})).is_err()
    })
    .await;
    until(&d, "the sidecar's cgroup is no longer confined", || {
        d.cgroup(&format!("{side}/cpuset.cpus")).as_deref() == Some("")
    })
    .await;
    let e = v.call("GetAssignment", json!({"id": "kubelet-core-6"})).unwrap_err();
    assert_eq!(e.0, "org.cpupool.Manager.NoSuchAssignment");

    // 100 kubelet restarts. A starting kubelet removes every socket in the directory; every
    // other restart here leaves ours in place, as a kubelet that does not clean up would. On
    // ext4 the new kubelet.sock usually gets the old one's inode number. Either way every pool
    // registers again, with the same device ids.
    let lists: Vec<Devices> =
        vec![first_list(sock("dp")).await, first_list(sock("th")).await, first_list(sock("web")).await];
    let mut times = Vec::new();
    for i in 0..100 {
        kubelet.exit().await;
        for e in std::fs::read_dir(&plugins).unwrap() {
            let path = e.unwrap().path();
            if i % 2 == 0 || path.ends_with("kubelet.sock") {
                std::fs::remove_file(path).unwrap();
            }
        }
        while registered.try_recv().is_ok() {}
        let start = Instant::now();
        kubelet = Kubelet::serve(&plugins, tx.clone());
        // Done when every pool has registered an endpoint that answers. Like the kubelet, the
        // peer dials the endpoint on Register: a registration that raced with the removal of
        // its socket does not count, and the daemon registers the pool again once it has
        // bound the socket anew.
        let mut pending = std::collections::BTreeSet::from(["dp", "th", "web"]);
        while !pending.is_empty() {
            let r = tokio::time::timeout(WAIT, registered.recv())
                .await
                .unwrap_or_else(|_| panic!("{pending:?} not registered within {WAIT:?}\n{}", d.logs()))
                .unwrap();
            let pool = r.resource_name.strip_prefix("cpupool.io/").unwrap().to_owned();
            assert_eq!(r.endpoint, format!("cpupoold-{pool}.sock"));
            if answers(plugins.join(&r.endpoint)).await {
                pending.remove(pool.as_str());
            }
        }
        times.push(start.elapsed());
        let again =
            vec![first_list(sock("dp")).await, first_list(sock("th")).await, first_list(sock("web")).await];
        assert_eq!(again, lists);
    }
    times.sort();
    let (p50, p99) = (times[50], times[99 * times.len() / 100]);
    println!(
        "re-registration after a kubelet restart (3 pools), 100 restarts: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        p50.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3,
        times[times.len() - 1].as_secs_f64() * 1e3
    );
    // A figure, not a bound: how soon a pool registers again follows the kubelet peer's own
    // time from bind() to listen() (connections before it are refused and retried with a
    // backoff that doubles from 20 ms), and on a loaded machine that took 5 s once, making one
    // restart 10.3 s. Every restart registering every pool again (above, or the wait panics)
    // is the check.
    d.stop();
}

/// A host where the kubelet comes after cpupoold, or its directory is removed and made again: no
/// device-plugin directory (the daemon waits quietly), then the kubelet creates it and every
/// pool registers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_installed_after_the_daemon() {
    let tmp = tempfile::tempdir().unwrap();
    let plugins = tmp.path().join("sb/kubelet/device-plugins");
    let d = Daemon::start_shaped(tmp.path(), "2x4x2:2", Some(CONFIG), &["--bus", "none"]);
    // The sandbox makes the directory; this host has none. The daemon serves its sockets again
    // as they are removed, until it sees the directory gone: remove it until it is.
    until(&d, "the device-plugin directory is gone", || {
        let _ = std::fs::remove_dir_all(&plugins);
        !plugins.exists()
    })
    .await;
    until(&d, "the daemon says it waits for the kubelet", || {
        d.logs().contains("waiting for the kubelet's directory")
    })
    .await;
    std::fs::create_dir_all(&plugins).unwrap();
    let (tx, mut registered) = mpsc::unbounded_channel();
    let _kubelet = Kubelet::serve(&plugins, tx);
    let mut pools = Vec::new();
    for _ in 0..3 {
        let r = tokio::time::timeout(WAIT, registered.recv())
            .await
            .unwrap_or_else(|_| panic!("no registration within {WAIT:?}\n{}", d.logs()))
            .unwrap();
        pools.push(r.resource_name);
    }
    pools.sort();
    assert_eq!(pools, ["cpupool.io/dp", "cpupool.io/th", "cpupool.io/web"]);
    // Waiting is not failing: nothing was logged as a warning.
    assert!(!d.logs().contains("warning: device plugin"), "{}", d.logs());
    d.stop();
}

/// Pools deleted and made at run time: the deleted one's socket goes, the new one is served and
/// registered, without a reload or a new kubelet. Assign and Release in between (pool events
/// that change no offered pool) leave the served sockets as they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_deleted_or_made_at_run_time_is_withdrawn_or_registered() {
    let tmp = tempfile::tempdir().unwrap();
    let sb = tmp.path().join("sb");
    let Peer { plugins, kubelet: _kubelet, tx: _tx, mut registered, .. } = serve_peer(&sb);
    let d = Daemon::start_shaped(tmp.path(), "2x4x2:2", Some(CONFIG), &["--bus", "none"]);
    let next = |registered: &mut mpsc::UnboundedReceiver<dp::RegisterRequest>| {
        let logs = d.logs();
        let r = registered.try_recv();
        r.map_err(|_| logs)
    };
    let mut got = Vec::new();
    until(&d, "three registrations", || {
        while let Ok(r) = next(&mut registered) {
            got.push(r.resource_name);
        }
        got.len() == 3
    })
    .await;
    let sock = |pool: &str| plugins.join(format!("cpupoold-{pool}.sock"));
    let ino =
        |pool: &str| std::fs::metadata(sock(pool)).map(|m| std::os::unix::fs::MetadataExt::ino(&m)).ok();
    let (dp, th) = (ino("dp"), ino("th"));

    let mut v = Varlink::connect(&d.varlink);
    std::fs::create_dir_all(sb.join("cgroup/work/app")).unwrap();
    for i in 0..5 {
        v.call(
            "Assign",
            json!({"pool": "web", "target": "cgroup:work/app", "millicpus": 100, "id": format!("a{i}")}),
        )
        .unwrap();
        v.call("Release", json!({"id": format!("a{i}")})).unwrap();
    }
    v.call("DeletePool", json!({"name": "web"})).unwrap();
    until(&d, "the deleted pool's socket is removed", || !sock("web").exists()).await;
    v.call("CreatePool", json!({"name": "web2", "kind": "shared", "cpus": "5,13"})).unwrap();
    until(&d, "the new pool registers", || {
        while let Ok(r) = next(&mut registered) {
            got.push(r.resource_name);
        }
        got.len() == 4
    })
    .await;
    assert_eq!(got[3], "cpupool.io/web2");
    assert!(sock("web2").exists());
    // The other pools kept their sockets (not served anew) and registrations through all of it.
    assert_eq!((ino("dp"), ino("th")), (dp, th));
    assert!(dp.is_some() && th.is_some());
    assert_eq!(got.len(), 4, "{got:?}");
    d.stop();
}

/// Holds as many idle connections to `sock` as it gets (of `n`), as nobody; prints how many
/// stayed open (the server spoke first: HTTP/2 settings), then waits for stdin to close.
const IDLE_HOLDER_PY: &str = r#"
import socket, sys
held, refused = [], 0
for _ in range(int(sys.argv[2])):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(sys.argv[1])
        s.settimeout(5)
        if s.recv(1):
            held.append(s)
            continue
    except OSError:
        pass
    refused += 1
print(len(held), refused, flush=True)
sys.stdin.read()
"#;

/// The device-plugin sockets' connections are the kubelet's: with the daemon's umask 000 (so a
/// socket would be open to all), another user's idle connections do not take the budget (64),
/// and root's calls are answered while they try.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_users_idle_connections_do_not_lock_the_kubelet_out() {
    use std::io::BufRead;
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let sb = tmp.path().join("sb");
    let Peer { plugins, kubelet: _kubelet, tx: _tx, mut registered, .. } = serve_peer(&sb);
    let umask0 = ["sh", "-c", "umask 000; exec \"$0\" \"$@\""];
    let d = Daemon::start_wrapped(tmp.path(), &umask0, "2x4x2:2", Some(CONFIG), &["--bus", "none"], &[]);
    tokio::time::timeout(WAIT, registered.recv())
        .await
        .unwrap_or_else(|_| panic!("no registration\n{}", d.logs()));
    let sock = plugins.join("cpupoold-dp.sock");
    common::open_to_everyone(&plugins);

    let mut holder = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", IDLE_HOLDER_PY])
        .arg(&sock)
        .arg("100")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(holder.stdout.take().unwrap()).read_line(&mut line).unwrap();
    // The kubelet (root) is served.
    let opts = plugin(sock.clone()).await.get_device_plugin_options(dp::Empty {}).await;
    assert!(opts.is_ok(), "root's call while nobody holds what it got ({line}): {opts:?}");
    let counts: Vec<u32> = line.split_whitespace().map(|n| n.parse().unwrap()).collect();
    assert_eq!(counts, [0, 100], "nobody's connections held and refused: {line}");
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the socket's mode");
    drop(holder.stdin.take());
    let _ = holder.wait();
    d.stop();
}

/// The kubelet hands a terminated pod's devices out again at once; cpupoold still holds them
/// for `release_grace_ms` (a minute here). Allocate must not be refused meanwhile: what no
/// container holds in PodResources is released for it. What a container still holds is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocate_takes_back_devices_the_kubelet_freed_within_the_grace_period() {
    let tmp = tempfile::tempdir().unwrap();
    let sb = tmp.path().join("sb");
    let mut peer = serve_peer(&sb);
    let config = CONFIG.replace("release_grace_ms = 500", "release_grace_ms = 60000");
    let d = Daemon::start_shaped(tmp.path(), "2x4x2:2", Some(&config), &["--bus", "none"]);
    for _ in 0..3 {
        tokio::time::timeout(WAIT, peer.registered.recv())
            .await
            .unwrap_or_else(|_| panic!("no registration within {WAIT:?}\n{}", d.logs()));
    }
    let sock = |pool: &str| peer.plugins.join(format!("cpupoold-{pool}.sock"));
    let alloc = |d: &[&str]| dp::AllocateRequest {
        container_requests: vec![dp::ContainerAllocateRequest { devices_ids: ids(d) }],
    };
    // Pod a holds 3 of web's 4 units (as PodResources lists them: one entry per device) and
    // core 6 of dp.
    let holds = |pod: &str, resource: &str, devs: &[&str]| pr::PodResources {
        name: pod.into(),
        namespace: "default".into(),
        containers: vec![pr::ContainerResources {
            name: "c".into(),
            devices: listed(resource, devs, None),
            ..Default::default()
        }],
    };
    let mut web = plugin(sock("web")).await;
    let mut dpc = plugin(sock("dp")).await;
    web.allocate(alloc(&["milli-web-00000", "milli-web-00001", "milli-web-00002"])).await.unwrap();
    dpc.allocate(alloc(&["core-6", "core-7"])).await.unwrap();
    *peer.pods.pods.lock().unwrap() = vec![
        holds("a", "cpupool.io/web", &["milli-web-00000", "milli-web-00001", "milli-web-00002"]),
        holds("a2", "cpupool.io/dp", &["core-6", "core-7"]),
    ];
    let mut v = Varlink::connect(&d.varlink);

    // While pod a still holds them, an overlapping Allocate is refused and changes nothing.
    let before = v.call("ListAssignments", json!({})).unwrap();
    let e = web.allocate(alloc(&["milli-web-00000", "milli-web-00001"])).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{}", e.message());
    let e = dpc.allocate(alloc(&["core-7"])).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{}", e.message());
    assert_eq!(v.call("ListAssignments", json!({})).unwrap(), before);

    // Pod a terminates: the kubelet frees its devices and hands them to pod b at once.
    peer.pods.pods.lock().unwrap().clear();
    let r = web.allocate(alloc(&["milli-web-00000", "milli-web-00001"])).await.unwrap().into_inner();
    assert_eq!(r.container_responses[0].envs["CPUPOOL_POOL"], "web");
    let a = v.call("GetAssignment", json!({"id": "kubelet-milli-web-00000"})).unwrap();
    assert_eq!(a["assignment"]["millicpus"], 1000, "{a}");
    let r = dpc.allocate(alloc(&["core-7"])).await.unwrap().into_inner();
    assert_eq!(r.container_responses[0].envs["EXCLUSIVE_CPUS"], "7,15");
    let e = v.call("GetAssignment", json!({"id": "kubelet-core-6"})).unwrap_err();
    assert_eq!(e.0, "org.cpupool.Manager.NoSuchAssignment");
    let logs = d.logs();
    assert!(logs.contains("released kubelet-core-6: the kubelet hands out its devices again"), "{logs}");

    // The kubelet turns to the static CPU manager with only CPUs 0,8 (the reserved pool)
    // reserved: it may hand out the pools' CPUs, and the daemon says which.
    assert!(!logs.contains("static CPU manager may give"), "{logs}");
    *peer.pods.allocatable.lock().unwrap() = (1..16).filter(|c| *c != 8).collect();
    until(&d, "the CPU manager conflict is logged", || {
        d.logs().contains(
            "the kubelet's static CPU manager may give CPUs 1-7,9-15 of pool(s) dp, th, web to Guaranteed containers",
        )
    })
    .await;
    d.stop();
}

/// A host without a kubelet: one line at info says it is not there yet, however many
/// reconcile rounds run (every 10 ms here); no warning, and no transport error about PodResources.
#[test]
fn no_kubelet_is_said_once_at_info() {
    let dir = tempfile::tempdir().unwrap();
    let config = format!("{}\n[kubelet]\nreconcile_interval_ms = 10\n", common::CONFIG);
    let d = Daemon::start_shaped(dir.path(), "1x4x2:1", Some(&config), &["--bus", "none"]);
    let deadline = Instant::now() + test_support::wait::PATIENCE;
    while !d.logs().contains("no kubelet yet") {
        assert!(Instant::now() < deadline, "no word of the missing kubelet:\n{}", d.logs());
        std::thread::sleep(Duration::from_millis(10));
    }
    // Reconcile rounds keep running meanwhile; answer a few calls so that several pass.
    let mut v = Varlink::connect(&d.varlink);
    for _ in 0..20 {
        v.call("Status", json!({})).unwrap();
    }
    let logs = d.logs();
    d.stop();
    let socket = dir.path().join("sb/kubelet/pod-resources/kubelet.sock");
    let said: Vec<&str> = logs.lines().filter(|l| l.contains("kubelet yet")).collect();
    assert_eq!(
        said,
        [format!(
            "cpupoold info: device plugin: no kubelet yet (`{}` does not exist); its containers are \
             reconciled once it is there",
            socket.display()
        )],
        "{logs}"
    );
    assert!(!logs.contains("PodResources"), "{logs}");
    assert!(!logs.lines().any(|l| l.starts_with("cpupoold warning")), "{logs}");
}
