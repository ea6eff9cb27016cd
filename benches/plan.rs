//! The planner's cost per mutation and for a first apply, against the number of assignments.
//!
//! `cargo bench --bench plan` builds, in process (no daemon, no I/O), a simulated 1024-CPU host
//! (8 sockets × 64 cores × 2 threads, 8 NUMA nodes) with 64 pools of 16 CPUs (the reserved one,
//! 31 exclusive, 32 shared) and 0, 1,000 or 10,000 assignments (12 one-CPU exclusive ones per
//! exclusive pool, the rest 50 millicpus of the shared pools), the host cgroups confined and
//! idle CPUs lent, and measures:
//!
//! - `plan Assign`: what the engine plans for one Assign (one exclusive CPU, alternately one
//!   shared share) and its Release: the layouts of what they touch, `kept`, and the two plans
//!   around the save;
//! - `first apply`: the plan from nothing to the whole layout (a first start, which writes every
//!   target cgroup), once per size (it is only run once, so its figure is coarse).
//!
//! Each row prints the time and its ratio to the row with no assignment: planning what a
//! mutation touches keeps `plan Assign` flat, and a first apply in O(n log n) grows with n
//! (×≈10 from 1,000 to 10,000), not n². No figure is asserted. `cargo test --all-targets` runs it
//! too, without `--bench`, with fewer assignments, so that it keeps working.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/timing.rs"]
mod timing;

use std::collections::BTreeSet;
use std::time::Instant;

use cpupoold::core::plan::{self, Layout, LayoutOptions};
use cpupoold::core::pool::{Pool, PoolKind, PoolName, Smt};
use cpupoold::core::state::{AssignSpec, AssignmentId, CgroupPath, Size, State, Target};
use cpupoold::core::topology::Topology;
use timing::ns_per_op;

fn spec(pool: &str, id: &str, size: Size) -> AssignSpec {
    let target = Target::parse(&format!("cgroup:scale/{id}")).unwrap();
    AssignSpec::new(pool, target, size, Some(AssignmentId::new(id).unwrap()))
}

/// The host's pools and `n` assignments, as benches/scale.rs makes them.
fn state(topo: &Topology, n: usize) -> State {
    let cpus: Vec<u32> = topo.online().iter().collect();
    let pools = (0..64)
        .map(|i| Pool {
            name: PoolName::new(&format!("p{i:02}")).unwrap(),
            kind: match i {
                0 => PoolKind::Reserved,
                1..32 => PoolKind::Exclusive,
                _ => PoolKind::Shared,
            },
            cpus: cpus[i * 16..(i + 1) * 16].iter().copied().collect(),
            smt: Smt::Threads,
            isolate: false,
            kubelet: false,
            enforce_quota: false,
            dra: false,
        })
        .collect();
    let mut s = State::with_pools(pools);
    let mut made = 0;
    'exclusive: for p in 1..32 {
        for k in 0..12 {
            if made == n {
                break 'exclusive;
            }
            s.assign(topo, &spec(&format!("p{p:02}"), &format!("x{p}-{k}"), Size::Cpus(1))).unwrap();
            made += 1;
        }
    }
    for k in 0..n - made {
        let pool = format!("p{:02}", 32 + k % 32);
        s.assign(topo, &spec(&pool, &format!("s{k}"), Size::Millicpus(50))).unwrap();
    }
    s.take_changes();
    s
}

/// What the engine plans to commit `next` after `now`: the partial layouts, then the plans
/// before and after the save. Returns the number of effects.
fn commit_plan(now: &State, next: &State, topo: &Topology, opts: &LayoutOptions) -> usize {
    let ids = &next.changes().assignments;
    let (before, after) = plan::partial_layouts(now, next, topo, opts, ids);
    let kept = plan::kept(&before, &after);
    plan::plan(&before, &kept).len() + plan::plan(&kept, &after).len()
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let (sizes, budget_ms, min): (&[usize], u64, usize) =
        if bench { (&[0, 1_000, 10_000], 1500, 200) } else { (&[0, 100, 300], 0, 5) };
    let topo = Topology::synthetic(8, 64, 2, 8);
    let opts = LayoutOptions {
        host_cgroups: vec![CgroupPath::new("system.slice").unwrap()],
        lend_idle: true,
        unpooled: BTreeSet::new(),
        partitions: cpupoold::core::plan::Partitions::Containers,
    };
    let mut rows: Vec<(&str, usize, f64)> = Vec::new();
    for &n in sizes {
        let s = state(&topo, n);
        let ns = ns_per_op(budget_ms, min, 20, |i| {
            let (pool, size) = if i % 2 == 0 { ("p01", Size::Cpus(1)) } else { ("p63", Size::Millicpus(50)) };
            let mut next = s.clone();
            next.assign(&topo, &spec(pool, "bench", size)).unwrap();
            let mut back = next.clone();
            back.take_changes();
            back.release("bench").unwrap();
            let effects = commit_plan(&s, &next, &topo, &opts) + commit_plan(&next, &back, &topo, &opts);
            std::hint::black_box(effects);
        });
        rows.push(("plan Assign + Release", n, ns));
        let whole = plan::layout(&s, &topo, &opts);
        let t = Instant::now();
        let effects = plan::plan(&Layout::new(), &whole);
        let ns = t.elapsed().as_nanos() as f64;
        assert!(effects.len() >= n, "a first apply writes every target");
        rows.push(("first apply", n, ns));
    }
    println!("cpupoold planner: 1024 CPUs (8x64x2, 8 NUMA nodes), 64 pools, in process");
    println!("{:<24} {:>12} {:>14}   ratio to no assignment", "operation", "assignments", "time");
    for (name, n, ns) in &rows {
        let base = rows.iter().find(|r| r.0 == *name).unwrap().2;
        println!("{name:<24} {n:>12} {:>11.3} ms   ×{:.2}", ns / 1e6, ns / base);
    }
}
