//! The snapshot's read model: the questions adapters ask a committed state (a container's CPUs
//! for the devices it holds, a claim's assignments, the unpooled CPUs, the pools a kubelet
//! server offers), answered here by the pure core. Adapters translate their protocol to a
//! question and the answer back; they do no CPU arithmetic and call no allocator, planner or
//! device model of their own.

use std::collections::BTreeSet;
use std::path::Path;

use super::Snapshot;
use crate::core::container::{self, Decision};
use crate::core::cpuset::CpuSet;
use crate::core::devices::{self, Allocation, Device, Refused};
use crate::core::dra::{self, names::claim_of, DraDevice, Millis, Unresolved};
use crate::core::plan;
use crate::core::pool::{Pool, PoolKind, PoolName};
use crate::core::state::{self, Assignment, AssignmentId, CgroupPath, PreparedClaim, Size, Target};

/// Which of the kubelet's servers offers a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    /// The device plugin (`kubelet = true`).
    DevicePlugin,
    /// The DRA driver (`dra = true`).
    Dra,
}

impl Server {
    /// Whether this server offers `pool`.
    pub fn offers(self, pool: &Pool) -> bool {
        match self {
            Server::DevicePlugin => pool.served_by_device_plugin(),
            Server::Dra => pool.served_by_dra(),
        }
    }
}

/// Why the devices a container holds give it no CPUs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeldError {
    /// The devices name a pool there is not.
    #[error("it holds devices of `{0}`, which is no pool")]
    NoPool(String),
    /// The devices do not decode in their pool.
    #[error("{0}")]
    Refused(Refused),
}

/// Offered pools' CPUs among some CPUs, and the pools they are of.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overlap {
    /// The CPUs.
    pub cpus: CpuSet,
    /// The pools with a CPU among them, in name order.
    pub pools: Vec<PoolName>,
}

impl Overlap {
    /// The pools' names, for a log line: `a, b`.
    pub fn names(&self) -> String {
        self.pools.iter().map(PoolName::as_str).collect::<Vec<_>>().join(", ")
    }
}

/// What one device of a DRA claim books: the pool, how much, and (exclusive pools) the CPUs
/// it must come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraWanted {
    /// The device, as the claim's result names it.
    pub device: String,
    /// The pool.
    pub pool: PoolName,
    /// An exclusive pool's device: the CPUs the assignment must come from (its NUMA node).
    pub within: Option<CpuSet>,
    /// Whole CPUs for an exclusive pool, millicpus for a shared one.
    pub size: Size,
}

/// Lookups.
impl Snapshot {
    /// Assignment `id`, if it is held.
    pub fn assignment(&self, id: &AssignmentId) -> Option<&Assignment> {
        self.state.assignments().get(id)
    }

    /// Whether an assignment named `id` is held.
    pub fn holds(&self, id: &str) -> bool {
        self.state.assignments().keys().any(|k| k.as_str() == id)
    }

    /// The NUMA nodes of `cpus`: a container's `cpuset.mems` beside them.
    pub fn mems_of(&self, cpus: &CpuSet) -> CpuSet {
        self.topology.nodes_of(cpus)
    }

    /// The CPUs online now, as the kubelet wing last read them (the topology's until then).
    pub fn online(&self) -> CpuSet {
        self.kubelet.online(&self.topology)
    }

    /// The CPUs of the exclusive pools.
    pub fn exclusive_cpus(&self) -> CpuSet {
        plan::exclusive_cpus(&self.state)
    }

    /// The CPUs a container of no pool runs on: those no exclusive pool holds, and those lent
    /// to the host.
    pub fn unpooled_cpus(&self) -> CpuSet {
        plan::unpooled_cpus(&self.state, &self.topology, &self.layout)
    }

    /// Whether cpupoold may write CPUs into `cgroup`: the rules a `cgroup:` assignment target
    /// passes, the target of `except` aside; `Err` says why not.
    pub fn may_confine(&self, cgroup: &CgroupPath, except: &AssignmentId) -> Result<(), String> {
        let target = Target::Cgroup(cgroup.clone());
        match self.state.check_target(&target, &self.layout.host_cgroups, except) {
            Ok(()) => Ok(()),
            Err(state::Error::TargetNotAllowed { reason, .. }) => Err(reason),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// Kubelet containers (device plugin allocations, seen by NRI and the reconciler).
impl Snapshot {
    /// What a kubelet container gets, given the devices the kubelet says it holds (`pool`,
    /// device ids; never the container's own environment: a pod's author writes that):
    /// its assignment's CPUs, its allocation held again, or the unpooled CPUs.
    pub fn container_decision(
        &self,
        held: Option<(&str, &[String])>,
        millis_per_device: u64,
    ) -> Result<Decision, HeldError> {
        let alloc = match held {
            Some((pool, ids)) => {
                let Some(p) = self.state.pools().values().find(|p| p.name.as_str() == pool) else {
                    return Err(HeldError::NoPool(pool.to_owned()));
                };
                Some(
                    devices::allocation(p, &self.topology, millis_per_device, ids)
                        .map_err(HeldError::Refused)?,
                )
            }
            None => None,
        };
        Ok(container::decide(&self.state, &self.topology, &self.layout, alloc.as_ref()))
    }

    /// The assignments the kubelet's devices hold, in id order.
    pub fn kubelet_assignments(&self) -> impl Iterator<Item = &Assignment> {
        self.state.assignments().values().filter(|a| devices::is_kubelet(a))
    }

    /// The kubelet assignment bound to container cgroup `cgroup`, if one is.
    pub fn kubelet_bound_to(&self, cgroup: &CgroupPath) -> Option<AssignmentId> {
        self.kubelet_assignments()
            .find(|a| matches!(&a.target, Target::Cgroup(t) if t == cgroup))
            .map(|a| a.id.clone())
    }

    /// The kubelet assignments bound to a container cgroup that `alive` says no container has.
    pub fn kubelet_orphans(&self, alive: impl Fn(&CgroupPath) -> bool) -> Vec<AssignmentId> {
        self.kubelet_assignments()
            .filter(|a| matches!(&a.target, Target::Cgroup(p) if !alive(p)))
            .map(|a| a.id.clone())
            .collect()
    }

    /// Whether the engine must be told that the kubelet holds `a` with `devices`: a shared
    /// pool's units held are Unhealthy, so a change matters; an exclusive pool's never does.
    pub fn held_changed(&self, a: &Assignment, devices: &BTreeSet<String>) -> bool {
        a.kind == PoolKind::Shared && self.kubelet.held.get(&a.id) != Some(devices)
    }
}

/// Pools the kubelet is offered (device plugin, DRA).
impl Snapshot {
    /// The pools `server` offers, in name order.
    pub fn offered(&self, server: Server) -> impl Iterator<Item = &Pool> {
        self.state.pools().values().filter(move |p| server.offers(p))
    }

    /// The CPUs among `cpus` of the pools `server` offers, and those pools.
    pub fn offered_in(&self, server: Server, cpus: &CpuSet) -> Overlap {
        let pools: Vec<&Pool> = self.offered(server).filter(|p| !p.cpus.is_disjoint(cpus)).collect();
        Overlap {
            cpus: pools.iter().fold(CpuSet::new(), |acc, p| acc.union(&p.cpus.intersection(cpus))),
            pools: pools.iter().map(|p| p.name.clone()).collect(),
        }
    }

    /// The CPUs of the pools `server` offers that no kubelet container can be given
    /// ([`Snapshot::container_cpus`]: offline, or outside the kubelet's pod cgroup), and
    /// those pools.
    pub fn offered_unusable(&self, server: Server) -> Overlap {
        let all = self.offered(server).fold(CpuSet::new(), |acc, p| acc.union(&p.cpus));
        self.offered_in(server, &all.difference(&self.container_cpus()))
    }

    /// Whether the kubelet's static CPU manager (its `cpu_manager_state` under `kubelet_dir`)
    /// has given CPUs of the pools `server` offers to containers.
    pub fn static_policy(
        &self,
        kubelet_dir: &Path,
        server: Server,
    ) -> Result<(), crate::host::kubelet::StaticConflict> {
        let served = match server {
            Server::DevicePlugin => Pool::served_by_device_plugin,
            Server::Dra => Pool::served_by_dra,
        };
        crate::host::kubelet::check_static_policy(&self.state, kubelet_dir, served)
    }
}

/// The device plugin's questions, for pool `name`.
impl Snapshot {
    /// Pool `name`, if the device plugin offers it.
    pub fn device_pool(&self, name: &PoolName) -> Option<&Pool> {
        self.state.pools().get(name).filter(|p| p.served_by_device_plugin())
    }

    /// The ListAndWatch devices of pool `name` (none when it is not offered): each unit's
    /// health from the CPUs containers can be given and the units the kubelet holds.
    pub fn device_list(&self, name: &PoolName, millis_per_device: u64) -> Vec<Device> {
        let Some(p) = self.device_pool(name) else { return Vec::new() };
        let held = self.kubelet.held_devices(&self.state);
        devices::list(&self.state, &self.topology, p, millis_per_device, &held, &self.container_cpus())
    }

    /// An Allocate request's containers (their device ids) decoded in `pool`: all of them, or
    /// the first refusal.
    pub fn device_allocations<'a>(
        &self,
        pool: &Pool,
        millis_per_device: u64,
        requests: impl ExactSizeIterator<Item = &'a [String]>,
    ) -> Result<Vec<Allocation>, Refused> {
        devices::allocations(pool, &self.topology, millis_per_device, requests)
    }

    /// The assignment that answers `alloc` as it is (the kubelet repeats Allocate for the same
    /// devices when a container restarts), wherever it has been retargeted since.
    pub fn answering(&self, alloc: &Allocation) -> Option<&Assignment> {
        let a = alloc.spec.id.as_ref().and_then(|id| self.assignment(id))?;
        devices::same(a, alloc).then_some(a)
    }

    /// GetPreferredAllocation for each container request of pool `pool`: (available,
    /// must include, size) to the device ids preferred; all of them, or the first refusal.
    pub fn preferred_devices<'a>(
        &self,
        pool: &Pool,
        millis_per_device: u64,
        requests: impl ExactSizeIterator<Item = (&'a [String], &'a [String], i32)>,
    ) -> Result<Vec<Vec<String>>, Refused> {
        devices::check_container_count(requests.len())?;
        requests
            .map(|(available, must, size)| {
                devices::preferred(pool, &self.topology, millis_per_device, available, must, size)
            })
            .collect()
    }

    /// The kubelet assignments of `pool` that stand in the way of `allocs` although no
    /// container holds them (`held` says which ids one does), `keep` aside. Exclusive pools:
    /// those whose CPUs overlap, or with the same id; shared pools: every one (units are
    /// interchangeable).
    pub fn freed_in_the_way(
        &self,
        pool: &Pool,
        allocs: &[&Allocation],
        keep: &[&AssignmentId],
        held: impl Fn(&str) -> bool,
    ) -> Vec<AssignmentId> {
        let in_the_way = |a: &Assignment, alloc: &Allocation| {
            Some(&a.id) == alloc.spec.id.as_ref()
                || match &alloc.spec.size {
                    Size::Cpuset(c) => !a.cpus.is_disjoint(c),
                    _ => pool.kind == PoolKind::Shared,
                }
        };
        self.kubelet_assignments()
            .filter(|a| a.pool == pool.name)
            .filter(|a| !keep.contains(&&a.id) && !held(a.id.as_str()))
            .filter(|a| allocs.iter().any(|alloc| in_the_way(a, alloc)))
            .map(|a| a.id.clone())
            .collect()
    }
}

/// DRA claims (assignments `dra-<uid>-<n>`).
impl Snapshot {
    /// The devices DRA serves on this node now: each one's capacity cut to the CPUs a
    /// container can be given (online, in the kubelet's pod cgroup); a device whose capacity
    /// falls below one step is left out until its CPUs come back.
    pub fn dra_devices(&self, millis_per_device: u64) -> Vec<DraDevice> {
        let usable = self.container_cpus();
        dra::devices(&self.state, &self.topology, millis_per_device)
            .into_iter()
            .filter_map(|mut d| {
                d.capacity = Millis::cpus(d.cpus.intersection(&usable).len() as u64);
                (d.capacity >= d.step).then_some(d)
            })
            .collect()
    }

    /// What a claim's results (`(device, consumed)`) book, one entry per device; a device not
    /// served or an amount it cannot give is refused, naming it.
    pub fn dra_wanted(
        &self,
        results: &[(String, Option<Millis>)],
        millis_per_device: u64,
    ) -> Result<Vec<DraWanted>, Unresolved> {
        let wanted = dra::resolve(&self.state, &self.topology, millis_per_device, results)?;
        Ok(wanted
            .into_iter()
            .map(|w| {
                let exclusive =
                    self.state.pools().get(&w.pool).is_some_and(|p| p.kind == PoolKind::Exclusive);
                DraWanted {
                    device: w.device,
                    within: exclusive.then_some(w.within),
                    pool: w.pool,
                    size: w.size,
                }
            })
            .collect())
    }

    /// The assignments `ids` of a claim, all held, or the first that is not.
    pub fn claim_assignments<'a>(
        &self,
        ids: &'a [AssignmentId],
    ) -> Result<Vec<&Assignment>, &'a AssignmentId> {
        ids.iter().map(|id| self.assignment(id).ok_or(id)).collect()
    }

    /// Whether one of `ids` is of an isolated pool (its CPUs go to one container at a time).
    pub fn any_isolated(&self, ids: &[AssignmentId]) -> bool {
        ids.iter()
            .filter_map(|id| self.assignment(id))
            .any(|a| self.state.pools().get(&a.pool).is_some_and(|p| p.isolate))
    }

    /// The assignments booked for claim `uid`, found by their names.
    pub fn claim_assignment_ids(&self, uid: &str) -> Vec<AssignmentId> {
        self.state.assignments().keys().filter(|id| claim_of(id.as_str()) == Some(uid)).cloned().collect()
    }

    /// The claims with assignments booked, by uid.
    pub fn booked_claims(&self) -> BTreeSet<String> {
        self.state.assignments().keys().filter_map(|id| claim_of(id.as_str())).map(str::to_owned).collect()
    }

    /// Prepared claim `uid`, as the engine recorded it.
    pub fn claim(&self, uid: &str) -> Option<&PreparedClaim> {
        self.state.claim(uid)
    }

    /// The prepared claims whose assignments are not all held (released by hand), each with
    /// the first that is not, by uid.
    pub fn claims_not_held(&self) -> Vec<(String, AssignmentId)> {
        self.state
            .claims()
            .iter()
            .filter_map(|(uid, c)| {
                self.claim_assignments(&c.assignments).err().map(|id| (uid.clone(), id.clone()))
            })
            .collect()
    }

    /// What a container of pod `pod_uid` whose environment names claim `uid` gets: the
    /// claim's CPUs when the claim is prepared here and reserved for the pod.
    pub fn claim_for(&self, uid: &str, pod_uid: &str) -> ClaimFor {
        decide(self.claim(uid), uid, pod_uid, |id| self.assignment(id).map(|a| a.cpus.clone()))
    }

    /// What the start of a container of claim `held` in `cgroup` does, given where each of the
    /// claim's assignments points now.
    pub fn claim_start(&self, held: &ClaimHeld, cgroup: &CgroupPath) -> AtStart {
        at_start(held, cgroup, |id| self.assignment(id).map(|a| a.target.clone()))
    }

    /// The claims' assignments bound to container cgroups that `gone` says are gone.
    pub fn claims_bound_to_gone(&self, gone: impl Fn(&CgroupPath) -> bool) -> Vec<AssignmentId> {
        self.state.assignments().values().filter(|a| bound_to_gone(a, &gone)).map(|a| a.id.clone()).collect()
    }
}

/// The CPUs of a DRA claim a container runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimHeld {
    /// The claim, as `namespace/name`.
    pub name: String,
    /// Its assignments.
    pub ids: Vec<AssignmentId>,
    /// Their CPUs.
    pub cpus: CpuSet,
}

/// What a container naming a claim gets ([`Snapshot::claim_for`]).
#[derive(Debug, PartialEq, Eq)]
pub enum ClaimFor {
    /// The claim's CPUs.
    Held(ClaimHeld),
    /// Nothing of the claim's (said why): it is not prepared here, or not the pod's.
    Refused(String),
    /// The claim is the pod's, but its CPUs are not all held: the container is not created.
    Lost(String),
}

/// What the container of pod `pod_uid` naming a claim recorded as `rec` gets, `held` saying
/// which CPUs an assignment holds.
pub(crate) fn decide(
    rec: Option<&PreparedClaim>,
    uid: &str,
    pod_uid: &str,
    held: impl Fn(&AssignmentId) -> Option<CpuSet>,
) -> ClaimFor {
    let Some(rec) = rec else {
        return ClaimFor::Refused(format!("claim {uid} is not prepared on this node"));
    };
    if !rec.pods.iter().any(|p| p == pod_uid) {
        return ClaimFor::Refused(format!(
            "claim {}/{} ({uid}) is not reserved for its pod {pod_uid}",
            rec.namespace, rec.name
        ));
    }
    let mut cpus = CpuSet::new();
    for id in &rec.assignments {
        match held(id) {
            Some(c) => cpus = cpus.union(&c),
            None => {
                return ClaimFor::Lost(format!(
                    "{id} of claim {}/{} is no longer held",
                    rec.namespace, rec.name
                ))
            }
        }
    }
    ClaimFor::Held(ClaimHeld {
        name: format!("{}/{}", rec.namespace, rec.name),
        ids: rec.assignments.clone(),
        cpus,
    })
}

/// What a claim container's start does.
#[derive(Debug, PartialEq, Eq)]
pub enum AtStart {
    /// Point the claim's only assignment, held for no container, at the container's cgroup.
    Bind(AssignmentId),
    /// It is bound to the container's cgroup already (a resync).
    Bound,
    /// Read the container's cgroup back against the claim's CPUs: they are bound to another
    /// container's cgroup (`Some`), or the claim has several assignments, which one cgroup
    /// cannot all be the target of (`None`: the engine then records the container running on
    /// them all).
    ReadBack(Option<CgroupPath>),
    /// Some of its CPUs are no longer held (said which).
    Lost(String),
}

/// What the start of a container of `held` in `cgroup` does, given where each assignment of
/// the claim points now (`None`: released).
pub(crate) fn at_start(
    held: &ClaimHeld,
    cgroup: &CgroupPath,
    target_of: impl Fn(&AssignmentId) -> Option<Target>,
) -> AtStart {
    let mut targets = Vec::new();
    for id in &held.ids {
        match target_of(id) {
            Some(t) => targets.push(t),
            None => return AtStart::Lost(format!("{id} of claim {} is no longer held", held.name)),
        }
    }
    match (held.ids.as_slice(), targets.as_slice()) {
        ([id], [Target::Kubelet(_)]) => AtStart::Bind(id.clone()),
        ([_], [Target::Cgroup(p)]) if p == cgroup => AtStart::Bound,
        ([_], [Target::Cgroup(p)]) => AtStart::ReadBack(Some(p.clone())),
        _ => AtStart::ReadBack(None),
    }
}

/// Whether `a` is a claim's assignment bound to a container cgroup that `gone` says is gone
/// (not one made by hand with a claim's name: that reclaims, and names no container).
pub(crate) fn bound_to_gone(a: &Assignment, gone: &impl Fn(&CgroupPath) -> bool) -> bool {
    claim_of(a.id.as_str()).is_some()
        && !a.reclaim
        && a.container.is_some()
        && matches!(&a.target, Target::Cgroup(p) if gone(p))
}

#[cfg(test)]
mod tests;
