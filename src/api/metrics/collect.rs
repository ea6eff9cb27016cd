//! What a scrape computes besides the counters: the gauges of the engine's latest published
//! snapshot (pools, assignments, partitions, isolation health, classes) and the usual
//! `process_*` families of the daemon process.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Unit;
use tokio::sync::watch;

use crate::core::boot::{self, Param};
use crate::core::cpuset::CpuSet;
use crate::core::state::Target;
use crate::engine::Snapshot;

/// The families computed from the latest snapshot at every scrape.
#[derive(Debug)]
pub(super) struct SnapshotCollector {
    pub(super) snapshots: watch::Receiver<Snapshot>,
}

/// Most IRQs named per isolated CPU: the busiest ones, so the `irq` label stays bounded
/// whatever the host's interrupt count.
pub const MAX_IRQ_SOURCES: usize = 3;

/// The kernel's partition text reduced to its state (`isolated invalid (reason)` gives
/// `isolated invalid`): the reason is free text and would make a label of unbounded values.
fn partition_state(text: &str) -> &str {
    let s = text.split(" (").next().unwrap_or(text).trim();
    if s.is_empty() {
        "none"
    } else {
        s
    }
}

fn target_kind(t: &Target) -> &'static str {
    match t {
        Target::Unit(_) => "unit",
        Target::Cgroup(_) => "cgroup",
        Target::Pid(_) => "pid",
        Target::Kubelet(_) => "kubelet",
    }
}

/// One gauge family with one sample per label set.
fn gauges<L: EncodeLabelSet>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    samples: &[(L, f64)],
) -> Result<(), std::fmt::Error> {
    if samples.is_empty() {
        return Ok(());
    }
    // Ended with a full stop, as the registry ends the help of the families registered there.
    let help = format!("{help}.");
    let mut m = enc.encode_descriptor(name, &help, unit, prometheus_client::metrics::MetricType::Gauge)?;
    for (labels, v) in samples {
        ConstGauge::new(*v).encode(m.encode_family(labels)?)?;
    }
    Ok(())
}

type Labels = Vec<(&'static str, String)>;

fn b(v: bool) -> f64 {
    if v {
        1.0
    } else {
        0.0
    }
}

impl Collector for SnapshotCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // A clone of the Arcs: the watch's lock is held for no longer than that.
        let snap = self.snapshots.borrow().clone();
        pools(&mut enc, &snap)?;
        assignments(&mut enc, &snap)?;
        isolation(&mut enc, &snap)?;
        classes(&mut enc, &snap)?;
        gauges(
            &mut enc,
            "build_info",
            "The daemon's version and backend (always 1)",
            None,
            &[(
                vec![("version", env!("CARGO_PKG_VERSION").to_owned()), ("backend", snap.backend.to_owned())],
                1.0,
            )],
        )
    }
}

fn pool(name: &str) -> Labels {
    vec![("pool", name.to_owned())]
}

/// Each pool's size, capacity, use, partition state and health.
fn pools(enc: &mut DescriptorEncoder, snap: &Snapshot) -> Result<(), std::fmt::Error> {
    let state = &snap.state;
    let mut cpus = Vec::new();
    let (mut capacity, mut free, mut assigned, mut partition, mut degraded) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for p in state.pools().values() {
        let name = p.name.as_str();
        cpus.push((vec![("pool", name.to_owned()), ("kind", p.kind.to_string())], p.cpus.len() as f64));
        capacity.push((pool(name), p.capacity_millis() as f64));
        free.push((pool(name), state.free_millis(p) as f64));
        assigned.push((pool(name), state.usage(&p.name).count as f64));
        if let Some(text) = snap.partitions.get(&p.name) {
            let labels = vec![("pool", name.to_owned()), ("state", partition_state(text).to_owned())];
            partition.push((labels, 1.0));
        }
        degraded.push((pool(name), b(snap.degraded.iter().any(|d| d == name))));
    }
    gauges(enc, "pool_cpus", "CPUs of the pool, by pool and kind", None, &cpus)?;
    gauges(
        enc,
        "pool_capacity_millicpus",
        "What the pool can give out, in thousandths of a CPU",
        None,
        &capacity,
    )?;
    gauges(enc, "pool_free_millicpus", "What the pool has not given out yet", None, &free)?;
    gauges(enc, "pool_assignments", "Assignments in the pool", None, &assigned)?;
    gauges(
        enc,
        "pool_partition",
        "The kernel's partition state of the pool's slice (1 for the current state)",
        None,
        &partition,
    )?;
    gauges(
        enc,
        "pool_degraded",
        "1 when the pool's cgroups could not all be applied at the last reconcile",
        None,
        &degraded,
    )?;

    Ok(())
}

/// Assignments by pool and kind of target, the degraded and the allocated ones, and whether the configuration
/// on disk was rejected.
fn assignments(enc: &mut DescriptorEncoder, snap: &Snapshot) -> Result<(), std::fmt::Error> {
    let state = &snap.state;
    let mut by_kind: std::collections::BTreeMap<(&str, &'static str), f64> = Default::default();
    for a in state.assignments().values() {
        *by_kind.entry((a.pool.as_str(), target_kind(&a.target))).or_default() += 1.0;
    }
    let by_kind: Vec<(Labels, f64)> = by_kind
        .into_iter()
        .map(|((p, k), n)| (vec![("pool", p.to_owned()), ("target_kind", k.to_owned())], n))
        .collect();
    gauges(enc, "assignments", "Assignments, by pool and kind of target", None, &by_kind)?;
    let none: Labels = Vec::new();
    gauges(
        enc,
        "assignments_degraded",
        "Assignments whose target the kernel does not confine to their CPUs",
        None,
        &[(none.clone(), snap.assignment_health.len() as f64)],
    )?;
    let allocated = state
        .assignments()
        .values()
        .filter(|a| snap.phase(a) == crate::core::state::phase::Phase::Allocated)
        .count();
    gauges(
        enc,
        "assignments_allocated",
        "Assignments booked for a container the kubelet allocated them to that does not run on them yet",
        None,
        &[(none.clone(), allocated as f64)],
    )?;
    gauges(
        enc,
        "config_rejected",
        "1 when the configuration on disk was rejected and the last good one runs",
        None,
        &[(none.clone(), b(snap.config_error.is_some()))],
    )?;

    Ok(())
}

/// Isolation health of the isolated pools: the partition, whether isolation holds, foreign
/// task time; then each isolated CPU's ([`isolated_cpus`]) and the IRQs moved off them.
fn isolation(enc: &mut DescriptorEncoder, snap: &Snapshot) -> Result<(), std::fmt::Error> {
    let (mut valid, mut holds, mut foreign) = (Vec::new(), Vec::new(), Vec::new());
    for (name, p) in &snap.report::<crate::engine::IsolationReport>().pools {
        let name = name.as_str();
        valid.push((pool(name), b(p.invalid.is_none())));
        let Some(h) = &p.health else { continue };
        holds.push((pool(name), b(h.holds())));
        if let Some(f) = h.foreign_percent {
            foreign.push((pool(name), f / 100.0));
        }
    }
    gauges(
        enc,
        "isolation_partition_valid",
        "1 when the isolated pool's partition is valid (0: the kernel made it invalid)",
        None,
        &valid,
    )?;
    gauges(
        enc,
        "isolation_holds",
        "1 when the last health interval saw no device interrupt and no foreign task time to speak of",
        None,
        &holds,
    )?;
    gauges(
        enc,
        "isolation_foreign_task",
        "CPU time of tasks outside the pool on its CPUs, as a fraction of the CPUs' time (last interval)",
        Some(&Unit::Other("ratio".into())),
        &foreign,
    )?;
    isolated_cpus(enc, snap)?;
    noise_and_boot(enc, snap)?;
    gauges(
        enc,
        "irqs_moved",
        "IRQs whose affinity the daemon moved off isolated CPUs",
        None,
        &[(Labels::new(), snap.report::<crate::engine::IrqReport>().moved.len() as f64)],
    )
}

/// The interrupt rates of each isolated CPU, and its busiest device IRQs.
fn isolated_cpus(enc: &mut DescriptorEncoder, snap: &Snapshot) -> Result<(), std::fmt::Error> {
    let (mut device, mut ipi, mut timer, mut irqs) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (name, p) in &snap.report::<crate::engine::IsolationReport>().pools {
        for c in p.health.iter().flat_map(|h| &h.cpus) {
            let cpu = || vec![("pool", name.to_string()), ("cpu", c.cpu.to_string())];
            device.push((cpu(), c.device_per_sec));
            ipi.push((cpu(), c.ipi_per_sec));
            timer.push((cpu(), c.timer_per_sec));
            for s in c.sources.iter().take(MAX_IRQ_SOURCES) {
                let mut l = cpu();
                l.push(("irq", s.irq.clone()));
                irqs.push((l, s.per_sec));
            }
        }
    }
    gauges(
        enc,
        "isolation_device_interrupts_per_second",
        "Device interrupts per second on an isolated CPU (last interval)",
        None,
        &device,
    )?;
    gauges(
        enc,
        "isolation_irq_interrupts_per_second",
        "Interrupts per second of the busiest device IRQs on an isolated CPU (at most 3 per CPU)",
        None,
        &irqs,
    )?;
    gauges(
        enc,
        "isolation_ipis_per_second",
        "Inter-processor interrupts per second on an isolated CPU (last interval)",
        None,
        &ipi,
    )?;
    gauges(
        enc,
        "isolation_timer_interrupts_per_second",
        "Local timer interrupts per second on an isolated CPU (last interval)",
        None,
        &timer,
    )
}

/// Each isolated CPU's interruptions by source (a fixed set per kernel: the tick, each IPI
/// kind, device IRQs as one, each softirq, tasks switched in; so at most ~20 series per
/// isolated CPU), and how the kernel's boot isolation covers the isolated pools.
fn noise_and_boot(enc: &mut DescriptorEncoder, snap: &Snapshot) -> Result<(), std::fmt::Error> {
    let iso = snap.report::<crate::engine::IsolationReport>();
    let (mut noise, mut uncovered) = (Vec::new(), Vec::new());
    let mut isolated = CpuSet::new();
    for (name, p) in &iso.pools {
        for c in p.health.iter().flat_map(|h| &h.cpus) {
            for n in &c.noise {
                let labels = vec![
                    ("pool", name.to_string()),
                    ("cpu", c.cpu.to_string()),
                    ("source", n.source.clone()),
                ];
                noise.push((labels, n.per_sec));
            }
        }
        isolated = isolated.union(&p.cpus);
        for param in Param::ALL {
            let left = p.cpus.difference(&param.covers(&iso.kernel.boot, &iso.kernel.nohz_full));
            uncovered.push((
                vec![("pool", name.to_string()), ("parameter", param.as_str().to_owned())],
                left.len() as f64,
            ));
        }
    }
    gauges(
        enc,
        "isolation_interruptions_per_second",
        "Interruptions per second on an isolated CPU by source: timer:LOC, ipi:KIND, device, softirq:NAME, sched:switched_in (last interval)",
        None,
        &noise,
    )?;
    gauges(
        enc,
        "isolation_boot_uncovered_cpus",
        "CPUs of an isolated pool that a boot isolation parameter (nohz_full, rcu_nocbs, isolcpus=managed_irq) does not cover",
        None,
        &uncovered,
    )?;
    let unused = boot::unused(&iso.kernel.boot, &iso.kernel.nohz_full, &iso.kernel.isolated, &isolated);
    gauges(
        enc,
        "isolation_boot_unused_cpus",
        "CPUs the kernel isolates at boot that no isolated pool uses",
        None,
        &[(Labels::new(), unused.len() as f64)],
    )
}

/// One family per row state of the power and cache classes, every row in each (1 in its own
/// state's): a rule can watch `class_setting_degraded == 1` without matching on a state label.
fn classes(enc: &mut DescriptorEncoder, snap: &Snapshot) -> Result<(), std::fmt::Error> {
    for (state, help) in [
        ("applied", "A configured power or cache key read back as wanted (1) or not (0)"),
        ("degraded", "A configured power or cache key written but not read back as wanted (1) or not (0)"),
        ("unsupported", "A configured power or cache key the host lacks support for (1) or not (0)"),
    ] {
        let rows: Vec<(Labels, f64)> = snap
            .report::<Vec<crate::core::classes::ClassRow>>()
            .iter()
            .map(|r| {
                let labels = vec![
                    ("pool", r.pool.clone()),
                    ("class", r.class.as_str().to_owned()),
                    ("key", r.key.clone()),
                ];
                (labels, if r.state.as_str() == state { 1.0 } else { 0.0 })
            })
            .collect();
        gauges(enc, &format!("class_setting_{state}"), help, None, &rows)?;
    }
    Ok(())
}

/// The usual `process_*` families, read from `/proc/self` at scrape (prometheus-client has no
/// process collector).
#[derive(Debug)]
pub(super) struct ProcessCollector;

/// From `/proc/self/stat`: `(utime + stime, start time after boot)` in clock ticks, threads,
/// virtual memory in bytes, resident pages.
fn self_stat() -> Option<(u64, u64, u64, u64, u64)> {
    let text = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name, which may hold spaces and parentheses.
    let rest = text.rsplit_once(") ")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
    // f[0] is field 3 (state): utime is field 14, stime 15, threads 20, starttime 22, vsize 23,
    // rss 24 (proc(5)).
    Some((n(11)? + n(12)?, n(19)?, n(17)?, n(20)?, n(21)?))
}

/// The boot time, seconds since the epoch (`btime` of `/proc/stat`).
fn boot_time() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    stat.lines().find_map(|l| l.strip_prefix("btime ")).and_then(|v| v.trim().parse().ok())
}

impl Collector for ProcessCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let none: Labels = Vec::new();
        let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100) as f64;
        if let Some((ticks, start, threads, vsize, rss)) = self_stat() {
            let page =
                nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE).ok().flatten().unwrap_or(4096);
            let m = enc.encode_descriptor(
                "process_cpu",
                "User and system CPU time of the daemon.",
                Some(&Unit::Seconds),
                prometheus_client::metrics::MetricType::Counter,
            )?;
            ConstCounter::new(ticks as f64 / hz).encode(m)?;
            gauges(
                &mut enc,
                "process_resident_memory",
                "Resident memory",
                Some(&Unit::Bytes),
                &[(none.clone(), (rss * page as u64) as f64)],
            )?;
            gauges(
                &mut enc,
                "process_virtual_memory",
                "Virtual memory",
                Some(&Unit::Bytes),
                &[(none.clone(), vsize as f64)],
            )?;
            gauges(&mut enc, "process_threads", "Threads", None, &[(none.clone(), threads as f64)])?;
            if let Some(boot) = boot_time() {
                gauges(
                    &mut enc,
                    "process_start_time",
                    "When the daemon started, since the Unix epoch",
                    Some(&Unit::Seconds),
                    &[(none.clone(), boot as f64 + start as f64 / hz)],
                )?;
            }
        }
        if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
            gauges(
                &mut enc,
                "process_open_fds",
                "Open file descriptors",
                None,
                &[(none.clone(), fds.count() as f64)],
            )?;
        }
        if let Some(soft) = rustix::process::getrlimit(rustix::process::Resource::Nofile).current {
            gauges(
                &mut enc,
                "process_max_fds",
                "Most open file descriptors",
                None,
                &[(none.clone(), soft as f64)],
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_reasons_do_not_become_label_values() {
        assert_eq!(
            partition_state("isolated invalid (Cpu list in cpuset.cpus not exclusive)"),
            "isolated invalid"
        );
        assert_eq!(partition_state("member"), "member");
        assert_eq!(partition_state(""), "none");
    }
}
