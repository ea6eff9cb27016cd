use proptest::prelude::*;

use super::*;
use crate::pool::{resolve, CpuSource, PoolSpec, Smt};

fn set(s: &str) -> CpuSet {
    CpuSet::parse(s).unwrap_or_else(|e| panic!("{e}"))
}

fn pool(name: &str, kind: PoolKind, cpus: &str, smt: Smt) -> Pool {
    Pool {
        name: PoolName::new(name).unwrap_or_else(|e| panic!("{e}")),
        kind,
        cpus: set(cpus),
        smt,
        isolate: false,
        kubelet: true,
        enforce_quota: false,
        dra: false,
    }
}

fn spec(pool: &str, target: &str, size: Size, id: Option<&str>) -> AssignSpec {
    AssignSpec::new(
        pool,
        Target::parse(target).unwrap_or_else(|e| panic!("{e}")),
        size,
        id.map(|i| AssignmentId::new(i).unwrap_or_else(|e| panic!("{e}"))),
    )
}

/// 1 socket, 4 cores, SMT-2: CPU c and c+4 are siblings.
fn fixture() -> (Topology, State) {
    let t = Topology::synthetic(1, 4, 2, 1);
    let s = State::with_pools(vec![
        pool("sys", PoolKind::Reserved, "0,4", Smt::Threads),
        pool("dp", PoolKind::Exclusive, "1-2,5-6", Smt::FullCores),
        pool("web", PoolKind::Shared, "3,7", Smt::Threads),
    ]);
    (t, s)
}

#[test]
fn exclusive_assign_takes_whole_cores_and_release_restores() {
    let (t, mut s) = fixture();
    let before = s.clone();
    let a = s.assign(&t, &spec("dp", "cgroup:a", Size::Cpus(2), Some("x"))).unwrap_or_else(|e| panic!("{e}"));
    assert!(a.changed());
    let a = a.into_inner();
    assert_eq!(a.cpus, set("1,5"));
    assert_eq!(a.millicpus, 2000);
    let dp = s.pools()[&a.pool].clone();
    assert_eq!(s.free_cpus(&dp), set("2,6"));
    let released = s.release("x").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(released, a);
    assert_eq!(s, before);
}

#[test]
fn within_keeps_a_picked_assignment_among_the_cpus_given() {
    // dp is 1-2,5-6 in whole cores (1+5, 2+6): within 2,6 there is one core.
    let (t, mut s) = fixture();
    let within = |cpus: &str, id: &str, n: u32| AssignSpec {
        within: Some(set(cpus)),
        ..spec("dp", &format!("cgroup:{id}"), Size::Cpus(n), Some(id))
    };
    let a = s.assign(&t, &within("2,6", "a", 2)).unwrap_or_else(|e| panic!("{e}")).into_inner();
    assert_eq!(a.cpus, set("2,6"));
    // Nothing free is left within 2,6, though the pool has 1,5.
    assert!(matches!(s.assign(&t, &within("2,6", "b", 2)), Err(Error::InsufficientCapacity { .. })));
    // Journals written before `within` load without it.
    let old = r#"{"pool":"dp","target":"cgroup:a","size":{"cpus":2},"id":null,"reclaim":true,"process_start":null}"#;
    let spec: AssignSpec = serde_json::from_str(old).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(spec.within, None);
}

#[test]
fn idempotent_repeat_and_conflicts() {
    let (t, mut s) = fixture();
    let first = s.assign(&t, &spec("dp", "cgroup:a", Size::Cpus(2), Some("x")));
    let again = s.assign(&t, &spec("dp", "cgroup:a", Size::Cpus(2), Some("x")));
    assert_eq!(
        again,
        Ok(Outcome::Identity(first.map(Outcome::into_inner).unwrap_or_else(|e| panic!("{e}"))))
    );
    let snapshot = s.clone();
    assert_eq!(
        s.assign(&t, &spec("dp", "cgroup:a", Size::Cpus(4), Some("x"))),
        Err(Error::DuplicateId { id: "x".into() })
    );
    assert_eq!(
        s.assign(&t, &spec("dp", "cgroup:a", Size::Cpus(2), Some("y"))),
        Err(Error::TargetBusy { target: "cgroup:a".into(), id: "x".into(), pool: "dp".into() })
    );
    // Asked from another pool, the error names the pool of the assignment that holds the target.
    let busy = s.assign(&t, &spec("web", "cgroup:a", Size::Millicpus(100), None));
    assert_eq!(busy, Err(Error::TargetBusy { target: "cgroup:a".into(), id: "x".into(), pool: "dp".into() }));
    assert_eq!(
        busy.err().map(|e| e.to_string()).as_deref(),
        Some("target `cgroup:a` already holds assignment `x` from pool `dp`; release it first")
    );
    assert_eq!(s, snapshot);
}

#[test]
fn exact_cpus_for_the_kubelet_then_retarget() {
    let (t, mut s) = fixture();
    let a = s
        .assign(&t, &spec("dp", "kubelet:core-2", Size::Cpuset(set("2,6")), Some("kubelet-core-2")))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(a.changed());
    assert_eq!(a.into_inner().cpus, set("2,6"));
    let again = s.assign(&t, &spec("dp", "kubelet:core-2", Size::Cpuset(set("2,6")), Some("kubelet-core-2")));
    assert!(matches!(again, Ok(Outcome::Identity(_))));
    let before = s.clone();
    let arg = |r: Result<Outcome<Assignment>, Error>| match r {
        Err(Error::InvalidArgument { arg, reason }) => format!("{arg}: {reason}"),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        arg(s.assign(&t, &spec("dp", "kubelet:cpu-6", Size::Cpuset(set("6")), None))),
        "cpus: CPUs 6 are held by assignment `kubelet-core-2`"
    );
    assert_eq!(
        arg(s.assign(&t, &spec("dp", "kubelet:cpu-3", Size::Cpuset(set("3")), None))),
        "cpus: CPUs 3 are not in pool `dp`"
    );
    assert!(arg(s.assign(&t, &spec("web", "kubelet:x", Size::Cpuset(set("3")), None))).starts_with("cpus:"));
    assert_eq!(
        s.assign(&t, &spec("dp", "kubelet:cpu-1", Size::Cpuset(set("1")), None)),
        Err(Error::NotWholeCores { pool: "dp".into(), requested: 1 })
    );
    assert_eq!(s, before);

    let target = Target::parse("cgroup:kubepods/pod1/ctr").unwrap_or_else(|e| panic!("{e}"));
    let ctr = || Some(Container { namespace: "ns".into(), pod: "p".into(), name: "c".into() });
    let moved = s.retarget("kubelet-core-2", target.clone(), None).unwrap_or_else(|e| panic!("{e}"));
    assert!(moved.changed());
    assert_eq!(moved.into_inner().cpus, set("2,6"));
    assert!(matches!(s.retarget("kubelet-core-2", target.clone(), None), Ok(Outcome::Identity(_))));
    // Learning the container is a change of its own; the same again is not.
    let named = s.retarget("kubelet-core-2", target.clone(), ctr()).unwrap_or_else(|e| panic!("{e}"));
    assert!(named.changed());
    assert_eq!(named.into_inner().container.map(|c| c.to_string()).as_deref(), Some("ns/p/c"));
    assert!(matches!(s.retarget("kubelet-core-2", target.clone(), ctr()), Ok(Outcome::Identity(_))));
    s.assign(&t, &spec("web", "cgroup:other", Size::Millicpus(10), Some("w")))
        .unwrap_or_else(|e| panic!("{e}"));
    let before = s.clone();
    assert_eq!(
        s.retarget("w", target, None),
        Err(Error::TargetBusy {
            target: "cgroup:kubepods/pod1/ctr".into(),
            id: "kubelet-core-2".into(),
            pool: "dp".into()
        })
    );
    assert_eq!(s.retarget("nope", Target::Pid(1), None), Err(Error::NoSuchAssignment { id: "nope".into() }));
    assert_eq!(s, before);
}

#[test]
fn every_assign_error_leaves_state_unchanged() {
    let (t, mut s) = fixture();
    let snapshot = s.clone();
    let cases = [
        (spec("nope", "pid:1", Size::Cpus(1), None), "NoSuchPool"),
        (spec("NOPE!", "pid:1", Size::Cpus(1), None), "NoSuchPool"),
        (spec("sys", "pid:1", Size::Cpus(1), None), "ReservedPool"),
        (spec("dp", "pid:1", Size::Cpus(6), None), "InsufficientCapacity"),
        (spec("dp", "pid:1", Size::Cpus(1), None), "NotWholeCores"),
        (spec("dp", "pid:1", Size::Cpus(0), None), "InvalidArgument"),
        (spec("dp", "pid:1", Size::Millicpus(1500), None), "InvalidArgument"),
        (spec("web", "pid:1", Size::Millicpus(2001), None), "InsufficientCapacity"),
        (spec("web", "pid:1", Size::Millicpus(0), None), "InvalidArgument"),
    ];
    for (sp, want) in cases {
        let err = s.assign(&t, &sp).err().unwrap_or_else(|| panic!("{sp:?} succeeded"));
        let got = format!("{err:?}");
        assert!(got.starts_with(want), "{sp:?}: {got}");
        assert_eq!(s, snapshot);
    }
    assert_eq!(s.release("nope"), Err(Error::NoSuchAssignment { id: "nope".into() }));
    assert_eq!(s.release("../x"), Err(Error::NoSuchAssignment { id: "../x".into() }));
    assert_eq!(s, snapshot);
    let msg = s
        .assign(&t, &spec("web", "pid:1", Size::Millicpus(2001), None))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert_eq!(msg, "pool `web` has 2000 millicpus free, 2001 requested");
}

#[test]
fn shared_pool_counts_millicpus_and_gives_the_whole_pool() {
    let (t, mut s) = fixture();
    let a = s.assign(&t, &spec("web", "pid:7", Size::Millicpus(1500), None)).map(Outcome::into_inner);
    let a = a.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(a.cpus, set("3,7"));
    assert_eq!(a.id.as_str(), "a1");
    let b = s.assign(&t, &spec("web", "pid:8", Size::Cpus(1), None));
    assert!(matches!(b, Err(Error::InsufficientCapacity { free: 500, requested: 1000, .. })));
    let b = s.assign(&t, &spec("web", "pid:8", Size::Millicpus(500), None)).map(Outcome::into_inner);
    assert_eq!(b.map(|b| b.id.to_string()), Ok("a2".to_string()));
    assert_eq!(s.free_millis(&s.pools()[&a.pool].clone()), 0);
}

#[test]
fn target_parsing() {
    assert_eq!(Target::parse("unit:foo.service"), Ok(Target::Unit("foo.service".into())));
    assert_eq!(Target::parse("unit:getty@tty1.service"), Ok(Target::Unit("getty@tty1.service".into())));
    assert_eq!(Target::parse("unit:a.b.slice"), Ok(Target::Unit("a.b.slice".into())));
    assert_eq!(Target::parse("pid:42"), Ok(Target::Pid(42)));
    assert_eq!(Target::parse("kubelet:cpu-3"), Ok(Target::Kubelet("cpu-3".into())));
    assert_eq!(Target::Kubelet("cpu-3".into()).to_string(), "kubelet:cpu-3");
    assert!(Target::parse("kubelet:").is_err());
    assert!(Target::parse("kubelet:a/b").is_err());
    assert_eq!(Target::parse("cgroup:a/b/"), Ok(Target::Cgroup(CgroupPath("a/b".into()))));
    for bad in [
        "cgroup:../../etc",
        "cgroup:a/../../etc",
        "cgroup:/etc",
        "cgroup:",
        "cgroup:a//b",
        "cgroup:./a",
        "cgroup:a\0b",
        "pid:0",
        "pid:-1",
        "pid:99999999999",
        "unit:",
        "unit:foo",
        "unit:a/b.service",
        "unit:..",
        "unit:.service",
        "unit:...service",
        "unit:x.",
        "unit:x.frobnicator",
        "unit:../../etc/passwd",
        "host:x",
        "nothing",
    ] {
        assert!(matches!(Target::parse(bad), Err(Error::InvalidArgument { arg: "target", .. })), "{bad}");
    }
    let p = CgroupPath::new("a/b/c").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(p.ancestors().iter().map(|p| p.as_str()).collect::<Vec<_>>(), vec!["a", "a/b"]);
    assert_eq!(p.depth(), 3);
    assert!(AssignmentId::new(&"x".repeat(129)).is_err());
    assert!(AssignmentId::new("a b").is_err());
}

#[test]
fn set_pools_refuses_to_strand_assignments() {
    let (t, mut s) = fixture();
    s.assign(&t, &spec("dp", "cgroup:a", Size::Cpus(2), Some("x"))).unwrap_or_else(|e| panic!("{e}"));
    s.assign(&t, &spec("web", "pid:3", Size::Millicpus(1500), Some("w"))).unwrap_or_else(|e| panic!("{e}"));
    let snapshot = s.clone();
    // dp shrinks away from the assigned core 1,5: refused.
    let shrunk = vec![
        pool("sys", PoolKind::Reserved, "0-1,4-5", Smt::Threads),
        pool("dp", PoolKind::Exclusive, "2,6", Smt::FullCores),
        pool("web", PoolKind::Shared, "3,7", Smt::Threads),
    ];
    let err = s.set_pools(shrunk).err().unwrap_or_default();
    assert_eq!(err.len(), 1);
    assert!(err[0].to_string().contains("no longer contains its CPUs 1,5"), "{}", err[0]);
    // web shrinks below what is held: refused.
    let err = s
        .set_pools(vec![
            pool("sys", PoolKind::Reserved, "0,4,7", Smt::Threads),
            pool("dp", PoolKind::Exclusive, "1-2,5-6", Smt::FullCores),
            pool("web", PoolKind::Shared, "3", Smt::Threads),
        ])
        .err()
        .unwrap_or_default();
    assert_eq!(err.len(), 1, "{err:?}");
    assert_eq!(s, snapshot);
    // Taking free CPUs from dp and growing web is fine; web's assignment follows the pool.
    s.set_pools(vec![
        pool("sys", PoolKind::Reserved, "0,4", Smt::Threads),
        pool("dp", PoolKind::Exclusive, "1,5", Smt::FullCores),
        pool("web", PoolKind::Shared, "2-3,6-7", Smt::Threads),
    ])
    .unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(
        s.assignments()[&AssignmentId::new("w").unwrap_or_else(|e| panic!("{e}"))].cpus,
        set("2-3,6-7")
    );
}

#[test]
fn state_serde_round_trip_rebuilds_usage() {
    let (t, mut s) = fixture();
    s.assign(&t, &spec("dp", "cgroup:a", Size::Cpus(2), None)).unwrap_or_else(|e| panic!("{e}"));
    let json = serde_json::to_string(&s).unwrap_or_default();
    let back: State = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(back, s);
}

/// The fixture with `x` (dp 1,5), `y` (dp 2,6) and `w` (web, 1500 millicpus), valid.
fn assigned() -> State {
    let (t, mut s) = fixture();
    for sp in [
        spec("dp", "cgroup:x", Size::Cpuset(set("1,5")), Some("x")),
        spec("dp", "cgroup:y", Size::Cpuset(set("2,6")), Some("y")),
        spec("web", "cgroup:w", Size::Millicpus(1500), Some("w")),
    ] {
        s.assign(&t, &sp).unwrap_or_else(|e| panic!("{e}"));
    }
    s
}

fn a<'d>(d: &'d mut StateData, i: &str) -> &'d mut Assignment {
    d.assignments.get_mut(&id(i)).unwrap_or_else(|| panic!("{i}"))
}

fn id(s: &str) -> AssignmentId {
    AssignmentId::new(s).unwrap_or_else(|e| panic!("{e}"))
}

/// `assigned()` with `edit` made to its data behind the methods' back, as a hand edit would.
fn violations(edit: impl FnOnce(&mut StateData)) -> Vec<Violation> {
    let mut data = assigned().data().clone();
    edit(&mut data);
    data.validate().err().unwrap_or_default()
}

#[test]
fn validate_names_each_broken_rule_and_the_assignments() {
    assert_eq!(assigned().check(), Ok(()));
    assert_eq!(State::default().check(), Ok(()));
    let cases: Vec<(Vec<Violation>, &str)> = vec![
        (
            violations(|d| a(d, "y").cpus = set("1-2,5-6")),
            "assignment `y` owns 4 CPUs but counts 2000 millicpus; assignments `x` and `y` both own CPUs 1,5",
        ),
        (
            violations(|d| {
                a(d, "y").cpus = set("2-3");
            }),
            "assignment `y` holds CPUs 3, which its pool `dp` does not have",
        ),
        (
            violations(|d| a(d, "w").millicpus = 2001),
            "shared pool `web` has 2000 millicpus but its assignments `w` hold 2001",
        ),
        (
            violations(|d| a(d, "w").kind = PoolKind::Exclusive),
            "assignment `w` is exclusive but its pool `web` is shared; \
             assignment `w` owns 2 CPUs but counts 1500 millicpus",
        ),
        (
            violations(|d| a(d, "x").pool = PoolName::new("gone").unwrap_or_else(|e| panic!("{e}"))),
            "assignment `x` is from pool `gone`, which the state does not have",
        ),
        (
            violations(|d| {
                let x = a(d, "x");
                x.pool = PoolName::new("sys").unwrap_or_else(|e| panic!("{e}"));
                x.cpus = set("0,4");
            }),
            "assignment `x` is exclusive but its pool `sys` is reserved; \
             assignment `x` takes from the reserved pool `sys`",
        ),
        (
            violations(|d| {
                let x = a(d, "x");
                x.cpus = CpuSet::new();
                x.millicpus = 0;
            }),
            "assignment `x` holds no CPU or no capacity",
        ),
        (
            violations(|d| a(d, "y").target = Target::Cgroup(CgroupPath("x".into()))),
            "assignments `x` and `y` both apply to `cgroup:x`",
        ),
        (
            violations(|d| {
                let mut web = d.pools[&PoolName::new("web").unwrap_or_else(|e| panic!("{e}"))].clone();
                web.cpus = set("3,6-7");
                d.pools.insert(web.name.clone(), web);
            }),
            "pools `dp` and `web` both have CPUs 6",
        ),
        (
            violations(|d| {
                let w = d.assignments.remove(&id("w")).unwrap_or_else(|| panic!("w"));
                d.assignments.insert(id("v"), w);
            }),
            "the assignment filed as `v` has the id `w`",
        ),
    ];
    for (found, want) in cases {
        let text: Vec<String> = found.iter().map(ToString::to_string).collect();
        assert_eq!(text.join("; "), want);
    }
    // Two shared assignments over the top: both are named.
    let found = violations(|d| {
        let mut w2 = d.assignments[&id("w")].clone();
        w2.id = id("w2");
        w2.target = Target::Pid(7);
        d.assignments.insert(w2.id.clone(), w2);
    });
    assert_eq!(
        found,
        vec![Violation::Overcommitted {
            pool: PoolName::new("web").unwrap_or_else(|e| panic!("{e}")),
            capacity: 2000,
            held: 3000,
            ids: vec![id("w"), id("w2")],
        }]
    );
}

#[derive(Debug, Clone)]
enum Op {
    Assign { pool: usize, size: u32, millis: bool },
    Release { nth: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0usize..4, 0u32..6, any::<bool>()).prop_map(|(pool, size, millis)| Op::Assign {
            pool,
            size,
            millis
        }),
        (0usize..64).prop_map(|nth| Op::Release { nth }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Random topologies, pools and assign/release sequences: no CPU is owned twice, shared
    /// capacity is never exceeded, pools cover exactly the online CPUs, and a release restores
    /// the exact free set from before the matching assign.
    #[test]
    fn assign_release_invariants(
        sockets in 1u32..3, cores in 1u32..8, threads in 1u32..3, numa in 1u32..4,
        dp_count in 1u32..6, web_count in 1u32..4, full in any::<bool>(),
        ops in proptest::collection::vec(op(), 1..80),
    ) {
        let t = Topology::synthetic(sockets, cores, threads, numa);
        let n = |s: &str| PoolName::new(s).unwrap_or_else(|e| panic!("{e}"));
        let mut dp = PoolSpec::new(n("dp"), PoolKind::Exclusive, CpuSource::Request { count: dp_count * threads, numa: None });
        dp.smt = if full { Smt::FullCores } else { Smt::Threads };
        let specs = vec![
            PoolSpec::new(n("sys"), PoolKind::Reserved, CpuSource::Request { count: 1, numa: None }),
            dp,
            PoolSpec::new(n("web"), PoolKind::Shared, CpuSource::Request { count: web_count, numa: None }),
        ];
        let Ok(pools) = resolve(&specs, &t) else { return Ok(()) };
        let covered = pools.iter().fold(CpuSet::new(), |a, p| a.union(&p.cpus));
        prop_assert_eq!(covered, t.online());
        prop_assert_eq!(State::with_pools(pools.clone()).check(), Ok(()));
        let names = ["sys", "dp", "web", "missing"];
        let mut s = State::with_pools(pools);
        let mut history: Vec<(AssignmentId, State)> = Vec::new();
        for (i, op) in ops.into_iter().enumerate() {
            match op {
                Op::Assign { pool, size, millis } => {
                    let before = s.clone();
                    let size = if millis { Size::Millicpus(u64::from(size) * 250) } else { Size::Cpus(size) };
                    let sp = spec(names[pool], &format!("pid:{}", i + 1), size, None);
                    match s.assign(&t, &sp) {
                        Ok(out) => history.push((out.into_inner().id, before)),
                        Err(_) => prop_assert_eq!(&s, &before),
                    }
                }
                Op::Release { nth } => {
                    if history.is_empty() { continue; }
                    // Release the newest assignment: the state must equal the one before it
                    // was made, but for the id counter.
                    if nth % 2 == 0 {
                        let Some((id, before)) = history.pop() else { continue };
                        s.release(id.as_str()).map_err(|e| TestCaseError::fail(e.to_string()))?;
                        prop_assert_eq!(&s.data().assignments, &before.data().assignments);
                        for p in s.pools().values() {
                            prop_assert_eq!(s.free_cpus(p), before.free_cpus(p));
                            prop_assert_eq!(s.free_millis(p), before.free_millis(p));
                        }
                    } else {
                        let (id, _) = history.remove(nth % history.len());
                        s.release(id.as_str()).map_err(|e| TestCaseError::fail(e.to_string()))?;
                        // Older snapshots include the removed one: drop them all.
                        history.clear();
                    }
                }
            }
            // The rules a loaded state file is held to (no CPU owned twice, exclusive CPUs
            // inside their pool, shared capacity respected, ...), plus whole cores, which
            // depend on the topology.
            prop_assert_eq!(s.check(), Ok(()));
            for a in s.assignments().values() {
                let p = &s.pools()[&a.pool];
                if p.kind == PoolKind::Exclusive && p.smt == Smt::FullCores {
                    prop_assert!(t.is_whole_cores(&a.cpus));
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(100))]

    /// The journal's view: after any run of mutations, the delta of what they touched, applied
    /// to the state they started from, gives the same state, usage and target index; and the
    /// delta of the old state over the same changes takes it back.
    #[test]
    fn deltas_replay_and_undo(ops in proptest::collection::vec(op(), 1..60), group in 1usize..5) {
        let (t, mut s) = fixture();
        let names = ["sys", "dp", "web", "missing"];
        let mut replay = s.clone();
        let mut made: Vec<AssignmentId> = Vec::new();
        for (i, chunk) in ops.chunks(group).enumerate() {
            let before = s.clone();
            for (j, op) in chunk.iter().enumerate() {
                match op {
                    Op::Assign { pool, size, millis } => {
                        let size = if *millis { Size::Millicpus(u64::from(*size) * 250) } else { Size::Cpus(*size) };
                        let sp = spec(names[*pool], &format!("pid:{}", i * 10 + j + 1), size, None);
                        if let Ok(out) = s.assign(&t, &sp) {
                            made.push(out.into_inner().id);
                        }
                    }
                    Op::Release { nth } if !made.is_empty() && nth % 3 == 0 => {
                        let id = made.remove(nth % made.len());
                        s.release(id.as_str()).map_err(|e| TestCaseError::fail(e.to_string()))?;
                    }
                    Op::Release { nth } if !made.is_empty() => {
                        let id = &made[nth % made.len()];
                        let target = Target::parse(&format!("cgroup:moved/{nth}")).unwrap_or_else(|e| panic!("{e}"));
                        let _ = s.retarget(id.as_str(), target, None);
                    }
                    Op::Release { .. } => {}
                }
            }
            let changes = s.take_changes();
            let mut back = s.clone();
            back.apply(before.delta(&changes));
            prop_assert_eq!(&back, &before);
            replay.apply(s.delta(&changes));
            let _ = replay.take_changes();
            prop_assert_eq!(&replay, &s);
            for p in s.pools().values() {
                prop_assert_eq!(replay.free_cpus(p), s.free_cpus(p));
                prop_assert_eq!(replay.free_millis(p), s.free_millis(p));
                prop_assert_eq!(back.free_cpus(p), before.free_cpus(p));
                prop_assert_eq!(replay.usage(&p.name).count, s.usage(&p.name).count);
            }
            // The target index follows: a target held here is refused in the replay too.
            for a in s.assignments().values() {
                let again = spec("web", &a.target.to_string(), Size::Millicpus(1), Some("probe"));
                let refused = matches!(replay.clone().assign(&t, &again), Err(Error::TargetBusy { .. }));
                prop_assert!(refused);
            }
        }
    }
}

#[test]
fn a_reload_is_recorded_with_the_shared_assignments_it_moves() {
    let (t, mut s) = fixture();
    let a = s
        .assign(&t, &spec("web", "cgroup:w", Size::Millicpus(500), Some("w")))
        .unwrap_or_else(|e| panic!("{e}"));
    let _ = s.take_changes();
    let before = s.clone();
    s.set_pools(vec![
        pool("sys", PoolKind::Reserved, "0,4", Smt::Threads),
        pool("dp", PoolKind::Exclusive, "1,5", Smt::FullCores),
        pool("web", PoolKind::Shared, "2-3,6-7", Smt::Threads),
    ])
    .unwrap_or_else(|m| panic!("{m:?}"));
    let changes = s.take_changes();
    assert!(changes.pools);
    assert_eq!(changes.assignments, [a.into_inner().id].into_iter().collect());
    let mut replay = before.clone();
    replay.apply(s.delta(&changes));
    assert_eq!(replay, s);
    assert_eq!(replay.assignments()[&id("w")].cpus, set("2-3,6-7"));
    let delta = serde_json::to_string(&s.delta(&changes)).unwrap_or_else(|e| panic!("{e}"));
    let parsed: Delta = serde_json::from_str(&delta).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(parsed, s.delta(&changes));
}

#[test]
fn slice_units_map_to_systemds_cgroup_paths() {
    let path = |s: &str| slice_cgroup(s).map(|p| p.to_string());
    assert_eq!(path("system.slice").as_deref(), Some("system.slice"));
    assert_eq!(path("cpupool-dp.slice").as_deref(), Some("cpupool.slice/cpupool-dp.slice"));
    assert_eq!(path("a-b-c.slice").as_deref(), Some("a.slice/a-b.slice/a-b-c.slice"));
    assert_eq!(path("-.slice"), None);
    assert_eq!(path("app.service"), None);
}

/// Targets that would defeat the pools are refused before anything is booked.
#[test]
fn targets_that_defeat_the_pools_are_refused() {
    let t = |s: &str| Target::parse(s).unwrap_or_else(|e| panic!("{e}"));
    let host =
        vec![CgroupPath::new("kubepods.slice/kubepods-besteffort.slice").unwrap_or_else(|e| panic!("{e}"))];
    let refused = |target: &str, others: &[Assignment]| {
        matches!(check_target(&t(target), &host, others.iter()), Err(Error::TargetNotAllowed { .. }))
    };
    for target in [
        "cgroup:cpupool.slice",
        "cgroup:cpupool.slice/cpupool-dp.slice",
        "unit:cpupool.slice",
        "unit:cpupool-web.slice",
        "cgroup:system.slice",
        "unit:system.slice",
        "unit:user.slice",
        "cgroup:init.scope",
        "unit:init.scope",
        "unit:-.slice",
        // A host cgroup of the configuration, and its ancestor.
        "cgroup:kubepods.slice/kubepods-besteffort.slice",
        "cgroup:kubepods.slice",
        "unit:kubepods.slice",
    ] {
        assert!(refused(target, &[]), "{target} was admitted");
    }
    for target in [
        "cgroup:cpupool.slice/cpupool-dp.slice/app",
        "unit:app.service",
        "unit:cpupool-dp-app.slice",
        "cgroup:system.slice/app.service",
        "cgroup:kubepods.slice/kubepods-burstable.slice/pod1/ctr",
        "pid:1",
    ] {
        assert!(!refused(target, &[]), "{target} was refused");
    }
    // Nested in, or holding, another assignment's target.
    let other = Assignment {
        id: AssignmentId::new("app").unwrap_or_else(|e| panic!("{e}")),
        pool: PoolName::new("dp").unwrap_or_else(|e| panic!("{e}")),
        kind: PoolKind::Exclusive,
        target: t("cgroup:cpupool.slice/cpupool-dp.slice/app"),
        cpus: CpuSet::range(1, 1),
        millicpus: 1000,
        reclaim: true,
        process_start: None,
        container: None,
    };
    let others = [other];
    assert!(refused("cgroup:cpupool.slice/cpupool-dp.slice/app/sub", &others));
    assert!(refused(
        "unit:cpupool-dp-x.slice",
        &[Assignment {
            target: t("cgroup:cpupool.slice/cpupool-dp.slice/cpupool-dp-x.slice/y"),
            ..others[0].clone()
        }]
    ));
    assert!(!refused("cgroup:cpupool.slice/cpupool-dp.slice/app2", &others));
    let Err(Error::TargetNotAllowed { reason, .. }) =
        check_target(&t("cgroup:cpupool.slice/cpupool-dp.slice/app/sub"), &host, others.iter())
    else {
        panic!("admitted")
    };
    assert!(reason.contains("lies inside") && reason.contains("assignment `app` (pool `dp`)"), "{reason}");
}

/// Targets whose cgroups nest in each other in every way: equal, enclosing, inside, siblings
/// sharing a prefix (`k/a` and `k/ab`), slice units and the cgroups they name.
const NESTING: [&str; 12] = [
    "cgroup:k/a",
    "cgroup:k/a/b",
    "cgroup:k/a/b/c",
    "cgroup:k/ab",
    "cgroup:k/a-b",
    "cgroup:k",
    "cgroup:app.slice/app-x.slice",
    "unit:app-x.slice",
    "unit:app.slice",
    "unit:app-x-y.slice",
    "unit:app.service",
    "pid:7",
];

proptest! {
    /// The engine asks [`State::check_target`], which looks nesting up in an index of target
    /// cgroups; it refuses exactly what walking every other assignment ([`check_target`])
    /// refuses, through assigns, retargets and releases.
    #[test]
    fn the_indexed_target_check_refuses_what_the_walk_refuses(
        ops in proptest::collection::vec((0usize..3, 0usize..6, 0..NESTING.len()), 0..16),
        probe in 0..NESTING.len(),
    ) {
        let topo = Topology::synthetic(1, 8, 1, 1);
        let mut s = State::with_pools(vec![pool("web", PoolKind::Shared, "0-7", Smt::Threads)]);
        let t = |i: usize| Target::parse(NESTING[i]).unwrap_or_else(|e| panic!("{e}"));
        for (op, id, target) in ops {
            let name = format!("a{id}");
            let _ = match op {
                0 => s.assign(&topo, &spec("web", NESTING[target], Size::Millicpus(100), Some(&name))).map(|_| ()),
                1 => s.retarget(&name, t(target), None).map(|_| ()),
                _ => s.release(&name).map(|_| ()),
            };
        }
        let host = [CgroupPath::new("kubepods.slice").unwrap_or_else(|e| panic!("{e}"))];
        // As a new assignment, and as each existing one (which does not count against itself).
        let mut asking: Vec<AssignmentId> = s.assignments().keys().cloned().collect();
        asking.push(AssignmentId::new("new").unwrap_or_else(|e| panic!("{e}")));
        for me in asking {
            let target = s.assignments().get(&me).map_or_else(|| t(probe), |a| a.target.clone());
            let others = s.assignments().values().filter(|o| o.id != me);
            let walked = check_target(&target, &host, others);
            let indexed = s.check_target(&target, &host, &me);
            prop_assert_eq!(walked.is_err(), indexed.is_err(), "{} as {}: {:?} vs {:?}", target, me, walked, indexed);
        }
    }
}

#[test]
fn a_run_scope_names_its_process_and_nothing_else_does() {
    let scope = Target::parse(&format!("unit:{}", Target::run_scope(4242, 987_654)))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(scope.run_scope_process(), Some((4242, 987_654)));
    let others = [
        "unit:cpupool-run-42.scope",
        "unit:cpupool-run-x-1.scope",
        "unit:run-42-1.scope",
        "unit:cpupool-run-1-2.service",
        "pid:42",
    ];
    for other in others {
        let t = Target::parse(other).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(t.run_scope_process(), None, "{other}");
    }
}
