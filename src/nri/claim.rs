//! Containers of DRA claims: a container the claim's CDI spec gave `CPUPOOL_CLAIM=<uid>` runs on
//! the CPUs the claim holds (its assignments `dra-<uid>-<n>`, booked at NodePrepareResources),
//! set in its CreateContainer adjustment.
//!
//! ```text
//! env CPUPOOL_CLAIM=<uid> ──► <state_dir>/dra/<uid>.json (host::kubelet::claims)
//!   pod uid among the claim's reservedFor? ──no──► no pool's CPUs, and a warning
//!   └─yes─► the CPUs of its assignments in the engine's snapshot ──► the adjustment
//! ```
//!
//! A pod's author writes its containers' environment too, so the name alone is not trusted: the
//! claim must be reserved for the container's pod. Several containers (of the pods it is
//! reserved for) may share one claim; its CPUs stay held until NodeUnprepareResources, whatever
//! its containers do, so a container's stop releases nothing.

use super::proto as api;
use super::ttrpc::{code, Status};
use super::Options;
use crate::core::cpuset::CpuSet;
use crate::core::state::AssignmentId;
use crate::engine::Snapshot;
use crate::host::kubelet::claims::{Claims, PreparedClaim};

/// What a container naming claim `uid` gets.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Claimed {
    /// The claim's CPUs.
    Cpus(CpuSet),
    /// Nothing of the claim's (said why): it is not prepared here, or not the pod's.
    Refused(String),
    /// The claim is the pod's, but its CPUs are not all held: the container is not created.
    Lost(String),
}

/// What the container of pod `pod_uid` naming a claim recorded as `rec` gets.
pub(super) fn decide(
    rec: Option<&PreparedClaim>,
    uid: &str,
    pod_uid: &str,
    held: impl Fn(&AssignmentId) -> Option<CpuSet>,
) -> Claimed {
    let Some(rec) = rec else {
        return Claimed::Refused(format!("claim {uid} is not prepared on this node"));
    };
    if !rec.pods.iter().any(|p| p == pod_uid) {
        return Claimed::Refused(format!(
            "claim {}/{} ({uid}) is not reserved for its pod {pod_uid}",
            rec.namespace, rec.name
        ));
    }
    let mut cpus = CpuSet::new();
    for id in &rec.assignments {
        match held(id) {
            Some(c) => cpus = cpus.union(&c),
            None => {
                return Claimed::Lost(format!(
                    "{id} of claim {}/{} is no longer held",
                    rec.namespace, rec.name
                ))
            }
        }
    }
    Claimed::Cpus(cpus)
}

/// The CPUs of the claim container `c` of `pod` names, if it names one that is its pod's;
/// `who` names the container in what is said.
pub(super) fn cpus_for(
    opts: &Options,
    snap: &Snapshot,
    pod: &api::PodSandbox,
    c: &api::Container,
    who: &str,
) -> Result<Option<CpuSet>, Status> {
    let Some(uid) = super::plugin::env_of(c, cpupool_wire::names::ENV_CLAIM) else { return Ok(None) };
    let rec = Claims::new(&opts.state_dir).load(uid).map_err(|e| {
        Status::new(code::UNAVAILABLE, format!("cpupoold: container {who}: {}", crate::error_chain(&e)))
    })?;
    let held = |id: &AssignmentId| snap.state.assignments().get(id).map(|a| a.cpus.clone());
    match decide(rec.as_ref(), uid, &pod.uid, held) {
        Claimed::Cpus(cpus) => Ok(Some(cpus)),
        Claimed::Refused(why) => {
            log::warn!("NRI: container {who} names a DRA claim in its environment, but {why}: it gets none of its CPUs");
            Ok(None)
        }
        Claimed::Lost(why) => {
            Err(Status::new(code::FAILED_PRECONDITION, format!("cpupoold: container {who}: {why}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn held(id: &str, cpus: &str) -> (AssignmentId, CpuSet) {
        (
            AssignmentId::new(id).unwrap_or_else(|e| panic!("{e}")),
            CpuSet::parse(cpus).unwrap_or_else(|e| panic!("{e}")),
        )
    }

    #[test]
    fn only_the_pods_a_claim_is_reserved_for_get_its_cpus() {
        let rec = PreparedClaim {
            uid: "u1".into(),
            namespace: "team".into(),
            name: "c".into(),
            assignments: vec![held("dra-u1-0", "1").0, held("dra-u1-1", "9").0],
            pods: vec!["pod-a".into(), "pod-b".into()],
            devices: vec![],
        };
        let all: BTreeMap<_, _> = [held("dra-u1-0", "1"), held("dra-u1-1", "9")].into_iter().collect();
        let all = |id: &AssignmentId| all.get(id).cloned();
        let both = Claimed::Cpus(CpuSet::parse("1,9").unwrap_or_else(|e| panic!("{e}")));
        // Two pods share the claim; each gets all of its CPUs.
        assert_eq!(decide(Some(&rec), "u1", "pod-a", all), both);
        assert_eq!(decide(Some(&rec), "u1", "pod-b", all), both);
        // Another pod naming it in its environment gets nothing.
        let other = decide(Some(&rec), "u1", "pod-x", all);
        assert!(
            matches!(&other, Claimed::Refused(w) if w.contains("not reserved for its pod pod-x")),
            "{other:?}"
        );
        // A claim not prepared here.
        assert!(matches!(decide(None, "u9", "pod-a", all), Claimed::Refused(_)));
        // CPUs released behind the claim's back: the container is not created.
        let some: BTreeMap<_, _> = [held("dra-u1-0", "1")].into_iter().collect();
        let some = |id: &AssignmentId| some.get(id).cloned();
        assert!(
            matches!(decide(Some(&rec), "u1", "pod-a", some), Claimed::Lost(w) if w.contains("dra-u1-1"))
        );
    }
}
