#![allow(clippy::unwrap_used)]
use super::*;
use crate::core::pool::PoolName;
use crate::core::state::State;
use crate::core::topology::Topology;

/// The pools `toml` configures on `topo`, with the reserved pool `sys` on `reserved`, as the
/// daemon resolves them.
fn state(topo: &Topology, reserved: &str, toml: &str) -> State {
    let toml = format!("[pools.sys]\nkind = \"reserved\"\ncpus = \"{reserved}\"\n{toml}");
    let settings = crate::config::load_strs(&[("test.toml", &toml)]).unwrap();
    State::with_pools(settings.resolve_pools(topo).unwrap())
}

fn target() -> Target {
    Target { node: "node-a".into(), driver: dra::driver_name("cpupool.io"), millis_per_device: 100 }
}

/// 2 sockets x 4 cores x 2 threads on 2 NUMA nodes (cores 0-3 on node 0, siblings c, c+8).
fn host_devices() -> Vec<DraDevice> {
    let t = Topology::synthetic(2, 4, 2, 2);
    let s = state(
        &t,
        "0,8",
        r#"
        [pools.dp]
        kind = "exclusive"
        cpus = "1-2,9-10,4-5,12-13"
        isolate = true
        dra = true
        [pools.one]
        kind = "exclusive"
        cpus = "6"
        smt = "threads"
        dra = true
        [pools.legacy]
        kind = "exclusive"
        cpus = "7,15"
        [pools.web]
        kind = "shared"
        cpus = "3,11"
        dra = true
        "#,
    );
    dra::devices(&s, &t, 100)
}

fn json(slice: &ResourceSlice) -> serde_json::Value {
    serde_json::to_value(slice).unwrap()
}

#[test]
fn a_slice_lists_the_dra_pools_with_their_attributes_and_capacity() {
    let slices = build("node-a", "dra.cpupool.io", &host_devices(), 3);
    assert_eq!(slices.len(), 1);
    let v = json(&slices[0]);
    assert_eq!(v["apiVersion"], "resource.k8s.io/v1");
    assert_eq!(v["kind"], "ResourceSlice");
    assert_eq!(v["metadata"]["name"], "node-a-dra.cpupool.io-0");
    let spec = &v["spec"];
    assert_eq!(spec["driver"], "dra.cpupool.io");
    assert_eq!(spec["nodeName"], "node-a");
    assert_eq!(spec["pool"], serde_json::json!({"name": "node-a", "generation": 3, "resourceSliceCount": 1}));
    let names: Vec<&str> =
        spec["devices"].as_array().unwrap().iter().map(|d| d["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["dp-numa0", "dp-numa1", "one-numa1", "web"], "legacy and sys are not DRA's");
    let dp0 = &spec["devices"][0];
    assert_eq!(dp0["allowMultipleAllocations"], true);
    assert_eq!(
        dp0["attributes"],
        serde_json::json!({
            "pool": {"string": "dp"}, "kind": {"string": "exclusive"}, "isolated": {"bool": true},
            "wholeCores": {"bool": true}, "resource.kubernetes.io/numaNode": {"int": 0}, "l3Group": {"int": 0}
        })
    );
    // Whole cores of 2 threads: steps of 2 CPUs, 2 when a request names no amount.
    assert_eq!(
        dp0["capacity"]["cpu"],
        serde_json::json!({"value": "4", "requestPolicy": {"default": "2", "validRange": {"min": "2", "step": "2"}}})
    );
    // One CPU: min + step would pass the capacity, so the range is the one step.
    assert_eq!(
        spec["devices"][2]["capacity"]["cpu"],
        serde_json::json!({"value": "1", "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "1"}}})
    );
    let web = &spec["devices"][3];
    assert_eq!(web["attributes"]["kind"], serde_json::json!({"string": "shared"}));
    assert_eq!(web["attributes"]["resource.kubernetes.io/numaNode"], serde_json::json!({"int": 0}));
    assert_eq!(
        web["capacity"]["cpu"],
        serde_json::json!({"value": "2", "requestPolicy": {"default": "100m", "validRange": {"min": "100m", "step": "100m"}}})
    );
}

#[test]
fn a_device_spanning_nodes_has_no_numa_node_and_lists_its_l3_groups() {
    let t = Topology::synthetic(2, 4, 2, 2);
    let s = state(&t, "0,8", "[pools.web]\nkind = \"shared\"\ncpus = \"3,7\"\ndra = true\n");
    let d = device(&dra::devices(&s, &t, 100)[0]);
    let attrs = d.attributes.unwrap();
    assert!(!attrs.contains_key(dra::ATTR_NUMA), "{attrs:?}");
    assert_eq!(
        attrs.get("l3Groups").and_then(|a| a.string.as_deref()),
        Some("0,4"),
        "the L3 groups by their ids"
    );
    assert!(!attrs.contains_key("l3Group"));
}

#[test]
fn every_device_stays_within_the_attribute_and_name_limits() {
    for d in host_devices() {
        let dev = device(&d);
        let n =
            dev.attributes.as_ref().map_or(0, BTreeMap::len) + dev.capacity.as_ref().map_or(0, BTreeMap::len);
        assert!(n <= MAX_ATTRIBUTES_AND_CAPACITIES, "{}: {n}", dev.name);
        assert!(dev.name.len() <= 63, "a device name is a DNS label");
        for (k, v) in dev.attributes.iter().flatten() {
            let id = k.rsplit('/').next().unwrap_or(k);
            assert!(id.len() <= 32, "attribute ids are C identifiers of at most 32: {k}");
            assert!(v.string.as_ref().is_none_or(|s| s.len() <= MAX_STRING_ATTRIBUTE), "{k}");
        }
    }
    // The longest pool name makes the longest device name.
    let long = PoolName::new(&"p".repeat(32)).unwrap();
    assert!(dra::device_name(&long, Some(u32::MAX)).len() <= 63);
}

/// More devices than one slice may hold: several slices of one generation, each saying how
/// many there are, none over the limit, every device once.
#[test]
fn devices_beyond_128_are_split_into_slices_of_one_generation() {
    // 2 sockets x 128 cores on 8 NUMA nodes (32 CPUs each); 20 pools with a CPU on every node.
    let t = Topology::synthetic(2, 128, 1, 8);
    let toml: String = (0..20)
        .map(|i| {
            let cpus: Vec<String> = (0..8).map(|n| (n * 32 + i).to_string()).collect();
            format!(
                "[pools.p{i:02}]\nkind = \"exclusive\"\ncpus = \"{}\"\nsmt = \"threads\"\ndra = true\n",
                cpus.join(",")
            )
        })
        .collect();
    let devices = dra::devices(&state(&t, "31", &toml), &t, 100);
    assert_eq!(devices.len(), 160);
    let slices = build("node-a", "dra.cpupool.io", &devices, 7);
    assert_eq!(slices.len(), 2);
    let mut names = Vec::new();
    for (i, s) in slices.iter().enumerate() {
        assert_eq!(s.metadata.name.as_deref(), Some(format!("node-a-dra.cpupool.io-{i}").as_str()));
        assert_eq!((s.spec.pool.generation, s.spec.pool.resource_slice_count), (7, 2));
        let devs = s.spec.devices.as_deref().unwrap_or_default();
        assert!(devs.len() <= MAX_DEVICES);
        names.extend(devs.iter().map(|d| d.name.clone()));
    }
    assert_eq!(names, devices.iter().map(|d| d.name.clone()).collect::<Vec<_>>());
    assert!(build("node-a", "dra.cpupool.io", &[], 1).is_empty(), "no devices, no slice");
}

#[test]
fn slice_names_are_dns_subdomains_even_for_the_longest_node_names() {
    assert_eq!(slice_name("n1", "dra.cpupool.io", 2), "n1-dra.cpupool.io-2");
    let long_a = format!("{}-.a", "x".repeat(250));
    let long_b = format!("{}-.b", "x".repeat(250));
    let (a, b) = (slice_name(&long_a, "dra.cpupool.io", 0), slice_name(&long_b, "dra.cpupool.io", 0));
    assert_ne!(a, b, "cut names stay apart");
    for n in [&a, &b] {
        assert!(n.len() <= 253, "{}", n.len());
        assert!(n.ends_with("-dra.cpupool.io-0"));
        assert!(!n.contains("-.") && !n.contains(".-"), "{n}");
    }
    assert_eq!(a, slice_name(&long_a, "dra.cpupool.io", 0), "stable");
}

fn seen(slices: Vec<ResourceSlice>) -> BTreeMap<String, ResourceSlice> {
    slices.into_iter().map(|s| (s.metadata.name.clone().unwrap(), s)).collect()
}

#[test]
fn nothing_is_written_while_the_slices_say_what_the_pools_do() {
    let (t, devices) = (target(), host_devices());
    // A restarted daemon finds its slices at generation 5: adopted, no write.
    let current = seen(build(&t.node, &t.driver, &devices, 5));
    assert_eq!(plan(&current, &t, &devices, 0), None);
    // Nothing to publish and nothing there: nothing to do.
    assert_eq!(plan(&BTreeMap::new(), &t, &[], 0), None);
}

#[test]
fn a_change_bumps_the_generation_and_deletes_what_is_left_over() {
    let (t, devices) = (target(), host_devices());
    let first = plan(&BTreeMap::new(), &t, &devices, 0).unwrap();
    assert_eq!((first.generation, first.apply.len(), first.delete.len()), (1, 1, 0));
    let mut current = seen(first.apply);
    // A resize: generation 2, above the one last written even when the server's is lower.
    let fewer = &devices[..2];
    let second = plan(&current, &t, fewer, 4).unwrap();
    assert_eq!(second.generation, 5);
    assert_eq!(second.apply[0].spec.devices.as_ref().map(Vec::len), Some(2));
    // A slice left from a larger pool (or someone else's edit) is deleted; one of a lower
    // generation is written again.
    let mut stale = current["node-a-dra.cpupool.io-0"].clone();
    stale.metadata.name = Some("node-a-dra.cpupool.io-1".into());
    current.insert("node-a-dra.cpupool.io-1".into(), stale);
    let third = plan(&current, &t, &devices, 1).unwrap();
    assert_eq!(third.delete, ["node-a-dra.cpupool.io-1"]);
    assert_eq!(third.generation, 2);
    // No DRA pool any more: every slice deleted, none applied.
    let last = plan(&current, &t, &[], 2).unwrap();
    assert!(last.apply.is_empty());
    assert_eq!(last.delete.len(), 2);
}

/// An API server that drops the fields of a gate it has off keeps the slice otherwise than it
/// was applied: that is no change of the devices while the slice is the one written, and one
/// when someone else wrote it since.
#[test]
fn a_slice_kept_without_the_fields_the_server_dropped_is_not_written_again() {
    let (t, devices) = (target(), host_devices());
    let applied_slice = build(&t.node, &t.driver, &devices, 1).remove(0);
    let name = applied_slice.metadata.name.clone().unwrap();
    let mut kept = applied_slice.clone();
    kept.metadata.resource_version = Some("7".into());
    for d in kept.spec.devices.iter_mut().flatten() {
        d.allow_multiple_allocations = None;
        for c in d.capacity.iter_mut().flat_map(|c| c.values_mut()) {
            c.request_policy = None;
        }
    }
    let applied = BTreeMap::from([(name.clone(), ("7".to_owned(), applied_slice.spec.clone()))]);
    let seen = BTreeMap::from([(name.clone(), kept.clone())]);
    assert!(plan(&seen, &t, &devices, 1).is_some(), "taken as it is, it differs");
    assert_eq!(plan(&as_applied(&seen, &applied), &t, &devices, 1), None);
    kept.metadata.resource_version = Some("8".into());
    let edited = BTreeMap::from([(name, kept)]);
    assert_eq!(plan(&as_applied(&edited, &applied), &t, &devices, 1).map(|p| p.generation), Some(2));
}

/// A watch event is taken as what the API server has unless it is the late echo of an earlier
/// write of this daemon's: someone else's edit counts whatever generation it carries.
#[test]
fn only_the_late_echo_of_an_own_write_is_passed_over() {
    let ours: std::collections::VecDeque<String> = ["10", "12", "15"].map(String::from).into();
    assert!(late_echo(Some(&ours), Some("10")));
    assert!(late_echo(Some(&ours), Some("12")));
    // The latest write's own echo is what the server has.
    assert!(!late_echo(Some(&ours), Some("15")));
    // Someone else's edit, older generation or not, has a version none of ours had.
    assert!(!late_echo(Some(&ours), Some("13")));
    assert!(!late_echo(None, Some("10")));
    assert!(!late_echo(Some(&ours), None));
}
