//! What a container gets when the runtime creates it (the NRI path): the CPUs and memory nodes
//! of the assignment its `Allocate` made, or the CPUs every container without one shares; and
//! where its cgroup will be, from the runtime's notation for it.
//!
//! Pure: the NRI wing decodes the runtime's request into a [`Created`], asks [`decide`], and
//! encodes the answer; the engine does the rest once the cgroup exists.

use std::collections::BTreeMap;

use super::cpuset::CpuSet;
use super::plan::LayoutOptions;
use super::pool::PoolKind;
use super::state::{AssignmentId, CgroupPath, State};
use super::topology::Topology;

pub use cpupool_wire::names::{
    ENV_ASSIGNMENT as ASSIGNMENT_ENV, ENV_CPUS as CPUS_ENV, ENV_MILLICPUS as MILLICPUS_ENV,
    ENV_POOL as POOL_ENV,
};

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

/// A container as the runtime describes it at creation (or at a resync).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Created {
    /// Its environment, `KEY=VALUE` split.
    pub env: BTreeMap<String, String>,
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
    /// An assignment `Allocate` made that is gone (released when its last container stopped):
    /// booked again from what the environment says, then [`Decision::Pooled`].
    Rebook {
        /// The assignment's id.
        id: AssignmentId,
        /// The pool.
        pool: String,
        /// The CPUs the environment names.
        cpus: CpuSet,
        /// For a shared pool, the millicpus.
        millicpus: Option<u64>,
    },
    /// No pool: the CPUs no exclusive pool holds (those lent to the host too).
    Unpooled {
        /// The CPUs.
        cpus: CpuSet,
        /// Their NUMA nodes.
        mems: CpuSet,
    },
}

/// Why a container's environment cannot be honoured: named by the variable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{var}: {reason}")]
pub struct Refused {
    /// The variable at fault.
    pub var: &'static str,
    /// Why.
    pub reason: String,
}

fn refused(var: &'static str, reason: impl Into<String>) -> Refused {
    Refused { var, reason: reason.into() }
}

/// What `c` gets in `state`.
pub fn decide(
    state: &State,
    topo: &Topology,
    opts: &LayoutOptions,
    c: &Created,
) -> Result<Decision, Refused> {
    let Some(id) = c.env.get(ASSIGNMENT_ENV) else {
        let cpus = super::plan::unpooled_cpus(state, topo, opts);
        return Ok(Decision::Unpooled { mems: topo.nodes_of(&cpus), cpus });
    };
    let id = AssignmentId::new(id).map_err(|e| refused(ASSIGNMENT_ENV, e.to_string()))?;
    if let Some(a) = state.assignments().get(&id) {
        return Ok(Decision::Pooled { id, mems: topo.nodes_of(&a.cpus), cpus: a.cpus.clone() });
    }
    let pool = c.env.get(POOL_ENV).ok_or_else(|| refused(POOL_ENV, "is not set"))?;
    let p = state.pools().iter().find(|(n, _)| n.as_str() == pool).map(|(_, p)| p);
    let Some(p) = p else { return Err(refused(POOL_ENV, format!("no pool `{pool}`"))) };
    let cpus = c.env.get(CPUS_ENV).ok_or_else(|| refused(CPUS_ENV, "is not set"))?;
    let cpus = CpuSet::parse(cpus).map_err(|e| refused(CPUS_ENV, e.to_string()))?;
    let millicpus = match p.kind {
        PoolKind::Shared => {
            let m = c.env.get(MILLICPUS_ENV).ok_or_else(|| refused(MILLICPUS_ENV, "is not set"))?;
            Some(m.parse().map_err(|e| refused(MILLICPUS_ENV, format!("`{m}`: {e}")))?)
        }
        _ => None,
    };
    Ok(Decision::Rebook { id, pool: pool.clone(), cpus, millicpus })
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
