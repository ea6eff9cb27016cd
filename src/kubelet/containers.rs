//! An extra source of container identity, consulted before the CRI: given the (namespace, pod,
//! container) the kubelet's PodResources names, the pod UID and container id that find the
//! container's cgroup. The cluster integration's pod watch is one (`k8s::pods::PodIndex`, with
//! the `k8s` feature); without one, the CRI's `ListContainers` alone answers.

/// What finds a container's cgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerRef {
    /// The pod's UID.
    pub pod_uid: String,
    /// The container id, without the runtime's `containerd://` prefix.
    pub container_id: String,
    /// The pod's QoS class (`Guaranteed`, `Burstable`, `BestEffort`), when known: it names the
    /// pod's cgroup outright.
    pub qos_class: Option<String>,
}

/// Where the reconciler can look a container up before asking the CRI.
pub trait ContainerSource: Send + Sync + std::fmt::Debug {
    /// `container` in pod `namespace/pod`, if the source knows it.
    fn container(&self, namespace: &str, pod: &str, container: &str) -> Option<ContainerRef>;
}
