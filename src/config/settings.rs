//! Stage 3: the merged inputs checked and turned into typed settings.
//!
//! Everything that can be checked without looking at the machine is checked here; what needs the
//! topology (overlaps, offline CPUs, NUMA nodes, counts that do not fit) is checked by
//! [`Settings::resolve_pools`], which still names the file that set the key at fault.

use std::path::PathBuf;

use super::cluster::{k8s_settings, kubelet_settings, K8s, Kubelet, MAX_SHARED_DEVICES};
use super::fragments::{CacheFragment, PathsFragment};
use super::inputs::{Inputs, PoolInput};
use super::{absolute, invalid, parse_metrics_listen, pool_key, ConfigError, Metrics, Origins};
use crate::core::pool::{self, CpuSource, Pool, PoolError, PoolName, PoolSpec};
use crate::core::state::CgroupPath;
use crate::core::topology::Topology;

/// Where the daemon reads and writes. Every path is absolute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paths {
    /// sysfs mount point (`/sys`); topology is read below it.
    pub sysfs_root: PathBuf,
    /// cgroup v2 mount point (`/sys/fs/cgroup`).
    pub cgroup_root: PathBuf,
    /// Durable state (`/var/lib/cpupoold`).
    pub state_dir: PathBuf,
    /// Sockets and other runtime files (`/run/cpupoold`).
    pub runtime_dir: PathBuf,
    /// The kubelet's root directory (`/var/lib/kubelet`); device-plugin sockets go below it.
    pub kubelet_dir: PathBuf,
    /// Where the DRA driver writes its CDI specs (`/var/run/cdi`), one per prepared claim; the
    /// container runtime reads them (containerd's `cdi_spec_dirs`).
    pub cdi_dir: PathBuf,
    /// procfs mount point (`/proc`): interrupt affinities are read and written below it
    /// (`irq/`, `interrupts`). Processes are always looked up in the real `/proc`.
    pub procfs_root: PathBuf,
    /// Where irqbalance puts its control socket (`/run/irqbalance`).
    pub irqbalance_dir: PathBuf,
    /// resctrl mount point (`/sys/fs/resctrl`): cache classes are applied below it. Only the
    /// default is ever mounted by the daemon.
    pub resctrl_root: PathBuf,
    /// The kernel behind these roots: the host's, unless the sandbox put its simulation here.
    /// Not configurable.
    pub kernel: crate::host::kernel::Kernel,
}

impl Default for Paths {
    fn default() -> Self {
        Paths {
            sysfs_root: "/sys".into(),
            cgroup_root: "/sys/fs/cgroup".into(),
            state_dir: "/var/lib/cpupoold".into(),
            runtime_dir: "/run/cpupoold".into(),
            kubelet_dir: "/var/lib/kubelet".into(),
            cdi_dir: "/var/run/cdi".into(),
            procfs_root: "/proc".into(),
            irqbalance_dir: crate::host::irqbalance::SOCKET_DIR.into(),
            resctrl_root: crate::host::resctrl::DEFAULT_ROOT.into(),
            kernel: crate::host::kernel::Kernel::HOST,
        }
    }
}

/// The validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// `[paths]`.
    pub paths: Paths,
    /// `daemon.host_cgroups`: cgroups confined to the reserved pool.
    pub host_cgroups: Vec<CgroupPath>,
    /// `daemon.admin_group`: the group allowed to change pools and assignments over the APIs.
    pub admin_group: String,
    /// `daemon.log_level`.
    pub log_level: log::LevelFilter,
    /// `daemon.lend_idle`: host cgroups may also use idle exclusive CPUs.
    pub lend_idle: bool,
    /// `daemon.backend`: how the plan is applied.
    pub backend: Backend,
    /// The configured pools, in name order; resolve them with [`Settings::resolve_pools`].
    pub pools: Vec<PoolSpec>,
    /// `[kubelet]`: the device plugin.
    pub kubelet: Kubelet,
    /// `[k8s]`: the cluster integration (used only when built with the `k8s` feature).
    pub k8s: K8s,
    /// `[metrics]`: the metrics endpoint.
    pub metrics: Metrics,
    /// Interrupt affinity: `daemon.irq_*`, `daemon.irqbalance` and each pool's `irq` and
    /// `irq_claim`.
    pub irq: Irq,
    /// Cache classes: each pool's `[pools.NAME.cache]` and `daemon.cache_restore_on_stop`.
    pub cache: Cache,
    /// Power classes: `daemon.power_restore_on_stop`, each pool's `[pools.NAME.power]` and
    /// `[idle_cpus.power]`.
    pub power: Power,
    /// Which file set each key, for error messages.
    pub origins: Origins,
}

/// Where interrupts go (see [`crate::core::isolation`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Irq {
    /// `daemon.irq_cpus`: where interrupts displaced from isolated CPUs go; `None`: the
    /// reserved pool's CPUs.
    pub cpus: Option<crate::core::cpuset::CpuSet>,
    /// `daemon.irq_restore_on_stop`: write the remembered affinities back when the daemon
    /// stops (otherwise they stay until isolation ends).
    pub restore_on_stop: bool,
    /// `daemon.irqbalance`: tell a running irqbalance the isolated CPUs.
    pub irqbalance: bool,
    /// Each pool's `irq` and `irq_claim`.
    pub pools: std::collections::BTreeMap<PoolName, IrqPool>,
}

/// Power classes (see [`crate::core::power`]). Only syntax is checked here; what the host
/// offers (governors, frequency limits, which drivers exist) is checked when the engine takes
/// the settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Power {
    /// `daemon.power_restore_on_stop`: write every value found before the daemon's first write
    /// back when it stops (otherwise they stay until the class is removed).
    pub restore_on_stop: bool,
    /// Each class by pool name, and [`crate::core::classes::IDLE_CPUS`] for `[idle_cpus.power]`;
    /// empty tables left out.
    pub classes: std::collections::BTreeMap<String, crate::core::power::PowerClass>,
}

impl Default for Power {
    fn default() -> Self {
        Power { restore_on_stop: true, classes: std::collections::BTreeMap::new() }
    }
}

/// The configuration key of `key` in the power class of `pool` (a pool name, or
/// [`crate::core::classes::IDLE_CPUS`]): `pools.dp.power.governor`, `idle_cpus.power.epp`.
pub fn power_key(pool: &str, key: &str) -> String {
    if pool == crate::core::classes::IDLE_CPUS {
        format!("idle_cpus.power.{key}")
    } else {
        pool_key(pool, &format!("power.{key}"))
    }
}

/// Checks one power table's syntax; `table` is its key (`pools.dp.power`).
fn power_class(
    pool: &str,
    f: super::fragments::PowerFragment,
    origins: &Origins,
) -> Result<crate::core::power::PowerClass, ConfigError> {
    use super::fragments::FreqValue;
    use crate::core::power::{self, Freq, PowerClass};
    let invalid = |k: &str, reason: String| {
        let key = power_key(pool, k);
        ConfigError::Invalid { file: origins.file_for(&key).unwrap_or_default(), key, reason }
    };
    let word = |k: &str, v: Option<String>| match v {
        Some(w) if !power::is_word(&w) => Err(invalid(
            k,
            format!(
                "`{}` is not a name the kernel lists (lower-case letters, digits, _ and -)",
                w.escape_debug()
            ),
        )),
        other => Ok(other),
    };
    let freq = |k: &str, v: Option<FreqValue>| -> Result<Option<Freq>, ConfigError> {
        let bad =
            |shown: String| invalid(k, format!("{shown} is not a frequency in kHz or `min`, `base`, `max`"));
        match v {
            None => Ok(None),
            Some(FreqValue::Number(n)) if n > 0 => Ok(Some(Freq::Khz(n.unsigned_abs()))),
            Some(FreqValue::Number(n)) => Err(bad(n.to_string())),
            Some(FreqValue::Word(w)) => match w.as_str() {
                "min" | "base" | "max" => Ok(Freq::parse_word(&w)),
                _ => Err(bad(format!("`{}`", w.escape_debug()))),
            },
        }
    };
    let class = PowerClass {
        governor: word("governor", f.governor)?,
        min_freq: freq("min_freq", f.min_freq)?,
        max_freq: freq("max_freq", f.max_freq)?,
        epp: word("epp", f.epp)?,
        resume_latency_us: match f.resume_latency_us {
            None => None,
            Some(n) => Some(
                u32::try_from(n).ok().filter(|&n| n <= power::MAX_RESUME_LATENCY_US).ok_or_else(|| {
                    invalid(
                        "resume_latency_us",
                        format!("{n} must be between 0 and {} (µs)", power::MAX_RESUME_LATENCY_US),
                    )
                })?,
            ),
        },
        uncore_min_freq: freq("uncore_min_freq", f.uncore_min_freq)?,
        uncore_max_freq: freq("uncore_max_freq", f.uncore_max_freq)?,
    };
    if class.uncore_min_freq == Some(Freq::Base) || class.uncore_max_freq == Some(Freq::Base) {
        let k = if class.uncore_min_freq == Some(Freq::Base) { "uncore_min_freq" } else { "uncore_max_freq" };
        return Err(invalid(k, "the uncore has no base frequency: use kHz, `min` or `max`".into()));
    }
    for (lo, hi, k) in [
        (class.min_freq, class.max_freq, "min_freq"),
        (class.uncore_min_freq, class.uncore_max_freq, "uncore_min_freq"),
    ] {
        if let (Some(Freq::Khz(lo)), Some(Freq::Khz(hi))) = (lo, hi) {
            if lo > hi {
                return Err(invalid(k, format!("{lo} kHz is above the maximum set beside it ({hi} kHz)")));
            }
        }
    }
    Ok(class)
}

/// One pool's `irq` and `irq_claim`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IrqPool {
    /// `irq`: `isolate` by default for `isolate = true` pools, `none` otherwise.
    pub mode: crate::core::isolation::IrqMode,
    /// `irq_claim`: globs on IRQ names whose interrupts go to exactly this pool's CPUs.
    pub claims: Vec<String>,
}

/// Cache classes (see `engine::cache`): what each pool asks of resctrl.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Cache {
    /// `daemon.cache_restore_on_stop`: remove the pools' resctrl groups when the daemon stops
    /// (their CPUs go back to the default group).
    pub restore_on_stop: bool,
    /// Each pool's `[pools.NAME.cache]`, for pools that set at least one key.
    pub pools: std::collections::BTreeMap<PoolName, crate::core::cache::CacheClass>,
}

/// How the daemon applies its plan (`daemon.backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backend {
    /// systemd when it runs as PID 1 (`/run/systemd/system` exists), cgroupfs otherwise.
    #[default]
    Auto,
    /// Slices and units through systemd's D-Bus API; partitions and delegated cgroups directly.
    Systemd,
    /// Every cgroup file written directly (no systemd on the host).
    Cgroupfs,
}

/// `daemon.host_cgroups` when no file sets it.
pub const DEFAULT_HOST_CGROUPS: [&str; 3] = ["system.slice", "user.slice", "init.scope"];
/// `daemon.admin_group` when no file sets it.
pub const DEFAULT_ADMIN_GROUP: &str = "cpupool";
/// `daemon.log_level` when no file sets it.
pub const DEFAULT_LOG_LEVEL: log::LevelFilter = log::LevelFilter::Info;

/// `daemon.backend`.
fn backend(text: Option<&str>, origins: &Origins) -> Result<Backend, ConfigError> {
    match text {
        None | Some("auto") => Ok(Backend::Auto),
        Some("systemd") => Ok(Backend::Systemd),
        Some("cgroupfs") => Ok(Backend::Cgroupfs),
        Some(other) => Err(invalid(
            origins,
            "daemon.backend",
            format!("`{}` is not one of auto, systemd, cgroupfs", other.escape_debug()),
        )),
    }
}

/// `[paths]`: every root absolute.
fn paths_settings(paths: PathsFragment, origins: &Origins) -> Result<Paths, ConfigError> {
    let defaults = Paths::default();
    let absolute =
        |value: Option<PathBuf>, default: PathBuf, key: &str| absolute(origins, value, default, key);
    Ok(Paths {
        sysfs_root: absolute(paths.sysfs_root, defaults.sysfs_root, "paths.sysfs_root")?,
        cgroup_root: absolute(paths.cgroup_root, defaults.cgroup_root, "paths.cgroup_root")?,
        state_dir: absolute(paths.state_dir, defaults.state_dir, "paths.state_dir")?,
        runtime_dir: absolute(paths.runtime_dir, defaults.runtime_dir, "paths.runtime_dir")?,
        kubelet_dir: absolute(paths.kubelet_dir, defaults.kubelet_dir, "paths.kubelet_dir")?,
        cdi_dir: absolute(paths.cdi_dir, defaults.cdi_dir, "paths.cdi_dir")?,
        procfs_root: absolute(paths.procfs_root, defaults.procfs_root, "paths.procfs_root")?,
        irqbalance_dir: absolute(paths.irqbalance_dir, defaults.irqbalance_dir, "paths.irqbalance_dir")?,
        resctrl_root: absolute(paths.resctrl_root, defaults.resctrl_root, "paths.resctrl_root")?,
        kernel: defaults.kernel,
    })
}

/// `daemon.host_cgroups`, each a cgroup path.
fn host_cgroups(list: Option<Vec<String>>, origins: &Origins) -> Result<Vec<CgroupPath>, ConfigError> {
    let Some(list) = list else {
        return Ok(DEFAULT_HOST_CGROUPS.iter().filter_map(|s| CgroupPath::new(s).ok()).collect());
    };
    list.iter()
        .enumerate()
        .map(|(i, s)| {
            CgroupPath::new(s).map_err(|source| ConfigError::HostCgroup {
                file: origins.file_for("daemon.host_cgroups").unwrap_or_default(),
                key: format!("daemon.host_cgroups[{i}]"),
                source: Box::new(source),
            })
        })
        .collect()
}

/// `daemon.admin_group`: a group name.
fn admin_group(name: Option<String>, origins: &Origins) -> Result<String, ConfigError> {
    let name = name.unwrap_or_else(|| DEFAULT_ADMIN_GROUP.to_owned());
    if name.is_empty() || name.chars().any(|c| c == ':' || c == '/' || c.is_whitespace() || c.is_control()) {
        return Err(invalid(
            origins,
            "daemon.admin_group",
            format!("`{}` is not a group name", name.escape_debug()),
        ));
    }
    Ok(name)
}

/// `daemon.log_level`.
fn log_level(text: Option<&str>, origins: &Origins) -> Result<log::LevelFilter, ConfigError> {
    Ok(match text {
        None => DEFAULT_LOG_LEVEL,
        Some("error") => log::LevelFilter::Error,
        Some("warn") => log::LevelFilter::Warn,
        Some("info") => log::LevelFilter::Info,
        Some("debug") => log::LevelFilter::Debug,
        Some("trace") => log::LevelFilter::Trace,
        Some(other) => {
            return Err(invalid(
                origins,
                "daemon.log_level",
                format!("`{}` is not one of error, warn, info, debug, trace", other.escape_debug()),
            ))
        }
    })
}

impl Settings {
    /// Validates merged inputs.
    pub(crate) fn from_inputs(inputs: Inputs) -> Result<Self, ConfigError> {
        let Inputs { paths, daemon, pools, origins, files, kubelet, k8s, metrics, idle_cpus } = inputs;
        let power_restore_on_stop = daemon.power_restore_on_stop;
        let daemon_irq = (daemon.irq_cpus.clone(), daemon.irq_restore_on_stop, daemon.irqbalance);
        let lend_idle = daemon.lend_idle.unwrap_or(false);
        let backend = backend(daemon.backend.as_deref(), &origins)?;
        let paths = paths_settings(paths, &origins)?;
        let host_cgroups = host_cgroups(daemon.host_cgroups, &origins)?;
        let admin_group = admin_group(daemon.admin_group, &origins)?;
        let log_level = log_level(daemon.log_level.as_deref(), &origins)?;

        let kubelet = kubelet_settings(kubelet, &origins)?;
        let k8s = k8s_settings(k8s, &origins)?;

        let defaults = Metrics::default();
        let metrics = Metrics {
            enabled: metrics.enabled.unwrap_or(defaults.enabled),
            listen: match &metrics.listen {
                None => defaults.listen,
                Some(text) => parse_metrics_listen(text)
                    .map_err(|reason| invalid(&origins, "metrics.listen", reason))?,
            },
        };

        let mut pools = pools;
        pools.retain(|_, p| p.removed != Some(true));
        if pools.is_empty() {
            return Err(ConfigError::NoPools { files });
        }
        let mut power = Power { restore_on_stop: power_restore_on_stop.unwrap_or(true), ..Power::default() };
        for (name, table) in pools
            .iter()
            .filter_map(|(n, p)| p.power.clone().map(|t| (n.as_str(), t)))
            .chain(idle_cpus.power.map(|t| (crate::core::classes::IDLE_CPUS, t)))
        {
            let class = power_class(name, table, &origins)?;
            if !class.is_empty() {
                power.classes.insert(name.to_owned(), class);
            }
        }
        let irq_inputs: Vec<(String, Option<String>, Option<Vec<String>>)> =
            pools.iter().map(|(n, p)| (n.clone(), p.irq.clone(), p.irq_claim.clone())).collect();
        let cache_inputs: Vec<(String, CacheFragment)> =
            pools.iter().filter_map(|(n, p)| Some((n.clone(), p.cache.clone()?))).collect();
        let pools = pools
            .into_iter()
            .map(|(name, input)| pool_spec(&name, input, &origins))
            .collect::<Result<Vec<_>, _>>()?;
        let irq = irq_settings(&daemon_irq, irq_inputs, &pools, &origins)?;
        let cache = cache_settings(daemon.cache_restore_on_stop, cache_inputs, &pools, &origins)?;

        Ok(Settings {
            paths,
            host_cgroups,
            admin_group,
            log_level,
            lend_idle,
            backend,
            pools,
            kubelet,
            k8s,
            metrics,
            irq,
            cache,
            power,
            origins,
        })
    }

    /// Resolves the pools against the host's topology (see [`pool::resolve`]). An error names the
    /// file that set the key at fault; `source()` is the [`PoolError`].
    pub fn resolve_pools(&self, topo: &Topology) -> Result<Vec<Pool>, ConfigError> {
        self.resolve_pools_keeping(topo, &std::collections::BTreeMap::new())
    }

    /// Like [`Settings::resolve_pools`], keeping the CPUs each `count` pool has now where it
    /// can (see [`pool::resolve_keeping`]): the running pools on a reload or pool edit, the
    /// saved ones at start.
    pub fn resolve_pools_keeping(
        &self,
        topo: &Topology,
        current: &std::collections::BTreeMap<crate::core::pool::PoolName, crate::core::cpuset::CpuSet>,
    ) -> Result<Vec<Pool>, ConfigError> {
        let pools = pool::resolve_keeping(&self.pools, topo, current).map_err(|source| {
            let key = self.key_for(&source);
            ConfigError::Pool { file: self.origins.file_for(&key), key, source }
        })?;
        self.check_device_counts(&pools)?;
        Ok(pools)
    }

    /// `source` as resolving reports it: naming the key at fault and the file that set it.
    pub fn pool_error(&self, source: PoolError) -> ConfigError {
        let key = self.key_for(&source);
        ConfigError::Pool { file: self.origins.file_for(&key), key, source }
    }

    /// Refuses a shared pool that would offer the kubelet more than [`MAX_SHARED_DEVICES`].
    fn check_device_counts(&self, pools: &[Pool]) -> Result<(), ConfigError> {
        if !self.kubelet.enabled {
            return Ok(());
        }
        let per_device = self.kubelet.millicpus_per_device.max(1);
        for p in pools.iter().filter(|p| p.kubelet && !p.dra && p.kind == crate::core::pool::PoolKind::Shared)
        {
            let devices = p.capacity_millis() / per_device;
            if devices > MAX_SHARED_DEVICES {
                let key = "kubelet.millicpus_per_device";
                return Err(ConfigError::Invalid {
                    file: self.origins.file_for(key).unwrap_or_default(),
                    key: key.to_owned(),
                    reason: format!(
                        "{per_device} makes shared pool `{}` ({} CPUs) {devices} devices, more than the {MAX_SHARED_DEVICES} \
                         one ListAndWatch message carries well under the kubelet's 4 MiB; use a larger unit, or \
                         `kubelet = false` on the pool",
                        p.name,
                        p.cpus.len()
                    ),
                });
            }
        }
        Ok(())
    }

    /// The key a resolution error is about.
    fn key_for(&self, err: &PoolError) -> String {
        let source_key = |name: &PoolName| {
            let field = match self.pools.iter().find(|p| &p.name == name).map(|p| &p.source) {
                Some(CpuSource::List(_)) | None => "cpus",
                Some(CpuSource::Request { .. }) => "count",
                Some(CpuSource::Isolcpus) => "isolcpus",
            };
            pool_key(name.as_str(), field)
        };
        match err {
            PoolError::InvalidName { name, .. } => pool_key(name, ""),
            PoolError::Duplicate(name) => pool_key(name.as_str(), ""),
            PoolError::NoReserved => "pools".to_owned(),
            PoolError::TwoReserved(_, second) => pool_key(second.as_str(), "kind"),
            // The later pool in claim order is the one that did not fit.
            PoolError::Overlap { b, .. } => source_key(b),
            PoolError::ReservedEmpty(name) | PoolError::NoHousekeeping { pool: name, .. } => source_key(name),
            PoolError::NotOnline { pool, .. } | PoolError::Empty(pool) => pool_key(pool.as_str(), "cpus"),
            // A list or the isolated set that splits cores is the list's fault; a counted pool
            // can only end up with part of a core because of what smt asks for.
            PoolError::PartialCores { pool, .. } => match source_key(pool) {
                key if key.ends_with(".count") => pool_key(pool.as_str(), "smt"),
                key => key,
            },
            PoolError::IsolateNotExclusive(name) => pool_key(name.as_str(), "isolate"),
            PoolError::QuotaNotShared(name) => pool_key(name.as_str(), "enforce_quota"),
            PoolError::DraNotOffered(name) => pool_key(name.as_str(), "dra"),
            PoolError::IsolcpusNotExclusive(name) | PoolError::IsolcpusEmpty(name) => {
                pool_key(name.as_str(), "isolcpus")
            }
            PoolError::ZeroCount(pool)
            | PoolError::NotEnoughCpus { pool, .. }
            | PoolError::CountNotWholeCores { pool, .. } => pool_key(pool.as_str(), "count"),
            PoolError::UnknownNode { pool, .. } => pool_key(pool.as_str(), "numa"),
        }
    }
}

/// The interrupt settings: `daemon.irq_*` and each pool's `irq` and `irq_claim`.
fn irq_settings(
    daemon: &(Option<String>, Option<bool>, Option<bool>),
    inputs: Vec<(String, Option<String>, Option<Vec<String>>)>,
    specs: &[PoolSpec],
    origins: &Origins,
) -> Result<Irq, ConfigError> {
    use crate::core::isolation::{check_glob, IrqMode};
    let invalid = |key: String, reason: String| ConfigError::Invalid {
        file: origins.file_for(&key).unwrap_or_default(),
        key,
        reason,
    };
    let cpus = match &daemon.0 {
        None => None,
        Some(text) => Some(crate::core::cpuset::CpuSet::parse(text).map_err(|source| ConfigError::Cpus {
            file: origins.file_for("daemon.irq_cpus").unwrap_or_default(),
            key: "daemon.irq_cpus".to_owned(),
            source,
        })?),
    };
    if cpus.as_ref().is_some_and(crate::core::cpuset::CpuSet::is_empty) {
        return Err(invalid(
            "daemon.irq_cpus".into(),
            "must name at least one CPU (omit it for the reserved pool's)".into(),
        ));
    }
    let mut pools = std::collections::BTreeMap::new();
    for (name, mode, claims) in inputs {
        let Some(spec) = specs.iter().find(|s| s.name.as_str() == name) else { continue };
        let mode = match mode.as_deref() {
            None if spec.isolate => IrqMode::Isolate,
            None => IrqMode::None,
            Some(word) => IrqMode::parse(word).ok_or_else(|| {
                invalid(
                    pool_key(&name, "irq"),
                    format!("`{}` is not one of isolate, sink, none", word.escape_debug()),
                )
            })?,
        };
        if mode == IrqMode::Sink && spec.isolate {
            return Err(invalid(
                pool_key(&name, "irq"),
                "an isolate = true pool cannot take displaced interrupts (irq = \"sink\")".into(),
            ));
        }
        let claims = claims.unwrap_or_default();
        for (i, glob) in claims.iter().enumerate() {
            check_glob(glob)
                .map_err(|reason| invalid(format!("{}[{i}]", pool_key(&name, "irq_claim")), reason))?;
        }
        pools.insert(spec.name.clone(), IrqPool { mode, claims });
    }
    Ok(Irq { cpus, restore_on_stop: daemon.1.unwrap_or(true), irqbalance: daemon.2.unwrap_or(true), pools })
}

/// The cache classes: each pool's `[pools.NAME.cache]` checked for syntax (what the host
/// offers is checked when the engine takes the settings).
fn cache_settings(
    restore_on_stop: Option<bool>,
    inputs: Vec<(String, CacheFragment)>,
    specs: &[PoolSpec],
    origins: &Origins,
) -> Result<Cache, ConfigError> {
    use crate::core::cache::{CacheClass, L3Share};
    let invalid = |key: String, reason: String| ConfigError::Invalid {
        file: origins.file_for(&key).unwrap_or_default(),
        key,
        reason,
    };
    let mut pools = std::collections::BTreeMap::new();
    for (name, input) in inputs {
        let Some(spec) = specs.iter().find(|s| s.name.as_str() == name) else { continue };
        let l3 = match &input.l3 {
            None => None,
            Some(text) => {
                Some(L3Share::parse(text).map_err(|reason| invalid(pool_key(&name, "cache.l3"), reason))?)
            }
        };
        if let Some(mb) = input.mb {
            if !(1..=100).contains(&mb) {
                return Err(invalid(
                    pool_key(&name, "cache.mb"),
                    format!("{mb} is not a percentage of memory bandwidth between 1 and 100"),
                ));
            }
        }
        if l3.is_some() || input.mb.is_some() {
            pools.insert(spec.name.clone(), CacheClass { l3, mb: input.mb });
        }
    }
    Ok(Cache { restore_on_stop: restore_on_stop.unwrap_or(true), pools })
}

fn pool_spec(name: &str, input: PoolInput, origins: &Origins) -> Result<PoolSpec, ConfigError> {
    let at = |field: &str| {
        let key = pool_key(name, field);
        (origins.file_for(&key).unwrap_or_default(), key)
    };
    let invalid = |field: &str, reason: &str| {
        let (file, key) = at(field);
        ConfigError::Invalid { file, key, reason: reason.to_owned() }
    };

    let pool_name = PoolName::new(name).map_err(|source| {
        let (file, key) = at("");
        ConfigError::PoolName { file, key, source }
    })?;
    let kind = input
        .kind
        .ok_or_else(|| invalid("kind", "missing: set \"reserved\", \"exclusive\" or \"shared\""))?;

    let isolcpus = input.isolcpus == Some(true);
    let source = match (input.cpus, input.count, isolcpus) {
        (Some(cpus), None, false) => CpuSource::List(cpus),
        (None, Some(count), false) => CpuSource::Request { count, numa: input.numa },
        (None, None, true) => CpuSource::Isolcpus,
        (None, None, false) => {
            return Err(invalid("", "no CPU source: set one of cpus, count or isolcpus = true"))
        }
        (cpus, _, _) => {
            // All three come from one file (see the inputs stage), so any of them names it.
            let field = if cpus.is_some() { "cpus" } else { "count" };
            return Err(invalid(
                field,
                "set only one of cpus, count and isolcpus = true (they are alternatives)",
            ));
        }
    };
    match source {
        CpuSource::Request { count: 0, .. } => return Err(invalid("count", "must be at least 1")),
        CpuSource::Request { .. } => {}
        _ if input.numa.is_some() => {
            return Err(invalid("numa", "only applies to count (a list or isolcpus names its CPUs)"))
        }
        _ => {}
    }

    let mut spec = PoolSpec::new(pool_name, kind, source);
    spec.smt = input.smt.unwrap_or(spec.smt);
    spec.isolate = input.isolate.unwrap_or(spec.isolate);
    spec.kubelet = input.kubelet.unwrap_or(spec.kubelet);
    spec.enforce_quota = input.enforce_quota.unwrap_or(spec.enforce_quota);
    spec.dra = input.dra.unwrap_or(spec.dra);
    Ok(spec)
}
