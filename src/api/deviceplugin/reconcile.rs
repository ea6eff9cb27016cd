//! Reconciliation with the kubelet's view: which container holds which of our devices
//! (PodResources `List`), which cgroup that container has (the runtime's CRI `ListContainers`
//! for its pod UID and id, then the cgroup tree), and what the engine must change:
//!
//! - a kubelet assignment whose devices a container holds is pointed at that container's
//!   cgroup (`engine.retarget`), and the engine applies its CPUs there;
//! - one whose devices no container holds is released once that has lasted
//!   `kubelet.release_grace_ms` (a kubelet that cannot be asked releases nothing);
//! - every other running container of the kubelet's (one holding none of our devices) is kept
//!   off the exclusive pools' CPUs (`kubelet.confine_unpooled`, `engine.set_unpooled`), as the
//!   kubelet's static CPU manager keeps its shared pool off exclusively allocated CPUs.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use super::proto::{cri, podresources};
use super::server::Shared;
use super::{devices, host, unix_channel, Options};
use crate::core::cpuset::CpuSet;
use crate::core::state::{CgroupPath, Container, Target};
use crate::engine::{error_chain, Handle};

/// Running containers by (namespace, pod, container name): (pod UID, container id).
type Containers = HashMap<(String, String, String), (String, String)>;

/// Who holds one allocation.
#[derive(Debug, Clone)]
pub(super) struct Holder {
    namespace: String,
    pod: String,
    container: String,
    devices: BTreeSet<String>,
}

/// A gRPC channel to the kubelet's or the runtime's `socket`, the error in words.
async fn channel(socket: &Path) -> Result<tonic::transport::Channel, String> {
    unix_channel(socket.to_owned()).await.map_err(|e| error_chain(&e))
}

/// The answer to a call to the kubelet or the runtime, waited for at most 5 s; the error in
/// words.
async fn answer<T>(
    call: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, String> {
    tokio::time::timeout(std::time::Duration::from_secs(5), call)
        .await
        .map_err(|_| "no answer within 5 s".to_owned())?
        .map(tonic::Response::into_inner)
        .map_err(|s| format!("{}: {}", s.code(), s.message()))
}

/// The kubelet's PodResources `List`.
pub(super) async fn pod_resources(socket: &Path) -> Result<podresources::ListPodResourcesResponse, String> {
    let mut client =
        podresources::pod_resources_lister_client::PodResourcesListerClient::new(channel(socket).await?);
    answer(client.list(podresources::ListPodResourcesRequest {})).await
}

/// The CPUs the kubelet's CPU manager allocates from (PodResources `GetAllocatableResources`).
async fn allocatable_cpus(socket: &Path) -> Result<CpuSet, String> {
    let mut client =
        podresources::pod_resources_lister_client::PodResourcesListerClient::new(channel(socket).await?);
    let reply =
        answer(client.get_allocatable_resources(podresources::AllocatableResourcesRequest {})).await?;
    Ok(reply.cpu_ids.into_iter().filter_map(|c| u32::try_from(c).ok()).collect())
}

/// Who holds which allocation, by assignment id (`kubelet-<first device>`). The kubelet lists a
/// container's devices one `ContainerDevices` entry per device (and per NUMA node of it), so
/// the entries of one container and resource are gathered into the one allocation its
/// Allocate made.
pub(super) fn holders(list: podresources::ListPodResourcesResponse, prefix: &str) -> HashMap<String, Holder> {
    let mut held: BTreeMap<(String, String, String, String), BTreeSet<String>> = BTreeMap::new();
    for pod in list.pod_resources {
        for c in pod.containers {
            for d in c.devices.into_iter().filter(|d| d.resource_name.starts_with(prefix)) {
                held.entry((pod.namespace.clone(), pod.name.clone(), c.name.clone(), d.resource_name))
                    .or_default()
                    .extend(d.device_ids);
            }
        }
    }
    held.into_iter()
        .filter_map(|((namespace, pod, container, _), devices)| {
            let id = format!("{}{}", devices::ID_PREFIX, devices::first_device(&devices)?);
            Some((id, Holder { namespace, pod, container, devices }))
        })
        .collect()
}

/// The reconciler's memory between rounds.
pub(super) struct Reconciler {
    opts: Options,
    shared: Arc<Shared>,
    /// Kubelet assignments no container holds, since when.
    missing: HashMap<String, Instant>,
    /// Whether the last PodResources call failed (logged once per outage).
    unreachable: bool,
    /// Whether the kubelet was found absent (no PodResources socket) and that was said.
    absent: bool,
    /// Pool CPUs the kubelet's CPU manager may hand out exclusively, as last logged.
    cpu_manager_conflict: CpuSet,
}

impl Reconciler {
    pub(super) fn new(opts: Options, shared: Arc<Shared>) -> Reconciler {
        Reconciler {
            opts,
            shared,
            missing: HashMap::new(),
            unreachable: false,
            absent: false,
            cpu_manager_conflict: CpuSet::new(),
        }
    }

    /// Says (once per change) when the kubelet's CPU manager may give pool CPUs to containers
    /// exclusively: its `GetAllocatableResources` CPUs are those the static policy allocates
    /// from (all but `reservedSystemCPUs`); the `none` policy reports none. Set up that way at
    /// start, the plugin refuses to start (`cpu_manager_state`); this notices a kubelet changed
    /// to the static policy while cpupoold runs.
    async fn check_cpu_manager(&mut self, handle: &Handle) {
        let Ok(allocatable) = allocatable_cpus(&self.opts.pod_resources_socket()).await else { return };
        let snap = handle.snapshot();
        let pools: Vec<&crate::core::pool::Pool> = snap
            .state
            .pools()
            .values()
            .filter(|p| p.kubelet && p.kind != crate::core::pool::PoolKind::Reserved)
            .collect();
        let conflict =
            pools.iter().fold(CpuSet::new(), |acc, p| acc.union(&p.cpus.intersection(&allocatable)));
        if conflict != self.cpu_manager_conflict && !conflict.is_empty() {
            let names: Vec<&str> =
                pools.iter().filter(|p| !p.cpus.is_disjoint(&conflict)).map(|p| p.name.as_str()).collect();
            log::error!(
                "device plugin: the kubelet's static CPU manager may give CPUs {conflict} of pool(s) {} to \
                 Guaranteed containers exclusively (GetAllocatableResources); keep them out of its reach with \
                 reservedSystemCPUs, or set cpuManagerPolicy: none",
                names.join(", ")
            );
        }
        self.cpu_manager_conflict = conflict;
    }

    /// One round.
    pub(super) async fn reconcile(&mut self, handle: &Handle) {
        self.check_cpu_manager(handle).await;
        let list = match pod_resources(&self.opts.pod_resources_socket()).await {
            Ok(l) => {
                if self.unreachable {
                    log::info!("device plugin: the kubelet's PodResources API answers again");
                }
                self.unreachable = false;
                self.absent = false;
                l
            }
            // No kubelet on this host (yet): nothing is wrong, and there is nothing to reconcile.
            // Said once, and only here when the registrar has not said it already (it waits for
            // the device-plugin directory, and says so, when that is missing too).
            Err(_) if !self.opts.pod_resources_socket().exists() => {
                if !self.absent && self.opts.plugin_dir().is_dir() {
                    log::info!(
                        "device plugin: no kubelet yet (`{}` does not exist); its containers are \
                         reconciled once it is there",
                        self.opts.pod_resources_socket().display()
                    );
                }
                self.absent = true;
                self.unreachable = false;
                return;
            }
            Err(e) => {
                if !self.unreachable {
                    log::info!(
                        "device plugin: PodResources not reachable ({e}); nothing is released until it is"
                    );
                }
                self.unreachable = true;
                return;
            }
        };
        let holders = holders(list, &format!("{}/", self.opts.resource_prefix));
        let snap = handle.snapshot();
        // Needed when some container is not in its cgroup yet, and to confine the others.
        let mut containers: Option<Containers> = None;
        if self.opts.confine_unpooled {
            containers = self.cri_containers().await.ok();
        }
        let now = Instant::now();
        for a in snap.state.assignments().values().filter(|a| devices::is_kubelet(a)) {
            let id = a.id.as_str();
            let Some(h) = holders.get(id) else {
                let since = *self.missing.entry(id.to_owned()).or_insert(now);
                if now.duration_since(since) >= self.opts.release_grace {
                    match handle.release(id).await {
                        Ok(_) => log::info!(
                            POOL = a.pool.as_str(), ASSIGNMENT = id;
                            "device plugin: released {id}: no container holds its devices any more"
                        ),
                        Err(e) => log::warn!("device plugin: releasing {id}: {}", error_chain(&e)),
                    }
                    self.missing.remove(id);
                    self.shared.set_held(id, None);
                }
                continue;
            };
            self.missing.remove(id);
            if a.kind == crate::core::pool::PoolKind::Shared {
                self.shared.set_held(id, Some(h.devices.clone()));
            }
            let extra =
                self.opts.containers.as_ref().and_then(|s| s.container(&h.namespace, &h.pod, &h.container));
            if extra.is_none() && containers.is_none() {
                containers = Some(self.cri_containers().await.unwrap_or_else(|e| {
                    log::debug!("device plugin: the container runtime's CRI is not reachable: {e}");
                    Containers::new()
                }));
            }
            let key = (h.namespace.clone(), h.pod.clone(), h.container.clone());
            let found = match &extra {
                Some(r) => Some((r.pod_uid.as_str(), r.container_id.as_str(), r.qos_class.as_deref())),
                None => {
                    containers.as_ref().and_then(|c| c.get(&key)).map(|(u, c)| (u.as_str(), c.as_str(), None))
                }
            };
            let Some((uid, cid, qos)) = found else { continue };
            let Some(path) = host::find_container(&self.opts.cgroup_root, uid, cid, qos) else { continue };
            let target = Target::Cgroup(path);
            let container =
                Container { namespace: h.namespace.clone(), pod: h.pod.clone(), name: h.container.clone() };
            if a.target == target && a.container.as_ref() == Some(&container) {
                continue;
            }
            match handle.retarget(id, target.clone(), Some(container)).await {
                Ok(_) => log::info!(
                    POOL = a.pool.as_str(), ASSIGNMENT = id, TARGET = target.to_string().as_str(),
                    POD = h.pod.as_str(), NAMESPACE = h.namespace.as_str(), CONTAINER = h.container.as_str();
                    "device plugin: CPUs {} of {id} applied to container {}/{}/{} ({target})",
                    a.cpus, h.namespace, h.pod, h.container
                ),
                Err(e) => log::warn!("device plugin: applying {id} to {target}: {}", error_chain(&e)),
            }
        }
        self.missing.retain(|id, _| snap.state.assignments().keys().any(|k| k.as_str() == id));
        // A runtime that cannot be asked leaves the confined set as it was.
        if let (true, Some(containers)) = (self.opts.confine_unpooled, &containers) {
            self.confine_unpooled(handle, &holders, containers).await;
        }
    }

    /// Keeps the running containers that hold none of our devices off the exclusive CPUs.
    async fn confine_unpooled(
        &mut self,
        handle: &Handle,
        holders: &HashMap<String, Holder>,
        containers: &Containers,
    ) {
        let pooled: BTreeSet<(&str, &str, &str)> =
            holders.values().map(|h| (h.namespace.as_str(), h.pod.as_str(), h.container.as_str())).collect();
        let unpooled: BTreeSet<CgroupPath> = containers
            .iter()
            .filter(|((ns, pod, name), _)| !pooled.contains(&(ns.as_str(), pod.as_str(), name.as_str())))
            .filter_map(|(_, (uid, cid))| host::find_container(&self.opts.cgroup_root, uid, cid, None))
            .collect();
        let count = unpooled.len();
        match handle.set_unpooled(unpooled).await {
            Ok(0) => {}
            Ok(_) => log::info!(
                "device plugin: {count} container(s) that use no pool kept off the exclusive pools' CPUs"
            ),
            Err(e) => {
                log::warn!("device plugin: confining the containers that use no pool: {}", error_chain(&e))
            }
        }
    }

    /// Running containers by (namespace, pod, container name): (pod UID, container id).
    async fn cri_containers(&self) -> Result<Containers, String> {
        let mut client = cri::runtime_service_client::RuntimeServiceClient::new(
            channel(&self.opts.runtime_endpoint).await?,
        );
        let reply = answer(client.list_containers(cri::ListContainersRequest {
            filter: Some(cri::ContainerFilter {
                state: Some(cri::ContainerStateValue { state: cri::ContainerState::ContainerRunning as i32 }),
                ..Default::default()
            }),
        }))
        .await?;
        let label = |c: &cri::Container, k: &str| c.labels.get(k).cloned().unwrap_or_default();
        Ok(reply
            .containers
            .into_iter()
            .map(|c| {
                let key = (
                    label(&c, "io.kubernetes.pod.namespace"),
                    label(&c, "io.kubernetes.pod.name"),
                    label(&c, "io.kubernetes.container.name"),
                );
                (key, (label(&c, "io.kubernetes.pod.uid"), c.id))
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(resource: &str, id: &str, node: i64) -> podresources::ContainerDevices {
        podresources::ContainerDevices {
            resource_name: resource.into(),
            device_ids: vec![id.into()],
            topology: Some(podresources::TopologyInfo { nodes: vec![podresources::NumaNode { id: node }] }),
        }
    }

    /// The shape the kubelet sends (`containerDevicesFromResourceDeviceInstances`): one entry per
    /// device and NUMA node, in map order.
    #[test]
    fn one_entry_per_device_is_one_allocation() {
        let container = |name: &str, devices| podresources::ContainerResources {
            name: name.into(),
            devices,
            ..Default::default()
        };
        let list = podresources::ListPodResourcesResponse {
            pod_resources: vec![podresources::PodResources {
                name: "p1".into(),
                namespace: "default".into(),
                containers: vec![
                    container(
                        "app",
                        vec![
                            entry("cpupool.io/web", "milli-web-00003", 0),
                            entry("cpupool.io/dp", "core-7", 1),
                            entry("cpupool.io/web", "milli-web-00001", 0),
                            entry("other.io/gpu", "gpu-0", 0),
                            entry("cpupool.io/dp", "core-6", 1),
                            entry("cpupool.io/web", "milli-web-00002", 0),
                        ],
                    ),
                    container("side", vec![entry("cpupool.io/web", "milli-web-00004", 0)]),
                ],
            }],
        };
        let h = holders(list, "cpupool.io/");
        let mut ids: Vec<&str> = h.keys().map(String::as_str).collect();
        ids.sort();
        assert_eq!(ids, ["kubelet-core-6", "kubelet-milli-web-00001", "kubelet-milli-web-00004"]);
        let devs = |id: &str| h[id].devices.iter().map(String::as_str).collect::<Vec<_>>();
        assert_eq!(devs("kubelet-core-6"), ["core-6", "core-7"]);
        assert_eq!(
            devs("kubelet-milli-web-00001"),
            ["milli-web-00001", "milli-web-00002", "milli-web-00003"]
        );
        assert_eq!(h["kubelet-milli-web-00004"].container, "side");
        assert_eq!(h["kubelet-core-6"].container, "app");
    }
}
