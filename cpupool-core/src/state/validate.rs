//! The rules every state keeps, checked on a state read from disk, and the assignments new pools would strand.

use std::fmt;

use std::collections::BTreeMap;

use super::{Assignment, AssignmentId, CpuSet, Pool, PoolKind, PoolName, State, StateData, Target};

/// An assignment that no longer fits the configured pools.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Misfit {
    /// The assignment.
    pub id: AssignmentId,
    /// Its pool.
    pub pool: PoolName,
    /// Why it no longer fits.
    pub reason: String,
}

impl fmt::Display for Misfit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "assignment `{}` (pool `{}`): {}", self.id, self.pool, self.reason)
    }
}

/// The assignments that do not fit `pools`.
pub fn misfits<'a>(
    pools: &BTreeMap<PoolName, Pool>,
    assignments: impl Iterator<Item = &'a Assignment>,
) -> Vec<Misfit> {
    let mut out = Vec::new();
    let mut shared_use: BTreeMap<&PoolName, u64> = BTreeMap::new();
    for a in assignments {
        let misfit = |reason: String| Misfit { id: a.id.clone(), pool: a.pool.clone(), reason };
        match pools.get(&a.pool) {
            None => out.push(misfit("its pool no longer exists".into())),
            Some(p) if p.kind != a.kind => {
                out.push(misfit(format!("the pool changed kind from {} to {}", a.kind, p.kind)))
            }
            Some(p) if p.kind == PoolKind::Exclusive => {
                let lost = a.cpus.difference(&p.cpus);
                if !lost.is_empty() {
                    out.push(misfit(format!("the pool no longer contains its CPUs {lost}")));
                }
            }
            Some(p) => *shared_use.entry(&p.name).or_default() += a.millicpus,
        }
    }
    for (name, used) in shared_use {
        if let Some(p) = pools.get(name) {
            if used > p.capacity_millis() {
                out.push(Misfit {
                    id: AssignmentId("*".into()),
                    pool: name.clone(),
                    reason: format!(
                        "assignments hold {used} millicpus but the pool would only have {}",
                        p.capacity_millis()
                    ),
                });
            }
        }
    }
    out
}

/// A way a state breaks the rules that every state [`State`]'s methods make keeps. A state file
/// can hold one when it was edited by hand or written by a faulty release: its checksum proves
/// only that it is the file that was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// An assignment is filed under another id than its own.
    MisfiledAssignment {
        /// The id it is filed under.
        key: AssignmentId,
        /// Its own id.
        id: AssignmentId,
    },
    /// A pool is filed under another name than its own.
    MisfiledPool {
        /// The name it is filed under.
        key: PoolName,
        /// Its own name.
        name: PoolName,
    },
    /// Two pools have CPUs in common.
    PoolsOverlap {
        /// One pool.
        pool: PoolName,
        /// The other.
        other: PoolName,
        /// The CPUs both have.
        cpus: CpuSet,
    },
    /// An assignment names a pool the state does not have.
    UnknownPool {
        /// The assignment.
        id: AssignmentId,
        /// The pool it names.
        pool: PoolName,
    },
    /// An assignment's kind is not its pool's.
    KindMismatch {
        /// The assignment.
        id: AssignmentId,
        /// Its pool.
        pool: PoolName,
        /// The assignment's kind.
        kind: PoolKind,
        /// The pool's kind.
        pool_kind: PoolKind,
    },
    /// An assignment takes from the reserved pool, which is not assigned from.
    FromReserved {
        /// The assignment.
        id: AssignmentId,
        /// The reserved pool.
        pool: PoolName,
    },
    /// An assignment holds CPUs its pool does not have.
    OutsidePool {
        /// The assignment.
        id: AssignmentId,
        /// Its pool.
        pool: PoolName,
        /// The CPUs outside the pool.
        cpus: CpuSet,
    },
    /// An assignment holds nothing: no CPU, or no capacity.
    Empty {
        /// The assignment.
        id: AssignmentId,
    },
    /// An exclusive assignment's capacity is not 1000 millicpus per CPU it owns.
    CapacityMismatch {
        /// The assignment.
        id: AssignmentId,
        /// The capacity it records.
        millicpus: u64,
        /// The CPUs it owns.
        cpus: u64,
    },
    /// Two exclusive assignments own the same CPUs.
    OwnedTwice {
        /// One assignment.
        id: AssignmentId,
        /// The other.
        other: AssignmentId,
        /// The CPUs both own.
        cpus: CpuSet,
    },
    /// A shared pool's assignments hold more than the pool has.
    Overcommitted {
        /// The pool.
        pool: PoolName,
        /// Its capacity, in millicpus.
        capacity: u64,
        /// What its assignments hold, in millicpus.
        held: u64,
        /// Its assignments.
        ids: Vec<AssignmentId>,
    },
    /// Two assignments apply to one target (a target has one cpuset).
    TargetTwice {
        /// One assignment.
        id: AssignmentId,
        /// The other.
        other: AssignmentId,
        /// The target.
        target: Target,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::MisfiledAssignment { key, id } => {
                write!(f, "the assignment filed as `{key}` has the id `{id}`")
            }
            Violation::MisfiledPool { key, name } => write!(f, "the pool filed as `{key}` is named `{name}`"),
            Violation::PoolsOverlap { pool, other, cpus } => {
                write!(f, "pools `{pool}` and `{other}` both have CPUs {cpus}")
            }
            Violation::UnknownPool { id, pool } => {
                write!(f, "assignment `{id}` is from pool `{pool}`, which the state does not have")
            }
            Violation::KindMismatch { id, pool, kind, pool_kind } => {
                write!(f, "assignment `{id}` is {kind} but its pool `{pool}` is {pool_kind}")
            }
            Violation::FromReserved { id, pool } => {
                write!(f, "assignment `{id}` takes from the reserved pool `{pool}`")
            }
            Violation::OutsidePool { id, pool, cpus } => {
                write!(f, "assignment `{id}` holds CPUs {cpus}, which its pool `{pool}` does not have")
            }
            Violation::Empty { id } => write!(f, "assignment `{id}` holds no CPU or no capacity"),
            Violation::CapacityMismatch { id, millicpus, cpus } => {
                write!(f, "assignment `{id}` owns {cpus} CPUs but counts {millicpus} millicpus")
            }
            Violation::OwnedTwice { id, other, cpus } => {
                write!(f, "assignments `{id}` and `{other}` both own CPUs {cpus}")
            }
            Violation::Overcommitted { pool, capacity, held, ids } => {
                let ids: Vec<String> = ids.iter().map(|i| format!("`{i}`")).collect();
                write!(
                    f,
                    "shared pool `{pool}` has {capacity} millicpus but its assignments {} hold {held}",
                    ids.join(", ")
                )
            }
            Violation::TargetTwice { id, other, target } => {
                write!(f, "assignments `{id}` and `{other}` both apply to `{target}`")
            }
        }
    }
}

impl StateData {
    /// Checks the rules every state made by [`State`]'s methods keeps (the property tests hold
    /// every state to them): pools are disjoint; each assignment is from a pool the state has,
    /// of the pool's kind and not the reserved one, within the pool's CPUs, and holds something;
    /// exclusive assignments count 1000 millicpus per CPU and no CPU is owned twice; no shared
    /// pool's assignments hold more than the pool has; no target has two assignments.
    ///
    /// Whole cores in full-cores pools depend on the topology and are not checked here.
    pub fn validate(&self) -> Result<(), Vec<Violation>> {
        let mut out = self.pool_violations();
        let mut owners: Vec<&Assignment> = Vec::new();
        let mut targets: BTreeMap<&Target, &AssignmentId> = BTreeMap::new();
        let mut shared: BTreeMap<&PoolName, (u64, Vec<AssignmentId>)> = BTreeMap::new();
        for (key, a) in &self.assignments {
            let id = || a.id.clone();
            if *key != a.id {
                out.push(Violation::MisfiledAssignment { key: key.clone(), id: id() });
            }
            if let Some(other) = targets.insert(&a.target, &a.id) {
                out.push(Violation::TargetTwice { id: other.clone(), other: id(), target: a.target.clone() });
            }
            let Some(p) = self.pools.get(&a.pool) else {
                out.push(Violation::UnknownPool { id: id(), pool: a.pool.clone() });
                continue;
            };
            against_pool(a, p, &mut out);
            match a.kind {
                PoolKind::Exclusive => {
                    let cpus = a.cpus.len() as u64;
                    if a.millicpus != cpus * 1000 {
                        out.push(Violation::CapacityMismatch { id: id(), millicpus: a.millicpus, cpus });
                    }
                    for other in &owners {
                        let both = other.cpus.intersection(&a.cpus);
                        if !both.is_empty() {
                            out.push(Violation::OwnedTwice { id: other.id.clone(), other: id(), cpus: both });
                        }
                    }
                    owners.push(a);
                }
                PoolKind::Shared => {
                    let entry = shared.entry(&p.name).or_default();
                    entry.0 = entry.0.saturating_add(a.millicpus);
                    entry.1.push(id());
                }
                PoolKind::Reserved => {}
            }
        }
        for (name, (held, ids)) in shared {
            let Some(p) = self.pools.get(name) else { continue };
            if held > p.capacity_millis() {
                out.push(Violation::Overcommitted {
                    pool: name.clone(),
                    capacity: p.capacity_millis(),
                    held,
                    ids,
                });
            }
        }
        if out.is_empty() {
            Ok(())
        } else {
            Err(out)
        }
    }

    /// Each pool filed under its own name, and no CPU in two pools.
    fn pool_violations(&self) -> Vec<Violation> {
        let mut out = Vec::new();
        let pools: Vec<&Pool> = self.pools.values().collect();
        for (key, p) in &self.pools {
            if *key != p.name {
                out.push(Violation::MisfiledPool { key: key.clone(), name: p.name.clone() });
            }
        }
        for (i, p) in pools.iter().enumerate() {
            for q in &pools[i + 1..] {
                let both = p.cpus.intersection(&q.cpus);
                if !both.is_empty() {
                    out.push(Violation::PoolsOverlap {
                        pool: p.name.clone(),
                        other: q.name.clone(),
                        cpus: both,
                    });
                }
            }
        }
        out
    }
}

impl State {
    /// [`StateData::validate`] on this state.
    pub fn check(&self) -> Result<(), Vec<Violation>> {
        self.data.validate()
    }
}

/// What assignment `a` must be to its pool `p`: of its kind, not the reserved pool, within its
/// CPUs, and not empty.
fn against_pool(a: &Assignment, p: &Pool, out: &mut Vec<Violation>) {
    let id = || a.id.clone();
    if p.kind != a.kind {
        out.push(Violation::KindMismatch { id: id(), pool: p.name.clone(), kind: a.kind, pool_kind: p.kind });
    }
    if p.kind == PoolKind::Reserved || a.kind == PoolKind::Reserved {
        out.push(Violation::FromReserved { id: id(), pool: p.name.clone() });
    }
    let outside = a.cpus.difference(&p.cpus);
    if !outside.is_empty() {
        out.push(Violation::OutsidePool { id: id(), pool: p.name.clone(), cpus: outside });
    }
    if a.cpus.is_empty() || a.millicpus == 0 {
        out.push(Violation::Empty { id: id() });
    }
}
