//! The state the daemon owns: the resolved pools and the assignments made from them.
//!
//! Every mutation is a method that either returns an error and leaves the state untouched, or
//! changes it and says whether anything changed ([`Outcome`]), so callers signal only real
//! changes. Per-pool usage is cached and rebuilt on load, never persisted, so a corrupt cache
//! cannot outlive a restart.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::alloc::{self, PickError};
use super::cpuset::CpuSet;
use super::pool::{Pool, PoolKind, PoolName, Smt};
use super::topology::Topology;

mod admit;
mod claims;
mod delta;
mod error;
pub mod phase;
mod target;
mod validate;

pub use admit::{check_target, slice_cgroup};
pub use claims::{PreparedClaim, PreparedDevice, TooLarge, MAX_CLAIM_BYTES};
pub use delta::{Changes, Delta};
#[cfg(any(test, feature = "testing"))]
pub use error::every_error;
pub use error::{counted, Error};
pub use target::{AssignmentId, CgroupPath, Target, MAX_CGROUP_PATH, MAX_DEVICE_ID, MAX_ID, MAX_UNIT_NAME};
pub use validate::{misfits, Misfit, Violation};
/// How much an assignment asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Size {
    /// Whole CPUs.
    Cpus(u32),
    /// Thousandths of a CPU (shared pools only, or whole thousands).
    Millicpus(u64),
    /// Exactly these CPUs (exclusive pools): what the kubelet allocated by device id.
    Cpuset(CpuSet),
}

/// A request for CPUs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssignSpec {
    /// The pool to take from.
    pub pool: String,
    /// What the CPUs are for.
    pub target: Target,
    /// How much.
    pub size: Size,
    /// The caller's id for idempotent retries; one is made up when absent.
    pub id: Option<AssignmentId>,
    /// Release it when the target goes away (the default).
    pub reclaim: bool,
    /// Pid targets: when the process started (the engine fills it in from the host).
    pub process_start: Option<u64>,
    /// Exclusive pools: the CPUs a picked assignment must come from (a DRA device's NUMA
    /// node); `None`: anywhere in the pool. Absent from journals written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub within: Option<CpuSet>,
}

impl AssignSpec {
    /// A spec with the defaults: reclaimed when the target goes away.
    pub fn new(pool: impl Into<String>, target: Target, size: Size, id: Option<AssignmentId>) -> AssignSpec {
        AssignSpec { pool: pool.into(), target, size, id, reclaim: true, process_start: None, within: None }
    }
}

fn yes() -> bool {
    true
}

/// CPUs given to a target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    /// Its id.
    pub id: AssignmentId,
    /// The pool it came from.
    pub pool: PoolName,
    /// The pool's kind when it was made.
    pub kind: PoolKind,
    /// What it applies to.
    pub target: Target,
    /// The CPUs the target may run on (exclusive: owned; shared: the pool's CPUs).
    pub cpus: CpuSet,
    /// Capacity it holds, in millicpus (exclusive: 1000 per CPU).
    pub millicpus: u64,
    /// Released when its target goes away: the unit stops, the process exits, the cgroup is
    /// removed.
    #[serde(default = "yes")]
    pub reclaim: bool,
    /// Pid targets: when the process started (clock ticks since boot), so that a pid the kernel
    /// reuses is never taken for the assigned process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_start: Option<u64>,
    /// Kubelet assignments: the container holding the devices, once the kubelet has said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<Container>,
}

/// A Kubernetes container, as the kubelet names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Container {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The container's name in the pod.
    pub name: String,
}

impl fmt::Display for Container {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.namespace, self.pod, self.name)
    }
}

/// Whether a mutation changed anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome<T> {
    /// The state already was as asked (an idempotent repeat).
    Identity(T),
    /// The state changed.
    Changed(T),
}

impl<T> Outcome<T> {
    /// The value, changed or not.
    pub fn into_inner(self) -> T {
        match self {
            Outcome::Identity(t) | Outcome::Changed(t) => t,
        }
    }
    /// Whether the state changed.
    pub fn changed(&self) -> bool {
        matches!(self, Outcome::Changed(_))
    }
}

/// Usage of one pool, derived from the assignments.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    /// CPUs owned by exclusive assignments.
    pub taken: CpuSet,
    /// Those of them serving targets outside `cpupool.slice` (kubelet containers, allocated
    /// or running): an isolated pool's partition cannot hold them.
    pub containers: CpuSet,
    /// Millicpus held.
    pub millicpus: u64,
    /// Number of assignments.
    pub count: usize,
}

/// Pools and assignments.
///
/// Copying a `State` is cheap whatever the number of assignments: they live in a persistent
/// map that shares its structure between copies, so the engine can decide a mutation on a copy
/// and publish snapshots without copying every assignment. Two states are equal when their
/// persisted data is; the derived indexes and the change record are not compared.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(from = "StateData", into = "StateData")]
pub struct State {
    data: StateData,
    usage: BTreeMap<PoolName, Usage>,
    /// The assignment holding each target (a target has one cpuset), derived like `usage`.
    targets: imbl::HashMap<Target, AssignmentId>,
    /// The cgroups the targets name, for [`State::check_target`]; derived like `usage`.
    cgroups: admit::CgroupIndex,
    /// What changed since the last [`State::take_changes`].
    changes: Changes,
}

impl PartialEq for State {
    fn eq(&self, other: &State) -> bool {
        self.data == other.data
    }
}

impl Eq for State {}

/// The persisted part of [`State`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct StateData {
    /// Pools by name.
    pub pools: BTreeMap<PoolName, Pool>,
    /// Assignments by id.
    pub assignments: imbl::OrdMap<AssignmentId, Assignment>,
    /// Counter for made-up ids.
    pub next_id: u64,
    /// The prepared DRA claims by uid ([`claims`]). Absent from states written before it.
    #[serde(default, skip_serializing_if = "imbl::OrdMap::is_empty")]
    pub claims: imbl::OrdMap<String, PreparedClaim>,
}

impl From<StateData> for State {
    fn from(data: StateData) -> Self {
        let mut s = State {
            data,
            usage: BTreeMap::new(),
            targets: imbl::HashMap::new(),
            cgroups: admit::CgroupIndex::default(),
            changes: Changes::default(),
        };
        s.rebuild_usage();
        s
    }
}

impl From<State> for StateData {
    fn from(s: State) -> Self {
        s.data
    }
}

impl Default for State {
    fn default() -> Self {
        State::from(StateData::default())
    }
}

impl State {
    /// A state with `pools` and no assignment.
    pub fn with_pools(pools: Vec<Pool>) -> Self {
        State::from(StateData {
            pools: pools.into_iter().map(|p| (p.name.clone(), p)).collect(),
            ..StateData::default()
        })
    }

    fn rebuild_usage(&mut self) {
        let mut usage: BTreeMap<PoolName, Usage> =
            self.data.pools.keys().map(|n| (n.clone(), Usage::default())).collect();
        let mut targets = imbl::HashMap::new();
        let mut cgroups = admit::CgroupIndex::default();
        for a in self.data.assignments.values() {
            add_usage(&mut usage, a);
            targets.insert(a.target.clone(), a.id.clone());
            cgroups.insert(a);
        }
        self.usage = usage;
        self.targets = targets;
        self.cgroups = cgroups;
    }

    /// Books `a` into the usage and the target indexes.
    fn add_usage(&mut self, a: &Assignment) {
        add_usage(&mut self.usage, a);
        self.index(a);
    }

    /// Enters `a`'s target in the target indexes.
    fn index(&mut self, a: &Assignment) {
        self.targets.insert(a.target.clone(), a.id.clone());
        self.cgroups.insert(a);
    }

    /// Takes `a`'s target out of the target indexes.
    fn unindex(&mut self, a: &Assignment) {
        if self.targets.get(&a.target) == Some(&a.id) {
            self.targets.remove(&a.target);
        }
        self.cgroups.remove(a);
    }

    fn remove_usage(&mut self, a: &Assignment) {
        let exclusive = a.kind == PoolKind::Exclusive;
        if let Some(u) = self.usage.get_mut(&a.pool) {
            if exclusive {
                u.taken = u.taken.difference(&a.cpus);
                u.containers = u.containers.difference(&a.cpus);
            }
            u.millicpus = u.millicpus.saturating_sub(a.millicpus);
            u.count = u.count.saturating_sub(1);
        }
        self.unindex(a);
    }

    /// What changed since the last [`State::take_changes`].
    pub fn changes(&self) -> &Changes {
        &self.changes
    }

    /// What changed, leaving the record empty.
    pub fn take_changes(&mut self) -> Changes {
        std::mem::take(&mut self.changes)
    }

    /// Records `changes` as changed here too: going back to an earlier state touches what the
    /// step forward touched.
    pub fn mark(&mut self, changes: &Changes) {
        self.changes.merge(changes);
    }

    /// The persisted data.
    pub fn data(&self) -> &StateData {
        &self.data
    }

    /// Pools by name.
    pub fn pools(&self) -> &BTreeMap<PoolName, Pool> {
        &self.data.pools
    }

    /// Assignments by id.
    pub fn assignments(&self) -> &imbl::OrdMap<AssignmentId, Assignment> {
        &self.data.assignments
    }

    /// The assignment whose target is `target`, through the target index.
    pub fn holder(&self, target: &Target) -> Option<&Assignment> {
        self.targets.get(target).and_then(|id| self.data.assignments.get(id))
    }

    /// A pool's usage.
    pub fn usage(&self, pool: &PoolName) -> Usage {
        self.usage.get(pool).cloned().unwrap_or_default()
    }

    /// A pool's free CPUs: for exclusive pools the CPUs no assignment owns, for the others
    /// all of them (shared capacity is counted in millicpus).
    pub fn free_cpus(&self, pool: &Pool) -> CpuSet {
        pool.cpus.difference(&self.usage(&pool.name).taken)
    }

    /// A pool's free millicpus.
    pub fn free_millis(&self, pool: &Pool) -> u64 {
        match pool.kind {
            PoolKind::Exclusive => self.free_cpus(pool).len() as u64 * 1000,
            _ => pool.capacity_millis().saturating_sub(self.usage(&pool.name).millicpus),
        }
    }

    /// A pool by name.
    pub fn pool(&self, name: &str) -> Result<&Pool, Error> {
        PoolName::new(name)
            .ok()
            .and_then(|n| self.data.pools.get(&n))
            .ok_or_else(|| Error::NoSuchPool { pool: crate::echo(name) })
    }

    /// Assigns CPUs. Repeating a request with the same id and spec returns the existing
    /// assignment unchanged.
    pub fn assign(&mut self, topo: &Topology, spec: &AssignSpec) -> Result<Outcome<Assignment>, Error> {
        let pool = self.pool(&spec.pool)?.clone();
        if let Some(existing) = self.repeated(&pool, spec)? {
            return Ok(Outcome::Identity(existing));
        }
        // A target has one cpuset: it can hold one assignment, from whichever pool.
        if let Some(a) = self.targets.get(&spec.target).and_then(|id| self.data.assignments.get(id)) {
            return Err(Error::TargetBusy {
                target: spec.target.to_string(),
                id: a.id.to_string(),
                // The pool of the assignment that holds it, which says where to release it.
                pool: a.pool.to_string(),
            });
        }
        let (cpus, millicpus) = match pool.kind {
            PoolKind::Reserved => return Err(Error::ReservedPool { pool: pool.name.to_string() }),
            PoolKind::Exclusive => {
                let cpus = self.exclusive_cpus(topo, &pool, &spec.size, spec.within.as_ref())?;
                let n = cpus.len() as u64;
                (cpus, n * 1000)
            }
            PoolKind::Shared => (pool.cpus.clone(), self.shared_millis(&pool, &spec.size)?),
        };
        let id = match &spec.id {
            Some(id) => id.clone(),
            None => self.next_id(),
        };
        let a = Assignment {
            id: id.clone(),
            pool: pool.name.clone(),
            kind: pool.kind,
            target: spec.target.clone(),
            cpus,
            millicpus,
            reclaim: spec.reclaim,
            process_start: spec.process_start,
            container: None,
        };
        self.add_usage(&a);
        self.changes.assignments.insert(id.clone());
        self.data.assignments.insert(id, a.clone());
        Ok(Outcome::Changed(a))
    }

    /// The assignment `spec` names by its id, if it exists already with the same pool, target
    /// and size (asking again is no change); another under that id is [`Error::DuplicateId`].
    fn repeated(&self, pool: &Pool, spec: &AssignSpec) -> Result<Option<Assignment>, Error> {
        let Some(id) = &spec.id else { return Ok(None) };
        let Some(existing) = self.data.assignments.get(id) else { return Ok(None) };
        let same_size = match (pool.kind, &spec.size) {
            (PoolKind::Exclusive, Size::Cpus(n)) => existing.cpus.len() as u64 == u64::from(*n),
            (_, Size::Cpuset(set)) => existing.cpus == *set,
            (_, Size::Cpus(n)) => existing.millicpus == u64::from(*n) * 1000,
            (_, Size::Millicpus(m)) => existing.millicpus == *m,
        };
        if existing.pool == pool.name && existing.target == spec.target && same_size {
            return Ok(Some(existing.clone()));
        }
        Err(Error::DuplicateId { id: id.to_string() })
    }

    /// The CPUs of an exclusive pool's new assignment of `size`: whole CPUs, chosen or picked
    /// (from `within`, when given).
    fn exclusive_cpus(
        &self,
        topo: &Topology,
        pool: &Pool,
        size: &Size,
        within: Option<&CpuSet>,
    ) -> Result<CpuSet, Error> {
        Ok(match size {
            Size::Cpuset(want) => self.exact(topo, pool, want)?,
            Size::Cpus(n) => self.pick_whole(topo, pool, u64::from(*n), within)?,
            Size::Millicpus(m) if m % 1000 == 0 => self.pick_whole(topo, pool, m / 1000, within)?,
            Size::Millicpus(m) => {
                return Err(Error::InvalidArgument {
                    arg: "millicpus",
                    reason: format!(
                        "pool `{}` is exclusive and hands out whole CPUs; {m} is not a multiple of 1000 (use cpus)",
                        pool.name
                    ),
                })
            }
        })
    }

    /// The millicpus of a shared pool's new assignment of `size`, if the pool has them free.
    fn shared_millis(&self, pool: &Pool, size: &Size) -> Result<u64, Error> {
        let m = match *size {
            Size::Cpus(n) => u64::from(n) * 1000,
            Size::Millicpus(m) => m,
            Size::Cpuset(_) => {
                return Err(Error::InvalidArgument {
                    arg: "cpus",
                    reason: format!(
                        "pool `{}` is shared: its assignments take millicpus, not chosen CPUs",
                        pool.name
                    ),
                })
            }
        };
        if m == 0 {
            let arg = if matches!(size, Size::Cpus(_)) { "cpus" } else { "millicpus" };
            return Err(Error::InvalidArgument { arg, reason: "must be at least 1".into() });
        }
        let free = self.free_millis(pool);
        if m > free {
            return Err(Error::InsufficientCapacity {
                pool: pool.name.to_string(),
                requested: m,
                free,
                unit: "millicpus",
            });
        }
        Ok(m)
    }

    /// A new assignment's id: `a<N>`, the next N not taken.
    fn next_id(&mut self) -> AssignmentId {
        loop {
            self.data.next_id += 1;
            let id = AssignmentId(format!("a{}", self.data.next_id));
            if !self.data.assignments.contains_key(&id) {
                return id;
            }
        }
    }

    /// Checks that `want` can be owned whole by a new assignment of the exclusive `pool`.
    /// `n` free CPUs of exclusive `pool` (among `within`, when given), chosen by the allocator.
    fn pick_whole(
        &self,
        topo: &Topology,
        pool: &Pool,
        n: u64,
        within: Option<&CpuSet>,
    ) -> Result<CpuSet, Error> {
        if n == 0 {
            return Err(Error::InvalidArgument { arg: "cpus", reason: "must be at least 1".into() });
        }
        let free = within.map_or_else(|| self.free_cpus(pool), |w| self.free_cpus(pool).intersection(w));
        alloc::pick(topo, &free, &CpuSet::new(), n as usize, pool.smt).map_err(|e| match e {
            PickError::Insufficient { available, .. } => Error::InsufficientCapacity {
                pool: pool.name.to_string(),
                requested: n,
                free: available as u64,
                unit: "cpus",
            },
            PickError::NotWholeCores { .. } => {
                Error::NotWholeCores { pool: pool.name.to_string(), requested: n }
            }
        })
    }

    fn exact(&self, topo: &Topology, pool: &Pool, want: &CpuSet) -> Result<CpuSet, Error> {
        let bad = |reason: String| Error::InvalidArgument { arg: "cpus", reason };
        if want.is_empty() {
            return Err(bad("must name at least one CPU".into()));
        }
        let outside = want.difference(&pool.cpus);
        if !outside.is_empty() {
            return Err(bad(format!("CPUs {outside} are not in pool `{}`", pool.name)));
        }
        let taken = want.difference(&self.free_cpus(pool));
        if !taken.is_empty() {
            let holder = self
                .data
                .assignments
                .values()
                .find(|a| a.pool == pool.name && !a.cpus.is_disjoint(&taken))
                .map(|a| a.id.to_string())
                .unwrap_or_default();
            return Err(bad(format!("CPUs {taken} are held by assignment `{holder}`")));
        }
        if pool.smt == Smt::FullCores && !topo.is_whole_cores(want) {
            return Err(Error::NotWholeCores { pool: pool.name.to_string(), requested: want.len() as u64 });
        }
        Ok(want.clone())
    }

    /// Points an assignment at another target, keeping its CPUs, and records the container it
    /// serves: the device plugin moves a kubelet allocation to its container's cgroup once the
    /// container is known.
    pub fn retarget(
        &mut self,
        id: &str,
        target: Target,
        container: Option<Container>,
    ) -> Result<Outcome<Assignment>, Error> {
        let key = AssignmentId::new(id).map_err(|_| Error::NoSuchAssignment { id: crate::echo(id) })?;
        let Some(current) = self.data.assignments.get(&key) else {
            return Err(Error::NoSuchAssignment { id: crate::echo(id) });
        };
        if current.target == target && current.container == container {
            return Ok(Outcome::Identity(current.clone()));
        }
        if let Some(other) =
            self.targets.get(&target).filter(|&id| *id != key).and_then(|id| self.data.assignments.get(id))
        {
            return Err(Error::TargetBusy {
                target: target.to_string(),
                id: other.id.to_string(),
                pool: other.pool.to_string(),
            });
        }
        let Some(a) = self.data.assignments.get_mut(&key) else {
            return Err(Error::NoSuchAssignment { id: crate::echo(id) });
        };
        let old = a.clone();
        a.target = target;
        a.container = container;
        let a = a.clone();
        self.remove_usage(&old);
        self.add_usage(&a);
        self.changes.assignments.insert(key);
        Ok(Outcome::Changed(a))
    }

    /// Releases an assignment, returning what it held.
    pub fn release(&mut self, id: &str) -> Result<Assignment, Error> {
        let key = AssignmentId::new(id).map_err(|_| Error::NoSuchAssignment { id: crate::echo(id) })?;
        let a = self
            .data
            .assignments
            .remove(&key)
            .ok_or_else(|| Error::NoSuchAssignment { id: crate::echo(id) })?;
        self.remove_usage(&a);
        self.changes.assignments.insert(key);
        Ok(a)
    }

    /// Replaces the pools (a config reload). Assignments must still fit: each one's pool must
    /// exist with the same kind and still contain its CPUs. Returns the assignments that do not
    /// fit, without changing anything, when there are any.
    pub fn set_pools(&mut self, pools: Vec<Pool>) -> Result<(), Vec<Misfit>> {
        let new: BTreeMap<PoolName, Pool> = pools.into_iter().map(|p| (p.name.clone(), p)).collect();
        let misfits = misfits(&new, self.data.assignments.values());
        if !misfits.is_empty() {
            return Err(misfits);
        }
        self.data.pools = new;
        self.changes.pools = true;
        // Shared assignments see the whole pool: follow its new CPUs.
        let follow: Vec<(AssignmentId, CpuSet)> = self
            .data
            .assignments
            .values()
            .filter_map(|a| {
                let p = self.data.pools.get(&a.pool)?;
                (p.kind == PoolKind::Shared && p.cpus != a.cpus).then(|| (a.id.clone(), p.cpus.clone()))
            })
            .collect();
        for (id, cpus) in follow {
            if let Some(a) = self.data.assignments.get_mut(&id) {
                a.cpus = cpus;
            }
            self.changes.assignments.insert(id);
        }
        self.rebuild_usage();
        Ok(())
    }
}

/// Books `a` into `usage`.
fn add_usage(usage: &mut BTreeMap<PoolName, Usage>, a: &Assignment) {
    let u = usage.entry(a.pool.clone()).or_default();
    if a.kind == PoolKind::Exclusive {
        u.taken = u.taken.union(&a.cpus);
        if a.target.outside_pools() {
            u.containers = u.containers.union(&a.cpus);
        }
    }
    u.millicpus += a.millicpus;
    u.count += 1;
}

#[cfg(test)]
mod tests;
