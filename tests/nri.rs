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
use std::time::Duration;

use common::{Daemon, Varlink};
use cpupoold::nri::proto as api;
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
    // Pod sandboxes run/stop/remove, container create/start/update/stop/remove: all within NRI
    // v0.6.1's mask (0x7FF), which refuses a plugin that asks for an event it does not know.
    assert_eq!(events, 0x1 | 0x2 | 0x4 | 0x8 | 0x20 | 0x80 | 0x200 | 0x400);
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
    let mut n = Node::serve(&tmp.path().join("sb"));
    let d = start(tmp.path());
    let mut rt = n.runtime.accept(WAIT).unwrap();
    rt.configure().unwrap();
    rt.synchronize(Vec::new(), Vec::new()).unwrap();
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
    let mut n = Node::serve(&tmp.path().join("sb"));
    let d = start(tmp.path());
    let mut rt = n.runtime.accept(WAIT).unwrap();
    rt.configure().unwrap();
    rt.synchronize(Vec::new(), Vec::new()).unwrap();
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
