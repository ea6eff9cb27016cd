//! The DRA pools as this node's ResourceSlices, against the fake API server
//! (`fake_apiserver/`, `fake_apiserver/slices.rs`: there is no real one on these machines): the
//! real `cpupoold --sandbox` on a 2-node host publishes its `dra = true` pools and follows
//! their changes through the varlink API, a reload and a CPU going offline, writes nothing when
//! nothing about them changed, puts back a slice deleted behind its back, rides out an API
//! server that fails, and deletes its slices when no pool is DRA's; a pool without `dra` keeps
//! its device plugin.
#![cfg(feature = "k8s")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod fake_apiserver;

use std::path::Path;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

use common::{Daemon, Varlink};
use fake_apiserver::{wait_for, Fake};

const NODE: &str = "node-a";
const WAIT: u64 = 60;

/// 2 sockets x 4 cores x 2 threads, NUMA node per socket (cores 0-3 on node 0; CPU c and c+8
/// are siblings). `dp` spans both nodes, `web` is on node 0, `legacy` stays with the device
/// plugin; 7 and 15 are free.
const CONFIG: &str = r#"
[pools.sys]
kind = "reserved"
cpus = "0,8"

[pools.dp]
kind = "exclusive"
cpus = "1-2,4-5,9-10,12-13"
dra = true

[pools.web]
kind = "shared"
cpus = "3,11"
dra = true

[pools.legacy]
kind = "exclusive"
cpus = "6,14"

[kubelet]
reconcile_interval_ms = 50
"#;

fn start(dir: &Path, fake: &Fake) -> Daemon {
    let kubeconfig = dir.join("kubeconfig");
    fake.write_kubeconfig(&kubeconfig);
    let config = format!(
        "{CONFIG}\n[k8s]\nenabled = true\nkubeconfig = \"{}\"\nnode_name = \"{NODE}\"\nnamespace = \"cpupool-system\"\n\
         report_interval_ms = 50\n",
        kubeconfig.display()
    );
    Daemon::start_shaped(dir, "2x4x2:2", Some(&config), &["--bus", "none", "--log-level", "debug"])
}

/// The devices of this node's slices, by name, once the slices are one complete generation.
fn devices(fake: &Fake) -> Result<(i64, Vec<Value>), String> {
    let slices = fake.slices(NODE);
    let Some(first) = slices.first() else { return Ok((0, Vec::new())) };
    let generation = first["spec"]["pool"]["generation"].as_i64().unwrap_or(-1);
    let count = first["spec"]["pool"]["resourceSliceCount"].as_i64().unwrap_or(-1);
    if slices.len() as i64 != count || slices.iter().any(|s| s["spec"]["pool"]["generation"] != generation) {
        return Err(format!("an incomplete pool: {slices:?}"));
    }
    let devices =
        slices.iter().flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default()).collect();
    Ok((generation, devices))
}

fn names(devices: &[Value]) -> Vec<String> {
    devices.iter().map(|d| d["name"].as_str().unwrap_or("").to_owned()).collect()
}

/// Waits until the slices list exactly `want`; (generation, devices).
fn wait_devices(fake: &Fake, d: &Daemon, want: &[&str]) -> (i64, Vec<Value>) {
    wait_for(WAIT, &format!("the devices {want:?}"), || {
        let (generation, devices) = devices(fake)?;
        if names(&devices) == want {
            Ok((generation, devices))
        } else {
            Err(format!("{:?} at generation {generation}\n{}", names(&devices), d.logs()))
        }
    })
}

/// Waits until `device`'s `cpu` capacity is `value`.
fn wait_capacity(fake: &Fake, device: &str, value: &str) {
    wait_for(WAIT, &format!("{device} with cpu {value}"), || {
        let (_, devs) = devices(fake)?;
        let d = devs.iter().find(|d| d["name"] == device).ok_or(format!("no {device}: {devs:?}"))?;
        if d["capacity"]["cpu"]["value"] == value {
            Ok(())
        } else {
            Err(format!("{d}"))
        }
    });
}

/// Waits until the node report lists `pools` (the daemon has published that state).
fn wait_report_pools(fake: &Fake, pools: &[&str]) {
    wait_for(WAIT, &format!("the report's pools {pools:?}"), || {
        let status = fake.status(NODE).ok_or("no report")?;
        let got: Vec<&str> =
            status["pools"].as_array().into_iter().flatten().filter_map(|p| p["name"].as_str()).collect();
        if got == pools {
            Ok(())
        } else {
            Err(format!("{got:?}"))
        }
    });
}

#[test]
fn fake_apiserver_dra_slices_follow_the_pools() {
    let dir = tempfile::tempdir().unwrap();
    let sb = dir.path().join("sb");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let registered = Arc::new(Mutex::new(Vec::<String>::new()));
    let _kubelet = {
        let registered = registered.clone();
        let registration = test_support::kubelet::Registration::new(move |r| {
            registered.lock().unwrap().push(r.resource_name)
        });
        common::kubelet_peer(&rt, &sb, Default::default(), registration)
    };
    let fake = Fake::start();
    fake.put("nodes", json!({"metadata": {"name": NODE}, "spec": {}}));
    let d = start(dir.path(), &fake);

    // One slice: a device per (DRA pool, NUMA node), the pool named after the node.
    let (_, devs) = wait_devices(&fake, &d, &["dp-numa0", "dp-numa1", "web"]);
    let slice = &fake.slices(NODE)[0];
    assert_eq!(slice["metadata"]["name"], "node-a-dra.cpupool.io-0");
    assert_eq!(slice["spec"]["driver"], "dra.cpupool.io");
    assert_eq!(slice["spec"]["pool"]["name"], NODE);
    assert_eq!(slice["metadata"]["managedFields"][0]["manager"], "cpupoold");
    assert_eq!(devs[0]["attributes"]["resource.kubernetes.io/numaNode"], json!({"int": 0}));
    assert_eq!(devs[1]["attributes"]["resource.kubernetes.io/numaNode"], json!({"int": 1}));
    assert_eq!(devs[0]["attributes"]["pool"], json!({"string": "dp"}));
    assert_eq!(devs[0]["attributes"]["wholeCores"], json!({"bool": true}));
    assert_eq!(devs[0]["allowMultipleAllocations"], true);
    assert_eq!(
        devs[0]["capacity"]["cpu"],
        json!({"value": "4", "requestPolicy": {"default": "2", "validRange": {"min": "2", "step": "2"}}})
    );
    assert_eq!(devs[2]["attributes"]["kind"], json!({"string": "shared"}));
    assert_eq!(devs[2]["capacity"]["cpu"]["value"], "2");
    assert_eq!(devs[2]["capacity"]["cpu"]["requestPolicy"]["default"], "100m");
    for r in fake.requests().iter().filter(|r| r.method == "PATCH" && r.path.contains("/resourceslices/")) {
        assert_eq!(r.query.get("fieldManager").map(String::as_str), Some("cpupoold"), "{r:?}");
        assert_eq!(r.query.get("force").map(String::as_str), Some("true"), "{r:?}");
    }
    assert!(
        fake.requests().iter().any(|r| r.is_watch()
            && r.path.ends_with("/resourceslices")
            && r.query.get("fieldSelector").map(String::as_str)
                == Some("spec.nodeName=node-a,spec.driver=dra.cpupool.io")),
        "the slices are watched with the node and driver selectors"
    );

    // The pool without dra keeps the device plugin; the DRA pools are not offered there.
    wait_for(WAIT, "legacy registered with the kubelet", || {
        let r = registered.lock().unwrap().clone();
        if r.iter().any(|n| n == "cpupool.io/legacy") {
            Ok(r)
        } else {
            Err(format!("{r:?}"))
        }
    });
    let r = registered.lock().unwrap().clone();
    assert!(!r.iter().any(|n| n == "cpupool.io/dp" || n == "cpupool.io/web"), "{r:?}");
    // The node report says which way each pool is offered.
    let status = wait_for(WAIT, "a report", || fake.status(NODE).ok_or_else(|| "none".to_owned()));
    let served: Vec<(&str, &Value)> = status["pools"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| (p["name"].as_str().unwrap_or(""), &p["servedBy"]))
        .collect();
    assert_eq!(
        served,
        [
            ("dp", &json!("dra")),
            ("legacy", &json!("devicePlugin")),
            ("sys", &Value::Null),
            ("web", &json!("dra"))
        ]
    );

    // Nothing about the devices changes: an assignment, a pool without dra created and
    // deleted. The report (written from the same snapshots) shows each; no slice is written.
    let writes = fake.writes("resourceslices");
    let mut v = Varlink::connect(&d.varlink);
    std::fs::create_dir_all(sb.join("cgroup/work/a0")).unwrap();
    let a = v.call("Assign", json!({"pool": "web", "target": "cgroup:work/a0", "millicpus": 200})).unwrap();
    let id = a["assignment"]["id"].as_str().unwrap().to_owned();
    v.call("CreatePool", json!({"name": "tmp", "kind": "exclusive", "cpus": "7,15"})).unwrap();
    wait_report_pools(&fake, &["dp", "legacy", "sys", "tmp", "web"]);
    v.call("DeletePool", json!({"name": "tmp"})).unwrap();
    wait_report_pools(&fake, &["dp", "legacy", "sys", "web"]);
    assert_eq!(fake.writes("resourceslices"), writes, "slices written though no device changed");

    // CPU 12 goes offline: dp-numa1 offers the 3 CPUs left until it is back.
    let online = sb.join("sys/devices/system/cpu/online");
    assert_eq!(std::fs::read_to_string(&online).unwrap().trim(), "0-15");
    std::fs::write(&online, "0-11,13-15\n").unwrap();
    wait_capacity(&fake, "dp-numa1", "3");
    std::fs::write(&online, "0-15\n").unwrap();
    wait_capacity(&fake, "dp-numa1", "4");
    let (g1, _) = devices(&fake).unwrap();

    // A slice deleted behind the daemon's back (the kubelet removes its node's slices of a
    // driver whose plugin is not registered) comes back, at a new generation.
    fake.delete("resourceslices", "node-a-dra.cpupool.io-0");
    let (g2, _) = wait_devices(&fake, &d, &["dp-numa0", "dp-numa1", "web"]);
    assert!(g2 > g1, "{g2} after {g1}");

    // Someone else rewrites the slice with an older generation and 100 devices of their own:
    // what the API server has now is taken as it is, and put right at a newer generation.
    let mut foreign = fake.object("resourceslices", "node-a-dra.cpupool.io-0").unwrap();
    foreign["spec"]["pool"]["generation"] = json!(g2 - 1);
    foreign["spec"]["devices"] =
        json!((0..100).map(|i| json!({"name": format!("foreign-{i}")})).collect::<Vec<_>>());
    fake.put("resourceslices", foreign);
    let (g2, _) = wait_devices(&fake, &d, &["dp-numa0", "dp-numa1", "web"]);

    // A resize off NUMA node 1: its device goes, the generation moves on.
    v.call("ResizePool", json!({"name": "dp", "cpus": "1-2,9-10"})).unwrap();
    let (g3, _) = wait_devices(&fake, &d, &["dp-numa0", "web"]);
    assert!(g3 > g2);

    // A pool created through the API with `dra` is DRA's (CreatePool's `dra`, as the
    // configuration's), and goes with it.
    let p = v
        .call("CreatePool", json!({"name": "tmp", "kind": "exclusive", "cpus": "7,15", "dra": true}))
        .unwrap();
    assert_eq!(p["pool"]["name"], "tmp");
    let dropin = std::fs::read_to_string(sb.join("etc/cpupoold/config.d/90-cpupoold-runtime.toml")).unwrap();
    assert!(dropin.contains("dra = true"), "{dropin}");
    wait_devices(&fake, &d, &["dp-numa0", "tmp-numa1", "web"]);
    v.call("DeletePool", json!({"name": "tmp"})).unwrap();
    let (g3, _) = wait_devices(&fake, &d, &["dp-numa0", "web"]);

    // A reload that adds a DRA pool on the freed CPUs.
    let config = sb.join("etc/cpupoold/config.toml");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str("\n[pools.batch]\nkind = \"exclusive\"\ncpus = \"4-5,12-13\"\ndra = true\n");
    std::fs::write(&config, text).unwrap();
    v.call("Reload", json!({})).unwrap();
    let (g4, devs) = wait_devices(&fake, &d, &["batch-numa1", "dp-numa0", "web"]);
    assert!(g4 > g3);
    assert_eq!(devs[0]["attributes"]["resource.kubernetes.io/numaNode"], json!({"int": 1}));

    // A DRA pool deleted through the API.
    v.call("Release", json!({"id": id})).unwrap();
    v.call("DeletePool", json!({"name": "web"})).unwrap();
    wait_devices(&fake, &d, &["batch-numa1", "dp-numa0"]);

    // The API server fails every write for a while and cuts the watches: the change made
    // meanwhile (batch down to one core: one step of 2 is all it holds) arrives once it answers.
    fake.fail_next("PATCH", "/resourceslices/", 503, 3);
    fake.drop_watches();
    v.call("ResizePool", json!({"name": "batch", "cpus": "4,12"})).unwrap();
    let batch = wait_for(WAIT, "batch at one core", || {
        let (_, devs) = devices(&fake)?;
        let b = devs.first().map(|b| b["capacity"]["cpu"].clone()).unwrap_or_default();
        if names(&devs) == ["batch-numa1", "dp-numa0"] && b["value"] == "2" {
            Ok(b)
        } else {
            Err(format!("{devs:?}"))
        }
    });
    assert_eq!(batch["requestPolicy"], json!({"default": "2", "validRange": {"min": "2", "max": "2"}}));
    // The log line after a write that went through comes when that write's answer is read,
    // which may be after the fake already serves the new slice: waited for, not assumed.
    wait_for(WAIT, "the log of the slices written again", || {
        let logs = d.logs();
        if logs.contains("applying ResourceSlice node-a-dra.cpupool.io-0")
            && logs.contains("the ResourceSlices are written again")
        {
            Ok(())
        } else {
            Err(logs)
        }
    });

    // No pool is DRA's any more: the slices are deleted.
    v.call("DeletePool", json!({"name": "batch"})).unwrap();
    v.call("DeletePool", json!({"name": "dp"})).unwrap();
    wait_for(WAIT, "no slice left", || {
        let s = fake.slices(NODE);
        if s.is_empty() {
            Ok(())
        } else {
            Err(format!("{s:?}"))
        }
    });
    assert!(
        fake.count(|r| r.method == "DELETE" && r.path.ends_with("/resourceslices/node-a-dra.cpupool.io-0"))
            >= 1
    );
    d.stop();
}

/// A restarted daemon finds its slices as it left them and adopts them: no write at start, so
/// the next change is the very next generation, in one write.
#[test]
fn fake_apiserver_dra_slices_are_adopted_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::start();
    fake.put("nodes", json!({"metadata": {"name": NODE}, "spec": {}}));
    let d = start(dir.path(), &fake);
    let (g1, _) = wait_devices(&fake, &d, &["dp-numa0", "dp-numa1", "web"]);
    d.stop();
    let writes = fake.writes("resourceslices");
    let slice_watches =
        || fake.count(|r| r.is_watch() && r.method == "GET" && r.path.ends_with("/resourceslices"));
    let watched = slice_watches();

    // The new daemon lists its slices (its watch follows the listing) before the pools change.
    let d = start(dir.path(), &fake);
    wait_for(WAIT, "the slices listed and watched", || {
        if slice_watches() > watched {
            Ok(())
        } else {
            Err(d.logs())
        }
    });
    let mut v = Varlink::connect(&d.varlink);
    v.call("ResizePool", json!({"name": "dp", "cpus": "1-2,9-10"})).unwrap();
    let (g2, _) = wait_devices(&fake, &d, &["dp-numa0", "web"]);
    assert_eq!(g2, g1 + 1, "the restart wrote the slices again\n{}", d.logs());
    assert_eq!(fake.writes("resourceslices"), writes + 1, "one write for the resize");
    d.stop();
}

/// An API server with the `DRAConsumableCapacity` gate off keeps the slices without its fields:
/// the daemon says so once and writes again only when the devices change, not on every change
/// of the engine.
#[test]
fn fake_apiserver_dra_slices_without_consumable_capacity_are_not_rewritten() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::start();
    fake.consumable_capacity_off();
    fake.put("nodes", json!({"metadata": {"name": NODE}, "spec": {}}));
    let d = start(dir.path(), &fake);
    let (g1, devs) = wait_devices(&fake, &d, &["dp-numa0", "dp-numa1", "web"]);
    assert_eq!(devs[0].get("allowMultipleAllocations"), None, "{}", devs[0]);
    let writes = fake.writes("resourceslices");

    // Engine changes that leave the devices alone: an assignment, a pool without dra.
    let mut v = Varlink::connect(&d.varlink);
    std::fs::create_dir_all(d.sb.join("cgroup/work/a0")).unwrap();
    v.call("Assign", json!({"pool": "web", "target": "cgroup:work/a0", "millicpus": 200})).unwrap();
    v.call("CreatePool", json!({"name": "tmp", "kind": "exclusive", "cpus": "7,15"})).unwrap();
    wait_report_pools(&fake, &["dp", "legacy", "sys", "tmp", "web"]);
    assert_eq!(fake.writes("resourceslices"), writes, "slices written again though no device changed");

    v.call("ResizePool", json!({"name": "dp", "cpus": "1-2,9-10"})).unwrap();
    let (g2, _) = wait_devices(&fake, &d, &["dp-numa0", "web"]);
    assert_eq!((g2, fake.writes("resourceslices")), (g1 + 1, writes + 1));
    let logs = d.logs();
    assert_eq!(logs.matches("feature gates on?").count(), 1, "{logs}");
    d.stop();
}
