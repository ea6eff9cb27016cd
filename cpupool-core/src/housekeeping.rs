//! Kernel housekeeping and isolation health, decided without I/O.
//!
//! Data flow: the host reads `/proc/cmdline`, the workqueue cpumask files, `/proc/interrupts`,
//! `/proc/stat` and the pool slices' `cpu.stat`, and hands the text here. This module parses
//! them, decides which mask the unbound workqueues should have, and turns two samples into
//! rates per isolated CPU ([`assess`]). Nothing here reads a file or a clock: the caller passes
//! the time between samples.
#![deny(missing_docs)]

use std::collections::BTreeMap;

use super::cpuset::CpuSet;
use super::noise::{self, NoiseRate};

pub use super::boot::{parse_cmdline, BootIsolation};

/// Why a layout leaves no CPU for housekeeping.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no housekeeping CPU: the reserved pool's CPUs {reserved} are all isolated by the kernel (isolcpus=/nohz_full= {kernel}), which leaves none for interrupts, kernel threads and host slices")]
pub struct NoHousekeeping {
    /// The reserved pool's CPUs.
    pub reserved: CpuSet,
    /// The CPUs the kernel isolated at boot.
    pub kernel: CpuSet,
}

/// The CPUs left for interrupts, kernel threads and host slices: the reserved pool's, less those
/// the kernel isolated at boot. Pools other than the reserved one never count: exclusive and
/// isolated pools belong to their workloads.
pub fn housekeeping_cpus(reserved: &CpuSet, kernel_isolated: &CpuSet) -> Result<CpuSet, NoHousekeeping> {
    let left = reserved.difference(kernel_isolated);
    if left.is_empty() {
        return Err(NoHousekeeping { reserved: reserved.clone(), kernel: kernel_isolated.clone() });
    }
    Ok(left)
}

/// Why a cpumask could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{text}` is not a hexadecimal CPU mask")]
pub struct MaskError {
    /// The text.
    pub text: String,
}

/// Parses the kernel's hexadecimal cpumask (`f`, `ff,ffffffff`: 32-bit groups separated by
/// commas, most significant first), as `workqueue/cpumask` shows it.
pub fn parse_mask(text: &str) -> Result<CpuSet, MaskError> {
    let err = || MaskError { text: text.trim().to_owned() };
    let digits: String = text.trim().chars().filter(|c| *c != ',').collect();
    if digits.is_empty() {
        return Err(err());
    }
    let mut set = CpuSet::new();
    for (i, c) in digits.chars().rev().enumerate() {
        let nibble = c.to_digit(16).ok_or_else(err)?;
        for bit in 0..4 {
            if nibble & (1 << bit) != 0 {
                let cpu = u32::try_from(i * 4 + bit).map_err(|_| err())?;
                set.insert(cpu);
            }
        }
    }
    Ok(set)
}

/// Formats `cpus` as the kernel prints a cpumask of `bits` CPUs: 32-bit groups of eight hex
/// digits separated by commas, the first group only as wide as the CPUs it holds (`f` for four
/// CPUs, `ff,ffffffff` for forty).
pub fn format_mask(cpus: &CpuSet, bits: u32) -> String {
    let bits = bits.max(cpus.last().map_or(1, |l| l + 1)).max(1);
    let groups = bits.div_ceil(32);
    let mut out = Vec::new();
    for g in (0..groups).rev() {
        let mut word = 0u32;
        for bit in 0..32 {
            if cpus.contains(g * 32 + bit) {
                word |= 1 << bit;
            }
        }
        let width = if g == groups - 1 { (bits - g * 32).div_ceil(4) as usize } else { 8 };
        out.push(format!("{word:0width$x}"));
    }
    out.join(",")
}

/// What the unbound workqueues' (or writeback's) mask should be with `isolated` CPUs taken out
/// of `current`; `None` when nothing needs writing (the kernel already keeps them off, as
/// Linux 6.12 does for isolated partitions, or there is no isolation).
pub fn trimmed_mask(current: &CpuSet, isolated: &CpuSet) -> Option<CpuSet> {
    let want = current.difference(isolated);
    (want != *current && !want.is_empty()).then_some(want)
}

/// `PF_KTHREAD` in a task's flags (`/proc/PID/stat` field 9, include/linux/sched.h): a kernel
/// thread.
pub const PF_KTHREAD: u32 = 0x0020_0000;
/// `PF_NO_SETAFFINITY`: the kernel refuses affinity changes from userspace (per-CPU kthreads
/// bound with `kthread_bind`, workqueue workers, whose CPUs follow the workqueue masks).
pub const PF_NO_SETAFFINITY: u32 = 0x0400_0000;

/// What `/proc/PID/stat` says of a task that matters for re-pinning it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskStat {
    /// Its name (field 2, without the parentheses).
    pub comm: String,
    /// Its `PF_*` flags (field 9).
    pub flags: u32,
    /// When it started, in clock ticks after boot (field 22): with the pid, which task it is
    /// (pids are reused).
    pub start: u64,
}

impl TaskStat {
    /// A kernel thread whose affinity userspace may change: one the kernel does not bind.
    pub fn movable_kthread(&self) -> bool {
        self.flags & PF_KTHREAD != 0 && self.flags & PF_NO_SETAFFINITY == 0
    }
}

/// Parses `/proc/PID/stat`. The name may hold spaces and parentheses, so the fields after it
/// are counted from its last `)`.
pub fn parse_task_stat(text: &str) -> Option<TaskStat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_owned();
    let rest: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    // rest[0] is field 3 (state).
    let flags = rest.get(9 - 3)?.parse().ok()?;
    let start = rest.get(22 - 3)?.parse().ok()?;
    Some(TaskStat { comm, flags, start })
}

/// `Cpus_allowed_list` from `/proc/PID/status`.
pub fn parse_allowed(status: &str) -> Option<CpuSet> {
    status.lines().find_map(|l| CpuSet::parse(l.strip_prefix("Cpus_allowed_list:")?.trim()).ok())
}

/// The affinity a movable kernel thread should have, or `None` to leave it as it is.
///
/// `current` is what it has now, `remembered` what it had before cpupoold first narrowed it.
/// A thread never narrowed is only touched when it may run on an `isolated` CPU and on more
/// than one CPU (one CPU is a per-CPU thread the kernel placed, whatever its flags say). It is
/// narrowed to the `housekeeping` CPUs it may use, or, when it may use none (a per-node
/// thread of another node), to its own CPUs less the isolated ones. With no isolated CPU, a
/// narrowed thread gets back what it had.
pub fn kthread_affinity(
    current: &CpuSet,
    remembered: Option<&CpuSet>,
    isolated: &CpuSet,
    housekeeping: &CpuSet,
) -> Option<CpuSet> {
    let base = match remembered {
        Some(r) => r,
        None if current.len() <= 1 || current.is_disjoint(isolated) => return None,
        None => current,
    };
    let want = if isolated.is_empty() {
        base.clone()
    } else {
        [base.intersection(housekeeping), base.difference(isolated), housekeeping.clone()]
            .into_iter()
            .find(|s| !s.is_empty())?
    };
    (want != *current).then_some(want)
}

/// One `/proc/interrupts` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IrqLine {
    /// Counts per CPU.
    pub counts: BTreeMap<u32, u64>,
    /// Device IRQs: the action names (`virtio1-requests`); others: the kernel's description.
    pub name: String,
}

/// Parsed `/proc/interrupts`: lines by their label (`32`, `LOC`, `CAL`).
pub type Interrupts = BTreeMap<String, IrqLine>;

/// Parses `/proc/interrupts`: a header naming the CPU columns (`CPU0 CPU2`: only online CPUs
/// appear), then `LABEL: count... [chip hwirq-type] names`.
pub fn parse_interrupts(text: &str) -> Interrupts {
    let mut lines = text.lines();
    let cpus = noise::cpu_columns(lines.next().unwrap_or(""));
    let mut out = Interrupts::new();
    for line in lines {
        let Some((label, rest)) = line.split_once(':') else { continue };
        let label = label.trim().to_owned();
        let mut words = rest.split_whitespace().peekable();
        let mut counts = BTreeMap::new();
        for &cpu in &cpus {
            match words.peek().and_then(|w| w.parse::<u64>().ok()) {
                Some(n) => {
                    counts.insert(cpu, n);
                    words.next();
                }
                None => break,
            }
        }
        let tail: Vec<&str> = words.collect();
        let name = if label.chars().all(|c| c.is_ascii_digit()) {
            // `PCI-MSI 1048576-edge virtio1-requests`: the action names come last.
            tail.last().copied().unwrap_or("").to_owned()
        } else {
            tail.join(" ")
        };
        out.insert(label, IrqLine { counts, name });
    }
    out
}

/// What kind of interrupt a `/proc/interrupts` label counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IrqKind {
    /// A device IRQ (numbered): movable, the point of isolation.
    Device,
    /// Inter-processor interrupts (x86 `RES`, `CAL`, `TLB`, `IWI`; arm64 `IPIn`): reported,
    /// not fixable from here.
    Ipi,
    /// The local timer (`LOC`).
    Timer,
    /// Anything else (NMIs, machine checks, counters): not counted.
    Other,
}

/// The kind of `label`.
pub fn irq_kind(label: &str) -> IrqKind {
    match label {
        l if l.chars().all(|c| c.is_ascii_digit()) => IrqKind::Device,
        "LOC" => IrqKind::Timer,
        "RES" | "CAL" | "TLB" | "IWI" => IrqKind::Ipi,
        l if l.starts_with("IPI") => IrqKind::Ipi,
        _ => IrqKind::Other,
    }
}

/// Per CPU task time from `/proc/stat`, in clock ticks: `user + nice + system` (guest time is
/// already in user). Interrupt time is not task time.
pub fn parse_stat(text: &str) -> BTreeMap<u32, u64> {
    text.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let cpu: u32 = w.next()?.strip_prefix("cpu")?.parse().ok()?;
            let f: Vec<u64> = w.take(3).filter_map(|x| x.parse().ok()).collect();
            (f.len() == 3).then(|| (cpu, f.iter().sum()))
        })
        .collect()
}

/// `usage_usec` from a cgroup's `cpu.stat`.
pub fn parse_cpu_stat(text: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix("usage_usec ")?.trim().parse().ok())
}

/// One reading of the counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sample {
    /// `/proc/interrupts`.
    pub interrupts: Interrupts,
    /// Task ticks per CPU (`/proc/stat`).
    pub task_ticks: BTreeMap<u32, u64>,
    /// Each isolated pool's cgroups' `usage_usec` (its slice, its containers' cgroups), by
    /// cgroup, where readable.
    pub pool_usage_usec: BTreeMap<String, BTreeMap<String, u64>>,
    /// Each isolated pool's existing cgroups' `cpuset.cpus.partition` and
    /// `cpuset.cpus.effective`, by cgroup.
    pub pool_cpusets: BTreeMap<String, BTreeMap<String, String>>,
    /// Softirqs and tasks switched in (`/proc/softirqs`, `/proc/schedstat`).
    pub noise: noise::Counters,
}

/// One device IRQ firing on an isolated CPU.
#[derive(Debug, Clone, PartialEq)]
pub struct IrqSource {
    /// Its number.
    pub irq: String,
    /// Its action names.
    pub name: String,
    /// Interrupts per second on this CPU.
    pub per_sec: f64,
}

/// One isolated CPU over one interval.
#[derive(Debug, Clone, PartialEq)]
pub struct CpuHealth {
    /// The CPU.
    pub cpu: u32,
    /// Device interrupts per second.
    pub device_per_sec: f64,
    /// The device IRQs responsible, busiest first.
    pub sources: Vec<IrqSource>,
    /// Inter-processor interrupts per second.
    pub ipi_per_sec: f64,
    /// Local timer interrupts per second.
    pub timer_per_sec: f64,
    /// Every source by name, zeros included: the local timer (`timer:LOC`), each IPI kind
    /// (`ipi:CAL`), device interrupts (`device`), each softirq (`softirq:RCU`) and tasks
    /// switched in (`sched:switched_in`), where the kernel's files list them.
    pub noise: Vec<NoiseRate>,
}

/// One isolated pool over one interval.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolHealth {
    /// Its CPUs.
    pub cpus: Vec<CpuHealth>,
    /// CPU time used on its CPUs by tasks outside its slice, in percent of its CPUs' time;
    /// `None` where the slice's `cpu.stat` cannot be read.
    pub foreign_percent: Option<f64>,
}

/// Foreign task time above this (percent of the pool's CPU time) breaks isolation: the
/// measured good case is 0.01–0.06 %, kernel threads that must run there included.
pub const FOREIGN_LIMIT_PERCENT: f64 = 1.0;

impl PoolHealth {
    /// Whether isolation holds: no device interrupt and no foreign task time to speak of.
    pub fn holds(&self) -> bool {
        self.cpus.iter().all(|c| c.device_per_sec == 0.0)
            && self.foreign_percent.is_none_or(|f| f < FOREIGN_LIMIT_PERCENT)
    }

    /// `holds`, or what breaks it: the busiest device IRQ and its CPU, foreign task time.
    pub fn summary(&self) -> String {
        let mut parts = Vec::new();
        let worst = self
            .cpus
            .iter()
            .filter(|c| c.device_per_sec > 0.0)
            .max_by(|a, b| a.device_per_sec.total_cmp(&b.device_per_sec));
        if let Some(c) = worst {
            let mut s = format!("{} IRQ/s", rate(c.device_per_sec));
            if let Some(top) = c.sources.first() {
                s.push_str(&format!(" from irq {} {}", top.irq, top.name));
            }
            s.push_str(&format!(" on CPU {}", c.cpu));
            let others = self.cpus.iter().filter(|x| x.device_per_sec > 0.0).count() - 1;
            if others > 0 {
                s.push_str(&format!(" (and {others} more CPU(s))"));
            }
            parts.push(s);
        }
        if let Some(f) = self.foreign_percent.filter(|f| *f >= FOREIGN_LIMIT_PERCENT) {
            parts.push(format!("{f:.1}% CPU time used by tasks outside the pool"));
        }
        if parts.is_empty() {
            "holds".to_owned()
        } else {
            parts.join("; ")
        }
    }
}

/// A rate as people read it: whole numbers from 10 up, one decimal below.
pub fn rate(r: f64) -> String {
    if r >= 10.0 {
        format!("{r:.0}")
    } else {
        format!("{r:.1}")
    }
}

/// One CPU between `before` and `after`, `secs` (positive) apart.
fn cpu_health(cpu: u32, before: &Sample, after: &Sample, secs: f64) -> CpuHealth {
    let (mut device, mut ipi, mut timer) = (0u64, 0u64, 0u64);
    let (mut sources, mut by_label) = (Vec::new(), Vec::new());
    for (label, line) in &after.interrupts {
        let Some(&now) = line.counts.get(&cpu) else { continue };
        // A counter that went down is a new IRQ with the number reused: count from zero.
        let d = noise::grew(before.interrupts.get(label).and_then(|l| l.counts.get(&cpu)).copied(), now);
        let kind = irq_kind(label);
        match kind {
            IrqKind::Device if d > 0 => {
                device += d;
                sources.push(IrqSource {
                    irq: label.clone(),
                    name: line.name.clone(),
                    per_sec: d as f64 / secs,
                });
            }
            IrqKind::Device | IrqKind::Other => {}
            IrqKind::Ipi => ipi += d,
            IrqKind::Timer => timer += d,
        }
        let source = match kind {
            IrqKind::Ipi => format!("ipi:{label}"),
            IrqKind::Timer => format!("timer:{label}"),
            _ => continue,
        };
        by_label.push(NoiseRate { source, per_sec: d as f64 / secs });
    }
    sources.sort_by(|a, b| b.per_sec.total_cmp(&a.per_sec));
    let mut noise = by_label;
    noise.push(NoiseRate { source: "device".to_owned(), per_sec: device as f64 / secs });
    noise.extend(noise::rates(&before.noise, &after.noise, cpu, secs));
    CpuHealth {
        cpu,
        device_per_sec: device as f64 / secs,
        sources,
        ipi_per_sec: ipi as f64 / secs,
        timer_per_sec: timer as f64 / secs,
        noise,
    }
}

/// The health of a pool on `cpus` between `before` and `after`, `secs` apart; `None` where
/// its cgroups' partitions or CPUs changed in between (a container's partition made or undone,
/// a cgroup come or gone): such a window measures the change, tasks leaving the CPUs it takes,
/// not the isolation, and the next one starts from `after`.
pub fn assess(pool: &str, cpus: &CpuSet, before: &Sample, after: &Sample, secs: f64) -> Option<PoolHealth> {
    if before.pool_cpusets.get(pool) != after.pool_cpusets.get(pool) {
        return None;
    }
    let secs = if secs > 0.0 { secs } else { 1.0 };
    let health = cpus.iter().map(|cpu| cpu_health(cpu, before, after, secs)).collect();
    // The pool's own time, from its cgroups' counters, where each was read at both ends.
    let own = match (before.pool_usage_usec.get(pool), after.pool_usage_usec.get(pool)) {
        (Some(a), Some(b)) if a.keys().eq(b.keys()) => {
            Some(b.iter().map(|(cg, now)| now.saturating_sub(a.get(cg).copied().unwrap_or(0))).sum::<u64>())
        }
        _ => None,
    };
    let foreign_percent = match own {
        Some(own_usec) if !cpus.is_empty() => {
            let ticks: u64 = cpus
                .iter()
                .map(|c| {
                    let t = |s: &Sample| s.task_ticks.get(&c).copied().unwrap_or(0);
                    t(after).saturating_sub(t(before))
                })
                .sum();
            // USER_HZ is 100: a tick is 10 ms.
            let busy_usec = ticks as f64 * 10_000.0;
            let own_usec = own_usec as f64;
            let total_usec = secs * 1e6 * cpus.len() as f64;
            Some(((busy_usec - own_usec).max(0.0) / total_usec * 100.0).min(100.0))
        }
        _ => None,
    };
    Some(PoolHealth { cpus: health, foreign_percent })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(s: &str) -> CpuSet {
        CpuSet::parse(s).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn housekeeping_needs_a_reserved_cpu_the_kernel_did_not_isolate() {
        assert_eq!(housekeeping_cpus(&set("0-1"), &set("1-3")), Ok(set("0")));
        let e = housekeeping_cpus(&set("0-1"), &set("0-3")).err().unwrap_or_else(|| panic!("accepted"));
        assert!(e.to_string().contains("reserved pool's CPUs 0-1"), "{e}");
    }

    #[test]
    fn masks_in_the_kernels_format() {
        assert_eq!(format_mask(&set("0-3"), 4), "f");
        assert_eq!(format_mask(&set("0-1"), 4), "3");
        assert_eq!(format_mask(&set("0-39"), 40), "ff,ffffffff");
        assert_eq!(format_mask(&set("0,33"), 40), "02,00000001");
        assert_eq!(parse_mask("ff,ffffffff\n"), Ok(set("0-39")));
        assert_eq!(parse_mask("3"), Ok(set("0-1")));
        assert_eq!(parse_mask("00000000,0000000c"), Ok(set("2-3")));
        for s in ["0-1", "", "xyz"] {
            assert!(parse_mask(s).is_err(), "{s}");
        }
        for cpus in ["0", "0-5", "1,31-33,63", "0-127"] {
            assert_eq!(parse_mask(&format_mask(&set(cpus), 128)), Ok(set(cpus)));
        }
    }

    #[test]
    fn trimmed_mask_only_when_the_kernel_left_isolated_cpus_in() {
        assert_eq!(trimmed_mask(&set("0-3"), &set("2-3")), Some(set("0-1")));
        // 6.12: the kernel took them out itself.
        assert_eq!(trimmed_mask(&set("0-1"), &set("2-3")), None);
        assert_eq!(trimmed_mask(&set("0-3"), &CpuSet::new()), None);
        // Never an empty mask.
        assert_eq!(trimmed_mask(&set("2-3"), &set("2-3")), None);
    }

    const INTERRUPTS: &str = "           CPU0       CPU1       CPU2       CPU3       \n  \
        0:         44          0          0          0   IO-APIC   2-edge      timer\n \
        32:          0          5        100          0  PCI-MSI 1048576-edge      virtio1-requests\n \
        33:          1          0          0          0  PCI-MSI 1048577-edge      virtio2-config\n\
        NMI:          0          0          0          0   Non-maskable interrupts\n\
        LOC:       1000       1000         10          0   Local timer interrupts\n\
        CAL:          3          3        246          0   Function call interrupts\n\
        ERR:          0\n";

    fn sample(text: &str) -> Sample {
        Sample { interrupts: parse_interrupts(text), ..Default::default() }
    }

    #[test]
    fn interrupts_parse_by_label_and_cpu() {
        let i = parse_interrupts(INTERRUPTS);
        let l = &i["32"];
        assert_eq!(l.name, "virtio1-requests");
        assert_eq!(l.counts.get(&2), Some(&100));
        assert_eq!(i["CAL"].name, "Function call interrupts");
        assert_eq!(i["ERR"].counts.get(&0), Some(&0));
        assert_eq!(irq_kind("32"), IrqKind::Device);
        assert_eq!(irq_kind("CAL"), IrqKind::Ipi);
        assert_eq!(irq_kind("IPI3"), IrqKind::Ipi);
        assert_eq!(irq_kind("LOC"), IrqKind::Timer);
        assert_eq!(irq_kind("NMI"), IrqKind::Other);
    }

    #[test]
    fn assess_names_the_irq_and_cpu_responsible() {
        let before = sample(INTERRUPTS);
        let after = sample(
            &INTERRUPTS
                .replace("        100          0  PCI", "        242          0  PCI")
                .replace("         10          0   Local", "         30          0   Local")
                .replace("        246          0   Function", "        738          0   Function"),
        );
        let h = assess("dp", &set("2-3"), &before, &after, 2.0).unwrap_or_else(|| panic!("not assessed"));
        assert_eq!(h.cpus[0].device_per_sec, 71.0);
        assert_eq!(h.cpus[0].sources[0].name, "virtio1-requests");
        assert_eq!(h.cpus[0].ipi_per_sec, 246.0);
        assert_eq!(h.cpus[0].timer_per_sec, 10.0);
        assert_eq!(h.cpus[1].device_per_sec, 0.0);
        assert!(!h.holds());
        assert_eq!(h.summary(), "71 IRQ/s from irq 32 virtio1-requests on CPU 2");
        let noise = |c: usize| -> Vec<(String, f64)> {
            h.cpus[c].noise.iter().map(|n| (n.source.clone(), n.per_sec)).collect()
        };
        // Each IPI kind and the tick by the kernel's label, device IRQs as one source.
        let want = |v: [f64; 3]| {
            vec![("ipi:CAL".to_owned(), v[0]), ("timer:LOC".to_owned(), v[1]), ("device".to_owned(), v[2])]
        };
        assert_eq!(noise(0), want([246.0, 10.0, 71.0]));
        assert_eq!(noise(1), want([0.0, 0.0, 0.0]), "zeros are reported, not left out");
        let quiet =
            assess("dp", &set("2-3"), &before, &before, 2.0).unwrap_or_else(|| panic!("not assessed"));
        assert!(quiet.holds());
        assert_eq!(quiet.summary(), "holds");
    }

    #[test]
    fn foreign_time_is_busy_time_less_the_pools_own() {
        let stat0 = "cpu  1 2 3 4\ncpu2 100 0 50 900 0 0 0 0 0 0\ncpu3 10 0 0 900\nintr 5\n";
        let stat1 = "cpu  1 2 3 4\ncpu2 200 0 60 900 0 0 0 0 0 0\ncpu3 10 0 2 1100\n";
        assert_eq!(parse_stat(stat0).get(&2), Some(&150));
        let mut before = Sample { task_ticks: parse_stat(stat0), ..Default::default() };
        let mut after = Sample { task_ticks: parse_stat(stat1), ..Default::default() };
        // 112 ticks = 1.12 s busy over 2 CPUs x 2 s; the pool ran 1.0 s of it.
        let slice = |usec| BTreeMap::from([("cpupool.slice/cpupool-dp.slice".to_owned(), usec)]);
        before.pool_usage_usec.insert("dp".into(), slice(5_000_000));
        after.pool_usage_usec.insert("dp".into(), slice(6_000_000));
        let h = assess("dp", &set("2-3"), &before, &after, 2.0).unwrap_or_else(|| panic!("not assessed"));
        let f = h.foreign_percent.unwrap_or_else(|| panic!("no foreign time"));
        // A cgroup whose counter was read at one end only leaves the pool's own time unknown.
        let ctr = "kubepods.slice/kubepods-podA.slice/cri-containerd-a.scope".to_owned();
        let mut ran = before.clone();
        ran.pool_usage_usec.entry("dp".into()).or_default().insert(ctr, 100_000);
        let unknown = assess("dp", &set("2-3"), &ran, &after, 2.0).and_then(|h| h.foreign_percent);
        assert_eq!(unknown, None);
        assert!((f - 3.0).abs() < 1e-9, "{f}");
        assert!(h.summary().contains("3.0% CPU time used by tasks outside the pool"), "{}", h.summary());
        assert_eq!(parse_cpu_stat("usage_usec 42\nuser_usec 40\n"), Some(42));
        let web = assess("web", &set("2-3"), &before, &after, 2.0).and_then(|h| h.foreign_percent);
        assert_eq!(web, None);
    }

    #[test]
    fn a_window_over_which_the_pools_partitions_changed_is_not_assessed() {
        // A container's scope became a partition in between: until then other tasks could run
        // on the CPU it takes, and did; that is the change, not a leak.
        let stat0 = "cpu3 10 0 0 900\n";
        let stat1 = "cpu3 60 0 0 1100\n";
        let slice = "cpupool.slice/cpupool-iso.slice".to_owned();
        let ctr = "kubepods.slice/kubepods-podA.slice/cri-containerd-a.scope".to_owned();
        let cpusets = |entries: &[(&String, &str)]| {
            let m = entries.iter().map(|(c, v)| ((*c).clone(), (*v).to_owned())).collect::<BTreeMap<_, _>>();
            BTreeMap::from([("iso".to_owned(), m)])
        };
        let usage = |entries: &[(&String, u64)]| {
            let m = entries.iter().map(|(c, v)| ((*c).clone(), *v)).collect::<BTreeMap<_, _>>();
            BTreeMap::from([("iso".to_owned(), m)])
        };
        let before = Sample {
            task_ticks: parse_stat(stat0),
            pool_cpusets: cpusets(&[(&slice, "isolated 3"), (&ctr, "member 3")]),
            pool_usage_usec: usage(&[(&slice, 0), (&ctr, 1_000)]),
            ..Default::default()
        };
        let mut after = Sample {
            task_ticks: parse_stat(stat1),
            pool_cpusets: cpusets(&[(&slice, "isolated "), (&ctr, "isolated 3")]),
            pool_usage_usec: usage(&[(&slice, 0), (&ctr, 1_000)]),
            ..Default::default()
        };
        assert_eq!(assess("iso", &set("3"), &before, &after, 2.0), None);
        // The same 0.5 s of other tasks' time with the partitions as they were is a leak.
        after.pool_cpusets = before.pool_cpusets.clone();
        let h = assess("iso", &set("3"), &before, &after, 2.0).unwrap_or_else(|| panic!("not assessed"));
        assert!(!h.holds(), "{}", h.summary());
        assert!(h.summary().contains("25.0% CPU time used by tasks outside the pool"), "{}", h.summary());
        // A container that started (its cgroup new) changes them too.
        let mut started = before.clone();
        started.pool_cpusets.insert("iso".into(), cpusets(&[(&slice, "isolated 3")])["iso"].clone());
        assert_eq!(assess("iso", &set("3"), &started, &before, 2.0), None);
    }

    #[test]
    fn task_stat_flags_and_start_after_the_last_parenthesis() {
        // kswapd0 on 6.1: PF_KTHREAD | PF_MEMALLOC | PF_KSWAPD ...; a name with `) (` in it.
        let line = "97 (kswapd0) S 2 0 0 0 -1 10758208 0 0 0 0 0 3 0 0 20 0 1 0 54 0 0 184467 0 0 0";
        let t = parse_task_stat(line).unwrap_or_else(|| panic!("not parsed"));
        assert_eq!(t.comm, "kswapd0");
        assert_eq!(t.flags, 10_758_208);
        assert_eq!(t.start, 54);
        assert!(t.movable_kthread());
        let odd = line.replace("(kswapd0)", "(a) (b c)");
        assert_eq!(parse_task_stat(&odd).map(|t| t.comm), Some("a) (b c".to_owned()));
        // migration/2: bound by the kernel.
        let bound = line.replace("10758208", &(PF_KTHREAD | PF_NO_SETAFFINITY | 0x40).to_string());
        assert!(!parse_task_stat(&bound).is_some_and(|t| t.movable_kthread()));
        // A user process.
        let user = line.replace("10758208", "4194560");
        assert!(!parse_task_stat(&user).is_some_and(|t| t.movable_kthread()));
        assert_eq!(parse_task_stat("97 (x) S 2"), None);
        assert_eq!(parse_allowed("Name:\tkswapd0\nCpus_allowed_list:\t0-3\n"), Some(set("0-3")));
        assert_eq!(parse_allowed("Name:\tx\n"), None);
    }

    #[test]
    fn kthreads_go_to_housekeeping_cpus_and_come_back() {
        let (iso, hk) = (set("2-3"), set("0"));
        // On the isolated CPUs: narrowed to housekeeping.
        assert_eq!(kthread_affinity(&set("0-3"), None, &iso, &hk), Some(set("0")));
        // Not on them, or per-CPU: left alone.
        assert_eq!(kthread_affinity(&set("0-1"), None, &iso, &hk), None);
        assert_eq!(kthread_affinity(&set("2"), None, &iso, &hk), None);
        // A node-1 thread with no housekeeping CPU on its node keeps its node less isolation.
        assert_eq!(kthread_affinity(&set("2-5"), None, &iso, &hk), Some(set("4-5")));
        // Only isolated CPUs: the housekeeping ones.
        assert_eq!(kthread_affinity(&set("2-3"), None, &iso, &hk), Some(set("0")));
        // Already narrowed: nothing to write; isolation resized: from what it had.
        assert_eq!(kthread_affinity(&set("0"), Some(&set("0-3")), &iso, &hk), None);
        assert_eq!(kthread_affinity(&set("0"), Some(&set("0-3")), &set("3"), &set("0-1")), Some(set("0-1")));
        // Isolation ended: back to what it had.
        assert_eq!(kthread_affinity(&set("0"), Some(&set("0-3")), &CpuSet::new(), &hk), Some(set("0-3")));
        assert_eq!(kthread_affinity(&set("0-3"), Some(&set("0-3")), &CpuSet::new(), &hk), None);
        assert_eq!(kthread_affinity(&set("0-3"), None, &CpuSet::new(), &hk), None);
    }
}
