//! Power knobs below a sysfs root (`/sys`; the sandbox's `DIR/sys`): cpufreq, PM QoS resume
//! latency, cpuidle (read only) and intel_uncore_frequency. What the files mean and hold is in
//! [`crate::core::power`]; this module finds, reads and writes them, and decides nothing.
//!
//! Layout (Documentation/admin-guide/pm/cpufreq.rst, intel_uncore_frequency_scaling.rst,
//! cpuidle.rst, ABI/testing/sysfs-devices-power):
//!
//! ```text
//! devices/system/cpu/cpuN/cpufreq -> ../cpufreq/policyM   scaling_governor, scaling_min_freq,
//!                                                           scaling_max_freq, cpuinfo_*_freq,
//!                                                           scaling_available_governors,
//!                                                           scaling_driver, base_frequency,
//!                                                           energy_performance_preference,
//!                                                           energy_performance_available_preferences
//! devices/system/cpu/cpuN/power/pm_qos_resume_latency_us
//! devices/system/cpu/cpuN/cpuidle/stateK/{name,latency,disable}
//! devices/system/cpu/intel_uncore_frequency/package_PP_die_DD/{min,max,initial_min,initial_max}_freq_khz
//! ```
//!
//! `cpuN/cpufreq` is a symbolic link to its policy's directory, and every write goes through
//! [`Root`], which follows no link: the link is read once and the policy's own path used.
#![deny(missing_docs)]

use std::io;
use std::path::{Path, PathBuf};

use super::fsutil::Root;

/// Why a power file could not be read or written: the host's one I/O error.
pub type PowerError = super::IoError;

/// The sysfs directory of the CPUs, relative to the sysfs root.
pub const CPU_DIR: &str = "devices/system/cpu";

/// One idle state of a CPU, as cpuidle lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdleState {
    /// `name` (`POLL`, `C1`, `C6`, ...).
    pub name: String,
    /// `latency`: its exit latency in µs.
    pub latency_us: u64,
}

/// The power files below one sysfs root.
#[derive(Debug, Clone)]
pub struct PowerFs {
    root: Root,
}

impl PowerFs {
    /// The files below `sysfs_root`.
    pub fn new(sysfs_root: impl Into<PathBuf>) -> PowerFs {
        PowerFs { root: Root::new(sysfs_root) }
    }

    /// The sysfs root.
    pub fn root(&self) -> &Path {
        self.root.path()
    }

    fn abs(&self, rel: &str) -> PathBuf {
        self.root.path().join(rel)
    }

    /// CPU `cpu`'s cpufreq policy directory (relative), or what is missing.
    pub fn cpufreq_dir(&self, cpu: u32) -> Result<String, String> {
        let rel = format!("{CPU_DIR}/cpu{cpu}/cpufreq");
        let path = self.abs(&rel);
        let missing = || format!("no cpufreq driver (`{}` is missing)", path.display());
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() => Ok(rel),
            Ok(m) if m.file_type().is_symlink() => {
                let target = std::fs::read_link(&path).map_err(|_| missing())?;
                // The kernel's link is `../cpufreq/policyM`; anything else is not followed.
                let policy = target
                    .to_str()
                    .and_then(|t| t.strip_prefix("../cpufreq/"))
                    .filter(|p| {
                        p.strip_prefix("policy").is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
                    })
                    .ok_or_else(|| {
                        format!("`{}` points to `{}`, not a cpufreq policy", path.display(), target.display())
                    })?;
                let rel = format!("{CPU_DIR}/cpufreq/{policy}");
                if self.abs(&rel).is_dir() {
                    Ok(rel)
                } else {
                    Err(missing())
                }
            }
            _ => Err(missing()),
        }
    }

    /// CPU `cpu`'s PM QoS resume latency file (relative), or what is missing.
    pub fn resume_latency_file(&self, cpu: u32) -> Result<String, String> {
        let rel = format!("{CPU_DIR}/cpu{cpu}/power/pm_qos_resume_latency_us");
        if self.abs(&rel).is_file() {
            Ok(rel)
        } else {
            Err(format!("no PM QoS resume latency (`{}` is missing)", self.abs(&rel).display()))
        }
    }

    /// The uncore directory of `package`'s `die` (relative), or what is missing.
    pub fn uncore_dir(&self, package: u32, die: u32) -> Result<String, String> {
        let rel = format!("{CPU_DIR}/intel_uncore_frequency/package_{package:02}_die_{die:02}");
        if self.abs(&rel).is_dir() {
            Ok(rel)
        } else {
            Err(format!("no intel_uncore_frequency driver (`{}` is missing)", self.abs(&rel).display()))
        }
    }

    /// Whether `rel` exists.
    pub fn exists(&self, rel: &str) -> bool {
        self.abs(rel).exists()
    }

    /// The file `rel`, trimmed.
    pub fn read(&self, rel: &str) -> Result<String, PowerError> {
        self.root
            .read_to_string(rel)
            .map(|s| s.trim().to_owned())
            .map_err(|e| PowerError::Read { path: e.path, source: e.source })
    }

    /// A number of kHz (or µs) in `rel`.
    pub fn read_number(&self, rel: &str) -> Result<u64, PowerError> {
        let text = self.read(rel)?;
        text.parse().map_err(|_| PowerError::Read {
            path: self.abs(rel),
            source: io::Error::new(
                io::ErrorKind::InvalidData,
                format!("`{}` is not a number", text.escape_debug()),
            ),
        })
    }

    /// Writes `value` to the existing file `rel`, in one write.
    pub fn write(&self, rel: &str, value: &str) -> Result<(), PowerError> {
        self.root.write(rel, value.as_bytes()).map_err(|e| PowerError::Write {
            path: e.path,
            data: value.to_owned(),
            source: e.source,
        })
    }

    /// CPU `cpu`'s idle states, in order (none without cpuidle).
    pub fn idle_states(&self, cpu: u32) -> Vec<IdleState> {
        let mut out = Vec::new();
        for k in 0.. {
            let dir = format!("{CPU_DIR}/cpu{cpu}/cpuidle/state{k}");
            let (Ok(name), Ok(latency_us)) =
                (self.read(&format!("{dir}/name")), self.read_number(&format!("{dir}/latency")))
            else {
                break;
            };
            out.push(IdleState { name, latency_us });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_cpufreq_link_is_resolved_to_its_policy_and_other_links_are_refused() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let cpu = dir.path().join(CPU_DIR);
        std::fs::create_dir_all(cpu.join("cpufreq/policy3")).unwrap_or_else(|e| panic!("{e}"));
        std::fs::create_dir_all(cpu.join("cpu3")).unwrap_or_else(|e| panic!("{e}"));
        std::fs::create_dir_all(cpu.join("cpu4")).unwrap_or_else(|e| panic!("{e}"));
        std::os::unix::fs::symlink("../cpufreq/policy3", cpu.join("cpu3/cpufreq"))
            .unwrap_or_else(|e| panic!("{e}"));
        std::os::unix::fs::symlink("/etc", cpu.join("cpu4/cpufreq")).unwrap_or_else(|e| panic!("{e}"));
        let fs = PowerFs::new(dir.path());
        assert_eq!(fs.cpufreq_dir(3).as_deref(), Ok("devices/system/cpu/cpufreq/policy3"));
        let e = fs.cpufreq_dir(4).err().unwrap_or_else(|| panic!("a link elsewhere was followed"));
        assert!(e.contains("not a cpufreq policy"), "{e}");
        let e = fs.cpufreq_dir(5).err().unwrap_or_else(|| panic!("no directory, yet found"));
        assert!(e.starts_with("no cpufreq driver (`") && e.ends_with("cpu5/cpufreq` is missing)"), "{e}");
    }
}
