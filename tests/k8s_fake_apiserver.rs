//! The cluster integration (`k8s` feature) against a fake API server (`fake_apiserver/`): the
//! real `cpupoold --sandbox` binary, with a kubeconfig pointing at the fake, follows its
//! ConfigMaps and node, and writes its CpuPoolNode report; the pod watch runs in-process.
//! There is no API server on these machines, so every test here is a fake.
#![cfg(feature = "k8s")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod fake_apiserver;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use common::{Daemon, Varlink};
use fake_apiserver::{condition, wait_for, Fake};

const NODE: &str = "node-a";
const NS: &str = "cpupool-system";
/// Long enough for a debug build on a loaded 2-core machine.
const WAIT: u64 = 60;

/// Starts the daemon on the shared 1x4x2 sandbox config with `[k8s]` pointing at `fake`.
fn start(dir: &Path, fake: &Fake, report_interval_ms: u64) -> Daemon {
    start_with(dir, fake, report_interval_ms, "")
}

/// Like [`start`], with `extra` configuration.
fn start_with(dir: &Path, fake: &Fake, report_interval_ms: u64, extra: &str) -> Daemon {
    fake.write_kubeconfig(&dir.join("kubeconfig"));
    start_before_kubeconfig(dir, report_interval_ms, extra)
}

/// Starts the daemon with `[k8s]` reading `dir/kubeconfig`, whether or not it exists yet.
fn start_before_kubeconfig(dir: &Path, report_interval_ms: u64, extra: &str) -> Daemon {
    let kubeconfig = dir.join("kubeconfig");
    let config = format!(
        "{}\n{extra}\n[k8s]\nenabled = true\nkubeconfig = \"{}\"\nnode_name = \"{NODE}\"\nnamespace = \"{NS}\"\n\
         report_interval_ms = {report_interval_ms}\n",
        common::CONFIG,
        kubeconfig.display()
    );
    Daemon::start_shaped(dir, "1x4x2:1", Some(&config), &["--bus", "none", "--log-level", "debug"])
}

fn node(group: Option<&str>) -> Value {
    let labels = match group {
        Some(g) => json!({"kubernetes.io/hostname": NODE, "cpupool.io/group": g}),
        None => json!({"kubernetes.io/hostname": NODE}),
    };
    json!({"metadata": {"name": NODE, "labels": labels}, "spec": {}})
}

fn configmap(name: &str, toml: &str) -> Value {
    json!({"metadata": {"name": name, "namespace": NS}, "data": {"config.toml": toml}})
}

/// Waits until the report's configGeneration is `name@<its current resourceVersion>`.
fn wait_generation(fake: &Fake, name: Option<&str>) -> Value {
    let want = name.map(|n| {
        let cm = fake.object("configmaps", n).unwrap_or_else(|| panic!("{n} exists"));
        format!("{n}@{}", cm["metadata"]["resourceVersion"].as_str().unwrap_or(""))
    });
    wait_for(WAIT, &format!("configGeneration {want:?}"), || {
        let status = fake.status(NODE).ok_or("no status yet")?;
        let got = status["configGeneration"].as_str().map(str::to_owned);
        if got == want {
            Ok(status)
        } else {
            Err(format!("{got:?}"))
        }
    })
}

/// Waits until the node report has a status; the status.
fn wait_report(fake: &Fake, what: &str) -> Value {
    wait_for(WAIT, what, || fake.status(NODE).ok_or_else(|| "none".to_owned()))
}

fn pool_names(status: &Value) -> Vec<String> {
    status["pools"]
        .as_array()
        .map(|p| p.iter().map(|p| p["name"].as_str().unwrap_or("").to_owned()).collect())
        .unwrap_or_default()
}

fn watches(fake: &Fake, path_end: &str) -> usize {
    fake.count(|r| r.method == "GET" && r.path.ends_with(path_end) && r.is_watch())
}

fn lists(fake: &Fake, path_end: &str) -> usize {
    fake.count(|r| r.method == "GET" && r.path.ends_with(path_end) && !r.is_watch())
}

#[test]
fn fake_apiserver_configmap_precedence_reconnect_and_410() {
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::start();
    fake.put("nodes", node(Some("g1")));
    let d = start(dir.path(), &fake, 50);
    let cluster_file = d.sb.join("run/cluster.toml");

    // No ConfigMap: the local files alone, reported without a generation.
    let status = wait_report(&fake, "a first report");
    assert_eq!(pool_names(&status), ["dp", "sys", "web"]);
    assert_eq!(condition(&status, "ConfigInvalid").map(|c| c.0).as_deref(), Some("False"));
    assert!(!cluster_file.exists());

    // default < group < node.
    let default = "[daemon]\nlog_level = \"debug\"\n";
    fake.put("configmaps", configmap("cpupoold-config.default", default));
    wait_generation(&fake, Some("cpupoold-config.default"));
    assert_eq!(std::fs::read_to_string(&cluster_file).unwrap(), default);
    let group = "[pools.web]\nenforce_quota = true\n";
    fake.put("configmaps", configmap("cpupoold-config.group.g1", group));
    fake.put("configmaps", configmap("cpupoold-config.group.other", "[pools.web]\nremoved = true\n"));
    wait_generation(&fake, Some("cpupoold-config.group.g1"));
    assert_eq!(std::fs::read_to_string(&cluster_file).unwrap(), group);
    let node_cm = "[pools.dp]\nremoved = true\n";
    fake.put("configmaps", configmap(&format!("cpupoold-config.node.{NODE}"), node_cm));
    let status = wait_generation(&fake, Some(&format!("cpupoold-config.node.{NODE}")));
    // Applied like SIGHUP: the node's ConfigMap removed the pool dp.
    assert_eq!(pool_names(&status), ["sys", "web"]);
    let mut v = Varlink::connect(&d.varlink);
    let pools = v.call("ListPools", json!({})).unwrap();
    assert_eq!(pools["pools"].as_array().map(Vec::len), Some(2), "{pools}");

    // The watch connection drops; the deletion made meanwhile arrives over the new watch.
    let before = watches(&fake, "/configmaps");
    fake.drop_watches();
    fake.delete("configmaps", &format!("cpupoold-config.node.{NODE}"));
    let status = wait_generation(&fake, Some("cpupoold-config.group.g1"));
    assert_eq!(pool_names(&status), ["dp", "sys", "web"]);
    assert!(watches(&fake, "/configmaps") > before, "the ConfigMap watch was not started again");

    // The history is compacted: the watch from the old version gets 410 Gone, the daemon lists
    // again and finds what changed.
    let lists_before = lists(&fake, "/configmaps");
    fake.expire("configmaps");
    fake.put("configmaps", configmap("cpupoold-config.group.g1", "[pools.web]\nenforce_quota = false\n"));
    wait_generation(&fake, Some("cpupoold-config.group.g1"));
    assert!(lists(&fake, "/configmaps") > lists_before, "no relist after 410 Gone");

    // The node moves to no group: the default applies again; then nothing at all.
    fake.put("nodes", node(None));
    wait_generation(&fake, Some("cpupoold-config.default"));
    fake.delete("configmaps", "cpupoold-config.default");
    wait_generation(&fake, None);
    wait_for(WAIT, "the cluster file removed", || {
        if cluster_file.exists() {
            Err("exists".into())
        } else {
            Ok(())
        }
    });
    let logs = d.logs();
    d.stop();
    eprintln!("precedence/reconnect/410 test: {:.1} s", started.elapsed().as_secs_f64());
    assert!(logs.contains("watching ConfigMaps"), "the 410 was logged:\n{logs}");
}

/// The host-package route: the kubeconfig is written when the node joins, after cpupoold
/// started. Until then the local files apply; then the daemon connects without a restart.
#[test]
fn fake_apiserver_kubeconfig_written_after_the_start_is_picked_up() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::start();
    fake.put("nodes", node(None));
    let d = start_before_kubeconfig(dir.path(), 50, "");
    let mut v = Varlink::connect(&d.varlink);
    let pools = v.call("ListPools", json!({})).unwrap();
    assert_eq!(pools["pools"].as_array().map(Vec::len), Some(3), "{pools}");
    wait_for(WAIT, "the missing kubeconfig logged", || {
        if d.logs().contains("the local configuration files alone apply until it can be made") {
            Ok(())
        } else {
            Err(d.logs())
        }
    });
    assert_eq!(fake.count(|_| true), 0, "no request without a kubeconfig");
    fake.write_kubeconfig(&dir.path().join("kubeconfig"));
    let status = wait_report(&fake, "a report once the kubeconfig is there");
    assert_eq!(pool_names(&status), ["dp", "sys", "web"]);
    d.stop();
}

/// A CpuPoolNode deleted by hand comes back with the periodic resync (every 150 report
/// intervals, 7.5 s here), though nothing on the node changed.
#[test]
fn fake_apiserver_deleted_report_is_written_again() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::start();
    fake.put("nodes", node(None));
    let d = start(dir.path(), &fake, 50);
    wait_report(&fake, "a first report");
    fake.delete("cpupoolnodes", NODE);
    assert!(fake.object("cpupoolnodes", NODE).is_none());
    let status = wait_report(&fake, "the report written again");
    assert_eq!(pool_names(&status), ["dp", "sys", "web"]);
    d.stop();
}

/// The watch request itself answered with HTTP 410 (not an `ERROR` event in the stream): the
/// daemon lists again, pausing longer while the server keeps answering so, and a ConfigMap made
/// meanwhile is applied once the watch works again.
#[test]
fn fake_apiserver_410_on_the_watch_request_lists_again_with_pauses() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::start();
    fake.put("nodes", node(None));
    let d = start(dir.path(), &fake, 50);
    wait_report(&fake, "a first report");
    wait_for(WAIT, "the ConfigMap watch", || {
        if watches(&fake, "/configmaps") > 0 {
            Ok(())
        } else {
            Err("no watch yet".to_owned())
        }
    });

    // Every watch request on ConfigMaps gets 410 for a while: the server compacted its history
    // and the watch goes on failing. Cut the open watch so the daemon comes back with one.
    let lists_before = lists(&fake, "/configmaps");
    fake.fail_next_watches("/configmaps", 410, 1_000);
    fake.drop_watches();
    let watched = Instant::now();
    wait_for(WAIT, "three lists after 410s", || {
        let n = lists(&fake, "/configmaps") - lists_before;
        if n >= 3 {
            Ok(())
        } else {
            Err(format!("{n} lists\n{}", d.logs()))
        }
    });
    // In 2 s the pauses (none, then 0.1, 0.2, 0.4, 0.8 s) leave room for about 5 lists; without
    // them a debug build here lists 16 times. The bound only fails when lists come too fast.
    std::thread::sleep(Duration::from_secs(2).saturating_sub(watched.elapsed()));
    let relists = lists(&fake, "/configmaps") - lists_before;
    assert!(relists <= 10, "{relists} lists in 2 s of 410s: the daemon does not pause");

    // The server recovers: the ConfigMap made meanwhile is applied.
    fake.clear_faults();
    fake.put("configmaps", configmap("cpupoold-config.default", "[daemon]\nlog_level = \"debug\"\n"));
    wait_generation(&fake, Some("cpupoold-config.default"));
    let logs = d.logs();
    d.stop();
    assert!(logs.contains("watching ConfigMaps"), "the 410 was logged:\n{logs}");
}

#[test]
fn fake_apiserver_rejected_configmap_keeps_running_config() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::start();
    fake.put("nodes", node(None));
    let good = "[pools.dp]\nremoved = true\n";
    fake.put("configmaps", configmap("cpupoold-config.default", good));
    let d = start(dir.path(), &fake, 50);
    let cluster_file = d.sb.join("run/cluster.toml");
    let status = wait_generation(&fake, Some("cpupoold-config.default"));
    assert_eq!(pool_names(&status), ["sys", "web"]);

    // A node ConfigMap with a bad key: rejected whole, the running configuration stays.
    let name = format!("cpupoold-config.node.{NODE}");
    fake.put(
        "configmaps",
        configmap(&name, "[pools.web]\nenforce_quota = true\n[pools.dp2]\nkind = \"shared\"\ncount = 0\n"),
    );
    let status = wait_for(WAIT, "ConfigInvalid=True", || {
        let s = fake.status(NODE).ok_or("no status")?;
        match condition(&s, "ConfigInvalid") {
            Some((st, msg)) if st == "True" => Ok((s, msg)),
            other => Err(format!("{other:?}")),
        }
    });
    let (status, message) = status;
    assert!(message.contains(&name) && message.contains("pools.dp2.count"), "{message}");
    assert_eq!(
        status["configGeneration"].as_str().map(|g| g.starts_with("cpupoold-config.default@")),
        Some(true)
    );
    assert_eq!(pool_names(&status), ["sys", "web"]);
    assert_eq!(
        std::fs::read_to_string(&cluster_file).unwrap(),
        good,
        "the cluster file is the last good one"
    );
    let mut v = Varlink::connect(&d.varlink);
    let pools = v.call("ListPools", json!({})).unwrap();
    let names: Vec<&str> =
        pools["pools"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["sys", "web"]);

    // One without the key is rejected too; a fixed one applies and clears the condition.
    fake.put("configmaps", json!({"metadata": {"name": name, "namespace": NS}, "data": {"other": "x"}}));
    wait_for(WAIT, "the missing key reported", || {
        let s = fake.status(NODE).ok_or("no status")?;
        let c = condition(&s, "ConfigInvalid").ok_or("no condition")?;
        if c.1.contains("no `config.toml` key") {
            Ok(())
        } else {
            Err(c.1)
        }
    });
    fake.put("configmaps", configmap(&name, "[pools.web]\nenforce_quota = true\n"));
    let status = wait_generation(&fake, Some(&name));
    assert_eq!(condition(&status, "ConfigInvalid").map(|c| c.0).as_deref(), Some("False"));
    assert_eq!(pool_names(&status), ["dp", "sys", "web"], "the node ConfigMap replaced the default");
    d.stop();
}

#[test]
fn fake_apiserver_report_updates_are_coalesced() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::start();
    fake.put("nodes", node(None));
    let interval = Duration::from_millis(200);
    let d = start(dir.path(), &fake, interval.as_millis() as u64);
    wait_report(&fake, "a first report");
    let patches = || fake.count(|r| r.method == "PATCH" && r.path.ends_with("/status"));
    let before = patches();

    const N: usize = 40;
    let t0 = Instant::now();
    let mut v = Varlink::connect(&d.varlink);
    for i in 0..N {
        std::fs::create_dir_all(d.sb.join(format!("cgroup/work/a{i}"))).unwrap();
        v.call("Assign", json!({"pool": "web", "target": format!("cgroup:work/a{i}"), "millicpus": 10}))
            .unwrap_or_else(|e| panic!("assign {i}: {e:?}"));
    }
    let assigning = t0.elapsed();
    let status = wait_for(WAIT, "the final state reported", || {
        let s = fake.status(NODE).ok_or("no status")?;
        let n = s["assignments"].as_array().map_or(0, Vec::len);
        if n == N {
            Ok(s)
        } else {
            Err(format!("{n} assignments"))
        }
    });
    let elapsed = t0.elapsed();
    let writes = patches() - before;
    // The last write carries the final state: every assignment, and the pool's free capacity.
    let web = status["pools"].as_array().unwrap().iter().find(|p| p["name"] == "web").unwrap().clone();
    assert_eq!(web["freeMillicpus"].as_u64(), Some(2000 - 10 * N as u64), "{web}");
    let a = &status["assignments"][0];
    assert!(a["owner"]["target"].as_str().is_some_and(|t| t.starts_with("cgroup:work/a")), "{a}");
    // At most one write per interval while the changes came (plus the one that was due).
    let bound = (elapsed.as_secs_f64() / interval.as_secs_f64()).floor() as usize + 2;
    eprintln!(
        "coalescing: {N} assignments in {:.2} s, final state reported after {:.2} s in {writes} status PATCHes (bound {bound})",
        assigning.as_secs_f64(),
        elapsed.as_secs_f64()
    );
    assert!(writes <= bound, "{writes} writes for {N} changes in {elapsed:?}");
    assert!(writes < N / 4, "{writes} writes for {N} changes");
    // Nothing more is written once the state is reported.
    let settled = patches();
    std::thread::sleep(interval * 3);
    assert_eq!(patches(), settled, "writes without changes");
    d.stop();
}

#[test]
fn fake_apiserver_401_and_409_are_retried() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::start();
    fake.put("nodes", node(None));
    fake.put("configmaps", configmap("cpupoold-config.default", "[daemon]\nlog_level = \"debug\"\n"));
    // The credentials are refused twice for the ConfigMap list and for the report, then a
    // conflicting write answers 409.
    fake.fail_next("GET", "/configmaps", 401, 2);
    fake.fail_next("PATCH", "/cpupoolnodes/", 401, 2);
    fake.fail_next("PATCH", "/status", 409, 1);
    let d = start(dir.path(), &fake, 50);
    let status = wait_generation(&fake, Some("cpupoold-config.default"));
    assert_eq!(condition(&status, "Ready").map(|c| c.0).as_deref(), Some("True"));
    let patches = fake.count(|r| r.method == "PATCH");
    assert!(patches >= 5, "2 refused, the object, 1 conflict, then the status: {patches}");
    for r in fake.requests().iter().filter(|r| r.method == "PATCH") {
        assert_eq!(r.query.get("fieldManager").map(String::as_str), Some("cpupoold"), "{r:?}");
        assert_eq!(r.query.get("force").map(String::as_str), Some("true"), "{r:?}");
    }
    let logs = d.logs();
    assert!(
        logs.contains("watching ConfigMaps: the API server refused our credentials (401 Unauthorized"),
        "{logs}"
    );
    assert!(
        logs.contains("writing the node report CpuPoolNode/node-a: the API server refused our credentials"),
        "{logs}"
    );
    assert!(logs.contains("conflicted with another write (409)"), "{logs}");
    d.stop();
}

/// The pod watch, in-process: the index follows this node's pods through a dropped
/// connection and a 410 Gone.
#[test]
fn fake_apiserver_pod_watch_reconnects_and_relists() {
    use cpupoold::kubernetes::cluster::pods::PodIndex;
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::start();
    let kubeconfig = dir.path().join("kubeconfig");
    fake.write_kubeconfig(&kubeconfig);
    // Uids as the API server makes them: random version-4 UUIDs, one beginning with a digit.
    let uid_p1 = test_support::apiserver::uid_digit_first();
    let pod = |name: &str, node: &str, cid: &str| {
        let uid = if name == "p1" { uid_p1.clone() } else { test_support::apiserver::uid() };
        json!({"metadata": {"name": name, "namespace": "apps", "uid": uid},
               "spec": {"nodeName": node, "containers": [{"name": "c"}]},
               "status": {"qosClass": "Guaranteed", "containerStatuses": [
                   {"name": "c", "containerID": cid, "image": "i", "imageID": "", "ready": true, "restartCount": 0}]}})
    };
    fake.put("pods", pod("p1", NODE, "containerd://aaa"));
    fake.put("pods", pod("elsewhere", "node-b", "containerd://zzz"));

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let index = PodIndex::new();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let task = {
        let index = index.clone();
        let opts = cpupoold::kubernetes::apiserver::Options {
            kubeconfig: Some(kubeconfig),
            node: NODE.into(),
            namespace: NS.into(),
            report_interval: Duration::from_millis(100),
        };
        rt.spawn(async move {
            let client = cpupoold::kubernetes::apiserver::client(&opts).await.unwrap();
            cpupoold::kubernetes::cluster::pods::run(client, opts.node, index, stopped).await;
        })
    };
    let found = |index: &PodIndex, pod: &str, cid: &str| {
        wait_for(WAIT, &format!("{pod} indexed"), || match index.lookup("apps", pod, "c") {
            Some(i) if i.container_id == cid => Ok(i),
            other => Err(format!("{other:?}")),
        })
    };
    let p1 = found(&index, "p1", "aaa");
    assert_eq!((p1.pod_uid.as_str(), p1.qos_class.as_deref()), (uid_p1.as_str(), Some("Guaranteed")));
    assert_eq!(index.lookup("apps", "elsewhere", "c"), None, "another node's pod");
    assert!(fake
        .requests()
        .iter()
        .any(|r| r.query.get("fieldSelector").map(String::as_str) == Some("spec.nodeName=node-a")));

    // A dropped connection: the pod created meanwhile arrives over the new watch.
    fake.drop_watches();
    fake.put("pods", pod("p2", NODE, "cri-o://bbb"));
    found(&index, "p2", "bbb");

    // 410 Gone: the index is rebuilt from a new list, without the pod deleted meanwhile.
    let lists_before = lists(&fake, "/pods");
    fake.expire("pods");
    fake.delete("pods", "p1");
    fake.put("pods", pod("p3", NODE, "containerd://ccc"));
    found(&index, "p3", "ccc");
    wait_for(WAIT, "p1 gone", || match index.lookup("apps", "p1", "c") {
        None => Ok(()),
        Some(i) => Err(format!("{i:?}")),
    });
    assert!(lists(&fake, "/pods") > lists_before, "no relist after 410");
    let _ = stop.send(true);
    rt.block_on(task).unwrap();
}

/// The pod watch gives the device plugin the container's pod UID and id (no CRI here), the
/// plugin moves the kubelet allocation to the container's cgroup, and the node report names
/// the pod and container as its owner.
#[test]
fn fake_apiserver_pod_identity_reaches_the_device_plugin() {
    use cpupoold::kubernetes::deviceplugin::proto::v1beta1 as dp;
    use cpupoold::kubernetes::grpc::proto::podresources as pr;
    use test_support::kubelet::{self, MemoryPods};

    let dir = tempfile::tempdir().unwrap();
    let sb = dir.path().join("sb");
    let plugins = sb.join("kubelet/device-plugins");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    // The kubelet's side the device plugin needs: registration and PodResources (no CRI
    // socket, so only the pod watch can tell which container holds the devices).
    let pods = MemoryPods::default();
    let _kubelet = common::kubelet_peer(&rt, &sb, pods.clone(), kubelet::Registration::new(|_| {}));
    let fake = Fake::start();
    fake.put("nodes", node(None));
    // A uid as the API server makes it, beginning with a digit (10 in 16 do).
    let uid = test_support::apiserver::uid_digit_first();
    fake.put(
        "pods",
        json!({"metadata": {"name": "p1", "namespace": "apps", "uid": uid},
               "spec": {"nodeName": NODE, "containers": [{"name": "c1"}]},
               "status": {"qosClass": "Guaranteed", "containerStatuses": [
                   {"name": "c1", "containerID": "containerd://abc", "image": "i", "imageID": "", "ready": true, "restartCount": 0}]}}),
    );
    let scope =
        format!("kubepods.slice/kubepods-pod{}.slice/cri-containerd-abc.scope", uid.replace('-', "_"));
    std::fs::create_dir_all(sb.join("cgroup").join(&scope)).unwrap();
    let d = start_with(dir.path(), &fake, 50, "[kubelet]\nreconcile_interval_ms = 50\n");

    // The pods were listed (and indexed) before the watch that follows the list started.
    wait_for(WAIT, "the pod watch", || if watches(&fake, "/pods") > 0 { Ok(()) } else { Err(d.logs()) });
    // The kubelet allocates core-1 of dp (CPUs 1 and 5) to apps/p1/c1.
    *pods.pods.lock().unwrap() = vec![pr::PodResources {
        name: "p1".into(),
        namespace: "apps".into(),
        containers: vec![pr::ContainerResources {
            name: "c1".into(),
            devices: vec![pr::ContainerDevices {
                resource_name: "cpupool.io/dp".into(),
                device_ids: vec!["core-1".into()],
                topology: None,
            }],
            ..Default::default()
        }],
    }];
    let sock = plugins.join("cpupoold-dp.sock");
    wait_for(WAIT, "the dp plugin socket", || if sock.exists() { Ok(()) } else { Err(d.logs()) });
    let envs = rt.block_on(async {
        let channel = cpupoold::kubernetes::grpc::clients::unix_channel(sock.clone()).await.unwrap();
        let mut c = dp::device_plugin_client::DevicePluginClient::new(channel);
        let req = dp::AllocateRequest {
            container_requests: vec![dp::ContainerAllocateRequest { devices_ids: vec!["core-1".into()] }],
        };
        c.allocate(req).await.unwrap().into_inner().container_responses[0].envs.clone()
    });
    assert_eq!(envs["CPUPOOL_CPUS"], "1,5");
    let mut v = Varlink::connect(&d.varlink);
    wait_for(WAIT, "the allocation moved to the container's cgroup", || {
        let a = v.call("GetAssignment", json!({"id": "kubelet-core-1"})).map_err(|e| format!("{e:?}"))?;
        let target = a["assignment"]["target"].as_str().unwrap_or("").to_owned();
        if target == format!("cgroup:{scope}") {
            Ok(())
        } else {
            Err(target)
        }
    });
    assert_eq!(std::fs::read_to_string(sb.join("cgroup").join(&scope).join("cpuset.cpus")).unwrap(), "1,5");
    let owner = wait_for(WAIT, "the owner in the report", || {
        let s = fake.status(NODE).ok_or("no status")?;
        let a =
            s["assignments"].as_array().and_then(|a| a.iter().find(|a| a["id"] == "kubelet-core-1").cloned());
        match a {
            Some(a) if a["owner"]["pod"] == "p1" => Ok(a["owner"].clone()),
            other => Err(format!("{other:?}")),
        }
    });
    assert_eq!(
        owner,
        json!({"target": format!("cgroup:{scope}"), "namespace": "apps", "pod": "p1", "podUid": uid, "container": "c1"})
    );
    assert!(!d.logs().contains("containerd.sock"), "the CRI was not needed");
    d.stop();
}
