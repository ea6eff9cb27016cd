//! What still interrupts an isolated CPU, by source, decided without I/O: the softirqs
//! (`/proc/softirqs`) and the tasks switched in (`/proc/schedstat`), next to the interrupts of
//! `/proc/interrupts` that [`super::housekeeping::assess`] splits by label.
//!
//! Data flow: the host's health sampler (the daemon's `host::health`) reads both files on a
//! housekeeping CPU; [`parse_softirqs`] and [`parse_schedstat`] turn them into [`Counters`],
//! which ride in the sample; [`rates`] turns two of them, and the seconds between them that the
//! caller measured, into [`NoiseRate`]s per CPU.
//!
//! Why these counters: both are per-CPU sums the kernel keeps anyway and prints on a read from
//! any CPU, without an IPI to the CPU they count. `/proc/schedstat`'s ninth CPU field (the
//! run queue's `pcount`, "timeslices run on this cpu": a non-idle task switched in) comes from
//! `sched_info`, counted whenever the kernel has `CONFIG_SCHED_INFO` (it does with
//! `CONFIG_SCHEDSTATS` or `CONFIG_TASK_DELAY_ACCT`, as distribution kernels do), also with
//! `kernel.sched_schedstats=0`; fields 1–6 (`sched_yield`, `schedule()` and wake-up counts)
//! stay 0 unless that sysctl is on, so they are not used. The field is the same in schedstat
//! versions 15 to 17. `/proc/stat`'s `ctxt` counts the whole machine only.
#![deny(missing_docs)]

use std::collections::BTreeMap;

/// Counts per CPU by name (`TIMER`, `RCU`).
pub type Softirqs = BTreeMap<String, BTreeMap<u32, u64>>;

/// The noise counters of one sample.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    /// `/proc/softirqs`; empty where the file could not be read.
    pub softirqs: Softirqs,
    /// Non-idle tasks switched in, per CPU (`/proc/schedstat`); empty where not readable.
    pub switches: BTreeMap<u32, u64>,
}

/// The CPUs a header line of `/proc/interrupts` or `/proc/softirqs` names, column by column
/// (`CPU0 CPU2 ...`).
pub fn cpu_columns(header: &str) -> Vec<u32> {
    header.split_whitespace().filter_map(|c| c.strip_prefix("CPU")?.parse().ok()).collect()
}

/// Parses `/proc/softirqs`: a header naming the CPU columns (`CPU0 CPU1`: the possible CPUs),
/// then `NAME: count...` per softirq (fs/proc/softirqs.c).
pub fn parse_softirqs(text: &str) -> Softirqs {
    let mut lines = text.lines();
    let cpus = cpu_columns(lines.next().unwrap_or(""));
    let mut out = Softirqs::new();
    for line in lines {
        let Some((name, rest)) = line.split_once(':') else { continue };
        let name = name.trim();
        if name.is_empty() {
            continue;
        }
        let counts: BTreeMap<u32, u64> = cpus
            .iter()
            .zip(rest.split_whitespace().map_while(|w| w.parse::<u64>().ok()))
            .map(|(c, n)| (*c, n))
            .collect();
        out.insert(name.to_owned(), counts);
    }
    out
}

/// Parses `/proc/schedstat`'s `cpuN` lines: the ninth field of each, the tasks switched in
/// (module docs). A line with fewer fields (an unknown version) is left out.
pub fn parse_schedstat(text: &str) -> BTreeMap<u32, u64> {
    text.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let cpu: u32 = w.next()?.strip_prefix("cpu")?.parse().ok()?;
            Some((cpu, w.nth(8)?.parse().ok()?))
        })
        .collect()
}

/// One source's rate on one CPU.
#[derive(Debug, Clone, PartialEq)]
pub struct NoiseRate {
    /// `timer:LOC`, `ipi:CAL`, `device`, `softirq:RCU`, `sched:switched_in`.
    pub source: String,
    /// Per second over the interval.
    pub per_sec: f64,
}

/// The source name of tasks switched in.
pub const SWITCHED_IN: &str = "sched:switched_in";

/// How much a counter grew; one that went down was reset (a reused IRQ number, a CPU brought
/// back): counted from zero.
pub fn grew(before: Option<u64>, after: u64) -> u64 {
    match before {
        Some(b) if after >= b => after - b,
        _ => after,
    }
}

/// The softirqs and tasks switched in on `cpu` between `before` and `after`, `secs` apart
/// (positive): one rate per softirq the kernel lists and one for the switches, zeros
/// included, where `after` has the CPU's count.
pub fn rates(before: &Counters, after: &Counters, cpu: u32, secs: f64) -> Vec<NoiseRate> {
    let mut out = Vec::new();
    for (name, counts) in &after.softirqs {
        let Some(&now) = counts.get(&cpu) else { continue };
        let then = before.softirqs.get(name).and_then(|c| c.get(&cpu)).copied();
        out.push(NoiseRate { source: format!("softirq:{name}"), per_sec: grew(then, now) as f64 / secs });
    }
    if let Some(&now) = after.switches.get(&cpu) {
        let then = before.switches.get(&cpu).copied();
        out.push(NoiseRate { source: SWITCHED_IN.to_owned(), per_sec: grew(then, now) as f64 / secs });
    }
    out
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// As a 4-CPU Debian 12 guest (6.12) printed it, columns as fs/proc/softirqs.c pads them.
    const SOFTIRQS: &str = "                    CPU0       CPU1       CPU2       CPU3       \n          \
        HI:          0          0          0          1\n       \
        TIMER:      61325      40011      23402      19817\n      \
        NET_TX:          3          1          0          0\n      \
        NET_RX:       2193        561        128        115\n       \
        BLOCK:      20711       5010          0          0\n    \
        IRQ_POLL:          0          0          0          0\n     \
        TASKLET:         32          3          0          0\n       \
        SCHED:      89201      60712      51177      12840\n     \
        HRTIMER:          0          0          0          0\n         \
        RCU:      71902      60240      43313      60577\n";

    /// Version 15 (6.1) and 17 (6.13+): the CPU lines are alike, the domain lines are not.
    const SCHEDSTAT_15: &str = "version 15\ntimestamp 4295893802\n\
        cpu0 0 0 0 0 0 0 1021853719386 75113290537 1213388\n\
        domain0 0f 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n\
        cpu1 0 0 0 0 0 0 880227745201 48823004112 901344\n\
        domain0 0f 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n";
    const SCHEDSTAT_17: &str = "version 17\ntimestamp 4295893802\n\
        cpu2 0 0 0 0 0 0 12 34 5678\n\
        domain0 MC 0f 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n\
        cpu3 1\n";

    #[test]
    fn softirqs_parse_by_name_and_cpu() {
        let s = parse_softirqs(SOFTIRQS);
        assert_eq!(s.len(), 10);
        assert_eq!(s["RCU"].get(&3), Some(&60577));
        assert_eq!(s["SCHED"].get(&0), Some(&89201));
        assert_eq!(s["HI"].get(&3), Some(&1));
        assert!(parse_softirqs("").is_empty());
    }

    #[test]
    fn schedstat_takes_the_ninth_cpu_field_of_any_version() {
        assert_eq!(parse_schedstat(SCHEDSTAT_15), BTreeMap::from([(0, 1_213_388), (1, 901_344)]));
        assert_eq!(parse_schedstat(SCHEDSTAT_17), BTreeMap::from([(2, 5678)]), "cpu3's line is short");
    }

    #[test]
    fn rates_over_a_known_interval_by_source() {
        let before = Counters { softirqs: parse_softirqs(SOFTIRQS), switches: parse_schedstat(SCHEDSTAT_15) };
        let mut after = before.clone();
        after.softirqs.get_mut("RCU").map(|c| c.insert(1, 60240 + 780));
        after.softirqs.get_mut("TIMER").map(|c| c.insert(1, 5));
        after.switches.insert(1, 901_344 + 5);
        let r = rates(&before, &after, 1, 10.0);
        let get = |s: &str| r.iter().find(|x| x.source == s).map(|x| x.per_sec);
        assert_eq!(r.len(), 11, "ten softirqs and the switches, zeros included: {r:?}");
        assert_eq!(get("softirq:RCU"), Some(78.0));
        assert_eq!(get("softirq:TIMER"), Some(0.5), "went down: counted from zero");
        assert_eq!(get("softirq:SCHED"), Some(0.0));
        assert_eq!(get(SWITCHED_IN), Some(0.5));
        assert!(rates(&before, &after, 9, 10.0).is_empty(), "a CPU the files do not list");
    }

    proptest! {
        /// What the kernel prints parses back to the counts, whatever the CPUs and counts.
        #[test]
        fn softirqs_in_the_kernels_layout_parse_back(
            cpus in proptest::collection::btree_set(0u32..512, 1..16),
            counts in proptest::collection::vec(any::<u32>(), 16),
        ) {
            let mut text = " ".repeat(20);
            for c in &cpus {
                text.push_str(&format!("CPU{c:<8}"));
            }
            text.push('\n');
            for name in ["HI", "TIMER", "NET_RX", "RCU"] {
                text.push_str(&format!("{name:>12}:"));
                for (i, _) in cpus.iter().enumerate() {
                    text.push_str(&format!(" {:>10}", counts[i]));
                }
                text.push('\n');
            }
            let s = parse_softirqs(&text);
            for (i, c) in cpus.iter().enumerate() {
                prop_assert_eq!(s["RCU"].get(c).copied(), Some(u64::from(counts[i])));
            }
        }
    }
}
