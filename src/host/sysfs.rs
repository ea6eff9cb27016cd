//! Reads the host's CPU topology from a sysfs tree.
//!
//! Data flow: [`read_topology`] is given the sysfs root (`/sys` on a real host, a directory
//! written by `crate::sim::machine::write_sysfs` in the sandbox and in tests). It reads
//!
//! 1. `devices/system/cpu/{online,offline,isolated}`: which CPUs exist and which the kernel
//!    isolated at boot;
//! 2. `devices/system/node/node*/cpulist`: which NUMA node each online CPU is on;
//! 3. for each online CPU N, `devices/system/cpu/cpuN/topology/*` (core siblings, package, die)
//!    and `devices/system/cpu/cpuN/cache/index*/{level,shared_cpu_list}` (its L3 group);
//!
//! then names each core and each L3 group by its lowest *online* CPU, so the names are unique
//! across packages and stable for a given set of online CPUs, and hands the facts to
//! [`Topology::new`], which derives the groupings. Nothing here decides anything about pools.
//!
//! Sysfs differs between kernels and architectures; this reader accepts:
//! - `core_cpus_list` (Linux 5.4+) or, failing that, the older `thread_siblings_list`;
//! - a missing or empty `offline` file, and a missing `isolated` file, as the empty set;
//! - a missing `die_id` as die 0, and an id of `-1` (what some arm64 kernels report when firmware
//!   gives no package information) as 0;
//! - no `devices/system/node` directory, or one without `node*` entries (a kernel without
//!   `CONFIG_NUMA`), as every CPU on node 0;
//! - sibling and node lists that still include offline CPUs (architectures that do not prune
//!   them): only online CPUs count.
//!
//! When a CPU has no level-3 cache entry (many VMs, arm64 without a PPTT, machines whose last
//! level is L2), its L3 group is taken to be the online CPUs that share both its package and its
//! NUMA node, named by the lowest of them: an L3 never spans packages, and where the cache layout
//! is unknown the node is the best proxy for which CPUs share one.
//!
//! The tree is read without locking, so a CPU going offline while it is read can make a file
//! vanish; the error names that file and the caller may simply read again.
#![deny(missing_docs)]

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::num::ParseIntError;
use std::path::{Path, PathBuf};

use crate::core::cpuset::{CpuSet, CpuSetError};
use crate::core::topology::{CpuPlace, Topology, TopologyData};

/// Why the topology could not be read. Every variant names the file or directory involved.
#[derive(Debug, thiserror::Error)]
pub enum SysfsError {
    /// A file or directory could not be read (missing, unreadable, not UTF-8).
    #[error("reading `{}`", .path.display())]
    Read {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// A file that should hold a CPU or node list holds something else.
    #[error("parsing the CPU list in `{}`", .path.display())]
    CpuList {
        /// The file.
        path: PathBuf,
        /// What is wrong with the list; it names the offending token.
        #[source]
        source: CpuSetError,
    },
    /// A file that should hold a number holds something else.
    #[error("parsing `{text}` in `{}` as a number", .path.display())]
    Number {
        /// The file.
        path: PathBuf,
        /// The file's contents, trimmed.
        text: String,
        /// Why it is not a number.
        #[source]
        source: ParseIntError,
    },
    /// NUMA nodes are described but none lists this online CPU.
    #[error("CPU {cpu} is online but no `node*/cpulist` under `{}` lists it", .path.display())]
    NoNode {
        /// The online CPU.
        cpu: u32,
        /// The node directory searched (`devices/system/node`).
        path: PathBuf,
    },
}

/// Reads the CPU topology from the sysfs tree rooted at `sysfs_root` (`/sys` on a real host).
///
/// See the module documentation for the files read and the fallbacks taken.
pub fn read_topology(sysfs_root: &Path) -> Result<Topology, SysfsError> {
    let cpu_dir = sysfs_root.join("devices/system/cpu");
    let node_dir = sysfs_root.join("devices/system/node");

    let online = read_list(&cpu_dir.join("online"))?;
    let offline = read_optional_list(&cpu_dir.join("offline"))?.unwrap_or_default();
    let isolated = read_optional_list(&cpu_dir.join("isolated"))?.unwrap_or_default();
    let node_of = read_nodes(&node_dir, &online)?;

    // First pass: everything but the L3 fallback, which needs every CPU's package and node.
    let mut places: BTreeMap<u32, (CpuPlace, bool)> = BTreeMap::new();
    let mut first_of_package_node: BTreeMap<(u32, u32), u32> = BTreeMap::new();
    for cpu in online.iter() {
        let this_dir = cpu_dir.join(format!("cpu{cpu}"));
        let topo_dir = this_dir.join("topology");

        let siblings = read_siblings(&topo_dir)?;
        let package = read_id(&topo_dir.join("physical_package_id"))?;
        let die = match read_optional(&topo_dir.join("die_id"))? {
            Some(text) => parse_id(&topo_dir.join("die_id"), &text)?,
            None => 0,
        };
        let node = match &node_of {
            None => 0,
            Some(map) => *map.get(&cpu).ok_or_else(|| SysfsError::NoNode { cpu, path: node_dir.clone() })?,
        };
        let l3 = read_l3(&this_dir.join("cache"))?;

        // CPUs are visited in ascending order, so the first one seen is the lowest.
        first_of_package_node.entry((package, node)).or_insert(cpu);
        let place = CpuPlace {
            core: lowest_online(&siblings, &online, cpu),
            package,
            die,
            node,
            l3: l3.as_ref().map_or(cpu, |set| lowest_online(set, &online, cpu)),
        };
        places.insert(cpu, (place, l3.is_some()));
    }

    let cpus = places
        .into_iter()
        .map(|(cpu, (mut place, has_l3))| {
            if !has_l3 {
                place.l3 = first_of_package_node.get(&(place.package, place.node)).copied().unwrap_or(cpu);
            }
            (cpu, place)
        })
        .collect();

    Ok(Topology::new(TopologyData { cpus, offline, isolated }))
}

/// The name of the group `set` that `cpu` belongs to: its lowest online CPU. `cpu` itself always
/// counts, so a list that forgets it still yields a name.
fn lowest_online(set: &CpuSet, online: &CpuSet, cpu: u32) -> u32 {
    let mut members = set.intersection(online);
    members.insert(cpu);
    members.first().unwrap_or(cpu)
}

/// The online threads of the core, from `core_cpus_list` or the older `thread_siblings_list`.
fn read_siblings(topo_dir: &Path) -> Result<CpuSet, SysfsError> {
    match read_optional_list(&topo_dir.join("core_cpus_list"))? {
        Some(set) => Ok(set),
        None => read_list(&topo_dir.join("thread_siblings_list")),
    }
}

/// Maps each online CPU to its NUMA node, or `None` when the kernel describes no nodes.
fn read_nodes(node_dir: &Path, online: &CpuSet) -> Result<Option<BTreeMap<u32, u32>>, SysfsError> {
    let Some(nodes) = numbered_entries(node_dir, "node")? else { return Ok(None) };
    if nodes.is_empty() {
        return Ok(None);
    }
    let mut node_of = BTreeMap::new();
    // Ascending node order: should two nodes claim a CPU, the lower one wins, deterministically.
    for (node, path) in nodes {
        let cpus = read_list(&path.join("cpulist"))?;
        for cpu in cpus.intersection(online).iter() {
            node_of.entry(cpu).or_insert(node);
        }
    }
    Ok(Some(node_of))
}

/// The CPUs sharing this CPU's level-3 cache, or `None` if sysfs describes no L3 for it.
fn read_l3(cache_dir: &Path) -> Result<Option<CpuSet>, SysfsError> {
    let Some(indexes) = numbered_entries(cache_dir, "index")? else { return Ok(None) };
    for (_, index_dir) in indexes {
        let level_path = index_dir.join("level");
        let level = read_file(&level_path)?;
        if parse_number(&level_path, &level)? == 3 {
            return read_list(&index_dir.join("shared_cpu_list")).map(Some);
        }
    }
    Ok(None)
}

/// The entries of `dir` named `<prefix><number>`, sorted by number; `None` if `dir` is missing.
fn numbered_entries(dir: &Path, prefix: &str) -> Result<Option<Vec<(u32, PathBuf)>>, SysfsError> {
    let read_err = |source| SysfsError::Read { path: dir.to_owned(), source };
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(read_err(e)),
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.map_err(read_err)?;
        let name = entry.file_name();
        let number = name
            .to_str()
            .and_then(|n| n.strip_prefix(prefix))
            .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|n| n.parse::<u32>().ok());
        if let Some(number) = number {
            found.push((number, entry.path()));
        }
    }
    found.sort();
    Ok(Some(found))
}

fn read_file(path: &Path) -> Result<String, SysfsError> {
    super::read_small(path).map_err(|source| SysfsError::Read { path: path.to_owned(), source })
}

/// Reads a file, `None` if it does not exist.
fn read_optional(path: &Path) -> Result<Option<String>, SysfsError> {
    match super::read_small(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(SysfsError::Read { path: path.to_owned(), source }),
    }
}

/// The CPUs the kernel has online now (`devices/system/cpu/online`), for noticing CPU hotplug
/// between topology reads.
pub fn read_online(sysfs_root: &Path) -> Result<CpuSet, SysfsError> {
    read_list(&sysfs_root.join("devices/system/cpu/online"))
}

fn read_list(path: &Path) -> Result<CpuSet, SysfsError> {
    parse_list(path, &read_file(path)?)
}

/// Reads a list that may be missing; a missing file is `None`, an empty one the empty set.
fn read_optional_list(path: &Path) -> Result<Option<CpuSet>, SysfsError> {
    read_optional(path)?.map(|text| parse_list(path, &text)).transpose()
}

fn parse_list(path: &Path, text: &str) -> Result<CpuSet, SysfsError> {
    CpuSet::parse(text).map_err(|source| SysfsError::CpuList { path: path.to_owned(), source })
}

fn read_id(path: &Path) -> Result<u32, SysfsError> {
    parse_id(path, &read_file(path)?)
}

/// A package or die id. `-1` is what some kernels report when firmware gives none (arm64 before
/// PPTT support); with no information every CPU is in one package, so it reads as 0.
fn parse_id(path: &Path, text: &str) -> Result<u32, SysfsError> {
    if text.trim() == "-1" {
        return Ok(0);
    }
    parse_number(path, text)
}

fn parse_number(path: &Path, text: &str) -> Result<u32, SysfsError> {
    let text = text.trim();
    text.parse().map_err(|source| SysfsError::Number { path: path.to_owned(), text: text.to_owned(), source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::machine::{write_sysfs, TopologyShape};

    fn set(s: &str) -> CpuSet {
        CpuSet::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn tempdir() -> tempfile::TempDir {
        tempfile::tempdir().unwrap_or_else(|e| panic!("creating a temp dir: {e}"))
    }

    fn put(root: &Path, rel: &str, contents: &str) {
        let path = root.join(rel);
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        }
        fs::write(&path, contents).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }

    fn read(root: &Path) -> Topology {
        read_topology(root).unwrap_or_else(|e| panic!("{}", chain(&e)))
    }

    /// The error and its causes, as `main` prints them.
    fn chain(e: &dyn std::error::Error) -> String {
        let mut text = e.to_string();
        let mut cause = e.source();
        while let Some(c) = cause {
            text.push_str(&format!(": {c}"));
            cause = c.source();
        }
        text
    }

    fn round_trip(topo: &Topology) {
        let dir = tempdir();
        write_sysfs(dir.path(), topo).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(&read(dir.path()), topo);
    }

    /// `topo` with `offline` taken offline, cores and L3 groups renamed after their lowest
    /// remaining CPU, as the kernel would then report them.
    fn take_offline(topo: &Topology, offline: &CpuSet, isolated: &CpuSet) -> Topology {
        let mut data = topo.data().clone();
        data.cpus.retain(|cpu, _| !offline.contains(*cpu));
        let first = |pick: fn(&CpuPlace) -> u32, name: u32| {
            data.cpus.iter().find(|(_, p)| pick(p) == name).map(|(cpu, _)| *cpu)
        };
        let renamed: BTreeMap<u32, CpuPlace> = data
            .cpus
            .iter()
            .map(|(&cpu, p)| {
                let core = first(|p| p.core, p.core).unwrap_or(cpu);
                let l3 = first(|p| p.l3, p.l3).unwrap_or(cpu);
                (cpu, CpuPlace { core, l3, ..*p })
            })
            .collect();
        data.cpus = renamed;
        data.offline = offline.clone();
        data.isolated = isolated.clone();
        Topology::new(data)
    }

    #[test]
    fn round_trips_synthetic_shapes() {
        for shape in ["2x8x2:2", "1x4x1:1", "1x1x1", "4x3x2:8", "2x4x4:1"] {
            let shape: TopologyShape = shape.parse().unwrap_or_else(|e| panic!("{shape}: {e}"));
            round_trip(&shape.topology());
        }
    }

    #[test]
    fn round_trips_offline_and_isolated_two_socket_smt2() {
        let full = Topology::synthetic(2, 8, 2, 2);
        // CPU 0 offline renames core 0 to 16 and node 0's L3 group to 1; 25 leaves 9 alone on
        // its core; 15 and 31 offline remove a whole core. Isolated 31 is offline: the file
        // keeps it.
        let topo = take_offline(&full, &set("0,15,25,31"), &set("4-5,20-21,31"));
        assert_eq!(topo.place(16).map(|p| p.core), Some(16));
        assert_eq!(topo.place(16).map(|p| p.l3), Some(1));
        assert_eq!(topo.siblings(9), set("9"));
        assert_eq!(topo.cores().len(), 15);
        assert_eq!(topo.isolated(), set("4-5,20-21"));
        round_trip(&topo);
    }

    #[test]
    fn round_trips_offline_and_isolated_one_socket() {
        let full = Topology::synthetic(1, 4, 1, 1);
        let topo = take_offline(&full, &set("3"), &set("2"));
        assert_eq!(topo.online(), set("0-2"));
        round_trip(&topo);
        let topo = take_offline(&full, &set("0"), &CpuSet::new());
        assert_eq!(topo.l3_groups().keys().copied().collect::<Vec<_>>(), vec![1]);
        round_trip(&topo);
    }

    /// A 2-socket, 4-core, SMT-2, 2-node x86 box, Linux numbering: CPUs 0-3 and 8-11 on socket
    /// 0 (siblings `c` and `c + 8`), 4-7 and 12-15 on socket 1. CPU 4 is offline, so core 4 is
    /// named after 12 and socket 1's L3 after 5; 2-3 and 10-11 are isolated.
    ///
    /// `modern` picks a 5.4+ x86 kernel: core_cpus_list, die_id, isolated, full cache
    /// directories, offline CPUs pruned from every list. Otherwise an older kernel:
    /// thread_siblings_list only, no die_id, no isolated file, no cache directory on socket 0
    /// (the L3 fallback) and only an L3 index on socket 1, and sibling, L3 and node lists that
    /// still name the offline CPU.
    fn write_real_box(root: &Path, modern: bool) {
        put(root, "devices/system/cpu/online", "0-3,5-15\n");
        put(root, "devices/system/cpu/offline", "4\n");
        put(root, "devices/system/cpu/possible", "0-15\n");
        put(root, "devices/system/cpu/present", "0-15\n");
        put(root, "devices/system/cpu/kernel_max", "8191\n");
        if modern {
            put(root, "devices/system/cpu/isolated", "2-3,10-11\n");
        }
        put(root, "devices/system/cpu/cpu4/online", "0\n");
        // (cpu, thread siblings, package, core_id, L3 shared_cpu_list) on the modern kernel.
        let cpus: [(u32, &str, &str, &str, &str); 15] = [
            (0, "0,8", "0", "0", "0-3,8-11"),
            (1, "1,9", "0", "1", "0-3,8-11"),
            (2, "2,10", "0", "2", "0-3,8-11"),
            (3, "3,11", "0", "3", "0-3,8-11"),
            (5, "5,13", "1", "1", "5-7,12-15"),
            (6, "6,14", "1", "2", "5-7,12-15"),
            (7, "7,15", "1", "3", "5-7,12-15"),
            (8, "0,8", "0", "0", "0-3,8-11"),
            (9, "1,9", "0", "1", "0-3,8-11"),
            (10, "2,10", "0", "2", "0-3,8-11"),
            (11, "3,11", "0", "3", "0-3,8-11"),
            (12, "12", "1", "0", "5-7,12-15"),
            (13, "5,13", "1", "1", "5-7,12-15"),
            (14, "6,14", "1", "2", "5-7,12-15"),
            (15, "7,15", "1", "3", "5-7,12-15"),
        ];
        for (cpu, siblings, package, core_id, l3) in cpus {
            let d = format!("devices/system/cpu/cpu{cpu}");
            let c = format!("{d}/cache");
            put(root, &format!("{d}/online"), "1\n");
            put(root, &format!("{d}/topology/physical_package_id"), &format!("{package}\n"));
            put(root, &format!("{d}/topology/core_id"), &format!("{core_id}\n"));
            if modern {
                put(root, &format!("{d}/topology/core_cpus_list"), &format!("{siblings}\n"));
                put(root, &format!("{d}/topology/thread_siblings_list"), &format!("{siblings}\n"));
                put(root, &format!("{d}/topology/die_id"), "0\n");
                put(root, &format!("{c}/index0/level"), "1\n");
                put(root, &format!("{c}/index0/type"), "Data\n");
                put(root, &format!("{c}/index0/shared_cpu_list"), &format!("{siblings}\n"));
                put(root, &format!("{c}/index1/level"), "1\n");
                put(root, &format!("{c}/index1/type"), "Instruction\n");
                put(root, &format!("{c}/index1/shared_cpu_list"), &format!("{siblings}\n"));
                put(root, &format!("{c}/index2/level"), "2\n");
                put(root, &format!("{c}/index2/type"), "Unified\n");
                put(root, &format!("{c}/index2/shared_cpu_list"), &format!("{siblings}\n"));
                put(root, &format!("{c}/index3/level"), "3\n");
                put(root, &format!("{c}/index3/type"), "Unified\n");
                put(root, &format!("{c}/index3/shared_cpu_list"), &format!("{l3}\n"));
                put(root, &format!("{c}/uevent"), "");
            } else {
                let siblings = if cpu == 12 { "4,12" } else { siblings };
                put(root, &format!("{d}/topology/thread_siblings_list"), &format!("{siblings}\n"));
                if package == "1" {
                    put(root, &format!("{c}/index3/level"), "3\n");
                    put(root, &format!("{c}/index3/shared_cpu_list"), "4-7,12-15\n");
                }
            }
        }
        put(root, "devices/system/node/online", "0-1\n");
        put(root, "devices/system/node/possible", "0-1\n");
        put(root, "devices/system/node/has_cpu", "0-1\n");
        put(root, "devices/system/node/node0/cpulist", "0-3,8-11\n");
        let node1 = if modern { "5-7,12-15\n" } else { "4-7,12-15\n" };
        put(root, "devices/system/node/node1/cpulist", node1);
        put(root, "devices/system/node/node1/meminfo", "Node 1 MemTotal: 1 kB\n");
    }

    fn real_box_expected(isolated: &str) -> Topology {
        let mut data = TopologyData { offline: set("4"), isolated: set(isolated), ..Default::default() };
        for cpu in (0..16).filter(|c| *c != 4) {
            let core = if cpu == 12 { 12 } else { cpu % 8 };
            let package = cpu % 8 / 4;
            let l3 = if package == 0 { 0 } else { 5 };
            data.cpus.insert(cpu, CpuPlace { core, package, die: 0, node: package, l3 });
        }
        Topology::new(data)
    }

    #[test]
    fn reads_a_modern_kernel_layout() {
        let dir = tempdir();
        write_real_box(dir.path(), true);
        let topo = read(dir.path());
        assert_eq!(topo, real_box_expected("2-3,10-11"));
        assert_eq!(topo.online(), set("0-3,5-15"));
        assert_eq!(topo.siblings(10), set("2,10"));
        assert_eq!(topo.siblings(12), set("12"));
        assert_eq!(topo.nodes()[&1], set("5-7,12-15"));
        assert_eq!(topo.l3_groups()[&5], set("5-7,12-15"));
        assert_eq!(topo.isolated(), set("2-3,10-11"));
    }

    #[test]
    fn reads_an_older_kernel_layout() {
        let dir = tempdir();
        write_real_box(dir.path(), false);
        // Socket 0 has no cache information: its L3 group falls back to package ∩ node.
        assert_eq!(read(dir.path()), real_box_expected(""));
    }

    #[test]
    fn empty_offline_file_and_negative_package_id() {
        let dir = tempdir();
        let root = dir.path();
        put(root, "devices/system/cpu/online", "0-1\n");
        put(root, "devices/system/cpu/offline", "\n");
        for cpu in 0..2 {
            let d = format!("devices/system/cpu/cpu{cpu}/topology");
            put(root, &format!("{d}/physical_package_id"), "-1\n");
            put(root, &format!("{d}/core_cpus_list"), &format!("{cpu}\n"));
        }
        let topo = read(root);
        assert_eq!(topo.offline(), &CpuSet::new());
        assert_eq!(topo.cores().len(), 2);
        assert!(topo.data().cpus.values().all(|p| p.package == 0 && p.node == 0 && p.l3 == 0));
    }

    #[test]
    fn without_numa_or_cache_everything_is_node_zero() {
        let dir = tempdir();
        let topo = Topology::synthetic(2, 2, 2, 2);
        write_sysfs(dir.path(), &topo).unwrap_or_else(|e| panic!("{e}"));
        fs::remove_dir_all(dir.path().join("devices/system/node")).unwrap_or_else(|e| panic!("{e}"));
        for cpu in topo.online().iter() {
            let cache = dir.path().join(format!("devices/system/cpu/cpu{cpu}/cache"));
            fs::remove_dir_all(cache).unwrap_or_else(|e| panic!("{e}"));
        }
        let back = read(dir.path());
        assert_eq!(back.nodes().keys().copied().collect::<Vec<_>>(), vec![0]);
        // One L3 group per package (package ∩ node 0), named by its lowest CPU.
        assert_eq!(back.l3_groups().keys().copied().collect::<Vec<_>>(), vec![0, 2]);
        assert_eq!(back.cores(), topo.cores());
    }

    #[test]
    fn missing_online_file_names_it() {
        let dir = tempdir();
        let err = read_topology(dir.path()).err().unwrap_or_else(|| panic!("read an empty tree"));
        let path = dir.path().join("devices/system/cpu/online");
        assert!(matches!(&err, SysfsError::Read { path: p, .. } if *p == path), "{err:?}");
        let text = chain(&err);
        assert!(text.starts_with(&format!("reading `{}`: ", path.display())), "{text}");
        assert!(err.to_string().contains(&path.display().to_string()));
    }

    #[test]
    fn garbage_in_a_cpulist_names_file_and_token() {
        let dir = tempdir();
        write_real_box(dir.path(), true);
        let path = dir.path().join("devices/system/node/node1/cpulist");
        put(dir.path(), "devices/system/node/node1/cpulist", "4-7,1x\n");
        let err = read_topology(dir.path()).err().unwrap_or_else(|| panic!("read garbage"));
        assert!(
            matches!(&err, SysfsError::CpuList { path: p, source: CpuSetError::Garbage { token } }
                if *p == path && token == "1x"),
            "{err:?}"
        );
        let text = chain(&err);
        assert!(text.contains(&path.display().to_string()) && text.contains("`1x`"), "{text}");
    }

    #[test]
    fn garbage_in_online_and_ids_names_the_file() {
        let dir = tempdir();
        write_real_box(dir.path(), true);
        let pkg = dir.path().join("devices/system/cpu/cpu7/topology/physical_package_id");
        put(dir.path(), "devices/system/cpu/cpu7/topology/physical_package_id", "one\n");
        let err = read_topology(dir.path()).err().unwrap_or_else(|| panic!("read garbage"));
        assert!(matches!(&err, SysfsError::Number { path, text, .. } if *path == pkg && text == "one"));
        assert!(chain(&err).contains(&pkg.display().to_string()), "{}", chain(&err));

        put(dir.path(), "devices/system/cpu/online", "0-3,\n");
        let err = read_topology(dir.path()).err().unwrap_or_else(|| panic!("read garbage"));
        assert!(err.to_string().contains("devices/system/cpu/online"), "{err}");
    }

    #[test]
    fn missing_topology_of_an_online_cpu_names_the_file() {
        let dir = tempdir();
        write_real_box(dir.path(), false);
        let topo = dir.path().join("devices/system/cpu/cpu3/topology");
        fs::remove_file(topo.join("thread_siblings_list")).unwrap_or_else(|e| panic!("{e}"));
        let err = read_topology(dir.path()).err().unwrap_or_else(|| panic!("read a broken tree"));
        assert!(chain(&err).contains("cpu3/topology/thread_siblings_list"), "{}", chain(&err));
    }

    #[test]
    fn online_cpu_missing_from_every_node_is_an_error() {
        let dir = tempdir();
        write_real_box(dir.path(), true);
        put(dir.path(), "devices/system/node/node1/cpulist", "5-7,12-14\n");
        let err = read_topology(dir.path()).err().unwrap_or_else(|| panic!("read a broken tree"));
        assert!(matches!(err, SysfsError::NoNode { cpu: 15, .. }), "{err:?}");
    }
}
