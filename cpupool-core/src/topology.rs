//! The host's CPU topology as plain data.
//!
//! The host side reads it from sysfs (`host::sysfs`); tests and the sandbox build it with
//! [`Topology::synthetic`]. Every grouping the allocator needs (cores, NUMA nodes, L3 groups) is
//! derived once here, so allocation never rescans the machine.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::cpuset::CpuSet;

/// Where one online logical CPU sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuPlace {
    /// The core, named by its lowest-numbered online thread (unique across packages).
    pub core: u32,
    /// `physical_package_id`.
    pub package: u32,
    /// `die_id`.
    pub die: u32,
    /// NUMA node.
    pub node: u32,
    /// The L3 cache group, named by its lowest-numbered online CPU.
    pub l3: u32,
}

/// A host's CPUs and how they group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "TopologyData", into = "TopologyData")]
pub struct Topology {
    data: TopologyData,
    cores: BTreeMap<u32, CpuSet>,
    /// Each core's online threads as a short list: a core's `CpuSet` is as long as its highest
    /// thread's number (a sibling sits half the host away), so the allocator, which looks at
    /// every core of a pool, reads these instead.
    threads: BTreeMap<u32, Vec<u32>>,
    nodes: BTreeMap<u32, CpuSet>,
    l3_groups: BTreeMap<u32, CpuSet>,
}

/// The facts a [`Topology`] is built from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct TopologyData {
    /// Each online CPU and its place.
    pub cpus: BTreeMap<u32, CpuPlace>,
    /// Present but offline CPUs.
    pub offline: CpuSet,
    /// CPUs the kernel isolated at boot (`isolcpus=`, `/sys/devices/system/cpu/isolated`).
    pub isolated: CpuSet,
}

impl From<TopologyData> for Topology {
    fn from(data: TopologyData) -> Self {
        Topology::new(data)
    }
}

impl From<Topology> for TopologyData {
    fn from(t: Topology) -> Self {
        t.data
    }
}

impl Topology {
    /// Derives the groupings from the facts.
    pub fn new(data: TopologyData) -> Self {
        let mut cores: BTreeMap<u32, CpuSet> = BTreeMap::new();
        let mut nodes: BTreeMap<u32, CpuSet> = BTreeMap::new();
        let mut l3_groups: BTreeMap<u32, CpuSet> = BTreeMap::new();
        for (&cpu, place) in &data.cpus {
            cores.entry(place.core).or_default().insert(cpu);
            nodes.entry(place.node).or_default().insert(cpu);
            l3_groups.entry(place.l3).or_default().insert(cpu);
        }
        let threads = cores.iter().map(|(&core, set)| (core, set.iter().collect())).collect();
        Topology { data, cores, threads, nodes, l3_groups }
    }

    /// A regular machine: `sockets` packages of `cores` cores of `threads` threads, split into
    /// `numa` nodes of whole cores (at least one per socket when `numa >= sockets`), with one L3
    /// group per NUMA node. CPU numbering follows Linux on x86: all first threads, then all
    /// second threads (so CPU `c` and `c + sockets*cores` are siblings).
    pub fn synthetic(sockets: u32, cores: u32, threads: u32, numa: u32) -> Self {
        let total_cores = sockets * cores;
        let numa = numa.clamp(1, total_cores.max(1));
        let mut data = TopologyData::default();
        for t in 0..threads {
            for core in 0..total_cores {
                let cpu = t * total_cores + core;
                let node = core * numa / total_cores.max(1);
                let first_core_of_node =
                    (0..total_cores).find(|c| c * numa / total_cores == node).unwrap_or(0);
                data.cpus.insert(
                    cpu,
                    CpuPlace { core, package: core / cores.max(1), die: 0, node, l3: first_core_of_node },
                );
            }
        }
        Topology::new(data)
    }

    /// The facts.
    pub fn data(&self) -> &TopologyData {
        &self.data
    }

    /// Online CPUs.
    pub fn online(&self) -> CpuSet {
        self.data.cpus.keys().copied().collect()
    }

    /// Present but offline CPUs.
    pub fn offline(&self) -> &CpuSet {
        &self.data.offline
    }

    /// Kernel-isolated CPUs (boot-time `isolcpus=`), online ones only.
    pub fn isolated(&self) -> CpuSet {
        self.data.isolated.intersection(&self.online())
    }

    /// The place of an online CPU.
    pub fn place(&self, cpu: u32) -> Option<&CpuPlace> {
        self.data.cpus.get(&cpu)
    }

    /// Online threads of the core `cpu` belongs to (including `cpu`); empty if `cpu` is offline.
    pub fn siblings(&self, cpu: u32) -> CpuSet {
        self.place(cpu).and_then(|p| self.cores.get(&p.core)).cloned().unwrap_or_default()
    }

    /// Cores by their name (lowest thread), with their online threads.
    pub fn cores(&self) -> &BTreeMap<u32, CpuSet> {
        &self.cores
    }

    /// The online threads of core `core` (a key of [`Topology::cores`]), ascending; empty for
    /// an unknown core.
    pub fn core_threads(&self, core: u32) -> &[u32] {
        self.threads.get(&core).map_or(&[], Vec::as_slice)
    }

    /// NUMA nodes with their online CPUs.
    pub fn nodes(&self) -> &BTreeMap<u32, CpuSet> {
        &self.nodes
    }

    /// L3 groups by their name (lowest CPU), with their online CPUs.
    pub fn l3_groups(&self) -> &BTreeMap<u32, CpuSet> {
        &self.l3_groups
    }

    /// The NUMA nodes `cpus` touch: what `cpuset.mems` should hold for them.
    ///
    /// One bitmap intersection per node rather than a lookup per CPU: the planner asks this for
    /// every placement it builds, and a host has far fewer nodes than CPUs.
    pub fn nodes_of(&self, cpus: &CpuSet) -> CpuSet {
        self.nodes.iter().filter(|(_, set)| !set.is_disjoint(cpus)).map(|(&n, _)| n).collect()
    }

    /// Whether `cpus` is made of whole cores only.
    pub fn is_whole_cores(&self, cpus: &CpuSet) -> bool {
        self.partial_cores(cpus).is_empty()
    }

    /// The CPUs of `cpus` whose core is only partly in `cpus`.
    pub fn partial_cores(&self, cpus: &CpuSet) -> CpuSet {
        cpus.iter().filter(|&c| !self.siblings(c).is_subset(cpus)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_two_socket_smt2() {
        let t = Topology::synthetic(2, 8, 2, 2);
        assert_eq!(t.online(), CpuSet::range(0, 31));
        assert_eq!(t.siblings(3), CpuSet::parse("3,19").unwrap_or_default());
        assert_eq!(t.siblings(19), CpuSet::parse("3,19").unwrap_or_default());
        assert_eq!(t.cores().len(), 16);
        assert_eq!(t.core_threads(3), [3, 19]);
        assert!(t.core_threads(19).is_empty(), "cores are named by their lowest thread");
        assert_eq!(t.nodes().len(), 2);
        assert_eq!(t.nodes()[&0], CpuSet::parse("0-7,16-23").unwrap_or_default());
        assert_eq!(t.place(9).map(|p| p.package), Some(1));
        assert_eq!(t.l3_groups().len(), 2);
        assert!(t.is_whole_cores(&CpuSet::parse("0,16").unwrap_or_default()));
        assert_eq!(t.partial_cores(&CpuSet::parse("0,1,16").unwrap_or_default()), CpuSet::range(1, 1));
        assert_eq!(t.nodes_of(&CpuSet::parse("0,9").unwrap_or_default()), CpuSet::range(0, 1));
    }

    #[test]
    fn serde_round_trip_rebuilds_groups() {
        let t = Topology::synthetic(1, 4, 2, 1);
        let json = serde_json::to_string(&t).unwrap_or_default();
        let back: Topology = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, t);
        assert_eq!(back.cores().len(), 4);
    }
}
