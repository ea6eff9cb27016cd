//! The planner as it was before it indexed who holds which CPU: an oracle for the property
//! test that the indexed one plans exactly the same effects in the same order.

use std::collections::BTreeMap;

use super::super::{CpuSet, Effect, Key, Layout, Partition, Placement, Role};

/// [`plan`] as it was before its grow phase had an index: each step walked every placement.
pub(super) fn plan(before: &Layout, after: &Layout) -> Vec<Effect> {
    let mut effects = Vec::new();

    // Partitions that change at all go back to member first, innermost first; when the parent's
    // grant changes, every partition below it goes too.
    let mut torn = super::super::torn(before, after);
    torn.sort_by_key(|k| std::cmp::Reverse(k.depth()));
    for k in &torn {
        if let Key::Cgroup(path) = k {
            effects.push(Effect::SetPartition { path: path.clone(), partition: Partition::Member });
        }
    }
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
            if before[k].quota.is_some() {
                effects.push(Effect::SetQuota { key: k.clone(), millis: None });
            }
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
                optional: new.role.optional(),
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
                    optional: want.role.optional(),
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
                    optional: after[k].role.optional(),
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
                optional: p.role.optional(),
            });
        }
    }

    // CPU time limits once every set is in place.
    for (k, p) in after {
        if before.get(k).and_then(|b| b.quota) != p.quota {
            effects.push(Effect::SetQuota { key: k.clone(), millis: p.quota });
        }
    }

    // Partitions last, outermost first: a partition's CPUs must already be its own.
    let mut built: Vec<(&Key, &Partition)> = after
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
            effects.push(Effect::SetPartition { path: path.clone(), partition: partition.clone() });
        }
    }
    effects
}
