//! Stage 2: the fragments merged into one set of inputs, remembering which file set what.
//!
//! Scalars merge key by key: a later file's value replaces an earlier one, and a key a file does
//! not mention keeps its earlier value. Arrays (`daemon.host_cgroups`) are replaced whole, never
//! appended to, so a drop-in can shrink the list.
//!
//! A pool's CPU source is one unit: the latest fragment that sets any of `cpus`, `count` or
//! `isolcpus` for a pool replaces all of them (and `numa`, which belongs to `count`) with what it
//! says. A vendor `count = 4, numa = 1` overridden by an admin's `cpus = "2-5"` is therefore a
//! list pool, not an error about two sources. A fragment that sets only `numa` moves the counted
//! request it finds to that node.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::fragments::{
    DaemonFragment, Fragment, IdleCpusFragment, K8sFragment, KubeletFragment, MetricsFragment, PathsFragment,
    PoolFragment, PowerFragment,
};
use super::{pool_key, ConfigError, Origins};
use crate::core::cpuset::CpuSet;

/// The keys that together say where a pool's CPUs come from.
const SOURCE_FIELDS: [&str; 4] = ["cpus", "count", "numa", "isolcpus"];

/// Every fragment merged; not yet checked for completeness or consistency.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Inputs {
    pub paths: PathsFragment,
    pub daemon: DaemonFragment,
    pub kubelet: KubeletFragment,
    pub k8s: K8sFragment,
    pub metrics: MetricsFragment,
    pub idle_cpus: IdleCpusFragment,
    /// By name as written; names are validated in the settings stage.
    pub pools: BTreeMap<String, PoolInput>,
    /// Who set each key last.
    pub origins: Origins,
    /// The fragments merged, in order.
    pub files: Vec<PathBuf>,
}

/// One pool's merged keys: a fragment's, with `cpus` parsed.
pub(crate) type PoolInput = PoolFragment<CpuSet>;

impl Inputs {
    /// Merges every fragment, first to last.
    pub fn merge_all(fragments: Vec<(PathBuf, Fragment)>) -> Result<Self, ConfigError> {
        let mut inputs = Inputs::default();
        for (file, fragment) in fragments {
            inputs.merge(&file, fragment)?;
        }
        Ok(inputs)
    }

    /// Lays `fragment` from `file` over what was merged so far.
    pub fn merge(&mut self, file: &Path, fragment: Fragment) -> Result<(), ConfigError> {
        self.files.push(file.to_owned());
        let mut set = Setter { origins: &mut self.origins, file };

        let Fragment { paths, daemon, pools, kubelet, k8s, metrics, idle_cpus } = fragment;
        if let Some(power) = idle_cpus.power {
            set.power(&mut self.idle_cpus.power, power, "idle_cpus.power");
        }
        set.field(&mut self.metrics.enabled, metrics.enabled, "metrics.enabled");
        set.field(&mut self.metrics.listen, metrics.listen, "metrics.listen");
        let c = &mut self.k8s;
        set.field(&mut c.enabled, k8s.enabled, "k8s.enabled");
        set.field(&mut c.kubeconfig, k8s.kubeconfig, "k8s.kubeconfig");
        set.field(&mut c.node_name, k8s.node_name, "k8s.node_name");
        set.field(&mut c.namespace, k8s.namespace, "k8s.namespace");
        set.field(&mut c.report_interval_ms, k8s.report_interval_ms, "k8s.report_interval_ms");
        let k = &mut self.kubelet;
        set.field(&mut k.enabled, kubelet.enabled, "kubelet.enabled");
        set.field(&mut k.resource_prefix, kubelet.resource_prefix, "kubelet.resource_prefix");
        set.field(&mut k.millicpus_per_device, kubelet.millicpus_per_device, "kubelet.millicpus_per_device");
        set.field(&mut k.release_grace_ms, kubelet.release_grace_ms, "kubelet.release_grace_ms");
        set.field(
            &mut k.reconcile_interval_ms,
            kubelet.reconcile_interval_ms,
            "kubelet.reconcile_interval_ms",
        );
        set.field(&mut k.runtime_endpoint, kubelet.runtime_endpoint, "kubelet.runtime_endpoint");
        set.field(&mut k.confine_unpooled, kubelet.confine_unpooled, "kubelet.confine_unpooled");
        set.field(&mut k.nri, kubelet.nri, "kubelet.nri");
        set.field(&mut k.nri_socket, kubelet.nri_socket, "kubelet.nri_socket");
        set.field(&mut self.paths.sysfs_root, paths.sysfs_root, "paths.sysfs_root");
        set.field(&mut self.paths.cgroup_root, paths.cgroup_root, "paths.cgroup_root");
        set.field(&mut self.paths.state_dir, paths.state_dir, "paths.state_dir");
        set.field(&mut self.paths.runtime_dir, paths.runtime_dir, "paths.runtime_dir");
        set.field(&mut self.paths.kubelet_dir, paths.kubelet_dir, "paths.kubelet_dir");
        set.field(&mut self.daemon.host_cgroups, daemon.host_cgroups, "daemon.host_cgroups");
        set.field(&mut self.daemon.admin_group, daemon.admin_group, "daemon.admin_group");
        set.field(&mut self.daemon.log_level, daemon.log_level, "daemon.log_level");
        set.field(&mut self.daemon.lend_idle, daemon.lend_idle, "daemon.lend_idle");
        set.field(&mut self.daemon.backend, daemon.backend, "daemon.backend");
        set.field(&mut self.daemon.irq_cpus, daemon.irq_cpus, "daemon.irq_cpus");
        set.field(
            &mut self.daemon.irq_restore_on_stop,
            daemon.irq_restore_on_stop,
            "daemon.irq_restore_on_stop",
        );
        set.field(&mut self.daemon.irqbalance, daemon.irqbalance, "daemon.irqbalance");
        set.field(
            &mut self.daemon.power_restore_on_stop,
            daemon.power_restore_on_stop,
            "daemon.power_restore_on_stop",
        );
        set.field(&mut self.paths.procfs_root, paths.procfs_root, "paths.procfs_root");
        set.field(&mut self.paths.irqbalance_dir, paths.irqbalance_dir, "paths.irqbalance_dir");
        set.field(&mut self.paths.resctrl_root, paths.resctrl_root, "paths.resctrl_root");
        set.field(
            &mut self.daemon.cache_restore_on_stop,
            daemon.cache_restore_on_stop,
            "daemon.cache_restore_on_stop",
        );

        for (name, p) in pools {
            // Parsed even when a later file overrides it: a broken file is broken on its own.
            let cpus = match &p.cpus {
                Some(text) => Some(CpuSet::parse(text).map_err(|source| ConfigError::Cpus {
                    file: file.to_owned(),
                    key: pool_key(&name, "cpus"),
                    source,
                })?),
                None => None,
            };
            let key = |field: &str| pool_key(&name, field);
            set.origins.set(pool_key(&name, ""), file);
            let sets_source = p.sets_source();
            let pool = self.pools.entry(name.clone()).or_default();
            if sets_source {
                for field in SOURCE_FIELDS {
                    set.origins.remove(&key(field));
                }
                pool.cpus = None;
                pool.count = None;
                pool.numa = None;
                pool.isolcpus = None;
                set.field(&mut pool.cpus, cpus, &key("cpus"));
                set.field(&mut pool.count, p.count, &key("count"));
                set.field(&mut pool.isolcpus, p.isolcpus, &key("isolcpus"));
            }
            set.field(&mut pool.numa, p.numa, &key("numa"));
            set.field(&mut pool.kind, p.kind, &key("kind"));
            set.field(&mut pool.smt, p.smt, &key("smt"));
            set.field(&mut pool.isolate, p.isolate, &key("isolate"));
            set.field(&mut pool.kubelet, p.kubelet, &key("kubelet"));
            set.field(&mut pool.enforce_quota, p.enforce_quota, &key("enforce_quota"));
            set.field(&mut pool.removed, p.removed, &key("removed"));
            set.field(&mut pool.irq, p.irq, &key("irq"));
            set.field(&mut pool.irq_claim, p.irq_claim, &key("irq_claim"));
            if let Some(cache) = p.cache {
                let merged = pool.cache.get_or_insert_with(Default::default);
                set.field(&mut merged.l3, cache.l3, &key("cache.l3"));
                set.field(&mut merged.mb, cache.mb, &key("cache.mb"));
            }
            if let Some(power) = p.power {
                set.power(&mut pool.power, power, &key("power"));
            }
        }
        Ok(())
    }
}

/// Overwrites a merged field with a fragment's value, if it has one, and records the file.
struct Setter<'a> {
    origins: &'a mut Origins,
    file: &'a Path,
}

impl Setter<'_> {
    fn field<T>(&mut self, slot: &mut Option<T>, value: Option<T>, key: &str) {
        if let Some(value) = value {
            *slot = Some(value);
            self.origins.set(key.to_owned(), self.file);
        }
    }

    /// A power table merges key by key, like the pool's own keys: a drop-in that sets only
    /// `governor` keeps the frequencies an earlier file set.
    fn power(&mut self, slot: &mut Option<PowerFragment>, value: PowerFragment, table: &str) {
        let to = slot.get_or_insert_with(PowerFragment::default);
        self.origins.set(table.to_owned(), self.file);
        let key = |k: &str| format!("{table}.{k}");
        self.field(&mut to.governor, value.governor, &key("governor"));
        self.field(&mut to.min_freq, value.min_freq, &key("min_freq"));
        self.field(&mut to.max_freq, value.max_freq, &key("max_freq"));
        self.field(&mut to.epp, value.epp, &key("epp"));
        self.field(&mut to.resume_latency_us, value.resume_latency_us, &key("resume_latency_us"));
        self.field(&mut to.uncore_min_freq, value.uncore_min_freq, &key("uncore_min_freq"));
        self.field(&mut to.uncore_max_freq, value.uncore_max_freq, &key("uncore_max_freq"));
    }
}
