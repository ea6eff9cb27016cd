//! The CPU picker shared by pool resolution, exclusive assignments and the device plugin's
//! preferred allocation.
//!
//! Given the CPUs still available, it picks `n` of them packed on the fewest NUMA nodes, then the
//! fewest L3 groups inside those, then by core:
//! - `smt = "full-cores"`: only cores whose every online thread is available are used, whole;
//! - `smt = "threads"`: CPUs whose siblings are already taken come first (filling half-used
//!   cores), then whole free cores, siblings together.
//!
//! At each level a group that fits the whole request is chosen best-fit (the smallest that fits),
//! otherwise the largest groups are taken whole and the remainder best-fit. Each call sorts the
//! available units once per level, so it is O(k log k) in the number of available CPUs `k` and
//! independent of how many assignments exist and of the rest of the host (`benches/alloc.rs`).

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::cpuset::CpuSet;
use super::topology::Topology;

/// How SMT siblings are handed out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Smt {
    /// Only whole cores: an assignment never shares a core with another.
    FullCores,
    /// Logical CPUs: siblings may go to different assignments.
    Threads,
}

impl fmt::Display for Smt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Smt::FullCores => "full-cores",
            Smt::Threads => "threads",
        })
    }
}

/// Why no CPUs could be picked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PickError {
    /// Fewer usable CPUs than asked for.
    #[error("{requested} CPUs requested but only {available} are free")]
    Insufficient {
        /// CPUs asked for.
        requested: usize,
        /// Usable CPUs (with full cores: CPUs of wholly free cores).
        available: usize,
    },
    /// With full cores, no set of free cores adds up to exactly the request.
    #[error("{requested} CPUs is not a whole number of free cores")]
    NotWholeCores {
        /// CPUs asked for.
        requested: usize,
    },
}

#[derive(Debug, Clone)]
struct Unit {
    cpus: Vec<u32>,
    node: u32,
    l3: u32,
    core: u32,
    /// Threads mode: some sibling of this CPU is not available (already taken).
    partial: bool,
}

/// Picks `n` CPUs from `available`, always including `must_include` (which must be part of
/// `available`; with full cores it is widened to its cores).
pub fn pick(
    topo: &Topology,
    available: &CpuSet,
    must_include: &CpuSet,
    n: usize,
    smt: Smt,
) -> Result<CpuSet, PickError> {
    // `units` skips CPUs that are not online (they have no place in the topology).
    let units = units(topo, available, smt);
    let usable: usize = units.iter().map(|u| u.cpus.len()).sum();
    if usable < n {
        return Err(PickError::Insufficient { requested: n, available: usable });
    }
    let (forced, rest): (Vec<Unit>, Vec<Unit>) =
        units.into_iter().partition(|u| u.cpus.iter().any(|c| must_include.contains(*c)));
    let forced_len: usize = forced.iter().map(|u| u.cpus.len()).sum();
    if forced_len > n {
        return Err(PickError::NotWholeCores { requested: n });
    }
    let prefer_nodes: Vec<u32> = forced.iter().map(|u| u.node).collect();
    let prefer_l3: Vec<u32> = forced.iter().map(|u| u.l3).collect();
    let mut chosen: CpuSet = forced.iter().flat_map(|u| u.cpus.iter().copied()).collect();
    let need = n - forced_len;
    if need > 0 {
        let by_node = choose(rest, need, &|u| u.node, &prefer_nodes, &|units, need| {
            choose(units, need, &|u| u.l3, &prefer_l3, &|units, need| take_in_order(units, need, smt))
        });
        chosen.extend_from(&by_node);
    }
    if chosen.len() != n {
        return Err(PickError::NotWholeCores { requested: n });
    }
    Ok(chosen)
}

/// Picks `count` device-plugin devices from `available`, always including `must_include`: with
/// `smt = "threads"` a device is one logical CPU, with `"full-cores"` one whole core (all its
/// online threads). Packed like [`pick`]: fewest NUMA nodes, then L3 groups, whole cores.
///
/// Full cores are counted in CPUs by [`pick`], so this needs the available cores to have one
/// thread count (true unless a sibling is offline); otherwise it says `NotWholeCores`.
pub fn pick_devices(
    topo: &Topology,
    available: &CpuSet,
    must_include: &CpuSet,
    count: usize,
    smt: Smt,
) -> Result<CpuSet, PickError> {
    match smt {
        Smt::Threads => pick(topo, available, must_include, count, smt),
        Smt::FullCores => {
            let available = available.intersection(&topo.online());
            let sizes: std::collections::BTreeSet<usize> = topo
                .cores()
                .values()
                .filter(|threads| threads.is_subset(&available))
                .map(CpuSet::len)
                .collect();
            match sizes.len() {
                0 if count == 0 => Ok(CpuSet::new()),
                0 => Err(PickError::Insufficient { requested: count, available: 0 }),
                1 => {
                    let per_core = sizes.first().copied().unwrap_or(1);
                    pick(topo, &available, must_include, count * per_core, smt)
                }
                _ => Err(PickError::NotWholeCores { requested: count }),
            }
        }
    }
}

/// The available CPUs grouped into the units handed out. Only `available` is walked (not every
/// core of the host), so the cost follows the pool, not the machine.
fn units(topo: &Topology, available: &CpuSet, smt: Smt) -> Vec<Unit> {
    let mut out = Vec::new();
    match smt {
        Smt::FullCores => {
            let mut seen = std::collections::HashSet::new();
            for cpu in available.iter() {
                let Some(place) = topo.place(cpu) else { continue };
                if !seen.insert(place.core) {
                    continue;
                }
                let threads = topo.core_threads(place.core);
                if threads.iter().all(|t| available.contains(*t)) {
                    out.push(Unit {
                        cpus: threads.to_vec(),
                        node: place.node,
                        l3: place.l3,
                        core: place.core,
                        partial: false,
                    });
                }
            }
            // In core order, as before: the packing below must not depend on the walk.
            out.sort_by_key(|u| u.core);
        }
        Smt::Threads => {
            for cpu in available.iter() {
                let Some(place) = topo.place(cpu) else { continue };
                out.push(Unit {
                    cpus: vec![cpu],
                    node: place.node,
                    l3: place.l3,
                    core: place.core,
                    partial: !topo.core_threads(place.core).iter().all(|t| available.contains(*t)),
                });
            }
        }
    }
    out
}

fn size(units: &[Unit]) -> usize {
    units.iter().map(|u| u.cpus.len()).sum()
}

type Next<'a> = dyn Fn(Vec<Unit>, usize) -> CpuSet + 'a;

/// One level of packing: group `units` by `key`, fill preferred groups first, then best-fit.
fn choose(
    units: Vec<Unit>,
    need: usize,
    key: &dyn Fn(&Unit) -> u32,
    prefer: &[u32],
    next: &Next<'_>,
) -> CpuSet {
    let mut groups: BTreeMap<u32, Vec<Unit>> = BTreeMap::new();
    for u in units {
        groups.entry(key(&u)).or_default().push(u);
    }
    let mut chosen = CpuSet::new();
    let mut need = need;
    let take = |units: Vec<Unit>, need: &mut usize, chosen: &mut CpuSet| {
        let want = (*need).min(size(&units));
        let got = next(units, want);
        *need = need.saturating_sub(got.len());
        chosen.extend_from(&got);
    };
    for k in prefer {
        if need == 0 {
            break;
        }
        if let Some(units) = groups.remove(k) {
            take(units, &mut need, &mut chosen);
        }
    }
    while need > 0 && !groups.is_empty() {
        // Best fit: the smallest group that holds the rest, lowest key on ties.
        let fit = groups
            .iter()
            .filter(|(_, u)| size(u) >= need)
            .min_by_key(|(k, u)| (size(u), **k))
            .map(|(k, _)| *k);
        let k = match fit {
            Some(k) => k,
            // Nothing holds it all: take the largest group whole and go on.
            None => match groups.iter().max_by_key(|(k, u)| (size(u), std::cmp::Reverse(**k))) {
                Some((k, _)) => *k,
                None => break,
            },
        };
        // A group that gives nothing (full cores that overshoot) is dropped; others are tried.
        let Some(units) = groups.remove(&k) else { break };
        take(units, &mut need, &mut chosen);
    }
    chosen
}

fn take_in_order(mut units: Vec<Unit>, need: usize, smt: Smt) -> CpuSet {
    // Half-used cores first (threads mode), then whole cores with siblings together.
    units.sort_by_key(|u| (!u.partial, u.core, u.cpus.first().copied()));
    let mut chosen = CpuSet::new();
    let mut got = 0;
    for u in units {
        if got == need {
            break;
        }
        if smt == Smt::FullCores && got + u.cpus.len() > need {
            continue;
        }
        for c in u.cpus {
            if got < need {
                chosen.insert(c);
                got += 1;
            }
        }
    }
    chosen
}

impl CpuSet {
    fn extend_from(&mut self, other: &CpuSet) {
        *self = self.union(other);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(s: &str) -> CpuSet {
        CpuSet::parse(s).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn full_cores_on_one_node() {
        let t = Topology::synthetic(2, 8, 2, 2);
        let got = pick(&t, &t.online(), &CpuSet::new(), 4, Smt::FullCores).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(got, set("0-1,16-17"));
        assert!(t.is_whole_cores(&got));
    }

    #[test]
    fn best_fit_prefers_the_fuller_node() {
        let t = Topology::synthetic(2, 8, 2, 2);
        // Node 0 has only 2 cores free, node 1 all 8: a 4-CPU request fits node 0 exactly.
        let avail = set("6-7,22-23").union(&t.nodes()[&1]);
        let got = pick(&t, &avail, &CpuSet::new(), 4, Smt::FullCores).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(got, set("6-7,22-23"));
    }

    #[test]
    fn spans_fewest_nodes_when_one_is_not_enough() {
        let t = Topology::synthetic(1, 8, 1, 4); // 4 nodes of 2 CPUs
        let avail = set("0,2-3,4-5,6");
        let got = pick(&t, &avail, &CpuSet::new(), 3, Smt::Threads).unwrap_or_else(|e| panic!("{e}"));
        // One full node (2-3) plus best fit for the last CPU (node 0 with 1 free CPU).
        assert_eq!(t.nodes_of(&got).len(), 2);
        assert_eq!(got, set("0,2-3"));
    }

    #[test]
    fn threads_fill_half_used_cores_first() {
        let t = Topology::synthetic(1, 4, 2, 1);
        // CPU 1's sibling (5) is taken: 1 is a half-used core.
        let avail = set("0-3,4,6-7");
        let got = pick(&t, &avail, &CpuSet::new(), 1, Smt::Threads).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(got, set("1"));
        let got = pick(&t, &avail, &CpuSet::new(), 3, Smt::Threads).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(got, set("0-1,4"));
    }

    #[test]
    fn must_include_is_kept_and_its_node_preferred() {
        let t = Topology::synthetic(2, 4, 2, 2);
        let got = pick(&t, &t.online(), &set("5"), 4, Smt::FullCores).unwrap_or_else(|e| panic!("{e}"));
        assert!(got.contains(5) && got.contains(13));
        assert!(got.is_subset(&t.nodes()[&1]));
    }

    #[test]
    fn errors() {
        let t = Topology::synthetic(1, 4, 2, 1);
        assert_eq!(
            pick(&t, &set("0-3"), &CpuSet::new(), 2, Smt::FullCores),
            Err(PickError::Insufficient { requested: 2, available: 0 })
        );
        assert_eq!(
            pick(&t, &t.online(), &CpuSet::new(), 3, Smt::FullCores),
            Err(PickError::NotWholeCores { requested: 3 })
        );
        assert_eq!(
            pick(&t, &t.online(), &CpuSet::new(), 9, Smt::Threads),
            Err(PickError::Insufficient { requested: 9, available: 8 })
        );
    }

    #[test]
    fn devices_are_cores_or_threads() {
        let t = Topology::synthetic(2, 4, 2, 2); // cores 0-3 on node 0, 4-7 on node 1; c+8 siblings
        let got = pick_devices(&t, &t.online(), &CpuSet::new(), 2, Smt::FullCores)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(got, set("0-1,8-9"));
        // must_include a core on node 1: the rest comes from node 1 too.
        let got =
            pick_devices(&t, &t.online(), &set("6,14"), 2, Smt::FullCores).unwrap_or_else(|e| panic!("{e}"));
        assert!(got.contains(6) && got.contains(14) && got.len() == 4 && got.is_subset(&t.nodes()[&1]));
        // Threads: 3 devices are 3 CPUs, siblings together.
        let got =
            pick_devices(&t, &t.online(), &CpuSet::new(), 3, Smt::Threads).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(got.len(), 3);
        assert_eq!(t.nodes_of(&got).len(), 1);
        assert_eq!(
            pick_devices(&t, &set("0,8"), &CpuSet::new(), 2, Smt::FullCores),
            Err(PickError::Insufficient { requested: 4, available: 2 })
        );
        assert_eq!(
            pick_devices(&t, &set("0"), &CpuSet::new(), 1, Smt::FullCores),
            Err(PickError::Insufficient { requested: 1, available: 0 })
        );
    }

    proptest::proptest! {
        #[test]
        fn picks_exactly_n_available_cpus(
            sockets in 1u32..3, cores in 1u32..6, threads in 1u32..3, numa in 1u32..4,
            avail_bits in proptest::collection::vec(proptest::bool::ANY, 64),
            n in 0usize..20, full in proptest::bool::ANY,
        ) {
            let t = Topology::synthetic(sockets, cores, threads, numa);
            let avail: CpuSet = t.online().iter().filter(|c| avail_bits[*c as usize % 64]).collect();
            let smt = if full { Smt::FullCores } else { Smt::Threads };
            match pick(&t, &avail, &CpuSet::new(), n, smt) {
                Ok(got) => {
                    proptest::prop_assert_eq!(got.len(), n);
                    proptest::prop_assert!(got.is_subset(&avail));
                    if full { proptest::prop_assert!(t.is_whole_cores(&got)); }
                }
                Err(PickError::Insufficient { available, .. }) => proptest::prop_assert!(available < n),
                Err(PickError::NotWholeCores { .. }) => proptest::prop_assert!(full),
            }
        }
    }
}
