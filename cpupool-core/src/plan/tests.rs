use proptest::prelude::*;

use super::*;
use crate::pool::{Pool, Smt};
use crate::state::{AssignSpec, AssignmentId, Size};

fn set(s: &str) -> CpuSet {
    CpuSet::parse(s).unwrap_or_else(|e| panic!("{e}"))
}
fn cg(s: &str) -> Key {
    Key::Cgroup(CgroupPath::new(s).unwrap_or_else(|e| panic!("{e}")))
}
fn place(cpus: &str, role: Role) -> Placement {
    Placement::new(set(cpus), set("0"), role)
}

/// Replays `effects` from `before`, checking after every step that no two conflicting
/// placements overlap and that children stay inside their parents; returns the final sets.
fn replay(before: &Layout, after: &Layout, effects: &[Effect]) -> Result<BTreeMap<Key, CpuSet>, String> {
    let mut cur: BTreeMap<Key, CpuSet> = before.iter().map(|(k, p)| (k.clone(), p.cpus.clone())).collect();
    // A placement keeps its old role until it is first written.
    let mut roles: BTreeMap<Key, Role> = before.iter().map(|(k, p)| (k.clone(), p.role.clone())).collect();
    for (i, e) in effects.iter().enumerate() {
        match e {
            Effect::CreateCgroup(p) => {
                cur.insert(Key::Cgroup(p.clone()), CpuSet::new());
            }
            Effect::RemoveCgroup(p) => {
                cur.remove(&Key::Cgroup(p.clone()));
            }
            Effect::SetCpus { key, cpus, .. } => {
                if cpus.is_empty() && !after.contains_key(key) {
                    cur.remove(key);
                } else {
                    cur.insert(key.clone(), cpus.clone());
                    if let Some(p) = after.get(key) {
                        roles.insert(key.clone(), p.role.clone());
                    }
                }
            }
            _ => {}
        }
        for (a, ca) in &cur {
            for (b, cb) in &cur {
                let (Some(ra), Some(rb)) = (roles.get(a), roles.get(b)) else { continue };
                if a < b && ra.conflicts(rb) && !ca.is_disjoint(cb) {
                    return Err(format!("after effect {i} ({e:?}): {a} {ca} overlaps {b} {cb}"));
                }
            }
        }
    }
    Ok(cur)
}

fn check(before: &Layout, after: &Layout) -> Vec<Effect> {
    let effects = plan(before, after);
    let fin = replay(before, after, &effects).unwrap_or_else(|e| panic!("{e}\n{effects:#?}"));
    let want: BTreeMap<Key, CpuSet> = after.iter().map(|(k, p)| (k.clone(), p.cpus.clone())).collect();
    assert_eq!(fin, want, "{effects:#?}");
    effects
}

#[test]
fn shrink_before_grow_on_resize() {
    let before = Layout::from([
        (cg("cpupool.slice"), place("0-3", Role::Parent)),
        (cg("cpupool.slice/cpupool-a.slice"), place("0-1", Role::Pool(PoolKind::Exclusive))),
        (cg("cpupool.slice/cpupool-b.slice"), place("2-3", Role::Pool(PoolKind::Exclusive))),
    ]);
    let mut after = before.clone();
    after.insert(cg("cpupool.slice/cpupool-a.slice"), place("0-2", Role::Pool(PoolKind::Exclusive)));
    after.insert(cg("cpupool.slice/cpupool-b.slice"), place("3", Role::Pool(PoolKind::Exclusive)));
    let effects = check(&before, &after);
    assert_eq!(
        effects,
        vec![
            Effect::SetCpus { key: cg("cpupool.slice/cpupool-b.slice"), cpus: set("3"), optional: false },
            Effect::SetCpus { key: cg("cpupool.slice/cpupool-a.slice"), cpus: set("0-2"), optional: false },
        ]
    );
}

#[test]
fn swap_breaks_the_cycle_by_emptying_one_set() {
    let before = Layout::from([
        (cg("p/a"), place("1", Role::Pool(PoolKind::Exclusive))),
        (cg("p/b"), place("2", Role::Pool(PoolKind::Exclusive))),
    ]);
    let after = Layout::from([
        (cg("p/a"), place("2", Role::Pool(PoolKind::Exclusive))),
        (cg("p/b"), place("1", Role::Pool(PoolKind::Exclusive))),
    ]);
    let effects = check(&before, &after);
    assert_eq!(effects.len(), 3);
}

#[test]
fn new_pool_slices_are_created_parent_first_and_released_targets_cleared() {
    let before = Layout::from([(cg("x/ctr"), place("2", Role::Exclusive))]);
    let after = Layout::from([
        (cg("cpupool.slice"), place("0-3", Role::Parent)),
        (cg("cpupool.slice/cpupool-a.slice"), place("2-3", Role::Pool(PoolKind::Exclusive))),
        (Key::Pid(9), place("2", Role::Exclusive)),
    ]);
    let effects = check(&before, &after);
    assert_eq!(
        effects[0],
        Effect::CreateCgroup(CgroupPath::new("cpupool.slice").unwrap_or_else(|e| panic!("{e}")))
    );
    assert_eq!(effects[2], Effect::SetCpus { key: cg("x/ctr"), cpus: CpuSet::new(), optional: true });
    let pid_at = effects.iter().position(|e| matches!(e, Effect::SetCpus { key: Key::Pid(9), .. }));
    assert!(pid_at > Some(2), "{effects:#?}");
    let last_mems = effects.iter().rposition(|e| matches!(e, Effect::SetMems { .. }));
    assert_eq!(last_mems, Some(effects.len() - 1));
}

/// Where the kernel has `cpuset.cpus.exclusive`, a container holding CPUs of an isolated pool
/// is an isolated partition of its own and its CPUs leave the pool's (an allocation's at once);
/// another container's coming and going leaves a standing container partition alone; without
/// partitions at all nothing is one.
#[test]
fn containers_of_isolated_pools_are_partitions_of_their_own() {
    let t = Topology::synthetic(1, 6, 1, 1);
    let n = |s: &str| PoolName::new(s).unwrap_or_else(|e| panic!("{e}"));
    let pool = |name: &str, kind, cpus: &str, isolate| Pool {
        name: n(name),
        kind,
        cpus: set(cpus),
        smt: Smt::Threads,
        isolate,
        kubelet: true,
        enforce_quota: false,
        dra: false,
    };
    let mut s = State::with_pools(vec![
        pool("sys", PoolKind::Reserved, "0-1", false),
        pool("dp", PoolKind::Exclusive, "2", false),
        pool("iso", PoolKind::Exclusive, "3-5", true),
    ]);
    let opts = LayoutOptions { partitions: Partitions::Containers, ..LayoutOptions::default() };
    let assign = |s: &mut State, target: &str| {
        let target = Target::parse(target).unwrap_or_else(|e| panic!("{e}"));
        s.assign(&t, &AssignSpec::new("iso", target, Size::Cpus(1), None))
            .unwrap_or_else(|e| panic!("{e}"))
            .into_inner()
    };
    let idle = layout(&s, &t, &opts);
    assert_eq!(idle[&cg("cpupool.slice")].partition, Partition::Parent(set("3-5")));
    // An allocation whose container is not known yet: its CPU leaves the pool's partition.
    let held = assign(&mut s, "kubelet:iso-3");
    let l = layout(&s, &t, &opts);
    assert_eq!(l[&cg("cpupool.slice")].partition, Partition::Parent(set("4-5")));
    assert_eq!(l[&cg("cpupool.slice/cpupool-iso.slice")].partition, Partition::Isolated(set("4-5")));
    // Its container: a partition of its own.
    let ctr = "kubepods.slice/kubepods-podA.slice/cri-containerd-a.scope";
    s.retarget(
        held.id.as_str(),
        Target::parse(&format!("cgroup:{ctr}")).unwrap_or_else(|e| panic!("{e}")),
        None,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let one = layout(&s, &t, &opts);
    assert_eq!(one[&cg(ctr)].partition, Partition::Isolated(set("3")));
    // A unit in the pool's slice stays in the pool's partition.
    let unit = assign(&mut s, "unit:cpupool-iso-x.slice");
    let two = layout(&s, &t, &opts);
    assert_eq!(two[&cg("cpupool.slice/cpupool-iso.slice")].partition, Partition::Isolated(set("4-5")));
    assert_eq!(two[&Key::Unit("cpupool-iso-x.slice".into())].partition, Partition::Member);
    // A second container: the pool's partition shrinks, the first container's is not torn.
    let other = "kubepods.slice/kubepods-podB.slice/cri-containerd-b.scope";
    assign(&mut s, &format!("cgroup:{other}"));
    let three = layout(&s, &t, &opts);
    let effects = check(&two, &three);
    let parts: Vec<&Effect> = effects.iter().filter(|e| matches!(e, Effect::SetPartition { .. })).collect();
    assert!(
        !parts.iter().any(|e| matches!(e, Effect::SetPartition { path, .. } if path.as_str() == ctr)),
        "{parts:#?}"
    );
    assert!(
        matches!(parts.last(), Some(Effect::SetPartition { path, partition: Partition::Isolated(c) }) if path.as_str() == other && c.len() == 1),
        "{parts:#?}"
    );
    let k = kept(&two, &three);
    assert_eq!(k[&cg(ctr)].partition, Partition::Isolated(set("3")));
    // The pool's partition is gone when containers hold all its CPUs.
    s.release(unit.id.as_str()).unwrap_or_else(|e| panic!("{e}"));
    assign(&mut s, "cgroup:kubepods.slice/kubepods-podC.slice/cri-containerd-c.scope");
    let full = layout(&s, &t, &opts);
    assert_eq!(full[&cg("cpupool.slice/cpupool-iso.slice")].partition, Partition::Member);
    assert!(
        !full.contains_key(&cg("cpupool.slice")) || full[&cg("cpupool.slice")].partition == Partition::Member
    );
    // Without partitions, nothing is one; with pools' partitions, no container is.
    let off = layout(&s, &t, &LayoutOptions { partitions: Partitions::Off, ..opts.clone() });
    assert!(off.values().all(|p| p.partition == Partition::Member), "{off:#?}");
    let pools = layout(&s, &t, &LayoutOptions { partitions: Partitions::Pools, ..opts.clone() });
    assert_eq!(pools[&cg("cpupool.slice/cpupool-iso.slice")].partition, Partition::Isolated(set("3-5")));
    assert_eq!(pools[&cg(ctr)].partition, Partition::Member);
}

#[test]
fn layout_from_state() {
    let t = Topology::synthetic(1, 4, 1, 1);
    let n = |s: &str| PoolName::new(s).unwrap_or_else(|e| panic!("{e}"));
    let mut s = State::with_pools(vec![
        Pool {
            name: n("sys"),
            kind: PoolKind::Reserved,
            cpus: set("0"),
            smt: Smt::Threads,
            isolate: false,
            kubelet: false,
            enforce_quota: false,
            dra: false,
        },
        Pool {
            name: n("dp"),
            kind: PoolKind::Exclusive,
            cpus: set("2-3"),
            smt: Smt::Threads,
            isolate: true,
            kubelet: true,
            enforce_quota: false,
            dra: false,
        },
        Pool {
            name: n("web"),
            kind: PoolKind::Shared,
            cpus: set("1"),
            smt: Smt::Threads,
            isolate: false,
            kubelet: true,
            enforce_quota: false,
            dra: false,
        },
    ]);
    let target = Target::parse("cgroup:k/ctr").unwrap_or_else(|e| panic!("{e}"));
    s.assign(&t, &AssignSpec::new("dp", target, Size::Cpus(1), None)).unwrap_or_else(|e| panic!("{e}"));
    let opts = LayoutOptions {
        host_cgroups: vec![CgroupPath::new("system.slice").unwrap_or_else(|e| panic!("{e}"))],
        lend_idle: false,
        unpooled: BTreeSet::new(),
        partitions: Partitions::Pools,
    };
    let l = layout(&s, &t, &opts);
    // The reserved pool's slices are the host ones: cpupool.slice holds the other pools.
    assert_eq!(l[&cg("cpupool.slice")].cpus, set("1-3"));
    assert_eq!(l[&cg("cpupool.slice")].partition, Partition::Parent(set("2-3")));
    assert_eq!(l[&cg("cpupool.slice/cpupool-dp.slice")].partition, Partition::Isolated(set("2-3")));
    assert!(!l.contains_key(&cg("cpupool.slice/cpupool-sys.slice")));
    assert_eq!(l[&cg("cpupool.slice/cpupool-dp.slice")].cpus, set("2-3"));
    assert_eq!(l[&cg("system.slice")].cpus, set("0"));
    assert_eq!(l[&cg("system.slice")].role, Role::Host);
    assert_eq!(l[&cg("k/ctr")].cpus, set("2"));
    assert_eq!(l.len(), 5);
    let up = check(&Layout::new(), &l);
    // Partitions come last, the parent's grant before the isolated pool.
    let parts: Vec<&Effect> = up.iter().filter(|e| matches!(e, Effect::SetPartition { .. })).collect();
    assert_eq!(parts.len(), 2, "{up:#?}");
    assert!(matches!(parts[0], Effect::SetPartition { partition: Partition::Parent(_), .. }));
    assert!(matches!(up.last(), Some(Effect::SetPartition { partition: Partition::Isolated(_), .. })));
    let down = check(&l, &Layout::new());
    // Torn down first, innermost first.
    assert!(
        matches!(&down[..2], [Effect::SetPartition { partition: Partition::Member, path: a }, Effect::SetPartition { partition: Partition::Member, path: b }] if a.as_str().ends_with("dp.slice") && b.as_str() == "cpupool.slice"),
        "{down:#?}"
    );

    // Lending: system.slice also gets the idle exclusive CPUs of pools that do not isolate,
    // and gives one back before an assignment takes it.
    let mut s2 = s.clone();
    let mut pools: Vec<Pool> = s2.pools().values().cloned().collect();
    for p in &mut pools {
        p.isolate = false;
    }
    s2.set_pools(pools).unwrap_or_else(|e| panic!("{e:?}"));
    let lend = LayoutOptions { lend_idle: true, ..opts.clone() };
    let before = layout(&s2, &t, &lend);
    assert_eq!(before[&cg("system.slice")].cpus, set("0,3"));
    let idle = s2.clone();
    let target = Target::parse("cgroup:k/ctr2").unwrap_or_else(|e| panic!("{e}"));
    s2.assign(&t, &AssignSpec::new("dp", target, Size::Cpus(1), None)).unwrap_or_else(|e| panic!("{e}"));
    let after = layout(&s2, &t, &lend);
    assert_eq!(after[&cg("system.slice")].cpus, set("0"));
    let effects = check(&before, &after);
    let shrink =
        effects.iter().position(|e| matches!(e, Effect::SetCpus { key, .. } if *key == cg("system.slice")));
    let grow = effects.iter().position(|e| matches!(e, Effect::SetCpus { key, .. } if *key == cg("k/ctr2")));
    assert!(shrink < grow, "{effects:#?}");

    // A container using no pool stays off the exclusive pool (2-3) and shares the reserved and
    // shared CPUs; lending adds the idle exclusive ones, which it gives back before an
    // assignment takes them.
    let side = CgroupPath::new("k/side").unwrap_or_else(|e| panic!("{e}"));
    let confine = LayoutOptions { unpooled: BTreeSet::from([side.clone()]), ..opts.clone() };
    let l = layout(&s, &t, &confine);
    assert_eq!(l[&Key::Cgroup(side.clone())].cpus, set("0-1"));
    assert_eq!(l[&Key::Cgroup(side.clone())].role, Role::Unpooled);
    check(&layout(&s, &t, &opts), &l);
    let lend = LayoutOptions { lend_idle: true, ..confine };
    let before = layout(&idle, &t, &lend);
    assert_eq!(before[&Key::Cgroup(side.clone())].cpus, set("0-1,3"));
    let after = layout(&s2, &t, &lend);
    assert_eq!(after[&Key::Cgroup(side.clone())].cpus, set("0-1"));
    let effects = check(&before, &after);
    let shrink = effects
        .iter()
        .position(|e| matches!(e, Effect::SetCpus { key, .. } if *key == Key::Cgroup(side.clone())));
    let grow = effects.iter().position(|e| matches!(e, Effect::SetCpus { key, .. } if *key == cg("k/ctr2")));
    assert!(shrink < grow, "{effects:#?}");
}

fn roles() -> impl Strategy<Value = Role> {
    prop_oneof![
        Just(Role::Pool(PoolKind::Exclusive)),
        Just(Role::Pool(PoolKind::Shared)),
        Just(Role::Host),
        Just(Role::Unpooled),
        Just(Role::Exclusive),
        Just(Role::Shared),
    ]
}

/// A random valid layout: placements of conflicting roles never overlap.
fn layout_strategy() -> impl Strategy<Value = Layout> {
    proptest::collection::vec((0u32..6, roles(), proptest::collection::btree_set(0u32..16, 1..5)), 0..8)
        .prop_map(|items| {
            let mut l = Layout::new();
            for (i, role, cpus) in items {
                let cpus: CpuSet = cpus.into_iter().collect();
                // Only assignments target processes; pool and host placements are cgroups.
                let assignment = matches!(role, Role::Exclusive | Role::Shared);
                let key = if i % 3 == 0 && assignment { Key::Pid(i + 1) } else { cg(&format!("g/c{i}")) };
                let clash =
                    l.iter().any(|(k, p)| *k != key && p.role.conflicts(&role) && !p.cpus.is_disjoint(&cpus));
                if !clash {
                    l.insert(key, Placement::new(cpus, set("0"), role));
                }
            }
            l
        })
}

/// `after` with the pid placements of `before` and no others. Pid placements cannot be emptied
/// mid-way, and in the daemon an exclusive assignment's CPUs never change: pids stay stable
/// across a change, as the engine keeps them.
fn with_stable_pids(before: &Layout, mut after: Layout) -> Layout {
    after.retain(|k, _| !matches!(k, Key::Pid(_)));
    for (k, p) in before {
        if matches!(k, Key::Pid(_)) {
            let clash = after.iter().any(|(_, q)| q.role.conflicts(&p.role) && !q.cpus.is_disjoint(&p.cpus));
            if !clash {
                after.insert(k.clone(), p.clone());
            }
        }
    }
    after
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn plans_never_overlap_midway_and_reach_the_target(before in layout_strategy(), after in layout_strategy()) {
        let after = with_stable_pids(&before, after);
        let effects = plan(&before, &after);
        let fin = replay(&before, &after, &effects).map_err(TestCaseError::fail)?;
        let want: BTreeMap<Key, CpuSet> = after.iter().map(|(k, p)| (k.clone(), p.cpus.clone())).collect();
        prop_assert_eq!(fin, want);
        // A plan from a layout to itself does nothing.
        prop_assert!(plan(&after, &after).is_empty());
    }

    #[test]
    fn kept_then_after_never_overlaps_and_only_gives_what_both_sides_name(
        before in layout_strategy(),
        after in layout_strategy(),
    ) {
        let after = with_stable_pids(&before, after);
        let mid = kept(&before, &after);
        // The first half (run before the save) gives nothing: every set it leaves is part of
        // what it had, and only what `after` also names is left.
        for (k, p) in &mid {
            prop_assert!(after.contains_key(k));
            prop_assert!(p.cpus.is_subset(&before[k].cpus));
        }
        let first = plan(&before, &mid);
        let at_mid = replay(&before, &mid, &first).map_err(TestCaseError::fail)?;
        let want_mid: BTreeMap<Key, CpuSet> = mid.iter().map(|(k, p)| (k.clone(), p.cpus.clone())).collect();
        prop_assert_eq!(at_mid, want_mid);
        let second = plan(&mid, &after);
        let fin = replay(&mid, &after, &second).map_err(TestCaseError::fail)?;
        let want: BTreeMap<Key, CpuSet> = after.iter().map(|(k, p)| (k.clone(), p.cpus.clone())).collect();
        prop_assert_eq!(fin, want);
    }
}

#[test]
fn kept_drops_released_targets_and_leaves_new_ones_for_after_the_save() {
    let mut before = Layout::new();
    before.insert(cg("a"), place("1-2", Role::Exclusive));
    before.insert(cg("b"), place("3", Role::Exclusive));
    before.insert(cg("w"), place("4-7", Role::Shared));
    let mut after = Layout::new();
    after.insert(cg("b"), place("3", Role::Exclusive));
    after.insert(cg("c"), place("1", Role::Exclusive));
    after.insert(cg("w"), place("5-8", Role::Shared));
    let mid = kept(&before, &after);
    assert_eq!(mid.keys().cloned().collect::<Vec<_>>(), vec![cg("b"), cg("w")]);
    assert_eq!(mid[&cg("w")].cpus, set("5-7"));
    let first = plan(&before, &mid);
    assert!(first
        .iter()
        .any(|e| matches!(e, Effect::SetCpus { key, cpus, .. } if *key == cg("a") && cpus.is_empty())));
    assert!(!first.iter().any(|e| matches!(e, Effect::SetCpus { key, .. } if *key == cg("c"))));
}

/// A shrinking isolated pool: its partition is torn down before the save and set up on the
/// new CPUs after it, never set up on CPUs it is about to lose.
#[test]
fn kept_tears_partitions_down_before_the_save() {
    let mut before = Layout::new();
    let mut top = place("2-3", Role::Parent);
    top.partition = Partition::Parent(set("2-3"));
    let mut dp = place("2-3", Role::Pool(PoolKind::Exclusive));
    dp.partition = Partition::Isolated(set("2-3"));
    before.insert(cg("cpupool.slice"), top);
    before.insert(cg("cpupool.slice/cpupool-dp.slice"), dp);
    let mut after = before.clone();
    for p in after.values_mut() {
        p.cpus = set("3");
        p.partition = match p.partition {
            Partition::Parent(_) => Partition::Parent(set("3")),
            _ => Partition::Isolated(set("3")),
        };
    }
    let k = kept(&before, &after);
    assert!(k.values().all(|p| p.partition == Partition::Member), "{k:?}");
    let first = plan(&before, &k);
    assert!(
        first.iter().all(|e| !matches!(
            e,
            Effect::SetPartition { partition: Partition::Isolated(_) | Partition::Parent(_), .. }
        )),
        "{first:#?}"
    );
    let second = plan(&k, &after);
    assert_eq!(
        second.last(),
        Some(&Effect::SetPartition {
            path: CgroupPath::new("cpupool.slice/cpupool-dp.slice").unwrap_or_else(|e| panic!("{e}")),
            partition: Partition::Isolated(set("3"))
        })
    );
    // Without a partition change, kept keeps them (no churn).
    assert_eq!(kept(&before, &before), before);
}

mod reference;

#[test]
fn every_role_has_its_own_place_in_the_holders_index() {
    for (i, r) in ROLES.iter().enumerate() {
        assert_eq!(role_index(r), i, "{r:?}");
    }
}

/// A random layout that may break the layout's rules (conflicting sets overlapping), as a
/// reconcile observes a host someone else changed.
fn any_layout() -> impl Strategy<Value = Layout> {
    proptest::collection::vec((0u32..8, roles(), proptest::collection::btree_set(0u32..12, 0..5)), 0..10)
        .prop_map(|items| {
            items
                .into_iter()
                .map(|(i, role, cpus)| {
                    // Nested paths, so that children wait for their parents.
                    let key =
                        if i % 4 == 3 { cg(&format!("g/c{}/n{i}", i - 1)) } else { cg(&format!("g/c{i}")) };
                    (key, Placement::new(cpus.into_iter().collect(), set("0"), role))
                })
                .collect()
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    /// The grow phase asks an index who holds which CPU instead of walking every placement at
    /// every step (quadratic when thousands of sets grow at once); it plans the very same effects
    /// in the same order as the walk did, so every ordering guarantee carries over.
    #[test]
    fn the_indexed_planner_plans_what_the_walking_one_did(
        valid in (layout_strategy(), layout_strategy()),
        any in (any_layout(), any_layout()),
    ) {
        for (before, after) in [(valid.0.clone(), with_stable_pids(&valid.0, valid.1)), any] {
            prop_assert_eq!(plan(&before, &after), reference::plan(&before, &after));
            let mid = kept(&before, &after);
            prop_assert_eq!(plan(&before, &mid), reference::plan(&before, &mid));
            prop_assert_eq!(plan(&mid, &after), reference::plan(&mid, &after));
        }
    }
}

/// Pools on a 2×4×2 host: the reserved one, a shared one (quota enforced or not), and two
/// exclusive ones, one isolated or not.
fn pools(isolate: bool, quota: bool) -> Vec<Pool> {
    let n = |s: &str| PoolName::new(s).unwrap_or_else(|e| panic!("{e}"));
    let pool = |name: &str, kind, cpus: &str, isolate, enforce_quota| Pool {
        name: n(name),
        kind,
        cpus: set(cpus),
        smt: Smt::Threads,
        isolate,
        kubelet: false,
        enforce_quota,
        dra: false,
    };
    vec![
        pool("sys", PoolKind::Reserved, "0,8", false, false),
        pool("web", PoolKind::Shared, "1-2,9-10", false, quota),
        pool("dp", PoolKind::Exclusive, "3-5,11-13", false, false),
        pool("rt", PoolKind::Exclusive, "6-7,14-15", isolate, false),
    ]
}

/// Targets, some nested in others (the core books them; the engine's admission would refuse
/// the nesting, but the planner must not rely on that).
const TARGETS: [&str; 12] = [
    "cgroup:k",
    "cgroup:system.slice",
    "cgroup:k/a",
    "cgroup:k/a/b",
    "cgroup:k/c",
    "cgroup:cpupool.slice/cpupool-dp.slice/x",
    "cgroup:system.slice/app",
    "cgroup:side",
    "unit:app.service",
    "unit:cpupool-web-w.slice",
    "pid:41",
    "pid:42",
];

#[derive(Debug, Clone)]
enum Op {
    Assign { pool: usize, target: usize, size: u32, id: usize },
    Release(usize),
    Retarget(usize, usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0usize..3, 0..TARGETS.len(), 1u32..3, 0usize..8)
            .prop_map(|(pool, target, size, id)| Op::Assign { pool, target, size, id }),
        1 => (0usize..8).prop_map(Op::Release),
        1 => (0usize..8, 0..TARGETS.len()).prop_map(|(id, t)| Op::Retarget(id, t)),
    ]
}

/// Runs `ops` on `s`, ignoring refusals (a refused mutation leaves the state as it was).
fn run(s: &mut State, topo: &Topology, ops: &[Op]) {
    let target = |i: usize| Target::parse(TARGETS[i]).unwrap_or_else(|e| panic!("{e}"));
    for op in ops {
        match op {
            Op::Assign { pool, target: t, size, id } => {
                let (pool, size) = match pool {
                    0 => ("web", Size::Millicpus(u64::from(*size) * 300)),
                    1 => ("dp", Size::Cpus(*size)),
                    _ => ("rt", Size::Cpus(1)),
                };
                let id = AssignmentId::new(&format!("a{id}")).ok();
                let _ = s.assign(topo, &AssignSpec::new(pool, target(*t), size, id));
            }
            Op::Release(id) => {
                let _ = s.release(&format!("a{id}"));
            }
            Op::Retarget(id, t) => {
                let _ = s.retarget(&format!("a{id}"), target(*t), None);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    /// A mutation plans over the placements it touches only ([`partial_layouts`]): for random
    /// states and random groups of mutations, the effects planned between the partial layouts
    /// before and after are exactly those planned between the whole layouts, for the two halves
    /// the engine runs around its save ([`kept`]) as for the whole change, and replayed on the
    /// whole layout before they give the whole layout after, never overlapping on the way.
    #[test]
    fn planning_what_a_mutation_touches_plans_what_planning_everything_does(
        isolate in any::<bool>(),
        quota in any::<bool>(),
        lend_idle in any::<bool>(),
        host in any::<bool>(),
        unpooled in any::<bool>(),
        containers in any::<bool>(),
        setup in proptest::collection::vec(op(), 0..12),
        group in proptest::collection::vec(op(), 1..4),
    ) {
        let topo = Topology::synthetic(2, 4, 2, 2);
        let path = |p: &str| CgroupPath::new(p).unwrap_or_else(|e| panic!("{e}"));
        let opts = LayoutOptions {
            host_cgroups: if host { vec![path("system.slice")] } else { Vec::new() },
            lend_idle,
            unpooled: if unpooled { BTreeSet::from([path("side"), path("k/u")]) } else { BTreeSet::new() },
            partitions: if containers { Partitions::Containers } else { Partitions::Pools },
        };
        let mut before = State::with_pools(pools(isolate, quota));
        run(&mut before, &topo, &setup);
        before.take_changes();
        let mut after = before.clone();
        run(&mut after, &topo, &group);
        let ids = after.changes().assignments.clone();

        let (fb, fa) = (layout(&before, &topo, &opts), layout(&after, &topo, &opts));
        let (pb, pa) = partial_layouts(&before, &after, &topo, &opts, &ids);
        // What the partial layouts hold, they hold as the whole ones do.
        for (k, p) in pb.iter() {
            prop_assert_eq!(Some(p), fb.get(k));
        }
        for (k, p) in pa.iter() {
            prop_assert_eq!(Some(p), fa.get(k));
        }
        let effects = plan(&pb, &pa);
        prop_assert_eq!(&effects, &plan(&fb, &fa));
        let (kp, kf) = (kept(&pb, &pa), kept(&fb, &fa));
        prop_assert_eq!(plan(&pb, &kp), plan(&fb, &kf));
        prop_assert_eq!(plan(&kp, &pa), plan(&kf, &fa));
        // The commit's layouts, without the pool level when the change cannot touch it, plan
        // the same.
        let (mb, ma) = mutation_layouts(&before, &after, &topo, &opts, &ids);
        for (k, p) in mb.iter() {
            prop_assert_eq!(Some(p), fb.get(k));
        }
        for (k, p) in ma.iter() {
            prop_assert_eq!(Some(p), fa.get(k));
        }
        prop_assert_eq!(&plan(&mb, &ma), &effects);
        let km = kept(&mb, &ma);
        prop_assert_eq!(plan(&mb, &km), plan(&fb, &kf));
        prop_assert_eq!(plan(&km, &ma), plan(&kf, &fa));
        let fin = replay(&fb, &fa, &effects).map_err(TestCaseError::fail)?;
        // A target may want CPUs an enclosing placement lacks (in another pool's slice, or in
        // another target), which no plan reaches; the engine's admission refuses such targets.
        let outside = fa.iter().any(|(k, p)| match k {
            Key::Cgroup(path) => path
                .ancestors()
                .into_iter()
                .any(|up| fa.get(&Key::Cgroup(up)).is_some_and(|u| !p.cpus.is_subset(&u.cpus))),
            _ => false,
        });
        if !outside {
            let want: BTreeMap<Key, CpuSet> = fa.iter().map(|(k, p)| (k.clone(), p.cpus.clone())).collect();
            prop_assert_eq!(fin, want);
        }
    }
}

/// A commit of an assignment whose target lies outside every pool-level cgroup plans over that
/// target alone; one inside `cpupool.slice`, or with idle CPUs lent and an exclusive pool
/// touched, plans over the pool level too.
#[test]
fn a_commit_plans_over_the_pool_level_only_when_it_can_touch_it() {
    let topo = Topology::synthetic(2, 4, 2, 2);
    let path = |p: &str| CgroupPath::new(p).unwrap_or_else(|e| panic!("{e}"));
    let opts = |lend_idle| LayoutOptions {
        host_cgroups: vec![path("system.slice")],
        lend_idle,
        unpooled: BTreeSet::from([path("k/u")]),
        partitions: Partitions::Pools,
    };
    let before = State::with_pools(pools(false, false));
    let commit = |pool: &str, target: &str, size: Size, lend_idle: bool| {
        let mut after = before.clone();
        let spec = AssignSpec::new(pool, Target::parse(target).unwrap_or_else(|e| panic!("{e}")), size, None);
        after.assign(&topo, &spec).unwrap_or_else(|e| panic!("{e}"));
        let ids = after.changes().assignments.clone();
        let (b, a) = mutation_layouts(&before, &after, &topo, &opts(lend_idle), &ids);
        let frame = |l: &Layout| l.contains_key(&Key::Cgroup(path(TOP_SLICE)));
        assert_eq!(frame(&b), frame(&a));
        (frame(&a), a.len())
    };
    let web = || Size::Millicpus(300);
    assert_eq!(commit("web", "cgroup:k/c", web(), false), (false, 1));
    assert_eq!(commit("web", "pid:41", web(), true), (false, 1));
    assert_eq!(commit("dp", "cgroup:k/c", Size::Cpus(1), false), (false, 1));
    // Inside cpupool.slice, at or above an unpooled container, below a host cgroup.
    assert!(commit("web", "cgroup:cpupool.slice/cpupool-web.slice/x", web(), false).0);
    assert!(commit("web", "cgroup:k", web(), false).0);
    assert!(commit("web", "cgroup:k/u/x", web(), false).0);
    assert!(commit("web", "cgroup:system.slice/app", web(), false).0);
    // Lending: an exclusive assignment moves what the host cgroups borrow.
    assert!(commit("dp", "cgroup:k/c", Size::Cpus(1), true).0);
}
