//! Reads the counters isolation health is measured from: `/proc/interrupts`, `/proc/stat`,
//! `/proc/softirqs`, `/proc/schedstat` and the pool slices' `cpu.stat`. These are read on a housekeeping CPU and do not disturb the
//! isolated ones (unlike, say, reading per-CPU MSRs or sending them an IPI).
//!
//! Data flow: [`read_sample`] is given the procfs root (`/proc`, the sandbox's `DIR/proc`) and
//! the cgroup root, and returns a [`Sample`] for [`crate::core::housekeeping::assess`].
#![deny(missing_docs)]

use std::path::Path;

use super::fsutil::{FsError, Root};
use crate::core::housekeeping::{parse_cpu_stat, parse_interrupts, parse_stat, Sample};
use crate::core::noise::{parse_schedstat, parse_softirqs, Counters};

/// Reads one sample; `slices` are `(pool, cgroup path relative to the cgroup root)`, several
/// for one pool where its containers have partitions of their own. A cgroup
/// whose `cpu.stat` cannot be read (no cpu controller) is left out: its foreign time is then
/// unknown rather than wrong. Each existing cgroup's `cpuset.cpus.partition` and
/// `cpuset.cpus.effective` go with it, so that a window over which they changed is known.
/// `softirqs` and `schedstat` are optional (a kernel without `CONFIG_SCHEDSTATS` has no
/// `schedstat`): what cannot be read is left out, and its sources are then not reported.
pub fn read_sample(procfs: &Path, cgroup: &Path, slices: &[(String, String)]) -> Result<Sample, FsError> {
    let proc = Root::new(procfs);
    let interrupts = parse_interrupts(&proc.read_to_string("interrupts")?);
    let task_ticks = parse_stat(&proc.read_to_string("stat")?);
    let cg = Root::new(cgroup);
    let optional = |file: &str| proc.read_to_string(file).unwrap_or_default();
    let noise = Counters {
        softirqs: parse_softirqs(&optional("softirqs")),
        switches: parse_schedstat(&optional("schedstat")),
    };
    let mut sample = Sample { interrupts, task_ticks, noise, ..Default::default() };
    for (pool, slice) in slices {
        let dir = slice.trim_start_matches('/');
        if !cg.exists(dir) {
            continue;
        }
        let read = |file: &str| cg.read_to_string(format!("{dir}/{file}")).unwrap_or_default();
        let cpuset =
            format!("{} {}", read("cpuset.cpus.partition").trim(), read("cpuset.cpus.effective").trim());
        sample.pool_cpusets.entry(pool.clone()).or_default().insert(slice.clone(), cpuset);
        if let Some(usec) = parse_cpu_stat(&read("cpu.stat")) {
            sample.pool_usage_usec.entry(pool.clone()).or_default().insert(slice.clone(), usec);
        }
    }
    Ok(sample)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_procfs_sample_reads_interrupts_stat_and_cpu_stat() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let (p, c) = (dir.path().join("proc"), dir.path().join("cg"));
        let slice = "cpupool.slice/cpupool-dp.slice";
        std::fs::create_dir_all(&p).unwrap_or_else(|e| panic!("{e}"));
        std::fs::create_dir_all(c.join(slice)).unwrap_or_else(|e| panic!("{e}"));
        let pools = [("dp".to_owned(), slice.to_owned())];
        assert!(read_sample(&p, &c, &pools).is_err(), "no /proc/interrupts");
        std::fs::write(
            p.join("interrupts"),
            "      CPU0  CPU1\n 32:  1  2  PCI-MSI 1-edge  virtio1-requests\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(p.join("stat"), "cpu 1 1 1 1\ncpu0 1 2 3 4\ncpu1 5 6 7 8\n")
            .unwrap_or_else(|e| panic!("{e}"));
        let s = read_sample(&p, &c, &pools).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.interrupts["32"].counts.get(&1), Some(&2));
        assert_eq!(s.task_ticks.get(&1), Some(&18));
        assert!(s.pool_usage_usec.is_empty());
        assert_eq!(s.noise, Counters::default(), "no softirqs, no schedstat: nothing to say");
        std::fs::write(
            p.join("softirqs"),
            "          CPU0  CPU1
  RCU:  7  9
",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(
            p.join("schedstat"),
            "version 15
cpu1 0 0 0 0 0 0 1 2 33
",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let s = read_sample(&p, &c, &pools).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.noise.softirqs["RCU"].get(&1), Some(&9));
        assert_eq!(s.noise.switches.get(&1), Some(&33));
        assert_eq!(s.pool_cpusets["dp"][slice], " ", "the slice exists, its cpuset files do not");
        std::fs::write(c.join(slice).join("cpu.stat"), "usage_usec 77\n").unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(c.join(slice).join("cpuset.cpus.partition"), "isolated\n")
            .unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(c.join(slice).join("cpuset.cpus.effective"), "2-3\n")
            .unwrap_or_else(|e| panic!("{e}"));
        let s = read_sample(&p, &c, &pools).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.pool_usage_usec.get("dp").and_then(|d| d.values().next()), Some(&77));
        assert_eq!(s.pool_cpusets["dp"][slice], "isolated 2-3");
        std::fs::remove_dir_all(c.join(slice)).unwrap_or_else(|e| panic!("{e}"));
        let s = read_sample(&p, &c, &pools).unwrap_or_else(|e| panic!("{e}"));
        assert!(s.pool_cpusets.is_empty() && s.pool_usage_usec.is_empty(), "{s:?}");
    }
}
