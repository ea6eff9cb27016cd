//! What a container gets when the runtime creates it (the NRI path): the CPUs and memory nodes
//! of the assignment its `Allocate` made, or the CPUs every container without one shares; and
//! where its cgroup will be, from the runtime's notation for it; and what identifies a
//! container to the PodResources path ([`ContainerRef`], [`ContainerSource`]).
//!
//! Pure: the NRI wing asks the kubelet which allocation the container holds, asks [`decide`],
//! and encodes the answer; the engine does the rest once the cgroup exists.

use super::cpuset::CpuSet;
use super::devices::Allocation;
use super::plan::LayoutOptions;
use super::state::{AssignSpec, AssignmentId, CgroupPath, State};
use super::topology::Topology;

/// The cgroup (relative to the cgroup root) of a container or pod sandbox, from the runtime's
/// `cgroups_path`: with the systemd driver `SLICE:PREFIX:NAME`, i.e. the scope
/// `PREFIX-NAME.scope` in `SLICE`, a slice whose parents its dashes name
/// (`kubepods-besteffort-pod1.slice` is in `kubepods-besteffort.slice`, in `kubepods.slice`);
/// with the cgroupfs driver a path from the root. `None` when it is neither.
pub fn cgroup_of(cgroups_path: &str) -> Option<CgroupPath> {
    let parts: Vec<&str> = cgroups_path.split(':').collect();
    let rel = match parts.as_slice() {
        [slice, prefix, name] => {
            let mut path = slice_path(slice)?;
            let unit =
                if name.ends_with(".slice") { (*name).to_owned() } else { format!("{prefix}-{name}.scope") };
            if unit.contains('/') {
                return None;
            }
            path.push(unit);
            path.join("/")
        }
        [path] => path.trim_start_matches('/').to_owned(),
        _ => return None,
    };
    CgroupPath::new(&rel).ok()
}

/// A slice's path in the cgroup tree: `a-b-c.slice` is `a.slice/a-b.slice/a-b-c.slice`; the
/// root slice `-.slice` (or an empty name) is the root.
fn slice_path(slice: &str) -> Option<Vec<String>> {
    if slice.is_empty() || slice == "-.slice" {
        return Some(Vec::new());
    }
    let stem = slice.strip_suffix(".slice")?;
    if stem.is_empty()
        || stem.starts_with('-')
        || stem.ends_with('-')
        || stem.contains("--")
        || stem.contains('/')
    {
        return None;
    }
    let mut out = Vec::new();
    let mut end = 0;
    for (i, c) in stem.char_indices() {
        if c == '-' {
            out.push(format!("{}.slice", &stem[..i]));
        }
        end = i + c.len_utf8();
    }
    out.push(format!("{}.slice", &stem[..end]));
    Some(out)
}

/// What the container is to get.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The CPUs and memory nodes of an existing assignment.
    Pooled {
        /// The assignment.
        id: AssignmentId,
        /// Its CPUs.
        cpus: CpuSet,
        /// Their NUMA nodes.
        mems: CpuSet,
    },
    /// The kubelet's allocation has no assignment (it was released when its previous
    /// container stopped, and the kubelet restarts the container with the same devices): held
    /// again as `Allocate` made it, then [`Decision::Pooled`].
    Rebook(AssignSpec),
    /// No pool: the CPUs no exclusive pool holds (those lent to the host too).
    Unpooled {
        /// The CPUs.
        cpus: CpuSet,
        /// Their NUMA nodes.
        mems: CpuSet,
    },
}

/// What a container gets in `state`, given the allocation the kubelet says it holds (from its
/// PodResources, never from the container's own environment: a pod's author could write any
/// `CPUPOOL_ASSIGNMENT` there).
pub fn decide(state: &State, topo: &Topology, opts: &LayoutOptions, held: Option<&Allocation>) -> Decision {
    let Some(alloc) = held else {
        let cpus = super::plan::unpooled_cpus(state, topo, opts);
        return Decision::Unpooled { mems: topo.nodes_of(&cpus), cpus };
    };
    match alloc.spec.id.as_ref().and_then(|id| state.assignments().get(id)) {
        Some(a) => Decision::Pooled { id: a.id.clone(), mems: topo.nodes_of(&a.cpus), cpus: a.cpus.clone() },
        None => Decision::Rebook(alloc.spec.clone()),
    }
}

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

/// Where the kubelet wing's reconciler can look a container up before asking the CRI: given
/// the (namespace, pod, container) the kubelet's PodResources names, the pod UID and container
/// id that find its cgroup. The cluster integration's pod watch is one (the daemon's
/// `kubernetes::cluster::pods::PodIndex`, with the `k8s` feature); without one, the CRI's
/// `ListContainers` alone answers.
pub trait ContainerSource: Send + Sync + std::fmt::Debug {
    /// `container` in pod `namespace/pod`, if the source knows it.
    fn container(&self, namespace: &str, pod: &str, container: &str) -> Option<ContainerRef>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(s: &str) -> Option<String> {
        cgroup_of(s).map(|p| p.as_str().to_owned())
    }

    /// containerd and CRI-O with the systemd driver: the slice's parents come from its dashes,
    /// the scope is PREFIX-NAME.scope.
    #[test]
    fn systemd_notation_names_the_scope_in_its_slices() {
        assert_eq!(
            path("kubepods-besteffort-pod1_2.slice:cri-containerd:abc").as_deref(),
            Some("kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1_2.slice/cri-containerd-abc.scope")
        );
        assert_eq!(
            path("kubepods-pod9.slice:crio:x").as_deref(),
            Some("kubepods.slice/kubepods-pod9.slice/crio-x.scope")
        );
        assert_eq!(path("system.slice:docker:y").as_deref(), Some("system.slice/docker-y.scope"));
        assert_eq!(path("-.slice:p:z").as_deref(), Some("p-z.scope"));
    }

    #[test]
    fn cgroupfs_notation_is_a_path_from_the_root() {
        assert_eq!(path("/kubepods/besteffort/pod1/abc").as_deref(), Some("kubepods/besteffort/pod1/abc"));
        assert_eq!(path("kubepods/pod1/abc").as_deref(), Some("kubepods/pod1/abc"));
    }

    /// No allocation: the CPUs no exclusive pool has; an allocation with its assignment: that
    /// assignment's CPUs and nodes; one whose assignment is gone: held again as Allocate made it.
    #[test]
    fn a_container_gets_its_allocation_or_the_cpus_of_no_exclusive_pool() {
        use crate::pool::{Pool, PoolKind, PoolName, Smt};
        let t = Topology::synthetic(1, 4, 2, 1);
        let pool = |name: &str, kind, cpus: &str| Pool {
            name: PoolName::new(name).unwrap_or_else(|e| panic!("{e}")),
            kind,
            cpus: CpuSet::parse(cpus).unwrap_or_else(|e| panic!("{e}")),
            smt: Smt::FullCores,
            isolate: false,
            kubelet: true,
            enforce_quota: false,
            dra: false,
        };
        let dp = pool("dp", PoolKind::Exclusive, "1-2,5-6");
        let mut s = State::with_pools(vec![
            pool("sys", PoolKind::Reserved, "0,4"),
            dp.clone(),
            pool("web", PoolKind::Shared, "3,7"),
        ]);
        let opts = LayoutOptions::default();
        let none = decide(&s, &t, &opts, None);
        assert_eq!(
            none,
            Decision::Unpooled {
                cpus: CpuSet::parse("0,3-4,7").unwrap_or_default(),
                mems: CpuSet::parse("0").unwrap_or_default()
            }
        );
        let alloc = crate::devices::allocation(&dp, &t, 100, &["core-2".to_owned()])
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(decide(&s, &t, &opts, Some(&alloc)), Decision::Rebook(alloc.spec.clone()));
        s.assign(&t, &alloc.spec).unwrap_or_else(|e| panic!("{e}"));
        let Decision::Pooled { id, cpus, mems } = decide(&s, &t, &opts, Some(&alloc)) else {
            panic!("pooled")
        };
        assert_eq!(
            (id.as_str(), cpus.to_string(), mems.to_string()),
            ("kubelet-core-2", "2,6".to_owned(), "0".to_owned())
        );
    }

    #[test]
    fn malformed_notation_is_none() {
        for bad in [
            "",
            "/",
            "a:b",
            "a:b:c:d",
            "kubepods--x.slice:p:n",
            "-x.slice:p:n",
            "x-.slice:p:n",
            "notaslice:p:n",
            "/a/../b",
            "k.slice:p:a/b",
        ] {
            assert_eq!(cgroup_of(bad), None, "{bad}");
        }
    }
}
