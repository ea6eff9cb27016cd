//! The order of the effects: from two layouts, the steps that take the host from one to the
//! other without a moment where the kernel would refuse a write or two sets that must stay
//! disjoint overlap (see the [planner's docs](super)). [`plan`] runs the steps in order, each a
//! method of [`Steps`], which tracks what each placement holds between them.

use std::collections::{BTreeMap, VecDeque};

use super::{Effect, Key, Layout, Partition, Placement, Role};
use crate::cpuset::CpuSet;
use crate::pool::PoolKind;
use crate::state::CgroupPath;

/// The ordered effects that turn `before` into `after`.
pub fn plan(before: &Layout, after: &Layout) -> Vec<Effect> {
    // Partitions that change at all go back to member first, innermost first; when the parent's
    // grant changes, every partition below it goes too.
    let mut torn = torn(before, after);
    torn.sort_by_key(|k| std::cmp::Reverse(k.depth()));
    let mut steps = Steps::new(before, after);
    steps.tear_down(&torn);
    steps.create();
    steps.shrink();
    steps.grow();
    steps.set_mems();
    steps.set_quotas();
    steps.build_partitions(&torn);
    steps.effects
}

/// The effects so far, and what each placement holds after them.
struct Steps<'a> {
    before: &'a Layout,
    after: &'a Layout,
    effects: Vec<Effect>,
    /// The CPUs each placement holds after the effects so far.
    current: BTreeMap<&'a Key, CpuSet>,
    /// A placement keeps its old role until it is written with its new CPUs.
    roles: BTreeMap<&'a Key, Role>,
}

impl<'a> Steps<'a> {
    fn new(before: &'a Layout, after: &'a Layout) -> Steps<'a> {
        Steps {
            before,
            after,
            effects: Vec::new(),
            current: before.iter().map(|(k, p)| (k, p.cpus.clone())).collect(),
            roles: before.iter().map(|(k, p)| (k, p.role.clone())).collect(),
        }
    }

    /// The partitions in `torn` (innermost first) back to member.
    fn tear_down(&mut self, torn: &[&Key]) {
        for k in torn {
            if let Key::Cgroup(path) = k {
                self.effects.push(Effect::SetPartition { path: path.clone(), partition: Partition::Member });
            }
        }
    }

    /// New owned cgroups, outermost first.
    fn create(&mut self) {
        let (before, after) = (self.before, self.after);
        let mut created: Vec<&Key> = after
            .iter()
            .filter(|(k, p)| p.role.owned() && !before.contains_key(*k))
            .map(|(k, _)| k)
            .collect();
        created.sort_by_key(|k| k.depth());
        for k in created {
            if let Key::Cgroup(path) = k {
                self.effects.push(Effect::CreateCgroup(path.clone()));
            }
            self.current.insert(k, CpuSet::new());
        }
    }

    /// First what goes away, then what keeps only part of its CPUs, innermost first. A placement
    /// whose role changes is not shrunk: it may newly conflict with others, so it waits in the
    /// grow step like a new one. Removed pool slices go once their CPUs are no longer needed by
    /// anyone: right away, innermost first (their children, if any, were listed before them).
    fn shrink(&mut self) {
        let (before, after) = (self.before, self.after);
        let mut shrinking: Vec<&Key> = before.keys().collect();
        shrinking.sort_by_key(|k| std::cmp::Reverse(k.depth()));
        let mut removed_owned = Vec::new();
        for &k in shrinking.iter().filter(|k| !after.contains_key(**k)) {
            if before[k].role.owned() {
                if let Key::Cgroup(path) = k {
                    removed_owned.push(path.clone());
                }
            } else {
                if before[k].quota.is_some() {
                    self.effects.push(Effect::SetQuota { key: k.clone(), millis: None });
                }
                self.effects.push(Effect::SetCpus { key: k.clone(), cpus: CpuSet::new(), optional: true });
            }
            self.current.remove(k);
        }
        for k in shrinking {
            let (old, Some(new)) = (&before[k], after.get(k)) else { continue };
            let keep = old.cpus.intersection(&new.cpus);
            if old.role == new.role && keep != old.cpus && !keep.is_empty() {
                self.effects.push(Effect::SetCpus {
                    key: k.clone(),
                    cpus: keep.clone(),
                    optional: new.role.optional(),
                });
                self.current.insert(k, keep);
            }
        }
        self.effects.extend(removed_owned.into_iter().map(Effect::RemoveCgroup));
    }

    /// Each set once nothing conflicting holds what it adds and its parents hold it. A placement
    /// whose role alone changes is pending too: until its role switches, it may block others
    /// under the old one. The switch rewrites its (unchanged) CPUs, which is harmless and keeps
    /// every step visible in the plan.
    fn grow(&mut self) {
        let after = self.after;
        let mut pending: Vec<&Key> = after
            .iter()
            .filter(|(k, p)| {
                self.current.get(k) != Some(&p.cpus) || self.roles.get(k).is_some_and(|r| *r != p.role)
            })
            .map(|(k, _)| k)
            .collect();
        pending.sort_by_key(|k| k.depth());
        let mut pending: VecDeque<&Key> = pending.into();
        // Who holds which CPU under which role, so that whether a set may grow costs the CPUs it
        // adds, not a walk over every placement: thousands of sets growing at once (a first
        // start) would make that quadratic.
        let mut holders = Holders::default();
        for (k, cpus) in &self.current {
            if let Some(r) = self.roles.get(k) {
                holders.add(cpus, r);
            }
        }
        while !pending.is_empty() {
            match pending.iter().position(|k| self.may_grow(k, &holders)) {
                Some(i) => {
                    let Some(k) = pending.remove(i) else { break };
                    let want = &after[k];
                    self.effects.push(Effect::SetCpus {
                        key: k.clone(),
                        cpus: want.cpus.clone(),
                        optional: want.role.optional(),
                    });
                    if let (Some(old), Some(r)) = (self.current.get(k), self.roles.get(k)) {
                        holders.remove(old, r);
                    }
                    holders.add(&want.cpus, &want.role);
                    self.current.insert(k, want.cpus.clone());
                    self.roles.insert(k, want.role.clone());
                }
                None => {
                    // A cycle: empty the first pending set that still holds something, then retry.
                    let Some(k) = pending.iter().copied().find(|k| {
                        !matches!(k, Key::Pid(_)) && self.current.get(k).is_some_and(|c| !c.is_empty())
                    }) else {
                        break;
                    };
                    self.effects.push(Effect::SetCpus {
                        key: k.clone(),
                        cpus: CpuSet::new(),
                        optional: after[k].role.optional(),
                    });
                    if let (Some(old), Some(r)) = (self.current.get(k), self.roles.get(k)) {
                        holders.remove(old, r);
                    }
                    self.current.insert(k, CpuSet::new());
                }
            }
        }
    }

    /// Whether `k` may be written with its CPUs of `after` now: nothing conflicting holds what
    /// it adds, and each of its parents in `after` already holds them.
    fn may_grow(&self, k: &Key, holders: &Holders) -> bool {
        let empty = CpuSet::new();
        let want = &self.after[k];
        let mine = self.current.get(k).unwrap_or(&empty);
        let same_role = self.before.get(k).is_some_and(|b| b.role == want.role);
        let adds = if same_role { want.cpus.difference(mine) } else { want.cpus.clone() };
        // What `k` itself holds does not stand in its own way.
        let own = self.roles.get(k).map(|r| (mine, r));
        let free_of_conflicts = !holders.blocks(&adds, &want.role, own);
        let parents_hold = match k {
            Key::Cgroup(path) => path.ancestors().into_iter().all(|a| {
                let a = Key::Cgroup(a);
                !self.after.contains_key(&a) || want.cpus.is_subset(self.current.get(&a).unwrap_or(&empty))
            }),
            _ => true,
        };
        free_of_conflicts && parents_hold
    }

    /// Memory nodes carry no exclusivity: set last, outermost first.
    fn set_mems(&mut self) {
        let (before, after) = (self.before, self.after);
        let mut mems: Vec<(&Key, &Placement)> = after
            .iter()
            .filter(|(k, p)| matches!(k, Key::Cgroup(_)) && before.get(*k).is_none_or(|b| b.mems != p.mems))
            .collect();
        mems.sort_by_key(|(k, _)| k.depth());
        for (k, p) in mems {
            if let Key::Cgroup(path) = k {
                self.effects.push(Effect::SetMems {
                    path: path.clone(),
                    mems: p.mems.clone(),
                    optional: p.role.optional(),
                });
            }
        }
    }

    /// CPU time limits once every set is in place.
    fn set_quotas(&mut self) {
        for (k, p) in self.after {
            if self.before.get(k).and_then(|b| b.quota) != p.quota {
                self.effects.push(Effect::SetQuota { key: k.clone(), millis: p.quota });
            }
        }
    }

    /// Partitions last, outermost first: a partition's CPUs must already be its own. Those torn
    /// down at the start are set up again.
    fn build_partitions(&mut self, torn: &[&Key]) {
        let before = self.before;
        let mut built: Vec<(&Key, &Partition)> = self
            .after
            .iter()
            .filter(|(k, p)| {
                p.partition != Partition::Member
                    && (torn.contains(k) || before.get(*k).is_none_or(|b| b.partition != p.partition))
            })
            .map(|(k, p)| (k, &p.partition))
            .collect();
        built.sort_by_key(|(k, _)| k.depth());
        for (k, partition) in built {
            if let Key::Cgroup(path) = k {
                self.effects.push(Effect::SetPartition { path: path.clone(), partition: partition.clone() });
            }
        }
    }
}

/// The partitions of `before` that go back to member on the way to `after`: those that change
/// or end, and every one below a parent whose grant changes. A container's own partition is
/// below no parent the planner grants from, so pool-level changes leave it standing.
pub(super) fn torn<'a>(before: &'a Layout, after: &Layout) -> Vec<&'a Key> {
    let changes =
        |k: &Key, p: &Placement| after.get(k).is_none_or(|a| a.partition != p.partition || a.cpus != p.cpus);
    let parents: Vec<&CgroupPath> = before
        .iter()
        .filter(|(k, p)| matches!(p.partition, Partition::Parent(_)) && changes(k, p))
        .filter_map(|(k, _)| match k {
            Key::Cgroup(c) => Some(c),
            _ => None,
        })
        .collect();
    let below = |k: &Key| match k {
        Key::Cgroup(c) => parents.iter().any(|up| c != *up && c.within(up)),
        _ => false,
    };
    before
        .iter()
        .filter(|(k, p)| p.partition != Partition::Member && (changes(k, p) || below(k)))
        .map(|(k, _)| k)
        .collect()
}

/// Every role a placement can have, as an index into [`Holders`] counts.
pub(super) const ROLES: [Role; 8] = [
    Role::Parent,
    Role::Pool(PoolKind::Reserved),
    Role::Pool(PoolKind::Exclusive),
    Role::Pool(PoolKind::Shared),
    Role::Host,
    Role::Unpooled,
    Role::Exclusive,
    Role::Shared,
];

/// `r`'s place in [`ROLES`]; a match, so that a new role cannot be forgotten there.
pub(super) fn role_index(r: &Role) -> usize {
    match r {
        Role::Parent => 0,
        Role::Pool(PoolKind::Reserved) => 1,
        Role::Pool(PoolKind::Exclusive) => 2,
        Role::Pool(PoolKind::Shared) => 3,
        Role::Host => 4,
        Role::Unpooled => 5,
        Role::Exclusive => 6,
        Role::Shared => 7,
    }
}

/// For each CPU, how many placements hold it under each role: the planner's answer to "does
/// anything conflicting hold one of these CPUs" in time proportional to the CPUs asked about.
#[derive(Default)]
struct Holders {
    counts: Vec<[u32; ROLES.len()]>,
}

impl Holders {
    fn add(&mut self, cpus: &CpuSet, role: &Role) {
        let r = role_index(role);
        for c in cpus.iter() {
            let c = c as usize;
            if self.counts.len() <= c {
                self.counts.resize(c + 1, [0; ROLES.len()]);
            }
            self.counts[c][r] += 1;
        }
    }

    fn remove(&mut self, cpus: &CpuSet, role: &Role) {
        let r = role_index(role);
        for c in cpus.iter() {
            if let Some(n) = self.counts.get_mut(c as usize) {
                n[r] = n[r].saturating_sub(1);
            }
        }
    }

    /// Whether a placement other than the asker (which holds `own`, under its role) holds one
    /// of `adds` under a role that conflicts with `role`.
    fn blocks(&self, adds: &CpuSet, role: &Role, own: Option<(&CpuSet, &Role)>) -> bool {
        let conflicting: Vec<usize> =
            ROLES.iter().enumerate().filter(|(_, r)| r.conflicts(role)).map(|(i, _)| i).collect();
        if conflicting.is_empty() {
            return false;
        }
        let own_role = own.map(|(_, r)| role_index(r));
        adds.iter().any(|c| {
            let Some(n) = self.counts.get(c as usize) else { return false };
            let mine = own.is_some_and(|(cpus, _)| cpus.contains(c));
            conflicting.iter().any(|&r| {
                let others = if mine && own_role == Some(r) { n[r].saturating_sub(1) } else { n[r] };
                others > 0
            })
        })
    }
}
