//! The DRA driver's kubelet plugin against the kubelet's protocols: the real `cpupoold
//! --sandbox` binary (k8s feature) registers through `plugins_registry/` with the
//! kubelet-shaped peer (test-support's plugin watcher and DRA client, the real protobuf), and
//! reads the claims from the fake API server (`fake_apiserver/claims.rs`): there is no API
//! server or kubelet on these machines, so the cluster side here is a fake.
#![cfg(feature = "k8s")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod fake_apiserver;

use std::path::{Path, PathBuf};

use cpupoold::core::cpuset::CpuSet;
use cpupoold::host::kubelet::proto::dra as pb;
use serde_json::{json, Value};

use common::{Daemon, Varlink};
use fake_apiserver::claims::{claim, Result as Res};
use fake_apiserver::{wait_for, Fake};
use test_support::dra::{self as peer, DraKubelet};

const NODE: &str = "node-a";
const NS: &str = "team";
const DRIVER: &str = "dra.cpupool.io";
const WAIT: u64 = 60;
/// Two NUMA nodes of 40 CPUs: 0-39 and 40-79.
const SHAPE: &str = "2x40x1:2";
const POOLS: &str = "[pools.sys]\nkind = \"reserved\"\ncpus = \"0,40\"\n\n\
    [pools.dp]\nkind = \"exclusive\"\ncpus = \"1-35,41-75\"\ndra = true\n\n\
    [pools.iso]\nkind = \"exclusive\"\ncpus = \"36-39,76-79\"\nisolate = true\ndra = true\n";

fn start(dir: &Path, fake: &Fake) -> Daemon {
    fake.write_kubeconfig(&dir.join("kubeconfig"));
    let config = format!(
        "{POOLS}\n[kubelet]\nenabled = true\n\n[k8s]\nenabled = true\nkubeconfig = \"{}\"\nnode_name = \"{NODE}\"\n",
        dir.join("kubeconfig").display()
    );
    Daemon::start_shaped(dir, SHAPE, Some(&config), &["--bus", "none", "--log-level", "debug"])
}

fn registration(d: &Daemon) -> PathBuf {
    d.sb.join(format!("kubelet/plugins_registry/{DRIVER}-reg.sock"))
}

/// Registers as the plugin watcher does once the registration socket is there.
async fn register(d: &Daemon) -> DraKubelet {
    let sock = registration(d);
    wait_for(WAIT, "the registration socket", || if sock.exists() { Ok(()) } else { Err(d.logs()) });
    let k = peer::register(&sock).await.unwrap_or_else(|e| panic!("{e}\n{}", d.logs()));
    assert_eq!(k.info.r#type, "DRAPlugin");
    assert_eq!(k.info.name, DRIVER);
    assert_eq!(k.info.supported_versions, ["v1.DRAPlugin"]);
    assert_eq!(Path::new(&k.info.endpoint), d.sb.join(format!("kubelet/plugins/{DRIVER}/dra.sock")));
    k
}

/// A result of ours on this node: `cpu` CPUs of `device`.
fn dp(device: &'static str, cpu: &'static str) -> Res<'static> {
    Res { driver: DRIVER, pool: NODE, device, cpu: Some(cpu) }
}

fn put(fake: &Fake, name: &str, results: &[Res<'_>]) -> pb::Claim {
    let uid = format!("uid-{name}");
    fake.put_claim(claim(NS, name, &uid, results, &[("pod-1", "pod-uid-1")]));
    peer::claim(NS, name, &uid)
}

async fn prepare_one(k: &DraKubelet, c: &pb::Claim) -> pb::NodePrepareResourceResponse {
    let mut r = k.prepare(vec![c.clone()]).await.unwrap();
    r.claims.remove(&c.uid).unwrap_or_else(|| panic!("no answer for {}", c.uid))
}

fn cdi(d: &Daemon, uid: &str) -> Option<Value> {
    let text = std::fs::read_to_string(d.sb.join(format!("run/cdi/cpupoold-{uid}.json"))).ok()?;
    Some(serde_json::from_str(&text).unwrap())
}

fn env_of(spec: &Value, key: &str) -> Option<String> {
    spec["devices"][0]["containerEdits"]["env"]
        .as_array()?
        .iter()
        .filter_map(Value::as_str)
        .find_map(|e| e.strip_prefix(&format!("{key}=")).map(str::to_owned))
}

fn cpus_of(d: &Daemon, uid: &str) -> CpuSet {
    let spec = cdi(d, uid).unwrap_or_else(|| panic!("no CDI spec for {uid}"));
    CpuSet::parse(&env_of(&spec, "CPUPOOL_CPUS").unwrap()).unwrap()
}

fn assignments(d: &Daemon) -> Vec<Value> {
    let mut v = Varlink::connect(&d.varlink);
    let r = v.call("ListAssignments", json!({})).unwrap();
    r["assignments"].as_array().cloned().unwrap_or_default()
}

fn dra_assignments(d: &Daemon) -> Vec<Value> {
    assignments(d).into_iter().filter(|a| a["id"].as_str().is_some_and(|i| i.starts_with("dra-"))).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_is_prepared_on_its_numa_node_survives_a_restart_and_is_unprepared() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::start();
    let d = start(dir.path(), &fake);
    let k = register(&d).await;

    // 4 CPUs of dp on NUMA node 1: one result, one transaction, the CDI spec lists them.
    let c = put(&fake, "four", &[dp("dp-numa1", "4")]);
    let r = prepare_one(&k, &c).await;
    assert_eq!(r.error, "", "{}", d.logs());
    let cdi_id = format!("{DRIVER}/cpu={}", c.uid);
    assert_eq!(
        r.devices,
        [pb::Device {
            request_names: vec!["cpus".into()],
            pool_name: NODE.into(),
            device_name: "dp-numa1".into(),
            cdi_device_ids: vec![cdi_id.clone()],
        }]
    );
    let cpus = cpus_of(&d, &c.uid);
    assert_eq!(cpus.len(), 4);
    assert!(cpus.is_subset(&CpuSet::parse("41-75").unwrap()), "{cpus}");
    let spec = cdi(&d, &c.uid).unwrap();
    assert_eq!(spec["kind"], format!("{DRIVER}/cpu"));
    assert_eq!(env_of(&spec, "CPUPOOL_POOL").as_deref(), Some("dp"));
    assert_eq!(env_of(&spec, "EXCLUSIVE_CPUS"), Some(cpus.to_string()));
    assert_eq!(env_of(&spec, "CPUPOOL_CLAIM").as_deref(), Some(c.uid.as_str()));
    assert_eq!(dra_assignments(&d).len(), 1);

    // Asked again: the same answer, nothing booked twice.
    assert_eq!(prepare_one(&k, &c).await, r);
    assert_eq!(dra_assignments(&d).len(), 1);

    // cpupoold restarts between prepare and unprepare: the claim is kept, and answered the same.
    d.stop();
    let d = start(dir.path(), &fake);
    let k = register(&d).await;
    assert_eq!(prepare_one(&k, &c).await, r);
    assert_eq!(cpus_of(&d, &c.uid), cpus);
    assert_eq!(dra_assignments(&d).len(), 1);

    // Unprepare releases and removes the spec; again, and an unknown claim, are success.
    let u = k.unprepare(vec![c.clone(), peer::claim(NS, "never", "uid-never")]).await.unwrap();
    assert_eq!(u.claims.len(), 2);
    assert!(u.claims.values().all(|c| c.error.is_empty()), "{u:?}");
    assert!(cdi(&d, &c.uid).is_none());
    assert!(dra_assignments(&d).is_empty());
    let u = k.unprepare(vec![c.clone()]).await.unwrap();
    assert_eq!(u.claims[&c.uid].error, "");
    d.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolated_held_and_foreign_claims() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::start();
    let d = start(dir.path(), &fake);
    let k = register(&d).await;

    // The isolated pool's claim gets its isolated CPUs.
    let iso = put(&fake, "iso", &[dp("iso-numa0", "2")]);
    assert_eq!(prepare_one(&k, &iso).await.error, "", "{}", d.logs());
    let cpus = cpus_of(&d, &iso.uid);
    assert_eq!(cpus.len(), 2);
    assert!(cpus.is_subset(&CpuSet::parse("36-39").unwrap()), "{cpus}");

    // A claim for more than is free: a clear error naming the claim, device and pool; nothing
    // changes.
    let before = assignments(&d);
    let more = put(&fake, "more", &[dp("iso-numa0", "3")]);
    let r = prepare_one(&k, &more).await;
    for word in ["team/more", "iso-numa0", NODE, "nothing was booked"] {
        assert!(r.error.contains(word), "{word} not in: {}", r.error);
    }
    assert!(r.devices.is_empty());
    assert_eq!(assignments(&d), before);
    assert!(cdi(&d, &more.uid).is_none());

    // Unknown device, wrong uid, another node's pool: refused naming the field.
    let unknown = put(&fake, "unknown", &[dp("gpu-numa0", "1")]);
    let e = prepare_one(&k, &unknown).await.error;
    assert!(e.contains("gpu-numa0") && e.contains("status.allocation.devices.results"), "{e}");
    put(&fake, "wronguid", &[dp("dp-numa0", "1")]);
    let e = prepare_one(&k, &peer::claim(NS, "wronguid", "uid-other")).await.error;
    assert!(e.contains("metadata.uid"), "{e}");
    let other =
        put(&fake, "other", &[Res { driver: DRIVER, pool: "node-b", device: "dp-numa0", cpu: Some("1") }]);
    let e = prepare_one(&k, &other).await.error;
    assert!(e.contains("status.allocation.devices.results[0].pool") && e.contains("node-b"), "{e}");
    let e = prepare_one(&k, &peer::claim(NS, "absent", "uid-absent")).await.error;
    assert!(e.contains("404"), "{e}");
    assert_eq!(assignments(&d), before);
    d.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_claims_at_once_never_share_a_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::start();
    let d = start(dir.path(), &fake);
    let k = std::sync::Arc::new(register(&d).await);
    let claims: Vec<pb::Claim> = (0..64)
        .map(|i| put(&fake, &format!("c{i}"), &[dp(if i % 2 == 0 { "dp-numa0" } else { "dp-numa1" }, "1")]))
        .collect();
    let tasks: Vec<_> = claims
        .iter()
        .map(|c| {
            let (k, c) = (k.clone(), c.clone());
            tokio::spawn(async move { prepare_one(&k, &c).await })
        })
        .collect();
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r.error, "", "{}", d.logs());
    }
    let mut seen = CpuSet::new();
    for c in &claims {
        let cpus = cpus_of(&d, &c.uid);
        assert_eq!(cpus.len(), 1);
        assert!(seen.is_disjoint(&cpus), "{cpus} given twice");
        seen = seen.union(&cpus);
    }
    assert_eq!(seen.len(), 64);
    assert_eq!(dra_assignments(&d).len(), 64);
    // A kubelet restart onto a wiped directory: the registration socket is made again.
    std::fs::remove_dir_all(d.sb.join("kubelet")).unwrap();
    let k = register(&d).await;
    let u = k.unprepare(claims.clone()).await.unwrap();
    assert!(u.claims.values().all(|c| c.error.is_empty()), "{u:?}");
    assert!(dra_assignments(&d).is_empty());
    d.stop();
}

/// The cpuset of a CreateContainer answer's adjustment.
fn adjusted(r: &cpupoold::nri::proto::CreateContainerResponse) -> CpuSet {
    let cpu = r
        .adjust
        .as_ref()
        .and_then(|a| a.linux.as_ref())
        .and_then(|l| l.resources.as_ref())
        .and_then(|r| r.cpu.as_ref());
    CpuSet::parse(&cpu.expect("an adjustment with CPUs").cpus).unwrap()
}

fn assignment(d: &Daemon, id: &str) -> Value {
    assignments(d).into_iter().find(|a| a["id"] == id).unwrap_or_else(|| panic!("no {id}\n{}", d.logs()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_of_a_claims_pod_share_its_cpus_and_other_pods_get_none() {
    use cpupoold::nri::proto as api;
    use test_support::nri as fake;
    let dir = tempfile::tempdir().unwrap();
    let fake_api = Fake::start();
    let node = fake::Node::serve(&dir.path().join("sb"));
    // The kubelet's pod cgroup is there before cpupoold starts, as on a node.
    std::fs::create_dir_all(dir.path().join("sb/cgroup/kubepods.slice")).unwrap();
    let d = start(dir.path(), &fake_api);
    let k = register(&d).await;
    let uid = "uid-shared";
    let pods = [("pod-1", "pod-uid-1"), ("pod-3", "pod-uid-3")];
    fake_api.put_claim(claim(NS, "shared", uid, &[dp("dp-numa0", "2")], &pods));
    let c = peer::claim(NS, "shared", uid);
    assert_eq!(prepare_one(&k, &c).await.error, "", "{}", d.logs());
    let cpus = cpus_of(&d, &c.uid);
    let id = format!("dra-{uid}-0");
    // The environment the runtime gives the container from the claim's CDI spec.
    let spec = cdi(&d, &c.uid).unwrap();
    let env: Vec<(String, String)> = spec["devices"][0]["containerEdits"]["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e.as_str()?.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
        .collect();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let pod = fake::pod("s1", "pod-uid-1", "pod-1");
    let mut rt = tokio::task::block_in_place(|| {
        let mut rt = node.runtime.accept(std::time::Duration::from_secs(30)).unwrap();
        rt.configure().unwrap();
        rt.synchronize(Vec::new(), Vec::new()).unwrap();
        // Two containers of the pod the claim is reserved for: both on its CPUs.
        let (a, b) = (fake::container(&pod, "a", "app", &env), fake::container(&pod, "b", "side", &env));
        for ctr in [&a, &b] {
            let r = rt.create(&pod, ctr).unwrap().unwrap_or_else(|e| panic!("{e:?}\n{}", d.logs()));
            assert_eq!(adjusted(&r), cpus);
        }
        let held = assignment(&d, &id);
        assert_eq!(held["target"], format!("kubelet:{id}"), "held, bound to none");
        assert_eq!(held["state"], "allocated", "no container runs on it yet: {held}");
        // The first to start: the claim's assignment is bound to its cgroup, applied and read
        // back, as a device-plugin container's.
        let start = |rt: &mut test_support::nri::Plugin, ctr: &api::Container| {
            node.runc_creates(&fake::cgroup(&pod, &ctr.id), &cpus.to_string());
            rt.event(api::Event::StartContainer, &pod, Some(ctr)).unwrap()
        };
        start(&mut rt, &a).unwrap_or_else(|e| panic!("{e:?}\n{}", d.logs()));
        let bound = assignment(&d, &id);
        assert_eq!(bound["target"], format!("cgroup:{}", fake::cgroup(&pod, "a")), "{bound}");
        assert_eq!(bound["container"], "default/pod-1/app", "{bound}");
        assert_eq!(bound["state"], "applied", "{bound}");
        // The second shares them (not isolated): its own cgroup is read back, the claim stays
        // bound to the first.
        start(&mut rt, &b).unwrap_or_else(|e| panic!("{e:?}\n{}", d.logs()));
        assert_eq!(assignment(&d, &id)["target"], format!("cgroup:{}", fake::cgroup(&pod, "a")));
        // A container of another pod the claim is reserved for, whose pod cgroup has other
        // CPUs: its start fails, naming the claim.
        let pod3 = fake::pod("s3", "pod-uid-3", "pod-3");
        let y = fake::container(&pod3, "y", "app", &env);
        rt.create(&pod3, &y).unwrap().unwrap_or_else(|e| panic!("{e:?}\n{}", d.logs()));
        node.runc_creates(fake::cgroup(&pod3, "y").rsplit_once('/').unwrap().0, "60-79");
        node.runc_creates(&fake::cgroup(&pod3, "y"), &cpus.to_string());
        let e = rt.event(api::Event::StartContainer, &pod3, Some(&y)).unwrap().expect_err("must not start");
        assert!(
            e.message.starts_with(
                "cpupoold: container default/pod-3/app would not run on the CPUs of claim team/shared"
            ),
            "{}",
            e.message
        );
        // A container of another pod naming the claim: none of its CPUs.
        let other = fake::pod("s2", "pod-uid-2", "pod-2");
        let x = fake::container(&other, "x", "app", &env);
        let r = rt.create(&other, &x).unwrap().unwrap_or_else(|e| panic!("{e:?}\n{}", d.logs()));
        assert!(adjusted(&r).is_disjoint(&cpus), "{} shares {cpus}", adjusted(&r));
        // The bound container stops while the second runs on the claim: bound to the survivor,
        // read back, applied.
        rt.stop(&pod, &a).unwrap().unwrap();
        let survivor = assignment(&d, &id);
        assert_eq!(survivor["target"], format!("cgroup:{}", fake::cgroup(&pod, "b")), "{}", d.logs());
        assert_eq!(
            (&survivor["container"], &survivor["state"]),
            (&json!("default/pod-1/side"), &json!("applied"))
        );
        // It stops too: the claim keeps its CPUs (until it is unprepared), held for no
        // container again: allocated.
        rt.stop(&pod, &b).unwrap().unwrap();
        let held = assignment(&d, &id);
        assert_eq!(held["target"], format!("kubelet:{id}"), "{}", d.logs());
        assert_eq!((&held["container"], &held["state"]), (&json!(""), &json!("allocated")), "{held}");
        // A later container of the claim binds them again.
        let later = fake::container(&pod, "c", "app", &env);
        rt.create(&pod, &later).unwrap().unwrap_or_else(|e| panic!("{e:?}\n{}", d.logs()));
        start(&mut rt, &later).unwrap_or_else(|e| panic!("{e:?}\n{}", d.logs()));
        assert_eq!(assignment(&d, &id)["target"], format!("cgroup:{}", fake::cgroup(&pod, "c")));
        rt
    });
    assert!(d.logs().contains("is not reserved for its pod pod-uid-2"), "{}", d.logs());
    // Unprepared while bound: released, whatever its target.
    let u = k.unprepare(vec![c.clone()]).await.unwrap();
    assert!(u.claims.values().all(|c| c.error.is_empty()), "{u:?}");
    assert!(dra_assignments(&d).is_empty(), "{}", d.logs());
    tokio::task::block_in_place(|| rt.stop(&pod, &fake::container(&pod, "c", "app", &env)).unwrap().unwrap());
    d.stop();
}

/// A claim of several devices (two results, one per NUMA node: two assignments) and its one
/// container: one cgroup, the target of neither, so the container is read back on all of the
/// claim's CPUs and recorded running on both; they read `allocated` until it starts, `applied`
/// while it runs (again after cpupoold restarts, once the runtime's Synchronize has read it
/// back: not before), `allocated` once it stops. The claim's UID begins with a digit, as most
/// an API server makes do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_of_several_devices_runs_its_container_on_all_of_them() {
    use cpupoold::nri::proto as api;
    use test_support::nri as fake;
    let dir = tempfile::tempdir().unwrap();
    let fake_api = Fake::start();
    let node = fake::Node::serve(&dir.path().join("sb"));
    std::fs::create_dir_all(dir.path().join("sb/cgroup/kubepods.slice")).unwrap();
    let d = start(dir.path(), &fake_api);
    let k = register(&d).await;
    let uid = test_support::uid::v4_digit_first();
    let pod_uid = test_support::uid::v4();
    let results = [dp("dp-numa0", "2"), dp("dp-numa1", "1")];
    fake_api.put_claim(claim(NS, "two", &uid, &results, &[("pod-1", &pod_uid)]));
    let c = peer::claim(NS, "two", &uid);
    assert_eq!(prepare_one(&k, &c).await.error, "", "{}", d.logs());
    let ids = [format!("dra-{uid}-0"), format!("dra-{uid}-1")];
    let states = |d: &Daemon| ids.iter().map(|id| assignment(d, id)["state"].clone()).collect::<Vec<_>>();
    let cpus = ids.iter().fold(CpuSet::new(), |acc, id| {
        acc.union(&CpuSet::parse(assignment(&d, id)["cpus"].as_str().unwrap()).unwrap())
    });
    assert_eq!(cpus.len(), 3);
    assert_eq!(states(&d), [json!("allocated"), json!("allocated")]);
    let spec = cdi(&d, &c.uid).unwrap();
    let env: Vec<(String, String)> = spec["devices"][0]["containerEdits"]["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e.as_str()?.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
        .collect();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let pod = fake::pod(&test_support::uid::container_id(), &pod_uid, "pod-1");
    let ctr = fake::container(&pod, &test_support::uid::container_id(), "app", &env);
    let cg = fake::cgroup(&pod, &ctr.id);
    let rt = tokio::task::block_in_place(|| {
        let mut rt = node.runtime.accept(std::time::Duration::from_secs(30)).unwrap();
        rt.configure().unwrap();
        rt.synchronize(Vec::new(), Vec::new()).unwrap();
        let r = rt.create(&pod, &ctr).unwrap().unwrap_or_else(|e| panic!("{e:?}\n{}", d.logs()));
        assert_eq!(adjusted(&r), cpus);
        assert_eq!(states(&d), [json!("allocated"), json!("allocated")], "created, not started");
        node.runc_creates(&cg, &cpus.to_string());
        rt.event(api::Event::StartContainer, &pod, Some(&ctr))
            .unwrap()
            .unwrap_or_else(|e| panic!("{e:?}\n{}", d.logs()));
        for id in &ids {
            let a = assignment(&d, id);
            assert_eq!(
                (&a["state"], &a["container"]),
                (&json!("applied"), &json!("default/pod-1/app")),
                "{a}\n{}",
                d.logs()
            );
        }
        rt
    });
    // cpupoold restarts while the container runs: allocated until the runtime synchronizes
    // and the container is read back again, applied after.
    drop(rt);
    d.stop();
    let d = start(dir.path(), &fake_api);
    let k = register(&d).await;
    assert_eq!(states(&d), [json!("allocated"), json!("allocated")], "nothing taken on trust");
    tokio::task::block_in_place(|| {
        let mut rt = node.runtime.accept(std::time::Duration::from_secs(30)).unwrap();
        rt.configure().unwrap();
        let mut running = ctr.clone();
        running.set_state(api::ContainerState::ContainerRunning);
        rt.synchronize(vec![pod.clone()], vec![running]).unwrap();
        assert_eq!(states(&d), [json!("applied"), json!("applied")], "{}", d.logs());
        // The runtime connects again, and the container went meanwhile: allocated.
        drop(rt);
        let mut rt = node.runtime.accept(std::time::Duration::from_secs(30)).unwrap();
        rt.configure().unwrap();
        rt.synchronize(vec![pod.clone()], Vec::new()).unwrap();
        assert_eq!(states(&d), [json!("allocated"), json!("allocated")], "gone while away: {}", d.logs());
        // A new container runs on it, and stops.
        let again = fake::container(&pod, &test_support::uid::container_id(), "app", &env);
        rt.create(&pod, &again).unwrap().unwrap_or_else(|e| panic!("{e:?}\n{}", d.logs()));
        node.runc_creates(&fake::cgroup(&pod, &again.id), &cpus.to_string());
        rt.event(api::Event::StartContainer, &pod, Some(&again))
            .unwrap()
            .unwrap_or_else(|e| panic!("{e:?}\n{}", d.logs()));
        assert_eq!(states(&d), [json!("applied"), json!("applied")]);
        rt.stop(&pod, &again).unwrap().unwrap();
        assert_eq!(states(&d), [json!("allocated"), json!("allocated")], "{}", d.logs());
    });
    let u = k.unprepare(vec![c.clone()]).await.unwrap();
    assert!(u.claims.values().all(|c| c.error.is_empty()), "{u:?}");
    assert!(dra_assignments(&d).is_empty(), "{}", d.logs());
    d.stop();
}
