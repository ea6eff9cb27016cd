use std::sync::Arc;

use super::*;
use crate::core::pool::Smt;
use crate::core::state::{AssignSpec, Container, State};
use crate::core::topology::Topology;
use crate::engine::KubeletView;

fn cpus(s: &str) -> CpuSet {
    CpuSet::parse(s).unwrap_or_else(|e| panic!("{e}"))
}

fn id(s: &str) -> AssignmentId {
    AssignmentId::new(s).unwrap_or_else(|e| panic!("{e}"))
}

fn cgroup(p: &str) -> CgroupPath {
    CgroupPath::new(p).unwrap_or_else(|e| panic!("{e}"))
}

fn name(s: &str) -> PoolName {
    PoolName::new(s).unwrap_or_else(|e| panic!("{e}"))
}

fn pool(n: &str, kind: PoolKind, set: &str) -> Pool {
    Pool {
        name: name(n),
        kind,
        cpus: cpus(set),
        smt: Smt::Threads,
        isolate: false,
        kubelet: true,
        enforce_quota: false,
        dra: false,
    }
}

/// A 16-CPU host (2 NUMA nodes: 0-7, 8-15): `dp` exclusive 2-5 for the device plugin, `web`
/// shared 6-7 for it too, `fast` exclusive isolated 8-11 served by DRA, `mine` exclusive 12-13
/// offered to no kubelet server.
fn host() -> (State, Topology) {
    let fast = Pool { isolate: true, dra: true, ..pool("fast", PoolKind::Exclusive, "8-11") };
    let mine = Pool { kubelet: false, ..pool("mine", PoolKind::Exclusive, "12-13") };
    let pools =
        vec![pool("dp", PoolKind::Exclusive, "2-5"), pool("web", PoolKind::Shared, "6-7"), fast, mine];
    (State::with_pools(pools), Topology::synthetic(1, 16, 1, 2))
}

fn snapshot(state: State, topo: Topology, kubelet: KubeletView) -> Snapshot {
    Snapshot {
        state: Arc::new(state),
        topology: Arc::new(topo),
        state_path: "/nonexistent/state.json".into(),
        config_error: None,
        degraded: Vec::new(),
        state_warnings: Arc::default(),
        partitions: Arc::default(),
        backend: "cgroupfs",
        layout: Arc::default(),
        assignment_health: Arc::default(),
        kubelet: Arc::new(kubelet),
        reports: Arc::default(),
    }
}

fn assign(state: &mut State, topo: &Topology, spec: AssignSpec) -> Assignment {
    state.assign(topo, &spec).unwrap_or_else(|e| panic!("{e}")).into_inner()
}

#[test]
fn a_containers_devices_decide_its_cpus_and_none_gets_the_unpooled_ones() {
    let (mut state, topo) = host();
    let empty = snapshot(state.clone(), topo.clone(), KubeletView::default());
    let devices = |snap: &Snapshot| -> Vec<String> {
        snap.device_list(&name("dp"), 1000).into_iter().map(|d| d.id).take(2).collect()
    };
    let two = devices(&empty);
    assert_eq!(two.len(), 2, "{two:?}");
    // No devices: the CPUs no exclusive pool holds.
    let unpooled = empty.unpooled_cpus();
    assert_eq!(unpooled, cpus("0-1,6-7,14-15"));
    assert_eq!(empty.exclusive_cpus(), cpus("2-5,8-13"));
    assert_eq!(
        empty.container_decision(None, 1000),
        Ok(Decision::Unpooled { mems: empty.mems_of(&unpooled), cpus: unpooled })
    );
    // Devices of a pool not booked (released when the previous container stopped): held again.
    let Ok(Decision::Rebook(spec)) = empty.container_decision(Some(("dp", &two)), 1000) else {
        panic!("not a rebook")
    };
    // Booked: its CPUs, and their NUMA node.
    let a = assign(&mut state, &topo, spec);
    let booked = snapshot(state, topo, KubeletView::default());
    assert_eq!(
        booked.container_decision(Some(("dp", &two)), 1000),
        Ok(Decision::Pooled { id: a.id.clone(), cpus: a.cpus.clone(), mems: cpus("0") })
    );
    // Devices of no pool, or of one that has no such devices: refused, naming them.
    let none = booked.container_decision(Some(("gone", &two)), 1000);
    assert_eq!(none, Err(HeldError::NoPool("gone".into())));
    assert_eq!(none.map_err(|e| e.to_string()), Err("it holds devices of `gone`, which is no pool".into()));
    let bad = booked.container_decision(Some(("dp", &["core-99".to_owned()])), 1000);
    assert!(matches!(&bad, Err(HeldError::Refused(r)) if r.to_string().contains("core-99")), "{bad:?}");
}

#[test]
fn offered_pools_are_each_servers_own_and_their_unusable_cpus_are_named() {
    let (state, topo) = host();
    let all = snapshot(state.clone(), topo.clone(), KubeletView::default());
    let names = |s: Server| all.offered(s).map(|p| p.name.to_string()).collect::<Vec<_>>();
    assert_eq!(names(Server::DevicePlugin), ["dp", "web"]);
    assert_eq!(names(Server::Dra), ["fast"]);
    assert!(all.device_pool(&name("dp")).is_some());
    assert!(all.device_pool(&name("fast")).is_none() && all.device_pool(&name("mine")).is_none());
    assert!(all.device_list(&name("mine"), 1000).is_empty());

    // The static CPU manager may hand out 4-15: dp's 4-5 and web's 6-7, not fast's or mine's.
    let overlap = all.offered_in(Server::DevicePlugin, &cpus("4-15"));
    assert_eq!(overlap, Overlap { cpus: cpus("4-7"), pools: vec![name("dp"), name("web")] });
    assert_eq!(overlap.names(), "dp, web");
    assert_eq!(all.offered_unusable(Server::DevicePlugin), Overlap::default());

    // CPU 3 offline and the pod cgroup without 7: their devices are unusable.
    let view = KubeletView {
        online: Some(cpus("0-2,4-15")),
        pod_cpus: Some(cpus("0-6,8-15")),
        ..Default::default()
    };
    let some = snapshot(state, topo, view);
    assert_eq!(some.online(), cpus("0-2,4-15"));
    let lacking = some.offered_unusable(Server::DevicePlugin);
    assert_eq!(lacking, Overlap { cpus: cpus("3,7"), pools: vec![name("dp"), name("web")] });
    assert_eq!(some.offered_unusable(Server::Dra), Overlap::default());
}

#[test]
fn kubelet_assignments_are_found_by_their_cgroup_and_orphans_by_theirs() {
    let (mut state, topo) = host();
    let (a, b) = (cgroup("kubepods.slice/a.scope"), cgroup("kubepods.slice/b.scope"));
    let spec = |n: &str, target: Target| AssignSpec::new("dp", target, Size::Cpus(1), Some(id(n)));
    assign(&mut state, &topo, spec("kubelet-core-2", Target::Cgroup(a.clone())));
    assign(&mut state, &topo, spec("kubelet-core-3", Target::Kubelet("kubelet-core-3".into())));
    // Bound to a cgroup, but not the kubelet's: never an orphan.
    assign(&mut state, &topo, spec("mine", Target::Cgroup(b.clone())));
    let snap = snapshot(state, topo, KubeletView::default());
    let ids = |v: Vec<AssignmentId>| v.iter().map(|i| i.to_string()).collect::<Vec<_>>();
    assert_eq!(snap.kubelet_assignments().count(), 2);
    assert_eq!(snap.kubelet_bound_to(&a), Some(id("kubelet-core-2")));
    assert_eq!(snap.kubelet_bound_to(&b), None);
    assert_eq!(ids(snap.kubelet_orphans(|p| *p == b)), ["kubelet-core-2"]);
    assert!(snap.kubelet_orphans(|p| *p == a).is_empty());
    assert!(snap.holds("mine") && !snap.holds("kubelet-core-9"));
}

#[test]
fn only_freed_kubelet_assignments_in_the_way_of_an_allocation_go() {
    let (mut state, topo) = host();
    let empty = snapshot(state.clone(), topo.clone(), KubeletView::default());
    let dp = pool("dp", PoolKind::Exclusive, "2-5");
    let ids: Vec<String> = empty.device_list(&dp.name, 1000).into_iter().map(|d| d.id).collect();
    let one = |i: usize| vec![ids[i].clone()];
    let allocs = empty
        .device_allocations(&dp, 1000, [one(0).as_slice(), one(1).as_slice()].into_iter())
        .unwrap_or_else(|e| panic!("{e}"));
    let made: Vec<Assignment> = allocs.iter().map(|al| assign(&mut state, &topo, al.spec.clone())).collect();
    let snap = snapshot(state, topo, KubeletView::default());
    // Asked again as they are: the same assignments answer.
    assert_eq!(snap.answering(&allocs[0]).map(|a| &a.id), Some(&made[0].id));
    // An allocation of the first's devices: the first is in the way unless a container holds
    // it, or the request keeps it; the second is not in the way.
    let asked = [&allocs[0]];
    assert_eq!(snap.freed_in_the_way(&dp, &asked, &[], |_| false), vec![made[0].id.clone()]);
    assert!(snap.freed_in_the_way(&dp, &asked, &[], |_| true).is_empty());
    assert!(snap.freed_in_the_way(&dp, &asked, &[&made[0].id], |_| false).is_empty());
    // Too many containers in one request: refused before any is decoded.
    let many = vec![(ids.as_slice(), &[][..], 1); devices::MAX_CONTAINER_REQUESTS + 1];
    assert!(snap.preferred_devices(&dp, 1000, many.into_iter()).is_err());
    let preferred = snap.preferred_devices(&dp, 1000, [(ids.as_slice(), &[][..], 2)].into_iter());
    assert_eq!(preferred.map(|p| p[0].len()), Ok(2));
}

#[test]
fn a_claims_devices_book_its_pools_and_its_assignments_are_found_by_name() {
    let (mut state, topo) = host();
    let snap = snapshot(state.clone(), topo.clone(), KubeletView::default());
    let devices = snap.dra_devices(1000);
    assert!(!devices.is_empty() && devices.iter().all(|d| d.pool == name("fast")), "{devices:?}");
    let first = devices[0].name.clone();
    let wanted = snap.dra_wanted(&[(first.clone(), None)], 1000).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(wanted.len(), 1);
    assert_eq!((wanted[0].device.as_str(), &wanted[0].pool), (first.as_str(), &name("fast")));
    // Exclusive: from the device's NUMA node.
    assert_eq!(wanted[0].within, Some(cpus("8-11")));
    assert!(snap.dra_wanted(&[("no-such-device".into(), None)], 1000).is_err());

    let uid = "0b5c1c2e-3f4a-4b6c-8d9e-0f1a2b3c4d5e";
    let n = |i: usize| id(&crate::core::dra::names::assignment_name(uid, i));
    let spec = AssignSpec::new("fast", Target::Kubelet(n(0).to_string()), Size::Cpus(1), Some(n(0)));
    let held = assign(&mut state, &topo, spec);
    let snap = snapshot(state, topo, KubeletView::default());
    assert_eq!(snap.claim_assignment_ids(uid), vec![n(0)]);
    assert_eq!(snap.booked_claims().into_iter().collect::<Vec<_>>(), [uid]);
    let both = [n(0), n(1)];
    assert_eq!(snap.claim_assignments(&both[..1]).map(|v| v[0].cpus.clone()), Ok(held.cpus));
    assert_eq!(snap.claim_assignments(&both).err(), Some(&n(1)));
    assert!(snap.any_isolated(&both));
}

#[test]
fn only_claim_assignments_bound_to_a_gone_container_are_held_again() {
    let (gone, alive) = (cgroup("kubepods.slice/a.scope"), cgroup("kubepods.slice/b.scope"));
    let owner = Container { namespace: "default".into(), pod: "p".into(), name: "a".into() };
    let a = |n: &str, target: Target| Assignment {
        id: id(n),
        pool: name("dp"),
        kind: PoolKind::Exclusive,
        target,
        cpus: cpus("1"),
        millicpus: 1000,
        reclaim: false,
        process_start: None,
        container: Some(owner.clone()),
    };
    let is_gone = |p: &CgroupPath| *p == gone;
    assert!(bound_to_gone(&a("dra-u1-0", Target::Cgroup(gone.clone())), &is_gone));
    // Bound to a live container, held for none, or no claim's: left alone.
    assert!(!bound_to_gone(&a("dra-u1-0", Target::Cgroup(alive.clone())), &is_gone));
    assert!(!bound_to_gone(&a("dra-u1-0", Target::Kubelet("dra-u1-0".into())), &is_gone));
    assert!(!bound_to_gone(&a("kubelet-core-1", Target::Cgroup(gone.clone())), &is_gone));
    let made_by_hand =
        Assignment { reclaim: true, container: None, ..a("dra-x", Target::Cgroup(gone.clone())) };
    assert!(!bound_to_gone(&made_by_hand, &is_gone));
}

fn held_(i: &str, set: &str) -> (AssignmentId, CpuSet) {
    (id(i), cpus(set))
}

#[test]
fn only_the_pods_a_claim_is_reserved_for_get_its_cpus() {
    let rec = PreparedClaim {
        uid: "u1".into(),
        namespace: "team".into(),
        name: "c".into(),
        assignments: vec![held_("dra-u1-0", "1").0, held_("dra-u1-1", "9").0],
        pods: vec!["pod-a".into(), "pod-b".into()],
        devices: vec![],
    };
    let all: std::collections::BTreeMap<_, _> =
        [held_("dra-u1-0", "1"), held_("dra-u1-1", "9")].into_iter().collect();
    let all = |id: &AssignmentId| all.get(id).cloned();
    let both = ClaimFor::Held(ClaimHeld {
        name: "team/c".into(),
        ids: rec.assignments.clone(),
        cpus: CpuSet::parse("1,9").unwrap_or_else(|e| panic!("{e}")),
    });
    // Two pods share the claim; each gets all of its CPUs.
    assert_eq!(decide(Some(&rec), "u1", "pod-a", all), both);
    assert_eq!(decide(Some(&rec), "u1", "pod-b", all), both);
    // Another pod naming it in its environment gets nothing.
    let other = decide(Some(&rec), "u1", "pod-x", all);
    assert!(
        matches!(&other, ClaimFor::Refused(w) if w.contains("not reserved for its pod pod-x")),
        "{other:?}"
    );
    // A claim not prepared here.
    assert!(matches!(decide(None, "u9", "pod-a", all), ClaimFor::Refused(_)));
    // CPUs released behind the claim's back: the container is not created.
    let some: std::collections::BTreeMap<_, _> = [held_("dra-u1-0", "1")].into_iter().collect();
    let some = |id: &AssignmentId| some.get(id).cloned();
    assert!(matches!(decide(Some(&rec), "u1", "pod-a", some), ClaimFor::Lost(w) if w.contains("dra-u1-1")));
}
