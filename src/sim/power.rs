//! The sandbox's power trees: cpufreq, PM QoS, cpuidle and intel_uncore_frequency as plain
//! files below a simulated sysfs, laid out as [`crate::host::power`] describes (from the kernel's
//! documentation), so the sandbox and the tests exercise every power knob.
//!
//! The simulated host looks like an intel_pstate machine: one cpufreq policy per CPU
//! (`cpuN/cpufreq` a link to `cpufreq/policyN`, as the kernel makes it), the governors
//! `performance` and `powersave`, 800 MHz to 3.5 GHz with a 2.1 GHz base, EPP with the five
//! words intel_pstate lists, PM QoS with no constraint (`0`), intel_idle's states, and one
//! uncore directory per package and die (800 MHz to 2.4 GHz). The files are plain: they take
//! any write, as a test playing an administrator needs; the daemon checks values against
//! what the host lists before it writes, as it does on a host.
#![deny(missing_docs)]

use std::collections::BTreeSet;
use std::io;
use std::path::Path;

use crate::core::topology::Topology;
use crate::host::power::CPU_DIR;

/// `cpuinfo_min_freq` of the simulated CPUs (kHz).
pub const CPU_MIN_KHZ: u64 = 800_000;
/// `base_frequency`.
pub const CPU_BASE_KHZ: u64 = 2_100_000;
/// `cpuinfo_max_freq`.
pub const CPU_MAX_KHZ: u64 = 3_500_000;
/// `initial_min_freq_khz` of the simulated uncore.
pub const UNCORE_MIN_KHZ: u64 = 800_000;
/// `initial_max_freq_khz`.
pub const UNCORE_MAX_KHZ: u64 = 2_400_000;
/// The governors the simulated driver lists.
pub const GOVERNORS: &str = "performance powersave";
/// The EPP words it lists.
pub const EPP_WORDS: &str = "default performance balance_performance balance_power power";

/// Which trees to write (tests leave some out to see the "not supported" path).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimPower {
    /// cpufreq (with EPP and base frequency).
    pub cpufreq: bool,
    /// `cpuN/power/pm_qos_resume_latency_us`.
    pub pm_qos: bool,
    /// cpuidle states.
    pub cpuidle: bool,
    /// intel_uncore_frequency.
    pub uncore: bool,
}

impl SimPower {
    /// Every tree.
    pub const ALL: SimPower = SimPower { cpufreq: true, pm_qos: true, cpuidle: true, uncore: true };
}

fn put(path: &Path, text: &str) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, format!("{text}\n"))
}

/// Writes the trees `what` asks for below `sysfs_root`, for `topo`'s online CPUs.
pub fn write_power(sysfs_root: &Path, topo: &Topology, what: SimPower) -> io::Result<()> {
    let cpu_dir = sysfs_root.join(CPU_DIR);
    let mut dies = BTreeSet::new();
    for (&cpu, place) in &topo.data().cpus {
        dies.insert((place.package, place.die));
        let this = cpu_dir.join(format!("cpu{cpu}"));
        if what.cpufreq {
            let policy = cpu_dir.join(format!("cpufreq/policy{cpu}"));
            for (file, text) in [
                ("scaling_driver", "intel_pstate".to_owned()),
                ("scaling_available_governors", GOVERNORS.to_owned()),
                ("scaling_governor", "powersave".to_owned()),
                ("cpuinfo_min_freq", CPU_MIN_KHZ.to_string()),
                ("cpuinfo_max_freq", CPU_MAX_KHZ.to_string()),
                ("base_frequency", CPU_BASE_KHZ.to_string()),
                ("scaling_min_freq", CPU_MIN_KHZ.to_string()),
                ("scaling_max_freq", CPU_MAX_KHZ.to_string()),
                ("scaling_cur_freq", CPU_BASE_KHZ.to_string()),
                ("energy_performance_preference", "balance_performance".to_owned()),
                ("energy_performance_available_preferences", EPP_WORDS.to_owned()),
                ("affected_cpus", cpu.to_string()),
                ("related_cpus", cpu.to_string()),
            ] {
                put(&policy.join(file), &text)?;
            }
            let link = this.join("cpufreq");
            if std::fs::symlink_metadata(&link).is_err() {
                std::os::unix::fs::symlink(format!("../cpufreq/policy{cpu}"), &link)?;
            }
        }
        if what.pm_qos {
            put(&this.join("power/pm_qos_resume_latency_us"), "0")?;
        }
        if what.cpuidle {
            for (k, (name, latency)) in [("POLL", 0), ("C1", 2), ("C1E", 10), ("C6", 133)].iter().enumerate()
            {
                let state = this.join(format!("cpuidle/state{k}"));
                put(&state.join("name"), name)?;
                put(&state.join("latency"), &latency.to_string())?;
                put(&state.join("disable"), "0")?;
            }
        }
    }
    if what.cpuidle {
        put(&cpu_dir.join("cpuidle/current_driver"), "intel_idle")?;
        put(&cpu_dir.join("cpuidle/current_governor"), "menu")?;
    }
    if what.uncore {
        for (package, die) in dies {
            let dir = cpu_dir.join(format!("intel_uncore_frequency/package_{package:02}_die_{die:02}"));
            for (file, khz) in [
                ("initial_min_freq_khz", UNCORE_MIN_KHZ),
                ("initial_max_freq_khz", UNCORE_MAX_KHZ),
                ("min_freq_khz", UNCORE_MIN_KHZ),
                ("max_freq_khz", UNCORE_MAX_KHZ),
                ("current_freq_khz", UNCORE_MIN_KHZ),
            ] {
                put(&dir.join(file), &khz.to_string())?;
            }
        }
    }
    Ok(())
}
