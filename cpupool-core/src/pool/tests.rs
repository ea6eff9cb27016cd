//! Pool names, specs and resolution.

use super::*;

fn name(s: &str) -> PoolName {
    PoolName::new(s).unwrap_or_else(|e| panic!("{e}"))
}
fn set(s: &str) -> CpuSet {
    CpuSet::parse(s).unwrap_or_else(|e| panic!("{e}"))
}
fn list(n: &str, kind: PoolKind, cpus: &str) -> PoolSpec {
    PoolSpec::new(name(n), kind, CpuSource::List(set(cpus)))
}
fn count(n: &str, kind: PoolKind, count: u32, numa: Option<u32>) -> PoolSpec {
    PoolSpec::new(name(n), kind, CpuSource::Request { count, numa })
}
fn cpus_of(pools: &[Pool], n: &str) -> CpuSet {
    pools.iter().find(|p| p.name.as_str() == n).map(|p| p.cpus.clone()).unwrap_or_default()
}

/// Creating or resizing a count pool leaves the other count pools' CPUs where they are; a
/// fresh resolution would move the shared pool (the new pool sorts before it).
#[test]
fn count_pools_keep_their_cpus() {
    let t = Topology::synthetic(2, 8, 2, 2);
    let mut specs = vec![
        count("reserved", PoolKind::Reserved, 2, None),
        PoolSpec { smt: Smt::FullCores, ..count("dp", PoolKind::Exclusive, 14, Some(1)) },
        count("web", PoolKind::Shared, 8, None),
    ];
    let before = resolve(&specs, &t).unwrap_or_else(|e| panic!("{e}"));
    let now: BTreeMap<PoolName, CpuSet> = before.iter().map(|p| (p.name.clone(), p.cpus.clone())).collect();
    specs.push(PoolSpec { smt: Smt::FullCores, ..count("batch", PoolKind::Exclusive, 4, Some(0)) });
    let after = resolve_keeping(&specs, &t, &now).unwrap_or_else(|e| panic!("{e}"));
    for p in ["dp", "web"] {
        assert_eq!(cpus_of(&after, p), now[&name(p)], "{p} moved");
    }
    // The reserved pool gives up unclaimed CPUs, and keeps its own two.
    let reserved = cpus_of(&after, "reserved");
    assert!(reserved.is_subset(&now[&name("reserved")]), "{reserved}");
    let own = CpuSet::parse("0,16").unwrap_or_else(|e| panic!("{e}"));
    assert!(own.is_subset(&reserved) && now[&name("reserved")].len() > 2, "{reserved}");
    let batch = cpus_of(&after, "batch");
    assert_eq!(batch.len(), 4);
    assert!(batch.is_subset(&t.nodes()[&0]), "{batch}");
    let fresh = resolve(&specs, &t).unwrap_or_else(|e| panic!("{e}"));
    assert_ne!(cpus_of(&fresh, "web"), now[&name("web")], "the case must be one a fresh resolution moves");

    // Shrinking stays within the pool's CPUs, growing keeps them all.
    let now: BTreeMap<PoolName, CpuSet> = after.iter().map(|p| (p.name.clone(), p.cpus.clone())).collect();
    specs[2] = count("web", PoolKind::Shared, 6, None);
    let shrunk = resolve_keeping(&specs, &t, &now).unwrap_or_else(|e| panic!("{e}"));
    assert!(cpus_of(&shrunk, "web").is_subset(&now[&name("web")]));
    assert_eq!(cpus_of(&shrunk, "batch"), now[&name("batch")]);
    specs[2] = count("web", PoolKind::Shared, 10, None);
    let grown = resolve_keeping(&specs, &t, &now).unwrap_or_else(|e| panic!("{e}"));
    assert!(now[&name("web")].is_subset(&cpus_of(&grown, "web")));
    assert_eq!(cpus_of(&grown, "web").len(), 10);
    assert_eq!(cpus_of(&grown, "dp"), now[&name("dp")]);
}

#[test]
fn names() {
    assert!(PoolName::new("dp_1").is_ok());
    assert!(PoolName::new(&"a".repeat(32)).is_ok());
    for bad in ["", "Dp", "a-b", "a.b", "a/b", "ä", "_a", "a_", "_", &"a".repeat(33)] {
        assert!(matches!(PoolName::new(bad), Err(PoolError::InvalidName { .. })), "{bad}");
    }
}

#[test]
fn explicit_lists_and_leftovers_join_reserved() {
    let t = Topology::synthetic(1, 4, 1, 1);
    let pools = resolve(&[list("sys", PoolKind::Reserved, "0"), list("dp", PoolKind::Exclusive, "2-3")], &t)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(cpus_of(&pools, "sys"), set("0-1"));
    assert_eq!(cpus_of(&pools, "dp"), set("2-3"));
}

#[test]
fn counted_pools_pack_whole_cores_on_the_asked_node() {
    let t = Topology::synthetic(2, 8, 2, 2);
    let mut dp = count("dp", PoolKind::Exclusive, 4, Some(1));
    dp.isolate = true;
    let pools = resolve(
        &[count("sys", PoolKind::Reserved, 2, None), dp, count("web", PoolKind::Shared, 3, None)],
        &t,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    // The request took core 0; the leftovers joined it.
    assert!(set("0,16").is_subset(&cpus_of(&pools, "sys")));
    let dp = cpus_of(&pools, "dp");
    assert_eq!(dp.len(), 4);
    assert!(t.is_whole_cores(&dp));
    assert!(dp.is_subset(&t.nodes()[&1]));
    assert_eq!(cpus_of(&pools, "web").len(), 3);
    let all = pools.iter().fold(CpuSet::new(), |a, p| a.union(&p.cpus));
    assert_eq!(all, t.online());
}

#[test]
fn every_validation_error() {
    let t = Topology::synthetic(1, 4, 2, 1);
    let r = |specs: &[PoolSpec]| resolve(specs, &t).err();
    let sys = || list("sys", PoolKind::Reserved, "0,4");
    assert_eq!(r(&[sys(), sys()]), Some(PoolError::Duplicate(name("sys"))));
    assert_eq!(r(&[list("x", PoolKind::Shared, "1")]), Some(PoolError::NoReserved));
    assert_eq!(
        r(&[sys(), list("r2", PoolKind::Reserved, "1")]),
        Some(PoolError::TwoReserved(name("sys"), name("r2")))
    );
    assert_eq!(
        r(&[sys(), list("a", PoolKind::Shared, "1-2"), list("b", PoolKind::Shared, "2-3")]),
        Some(PoolError::Overlap { a: name("a"), b: name("b"), cpus: set("2") })
    );
    assert_eq!(
        r(&[sys(), list("a", PoolKind::Shared, "6-9")]),
        Some(PoolError::NotOnline { pool: name("a"), cpus: set("8-9") })
    );
    assert_eq!(
        r(&[sys(), list("a", PoolKind::Exclusive, "1-2")]),
        Some(PoolError::PartialCores { pool: name("a"), cpus: set("1-2") })
    );
    let mut shared_isolated = list("a", PoolKind::Shared, "1");
    shared_isolated.isolate = true;
    assert_eq!(r(&[sys(), shared_isolated]), Some(PoolError::IsolateNotExclusive(name("a"))));
    let mut reserved_dra = sys();
    reserved_dra.dra = true;
    assert_eq!(r(&[reserved_dra]), Some(PoolError::DraNotOffered(name("sys"))));
    let mut hidden_dra = list("a", PoolKind::Shared, "1");
    (hidden_dra.kubelet, hidden_dra.dra) = (false, true);
    assert_eq!(r(&[sys(), hidden_dra]), Some(PoolError::DraNotOffered(name("a"))));
    assert_eq!(
        r(&[sys(), PoolSpec::new(name("a"), PoolKind::Shared, CpuSource::Isolcpus)]),
        Some(PoolError::IsolcpusNotExclusive(name("a")))
    );
    assert_eq!(
        r(&[sys(), PoolSpec::new(name("a"), PoolKind::Exclusive, CpuSource::Isolcpus)]),
        Some(PoolError::IsolcpusEmpty(name("a")))
    );
    assert_eq!(r(&[sys(), list("a", PoolKind::Shared, "")]), Some(PoolError::Empty(name("a"))));
    assert_eq!(r(&[sys(), count("a", PoolKind::Shared, 0, None)]), Some(PoolError::ZeroCount(name("a"))));
    assert_eq!(
        r(&[sys(), count("a", PoolKind::Shared, 1, Some(3))]),
        Some(PoolError::UnknownNode { pool: name("a"), node: 3, nodes: set("0") })
    );
    assert_eq!(
        r(&[sys(), count("a", PoolKind::Shared, 7, None)]),
        Some(PoolError::NotEnoughCpus { pool: name("a"), requested: 7, available: 6, where_: String::new() })
    );
    assert_eq!(
        r(&[sys(), count("a", PoolKind::Exclusive, 3, None)]),
        Some(PoolError::CountNotWholeCores { pool: name("a"), requested: 3 })
    );
    assert_eq!(
        r(&[list("sys", PoolKind::Reserved, "0-7"), list("a", PoolKind::Shared, "1")]),
        Some(PoolError::Overlap { a: name("sys"), b: name("a"), cpus: set("1") })
    );
    // Every online CPU taken by other pools: the reserved pool ends up empty.
    let t1 = Topology::synthetic(1, 1, 1, 1);
    assert_eq!(
        resolve(&[count("sys", PoolKind::Reserved, 1, None), list("a", PoolKind::Shared, "0")], &t1).err(),
        Some(PoolError::NotEnoughCpus {
            pool: name("sys"),
            requested: 1,
            available: 0,
            where_: String::new()
        })
    );
}

#[test]
fn isolcpus_pool_takes_kernel_isolated_cpus_and_requests_avoid_them() {
    let mut data = Topology::synthetic(1, 4, 1, 1).data().clone();
    data.isolated = set("2-3");
    let t = Topology::new(data);
    let pools = resolve(
        &[
            count("sys", PoolKind::Reserved, 1, None),
            PoolSpec::new(name("iso"), PoolKind::Exclusive, CpuSource::Isolcpus),
            count("web", PoolKind::Shared, 1, None),
        ],
        &t,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(cpus_of(&pools, "iso"), set("2-3"));
    assert_eq!(cpus_of(&pools, "sys"), set("0"));
    assert_eq!(cpus_of(&pools, "web"), set("1"));
}
