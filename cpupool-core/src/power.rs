//! A pool's power class (`[pools.NAME.power]`, `[idle_cpus.power]`) as plain data, and the
//! kernel's encodings of its values; no I/O.
//!
//! The files and what they hold come from the kernel's documentation:
//! - cpufreq (Documentation/admin-guide/pm/cpufreq.rst): `scaling_governor` is one of the words
//!   in `scaling_available_governors`; `scaling_min_freq`, `scaling_max_freq`,
//!   `cpuinfo_min_freq`, `cpuinfo_max_freq` and intel_pstate's `base_frequency` are kHz;
//!   `energy_performance_preference` (intel_pstate, amd-pstate) is one of the words in
//!   `energy_performance_available_preferences` or, with intel_pstate, a number 0-255.
//! - PM QoS (Documentation/ABI/testing/sysfs-devices-power, `pm_qos_resume_latency_us`): a
//!   number of microseconds, where `0` is the absence of any constraint and `n/a` is the
//!   strictest one (no resume latency accepted). So the configured `resume_latency_us = 0`,
//!   "keep these CPUs out of every idle state", is the file's `n/a`, and the file's `0` is what
//!   a CPU nobody constrains holds. [`resume_latency_text`] and [`parse_resume_latency`] are
//!   the one place that knows it.
//! - intel_uncore_frequency
//!   (Documentation/admin-guide/pm/intel_uncore_frequency_scaling.rst): one directory per
//!   package and die, `package_PP_die_DD`, with `min_freq_khz` and `max_freq_khz` (settable)
//!   within `initial_min_freq_khz` and `initial_max_freq_khz` (the limits found at boot).
#![deny(missing_docs)]

use std::fmt;

pub mod plan;

/// The largest resume latency the kernel takes (it reads the file as a signed 32-bit number;
/// its own "no constraint" sits at the top of that range).
pub const MAX_RESUME_LATENCY_US: u32 = i32::MAX as u32 - 1;

/// A frequency setting: kHz, or one of the limits the host reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freq {
    /// A frequency in kHz.
    Khz(u64),
    /// The lowest the hardware allows (`cpuinfo_min_freq`, `initial_min_freq_khz`).
    Min,
    /// The guaranteed frequency (intel_pstate's `base_frequency`; uncore has none).
    Base,
    /// The highest the hardware allows (`cpuinfo_max_freq`, `initial_max_freq_khz`).
    Max,
}

impl Freq {
    /// `min`, `base`, `max` or a number of kHz.
    pub fn parse_word(word: &str) -> Option<Freq> {
        match word {
            "min" => Some(Freq::Min),
            "base" => Some(Freq::Base),
            "max" => Some(Freq::Max),
            _ => word.parse().ok().filter(|&k| k > 0).map(Freq::Khz),
        }
    }
}

impl fmt::Display for Freq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Freq::Khz(k) => write!(f, "{k}"),
            Freq::Min => f.write_str("min"),
            Freq::Base => f.write_str("base"),
            Freq::Max => f.write_str("max"),
        }
    }
}

/// One power class: every key optional; an absent key leaves the CPUs' value alone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PowerClass {
    /// `governor`: cpufreq `scaling_governor`.
    pub governor: Option<String>,
    /// `min_freq`: cpufreq `scaling_min_freq`.
    pub min_freq: Option<Freq>,
    /// `max_freq`: cpufreq `scaling_max_freq`.
    pub max_freq: Option<Freq>,
    /// `epp`: `energy_performance_preference`.
    pub epp: Option<String>,
    /// `resume_latency_us`: PM QoS per CPU (see [`resume_latency_text`]).
    pub resume_latency_us: Option<u32>,
    /// `uncore_min_freq`: intel_uncore_frequency `min_freq_khz` of the dies the CPUs are on.
    pub uncore_min_freq: Option<Freq>,
    /// `uncore_max_freq`: intel_uncore_frequency `max_freq_khz`.
    pub uncore_max_freq: Option<Freq>,
}

/// The keys of a power class, in the order they are applied and reported.
pub const KEYS: [&str; 7] =
    ["governor", "max_freq", "min_freq", "epp", "resume_latency_us", "uncore_max_freq", "uncore_min_freq"];

impl PowerClass {
    /// Whether no key is set.
    pub fn is_empty(&self) -> bool {
        self.keys().next().is_none()
    }

    /// The keys that are set, each with its value as configured, in [`KEYS`] order.
    pub fn keys(&self) -> impl Iterator<Item = (&'static str, String)> + '_ {
        KEYS.into_iter().filter_map(|k| self.wanted(k).map(|v| (k, v)))
    }

    /// The configured value of `key`, as written in the configuration.
    pub fn wanted(&self, key: &str) -> Option<String> {
        match key {
            "governor" => self.governor.clone(),
            "min_freq" => self.min_freq.map(|f| f.to_string()),
            "max_freq" => self.max_freq.map(|f| f.to_string()),
            "epp" => self.epp.clone(),
            "resume_latency_us" => self.resume_latency_us.map(|v| v.to_string()),
            "uncore_min_freq" => self.uncore_min_freq.map(|f| f.to_string()),
            "uncore_max_freq" => self.uncore_max_freq.map(|f| f.to_string()),
            _ => None,
        }
    }
}

/// What to write to `pm_qos_resume_latency_us` for a configured latency: `n/a` for 0 (no
/// latency accepted: no idle state at all), the number otherwise. Never `0`, which the kernel
/// reads as "no constraint".
pub fn resume_latency_text(us: u32) -> String {
    if us == 0 {
        "n/a".to_owned()
    } else {
        us.to_string()
    }
}

/// What a `pm_qos_resume_latency_us` file holds: `None` for no constraint (`0`), `Some(0)` for
/// `n/a`, `Some(n)` for n µs; `Err` for anything else.
pub fn parse_resume_latency(text: &str) -> Result<Option<u32>, String> {
    match text.trim() {
        "n/a" => Ok(Some(0)),
        "0" => Ok(None),
        t => t.parse().map(Some).map_err(|_| format!("`{}` is not a resume latency", t.escape_debug())),
    }
}

/// Whether `word` can be a governor or EPP name as the kernel lists them: a short word of
/// lower-case letters, digits, `_` and `-` (nothing that could carry a second value or a
/// newline into a sysfs write).
pub fn is_word(word: &str) -> bool {
    !word.is_empty()
        && word.len() <= 32
        && word.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The documented encoding: the configured 0 is the file's `n/a`, and the file's 0 means
    /// no constraint (not "0 µs").
    #[test]
    fn resume_latency_follows_the_abi_document() {
        assert_eq!(resume_latency_text(0), "n/a");
        assert_eq!(resume_latency_text(20), "20");
        assert_eq!(parse_resume_latency("n/a\n"), Ok(Some(0)));
        assert_eq!(parse_resume_latency("0\n"), Ok(None));
        assert_eq!(parse_resume_latency("125"), Ok(Some(125)));
        assert!(parse_resume_latency("-1").is_err());
    }

    #[test]
    fn frequency_words() {
        assert_eq!(Freq::parse_word("max"), Some(Freq::Max));
        assert_eq!(Freq::parse_word("base"), Some(Freq::Base));
        assert_eq!(Freq::parse_word("2400000"), Some(Freq::Khz(2_400_000)));
        assert_eq!(Freq::parse_word("0"), None);
        assert_eq!(Freq::parse_word("fast"), None);
        assert_eq!(Freq::Khz(800_000).to_string(), "800000");
    }

    #[test]
    fn keys_in_order() {
        let c = PowerClass {
            governor: Some("performance".into()),
            min_freq: Some(Freq::Max),
            resume_latency_us: Some(0),
            ..PowerClass::default()
        };
        let keys: Vec<_> = c.keys().collect();
        assert_eq!(
            keys,
            [
                ("governor", "performance".into()),
                ("min_freq", "max".into()),
                ("resume_latency_us", "0".into())
            ]
        );
        assert!(PowerClass::default().is_empty());
        assert!(is_word("balance_performance") && !is_word("a b") && !is_word("x\n") && !is_word(""));
    }
}
