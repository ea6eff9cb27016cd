//! The DRA driver's kubelet plugin against the kubelet's protocols: the real `cpupoold
//! --sandbox` binary (k8s feature) registers through `plugins_registry/` with the
//! kubelet-shaped peer (test-support's plugin watcher and DRA client, the real protobuf), and
//! reads the claims from the fake API server (`fake_apiserver/claims.rs`): there is no API
//! server or kubelet on these machines, so the cluster side here is a fake.
#![cfg(feature = "k8s")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod dra_common;
mod fake_apiserver;

use std::path::Path;

use cpupoold::core::cpuset::CpuSet;
use cpupoold::kubernetes::dra::proto::dra as pb;
use serde_json::{json, Value};

use common::Daemon;
use dra_common::{assignments, cdi_path, dp, prepare_one, register, DRIVER, NODE, NS};
use fake_apiserver::claims::{claim, Result as Res};
use fake_apiserver::Fake;
use test_support::apiserver;
use test_support::dra as peer;

/// Two NUMA nodes of 40 CPUs: 0-39 and 40-79.
const SHAPE: &str = "2x40x1:2";
const POOLS: &str = "[pools.sys]\nkind = \"reserved\"\ncpus = \"0,40\"\n\n\
    [pools.dp]\nkind = \"exclusive\"\ncpus = \"1-35,41-75\"\ndra = true\n\n\
    [pools.iso]\nkind = \"exclusive\"\ncpus = \"36-39,76-79\"\nisolate = true\ndra = true\n";

fn start(dir: &Path, fake: &Fake) -> Daemon {
    start_with(dir, fake, POOLS)
}

fn start_with(dir: &Path, fake: &Fake, pools: &str) -> Daemon {
    dra_common::start_with(dir, fake, SHAPE, pools)
}

/// A claim `name` with a random uid as the API server gives (either kind of first character).
fn put(fake: &Fake, name: &str, results: &[Res<'_>]) -> pb::Claim {
    put_uid(fake, name, &apiserver::uid(), results)
}

fn put_uid(fake: &Fake, name: &str, uid: &str, results: &[Res<'_>]) -> pb::Claim {
    fake.put_claim(claim(NS, name, uid, results, &[("pod-1", &apiserver::uid())]));
    peer::claim(NS, name, uid)
}

fn cdi(d: &Daemon, uid: &str) -> Option<Value> {
    let text = std::fs::read_to_string(cdi_path(d, uid)).ok()?;
    Some(serde_json::from_str(&text).unwrap())
}

/// The claim's CDI spec by the CDI project's rules (SPEC.md's table of versions, its
/// `specs-go/version.go`): a device named by the uid, and `cdiVersion` the lowest a runtime's
/// CDI library takes for it: 0.5.0 for a name beginning with a digit (containerd refused the
/// 0.3.0 spec of such a claim: issue 33), the earliest it takes, 0.3.0, otherwise.
fn assert_cdi_rules(spec: &Value, uid: &str) {
    assert!(apiserver::is_v4(uid), "{uid}");
    let lowest = if uid.starts_with(|c: char| c.is_ascii_digit()) { "0.5.0" } else { "0.3.0" };
    assert_eq!(spec["cdiVersion"], lowest, "{spec}");
    assert_eq!(spec["devices"][0]["name"], uid, "{spec}");
    assert_eq!(cpupoold::kubernetes::cdi::validate(spec), Ok(()), "{spec}");
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

fn dra_assignments(d: &Daemon) -> Vec<Value> {
    assignments(d).into_iter().filter(|a| a["id"].as_str().is_some_and(|i| i.starts_with("dra-"))).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_is_prepared_on_its_numa_node_survives_a_restart_and_is_unprepared() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::start();
    let d = start(dir.path(), &fake);
    let k = register(&d).await;

    // 4 CPUs of dp on NUMA node 1: one result, one transaction, the CDI spec lists them. The
    // uid begins with a digit, as 10 in 16 an API server makes do.
    let c = put_uid(&fake, "four", &apiserver::uid_digit_first(), &[dp("dp-numa1", "4")]);
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
    assert_cdi_rules(&spec, &c.uid);
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
    let u = k.unprepare(vec![c.clone(), peer::claim(NS, "never", &apiserver::uid())]).await.unwrap();
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
    let e = prepare_one(&k, &peer::claim(NS, "wronguid", &apiserver::uid())).await.error;
    assert!(e.contains("metadata.uid"), "{e}");
    let other = put(&fake, "other", &[Res { pool: "node-b", ..dp("dp-numa0", "1") }]);
    let e = prepare_one(&k, &other).await.error;
    assert!(e.contains("status.allocation.devices.results[0].pool") && e.contains("node-b"), "{e}");
    let e = prepare_one(&k, &peer::claim(NS, "absent", &apiserver::uid())).await.error;
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

/// Claims as a cluster makes them, several in one NodePrepareResources call: random uids of
/// both kinds, a namespace, claim names and request names at the API's maxima, whole and
/// fractional quantities (`2`, `1500m`, `100m`) on an exclusive and a shared pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_as_a_cluster_makes_them_several_in_one_call() {
    const SHARED: &str = "[pools.sys]\nkind = \"reserved\"\ncpus = \"0,40\"\n\n\
        [pools.dp]\nkind = \"exclusive\"\ncpus = \"1-35,41-75\"\ndra = true\n\n\
        [pools.web]\nkind = \"shared\"\ncpus = \"36-39,76-79\"\ndra = true\n";
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::start();
    let d = start_with(dir.path(), &fake, SHARED);
    let k = register(&d).await;
    let ns = apiserver::label("team");
    let request = apiserver::label("cpus");
    let res = |device, cpu| Res { request: &request, ..dp(device, cpu) };
    let wanted = [
        (apiserver::uid_digit_first(), res("dp-numa0", "2"), "EXCLUSIVE_CPUS"),
        (apiserver::uid_letter_first(), res("dp-numa1", "2"), "EXCLUSIVE_CPUS"),
        (apiserver::uid_digit_first(), res("web", "1500m"), "SHARED_CPUS"),
        (apiserver::uid(), res("web", "100m"), "SHARED_CPUS"),
    ];
    let mut claims = Vec::new();
    for (i, (uid, r, _)) in wanted.iter().enumerate() {
        let name = apiserver::subdomain(&format!("claim{i}"));
        fake.put_claim(claim(
            &ns,
            &name,
            uid,
            std::slice::from_ref(r),
            &[(&apiserver::subdomain("pod"), &apiserver::uid())],
        ));
        claims.push(peer::claim(&ns, &name, uid));
    }
    let answers = k.prepare(claims.clone()).await.unwrap();
    assert_eq!(answers.claims.len(), wanted.len());
    for (uid, r, var) in &wanted {
        let a = &answers.claims[uid];
        assert_eq!(a.error, "", "{uid}: {}", d.logs());
        assert_eq!(a.devices.len(), 1);
        assert_eq!(a.devices[0].request_names, std::slice::from_ref(&request));
        assert_eq!(a.devices[0].device_name, r.device);
        assert_eq!(a.devices[0].cdi_device_ids, [format!("{DRIVER}/cpu={uid}")]);
        let spec = cdi(&d, uid).unwrap_or_else(|| panic!("no CDI spec for {uid}"));
        assert_cdi_rules(&spec, uid);
        assert_eq!(env_of(&spec, "CPUPOOL_CLAIM").as_deref(), Some(uid.as_str()));
        let cpus = cpus_of(&d, uid);
        assert_eq!(env_of(&spec, var), Some(cpus.to_string()), "{spec}");
        // What the allocation says was consumed is what is booked.
        let held = assignment(&d, &format!("dra-{uid}-0"));
        let millis = match r.cpu {
            Some("2") => 2000,
            Some("1500m") => 1500,
            _ => 100,
        };
        assert_eq!(held["millicpus"], millis, "{held}");
        if millis == 2000 {
            assert_eq!(cpus.len(), 2, "{held}");
        } else {
            assert_eq!(cpus, CpuSet::parse("36-39,76-79").unwrap(), "{held}");
        }
    }
    // Asked again in one call (the kubelet after its restart): the same answers.
    assert_eq!(k.prepare(claims.clone()).await.unwrap(), answers);
    let u = k.unprepare(claims).await.unwrap();
    assert!(u.claims.values().all(|c| c.error.is_empty()), "{u:?}");
    assert!(dra_assignments(&d).is_empty(), "{}", d.logs());
    assert!(wanted.iter().all(|(uid, _, _)| cdi(&d, uid).is_none()));
    d.stop();
}

/// The cpuset of a CreateContainer answer's adjustment.
fn adjusted(r: &cpupoold::kubernetes::nri::proto::CreateContainerResponse) -> CpuSet {
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
    use cpupoold::kubernetes::nri::proto as api;
    use test_support::nri as fake;
    let dir = tempfile::tempdir().unwrap();
    let fake_api = Fake::start();
    let node = fake::Node::serve(&dir.path().join("sb"));
    // The kubelet's pod cgroup is there before cpupoold starts, as on a node.
    std::fs::create_dir_all(dir.path().join("sb/cgroup/kubepods.slice")).unwrap();
    let d = start(dir.path(), &fake_api);
    let k = register(&d).await;
    let uid = &apiserver::uid_digit_first();
    // Pods as a cluster makes them: random uids, names at the API's maximum (253).
    let (pod1, pod2, pod3) = (apiserver::uid(), apiserver::uid(), apiserver::uid());
    let (name1, name2, name3) =
        (apiserver::subdomain("pod-1"), apiserver::subdomain("pod-2"), apiserver::subdomain("pod-3"));
    let pods = [(name1.as_str(), pod1.as_str()), (name3.as_str(), pod3.as_str())];
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
    let pod = fake::pod("s1", &pod1, &name1);
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
        assert_eq!(bound["container"], format!("default/{name1}/app"), "{bound}");
        assert_eq!(bound["state"], "applied", "{bound}");
        // The second shares them (not isolated): its own cgroup is read back, the claim stays
        // bound to the first.
        start(&mut rt, &b).unwrap_or_else(|e| panic!("{e:?}\n{}", d.logs()));
        assert_eq!(assignment(&d, &id)["target"], format!("cgroup:{}", fake::cgroup(&pod, "a")));
        // A container of another pod the claim is reserved for, whose pod cgroup has other
        // CPUs: its start fails, naming the claim.
        let pod3 = fake::pod("s3", &pod3, &name3);
        let y = fake::container(&pod3, "y", "app", &env);
        rt.create(&pod3, &y).unwrap().unwrap_or_else(|e| panic!("{e:?}\n{}", d.logs()));
        node.runc_creates(fake::cgroup(&pod3, "y").rsplit_once('/').unwrap().0, "60-79");
        node.runc_creates(&fake::cgroup(&pod3, "y"), &cpus.to_string());
        let e = rt.event(api::Event::StartContainer, &pod3, Some(&y)).unwrap().expect_err("must not start");
        assert!(
            e.message.starts_with(&format!(
                "cpupoold: container default/{name3}/app would not run on the CPUs of claim team/shared"
            )),
            "{}",
            e.message
        );
        // A container of another pod naming the claim: none of its CPUs.
        let other = fake::pod("s2", &pod2, &name2);
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
            (&json!(format!("default/{name1}/side")), &json!("applied"))
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
    assert!(d.logs().contains(&format!("is not reserved for its pod {pod2}")), "{}", d.logs());
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
    use cpupoold::kubernetes::nri::proto as api;
    use test_support::nri as fake;
    let dir = tempfile::tempdir().unwrap();
    let fake_api = Fake::start();
    let node = fake::Node::serve(&dir.path().join("sb"));
    std::fs::create_dir_all(dir.path().join("sb/cgroup/kubepods.slice")).unwrap();
    let d = start(dir.path(), &fake_api);
    let k = register(&d).await;
    let uid = test_support::apiserver::uid_digit_first();
    let pod_uid = test_support::apiserver::uid();
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
