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
        set.metrics(&mut self.metrics, metrics);
        set.k8s(&mut self.k8s, k8s);
        set.kubelet(&mut self.kubelet, kubelet);
        set.paths(&mut self.paths, paths);
        set.daemon(&mut self.daemon, daemon);
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
            set.pool(self.pools.entry(name.clone()).or_default(), &name, p, cpus);
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
    fn field<T: std::fmt::Debug>(&mut self, slot: &mut Option<T>, value: Option<T>, key: &str) {
        if let Some(value) = value {
            self.origins.set_value(key, self.file, format!("{value:?}"));
            *slot = Some(value);
        }
    }

    /// The `[metrics]` keys.
    fn metrics(&mut self, to: &mut MetricsFragment, from: MetricsFragment) {
        self.field(&mut to.enabled, from.enabled, "metrics.enabled");
        self.field(&mut to.listen, from.listen, "metrics.listen");
    }

    /// The `[k8s]` keys.
    fn k8s(&mut self, to: &mut K8sFragment, from: K8sFragment) {
        self.field(&mut to.enabled, from.enabled, "k8s.enabled");
        self.field(&mut to.kubeconfig, from.kubeconfig, "k8s.kubeconfig");
        self.field(&mut to.node_name, from.node_name, "k8s.node_name");
        self.field(&mut to.namespace, from.namespace, "k8s.namespace");
        self.field(&mut to.report_interval_ms, from.report_interval_ms, "k8s.report_interval_ms");
    }

    /// The `[kubelet]` keys.
    fn kubelet(&mut self, to: &mut KubeletFragment, from: KubeletFragment) {
        self.field(&mut to.enabled, from.enabled, "kubelet.enabled");
        self.field(&mut to.resource_prefix, from.resource_prefix, "kubelet.resource_prefix");
        self.field(&mut to.millicpus_per_device, from.millicpus_per_device, "kubelet.millicpus_per_device");
        self.field(&mut to.release_grace_ms, from.release_grace_ms, "kubelet.release_grace_ms");
        self.field(
            &mut to.reconcile_interval_ms,
            from.reconcile_interval_ms,
            "kubelet.reconcile_interval_ms",
        );
        self.field(&mut to.runtime_endpoint, from.runtime_endpoint, "kubelet.runtime_endpoint");
        self.field(&mut to.confine_unpooled, from.confine_unpooled, "kubelet.confine_unpooled");
        self.field(&mut to.nri, from.nri, "kubelet.nri");
        self.field(&mut to.nri_socket, from.nri_socket, "kubelet.nri_socket");
    }

    /// The `[paths]` keys.
    fn paths(&mut self, to: &mut PathsFragment, from: PathsFragment) {
        self.field(&mut to.sysfs_root, from.sysfs_root, "paths.sysfs_root");
        self.field(&mut to.cgroup_root, from.cgroup_root, "paths.cgroup_root");
        self.field(&mut to.state_dir, from.state_dir, "paths.state_dir");
        self.field(&mut to.runtime_dir, from.runtime_dir, "paths.runtime_dir");
        self.field(&mut to.kubelet_dir, from.kubelet_dir, "paths.kubelet_dir");
        self.field(&mut to.cdi_dir, from.cdi_dir, "paths.cdi_dir");
        self.field(&mut to.procfs_root, from.procfs_root, "paths.procfs_root");
        self.field(&mut to.irqbalance_dir, from.irqbalance_dir, "paths.irqbalance_dir");
        self.field(&mut to.resctrl_root, from.resctrl_root, "paths.resctrl_root");
    }

    /// The `[daemon]` keys.
    fn daemon(&mut self, to: &mut DaemonFragment, from: DaemonFragment) {
        self.field(&mut to.host_cgroups, from.host_cgroups, "daemon.host_cgroups");
        self.field(&mut to.admin_group, from.admin_group, "daemon.admin_group");
        self.field(&mut to.log_level, from.log_level, "daemon.log_level");
        self.field(&mut to.lend_idle, from.lend_idle, "daemon.lend_idle");
        self.field(&mut to.backend, from.backend, "daemon.backend");
        self.field(&mut to.irq_cpus, from.irq_cpus, "daemon.irq_cpus");
        self.field(&mut to.irq_restore_on_stop, from.irq_restore_on_stop, "daemon.irq_restore_on_stop");
        self.field(&mut to.irqbalance, from.irqbalance, "daemon.irqbalance");
        self.field(&mut to.power_restore_on_stop, from.power_restore_on_stop, "daemon.power_restore_on_stop");
        self.field(&mut to.cache_restore_on_stop, from.cache_restore_on_stop, "daemon.cache_restore_on_stop");
    }

    /// One pool's keys; `cpus` parsed already. The CPU source (`cpus`, `count`, `isolcpus`)
    /// replaces the earlier one whole.
    fn pool(&mut self, pool: &mut PoolInput, name: &str, p: PoolFragment, cpus: Option<CpuSet>) {
        let key = |field: &str| pool_key(name, field);
        self.origins.set(pool_key(name, ""), self.file);
        let sets_source = p.sets_source();
        if sets_source {
            for field in SOURCE_FIELDS {
                self.origins.replace(&key(field), self.file);
            }
            pool.cpus = None;
            pool.count = None;
            pool.numa = None;
            pool.isolcpus = None;
            self.field(&mut pool.cpus, cpus, &key("cpus"));
            self.field(&mut pool.count, p.count, &key("count"));
            self.field(&mut pool.isolcpus, p.isolcpus, &key("isolcpus"));
        }
        self.field(&mut pool.numa, p.numa, &key("numa"));
        self.field(&mut pool.kind, p.kind, &key("kind"));
        self.field(&mut pool.smt, p.smt, &key("smt"));
        self.field(&mut pool.isolate, p.isolate, &key("isolate"));
        self.field(&mut pool.kubelet, p.kubelet, &key("kubelet"));
        self.field(&mut pool.enforce_quota, p.enforce_quota, &key("enforce_quota"));
        self.field(&mut pool.dra, p.dra, &key("dra"));
        self.field(&mut pool.removed, p.removed, &key("removed"));
        self.field(&mut pool.irq, p.irq, &key("irq"));
        self.field(&mut pool.irq_claim, p.irq_claim, &key("irq_claim"));
        if let Some(cache) = p.cache {
            let merged = pool.cache.get_or_insert_with(Default::default);
            self.field(&mut merged.l3, cache.l3, &key("cache.l3"));
            self.field(&mut merged.mb, cache.mb, &key("cache.mb"));
        }
        if let Some(power) = p.power {
            self.power(&mut pool.power, power, &key("power"));
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
