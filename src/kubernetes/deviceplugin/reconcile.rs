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

use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

use super::Options;
use crate::core::cpuset::CpuSet;
use crate::core::state::{Assignment, AssignmentId, CgroupPath, Container, Target};
use crate::engine::{Handle, Overlap, Server};
use crate::error_chain;
use crate::host;
use crate::kubernetes::grpc::clients::{self, Containers, Holder};

/// The reconciler's memory between rounds.
pub(super) struct Reconciler {
    opts: Options,
    /// Kubelet assignments no container holds, since when.
    missing: HashMap<String, Instant>,
    /// Whether the last PodResources call failed (logged once per outage).
    unreachable: bool,
    /// Whether the kubelet was found absent (no PodResources socket) and that was said.
    absent: bool,
    /// Pool CPUs the kubelet's CPU manager may hand out exclusively, as last logged.
    cpu_manager_conflict: CpuSet,
    /// Pool CPUs the kubelet's pod cgroup does not have, as last logged.
    unreachable_cpus: CpuSet,
}

impl Reconciler {
    pub(super) fn new(opts: Options) -> Reconciler {
        Reconciler {
            opts,
            missing: HashMap::new(),
            unreachable: false,
            absent: false,
            cpu_manager_conflict: CpuSet::new(),
            unreachable_cpus: CpuSet::new(),
        }
    }

    /// Says (once per change) when the kubelet's CPU manager may give pool CPUs to containers
    /// exclusively: its `GetAllocatableResources` CPUs are those the static policy allocates
    /// from (all but `reservedSystemCPUs`); the `none` policy reports none. Set up that way at
    /// start, the plugin refuses to start (`cpu_manager_state`); this notices a kubelet changed
    /// to the static policy while cpupoold runs.
    async fn check_cpu_manager(&mut self, handle: &Handle) {
        let Ok(allocatable) = clients::allocatable_cpus(&self.opts.pod_resources_socket()).await else {
            return;
        };
        let conflict = handle.snapshot().offered_in(Server::DevicePlugin, &allocatable);
        if conflict.cpus != self.cpu_manager_conflict && !conflict.cpus.is_empty() {
            log::error!(
                "device plugin: the kubelet's static CPU manager may give CPUs {} of pool(s) {} to \
                 Guaranteed containers exclusively (GetAllocatableResources); keep them out of its reach with \
                 reservedSystemCPUs, or set cpuManagerPolicy: none",
                conflict.cpus,
                conflict.names()
            );
        }
        self.cpu_manager_conflict = conflict.cpus;
    }

    /// One round.
    pub(super) async fn reconcile(&mut self, handle: &Handle) {
        self.check_cpu_manager(handle).await;
        let Some(list) = self.pod_resources().await else { return };
        let holders = clients::holders(list, &format!("{}/", self.opts.resource_prefix));
        let snap = handle.snapshot();
        // While the NRI plugin serves the runtime, containers get their CPUs (and unpooled ones
        // are kept off the exclusive CPUs) when they are created: this poll only releases the
        // allocations no container holds.
        let nri = snap.kubelet.nri.is_some();
        // Needed when some container is not in its cgroup yet, and to confine the others.
        let mut containers: Option<Containers> = None;
        if self.opts.confine_unpooled && !nri {
            containers = self.cri_containers().await.ok();
        }
        let now = Instant::now();
        for a in snap.kubelet_assignments() {
            let id = a.id.as_str();
            let Some(h) = holders.get(id) else {
                self.release_unheld(handle, a, snap.kubelet.held.contains_key(&a.id), now).await;
                continue;
            };
            self.missing.remove(id);
            // Asked only for a change: the engine is not woken on every tick.
            if snap.held_changed(a, &h.devices) {
                set_held(handle, &a.id, Some(h.devices.clone())).await;
            }
            if !nri {
                self.follow_container(handle, a, h, &mut containers).await;
            }
        }
        self.missing.retain(|id, _| snap.holds(id));
        // A runtime that cannot be asked leaves the confined set as it was.
        if let (true, false, Some(containers)) = (self.opts.confine_unpooled, nri, &containers) {
            // The pods' sandboxes too: a runtime that lists none leaves them as they were.
            let sandboxes = match clients::cri_sandboxes(&self.opts.runtime_endpoint).await {
                Ok(s) => s,
                Err(e) => {
                    log::debug!("device plugin: listing the pod sandboxes: {e}");
                    Vec::new()
                }
            };
            self.confine_unpooled(handle, &holders, containers, &sandboxes).await;
        }
    }

    /// The kubelet's PodResources `List`, or `None` when there is no kubelet or it does not
    /// answer (said once per change).
    async fn pod_resources(
        &mut self,
    ) -> Option<crate::kubernetes::grpc::proto::podresources::ListPodResourcesResponse> {
        match clients::pod_resources(&self.opts.pod_resources_socket()).await {
            Ok(l) => {
                if self.unreachable {
                    log::info!("device plugin: the kubelet's PodResources API answers again");
                }
                self.unreachable = false;
                self.absent = false;
                Some(l)
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
                None
            }
            Err(e) => {
                if !self.unreachable {
                    log::info!(
                        "device plugin: PodResources not reachable ({e}); nothing is released until it is"
                    );
                }
                self.unreachable = true;
                None
            }
        }
    }

    /// Releases kubelet assignment `a`, which no container holds, once that has lasted the
    /// grace period (`held`: the engine records which devices hold it).
    async fn release_unheld(&mut self, handle: &Handle, a: &Assignment, held: bool, now: Instant) {
        let id = a.id.as_str();
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
            if held {
                set_held(handle, &a.id, None).await;
            }
        }
    }

    /// Points kubelet assignment `a` at the cgroup of the container `h` that holds its devices,
    /// found through the cluster integration or the runtime's CRI (`containers`, asked once a
    /// round when needed).
    async fn follow_container(
        &self,
        handle: &Handle,
        a: &Assignment,
        h: &Holder,
        containers: &mut Option<Containers>,
    ) {
        let id = a.id.as_str();
        let extra =
            self.opts.containers.as_ref().and_then(|s| s.container(&h.namespace, &h.pod, &h.container));
        if extra.is_none() && containers.is_none() {
            *containers = Some(self.cri_containers().await.unwrap_or_else(|e| {
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
        let Some((uid, cid, qos)) = found else { return };
        let Some(path) = host::kubelet::find_container(&self.opts.cgroup_root, uid, cid, qos) else {
            return;
        };
        let target = Target::Cgroup(path);
        let container =
            Container { namespace: h.namespace.clone(), pod: h.pod.clone(), name: h.container.clone() };
        if a.target == target && a.container.as_ref() == Some(&container) {
            return;
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

    /// Keeps the running containers that hold none of our devices, and the pods' sandboxes, off
    /// the exclusive CPUs.
    async fn confine_unpooled(
        &mut self,
        handle: &Handle,
        holders: &HashMap<String, Holder>,
        containers: &Containers,
        sandboxes: &[(String, String)],
    ) {
        let pooled: BTreeSet<(&str, &str, &str)> =
            holders.values().map(|h| (h.namespace.as_str(), h.pod.as_str(), h.container.as_str())).collect();
        let unpooled: BTreeSet<CgroupPath> = containers
            .iter()
            .filter(|((ns, pod, name), _)| !pooled.contains(&(ns.as_str(), pod.as_str(), name.as_str())))
            .map(|(_, (uid, cid))| (uid, cid))
            .chain(sandboxes.iter().map(|(uid, id)| (uid, id)))
            .filter_map(|(uid, cid)| host::kubelet::find_container(&self.opts.cgroup_root, uid, cid, None))
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

    /// Publishes the effective CPUs of the kubelet's pod cgroup, and says (once per change)
    /// which offered pools' CPUs it lacks: their devices are Unhealthy until it has them.
    async fn refresh_pod_cpus(&mut self, handle: &Handle) {
        let cpus = host::kubelet::pod_cpus(&self.opts.cgroup_root);
        if let Err(e) = handle.set_pod_cpus(cpus.clone()).await {
            log::debug!("device plugin: publishing the pod cgroup's CPUs: {}", error_chain(&e));
            return;
        }
        let lacking = match &cpus {
            Some(_) => handle.snapshot().offered_unusable(Server::DevicePlugin),
            None => Overlap::default(),
        };
        if lacking.cpus != self.unreachable_cpus && !lacking.cpus.is_empty() {
            log::warn!(
                "device plugin: the kubelet's pod cgroup does not have CPUs {} of pool(s) {} (its \
                 effective CPUs are {}): no container can run there, so their devices are Unhealthy. An \
                 isolated partition takes its CPUs from every cgroup outside it (docs/behaviour.md, \
                 \"Isolated pools and containers\").",
                lacking.cpus,
                lacking.names(),
                cpus.as_ref().map(ToString::to_string).unwrap_or_default()
            );
        } else if lacking.cpus.is_empty() && !self.unreachable_cpus.is_empty() {
            log::info!("device plugin: the kubelet's pod cgroup has every offered pool's CPUs again");
        }
        self.unreachable_cpus = lacking.cpus;
    }

    /// Running containers by (namespace, pod, container name): (pod UID, container id).
    async fn cri_containers(&self) -> Result<Containers, String> {
        clients::cri_containers(&self.opts.runtime_endpoint).await
    }

    /// Reads the CPUs online again: a CPU taken offline makes its devices Unhealthy (and a
    /// shared pool's capacity smaller) on every open ListAndWatch, until it comes back. So does
    /// a CPU the kubelet's pod cgroup does not have (an isolated partition took it): no
    /// container could be given it.
    pub(super) async fn refresh_online(&mut self, handle: &Handle) {
        self.refresh_pod_cpus(handle).await;
        let now = match host::sysfs::read_online(&self.opts.sysfs_root) {
            Ok(set) => set,
            Err(e) => {
                log::debug!("device plugin: reading the online CPUs: {}", error_chain(&e));
                return;
            }
        };
        let before = handle.snapshot().online();
        let (gone, back) = (before.difference(&now), now.difference(&before));
        match handle.set_online(now).await {
            Ok(true) => {
                if !gone.is_empty() {
                    log::warn!("device plugin: CPUs {gone} went offline; their devices are Unhealthy");
                }
                if !back.is_empty() {
                    log::info!("device plugin: CPUs {back} are online again");
                }
            }
            Ok(false) => {}
            Err(e) => log::debug!("device plugin: publishing the online CPUs: {}", error_chain(&e)),
        }
    }
}

/// Publishes the devices the kubelet holds for assignment `id` (they decide which shared units
/// are Unhealthy); the engine going away is the shutdown, said elsewhere.
pub(super) async fn set_held(handle: &Handle, id: &AssignmentId, devices: Option<BTreeSet<String>>) {
    if let Err(e) = handle.set_held(id.clone(), devices).await {
        log::debug!("device plugin: publishing the devices of {id}: {}", error_chain(&e));
    }
}
