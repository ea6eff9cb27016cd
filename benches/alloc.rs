//! The allocator's cost per operation against the size of the pool it allocates from.
//!
//! `cargo bench --bench alloc` builds simulated hosts of 256, 1024 and 4096 CPUs (SMT-2, one
//! NUMA node per 128 CPUs), each with one exclusive whole-core pool of every CPU but the first
//! core, filled to half with 2-CPU assignments, and measures in process (no daemon, no I/O):
//!
//! - `pick`: `alloc::pick` of one core from the pool's free CPUs;
//! - `assign+release`: `State::assign` of 2 CPUs to a new cgroup target, then `State::release`;
//! - `pick (64-CPU pool)`: `alloc::pick` from a pool of 64 CPUs on the same host, so that a cost
//!   that grows with the host rather than the pool shows.
//!
//! Each row prints the nanoseconds per operation, that figure divided by the pool's size, and
//! the ratio to the 256-CPU row: O(pool size) per operation means ns/CPU stays flat across
//! sizes (and the 64-CPU-pool row stays flat across hosts). No figure is asserted. `cargo test
//! --all-targets` runs it too, without `--bench`, as a short smoke run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/timing.rs"]
mod timing;

use cpupoold::core::alloc;
use cpupoold::core::cpuset::CpuSet;
use cpupoold::core::pool::{Pool, PoolKind, PoolName, Smt};
use cpupoold::core::state::{AssignSpec, Size, State, Target};
use cpupoold::core::topology::Topology;
use timing::ns_per_op;

fn pool(name: &str, kind: PoolKind, cpus: CpuSet) -> Pool {
    Pool {
        name: PoolName::new(name).unwrap(),
        kind,
        cpus,
        smt: Smt::FullCores,
        isolate: false,
        kubelet: true,
        enforce_quota: false,
        dra: false,
    }
}

fn spec(pool: &str, target: &str, cpus: u32) -> AssignSpec {
    AssignSpec::new(pool, Target::parse(target).unwrap(), Size::Cpus(cpus), None)
}

struct Row {
    name: &'static str,
    cpus: usize,
    pool: usize,
    ns: f64,
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let (budget_ms, min) = if bench { (1500, 2000) } else { (0, 20) };
    // (sockets, cores per socket, threads, NUMA nodes)
    let hosts = [(2, 64, 2, 2), (8, 64, 2, 8), (16, 128, 2, 32)];
    let mut rows = Vec::new();
    for (sockets, cores, threads, numa) in hosts {
        let topo = Topology::synthetic(sockets, cores, threads, numa);
        let online = topo.online();
        let total = online.len();
        let first_core = topo.siblings(0);
        let ex_cpus = online.difference(&first_core);
        // 32 whole cores from the middle of the host.
        let cores: Vec<&CpuSet> = topo.cores().values().collect();
        let small = cores[cores.len() / 2..][..32].iter().fold(CpuSet::new(), |acc, c| acc.union(c));
        let ex_cpus = ex_cpus.difference(&small);
        let mut state = State::with_pools(vec![
            pool("sys", PoolKind::Reserved, first_core),
            pool("ex", PoolKind::Exclusive, ex_cpus.clone()),
            pool("small", PoolKind::Exclusive, small.clone()),
        ]);
        // Half full, as a busy node is.
        for i in 0..ex_cpus.len() / 4 {
            state.assign(&topo, &spec("ex", &format!("cgroup:fill/{i}"), 2)).unwrap();
        }
        state.assign(&topo, &spec("small", "cgroup:fill/small", 32)).unwrap();
        let ex = state.pools().values().find(|p| p.name.as_str() == "ex").unwrap().clone();
        let sm = state.pools().values().find(|p| p.name.as_str() == "small").unwrap().clone();
        let (free_ex, free_small) = (state.free_cpus(&ex), state.free_cpus(&sm));
        let none = CpuSet::new();

        let ns = ns_per_op(budget_ms, min, 100, |_| {
            std::hint::black_box(alloc::pick(&topo, &free_ex, &none, 2, Smt::FullCores).unwrap());
        });
        rows.push(Row { name: "pick 1 core", cpus: total, pool: ex_cpus.len(), ns });

        let ns = ns_per_op(budget_ms, min, 100, |i| {
            let a = state.assign(&topo, &spec("ex", &format!("cgroup:bench/{i}"), 2)).unwrap().into_inner();
            state.release(a.id.as_str()).unwrap();
        });
        rows.push(Row { name: "assign+release 2 CPUs", cpus: total, pool: ex_cpus.len(), ns });

        let ns = ns_per_op(budget_ms, min, 100, |_| {
            std::hint::black_box(alloc::pick(&topo, &free_small, &none, 2, Smt::FullCores).unwrap());
        });
        rows.push(Row { name: "pick 1 core (64-CPU pool)", cpus: total, pool: small.len(), ns });
    }

    println!("cpupoold allocator, exclusive full-cores pools half full, in process");
    println!(
        "{:<28} {:>6} {:>6} {:>12} {:>10} {:>14}",
        "operation", "host", "pool", "ns/op", "ns/CPU", "ops/s"
    );
    for r in &rows {
        let base = rows.iter().find(|b| b.name == r.name).unwrap();
        println!(
            "{:<28} {:>6} {:>6} {:>12.0} {:>10.1} {:>14.0}   ns/op ×{:.1} for pool ×{:.1}",
            r.name,
            r.cpus,
            r.pool,
            r.ns,
            r.ns / r.pool as f64,
            1e9 / r.ns,
            r.ns / base.ns,
            r.pool as f64 / base.pool as f64
        );
    }
}
