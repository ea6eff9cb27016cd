//! The planning of a power class (`[pools.NAME.power]`): which sysfs files each configured key
//! sets on which CPUs or uncore dies, and to what, with words such as `max` resolved against the
//! limits each CPU reports; or why the host cannot take the key ([`Refusal`]: what it lacks,
//! [`Missing`], or a value it does not offer, [`Unfit`], each naming the CPU, die, file or key
//! at fault; their messages are what configuration errors and class reports show). No I/O: what the
//! host reports comes through [`PowerFacts`], which the engine implements over the sysfs reader
//! (reading each file once per pass). The engine's power keeper writes the plan and reads it
//! back; the same plan checks new settings before they are taken.
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::{resume_latency_text, Freq, PowerClass};
use crate::cpuset::CpuSet;
use crate::topology::Topology;

/// What the host reports that a plan needs: file contents (paths relative to the sysfs root)
/// and where each CPU's and die's files are. Errors are the text a refusal shows.
pub trait PowerFacts {
    /// The sysfs root, for messages.
    fn root(&self) -> &Path;
    /// The trimmed content of `rel`.
    fn read(&self, rel: &str) -> Result<String, String>;
    /// The cpufreq policy directory of `cpu`.
    fn cpufreq_dir(&self, cpu: u32) -> Result<String, String>;
    /// The PM QoS resume latency file of `cpu`.
    fn resume_latency_file(&self, cpu: u32) -> Result<String, String>;
    /// The intel_uncore_frequency directory of `package`'s `die`.
    fn uncore_dir(&self, package: u32, die: u32) -> Result<String, String>;

    /// `rel` as a number.
    fn read_number(&self, rel: &str) -> Result<u64, String> {
        let text = self.read(rel)?;
        text.parse().map_err(|_| {
            format!("`{}` holds `{}`, not a number", self.root().join(rel).display(), text.escape_debug())
        })
    }

    /// Whether `rel` can be read.
    fn exists(&self, rel: &str) -> bool {
        self.read(rel).is_ok()
    }
}

/// Why a key cannot be planned on this host: the two kinds a configuration check and a class's
/// report tell apart, each naming what is at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The host lacks the driver or file.
    #[error(transparent)]
    Unsupported(Missing),
    /// The host does not offer the value.
    #[error(transparent)]
    Invalid(Unfit),
}

/// What the host lacks for a key. Where [`PowerFacts`] could not find or read a file, its own
/// words are the message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Missing {
    /// `cpu` has no cpufreq policy directory.
    #[error("{why}")]
    Cpufreq {
        /// The CPU.
        cpu: u32,
        /// What the facts said.
        why: String,
    },
    /// `cpu` has no PM QoS resume latency file.
    #[error("{why}")]
    ResumeLatency {
        /// The CPU.
        cpu: u32,
        /// What the facts said.
        why: String,
    },
    /// A die has no intel_uncore_frequency directory.
    #[error("{why}")]
    Uncore {
        /// The package.
        package: u32,
        /// The die.
        die: u32,
        /// What the facts said.
        why: String,
    },
    /// A file the plan reads is missing, unreadable, or holds no number.
    #[error("{why}")]
    Unreadable {
        /// The file, relative to the sysfs root.
        file: String,
        /// What the facts said.
        why: String,
    },
    /// `base` was asked for and the CPU reports no `base_frequency` (intel_pstate does).
    #[error("no base frequency (`{}` is missing; intel_pstate reports one)", file.display())]
    BaseFrequency {
        /// The missing file.
        file: PathBuf,
    },
    /// The cpufreq driver has no `energy_performance_preference`.
    #[error(
        "no energy_performance_preference (the cpufreq driver `{driver}` has none: `{}` is missing)",
        file.display()
    )]
    Epp {
        /// The driver (`?` when unreadable).
        driver: String,
        /// The missing file.
        file: PathBuf,
    },
}

/// A value the host does not offer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unfit {
    /// `base` where there is no base frequency.
    #[error("{at} has no base frequency")]
    NoBase {
        /// The CPU or die.
        at: Place,
    },
    /// A frequency outside the hardware's limits.
    #[error("{khz} kHz is outside {at}'s limits ({lo}-{hi} kHz)")]
    OutOfRange {
        /// What was asked.
        khz: u64,
        /// The CPU or die.
        at: Place,
        /// The lowest it allows.
        lo: u64,
        /// The highest it allows.
        hi: u64,
    },
    /// A governor the CPU does not offer.
    #[error("`{want}` is not a governor CPU {cpu} offers (scaling_available_governors: {offered})")]
    Governor {
        /// The governor configured.
        want: String,
        /// The CPU.
        cpu: u32,
        /// `scaling_available_governors`.
        offered: String,
    },
    /// `min_freq` resolves above `max_freq`.
    #[error("min_freq is {min} kHz on CPU {cpu}, above max_freq ({max} kHz)")]
    MinAboveMax {
        /// The CPU.
        cpu: u32,
        /// `min_freq` resolved.
        min: u64,
        /// `max_freq` resolved.
        max: u64,
    },
    /// `uncore_min_freq` resolves above `uncore_max_freq`.
    #[error(
        "uncore_min_freq is {min} kHz on package {package} die {die}, above uncore_max_freq ({max} kHz)"
    )]
    UncoreMinAboveMax {
        /// The package.
        package: u32,
        /// The die.
        die: u32,
        /// `uncore_min_freq` resolved.
        min: u64,
        /// `uncore_max_freq` resolved.
        max: u64,
    },
    /// An energy-performance preference the CPU does not offer.
    #[error(
        "`{want}` is not a preference CPU {cpu} offers (energy_performance_available_preferences: {offered})"
    )]
    Preference {
        /// The preference configured.
        want: String,
        /// The CPU.
        cpu: u32,
        /// `energy_performance_available_preferences`.
        offered: String,
    },
    /// A key that is no cpufreq key reached the cpufreq planner.
    #[error("`{key}` is not a cpufreq key")]
    NotCpufreqKey {
        /// The key.
        key: String,
    },
}

/// Where a frequency's limits come from: a CPU, or the uncore of a die.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// A CPU's cpufreq limits.
    Cpu(u32),
    /// A die's uncore limits.
    Uncore {
        /// The package.
        package: u32,
        /// The die.
        die: u32,
    },
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Place::Cpu(cpu) => write!(f, "CPU {cpu}"),
            Place::Uncore { package, die } => write!(f, "the uncore of package {package} die {die}"),
        }
    }
}

/// One configured key of one class, turned into the files it sets.
#[derive(Debug, Clone)]
pub struct KeyPlan {
    /// The class: a pool's name, or `idle_cpus`.
    pub pool: String,
    /// The key (`governor`).
    pub key: &'static str,
    /// The value as configured.
    pub wanted: String,
    /// The CPUs the class covers.
    pub cpus: CpuSet,
    /// (file, value) pairs, each file once.
    pub writes: Result<Vec<(String, String)>, Refusal>,
}

/// A frequency word resolved against a CPU's or die's limits; `base` is `None` where there is
/// none. Out of range is refused.
fn resolve_freq(f: Freq, lo: u64, base: Option<u64>, hi: u64, at: Place) -> Result<u64, Refusal> {
    match f {
        Freq::Min => Ok(lo),
        Freq::Max => Ok(hi),
        Freq::Base => base.ok_or(Refusal::Invalid(Unfit::NoBase { at })),
        Freq::Khz(k) if (lo..=hi).contains(&k) => Ok(k),
        Freq::Khz(khz) => Err(Refusal::Invalid(Unfit::OutOfRange { khz, at, lo, hi })),
    }
}

/// The refusal for `file`, which the facts could not read (or hold no number): their words.
fn unreadable(file: &str) -> impl FnOnce(String) -> Refusal + '_ {
    move |why| Refusal::Unsupported(Missing::Unreadable { file: file.to_owned(), why })
}

/// One cpufreq key on one CPU: the file and the value.
fn cpufreq_write(
    fs: &impl PowerFacts,
    class: &PowerClass,
    key: &str,
    cpu: u32,
) -> Result<(String, String), Refusal> {
    let dir = fs.cpufreq_dir(cpu).map_err(|why| Refusal::Unsupported(Missing::Cpufreq { cpu, why }))?;
    let f = |name: &str| format!("{dir}/{name}");
    let read = |file: &str| fs.read(file).map_err(unreadable(file));
    let number = |file: &str| fs.read_number(file).map_err(unreadable(file));
    match key {
        "governor" => {
            let want = class.governor.clone().unwrap_or_default();
            let offered = read(&f("scaling_available_governors"))?;
            if !offered.split_whitespace().any(|g| g == want) {
                return Err(Refusal::Invalid(Unfit::Governor { want, cpu, offered }));
            }
            Ok((f("scaling_governor"), want))
        }
        "min_freq" | "max_freq" => {
            let lo = number(&f("cpuinfo_min_freq"))?;
            let hi = number(&f("cpuinfo_max_freq"))?;
            let base_file = f("base_frequency");
            let base = if fs.exists(&base_file) { Some(number(&base_file)?) } else { None };
            let resolve = |fr: Freq| {
                if fr == Freq::Base && base.is_none() {
                    let file = fs.root().join(&base_file);
                    return Err(Refusal::Unsupported(Missing::BaseFrequency { file }));
                }
                resolve_freq(fr, lo, base, hi, Place::Cpu(cpu))
            };
            // Each key's own value decides its error; the other one only matters for the
            // order check, which the minimum reports.
            let own = if key == "min_freq" { class.min_freq } else { class.max_freq };
            let value = own.map(resolve).transpose()?.unwrap_or_default();
            if key == "min_freq" {
                if let Some(Ok(max)) = class.max_freq.map(resolve) {
                    if value > max {
                        return Err(Refusal::Invalid(Unfit::MinAboveMax { cpu, min: value, max }));
                    }
                }
                Ok((f("scaling_min_freq"), value.to_string()))
            } else {
                Ok((f("scaling_max_freq"), value.to_string()))
            }
        }
        "epp" => {
            let want = class.epp.clone().unwrap_or_default();
            let file = f("energy_performance_preference");
            if !fs.exists(&file) {
                let driver = fs.read(&f("scaling_driver")).unwrap_or_else(|_| "?".into());
                let file = fs.root().join(&file);
                return Err(Refusal::Unsupported(Missing::Epp { driver, file }));
            }
            let offered = read(&f("energy_performance_available_preferences"))?;
            let driver = fs.read(&f("scaling_driver")).unwrap_or_default();
            // intel_pstate also takes the raw 0-255 value (intel_pstate.rst).
            let raw = driver == "intel_pstate" && want.parse::<u8>().is_ok();
            if !raw && !offered.split_whitespace().any(|w| w == want) {
                return Err(Refusal::Invalid(Unfit::Preference { want, cpu, offered }));
            }
            Ok((file, want))
        }
        _ => Err(Refusal::Invalid(Unfit::NotCpufreqKey { key: key.to_owned() })),
    }
}

/// The files and values `class` sets on `cpus` (see the module docs).
pub fn plan_class(
    fs: &impl PowerFacts,
    topo: &Topology,
    pool: &str,
    class: &PowerClass,
    cpus: &CpuSet,
) -> Vec<KeyPlan> {
    class
        .keys()
        .map(|(key, wanted)| {
            let writes = plan_key(fs, topo, class, key, cpus).map(|w| {
                let mut seen = BTreeSet::new();
                w.into_iter().filter(|(f, _)| seen.insert(f.clone())).collect()
            });
            KeyPlan { pool: pool.to_owned(), key, wanted, cpus: cpus.clone(), writes }
        })
        .collect()
}

fn plan_key(
    fs: &impl PowerFacts,
    topo: &Topology,
    class: &PowerClass,
    key: &str,
    cpus: &CpuSet,
) -> Result<Vec<(String, String)>, Refusal> {
    match key {
        "resume_latency_us" => {
            let text = resume_latency_text(class.resume_latency_us.unwrap_or_default());
            cpus.iter()
                .map(|cpu| {
                    let file = fs
                        .resume_latency_file(cpu)
                        .map_err(|why| Refusal::Unsupported(Missing::ResumeLatency { cpu, why }))?;
                    Ok((file, text.clone()))
                })
                .collect()
        }
        "uncore_min_freq" | "uncore_max_freq" => {
            let dies: BTreeSet<(u32, u32)> =
                cpus.iter().filter_map(|c| topo.place(c)).map(|p| (p.package, p.die)).collect();
            let mut out = Vec::new();
            for (package, die) in dies {
                let dir = fs
                    .uncore_dir(package, die)
                    .map_err(|why| Refusal::Unsupported(Missing::Uncore { package, die, why }))?;
                let number = |file: String| fs.read_number(&file).map_err(unreadable(&file));
                let lo = number(format!("{dir}/initial_min_freq_khz"))?;
                let hi = number(format!("{dir}/initial_max_freq_khz"))?;
                let resolve = |f: Freq| resolve_freq(f, lo, None, hi, Place::Uncore { package, die });
                let own =
                    if key == "uncore_min_freq" { class.uncore_min_freq } else { class.uncore_max_freq };
                let value = own.map(resolve).transpose()?.unwrap_or_default();
                if key == "uncore_min_freq" {
                    if let Some(Ok(max)) = class.uncore_max_freq.map(resolve) {
                        if value > max {
                            return Err(Refusal::Invalid(Unfit::UncoreMinAboveMax {
                                package,
                                die,
                                min: value,
                                max,
                            }));
                        }
                    }
                    out.push((format!("{dir}/min_freq_khz"), value.to_string()));
                } else {
                    out.push((format!("{dir}/max_freq_khz"), value.to_string()));
                }
            }
            Ok(out)
        }
        _ => cpus.iter().map(|cpu| cpufreq_write(fs, class, key, cpu)).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each refusal says what its message text said before it was typed: configuration errors
    /// and class reports show these words.
    #[test]
    fn refusals_keep_their_words() {
        let path = |p: &str| PathBuf::from(p);
        let cases = [
            (
                Refusal::Invalid(Unfit::NoBase { at: Place::Uncore { package: 0, die: 1 } }),
                "the uncore of package 0 die 1 has no base frequency",
            ),
            (
                Refusal::Invalid(Unfit::OutOfRange { khz: 9, at: Place::Cpu(3), lo: 800, hi: 3000 }),
                "9 kHz is outside CPU 3's limits (800-3000 kHz)",
            ),
            (
                Refusal::Invalid(Unfit::Governor { want: "turbo".into(), cpu: 2, offered: "performance powersave".into() }),
                "`turbo` is not a governor CPU 2 offers (scaling_available_governors: performance powersave)",
            ),
            (
                Refusal::Invalid(Unfit::MinAboveMax { cpu: 1, min: 3000, max: 2000 }),
                "min_freq is 3000 kHz on CPU 1, above max_freq (2000 kHz)",
            ),
            (
                Refusal::Invalid(Unfit::UncoreMinAboveMax { package: 0, die: 2, min: 3000, max: 2000 }),
                "uncore_min_freq is 3000 kHz on package 0 die 2, above uncore_max_freq (2000 kHz)",
            ),
            (
                Refusal::Invalid(Unfit::Preference { want: "x".into(), cpu: 1, offered: "a b".into() }),
                "`x` is not a preference CPU 1 offers (energy_performance_available_preferences: a b)",
            ),
            (Refusal::Invalid(Unfit::NotCpufreqKey { key: "foo".into() }), "`foo` is not a cpufreq key"),
            (
                Refusal::Unsupported(Missing::BaseFrequency { file: path("/sys/cpu1/base_frequency") }),
                "no base frequency (`/sys/cpu1/base_frequency` is missing; intel_pstate reports one)",
            ),
            (
                Refusal::Unsupported(Missing::Epp { driver: "acpi-cpufreq".into(), file: path("/sys/epp") }),
                "no energy_performance_preference (the cpufreq driver `acpi-cpufreq` has none: `/sys/epp` is missing)",
            ),
            (
                Refusal::Unsupported(Missing::Unreadable { file: "f".into(), why: "`/sys/f` holds `x`".into() }),
                "`/sys/f` holds `x`",
            ),
            (
                Refusal::Unsupported(Missing::Cpufreq { cpu: 5, why: "no cpufreq driver".into() }),
                "no cpufreq driver",
            ),
            (
                Refusal::Unsupported(Missing::ResumeLatency { cpu: 5, why: "no PM QoS".into() }),
                "no PM QoS",
            ),
            (
                Refusal::Unsupported(Missing::Uncore { package: 0, die: 0, why: "no uncore".into() }),
                "no uncore",
            ),
        ];
        for (refusal, text) in cases {
            assert_eq!(refusal.to_string(), text);
        }
    }
}
