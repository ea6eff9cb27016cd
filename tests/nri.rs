//! The NRI plugin against a fake container runtime (`test_support::nri`, named a fake: the
//! real containerd runs in the guest suite, tests/vm/). It checks what the real runtime makes
//! hard to provoke: registration and the events subscribed, Synchronize on every connection,
//! the adjustment at creation (from the allocation PodResources says the container holds, not
//! from its environment), the read-back at start, release at stop, a container restarted
//! after its CPUs were released, a start refused when the kernel does not give the CPUs,
//! reconnection after the runtime goes, and a restart of cpupoold with containers running.
//!
//! The daemon is the real binary on a simulated 2-socket, 4-core, SMT-2, 2-NUMA host (CPU c
//! and c+8 are siblings; cores 0-3 on node 0, 4-7 on node 1); the kubelet's device plugin part
//! is the kubelet-shaped peer of tests/deviceplugin.rs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{Daemon, Varlink};
use cpupoold::kubernetes::nri::proto as api;
use serde_json::json;
use test_support::nri::{self as fake, Node};

/// reserved 0,8; dp: cores 1-3 and 6-7, whole cores; web: shared 4-5,12-13.
const CONFIG: &str = r#"
[pools.sys]
kind = "reserved"
cpus = "0,8"

[pools.dp]
kind = "exclusive"
cpus = "1-3,9-11,6-7,14-15"

[pools.web]
kind = "shared"
cpus = "4-5,12-13"

[kubelet]
millicpus_per_device = 500
# The fake kubelet's PodResources lists no pod: nothing may be released for that meanwhile.
release_grace_ms = 600000
reconcile_interval_ms = 100
"#;

const WAIT: Duration = test_support::wait::PATIENCE;

fn start(tmp: &Path) -> Daemon {
    Daemon::start_shaped(tmp, "2x4x2:2", Some(CONFIG), &["--bus", "none"])
}

/// A node and the daemon on it, with the fake runtime's first connection configured and
/// synchronized with nothing running.
fn connected(tmp: &Path) -> (Node, Daemon, fake::Plugin) {
    let n = Node::serve(&tmp.join("sb"));
    let d = start(tmp);
    let mut rt = n.runtime.accept(WAIT).unwrap();
    rt.configure().unwrap();
    rt.synchronize(Vec::new(), Vec::new()).unwrap();
    (n, d, rt)
}

fn env_refs(env: &[(String, String)]) -> Vec<(&str, &str)> {
    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

/// The CPUs and memory nodes an adjustment sets.
fn adjusted(r: &api::CreateContainerResponse) -> (String, String) {
    let cpu = r
        .adjust
        .as_ref()
        .and_then(|a| a.linux.as_ref())
        .and_then(|l| l.resources.as_ref())
        .and_then(|r| r.cpu.as_ref())
        .cloned()
        .unwrap_or_default();
    (cpu.cpus, cpu.mems)
}

fn assignment(d: &Daemon, id: &str) -> Option<serde_json::Value> {
    let list = Varlink::connect(&d.varlink).call("ListAssignments", json!({})).unwrap();
    list["assignments"].as_array().unwrap().iter().find(|a| a["id"] == id).cloned()
}

/// The events cpupoold follows: pod sandboxes run/stop/remove, container
/// create/start/update/stop/remove.
const FOLLOWED: [&str; 8] = [
    "RUN_POD_SANDBOX",
    "STOP_POD_SANDBOX",
    "REMOVE_POD_SANDBOX",
    "CREATE_CONTAINER",
    "START_CONTAINER",
    "UPDATE_CONTAINER",
    "STOP_CONTAINER",
    "REMOVE_CONTAINER",
];

/// `enum Event` of NRI's api.proto (as vendored from containerd/nri): name → value.
fn proto_events() -> Vec<(String, i32)> {
    let proto =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("proto/nri/v1alpha1/api.proto"))
            .unwrap();
    let body = proto.split("enum Event {").nth(1).unwrap().split('}').next().unwrap();
    body.lines()
        .filter_map(|l| l.trim().strip_suffix(';')?.split_once('='))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().parse().unwrap()))
        .collect()
}

/// The mask of the followed events as NRI defines it: event `e` is bit `e - 1` (containerd/nri
/// `pkg/api/event.go`: `1 << (e - 1)`; `UNKNOWN` = 0 has no bit).
fn followed_events() -> i32 {
    let events = proto_events();
    FOLLOWED
        .iter()
        .map(|name| {
            events.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("{name} not in api.proto")).1
        })
        .fold(0, |m, v| m | 1 << (v - 1))
}

/// The mask docs/interfaces.md gives is the one derived from the proto, and it is within what
/// NRI v0.6.1 (containerd 1.7.24) accepts: the events it knows, 1-11 (`0x7ff`), as it refuses a
/// plugin that asks for one it does not know.
#[test]
fn the_event_mask_comes_from_the_protos_event_numbers() {
    let mask = followed_events();
    assert_eq!(mask, 0x6af);
    let v061 =
        proto_events().iter().filter(|(_, v)| (1..=11).contains(v)).fold(0, |m, (_, v)| m | 1 << (v - 1));
    assert_eq!(v061, 0x7ff);
    assert_eq!(mask & !v061, 0);
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/interfaces.md")).unwrap();
    assert!(
        doc.contains(&format!("mask `{mask:#x}`")),
        "docs/interfaces.md does not give the mask {mask:#x}"
    );
}

fn state(mut c: api::Container, s: api::ContainerState) -> api::Container {
    c.set_state(s);
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_runtime_a_pooled_container_starts_on_its_cpus_and_gives_them_back() {
    let tmp = tempfile::tempdir().unwrap();
    let mut n = Node::serve(&tmp.path().join("sb"));
    let d = start(tmp.path());
    let mut rt = n.runtime.accept(WAIT).unwrap_or_else(|e| panic!("no registration: {e}\n{}", d.logs()));
    assert_eq!((rt.name.as_str(), rt.index.as_str()), ("cpupoold", "90"));
    let events = rt.configure().unwrap();
    assert_eq!(events, followed_events(), "{events:#x}");
    rt.synchronize(Vec::new(), Vec::new()).unwrap();

    // The kubelet allocates core 6 (CPUs 6,14, node 1) of dp; the runtime creates the container.
    let env = n.allocate("dp", &["core-6"], "default/web-0/app").await;
    let pod = fake::pod("s1", &test_support::apiserver::uid(), "web-0");
    let c = fake::container(&pod, "c1", "app", &env_refs(&env));
    let r: api::CreateContainerResponse = rt.create(&pod, &c).unwrap().unwrap();
    assert_eq!(adjusted(&r), ("6,14".to_owned(), "1".to_owned()), "{}", d.logs());
    let a = assignment(&d, "kubelet-core-6").unwrap();
    assert_eq!(a["target"], "kubelet:core-6", "not bound before the cgroup exists: {a}");

    // runc makes the cgroup with the adjusted CPUs; StartContainer binds and reads it back.
    let cg = fake::cgroup(&pod, "c1");
    n.runc_creates(&cg, "6,14");
    let started: Result<api::Empty, _> = rt.event(api::Event::StartContainer, &pod, Some(&c)).unwrap();
    started.unwrap_or_else(|e| panic!("{e:?}\n{}", d.logs()));
    let a = assignment(&d, "kubelet-core-6").unwrap();
    assert_eq!(a["target"], format!("cgroup:{cg}"), "{a}");
    assert_eq!(a["container"], "default/web-0/app", "{a}");
    assert_eq!(a["state"], "applied", "{a}");

    // A container without a pool device: the CPUs no exclusive pool holds, and its cgroup is
    // kept there once started; so is the pod's sandbox.
    let side = fake::container(&pod, "c2", "side", &[]);
    let r: api::CreateContainerResponse = rt.create(&pod, &side).unwrap().unwrap();
    assert_eq!(adjusted(&r), ("0,4-5,8,12-13".to_owned(), "0-1".to_owned()));
    n.runc_creates(&fake::cgroup(&pod, "c2"), "0-15");
    let _: api::Empty = rt.event(api::Event::StartContainer, &pod, Some(&side)).unwrap().unwrap();
    assert_eq!(
        d.cgroup(&format!("{}/cpuset.cpus", fake::cgroup(&pod, "c2"))).as_deref(),
        Some("0,4-5,8,12-13")
    );
    n.runc_creates(&fake::cgroup(&pod, "s1"), "0-15");
    let _: api::Empty = rt.event(api::Event::RunPodSandbox, &pod, None).unwrap().unwrap();
    assert_eq!(
        d.cgroup(&format!("{}/cpuset.cpus", fake::cgroup(&pod, "s1"))).as_deref(),
        Some("0,4-5,8,12-13")
    );

    // An update asking for other CPUs (the kubelet's static CPU manager) is answered with its own.
    let asked = api::LinuxResources {
        cpu: Some(api::LinuxCpu { cpus: "1-3".into(), ..Default::default() }),
        ..Default::default()
    };
    let req = api::UpdateContainerRequest {
        pod: Some(pod.clone()),
        container: Some(c.clone()),
        linux_resources: Some(asked),
    };
    let r: api::UpdateContainerResponse = rt.call("UpdateContainer", &req).unwrap().unwrap();
    let kept: Vec<(&str, &str)> = r
        .update
        .iter()
        .filter_map(|u| {
            Some((u.container_id.as_str(), u.linux.as_ref()?.resources.as_ref()?.cpu.as_ref()?.cpus.as_str()))
        })
        .collect();
    assert_eq!(kept, [("c1", "6,14")]);
    assert!(d.logs().contains("cpuManagerPolicy"), "{}", d.logs());

    // The container stops: its CPUs are released at once.
    rt.stop(&pod, &state(c.clone(), api::ContainerState::ContainerStopped)).unwrap().unwrap();
    assert!(assignment(&d, "kubelet-core-6").is_none(), "{}", d.logs());

    // The kubelet restarts it (a new container, the same environment): held again, bound again.
    let again = fake::container(&pod, "c3", "app", &env_refs(&env));
    let r: api::CreateContainerResponse = rt.create(&pod, &again).unwrap().unwrap();
    assert_eq!(adjusted(&r).0, "6,14");
    n.runc_creates(&fake::cgroup(&pod, "c3"), "6,14");
    let _: api::Empty = rt.event(api::Event::StartContainer, &pod, Some(&again)).unwrap().unwrap();
    assert_eq!(
        assignment(&d, "kubelet-core-6").unwrap()["target"],
        format!("cgroup:{}", fake::cgroup(&pod, "c3"))
    );
    // The old container's removal, later, does not take the new one's CPUs.
    let _: api::Empty = rt.event(api::Event::RemoveContainer, &pod, Some(&c)).unwrap().unwrap();
    assert!(assignment(&d, "kubelet-core-6").is_some());
    let _: api::Empty = rt.event(api::Event::RemoveContainer, &pod, Some(&again)).unwrap().unwrap();
    assert!(assignment(&d, "kubelet-core-6").is_none(), "released when its container is removed");
    d.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_runtime_a_start_whose_cgroup_does_not_hold_the_cpus_fails_and_a_copied_environment_gets_nothing(
) {
    let tmp = tempfile::tempdir().unwrap();
    let (mut n, d, mut rt) = connected(tmp.path());
    let env = n.allocate("dp", &["core-7"], "default/db-0/db").await;
    let pod = fake::pod("s1", &test_support::apiserver::uid(), "db-0");
    let c = fake::container(&pod, "c1", "db", &env_refs(&env));
    let _: api::CreateContainerResponse = rt.create(&pod, &c).unwrap().unwrap();
    // The pod's parent has other CPUs (the kernel gives a cgroup only what its parent has).
    n.runc_creates("kubepods.slice", "0-5");
    n.runc_creates(&fake::cgroup(&pod, "c1"), "7,15");
    let r: Result<api::Empty, _> = rt.event(api::Event::StartContainer, &pod, Some(&c)).unwrap();
    let e = r.expect_err("the start must fail");
    assert!(e.message.starts_with("cpupoold: container default/db-0/db"), "{}", e.message);
    let a = assignment(&d, "kubelet-core-7").unwrap();
    assert_eq!(a["target"], "kubelet:core-7", "never bound where the CPUs do not hold: {a}");
    // A container whose author copied db's variables into its environment holds no device
    // (PodResources says so): it gets no pool's CPUs, and db's assignment is not touched.
    let thief = fake::container(&pod, "c9", "x", &env_refs(&env));
    let r: api::CreateContainerResponse = rt.create(&pod, &thief).unwrap().unwrap();
    assert_eq!(adjusted(&r).0, "0,4-5,8,12-13", "the CPUs of no pool");
    n.runc_creates(&fake::cgroup(&pod, "c9"), "0,4-5,8,12-13");
    let _: api::Empty = rt.event(api::Event::StartContainer, &pod, Some(&thief)).unwrap().unwrap();
    assert_eq!(assignment(&d, "kubelet-core-7").unwrap()["target"], "kubelet:core-7");
    rt.stop(&pod, &thief).unwrap().unwrap();
    assert!(assignment(&d, "kubelet-core-7").is_some(), "its stop releases nothing of db's");
    assert!(d.logs().contains("container default/db-0/x names kubelet-core-7 in its environment, but the kubelet says it holds none"), "{}", d.logs());
    // A method this plugin does not serve is Unimplemented (newer runtimes fall back on it).
    let r: Result<api::Empty, _> = rt.call("PostStartContainer", &api::Empty {}).unwrap();
    assert_eq!(r.unwrap_err().code, 12);
    d.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_runtime_reconnects_and_a_restart_of_cpupoold_keeps_running_containers() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut n, d, mut rt) = connected(tmp.path());
    let env1 = n.allocate("dp", &["core-1"], "default/p/a").await;
    let env2 = n.allocate("dp", &["core-2"], "default/p/b").await;
    let pod = fake::pod("s1", &test_support::apiserver::uid(), "p");
    let (c1, c2) = (
        fake::container(&pod, "c1", "a", &env_refs(&env1)),
        fake::container(&pod, "c2", "b", &env_refs(&env2)),
    );
    for (c, cpus) in [(&c1, "1,9"), (&c2, "2,10")] {
        let _: api::CreateContainerResponse = rt.create(&pod, c).unwrap().unwrap();
        n.runc_creates(&fake::cgroup(&pod, &c.id), cpus);
        let _: api::Empty = rt.event(api::Event::StartContainer, &pod, Some(c)).unwrap().unwrap();
    }
    // The runtime restarts: the plugin connects again and is synchronized with what runs.
    drop(rt);
    let mut rt = n.runtime.accept(WAIT).unwrap_or_else(|e| panic!("no reconnection: {e}\n{}", d.logs()));
    rt.configure().unwrap();
    let running = |c: &api::Container| state(c.clone(), api::ContainerState::ContainerRunning);
    rt.synchronize(vec![pod.clone()], vec![running(&c1), running(&c2)]).unwrap();
    for (id, c) in [("kubelet-core-1", "c1"), ("kubelet-core-2", "c2")] {
        assert_eq!(
            assignment(&d, id).unwrap()["target"],
            format!("cgroup:{}", fake::cgroup(&pod, c)),
            "{}",
            d.logs()
        );
    }
    // cpupoold restarts while c2 goes: c1 keeps its CPUs, c2's are released at the resync.
    d.kill();
    let before =
        std::fs::read_to_string(n.sb.join("cgroup").join(fake::cgroup(&pod, "c1")).join("cpuset.cpus"))
            .unwrap();
    let d = start(tmp.path());
    let mut rt = n.runtime.accept(WAIT).unwrap();
    rt.configure().unwrap();
    rt.synchronize(vec![pod.clone()], vec![running(&c1)]).unwrap();
    assert_eq!(
        assignment(&d, "kubelet-core-1").unwrap()["target"],
        format!("cgroup:{}", fake::cgroup(&pod, "c1"))
    );
    assert!(assignment(&d, "kubelet-core-2").is_none(), "{}", d.logs());
    let after =
        std::fs::read_to_string(n.sb.join("cgroup").join(fake::cgroup(&pod, "c1")).join("cpuset.cpus"))
            .unwrap();
    assert_eq!(before, after, "nothing moved");
    d.stop();
}

/// A runtime that reconnects while the kubelet's PodResources cannot answer (the socket file
/// is there, nobody listens: a kubelet restarting): the running container that says it holds
/// devices cannot be looked up, and Synchronize used to count it gone and release its CPUs
/// under it. It keeps them, bound to its cgroup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_runtime_reconnecting_while_the_kubelet_cannot_answer_releases_nothing_that_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut n, d, mut rt) = connected(tmp.path());
    let env = n.allocate("dp", &["core-1"], "default/p/a").await;
    let pod = fake::pod("s1", &test_support::apiserver::uid(), "p");
    let c1 = fake::container(&pod, "c1", "a", &env_refs(&env));
    let _: api::CreateContainerResponse = rt.create(&pod, &c1).unwrap().unwrap();
    n.runc_creates(&fake::cgroup(&pod, "c1"), "1,9");
    let _: api::Empty = rt.event(api::Event::StartContainer, &pod, Some(&c1)).unwrap().unwrap();
    let target = format!("cgroup:{}", fake::cgroup(&pod, "c1"));
    assert_eq!(assignment(&d, "kubelet-core-1").unwrap()["target"], target.as_str());
    // The kubelet goes away: its socket stays, refusing connections.
    let socket = n.sb.join("kubelet/pod-resources/kubelet.sock");
    std::fs::remove_file(&socket).unwrap();
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    drop(rt);
    let mut rt = n.runtime.accept(WAIT).unwrap_or_else(|e| panic!("no reconnection: {e}\n{}", d.logs()));
    rt.configure().unwrap();
    let running = state(c1.clone(), api::ContainerState::ContainerRunning);
    rt.synchronize(vec![pod.clone()], vec![running]).unwrap();
    let kept = assignment(&d, "kubelet-core-1")
        .unwrap_or_else(|| panic!("released under a running container\n{}", d.logs()));
    assert_eq!(kept["target"], target.as_str(), "{}", d.logs());
    d.stop();
}

/// The `cgroups_path`s a runtime could send that name a cgroup cpupoold does not own: the host
/// slices, systemd's own scope, cpupoold's parent slice and a pool's slice, as cgroupfs paths and
/// in the systemd driver's `SLICE:PREFIX:NAME` form (a NAME ending in `.slice` is taken whole).
const NOT_OURS: [(&str, &str); 9] = [
    ("/system.slice", "system.slice"),
    ("/init.scope", "init.scope"),
    ("/user.slice", "user.slice"),
    ("/cpupool.slice", "cpupool.slice"),
    ("/cpupool.slice/cpupool-dp.slice", "cpupool.slice/cpupool-dp.slice"),
    ("-.slice:cri-containerd:system.slice", "system.slice"),
    ("-.slice:cri-containerd:user.slice", "user.slice"),
    ("-.slice:cri-containerd:cpupool.slice", "cpupool.slice"),
    ("cpupool.slice:cri-containerd:cpupool-dp.slice", "cpupool.slice/cpupool-dp.slice"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_runtime_naming_host_or_pool_slices_as_a_pod_or_container_cgroup_gets_nothing_written_there() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut n, d, mut rt) = connected(tmp.path());
    let read = |d: &Daemon| {
        NOT_OURS.iter().map(|(_, rel)| (*rel, d.cgroup(&format!("{rel}/cpuset.cpus")))).collect::<Vec<_>>()
    };
    let before = read(&d);
    assert!(before.iter().all(|(_, v)| v.is_some()), "{before:?}");
    let uids = [
        "4f1c9a0e-7b2d-4c3e-9a1f-0d2e3b4c5d6e",
        "0a9b8c7d-6e5f-4a3b-8c2d-1e0f9a8b7c6d",
        "93c1e2d4-5f6a-4b7c-9d8e-7f6a5b4c3d2e",
    ];
    let mut pods = Vec::new();
    for (i, (path, _)) in NOT_OURS.iter().enumerate() {
        // A pod sandbox there.
        let mut pod = fake::pod(&format!("s{i}"), uids[i % uids.len()], &format!("p-{i}"));
        pod.linux.as_mut().unwrap().cgroups_path = (*path).to_owned();
        let _: api::Empty = rt.event(api::Event::RunPodSandbox, &pod, None).unwrap().unwrap();
        // A container without a pool device there (in a pod of its own): created and started
        // (a container is never failed for this), with no CPUs adjusted and nothing written.
        let host = fake::pod(&format!("h{i}"), uids[(i + 1) % uids.len()], &format!("h-{i}"));
        let mut c = fake::container(&host, &format!("c{i}"), "side", &[]);
        c.linux.as_mut().unwrap().cgroups_path = (*path).to_owned();
        let r: api::CreateContainerResponse = rt.create(&host, &c).unwrap().unwrap();
        assert_eq!(adjusted(&r), (String::new(), String::new()), "{path}: {}", d.logs());
        let _: api::Empty = rt.event(api::Event::StartContainer, &host, Some(&c)).unwrap().unwrap();
        pods.push(pod);
    }
    // A container holding dp's devices whose cgroup is one of them is not created: its CPUs
    // would be written there (fails closed); its allocation stays unbound.
    for (core, path) in
        [("core-1", "/system.slice"), ("core-2", "cpupool.slice:cri-containerd:cpupool-dp.slice")]
    {
        let pod =
            fake::pod(&format!("q{core}"), "5b6c7d8e-9f0a-4b1c-8d2e-3f4a5b6c7d8e", &format!("q-{core}"));
        let env = n.allocate("dp", &[core], &format!("default/q-{core}/app")).await;
        let mut c = fake::container(&pod, &format!("qc-{core}"), "app", &env_refs(&env));
        c.linux.as_mut().unwrap().cgroups_path = path.to_owned();
        let r: Result<api::CreateContainerResponse, _> = rt.create(&pod, &c).unwrap();
        let e = r.expect_err("the creation must fail");
        assert!(
            e.message.starts_with(&format!("cpupoold: container default/q-{core}/app would not run")),
            "{path}: {}",
            e.message
        );
        // Were it created anyway (a runtime that ignores the error), its start binds nothing.
        let r: Result<api::Empty, _> = rt.event(api::Event::StartContainer, &pod, Some(&c)).unwrap();
        assert!(r.is_err(), "{path}: started");
        let a = assignment(&d, &format!("kubelet-{core}")).unwrap();
        assert_eq!(a["target"], format!("kubelet:{core}"), "{path}: {a}");
    }
    // A sandbox of the runtime's own is still kept off the exclusive CPUs after them.
    let fine = fake::pod("sok", "7d3e2f1a-0b9c-4d8e-a7f6-5e4d3c2b1a09", "ok");
    n.runc_creates(&fake::cgroup(&fine, "sok"), "0-15");
    let _: api::Empty = rt.event(api::Event::RunPodSandbox, &fine, None).unwrap().unwrap();
    assert_eq!(
        d.cgroup(&format!("{}/cpuset.cpus", fake::cgroup(&fine, "sok"))).as_deref(),
        Some("0,4-5,8,12-13"),
        "{}",
        d.logs()
    );
    assert_eq!(read(&d), before, "{}", d.logs());
    // Each refusal is said, naming the cgroup and why (the rule assignments pass).
    let logs = d.logs();
    for (_, rel) in NOT_OURS {
        let said = format!("NRI: not confining `{rel}`");
        assert!(logs.contains(&said), "`{said}` not in the log:\n{logs}");
    }
    assert!(logs.contains("which the reserved pool confines for the host's own processes"), "{logs}");
    assert!(logs.contains("is a slice cpupoold manages for its pools"), "{logs}");
    // The sandboxes go: still nothing written there.
    for pod in &pods {
        let _: api::Empty = rt.event(api::Event::RemovePodSandbox, pod, None).unwrap().unwrap();
    }
    assert_eq!(read(&d), before, "{}", d.logs());
    d.stop();
}

/// What a poller saw of one assignment: its state (`None`: no such assignment), read between
/// `asked` and `answered`.
struct Seen {
    asked: Instant,
    answered: Instant,
    state: Option<String>,
}

/// Polls the state of assignment `id` over varlink, as `cpupoolctl assignments` reads it,
/// every 10 ms (the guest polls every 100 ms), handing each reading to the test, until the test
/// drops the receiver.
fn poll_state(varlink: &Path, id: &str) -> std::sync::mpsc::Receiver<Seen> {
    let (tx, rx) = std::sync::mpsc::channel::<Seen>();
    let (varlink, id) = (varlink.to_owned(), id.to_owned());
    std::thread::spawn(move || {
        let mut v = Varlink::connect(&varlink);
        let (pause, stopped) = std::sync::mpsc::channel::<()>();
        loop {
            let asked = Instant::now();
            // The daemon stops at the test's end, maybe before this thread hears of it.
            let Ok(Ok(list)) = v.try_call("ListAssignments", json!({})) else { return };
            let state = list["assignments"]
                .as_array()
                .unwrap()
                .iter()
                .find(|a| a["id"] == id.as_str())
                .map(|a| a["state"].as_str().unwrap().to_owned());
            if tx.send(Seen { asked, answered: Instant::now(), state }).is_err() {
                drop(pause);
                return;
            }
            let _ = stopped.recv_timeout(Duration::from_millis(10));
        }
    });
    rx
}

/// Collects the poller's readings into `all` up to the first one asked after `after` (every
/// phase is seen by the poller, however short); its state.
fn reading_after(
    rx: &std::sync::mpsc::Receiver<Seen>,
    all: &mut Vec<Seen>,
    after: Instant,
) -> Option<String> {
    loop {
        let s = rx.recv_timeout(WAIT).expect("the poller reads on");
        let (fresh, state) = (s.asked >= after, s.state.clone());
        all.push(s);
        if fresh {
            return state;
        }
    }
}

/// The Monitor stream's events of assignment `id`, up to its `removed`.
fn monitor_until_removed(m: &mut Varlink, id: &str) -> Vec<String> {
    let mut changes = Vec::new();
    while changes.last().map(String::as_str) != Some("removed") {
        let e = m.read().unwrap_or_else(|e| panic!("Monitor, after {changes:?}: {e}"));
        let e = &e["parameters"]["event"];
        if e["id"] == id {
            changes.push(e["change"].as_str().unwrap().to_owned());
        }
    }
    changes
}

/// A pod's whole life, polled: the kubelet's allocation reads `allocated` from `Allocate`
/// through the container's creation, `applied` only from the read-back at its start until its
/// stop, and is released then; so on every transport and the Monitor stream. Pod UIDs and
/// container ids are random as an API server's and containerd's are, a digit-first UID first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_runtime_an_allocation_is_allocated_until_its_container_starts_and_applied_only_while_it_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut n, d, mut rt) = connected(tmp.path());
    let mut monitor = Varlink::connect(&d.varlink);
    monitor.set_timeout(WAIT);
    monitor.monitor().unwrap();
    for (i, uid) in [test_support::apiserver::uid_digit_first(), test_support::apiserver::uid_letter_first()]
        .iter()
        .enumerate()
    {
        let name = format!("web-{i}");
        let id = "kubelet-core-2";
        let polled = poll_state(&d.varlink, id);
        let mut seen = Vec::new();
        let t0 = Instant::now();
        let env = n.allocate("dp", &["core-2"], &format!("default/{name}/app")).await;
        let allocated = Instant::now();
        assert_eq!(
            reading_after(&polled, &mut seen, allocated).as_deref(),
            Some("allocated"),
            "{}",
            d.logs()
        );
        let pod = fake::pod(&test_support::uid::container_id(), uid, &name);
        let cid = test_support::uid::container_id();
        let c = fake::container(&pod, &cid, "app", &env_refs(&env));
        let r: api::CreateContainerResponse = rt.create(&pod, &c).unwrap().unwrap();
        let created = Instant::now();
        assert_eq!(adjusted(&r).0, "2,10");
        let a = assignment(&d, id).unwrap();
        assert_eq!((&a["state"], &a["target"]), (&json!("allocated"), &json!("kubelet:core-2")), "{a}");
        assert_eq!(reading_after(&polled, &mut seen, created).as_deref(), Some("allocated"));
        let cg = fake::cgroup(&pod, &cid);
        n.runc_creates(&cg, "2,10");
        let starting = Instant::now();
        let _: api::Empty = rt.event(api::Event::StartContainer, &pod, Some(&c)).unwrap().unwrap();
        let started = Instant::now();
        let a = assignment(&d, id).unwrap();
        assert_eq!((&a["state"], &a["target"]), (&json!("applied"), &json!(format!("cgroup:{cg}"))), "{a}");
        assert_eq!(reading_after(&polled, &mut seen, started).as_deref(), Some("applied"));
        let stopping = Instant::now();
        rt.stop(&pod, &state(c.clone(), api::ContainerState::ContainerStopped)).unwrap().unwrap();
        let stopped = Instant::now();
        assert!(assignment(&d, id).is_none(), "released at its stop\n{}", d.logs());
        assert_eq!(reading_after(&polled, &mut seen, stopped), None);
        let _: api::Empty = rt.event(api::Event::RemoveContainer, &pod, Some(&c)).unwrap().unwrap();
        drop(polled);

        // Applied only between the start's request and the stop's answer; allocated from the
        // allocation until the start was answered; gone before the allocation and after the
        // stop. A reading is of a moment between its request and its answer.
        for s in &seen {
            let ok = match s.state.as_deref() {
                Some("applied") => s.answered >= starting && s.asked <= stopped,
                Some("allocated") => s.answered >= t0 && s.asked <= started,
                None => s.asked <= allocated || s.answered >= stopping,
                Some(other) => panic!("state {other}"),
            };
            assert!(
                ok,
                "{:?} read between {:?} and {:?} (start asked {:?}, answered {:?}, stop asked {:?}, answered {:?})",
                s.state,
                s.asked - t0,
                s.answered - t0,
                starting - t0,
                started - t0,
                stopping - t0,
                stopped - t0
            );
        }
        let changes = monitor_until_removed(&mut monitor, id);
        assert_eq!(changes, ["added", "applied", "removed"], "{}", d.logs());
        // The timings, for the record (the guest measures the same against real containerd).
        let first = |st: &str| seen.iter().find(|s| s.state.as_deref() == Some(st)).map(|s| s.answered - t0);
        let last =
            |st: &str| seen.iter().rev().find(|s| s.state.as_deref() == Some(st)).map(|s| s.answered - t0);
        eprintln!(
            "pod uid {uid}: Allocate answered {:?}, CreateContainer {:?}, StartContainer asked {:?} answered {:?}, \
             StopContainer asked {:?} answered {:?}; polled {} times: allocated {:?}..{:?}, applied {:?}..{:?}, \
             gone from {:?}",
            allocated - t0, created - t0, starting - t0, started - t0, stopping - t0, stopped - t0, seen.len(),
            first("allocated"), last("allocated"), first("applied"), last("applied"),
            seen.iter().rev().take_while(|s| s.state.is_none()).last().map(|s| s.answered - t0),
        );
    }
    d.stop();
}
