#![allow(clippy::unwrap_used)]
use super::*;

fn pool(name: &str, kind: PoolKind, cpus: &str, smt: Smt, dra: bool) -> Pool {
    Pool {
        name: PoolName::new(name).unwrap(),
        kind,
        cpus: CpuSet::parse(cpus).unwrap(),
        smt,
        isolate: kind == PoolKind::Exclusive,
        kubelet: true,
        enforce_quota: false,
        dra,
    }
}

/// 2 sockets x 4 cores x 2 threads, 2 NUMA nodes: cores 0-3 on node 0, siblings c and c+8.
fn host() -> (Topology, State) {
    let t = Topology::synthetic(2, 4, 2, 2);
    let s = State::with_pools(vec![
        pool("sys", PoolKind::Reserved, "0,8", Smt::Threads, false),
        pool("dp_fast", PoolKind::Exclusive, "1-3,5-7,9-11,13-15", Smt::FullCores, true),
        pool("th", PoolKind::Exclusive, "4", Smt::Threads, true),
        pool("web", PoolKind::Shared, "12", Smt::Threads, true),
    ]);
    (t, s)
}

#[test]
fn quantities_parse_as_the_api_server_writes_cpu_amounts() {
    for (q, m) in [
        ("4", 4000),
        ("0", 0),
        ("500m", 500),
        ("1.5", 1500),
        ("0.25", 250),
        (".5", 500),
        ("2k", 2_000_000),
        ("1.000", 1000),
    ] {
        assert_eq!(Millis::parse(q), Ok(Millis(m)), "{q}");
    }
    for q in ["", "-1", "1e3", "1Ki", "0.0005", "1.5m", "m", "1..5", "99999999999999999999"] {
        let e = Millis::parse(q).unwrap_err();
        assert!(e.to_string().contains("is not a CPU amount"), "{q}: {e}");
    }
    assert_eq!(Millis(4000).to_string(), "4");
    assert_eq!(Millis(1500).to_string(), "1500m");
    for m in [0, 1, 999, 1000, 1001, 123_456] {
        assert_eq!(Millis::parse(&Millis(m).to_string()), Ok(Millis(m)), "round trip of {m}");
    }
}

#[test]
fn a_pool_is_one_device_per_numa_node_not_one_per_cpu() {
    let (t, s) = host();
    let d = devices(&s, &t, 100);
    let names: Vec<&str> = d.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["dp-fast-numa0", "dp-fast-numa1", "th-numa1", "web"]);
    let dp0 = &d[0];
    assert_eq!(
        (dp0.cpus.to_string(), dp0.numa, dp0.capacity, dp0.step),
        ("1-3,9-11".into(), Some(0), Millis::cpus(6), Millis::cpus(2))
    );
    assert!(dp0.whole_cores && dp0.isolated && dp0.kind == PoolKind::Exclusive);
    assert_eq!(dp0.l3, vec![0]);
    assert_eq!((d[2].step, d[2].capacity), (Millis::cpus(1), Millis::cpus(1)));
    // A shared pool is used as a whole: one device, its NUMA node when it has one.
    assert_eq!((d[3].numa, d[3].capacity, d[3].step), (Some(1), Millis(1000), Millis(100)));
    // The reserved pool and pools the device plugin serves are not in the slice.
    let mut plugin = s.clone();
    plugin = State::with_pools(
        plugin
            .pools()
            .values()
            .cloned()
            .map(|mut p| {
                p.dra = false;
                p
            })
            .collect(),
    );
    assert!(devices(&plugin, &t, 100).is_empty());
}

#[test]
fn names_are_dns_labels_one_to_one_with_pools() {
    let n = |s: &str| PoolName::new(s).unwrap();
    assert_eq!(device_name(&n("a_b"), Some(3)), "a-b-numa3");
    assert_eq!(device_name(&n("web"), None), "web");
    assert_eq!(class_name(&n("a_b"), "dra.cpupool.io"), "a-b.dra.cpupool.io");
}

#[test]
fn results_add_up_per_device_and_step() {
    let (t, s) = host();
    let r = |v: &[(&str, Option<&str>)]| {
        let v: Vec<(String, Option<Millis>)> =
            v.iter().map(|(d, q)| ((*d).to_owned(), q.map(|q| Millis::parse(q).unwrap()))).collect();
        resolve(&s, &t, 100, &v)
    };
    // One result that consumed 4 CPUs.
    let w = r(&[("dp-fast-numa1", Some("4"))]).unwrap();
    assert_eq!(w.len(), 1);
    assert_eq!(
        (w[0].pool.as_str(), w[0].within.to_string(), &w[0].size),
        ("dp_fast", "5-7,13-15".to_owned(), &Size::Cpus(4))
    );
    // Two results with no amount (an extended-resource request for 2): two steps (two cores).
    let w = r(&[("dp-fast-numa0", None), ("dp-fast-numa0", None)]).unwrap();
    assert_eq!(w[0].size, Size::Cpus(4));
    // Shared: millicpus.
    assert_eq!(r(&[("web", Some("300m")), ("web", None)]).unwrap()[0].size, Size::Millicpus(400));
    // Two devices, two wants.
    assert_eq!(r(&[("dp-fast-numa0", Some("2")), ("th-numa1", None)]).unwrap().len(), 2);

    let e = r(&[("dp-fast-numa0", Some("3"))]).unwrap_err();
    assert!(e.to_string().contains("3 is not a multiple of its step 2"), "{e}");
    let e = r(&[("dp-fast-numa0", Some("4")), ("dp-fast-numa0", Some("4"))]).unwrap_err();
    assert!(e.to_string().contains("8 asked, its capacity is 6"), "{e}");
    let e = r(&[("web", Some("150m"))]).unwrap_err();
    assert!(e.to_string().contains("150m is not a multiple of its step 100m"), "{e}");
    let e = r(&[("sys", None)]).unwrap_err();
    assert!(e.to_string().starts_with("device `sys`: no pool on this node is served by DRA"), "{e}");
    assert!(r(&[("dp-fast-numa0", Some("0"))]).is_err());
}

/// What the scheduler writes for a shared pool's request of `100m`: `100m` where fractional
/// steps are honoured (1.37, `DRAFractionalCapacityRange`), `1` where the range arithmetic is
/// integer (1.34-1.36 round the step up to a whole unit). The driver books what was consumed.
#[test]
fn a_shared_request_books_what_the_scheduler_says_was_consumed() {
    let (t, s) = host();
    let r = |q: &str| resolve(&s, &t, 100, &[("web".to_owned(), Some(Millis::parse(q).unwrap()))]);
    assert_eq!(r("100m").unwrap()[0].size, Size::Millicpus(100));
    assert_eq!(r("1").unwrap()[0].size, Size::Millicpus(1000), "100m rounded up books a whole CPU");
    assert_eq!(r("1000m").unwrap()[0].size, Size::Millicpus(1000));
    let e = r("1500m").unwrap_err();
    assert!(e.to_string().contains("1500m asked, its capacity is 1"), "{e}");
}
