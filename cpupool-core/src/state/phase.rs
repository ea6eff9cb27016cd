//! What an assignment's CPUs do now: booked for a container that does not run on them
//! (`allocated`), enforced on the target as read back (`applied`), or not (`degraded`).

use super::{Assignment, Target};

/// What an assignment's CPUs do now, as the APIs, the metrics and `Monitor` say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase<'a> {
    /// Booked for a container the kubelet allocated them to (the device plugin's `Allocate`,
    /// a prepared DRA claim) that does not run on them yet: no cgroup has them, nothing
    /// enforces them.
    Allocated,
    /// The kernel enforces them on the target, as read back after they were written (a
    /// kubelet allocation: in its container's cgroup, as the container starts).
    Applied,
    /// The kernel does not enforce them on the target, and correcting it failed (why).
    Degraded(&'a str),
}

impl Phase<'_> {
    /// `allocated`, `applied` or `degraded`, as the APIs spell it.
    pub fn as_str(&self) -> &'static str {
        match self {
            Phase::Allocated => "allocated",
            Phase::Applied => "applied",
            Phase::Degraded(_) => "degraded",
        }
    }

    /// Why it is degraded; empty otherwise.
    pub fn reason(&self) -> &str {
        match self {
            Phase::Degraded(why) => why,
            _ => "",
        }
    }
}

impl Assignment {
    /// Its phase: `health` is why the kernel does not enforce it, if it does not (the drift
    /// check's finding); `running` whether a container was read back running on its CPUs
    /// although its target is none (a claim of several devices: one cgroup, the target of
    /// none of them). A `kubelet:` target is a booking: allocated until a container runs on it.
    pub fn phase<'a>(&self, health: Option<&'a str>, running: bool) -> Phase<'a> {
        match (health, &self.target) {
            (Some(why), _) => Phase::Degraded(why),
            (None, Target::Kubelet(_)) if !running => Phase::Allocated,
            _ => Phase::Applied,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpuset::CpuSet;
    use crate::pool::{PoolKind, PoolName};
    use crate::state::AssignmentId;

    fn to(target: &str) -> Assignment {
        Assignment {
            id: AssignmentId::new("kubelet-core-2").unwrap_or_else(|e| panic!("{e}")),
            pool: PoolName::new("dp").unwrap_or_else(|e| panic!("{e}")),
            kind: PoolKind::Exclusive,
            target: Target::parse(target).unwrap_or_else(|e| panic!("{e}")),
            cpus: CpuSet::parse("2,10").unwrap_or_else(|e| panic!("{e}")),
            millicpus: 2000,
            reclaim: true,
            process_start: None,
            container: None,
        }
    }

    #[test]
    fn a_booking_is_allocated_until_a_container_runs_on_it() {
        let booked = to("kubelet:core-2");
        assert_eq!(booked.phase(None, false), Phase::Allocated);
        assert_eq!(booked.phase(None, false).as_str(), "allocated");
        // A claim of several devices, read back in the container that runs on it.
        assert_eq!(booked.phase(None, true), Phase::Applied);
        let bound = to("cgroup:kubepods.slice/a.scope");
        assert_eq!(bound.phase(None, false), Phase::Applied);
        let degraded = bound.phase(Some("EBUSY"), false);
        assert_eq!((degraded.as_str(), degraded.reason()), ("degraded", "EBUSY"));
        assert_eq!(Phase::Applied.reason(), "");
        assert_eq!(to("unit:a.service").phase(None, false), Phase::Applied);
    }
}
