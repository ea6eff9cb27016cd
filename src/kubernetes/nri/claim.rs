//! Containers of DRA claims: a container the claim's CDI spec gave `CPUPOOL_CLAIM=<uid>` runs on
//! the CPUs the claim holds (its assignments `dra-<uid>-<n>`, booked at NodePrepareResources),
//! set in its CreateContainer adjustment, bound to its cgroup and read back at its start, and
//! held again for no container when it goes.
//!
//! ```text
//! CreateContainer: env CPUPOOL_CLAIM=<uid> ──► the snapshot's prepared claim (Snapshot::claim_for)
//!   pod uid among the claim's reservedFor? ──no──► no pool's CPUs, and a warning
//!   └─yes─► the CPUs of its assignments in the same snapshot ──► the adjustment
//! StartContainer (the snapshot's Snapshot::claim_start):
//!   its one assignment held for no container ──► bind.rs: bound to the container's cgroup,
//!       applied (an isolated pool's: a partition) and read back; a difference fails the start
//!   bound to another container's cgroup ──► the container's own cpuset.cpus.effective read
//!       back (Handle::enforced) against the claim's CPUs
//!   several assignments (one cgroup is the target of one) ──► read back so, then by the
//!       engine (Handle::running), which records the container running on all of them
//! Stop/RemoveContainer, or gone while cpupoold was away (unbind):
//!   bound to its cgroup, another started container of the claim runs ──► bound to that one
//!       (the survivor), read back
//!   bound to its cgroup, none runs ──► retargeted to kubelet:dra-<uid>-<n>: held (allocated),
//!       until unprepared
//!   several assignments ──► the container no longer runs on them (Handle::stopped)
//! ```
//!
//! A pod's author writes its containers' environment too, so the name alone is not trusted: the
//! claim must be reserved for the container's pod. Several containers (of the pods it is
//! reserved for) may share one claim; its CPUs stay held until NodeUnprepareResources, whatever
//! its containers do, so a container's stop releases nothing. An isolated claim's CPUs, bound
//! to a container that the kernel made a partition, are that container's alone: a second
//! container of the claim cannot have them while the first runs, and its start fails saying so.

use std::collections::HashMap;

use super::bind::owner_of;
use super::context::{env_of, name_of, Call, Held, Seen};
use super::proto as api;
use super::ttrpc::{code, Status};
use crate::core::cpuset::CpuSet;
use crate::core::state::{AssignmentId, CgroupPath, Container as Owner, Target};
use crate::engine::{AtStart, ClaimFor, Snapshot};
use crate::error_chain;

/// The claim container `c` of `pod` names, if it names one that is its pod's; `who` names the
/// container in what is said.
pub(super) fn held_for(
    snap: &Snapshot,
    pod: &api::PodSandbox,
    c: &api::Container,
    who: &str,
) -> Result<Option<Held>, Status> {
    let Some(uid) = env_of(c, cpupool_wire::names::ENV_CLAIM) else { return Ok(None) };
    match snap.claim_for(uid, &pod.uid) {
        ClaimFor::Held(held) => Ok(Some(held)),
        ClaimFor::Refused(why) => {
            log::warn!("NRI: container {who} names a DRA claim in its environment, but {why}: it gets none of its CPUs");
            Ok(None)
        }
        ClaimFor::Lost(why) => {
            Err(Status::new(code::FAILED_PRECONDITION, format!("cpupoold: container {who}: {why}")))
        }
    }
}

/// Why a container of `held` whose cgroup holds `now` cannot start; `bound`: the cgroup the
/// claim is bound to, `isolated`: whether it is of an isolated pool.
pub(super) fn refusal(
    who: &str,
    held: &Held,
    now: &CpuSet,
    bound: Option<&CgroupPath>,
    isolated: bool,
) -> String {
    let why = match bound {
        Some(p) if isolated => format!(
            "an isolated claim's CPUs go to one container at a time: they are bound to {p}, the \
             isolated partition of its container where the kernel has cpuset.cpus.exclusive (give \
             each container its own claim)"
        ),
        Some(p) => format!("they are bound to {p}, and the kernel does not let this cgroup have them too"),
        None => format!(
            "a claim of {} devices is bound to no container (a cgroup is the target of one assignment), \
             and the kernel does not give these CPUs to its cgroup",
            held.ids.len()
        ),
    };
    format!(
        "cpupoold: container {who} would not run on the CPUs of claim {}: its cgroup has CPUs {now}, not {}: {why}",
        held.name, held.cpus
    )
}

/// StartContainer of claim container `c` of `pod` (module docs): a difference between what the
/// kernel gives it and the claim's CPUs fails the start.
pub(super) async fn start(
    call: &Call<'_>,
    pod: &api::PodSandbox,
    c: &api::Container,
    held: &Held,
    cgroup: Option<CgroupPath>,
) -> Result<(), Status> {
    let who = name_of(pod, c);
    let Some(cgroup) = cgroup else {
        log::warn!("NRI: container {who} has no cgroup cpupoold can name; claim {} stays unbound", held.name);
        return Ok(());
    };
    let snap = call.handle.snapshot();
    let bound = match snap.claim_start(held, &cgroup) {
        AtStart::Bind(id) => {
            let what = format!("claim {} ({id})", held.name);
            return super::bind::bind(call, pod, c, &id, cgroup, &what).await;
        }
        AtStart::Bound => return Ok(()),
        AtStart::Lost(why) => {
            return Err(Status::new(code::FAILED_PRECONDITION, format!("cpupoold: container {who}: {why}")))
        }
        AtStart::ReadBack(bound) => bound,
    };
    let isolated = snap.any_isolated(&held.ids);
    match call.within(call.handle.enforced(cgroup.clone())).await {
        Some(Ok(Some(now))) if now != held.cpus => {
            Err(Status::new(code::FAILED_PRECONDITION, refusal(&who, held, &now, bound.as_ref(), isolated)))
        }
        Some(Ok(_)) => {
            if bound.is_none() {
                running(call, &who, held, &cgroup, owner_of(pod, c)).await?;
            }
            log::info!(
                "NRI: container {who} starts on CPUs {} of claim {}, read back from {cgroup}{}",
                held.cpus,
                held.name,
                bound.map(|p| format!(" (the claim is bound to {p})")).unwrap_or_default()
            );
            Ok(())
        }
        Some(Err(e)) => Err(Status::new(
            code::UNAVAILABLE,
            format!("cpupoold: container {who}: reading back its cgroup {cgroup}: {}", error_chain(&e)),
        )),
        None => {
            log::warn!("NRI: reading back container {who} took longer than {:?}", call.budget);
            Ok(())
        }
    }
}

/// A claim of several devices, read back in container `who`'s `cgroup`: the engine reads it
/// back again and records the container running on all of its assignments (they read
/// `applied`). A read-back that no longer holds fails the start, as a bind's does.
async fn running(
    call: &Call<'_>,
    who: &str,
    held: &Held,
    cgroup: &CgroupPath,
    owner: Owner,
) -> Result<(), Status> {
    match call.within(call.handle.running(held.ids.clone(), cgroup.clone(), owner)).await {
        Some(Ok(true)) => Ok(()),
        Some(Ok(false)) => Err(Status::new(
            code::FAILED_PRECONDITION,
            format!(
                "cpupoold: container {who} would not run on the CPUs of claim {}: its cgroup {cgroup} does not hold CPUs {}",
                held.name, held.cpus
            ),
        )),
        Some(Err(e)) => Err(Status::new(
            code::UNAVAILABLE,
            format!("cpupoold: container {who}: recording it on claim {}: {}", held.name, error_chain(&e)),
        )),
        None => {
            log::warn!("NRI: recording container {who} on claim {} took longer than {:?}", held.name, call.budget);
            Ok(())
        }
    }
}

/// Synchronize: the containers read back on claims' CPUs before this connection (or this
/// process) are taken on no trust; those the runtime still runs (`live`, started) were read
/// back again as it synchronized.
pub(super) async fn alive(call: &Call<'_>, live: &HashMap<String, Seen>) {
    let running = live.values().filter(|s| s.started).filter_map(|s| s.cgroup.clone()).collect();
    if let Some(Err(e)) = call.within(call.handle.alive(running)).await {
        log::warn!("NRI: recording the containers that run: {}", error_chain(&e));
    }
}

/// The started container of `live` other than those `gone` names that runs on the claim whose
/// one assignment is `id`: its cgroup and name.
fn survivor<'a>(
    live: &'a HashMap<String, Seen>,
    id: &AssignmentId,
    gone: &impl Fn(&CgroupPath) -> bool,
) -> Option<(&'a CgroupPath, &'a Owner)> {
    live.values()
        .filter(|s| {
            s.started && s.claim.as_ref().is_some_and(|h| h.ids.as_slice() == std::slice::from_ref(id))
        })
        .find_map(|s| s.cgroup.as_ref().filter(|p| !gone(p)).map(|p| (p, &s.owner)))
}

/// StopContainer, RemoveContainer, and containers gone while cpupoold was away: the claims'
/// assignments bound to the cgroups `gone` names are bound to another started container of
/// the claim in `live` (a survivor) if one runs, read back as at a start; else held again for
/// no container (`kubelet:<id>`, allocated), as NodePrepareResources left them: the claim
/// keeps its CPUs until NodeUnprepareResources, they leave the container's partition, and a
/// later container of the claim binds them again. `why` says what happened.
pub(super) async fn unbind(
    call: &Call<'_>,
    live: &HashMap<String, Seen>,
    gone: impl Fn(&CgroupPath) -> bool,
    why: &str,
) {
    for id in call.handle.snapshot().claims_bound_to_gone(&gone) {
        if let Some((cgroup, owner)) = survivor(live, &id, &gone) {
            let target = Target::Cgroup(cgroup.clone());
            match call.within(call.handle.bind(id.as_str(), target, Some(owner.clone()))).await {
                Some(Ok(_)) => {
                    log::info!(
                        ASSIGNMENT = id.as_str();
                        "NRI: {id} is bound to container {owner} ({cgroup}), which runs on its claim's CPUs: {why}"
                    );
                    continue;
                }
                Some(Err(e)) => {
                    log::warn!(
                        "NRI: binding {id} to container {owner}, which runs on it: {}",
                        error_chain(&e)
                    )
                }
                None => {
                    log::warn!("NRI: binding {id} to container {owner} took longer than {:?}", call.budget)
                }
            }
        }
        let held = Target::Kubelet(id.to_string());
        match call.within(call.handle.retarget(id.as_str(), held, None)).await {
            Some(Ok(a)) => {
                let a = a.into_inner();
                log::info!(
                    POOL = a.pool.as_str(), ASSIGNMENT = id.as_str();
                    "NRI: {id} (CPUs {} of pool {}) is held for its claim again: {why}", a.cpus, a.pool
                )
            }
            Some(Err(e)) => log::warn!("NRI: holding {id} for its claim again ({why}): {}", error_chain(&e)),
            None => log::warn!("NRI: holding {id} for its claim again took longer than {:?}", call.budget),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::view::at_start;

    fn held(id: &str, cpus: &str) -> (AssignmentId, CpuSet) {
        (
            AssignmentId::new(id).unwrap_or_else(|e| panic!("{e}")),
            CpuSet::parse(cpus).unwrap_or_else(|e| panic!("{e}")),
        )
    }

    fn cgroup(p: &str) -> CgroupPath {
        CgroupPath::new(p).unwrap_or_else(|e| panic!("{e}"))
    }

    fn claim_of(ids: &[&str], cpus: &str) -> Held {
        Held {
            name: "team/c".into(),
            ids: ids.iter().map(|i| held(i, "0").0).collect(),
            cpus: CpuSet::parse(cpus).unwrap_or_else(|e| panic!("{e}")),
        }
    }

    #[test]
    fn a_claims_one_assignment_binds_to_its_first_container_and_the_others_read_back() {
        let one = claim_of(&["dra-u1-0"], "1-2");
        let (mine, other) = (cgroup("kubepods.slice/a.scope"), cgroup("kubepods.slice/b.scope"));
        let at = |t: Target| at_start(&one, &mine, move |_: &AssignmentId| Some(t.clone()));
        let id = held("dra-u1-0", "0").0;
        assert_eq!(at(Target::Kubelet("dra-u1-0".into())), AtStart::Bind(id));
        assert_eq!(at(Target::Cgroup(mine.clone())), AtStart::Bound);
        assert_eq!(at(Target::Cgroup(other.clone())), AtStart::ReadBack(Some(other.clone())));
        // Released behind the claim's back: the container does not start.
        let lost = at_start(&one, &mine, |_: &AssignmentId| None);
        assert!(matches!(&lost, AtStart::Lost(w) if w.contains("dra-u1-0 of claim team/c")), "{lost:?}");
        // Two assignments cannot both be the target of one cgroup: read back, bound to none.
        let two = claim_of(&["dra-u1-0", "dra-u1-1"], "1-2,41");
        let kubelet = |id: &AssignmentId| Some(Target::Kubelet(id.to_string()));
        assert_eq!(at_start(&two, &mine, kubelet), AtStart::ReadBack(None));

        let now = CpuSet::parse("3-9").unwrap_or_else(|e| panic!("{e}"));
        let isolated = refusal("default/p/b", &one, &now, Some(&other), true);
        assert!(
            isolated.starts_with("cpupoold: container default/p/b would not run on the CPUs of claim team/c")
        );
        assert!(isolated.contains("an isolated claim's CPUs go to one container at a time"), "{isolated}");
        assert!(isolated.contains("bound to kubepods.slice/b.scope"), "{isolated}");
        assert!(refusal("x", &two, &now, None, false).contains("a claim of 2 devices"));
    }
}
