//! The planner: from the placement the state implies ([`layout`]) before and after a change, the
//! ordered host effects that get from one to the other.
//!
//! Order matters because the kernel sees every intermediate step. Sets that must stay disjoint
//! (pool slices among themselves and against the host slices, exclusive assignments among
//! themselves) are first shrunk to what they keep, and only then grown, each grow waiting until
//! no conflicting set still holds the CPUs it adds. Parents grow before their children and
//! shrink after them. Only a true cycle (two pools swapping CPUs) needs a set to be emptied for a
//! moment; that is the one case where a set is written empty mid-way.
//!
//! The planner does not know which backend runs the effects: the cgroupfs backend writes
//! `cpuset.cpus` itself, the systemd backend sets `AllowedCPUs` on units.

use std::collections::BTreeMap;

use super::cpuset::CpuSet;
use super::pool::{PoolKind, PoolName};
use super::state::{CgroupPath, State, Target};
use super::topology::Topology;

/// The slice that holds every pool slice.
pub const TOP_SLICE: &str = "cpupool.slice";

/// The cgroup path of a pool's slice: `cpupool.slice/cpupool-<pool>.slice`.
pub fn pool_slice(pool: &PoolName) -> CgroupPath {
    // Pool names are [a-z0-9_]{1,32}, so this is always a valid path.
    CgroupPath::new(&format!("{TOP_SLICE}/cpupool-{pool}.slice")).unwrap_or_else(|_| unreachable_path())
}

#[allow(clippy::panic)]
fn unreachable_path() -> CgroupPath {
    panic!("pool names are validated to form valid cgroup paths")
}

/// What a placement is restricted on.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    /// A cgroup, relative to the cgroup root.
    Cgroup(CgroupPath),
    /// A systemd unit.
    Unit(String),
    /// A process (all its threads).
    Pid(u32),
}

impl Key {
    fn depth(&self) -> usize {
        match self {
            Key::Cgroup(p) => p.depth(),
            _ => usize::MAX,
        }
    }
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Key::Cgroup(p) => write!(f, "cgroup {p}"),
            Key::Unit(u) => write!(f, "unit {u}"),
            Key::Pid(p) => write!(f, "pid {p}"),
        }
    }
}

impl From<&Target> for Key {
    fn from(t: &Target) -> Key {
        match t {
            Target::Cgroup(p) => Key::Cgroup(p.clone()),
            Target::Unit(u) => Key::Unit(u.clone()),
            Target::Pid(p) => Key::Pid(*p),
        }
    }
}

/// Why a placement exists; decides which placements must stay disjoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// `cpupool.slice`: holds every pool slice.
    Parent,
    /// A pool's slice.
    Pool(PoolKind),
    /// A host slice (system.slice, ...) confined to the reserved pool. Skipped where it does
    /// not exist.
    Host,
    /// An exclusive assignment's target.
    Exclusive,
    /// A shared assignment's target.
    Shared,
}

impl Role {
    fn conflicts(&self, other: &Role) -> bool {
        use Role::*;
        matches!(
            (self, other),
            (Pool(_), Pool(_))
                | (Exclusive, Exclusive)
                | (Host, Pool(PoolKind::Exclusive | PoolKind::Shared))
                | (Pool(PoolKind::Exclusive | PoolKind::Shared), Host)
        )
    }

    /// Cgroups the daemon creates and removes itself.
    fn owned(&self) -> bool {
        matches!(self, Role::Parent | Role::Pool(_))
    }
}

/// Where one thing may run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Its CPUs.
    pub cpus: CpuSet,
    /// Its memory nodes (cgroups only).
    pub mems: CpuSet,
    /// Why it exists.
    pub role: Role,
}

/// Every placement the daemon maintains.
pub type Layout = BTreeMap<Key, Placement>;

/// One host side effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Create a cgroup (and enable `+cpuset` in its parents' `cgroup.subtree_control`).
    CreateCgroup(CgroupPath),
    /// Restrict `key` to `cpus`. Empty `cpus` lifts the restriction (cgroup: inherit the
    /// parent; unit: `AllowedCPUs=`; pid: every CPU). `optional`: skip if it does not exist.
    SetCpus {
        /// What.
        key: Key,
        /// Its CPUs.
        cpus: CpuSet,
        /// Skip it if it does not exist.
        optional: bool,
    },
    /// Write a cgroup's `cpuset.mems`.
    SetMems {
        /// The cgroup.
        path: CgroupPath,
        /// Its nodes.
        mems: CpuSet,
        /// Skip it if it does not exist.
        optional: bool,
    },
    /// Remove a cgroup the daemon created.
    RemoveCgroup(CgroupPath),
}

/// The placements `state` implies: the top slice, one slice per pool, the host cgroups on the
/// reserved pool, and every assignment's target.
pub fn layout(state: &State, topo: &Topology, host_cgroups: &[CgroupPath]) -> Layout {
    let mut out = Layout::new();
    let all = state.pools().values().fold(CpuSet::new(), |acc, p| acc.union(&p.cpus));
    if let Ok(top) = CgroupPath::new(TOP_SLICE) {
        out.insert(Key::Cgroup(top), Placement { mems: topo.nodes_of(&all), cpus: all, role: Role::Parent });
    }
    for p in state.pools().values() {
        out.insert(
            Key::Cgroup(pool_slice(&p.name)),
            Placement { cpus: p.cpus.clone(), mems: topo.nodes_of(&p.cpus), role: Role::Pool(p.kind) },
        );
        if p.kind == PoolKind::Reserved {
            for h in host_cgroups {
                out.insert(
                    Key::Cgroup(h.clone()),
                    Placement { cpus: p.cpus.clone(), mems: topo.nodes_of(&p.cpus), role: Role::Host },
                );
            }
        }
    }
    for a in state.assignments().values() {
        let role = if a.kind == PoolKind::Exclusive { Role::Exclusive } else { Role::Shared };
        out.insert(
            Key::from(&a.target),
            Placement { cpus: a.cpus.clone(), mems: topo.nodes_of(&a.cpus), role },
        );
    }
    out
}

/// The ordered effects that turn `before` into `after`.
pub fn plan(before: &Layout, after: &Layout) -> Vec<Effect> {
    let mut effects = Vec::new();
    let mut current: BTreeMap<&Key, CpuSet> = before.iter().map(|(k, p)| (k, p.cpus.clone())).collect();
    // A placement keeps its old role until it is written with its new CPUs.
    let mut roles: BTreeMap<&Key, Role> = before.iter().map(|(k, p)| (k, p.role.clone())).collect();

    // Create new owned cgroups, outermost first.
    let mut created: Vec<&Key> =
        after.iter().filter(|(k, p)| p.role.owned() && !before.contains_key(*k)).map(|(k, _)| k).collect();
    created.sort_by_key(|k| k.depth());
    for k in created {
        if let Key::Cgroup(path) = k {
            effects.push(Effect::CreateCgroup(path.clone()));
        }
        current.insert(k, CpuSet::new());
    }

    // Shrink: first what goes away, then what keeps only part of its CPUs, innermost first.
    // A placement whose role changes is not shrunk: it may newly conflict with others, so it
    // waits in the grow phase like a new one.
    let mut shrinking: Vec<&Key> = before.keys().collect();
    shrinking.sort_by_key(|k| std::cmp::Reverse(k.depth()));
    let mut removed_owned = Vec::new();
    for &k in shrinking.iter().filter(|k| !after.contains_key(**k)) {
        if before[k].role.owned() {
            if let Key::Cgroup(path) = k {
                removed_owned.push(path.clone());
            }
        } else {
            effects.push(Effect::SetCpus { key: k.clone(), cpus: CpuSet::new(), optional: true });
        }
        current.remove(k);
    }
    for k in shrinking {
        let (old, Some(new)) = (&before[k], after.get(k)) else { continue };
        let keep = old.cpus.intersection(&new.cpus);
        if old.role == new.role && keep != old.cpus && !keep.is_empty() {
            effects.push(Effect::SetCpus {
                key: k.clone(),
                cpus: keep.clone(),
                optional: new.role == Role::Host,
            });
            current.insert(k, keep);
        }
    }
    // Removed pool slices go once their CPUs are no longer needed by anyone: right away,
    // innermost first (their children, if any, were listed before them).
    effects.extend(removed_owned.into_iter().map(Effect::RemoveCgroup));

    // Grow: each set once nothing conflicting holds what it adds and its parents hold it.
    // A placement whose role alone changes is pending too: until its role switches, it may
    // block others under the old one. The switch rewrites its (unchanged) CPUs, which is
    // harmless and keeps every step visible in the plan.
    let mut pending: Vec<&Key> = after
        .iter()
        .filter(|(k, p)| current.get(k) != Some(&p.cpus) || roles.get(k).is_some_and(|r| *r != p.role))
        .map(|(k, _)| k)
        .collect();
    pending.sort_by_key(|k| k.depth());
    while !pending.is_empty() {
        let ready = pending.iter().position(|k| {
            let want = &after[*k];
            let same_role = before.get(*k).is_some_and(|b| b.role == want.role);
            let adds = if same_role {
                want.cpus.difference(current.get(k).unwrap_or(&CpuSet::new()))
            } else {
                want.cpus.clone()
            };
            let free_of_conflicts = current.iter().all(|(other, cpus)| {
                *other == *k
                    || !roles.get(other).is_some_and(|r| r.conflicts(&want.role))
                    || cpus.is_disjoint(&adds)
            });
            let parents_hold = match k {
                Key::Cgroup(path) => path.ancestors().iter().all(|a| {
                    let a = Key::Cgroup(a.clone());
                    !after.contains_key(&a) || want.cpus.is_subset(current.get(&a).unwrap_or(&CpuSet::new()))
                }),
                _ => true,
            };
            free_of_conflicts && parents_hold
        });
        match ready {
            Some(i) => {
                let k = pending.remove(i);
                let want = &after[k];
                effects.push(Effect::SetCpus {
                    key: k.clone(),
                    cpus: want.cpus.clone(),
                    optional: want.role == Role::Host,
                });
                current.insert(k, want.cpus.clone());
                roles.insert(k, want.role.clone());
            }
            None => {
                // A cycle: empty the first pending set that still holds something, then retry.
                let Some(k) = pending
                    .iter()
                    .copied()
                    .find(|k| !matches!(k, Key::Pid(_)) && current.get(k).is_some_and(|c| !c.is_empty()))
                else {
                    break;
                };
                effects.push(Effect::SetCpus {
                    key: k.clone(),
                    cpus: CpuSet::new(),
                    optional: after[k].role == Role::Host,
                });
                current.insert(k, CpuSet::new());
            }
        }
    }

    // Memory nodes carry no exclusivity: set them last, outermost first.
    let mut mems: Vec<(&Key, &Placement)> = after
        .iter()
        .filter(|(k, p)| matches!(k, Key::Cgroup(_)) && before.get(*k).is_none_or(|b| b.mems != p.mems))
        .collect();
    mems.sort_by_key(|(k, _)| k.depth());
    for (k, p) in mems {
        if let Key::Cgroup(path) = k {
            effects.push(Effect::SetMems {
                path: path.clone(),
                mems: p.mems.clone(),
                optional: p.role == Role::Host,
            });
        }
    }
    effects
}

/// What of `before` can stay while a change to `after` is being saved: the placements `after`
/// keeps, each shrunk to the CPUs it keeps (unless that is nothing or its role changes, where
/// it stays as it was). Placements `after` drops are left out.
///
/// The engine runs `plan(before, kept)` before it saves the new state and `plan(kept, after)`
/// only once the save is durable. Whenever a crash stops it, every target then holds CPUs only
/// if the state on disk names it (with those CPUs or more): nothing unsaved is half applied, and
/// the reconcile at the next start completes the rest from the saved state.
pub fn kept(before: &Layout, after: &Layout) -> Layout {
    before
        .iter()
        .filter_map(|(k, old)| {
            let new = after.get(k)?;
            let keep = old.cpus.intersection(&new.cpus);
            let mut p = old.clone();
            if old.role == new.role && !keep.is_empty() {
                p.cpus = keep;
            }
            Some((k.clone(), p))
        })
        .collect()
}

#[cfg(test)]
mod tests;
