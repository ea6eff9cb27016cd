//! The cost of a power class on 1,024 simulated CPUs.
//!
//! `cargo bench --bench classes` writes the sandbox's simulated sysfs (`sim::power`) for
//! a 1024-CPU host (8 sockets × 64 cores × 2 threads, 8 NUMA nodes, one uncore die per
//! socket) into a temporary directory, puts every CPU in one pool whose class sets all seven
//! keys (governor, min_freq, max_freq, epp, resume_latency_us, uncore_min_freq,
//! uncore_max_freq), and times the engine's power pass ([`PowerManager`]) as it runs in the
//! daemon:
//!
//! - `floor`: reading each CPU's `scaling_governor` once (1,024 reads through the same
//!   `PowerFs`), the least any pass that reads back one key must do;
//! - `first apply`: from the host's own values, the pass that remembers 4,112 files, saves
//!   `power.json` durably, writes them and reads them back (then a restore puts them back,
//!   untimed);
//! - `apply, every value changes`: the class switched between two sets of values (a reload);
//! - `apply, nothing changes`: the drift check's pass;
//! - `restore all`: the daemon stopping.
//!
//! Each row prints the time and its ratio to the floor of the same run. No figure is asserted.
//! `cargo test --all-targets` runs it too, without `--bench`, on 64 CPUs and once each, so that
//! it keeps working.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use cpupoold::core::cpuset::CpuSet;
use cpupoold::core::topology::Topology;
use cpupoold::engine::power::PowerManager;
use cpupoold::host::power::PowerFs;
use cpupoold::sim::{machine as simhost, power as simpower};

const FAST: &str =
    "governor = \"performance\"\nmin_freq = \"max\"\nmax_freq = \"max\"\nepp = \"performance\"\n\
    resume_latency_us = 0\nuncore_min_freq = \"max\"\nuncore_max_freq = \"max\"\n";
const SLOW: &str = "governor = \"powersave\"\nmin_freq = \"min\"\nmax_freq = 2000000\nepp = \"power\"\n\
    resume_latency_us = 100\nuncore_min_freq = \"min\"\nuncore_max_freq = \"min\"\n";

fn time(runs: usize, mut f: impl FnMut()) -> Duration {
    let mut times: Vec<Duration> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    times.sort();
    times[runs / 2]
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let (topo, runs) =
        if bench { (Topology::synthetic(8, 64, 2, 8), 9) } else { (Topology::synthetic(1, 32, 2, 1), 1) };
    let n = topo.online().len();
    // On tmpfs where there is one: sysfs lives in memory, and a disk file system would time its
    // own truncate-and-write (ext4 flushes a file truncated to zero when it is closed), not ours.
    let shm = std::path::Path::new("/dev/shm");
    let dir = if shm.is_dir() { tempfile::tempdir_in(shm) } else { tempfile::tempdir() }.unwrap();
    let sys = dir.path().join("sys");
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    simhost::write_sysfs(&sys, &topo).unwrap();
    simpower::write_power(&sys, &topo, simpower::SimPower::ALL).unwrap();
    let all = topo.online();
    let settings = |class: &str| {
        let text = format!("[pools.all]\nkind = \"reserved\"\ncpus = \"{all}\"\n[pools.all.power]\n{class}");
        let mut s = cpupoold::config::load_str(&text, "bench.toml").unwrap();
        s.paths.sysfs_root = sys.clone();
        s.paths.state_dir = state.clone();
        s
    };
    let (fast, slow) = (settings(FAST), settings(SLOW));
    let pools: BTreeMap<String, CpuSet> = BTreeMap::from([("all".to_owned(), all.clone())]);

    let fs = PowerFs::new(&sys);
    let governors: Vec<String> =
        (0..n as u32).map(|c| format!("devices/system/cpu/cpufreq/policy{c}/scaling_governor")).collect();
    let floor = time(runs, || {
        for g in &governors {
            fs.read(g).unwrap();
        }
    });

    let mut firsts: Vec<Duration> = (0..runs)
        .map(|_| {
            let mut m = PowerManager::new(&fast);
            let t = Instant::now();
            m.apply(&topo, &pools);
            let d = t.elapsed();
            assert!(m.report().iter().all(|r| r.state.as_str() == "applied"), "{:?}", m.report());
            // The host's own values back for the next run, untimed.
            m.restore_all();
            d
        })
        .collect();
    firsts.sort();
    let first = firsts[runs / 2];

    let mut m = PowerManager::new(&fast);
    m.apply(&topo, &pools);
    let mut flip = false;
    let change = time(runs, || {
        flip = !flip;
        m.configure(if flip { &slow } else { &fast });
        m.apply(&topo, &pools);
    });
    let same = time(runs, || m.apply(&topo, &pools));
    let restore = time(runs, || {
        m.restore_all();
        m.apply(&topo, &pools);
    })
    .saturating_sub(same);
    let files = std::fs::read_to_string(state.join("power.json")).unwrap().matches("\": \"").count();

    println!("power class, 7 keys, on {n} simulated CPUs ({files} files remembered)");
    let row = |what: &str, d: Duration| {
        let ratio = d.as_secs_f64() / floor.as_secs_f64();
        println!("{what:<42} {:>10.2} ms  ×{ratio:>7.1} the floor", d.as_secs_f64() * 1e3);
    };
    row("floor: read 1 file per CPU once", floor);
    row("first apply (remember, save, write, read)", first);
    row("apply, every value changes (a reload)", change);
    row("apply, nothing changes (drift check)", same);
    row("restore all (the daemon stops, about)", restore);
}
