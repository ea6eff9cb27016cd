//! The `CpuPoolNode` custom resource (`cpupool.io/v1alpha1`): one cluster-scoped object per
//! node, named after the node, whose status the daemon keeps current (see [`super::report`]).
//!
//! The CRD shipped as `deploy/crd.yaml` is generated from these types ([`crd_yaml`],
//! `cpupoold --print-crd`); a test fails when the two differ.

use kube::CustomResource;
use kube::CustomResourceExt;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What the object is about: the node it reports on.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "cpupool.io",
    version = "v1alpha1",
    kind = "CpuPoolNode",
    plural = "cpupoolnodes",
    singular = "cpupoolnode",
    shortname = "cpn",
    status = "CpuPoolNodeStatus",
    printcolumn = r#"{"name":"Generation","type":"string","jsonPath":".status.configGeneration"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct CpuPoolNodeSpec {
    /// The node's name (the same as the object's).
    pub node_name: String,
}

/// What the daemon reports.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CpuPoolNodeStatus {
    /// The host's CPUs.
    pub topology: TopologySummary,
    /// Every pool, in name order.
    pub pools: Vec<PoolStatus>,
    /// Every assignment, in id order.
    pub assignments: Vec<AssignmentStatus>,
    /// The cluster configuration last applied: `<ConfigMap name>@<resourceVersion>`; absent
    /// when the local files alone apply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_generation: Option<String>,
    /// `Ready` and `ConfigInvalid`.
    pub conditions: Vec<NodeCondition>,
}

/// The host's CPUs in brief.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TopologySummary {
    /// Online CPUs (a CPU list such as `0-15`).
    pub online: String,
    /// How many CPUs are online.
    pub cpu_count: u32,
    /// Physical cores.
    pub cores: u32,
    /// NUMA nodes.
    pub numa_nodes: u32,
    /// CPUs the kernel isolated (`isolcpus=`), a CPU list; empty when none.
    pub isolated: String,
}

/// One pool.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolStatus {
    /// The pool's name.
    pub name: String,
    /// `reserved`, `exclusive` or `shared`.
    pub kind: String,
    /// The pool's CPUs.
    pub cpus: String,
    /// Exclusive and reserved pools: CPUs no assignment holds; shared pools: the pool's CPUs.
    pub free: String,
    /// Shared pools: millicpus not yet assigned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub free_millicpus: Option<u64>,
    /// The kernel's word on the pool's cpuset partition (`member`, `isolated`, `isolated
    /// invalid (...)`), when the pool has a slice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    /// How the kubelet is offered the pool: `devicePlugin`, or `dra` (this node's
    /// ResourceSlices); absent when it is not (`kubelet = false`, the reserved pool).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served_by: Option<String>,
}

/// One assignment.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AssignmentStatus {
    /// The assignment's id.
    pub id: String,
    /// Its pool.
    pub pool: String,
    /// The CPUs it runs on.
    pub cpus: String,
    /// Shared pools: its millicpus.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub millicpus: Option<u64>,
    /// Who holds it.
    pub owner: Owner,
}

/// Who holds an assignment: the target, and the pod and container when the target is a
/// container the pod watch knows.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Owner {
    /// The target as the APIs spell it: `unit:NAME`, `pid:N`, `cgroup:PATH`, `kubelet:DEVICE`.
    pub target: String,
    /// The pod's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The pod's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// The pod's UID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    /// The container's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
}

/// A condition, as Kubernetes objects carry them.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeCondition {
    /// `Ready` or `ConfigInvalid`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True` or `False`.
    pub status: String,
    /// A CamelCase word.
    pub reason: String,
    /// The details (for `ConfigInvalid`, the error naming the ConfigMap key at fault).
    pub message: String,
    /// When `status` last changed (RFC 3339).
    pub last_transition_time: String,
}

/// The CRD as YAML, as shipped in `deploy/crd.yaml`.
pub fn crd_yaml() -> Result<String, serde_yaml::Error> {
    let body = serde_yaml::to_string(&CpuPoolNode::crd())?;
    Ok(format!("# Generated by `cpupoold --print-crd` (src/kubernetes/cluster/crd.rs); do not edit.\n{body}"))
}
