//! `[kubelet]` and `[k8s]`: how the pools are offered to the kubelet, and the cluster
//! integration; their types, defaults and checks.

use std::path::PathBuf;

use super::fragments::{K8sFragment, KubeletFragment};
use super::{absolute, invalid, ConfigError, Origins};

/// `[kubelet]`: how the pools are offered to the kubelet (see `kubelet`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kubelet {
    /// `kubelet.enabled`: serve the device plugin (it waits for the kubelet if there is none).
    pub enabled: bool,
    /// `kubelet.resource_prefix`: resources are `<prefix>/<pool>`.
    pub resource_prefix: String,
    /// `kubelet.millicpus_per_device`: a shared pool's device is this many millicpus.
    pub millicpus_per_device: u64,
    /// `kubelet.release_grace_ms`: how long a kubelet assignment whose devices no container
    /// holds any more is kept before it is released.
    pub release_grace: std::time::Duration,
    /// `kubelet.reconcile_interval_ms`: how often the kubelet's PodResources are read.
    pub reconcile_interval: std::time::Duration,
    /// `kubelet.runtime_endpoint`: the container runtime's CRI socket.
    pub runtime_endpoint: PathBuf,
    /// `kubelet.confine_unpooled`: keep the kubelet's containers that use no pool off the
    /// exclusive pools' CPUs.
    pub confine_unpooled: bool,
    /// `kubelet.nri`: serve the runtime's NRI (containers get their CPUs when created) where
    /// its socket exists.
    pub nri: bool,
    /// `kubelet.nri_socket`: the runtime's NRI socket.
    pub nri_socket: PathBuf,
}

impl Default for Kubelet {
    fn default() -> Self {
        Kubelet {
            enabled: true,
            resource_prefix: DEFAULT_RESOURCE_PREFIX.to_owned(),
            millicpus_per_device: DEFAULT_MILLICPUS_PER_DEVICE,
            release_grace: std::time::Duration::from_millis(DEFAULT_RELEASE_GRACE_MS),
            reconcile_interval: std::time::Duration::from_millis(DEFAULT_RECONCILE_INTERVAL_MS),
            runtime_endpoint: DEFAULT_RUNTIME_ENDPOINT.into(),
            confine_unpooled: true,
            nri: true,
            nri_socket: DEFAULT_NRI_SOCKET.into(),
        }
    }
}

/// `[k8s]`: the cluster integration (see `k8s`, built with the `k8s` cargo feature).
///
/// The node name and namespace stay `None` when no file sets them: the daemon takes them from
/// its environment (`NODE_NAME`, the host name; `POD_NAMESPACE`, `cpupool-system`) when it starts
/// the integration, so that the settings themselves do not depend on the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct K8s {
    /// `k8s.enabled`: report to and take configuration from the API server.
    pub enabled: bool,
    /// `k8s.kubeconfig`: the kubeconfig file; `None` (unset or empty) tries the in-cluster
    /// service account first, then `$KUBECONFIG` and `~/.kube/config`.
    pub kubeconfig: Option<PathBuf>,
    /// `k8s.node_name`: this node's name (a DNS subdomain).
    pub node_name: Option<String>,
    /// `k8s.namespace`: where the `cpupoold-config.*` ConfigMaps live (a DNS label).
    pub namespace: Option<String>,
    /// `k8s.report_interval_ms`: the least time between two updates of the node report.
    pub report_interval: std::time::Duration,
}

impl Default for K8s {
    fn default() -> Self {
        K8s {
            enabled: false,
            kubeconfig: None,
            node_name: None,
            namespace: None,
            report_interval: std::time::Duration::from_millis(DEFAULT_REPORT_INTERVAL_MS),
        }
    }
}

/// `k8s.report_interval_ms` when no file sets it.
pub const DEFAULT_REPORT_INTERVAL_MS: u64 = 2_000;

/// `kubelet.resource_prefix` when no file sets it.
pub const DEFAULT_RESOURCE_PREFIX: &str = "cpupool.io";
/// `kubelet.millicpus_per_device` when no file sets it: a 512-CPU shared pool is 5120 devices,
/// a ListAndWatch message of at most 0.5 MiB (the kubelet's gRPC limit is 4 MiB).
pub const DEFAULT_MILLICPUS_PER_DEVICE: u64 = 100;
/// The most devices one shared pool may offer the kubelet: at about 100 bytes a device (a
/// 32-character pool name, `Unhealthy`, 8 NUMA nodes) its ListAndWatch message stays under
/// 2 MiB, half the kubelet's 4 MiB gRPC limit (a test encodes it).
pub const MAX_SHARED_DEVICES: u64 = 16_384;
/// `kubelet.release_grace_ms` when no file sets it.
pub const DEFAULT_RELEASE_GRACE_MS: u64 = 60_000;
/// `kubelet.reconcile_interval_ms` when no file sets it.
pub const DEFAULT_RECONCILE_INTERVAL_MS: u64 = 5_000;
/// `kubelet.nri_socket` when no file sets it: where containerd and CRI-O listen for plugins.
pub const DEFAULT_NRI_SOCKET: &str = "/var/run/nri/nri.sock";

/// `kubelet.runtime_endpoint` when no file sets it.
pub const DEFAULT_RUNTIME_ENDPOINT: &str = "/run/containerd/containerd.sock";

/// Checks `[kubelet]`.
pub(super) fn kubelet_settings(input: KubeletFragment, origins: &Origins) -> Result<Kubelet, ConfigError> {
    let defaults = Kubelet::default();
    let resource_prefix = input.resource_prefix.unwrap_or(defaults.resource_prefix);
    if let Err(reason) = check_resource_prefix(&resource_prefix) {
        return Err(invalid(origins, "kubelet.resource_prefix", reason));
    }
    let millicpus_per_device = input.millicpus_per_device.unwrap_or(defaults.millicpus_per_device);
    if !(10..=1000).contains(&millicpus_per_device) || 1000 % millicpus_per_device != 0 {
        return Err(invalid(origins,
            "kubelet.millicpus_per_device",
            format!(
                "{millicpus_per_device} must divide 1000 and be at least 10 (a device is a whole share of one CPU; \
                 smaller units make ListAndWatch messages too large)"
            ),
        ));
    }
    let interval = input.reconcile_interval_ms.unwrap_or(DEFAULT_RECONCILE_INTERVAL_MS);
    if !(10..=3_600_000).contains(&interval) {
        return Err(invalid(
            origins,
            "kubelet.reconcile_interval_ms",
            format!("{interval} must be between 10 and 3600000"),
        ));
    }
    let grace = input.release_grace_ms.unwrap_or(DEFAULT_RELEASE_GRACE_MS);
    if grace > 86_400_000 {
        return Err(invalid(
            origins,
            "kubelet.release_grace_ms",
            format!("{grace} must be at most 86400000 (a day)"),
        ));
    }
    let runtime_endpoint =
        absolute(origins, input.runtime_endpoint, defaults.runtime_endpoint, "kubelet.runtime_endpoint")?;
    Ok(Kubelet {
        enabled: input.enabled.unwrap_or(defaults.enabled),
        resource_prefix,
        millicpus_per_device,
        release_grace: std::time::Duration::from_millis(grace),
        reconcile_interval: std::time::Duration::from_millis(interval),
        runtime_endpoint,
        confine_unpooled: input.confine_unpooled.unwrap_or(defaults.confine_unpooled),
        nri: input.nri.unwrap_or(defaults.nri),
        nri_socket: absolute(origins, input.nri_socket, defaults.nri_socket, "kubelet.nri_socket")?,
    })
}

/// Checks `[k8s]`.
pub(super) fn k8s_settings(input: K8sFragment, origins: &Origins) -> Result<K8s, ConfigError> {
    let report_interval = input.report_interval_ms.unwrap_or(DEFAULT_REPORT_INTERVAL_MS);
    if !(10..=3_600_000).contains(&report_interval) {
        return Err(invalid(
            origins,
            "k8s.report_interval_ms",
            format!("{report_interval} must be between 10 and 3600000"),
        ));
    }
    let kubeconfig = match input.kubeconfig {
        Some(p) if p.as_os_str().is_empty() => None,
        Some(p) if p.is_absolute() => Some(p),
        Some(p) => {
            return Err(invalid(
                origins,
                "k8s.kubeconfig",
                format!("`{}` must be an absolute path (or empty for the in-cluster account)", p.display()),
            ))
        }
        None => None,
    };
    if let Some(name) = &input.node_name {
        if !is_dns_subdomain(name) {
            return Err(invalid(
                origins,
                "k8s.node_name",
                format!("`{}` is not a node name (a DNS subdomain: a-z, 0-9, - and .)", name.escape_debug()),
            ));
        }
    }
    if let Some(ns) = &input.namespace {
        if !is_dns_label(ns) {
            return Err(invalid(
                origins,
                "k8s.namespace",
                format!(
                    "`{}` is not a namespace name (a DNS label: a-z, 0-9 and -, at most 63)",
                    ns.escape_debug()
                ),
            ));
        }
    }
    Ok(K8s {
        enabled: input.enabled.unwrap_or(false),
        kubeconfig,
        node_name: input.node_name,
        namespace: input.namespace,
        report_interval: std::time::Duration::from_millis(report_interval),
    })
}

/// An RFC 1123 label: what Kubernetes accepts as a namespace name.
pub(crate) fn is_dns_label(l: &str) -> bool {
    !l.is_empty()
        && l.len() <= 63
        && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !l.starts_with('-')
        && !l.ends_with('-')
}

/// An RFC 1123 subdomain: what Kubernetes accepts as a node or object name.
pub(crate) fn is_dns_subdomain(p: &str) -> bool {
    !p.is_empty() && p.len() <= 253 && p.split('.').all(is_dns_label)
}

/// A resource prefix is a DNS subdomain (RFC 1123): the kubelet refuses anything else.
fn check_resource_prefix(p: &str) -> Result<(), String> {
    if !is_dns_subdomain(p) {
        return Err(format!(
            "`{}` is not a DNS subdomain such as cpupool.io (lower-case letters, digits, - and .)",
            p.escape_debug()
        ));
    }
    if p == "kubernetes.io" || p.ends_with(".kubernetes.io") || p == "k8s.io" || p.ends_with(".k8s.io") {
        return Err(format!("`{p}` is reserved by Kubernetes"));
    }
    Ok(())
}
