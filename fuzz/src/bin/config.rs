//! Configuration loading: up to four TOML fragments (split at NUL bytes) merged and validated
//! through the same stages as the files, then resolved against two simulated hosts. Resolved
//! pools must never share a CPU, must use online CPUs only, and there is exactly one non-empty
//! reserved pool. Errors name one of the fragments when they name a file.
use std::path::Path;

use cpupoold::config;
use cpupoold::core::cpuset::CpuSet;
use cpupoold::core::pool::PoolKind;
use cpupoold::core::topology::Topology;

const NAMES: [&str; 4] = [
    "usr/lib/cpupoold/config.d/10-vendor.toml",
    "etc/cpupoold/config.toml",
    "etc/cpupoold/config.d/50-a.toml",
    "etc/cpupoold/config.d/90-cpupoold-runtime.toml",
];

fn main() {
    let hosts = [Topology::synthetic(2, 8, 2, 2), Topology::synthetic(1, 4, 1, 1)];
    afl::fuzz!(|data: &[u8]| {
        let mut fragments = Vec::new();
        for (name, part) in NAMES.iter().zip(data.split(|b| *b == 0)) {
            let Ok(text) = std::str::from_utf8(part) else { return };
            fragments.push((*name, text));
        }
        let settings = match config::load_strs(&fragments) {
            Ok(s) => s,
            Err(e) => {
                assert!(!e.to_string().is_empty());
                if let Some(file) = e.file().filter(|f| !f.as_os_str().is_empty()) {
                    assert!(NAMES.iter().any(|n| Path::new(n) == file), "error names {file:?}: {e}");
                }
                return;
            }
        };
        for topo in &hosts {
            let Ok(pools) = settings.resolve_pools(topo) else { continue };
            let mut seen = CpuSet::new();
            for p in &pools {
                assert!(p.cpus.is_disjoint(&seen), "pool {} shares CPUs: {:?}", p.name, pools);
                assert!(p.cpus.is_subset(&topo.online()), "pool {} has offline CPUs", p.name);
                seen = seen.union(&p.cpus);
            }
            let reserved: Vec<_> = pools.iter().filter(|p| p.kind == PoolKind::Reserved).collect();
            assert_eq!(reserved.len(), 1, "{pools:?}");
            assert!(!reserved[0].cpus.is_empty(), "{pools:?}");
        }
    });
}
