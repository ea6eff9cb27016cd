//! The planning of a power class (`[pools.NAME.power]`): which sysfs files each configured key
//! sets on which CPUs or uncore dies, and to what, with words such as `max` resolved against the
//! limits each CPU reports; or why the host cannot take the key ([`Refusal`]). No I/O: what the
//! host reports comes through [`PowerFacts`], which the engine implements over the sysfs reader
//! (reading each file once per pass). The engine's power keeper writes the plan and reads it
//! back; the same plan checks new settings before they are taken.
use std::collections::BTreeSet;
use std::path::Path;

use super::{resume_latency_text, Freq, PowerClass};
use crate::core::cpuset::CpuSet;
use crate::core::topology::Topology;

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

/// Why a key cannot be planned on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The host lacks the driver or file: what is missing.
    Unsupported(String),
    /// The host does not offer the value: why.
    Invalid(String),
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
fn resolve_freq(f: Freq, lo: u64, base: Option<u64>, hi: u64, what: &str) -> Result<u64, Refusal> {
    match f {
        Freq::Min => Ok(lo),
        Freq::Max => Ok(hi),
        Freq::Base => base.ok_or_else(|| Refusal::Invalid(format!("{what} has no base frequency"))),
        Freq::Khz(k) if (lo..=hi).contains(&k) => Ok(k),
        Freq::Khz(k) => Err(Refusal::Invalid(format!("{k} kHz is outside {what}'s limits ({lo}-{hi} kHz)"))),
    }
}

fn read_err(e: String) -> Refusal {
    Refusal::Unsupported(e)
}

/// One cpufreq key on one CPU: the file and the value.
fn cpufreq_write(
    fs: &impl PowerFacts,
    class: &PowerClass,
    key: &str,
    cpu: u32,
) -> Result<(String, String), Refusal> {
    let dir = fs.cpufreq_dir(cpu).map_err(Refusal::Unsupported)?;
    let f = |name: &str| format!("{dir}/{name}");
    match key {
        "governor" => {
            let want = class.governor.clone().unwrap_or_default();
            let offered = fs.read(&f("scaling_available_governors")).map_err(read_err)?;
            if !offered.split_whitespace().any(|g| g == want) {
                return Err(Refusal::Invalid(format!(
                    "`{want}` is not a governor CPU {cpu} offers (scaling_available_governors: {offered})"
                )));
            }
            Ok((f("scaling_governor"), want))
        }
        "min_freq" | "max_freq" => {
            let lo = fs.read_number(&f("cpuinfo_min_freq")).map_err(read_err)?;
            let hi = fs.read_number(&f("cpuinfo_max_freq")).map_err(read_err)?;
            let base_file = f("base_frequency");
            let base = if fs.exists(&base_file) {
                Some(fs.read_number(&base_file).map_err(read_err)?)
            } else {
                None
            };
            let what = format!("CPU {cpu}");
            let resolve = |fr: Freq| {
                if fr == Freq::Base && base.is_none() {
                    let path = fs.root().join(&base_file);
                    return Err(Refusal::Unsupported(format!(
                        "no base frequency (`{}` is missing; intel_pstate reports one)",
                        path.display()
                    )));
                }
                resolve_freq(fr, lo, base, hi, &what)
            };
            // Each key's own value decides its error; the other one only matters for the
            // order check, which the minimum reports.
            let own = if key == "min_freq" { class.min_freq } else { class.max_freq };
            let value = own.map(resolve).transpose()?.unwrap_or_default();
            if key == "min_freq" {
                if let Some(Ok(max)) = class.max_freq.map(resolve) {
                    if value > max {
                        return Err(Refusal::Invalid(format!(
                            "min_freq is {value} kHz on CPU {cpu}, above max_freq ({max} kHz)"
                        )));
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
                return Err(Refusal::Unsupported(format!(
                    "no energy_performance_preference (the cpufreq driver `{driver}` has none: `{}` is missing)",
                    fs.root().join(&file).display()
                )));
            }
            let offered = fs.read(&f("energy_performance_available_preferences")).map_err(read_err)?;
            let driver = fs.read(&f("scaling_driver")).unwrap_or_default();
            // intel_pstate also takes the raw 0-255 value (intel_pstate.rst).
            let raw = driver == "intel_pstate" && want.parse::<u8>().is_ok();
            if !raw && !offered.split_whitespace().any(|w| w == want) {
                return Err(Refusal::Invalid(format!(
                    "`{want}` is not a preference CPU {cpu} offers (energy_performance_available_preferences: {offered})"
                )));
            }
            Ok((file, want))
        }
        _ => Err(Refusal::Invalid(format!("`{key}` is not a cpufreq key"))),
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
                .map(|cpu| Ok((fs.resume_latency_file(cpu).map_err(Refusal::Unsupported)?, text.clone())))
                .collect()
        }
        "uncore_min_freq" | "uncore_max_freq" => {
            let dies: BTreeSet<(u32, u32)> =
                cpus.iter().filter_map(|c| topo.place(c)).map(|p| (p.package, p.die)).collect();
            let mut out = Vec::new();
            for (package, die) in dies {
                let dir = fs.uncore_dir(package, die).map_err(Refusal::Unsupported)?;
                let lo = fs.read_number(&format!("{dir}/initial_min_freq_khz")).map_err(read_err)?;
                let hi = fs.read_number(&format!("{dir}/initial_max_freq_khz")).map_err(read_err)?;
                let what = format!("the uncore of package {package} die {die}");
                let resolve = |f: Freq| resolve_freq(f, lo, None, hi, &what);
                let own =
                    if key == "uncore_min_freq" { class.uncore_min_freq } else { class.uncore_max_freq };
                let value = own.map(resolve).transpose()?.unwrap_or_default();
                if key == "uncore_min_freq" {
                    if let Some(Ok(max)) = class.uncore_max_freq.map(resolve) {
                        if value > max {
                            return Err(Refusal::Invalid(format!(
                                "uncore_min_freq is {value} kHz on package {package} die {die}, above \
                                 uncore_max_freq ({max} kHz)"
                            )));
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
