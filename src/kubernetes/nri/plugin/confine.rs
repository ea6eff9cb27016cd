//! Keeping unpooled containers and pod sandboxes off the exclusive CPUs, only in cgroups
//! cpupoold may write, and releasing what containers gone while we were away held.

use std::collections::BTreeSet;

use super::{Call, Live};
use crate::core::state::{AssignmentId, CgroupPath};
use crate::error_chain;

/// Gives the engine the cgroups to keep off the exclusive CPUs (pod sandboxes and started
/// containers without a pool) when they changed.
pub(super) async fn confine(live: &mut Live, call: &Call<'_>) {
    let sandboxes = live.sandboxes.iter().map(|(id, cg)| (format!("pod sandbox {id}"), cg.clone()));
    let containers = live
        .containers
        .iter()
        .filter(|(_, s)| s.started && s.assignment.is_none() && s.claim.is_none())
        .filter_map(|(id, s)| Some((format!("container {id}"), s.cgroup.clone()?)));
    let candidates: Vec<(String, CgroupPath)> = sandboxes.chain(containers).collect();
    let snap = call.handle.snapshot();
    let mut want = BTreeSet::new();
    for (what, cg) in candidates {
        if ours(live, &snap, &cg, &AssignmentId::none(), &what).is_ok() {
            want.insert(cg);
        }
    }
    // Said once while a container or sandbox there lives.
    let live_cgroups: BTreeSet<CgroupPath> = live
        .sandboxes
        .values()
        .chain(live.containers.values().filter_map(|s| s.cgroup.as_ref()))
        .cloned()
        .collect();
    live.refused.retain(|p| live_cgroups.contains(p));
    if want == live.unpooled {
        return;
    }
    match call.within(call.handle.set_unpooled(want.clone())).await {
        Some(Ok(_)) => live.unpooled = want,
        Some(Err(e)) => log::warn!(
            "NRI: keeping {} container(s) and pod sandbox(es) off the exclusive CPUs: {}",
            want.len(),
            error_chain(&e)
        ),
        None => {
            log::warn!("NRI: keeping containers off the exclusive CPUs took longer than {:?}", call.budget)
        }
    }
}

/// Whether cpupoold may write CPUs into `cgroup`, the cgroup of `what`: the rules a `cgroup:`
/// assignment target passes (no host slice, `init.scope`, `cpupool.slice`, pool slice or
/// ancestor of one, nor a cgroup nested with the target of an assignment other than
/// `except`). A refusal is said once per cgroup while something there lives, and answered
/// with its reason.
pub(super) fn ours(
    live: &mut Live,
    snap: &crate::engine::Snapshot,
    cgroup: &CgroupPath,
    except: &AssignmentId,
    what: &str,
) -> Result<(), String> {
    let Err(reason) = snap.may_confine(cgroup, except) else { return Ok(()) };
    if live.refused.insert(cgroup.clone()) {
        log::warn!(
            "NRI: not confining `{cgroup}` ({what}) to any pool's CPUs: {reason}. It runs where the runtime put it."
        );
    }
    Err(reason)
}

/// Releases the kubelet assignments bound to a container cgroup that no live container has
/// (the container went while cpupoold was not connected). `listed` is every cgroup the runtime
/// says a container lives in, including those whose devices could not be learnt (the kubelet's
/// PodResources not answering, as while it restarts): theirs are kept.
pub(super) async fn release_orphans(live: &Live, call: &Call<'_>, listed: &BTreeSet<CgroupPath>) {
    let alive: BTreeSet<&CgroupPath> =
        live.containers.values().filter_map(|s| s.cgroup.as_ref()).chain(listed.iter()).collect();
    super::super::claim::unbind(call, &live.containers, |p| !alive.contains(p), "its container is gone")
        .await;
    for id in call.handle.snapshot().kubelet_orphans(|p| alive.contains(p)) {
        match call.within(call.handle.release(id.as_str())).await {
            Some(Ok(a)) => log::info!(
                POOL = a.pool.as_str(), ASSIGNMENT = id.as_str();
                "NRI: released {id} (CPUs {} of pool {}): its container {} is gone", a.cpus, a.pool, a.target
            ),
            Some(Err(e)) => log::warn!("NRI: releasing {id}, whose container is gone: {}", error_chain(&e)),
            None => log::warn!("NRI: releasing {id} took longer than {:?}", call.budget),
        }
    }
}
