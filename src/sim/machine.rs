//! The simulated host: the sysfs and cgroupfs trees `cpupoold --sandbox DIR` and the tests run
//! against.
//!
//! Data flow: the CLI's `--topology 2x8x2:2` parses into a [`TopologyShape`], which builds a
//! [`Topology`] with [`Topology::synthetic`] (tests may build one by hand, with offline and
//! isolated CPUs). [`write_sysfs`] lays that topology out as the kernel would under a sysfs root,
//! and [`write_cgroupfs`] creates a cgroup2-like root of plain files. From then on the daemon
//! reads and writes those roots with exactly the code it uses on a real host
//! ([`crate::host::sysfs::read_topology`] and the cgroupfs backend), so the sandbox exercises
//! the real paths; only the roots differ, and the kernel's part in the writes (see
//! [`super::cgroup`]).
//!
//! Files are written in the kernel's formats: lists in the kernel list syntax with a trailing
//! newline (`"0-3\n"`, the empty set as `"\n"`), numbers followed by a newline. Only online CPUs
//! get `topology/` and `cache/` directories, and sibling, package, node and cache lists name
//! online CPUs only, as on x86 after a CPU is taken offline.
#![deny(missing_docs)]

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::io;
use std::num::ParseIntError;
use std::path::Path;
use std::str::FromStr;

use crate::core::cpuset::{CpuSet, MAX_CPU};
use crate::core::topology::Topology;

/// The most CPUs a [`TopologyShape`] may have: CPU numbers `0..=MAX_CPU`.
pub const MAX_SHAPE_CPUS: u64 = MAX_CPU as u64 + 1;

/// Writes a sysfs tree under `root` that [`crate::host::sysfs::read_topology`] reads back as `topo`.
///
/// Written: `devices/system/cpu/{online,offline,isolated,possible,present}`; for each CPU
/// `cpuN/online`, and for each online CPU `cpuN/topology/{core_cpus_list,thread_siblings_list,
/// core_siblings_list,package_cpus_list,die_cpus_list,physical_package_id,die_id,core_id}` and
/// `cpuN/cache/index3/{level,type,shared_cpu_list}` (the CPU's L3 group; the L1 and L2 entries a
/// kernel would also show are left out); `devices/system/node/{online,possible,has_cpu}` and
/// `nodeK/cpulist`.
///
/// The read-back equals `topo` when `topo` names each core and L3 group by its lowest online
/// CPU, as [`Topology::synthetic`] and sysfs do. Existing files are overwritten; files of a
/// different topology written earlier are not removed, so give it a fresh directory.
pub fn write_sysfs(root: &Path, topo: &Topology) -> io::Result<()> {
    let cpu_dir = root.join("devices/system/cpu");
    let online = topo.online();
    let present = online.union(topo.offline());
    put(&cpu_dir.join("online"), &list(&online))?;
    put(&cpu_dir.join("offline"), &list(topo.offline()))?;
    put(&cpu_dir.join("isolated"), &list(&topo.data().isolated))?;
    put(&cpu_dir.join("possible"), &list(&present))?;
    put(&cpu_dir.join("present"), &list(&present))?;

    // Group the online CPUs by package and by (package, die), and number the cores within each
    // package as the kernel's `core_id` does (0, 1, ... in CPU order).
    let mut packages: BTreeMap<u32, CpuSet> = BTreeMap::new();
    let mut dies: BTreeMap<(u32, u32), CpuSet> = BTreeMap::new();
    for (&cpu, place) in &topo.data().cpus {
        packages.entry(place.package).or_default().insert(cpu);
        dies.entry((place.package, place.die)).or_default().insert(cpu);
    }
    let mut core_ids: BTreeMap<u32, u32> = BTreeMap::new();
    let mut next_core_id: BTreeMap<u32, u32> = BTreeMap::new();
    for (&core, threads) in topo.cores() {
        let package = threads.first().and_then(|cpu| topo.place(cpu)).map_or(0, |p| p.package);
        let next = next_core_id.entry(package).or_insert(0);
        core_ids.insert(core, *next);
        *next += 1;
    }

    for cpu in topo.offline().difference(&online).iter() {
        put(&cpu_dir.join(format!("cpu{cpu}/online")), "0\n")?;
    }
    for (&cpu, place) in &topo.data().cpus {
        let this = cpu_dir.join(format!("cpu{cpu}"));
        put(&this.join("online"), "1\n")?;

        let t = this.join("topology");
        let siblings = list(&topo.siblings(cpu));
        let package = packages.get(&place.package).map(list).unwrap_or_default();
        let die = dies.get(&(place.package, place.die)).map(list).unwrap_or_default();
        put(&t.join("core_cpus_list"), &siblings)?;
        put(&t.join("thread_siblings_list"), &siblings)?;
        put(&t.join("core_siblings_list"), &package)?;
        put(&t.join("package_cpus_list"), &package)?;
        put(&t.join("die_cpus_list"), &die)?;
        put(&t.join("physical_package_id"), &format!("{}\n", place.package))?;
        put(&t.join("die_id"), &format!("{}\n", place.die))?;
        let core_id = core_ids.get(&place.core).copied().unwrap_or(0);
        put(&t.join("core_id"), &format!("{core_id}\n"))?;

        // Only the L3 entry: L1 and L2 would triple the file count (8192 CPUs already make
        // ~100k files) and nothing reads them.
        let l3 = topo.l3_groups().get(&place.l3).map(list).unwrap_or_else(|| format!("{cpu}\n"));
        let c = this.join("cache/index3");
        put(&c.join("level"), "3\n")?;
        put(&c.join("type"), "Unified\n")?;
        put(&c.join("shared_cpu_list"), &l3)?;
    }

    // The unbound and writeback workqueue masks, as `%*pb` prints a cpumask of the possible
    // CPUs: all of them until someone narrows it (Linux before 6.12 never does by itself).
    let possible = present.last().map_or(1, |l| l + 1);
    let mask = format!("{}\n", crate::core::housekeeping::format_mask(&present, possible));
    put(&root.join("devices/virtual/workqueue/cpumask"), &mask)?;
    put(&root.join("devices/virtual/workqueue/writeback/cpumask"), &mask)?;

    let node_dir = root.join("devices/system/node");
    let nodes: CpuSet = topo.nodes().keys().copied().collect();
    put(&node_dir.join("online"), &list(&nodes))?;
    put(&node_dir.join("possible"), &list(&nodes))?;
    put(&node_dir.join("has_cpu"), &list(&nodes))?;
    for (node, cpus) in topo.nodes() {
        put(&node_dir.join(format!("node{node}/cpulist")), &list(cpus))?;
    }
    Ok(())
}

/// Writes the kernel counters the isolation health sampler reads, where they are missing:
/// `interrupts` (one virtio device IRQ, the local timer and function-call IPIs, all zero),
/// `stat` (per-CPU times, all zero), `softirqs` ([`softirqs_text`]), `schedstat`
/// ([`schedstat_text`]) and `cmdline` (no isolation parameters), in the kernel's formats. Tests rewrite them to make counts move.
pub fn write_procfs(root: &Path, topo: &Topology) -> io::Result<()> {
    let online: Vec<u32> = topo.online().iter().collect();
    let interrupts = root.join("interrupts");
    if !interrupts.exists() {
        put(&interrupts, &interrupts_text(&online, &BTreeMap::new()))?;
    }
    let stat = root.join("stat");
    if !stat.exists() {
        let mut text = "cpu  0 0 0 0 0 0 0 0 0 0\n".to_owned();
        for cpu in &online {
            text.push_str(&format!("cpu{cpu} 0 0 0 0 0 0 0 0 0 0\n"));
        }
        text.push_str("intr 0\nctxt 0\nbtime 0\nprocesses 1\nprocs_running 1\nprocs_blocked 0\n");
        put(&stat, &text)?;
    }
    let softirqs = root.join("softirqs");
    if !softirqs.exists() {
        let possible: Vec<u32> = topo.online().union(topo.offline()).iter().collect();
        put(&softirqs, &softirqs_text(&possible, &BTreeMap::new()))?;
    }
    // A kernel booted without isolation parameters; tests write their own before the start.
    let cmdline = root.join("cmdline");
    if !cmdline.exists() {
        put(&cmdline, "BOOT_IMAGE=/boot/vmlinuz-sandbox root=/dev/vda1 ro quiet\n")?;
    }
    // The node's name when neither k8s.node_name nor NODE_NAME gives one.
    let hostname = root.join("sys/kernel/hostname");
    if !hostname.exists() {
        put(&hostname, "sandbox\n")?;
    }
    let schedstat = root.join("schedstat");
    if !schedstat.exists() {
        put(&schedstat, &schedstat_text(&online, &BTreeMap::new()))?;
    }
    Ok(())
}

/// The softirqs the kernel lists, in its order (`softirq_to_name`, include/linux/interrupt.h).
pub const SOFTIRQS: [&str; 10] =
    ["HI", "TIMER", "NET_TX", "NET_RX", "BLOCK", "IRQ_POLL", "TASKLET", "SCHED", "HRTIMER", "RCU"];

/// `/proc/softirqs` for the `possible` CPUs with `counts[(name, cpu)]` (zero where missing),
/// laid out as fs/proc/softirqs.c prints it: a 20-column indent and `CPU%-8d` per CPU, then
/// `%12s:` and ` %10u` per CPU.
pub fn softirqs_text(possible: &[u32], counts: &BTreeMap<(&str, u32), u64>) -> String {
    let mut text = " ".repeat(20);
    for cpu in possible {
        text.push_str(&format!("CPU{cpu:<8}"));
    }
    text.push('\n');
    for name in SOFTIRQS {
        text.push_str(&format!("{name:>12}:"));
        for cpu in possible {
            text.push_str(&format!(" {:>10}", counts.get(&(name, *cpu)).copied().unwrap_or(0)));
        }
        text.push('\n');
    }
    text
}

/// `/proc/schedstat` (version 15, as Linux 6.1 to 6.12 print it) for the `online` CPUs, each
/// with `switched_in[cpu]` tasks switched in (the ninth field; zero where missing) and one
/// scheduling domain line; the other fields are zero, as with `kernel.sched_schedstats=0`.
pub fn schedstat_text(online: &[u32], switched_in: &BTreeMap<u32, u64>) -> String {
    let mut text = "version 15\ntimestamp 4294892296\n".to_owned();
    let span = online.last().map_or(1, |l| l + 1);
    let mask = crate::core::housekeeping::format_mask(&online.iter().copied().collect(), span);
    for cpu in online {
        let n = switched_in.get(cpu).copied().unwrap_or(0);
        text.push_str(&format!("cpu{cpu} 0 0 0 0 0 0 {} {} {n}\n", n * 1_000_000, n * 20_000));
        text.push_str(&format!("domain0 {mask}{}\n", " 0".repeat(36)));
    }
    text
}

/// `/proc/interrupts` for `online` CPUs with `counts[(label, cpu)]` (zero where missing):
/// device IRQ 32 `virtio1-requests`, `LOC` and `CAL`.
pub fn interrupts_text(online: &[u32], counts: &BTreeMap<(&str, u32), u64>) -> String {
    let mut text = String::from("    ");
    for cpu in online {
        text.push_str(&format!(" {:>10}", format!("CPU{cpu}")));
    }
    text.push('\n');
    for (label, tail) in [
        ("32", "  PCI-MSI 1048576-edge      virtio1-requests"),
        ("LOC", "   Local timer interrupts"),
        ("CAL", "   Function call interrupts"),
    ] {
        text.push_str(&format!("{label:>4}:"));
        for cpu in online {
            text.push_str(&format!(" {:>10}", counts.get(&(label, *cpu)).copied().unwrap_or(0)));
        }
        text.push_str(tail);
        text.push('\n');
    }
    text
}

/// Creates a cgroup2-like root under `root` as plain files: the controllers, an empty
/// `cgroup.subtree_control`, `cpuset.{cpus,mems}.effective` covering the online CPUs and their
/// nodes, and `system.slice/`, `user.slice/` and `init.scope/`, each with empty `cpuset.cpus`,
/// `cpuset.mems` (`"\n"`, as the kernel shows an unset cpuset) and `cgroup.procs` (no bytes, as
/// for a cgroup without processes).
pub fn write_cgroupfs(root: &Path, topo: &Topology) -> io::Result<()> {
    let nodes: CpuSet = topo.nodes().keys().copied().collect();
    put(&root.join("cgroup.controllers"), "cpuset cpu io memory pids\n")?;
    put(&root.join("cgroup.subtree_control"), "\n")?;
    put(&root.join("cpuset.cpus.effective"), &list(&topo.online()))?;
    put(&root.join("cpuset.mems.effective"), &list(&nodes))?;
    for child in ["system.slice", "user.slice", "init.scope"] {
        let dir = root.join(child);
        put(&dir.join("cpuset.cpus"), "\n")?;
        put(&dir.join("cpuset.mems"), "\n")?;
        put(&dir.join("cgroup.procs"), "")?;
    }
    Ok(())
}

/// A set as sysfs prints it: the list syntax and a newline.
fn list(set: &CpuSet) -> String {
    format!("{set}\n")
}

/// Writes `contents` to `path`, creating its directory; errors name the path.
fn put(path: &Path, contents: &str) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).map_err(|e| with_path("creating", dir, e))?;
    }
    fs::write(path, contents).map_err(|e| with_path("writing", path, e))
}

/// Keeps the error's kind and puts the path in its message, since `io::Error` has no path.
fn with_path(action: &str, path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{action} `{}`: {e}", path.display()))
}

/// The shape of a regular simulated machine, as written on the command line:
/// `SOCKETSxCORESxTHREADS[:NUMA]`, e.g. `2x8x2:2` (2 sockets of 8 cores of 2 threads, 2 NUMA
/// nodes). NUMA defaults to one node per socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TopologyShape {
    /// Packages.
    pub sockets: u32,
    /// Cores per package.
    pub cores: u32,
    /// Threads per core.
    pub threads: u32,
    /// NUMA nodes, splitting the cores evenly in CPU order.
    pub numa: u32,
}

/// A part of a [`TopologyShape`], to name in errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ShapePart {
    /// `SOCKETS`.
    Sockets,
    /// `CORES`.
    Cores,
    /// `THREADS`.
    Threads,
    /// `NUMA`.
    Numa,
}

impl fmt::Display for ShapePart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ShapePart::Sockets => "SOCKETS",
            ShapePart::Cores => "CORES",
            ShapePart::Threads => "THREADS",
            ShapePart::Numa => "NUMA",
        })
    }
}

/// Why a topology shape was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    /// Not three `x`-separated parts with an optional `:NUMA`.
    #[error("`{text}` is not SOCKETSxCORESxTHREADS[:NUMA] (e.g. `2x8x2:2`)")]
    Syntax {
        /// The whole argument.
        text: String,
    },
    /// A part is not a number.
    #[error("{part} `{text}` is not a number")]
    Number {
        /// Which part.
        part: ShapePart,
        /// The part as written.
        text: String,
        /// Why it is not a number.
        #[source]
        source: ParseIntError,
    },
    /// A part is zero.
    #[error("{part} must be at least 1")]
    Zero {
        /// Which part.
        part: ShapePart,
    },
    /// More CPUs than the kernel can number.
    #[error("{total} CPUs is too many (at most {MAX_SHAPE_CPUS})")]
    TooManyCpus {
        /// SOCKETS × CORES × THREADS.
        total: u64,
    },
    /// More NUMA nodes than cores, so some node would have no CPU.
    #[error("{numa} NUMA nodes is more than the {cores} cores (each node needs a core)")]
    TooManyNodes {
        /// The NUMA part.
        numa: u32,
        /// SOCKETS × CORES.
        cores: u64,
    },
}

impl TopologyShape {
    /// Logical CPUs in the shape.
    pub fn total_cpus(&self) -> u64 {
        u64::from(self.sockets) * u64::from(self.cores) * u64::from(self.threads)
    }

    /// The machine this shape describes, numbered as Linux numbers x86 CPUs.
    pub fn topology(&self) -> Topology {
        Topology::synthetic(self.sockets, self.cores, self.threads, self.numa)
    }
}

impl FromStr for TopologyShape {
    type Err = ShapeError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let syntax = || ShapeError::Syntax { text: text.to_owned() };
        let (factors, numa) = match text.trim().split_once(':') {
            Some((factors, numa)) => (factors, Some(numa)),
            None => (text.trim(), None),
        };
        let parts: Vec<&str> = factors.split(['x', 'X']).collect();
        let [sockets, cores, threads] = parts[..] else { return Err(syntax()) };
        let sockets = parse_part(ShapePart::Sockets, sockets)?;
        let cores = parse_part(ShapePart::Cores, cores)?;
        let threads = parse_part(ShapePart::Threads, threads)?;
        let numa = numa.map(|n| parse_part(ShapePart::Numa, n)).transpose()?.unwrap_or(sockets);
        let shape = TopologyShape { sockets, cores, threads, numa };
        let total = shape.total_cpus();
        if total > MAX_SHAPE_CPUS {
            return Err(ShapeError::TooManyCpus { total });
        }
        // Topology::synthetic would silently clamp; refuse instead so the shape means what it says.
        let total_cores = u64::from(sockets) * u64::from(cores);
        if u64::from(numa) > total_cores {
            return Err(ShapeError::TooManyNodes { numa, cores: total_cores });
        }
        Ok(shape)
    }
}

fn parse_part(part: ShapePart, text: &str) -> Result<u32, ShapeError> {
    let text = text.trim();
    let n: u32 = text.parse().map_err(|source| ShapeError::Number { part, text: text.to_owned(), source })?;
    if n == 0 {
        return Err(ShapeError::Zero { part });
    }
    Ok(n)
}

/// The command-line syntax, always with the NUMA part: `2x8x2:2`.
impl fmt::Display for TopologyShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}x{}:{}", self.sockets, self.cores, self.threads, self.numa)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(s: &str) -> CpuSet {
        CpuSet::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn shape(text: &str) -> TopologyShape {
        text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    fn shape_err(text: &str) -> ShapeError {
        text.parse::<TopologyShape>().err().unwrap_or_else(|| panic!("{text} parsed"))
    }

    fn cat(path: &Path) -> String {
        fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    #[test]
    fn parses_shapes() {
        assert_eq!(shape("2x8x2:2"), TopologyShape { sockets: 2, cores: 8, threads: 2, numa: 2 });
        assert_eq!(shape("2x8x2"), TopologyShape { sockets: 2, cores: 8, threads: 2, numa: 2 });
        assert_eq!(shape("1x4x1:1"), TopologyShape { sockets: 1, cores: 4, threads: 1, numa: 1 });
        assert_eq!(shape(" 4X2x1:8 "), TopologyShape { sockets: 4, cores: 2, threads: 1, numa: 8 });
        assert_eq!(shape("1x8192x1").total_cpus(), 8192);
        assert_eq!(shape("2x8x2").to_string(), "2x8x2:2");
        assert_eq!(shape(&shape("3x5x2:1").to_string()), shape("3x5x2:1"));
        let topo = shape("2x8x2:2").topology();
        assert_eq!(topo.online(), set("0-31"));
        assert_eq!(topo.nodes().len(), 2);
    }

    #[test]
    fn rejects_bad_shapes_naming_the_part() {
        assert_eq!(shape_err("2x8"), ShapeError::Syntax { text: "2x8".into() });
        assert_eq!(shape_err("2x8x2x1"), ShapeError::Syntax { text: "2x8x2x1".into() });
        assert_eq!(shape_err(""), ShapeError::Syntax { text: "".into() });
        assert!(matches!(
            shape_err("2xeightx2"),
            ShapeError::Number { part: ShapePart::Cores, ref text, .. } if text == "eight"
        ));
        assert!(matches!(
            shape_err("2x8x2:"),
            ShapeError::Number { part: ShapePart::Numa, ref text, .. } if text.is_empty()
        ));
        assert!(matches!(shape_err("-1x8x2"), ShapeError::Number { part: ShapePart::Sockets, .. }));
        assert!(matches!(shape_err("1x1x99999999999"), ShapeError::Number { part: ShapePart::Threads, .. }));
        assert_eq!(shape_err("2x8x0"), ShapeError::Zero { part: ShapePart::Threads });
        assert_eq!(shape_err("0x8x2"), ShapeError::Zero { part: ShapePart::Sockets });
        assert_eq!(shape_err("2x8x2:0"), ShapeError::Zero { part: ShapePart::Numa });
        assert_eq!(shape_err("1x8193x1"), ShapeError::TooManyCpus { total: 8193 });
        assert_eq!(shape_err("65536x65536x65536"), ShapeError::TooManyCpus { total: 65536u64.pow(3) });
        assert_eq!(shape_err("2x2x2:5"), ShapeError::TooManyNodes { numa: 5, cores: 4 });
        let msg = shape_err("2xeightx2").to_string();
        assert!(msg.contains("CORES") && msg.contains("`eight`"), "{msg}");
    }

    #[test]
    fn writes_kernel_formats() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let root = dir.path();
        let topo = shape("2x2x2:2").topology();
        write_sysfs(root, &topo).unwrap_or_else(|e| panic!("{e}"));
        let cpu = root.join("devices/system/cpu");
        assert_eq!(cat(&cpu.join("online")), "0-7\n");
        assert_eq!(cat(&cpu.join("offline")), "\n");
        assert_eq!(cat(&cpu.join("isolated")), "\n");
        assert_eq!(cat(&cpu.join("cpu5/topology/core_cpus_list")), "1,5\n");
        assert_eq!(cat(&cpu.join("cpu5/topology/thread_siblings_list")), "1,5\n");
        assert_eq!(cat(&cpu.join("cpu5/topology/package_cpus_list")), "0-1,4-5\n");
        assert_eq!(cat(&cpu.join("cpu6/topology/physical_package_id")), "1\n");
        assert_eq!(cat(&cpu.join("cpu6/topology/die_id")), "0\n");
        assert_eq!(cat(&cpu.join("cpu7/topology/core_id")), "1\n");
        assert_eq!(cat(&cpu.join("cpu7/cache/index3/level")), "3\n");
        assert_eq!(cat(&cpu.join("cpu7/cache/index3/shared_cpu_list")), "2-3,6-7\n");
        assert_eq!(cat(&cpu.join("cpu7/cache/index3/type")), "Unified\n");
        assert_eq!(cat(&root.join("devices/system/node/node1/cpulist")), "2-3,6-7\n");
        assert_eq!(cat(&root.join("devices/system/node/online")), "0-1\n");
    }

    /// The simulated noise counters are what the health sampler's parsers read on a real
    /// kernel: the ten softirqs for every CPU, each CPU's switches in schedstat's ninth field.
    #[test]
    fn writes_softirqs_and_schedstat_as_the_kernel_prints_them() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let topo = shape("1x4x1:1").topology();
        write_procfs(dir.path(), &topo).unwrap_or_else(|e| panic!("{e}"));
        let soft = crate::core::noise::parse_softirqs(&cat(&dir.path().join("softirqs")));
        assert_eq!(soft.keys().map(String::as_str).collect::<Vec<_>>().len(), 10);
        assert!(soft.values().all(|c| c.keys().copied().eq(0..4) && c.values().all(|n| *n == 0)), "{soft:?}");
        let counts = BTreeMap::from([(("RCU", 3u32), 4_294_967_295u64), (("SCHED", 0), 7)]);
        let text = softirqs_text(&[0, 1, 2, 3], &counts);
        assert!(text.starts_with(&format!("{}CPU0       CPU1       CPU2", " ".repeat(20))), "{text}");
        assert!(text.contains("\n         RCU:          0          0          0 4294967295\n"), "{text}");
        let soft = crate::core::noise::parse_softirqs(&text);
        assert_eq!((soft["RCU"][&3], soft["SCHED"][&0]), (4_294_967_295, 7));
        let sched = crate::core::noise::parse_schedstat(&schedstat_text(&[0, 2], &BTreeMap::from([(2, 41)])));
        assert_eq!(sched, BTreeMap::from([(0, 0), (2, 41)]));
        let written = crate::core::noise::parse_schedstat(&cat(&dir.path().join("schedstat")));
        assert_eq!(written.keys().copied().collect::<Vec<_>>(), [0, 1, 2, 3]);
    }

    #[test]
    fn writes_a_cgroup2_root() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let root = dir.path();
        write_cgroupfs(root, &shape("2x4x2:2").topology()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cat(&root.join("cgroup.controllers")), "cpuset cpu io memory pids\n");
        assert_eq!(cat(&root.join("cgroup.subtree_control")), "\n");
        assert_eq!(cat(&root.join("cpuset.cpus.effective")), "0-15\n");
        assert_eq!(cat(&root.join("cpuset.mems.effective")), "0-1\n");
        for child in ["system.slice", "user.slice", "init.scope"] {
            assert_eq!(cat(&root.join(child).join("cpuset.cpus")), "\n");
            assert_eq!(cat(&root.join(child).join("cpuset.mems")), "\n");
            assert_eq!(cat(&root.join(child).join("cgroup.procs")), "");
        }
    }

    #[test]
    fn write_errors_name_the_path() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        // A file where a directory must go.
        fs::write(dir.path().join("devices"), "").unwrap_or_else(|e| panic!("{e}"));
        let err = write_sysfs(dir.path(), &shape("1x1x1").topology())
            .err()
            .unwrap_or_else(|| panic!("wrote through a file"));
        assert!(err.to_string().contains(&dir.path().join("devices").display().to_string()), "{err}");
    }
}
