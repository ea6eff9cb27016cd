//! Power and cache classes: what a pool asks of its CPUs beyond the cpuset (cpufreq, PM QoS,
//! uncore frequency; resctrl cache ways and memory bandwidth), and what is in force.
//!
//! The managers that apply a class (`engine::power`, `engine::cache`) each report one
//! [`ClassRow`] per configured key; the engine publishes them together in the snapshot, and
//! every surface (`pool show`, `status`, D-Bus, varlink, metrics) shows those rows, so a new
//! knob needs no new wire shape.

use serde::{Deserialize, Serialize};

/// Which class a setting belongs to: the config table it comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClassKind {
    /// `[pools.NAME.power]` or `[idle_cpus.power]`.
    Power,
    /// `[pools.NAME.cache]`.
    Cache,
}

impl ClassKind {
    /// The table's name, as in the configuration and on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ClassKind::Power => "power",
            ClassKind::Cache => "cache",
        }
    }
}

/// Where a setting stands, after the last apply and its read-back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", content = "why", rename_all = "lowercase")]
pub enum ClassState {
    /// Written, and read back as wanted on every CPU (or group) it covers.
    Applied,
    /// Written, but what was read back differs (or the write failed): the reason.
    Degraded(String),
    /// The host lacks what the key needs: what is missing.
    Unsupported(String),
}

impl ClassState {
    /// `applied`, `degraded` or `unsupported`, as on the wire.
    pub fn as_str(&self) -> &'static str {
        match self {
            ClassState::Applied => "applied",
            ClassState::Degraded(_) => "degraded",
            ClassState::Unsupported(_) => "unsupported",
        }
    }

    /// The reason, empty when applied.
    pub fn why(&self) -> &str {
        match self {
            ClassState::Applied => "",
            ClassState::Degraded(w) | ClassState::Unsupported(w) => w,
        }
    }
}

/// The name under which CPUs in no pool appear in class rows (`[idle_cpus.power]`); no pool
/// can have it, since pool names cannot contain parentheses.
pub const IDLE_CPUS: &str = "(idle)";

/// One configured key of one pool's class: what was asked, what the kernel shows, and its state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClassRow {
    /// The pool, or [`IDLE_CPUS`].
    pub pool: String,
    /// `power` or `cache`.
    pub class: ClassKind,
    /// The key as configured (`governor`, `resume_latency_us`, `l3`, ...).
    pub key: String,
    /// The value as configured (`performance`, `0`, `50%`).
    pub wanted: String,
    /// What was read back, as the kernel's file shows it (`performance`, `n/a`, `ff0`); when
    /// CPUs differ, the distinct values joined with `,`.
    pub in_force: String,
    /// The CPUs (kernel list) or resctrl group the setting covers.
    pub scope: String,
    /// Applied, degraded or unsupported.
    pub state: ClassState,
}
