//! The cost of a cache class on the simulated resctrl of a 1,024-CPU host (8 L3 cache ids),
//! measured through the daemon's own host calls ([`Resctrl`]) as the cache manager makes them.
//!
//! - floor: reading the group's `cpus_list` and `schemata` once;
//! - `check`: reading `info/` (L3, MB, the groups) and planning one pool's `l3 = "50%"`,
//!   `mb = 50`, what every start, reload and pool edit does;
//! - `pass, nothing to write`: a drift check's pass over a group that holds what it should
//!   (read `cpus_list`, read and judge `schemata`, read both back);
//! - `first apply`: `mkdir` of the group, its 1,020 CPUs and schemata written and read back,
//!   then `rmdir` (so the next round starts alike).
//!
//! Each row prints µs per operation and the ratio to the floor of the same run. The cost does
//! not grow with the CPUs: a pool's CPUs are one `cpus_list` write. No figure is asserted;
//! `cargo test --all-targets` runs it as a short smoke run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/timing.rs"]
mod timing;

use std::collections::BTreeMap;

use cpupoold::core::cache::{self, CacheClass, L3Share};
use cpupoold::core::cpuset::CpuSet;
use cpupoold::core::pool::PoolName;
use cpupoold::host::resctrl::Resctrl;
use cpupoold::sim::resctrl::{self as simresctrl, SimResctrl};
use timing::ns_per_op;

fn main() {
    let smoke = !std::env::args().any(|a| a == "--bench");
    let budget = if smoke { 20 } else { 2_000 };
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("resctrl");
    let online = CpuSet::range(0, 1023);
    simresctrl::write_root(&root, &SimResctrl::new(&online, 8)).unwrap();
    let fs = Resctrl::new(&root).with_kernel(cpupoold::sim::KERNEL);
    let pool = PoolName::new("dp").unwrap();
    let classes =
        BTreeMap::from([(pool.clone(), CacheClass { l3: Some(L3Share::Percent(50)), mb: Some(50) })]);
    let cpus = CpuSet::range(4, 1023);
    let group = "cpupool-dp";

    let plan = |fs: &Resctrl| {
        let info = fs.info().unwrap();
        let want = cache::plan(&classes, &info).unwrap()[&pool];
        (info, want)
    };
    let (info, want) = plan(&fs);
    let text = cache::schemata(&want, &info);
    let apply = |fs: &Resctrl| {
        fs.create_group(group).unwrap();
        fs.set_cpus(group, &cpus).unwrap();
        fs.set_schemata(group, &text).unwrap();
        assert_eq!(fs.cpus(group).unwrap(), cpus);
        fs.schemata(group).unwrap()
    };
    apply(&fs);
    let l3 = info.l3.as_ref().unwrap();
    let floor = ns_per_op(budget, 10, 10, |_| {
        fs.cpus(group).unwrap();
        fs.schemata(group).unwrap();
    });
    let check = ns_per_op(budget, 10, 10, |_| {
        plan(&fs);
    });
    let steady = ns_per_op(budget, 10, 10, |_| {
        assert_eq!(fs.cpus(group).unwrap(), cpus);
        let shown = cache::parse_schemata(&fs.schemata(group).unwrap());
        assert!(cache::in_force(&shown, "L3", &l3.domains, want.l3.unwrap(), 16).1);
        fs.cpus(group).unwrap();
        fs.schemata(group).unwrap();
    });
    fs.remove_group(group).unwrap();
    let first = ns_per_op(budget, 10, 10, |_| {
        apply(&fs);
        fs.remove_group(group).unwrap();
    });
    println!("cache class of one pool (1,020 of 1,024 CPUs, 8 cache ids), simulated resctrl:");
    for (what, ns) in [
        ("floor: read cpus_list + schemata", floor),
        ("check (info/ read, plan)", check),
        ("pass, nothing to write", steady),
        ("first apply (+ rmdir)", first),
    ] {
        println!("{what:<36} {:>9.1} µs  ×{:.1} the floor", ns / 1000.0, ns / floor);
    }
}
