//! What the plugin's parts share: a call's context (the engine, the options, the kubelet's
//! PodResources and the time left to answer the runtime), the plugin's record of a container
//! it has seen alive, and the claim such a container holds. `plugin.rs` dispatches the
//! runtime's requests and keeps the record; `bind.rs` binds at StartContainer; `claim.rs`
//! decides for the containers of DRA claims. Each takes these from here, so none of them
//! imports another that imports it back.

use std::future::Future;
use std::time::Duration;

use super::proto as api;
use super::Options;
use crate::core::state::{AssignmentId, CgroupPath, Container as Owner};
use crate::engine::{EngineError, Handle};
use crate::kubernetes::grpc::clients;

/// The engine, with the time left to answer the runtime.
pub(super) struct Call<'a> {
    pub(super) handle: &'a Handle,
    pub(super) opts: &'a Options,
    pub(super) kubelet: &'a clients::PodResources,
    pub(super) budget: Duration,
}

impl Call<'_> {
    /// `f`'s answer, or `None` once the budget is spent.
    pub(super) async fn within<T>(
        &self,
        f: impl Future<Output = Result<T, EngineError>>,
    ) -> Option<Result<T, EngineError>> {
        tokio::time::timeout(self.budget, f).await.ok()
    }
}

/// The value of `key` in the container's environment (the last entry wins, as in the process).
pub(super) fn env_of<'a>(c: &'a api::Container, key: &str) -> Option<&'a str> {
    c.env.iter().rev().filter_map(|e| e.split_once('=')).find(|(k, _)| *k == key).map(|(_, v)| v)
}

/// `namespace/pod/container`, as the kubelet names a container.
pub(super) fn name_of(pod: &api::PodSandbox, c: &api::Container) -> String {
    format!("{}/{}/{}", pod.namespace, pod.name, c.name)
}

/// A container seen alive.
#[derive(Debug, Clone)]
pub(super) struct Seen {
    /// Its name, as the kubelet's.
    pub(super) owner: Owner,
    /// Its cgroup, from the runtime's `cgroups_path`.
    pub(super) cgroup: Option<CgroupPath>,
    /// The assignment it runs on; `None`: no pool.
    pub(super) assignment: Option<AssignmentId>,
    /// Whether it was started.
    pub(super) started: bool,
    /// The DRA claim it runs on (held until the claim is unprepared).
    pub(super) claim: Option<Held>,
}

/// The claim a container runs on, as found at its creation (the snapshot's answer).
pub(super) use crate::engine::ClaimHeld as Held;
