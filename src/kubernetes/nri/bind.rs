//! Binding at StartContainer: an assignment's target becomes the starting container's cgroup
//! through the engine's [`Handle::bind`](crate::engine::Handle::bind), which applies it (an
//! isolated pool's container becomes an isolated partition where the kernel has
//! `cpuset.cpus.exclusive`), reads back what the kernel enforces and keeps the binding only if
//! it holds the CPUs. Shared by device-plugin containers (plugin.rs) and the containers of DRA
//! claims (claim.rs).
//!
//! ```text
//! StartContainer ─► bind(id, cgroup, owner) ─► engine: retarget → apply → read back
//!   read back holds ──► Ok: the container starts on the CPUs
//!   it does not     ──► `cpupoold: container ... would not run on the CPUs of ...`: not started
//!   no answer in time ► Ok (the adjustment gave it the CPUs; the binding completes)
//! ```

use super::context::{name_of, Call};
use super::proto as api;
use super::ttrpc::{code, Status};
use crate::core::state::{AssignmentId, CgroupPath, Container as Owner, Target};
use crate::error_chain;

/// Container `c` of `pod`, as an assignment records the container it serves.
pub(super) fn owner_of(pod: &api::PodSandbox, c: &api::Container) -> Owner {
    Owner { namespace: pod.namespace.clone(), pod: pod.name.clone(), name: c.name.clone() }
}

/// Points `id` at the cgroup of container `c` of `pod` and reads it back; `what` names the
/// CPUs in what is said (the assignment, or the claim it serves).
pub(super) async fn bind(
    call: &Call<'_>,
    pod: &api::PodSandbox,
    c: &api::Container,
    id: &AssignmentId,
    cgroup: CgroupPath,
    what: &str,
) -> Result<(), Status> {
    let who = name_of(pod, c);
    let target = Target::Cgroup(cgroup);
    match call.within(call.handle.bind(id.as_str(), target.clone(), Some(owner_of(pod, c)))).await {
        Some(Ok(a)) => {
            let a = a.into_inner();
            log::info!(
                POOL = a.pool.as_str(), ASSIGNMENT = id.as_str(), TARGET = target.to_string().as_str(),
                POD = pod.name.as_str(), NAMESPACE = pod.namespace.as_str(), CONTAINER = c.name.as_str();
                "NRI: container {who} starts on CPUs {} of pool {} ({what}), read back from {target}", a.cpus, a.pool
            );
            Ok(())
        }
        Some(Err(e)) => Err(Status::new(
            code::FAILED_PRECONDITION,
            format!("cpupoold: container {who} would not run on the CPUs of {what}: {}", error_chain(&e)),
        )),
        None => {
            log::warn!(
                "NRI: binding {what} to container {who} took longer than {:?}; it completes in the engine",
                call.budget
            );
            Ok(())
        }
    }
}
