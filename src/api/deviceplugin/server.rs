//! One pool's `v1beta1.DevicePlugin` service. Thin: each call decodes with [`devices`], calls
//! the engine, and encodes the answer or maps the error to a gRPC status naming the field.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use tokio::sync::{broadcast, mpsc, watch, Notify};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::devices::{self, Refused};
use super::proto::v1beta1::{self, device_plugin_server::DevicePlugin};
use super::reconcile;
use crate::api::ops;
use crate::core::cpuset::CpuSet;
use crate::core::pool::{Pool, PoolKind, PoolName};
use crate::core::state::{AssignmentId, Outcome, Size};
use crate::engine::{EngineError, Handle, Snapshot};

/// What every pool's service shares.
pub struct Shared {
    /// The engine.
    pub handle: Handle,
    /// `kubelet.millicpus_per_device`.
    pub millis_per_device: u64,
    /// `kubelet.resource_prefix`.
    pub resource_prefix: String,
    /// The kubelet's PodResources socket.
    pub pod_resources: PathBuf,
    /// Devices of shared pools the kubelet holds, by assignment (Allocate and PodResources).
    pub held: Mutex<BTreeMap<String, BTreeSet<String>>>,
    /// The CPUs online as last read on the reconcile tick; `None` until then (the topology's).
    pub online: Mutex<Option<CpuSet>>,
    /// Woken when `held` or `online` changes: the devices' health follows them.
    pub health_changed: Notify,
}

impl Shared {
    /// The shared-pool devices the kubelet holds.
    pub fn held_devices(&self) -> BTreeSet<String> {
        self.held.lock().map(|h| h.values().flatten().cloned().collect()).unwrap_or_default()
    }

    /// Records the devices an assignment holds (`None`: it is gone).
    pub fn set_held(&self, id: &str, devs: Option<BTreeSet<String>>) {
        if let Ok(mut h) = self.held.lock() {
            let before = h.get(id).cloned();
            match &devs {
                Some(d) => h.insert(id.to_owned(), d.clone()),
                None => h.remove(id),
            };
            if before != devs {
                self.health_changed.notify_waiters();
            }
        }
    }

    /// Reads the online CPUs again: a CPU taken offline makes its devices Unhealthy (and a
    /// shared pool's capacity smaller) on every open ListAndWatch, until it comes back.
    pub fn refresh_online(&self, sysfs_root: &Path) {
        let now = match crate::host::sysfs::read_online(sysfs_root) {
            Ok(set) => set,
            Err(e) => {
                log::debug!("device plugin: reading the online CPUs: {}", crate::engine::error_chain(&e));
                return;
            }
        };
        let before = self.online_now(&self.handle.snapshot());
        if before != now {
            let (gone, back) = (before.difference(&now), now.difference(&before));
            if !gone.is_empty() {
                log::warn!("device plugin: CPUs {gone} went offline; their devices are Unhealthy");
            }
            if !back.is_empty() {
                log::info!("device plugin: CPUs {back} are online again");
            }
            if let Ok(mut online) = self.online.lock() {
                *online = Some(now);
            }
            self.health_changed.notify_waiters();
        }
    }

    /// The CPUs online now, as far as the plugin knows.
    fn online_now(&self, snap: &Snapshot) -> CpuSet {
        self.online.lock().ok().and_then(|o| o.clone()).unwrap_or_else(|| snap.topology.online())
    }
}

/// The service of one pool.
pub struct PoolPlugin {
    /// The pool.
    pub pool: PoolName,
    /// Shared with the other pools.
    pub shared: Arc<Shared>,
    /// `true` once the plugin is stopped: open ListAndWatch streams end.
    pub stopped: watch::Receiver<bool>,
}

fn refused(r: &Refused) -> Status {
    Status::invalid_argument(r.to_string())
}

/// Each engine error to a status; the message names the API error kind and the argument.
fn engine_status(e: &EngineError) -> Status {
    let api = ops::engine_error(e);
    let msg = format!("{}: {}", api.kind, api.message);
    match api.kind.name() {
        "InvalidArgument" | "NotWholeCores" => Status::invalid_argument(msg),
        "InsufficientCapacity"
        | "TargetBusy"
        | "TargetNotAllowed"
        | "TargetOutsidePool"
        | "DuplicateId"
        | "NoSuchPool"
        | "ReservedPool" => Status::failed_precondition(msg),
        "ShuttingDown" => Status::unavailable(msg),
        _ => Status::internal(msg),
    }
}

impl PoolPlugin {
    /// Releases this pool's kubelet assignments that stand in the way of `alloc` although the
    /// kubelet has freed their devices: no container holds them in PodResources. The kubelet
    /// hands a terminated pod's devices out again at once, and reconciliation waits out
    /// `release_grace_ms` before it lets go; until then, Allocate must not refuse what the
    /// kubelet has decided. Exclusive pools: those whose CPUs overlap, or with the same id;
    /// shared pools: every freed one (units are interchangeable). Returns how many went; none
    /// when PodResources cannot be asked (the refusal stands).
    async fn release_freed(&self, pool: &Pool, alloc: &devices::Allocation, made: &[AssignmentId]) -> usize {
        let list = match reconcile::pod_resources(&self.shared.pod_resources).await {
            Ok(l) => l,
            Err(e) => {
                log::info!(POOL = pool.name.as_str(); "Allocate: PodResources not reachable ({e}); cannot tell whether the kubelet freed the devices in the way");
                return 0;
            }
        };
        let held = reconcile::holders(list, &format!("{}/", self.shared.resource_prefix));
        let snap = self.shared.handle.snapshot();
        let freed: Vec<AssignmentId> = snap
            .state
            .assignments()
            .values()
            .filter(|a| devices::is_kubelet(a) && a.pool == pool.name)
            .filter(|a| !made.contains(&a.id) && !held.contains_key(a.id.as_str()))
            .filter(|a| {
                Some(&a.id) == alloc.spec.id.as_ref()
                    || match &alloc.spec.size {
                        Size::Cpuset(c) => !a.cpus.is_disjoint(c),
                        _ => pool.kind == PoolKind::Shared,
                    }
            })
            .map(|a| a.id.clone())
            .collect();
        let mut released = 0;
        for id in freed {
            match self.shared.handle.release(id.as_str()).await {
                Ok(_) => {
                    released += 1;
                    self.shared.set_held(id.as_str(), None);
                    log::info!(POOL = pool.name.as_str(), ASSIGNMENT = id.as_str();
                        "Allocate: released {id}: the kubelet hands out its devices again and no container holds them");
                }
                Err(e) => log::warn!(
                    "Allocate: releasing `{id}`, whose devices the kubelet freed: {}",
                    crate::engine::error_chain(&e)
                ),
            }
        }
        released
    }

    fn pool_of(&self, snap: &Snapshot) -> Result<Pool, Status> {
        snap.state
            .pools()
            .get(&self.pool)
            .filter(|p| p.kubelet && p.kind != PoolKind::Reserved)
            .cloned()
            .ok_or_else(|| {
                Status::not_found(format!("pool `{}` is no longer offered to the kubelet", self.pool))
            })
    }

    fn list(&self) -> Vec<v1beta1::Device> {
        let snap = self.shared.handle.snapshot();
        match snap.state.pools().get(&self.pool) {
            Some(p) if p.kubelet => devices::list(
                &snap.state,
                &snap.topology,
                p,
                self.shared.millis_per_device,
                &self.shared.held_devices(),
                &self.shared.online_now(&snap),
            ),
            _ => Vec::new(),
        }
    }
}

type DeviceStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<v1beta1::ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for PoolPlugin {
    async fn get_device_plugin_options(
        &self,
        _: Request<v1beta1::Empty>,
    ) -> Result<Response<v1beta1::DevicePluginOptions>, Status> {
        Ok(Response::new(options()))
    }

    type ListAndWatchStream = DeviceStream;

    async fn list_and_watch(
        &self,
        _: Request<v1beta1::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let (tx, rx) = mpsc::channel(4);
        // Subscribed before the first list, so no change falls between the two.
        let mut events = self.shared.handle.subscribe();
        let mut stopped = self.stopped.clone();
        let this =
            PoolPlugin { pool: self.pool.clone(), shared: self.shared.clone(), stopped: stopped.clone() };
        tokio::spawn(async move {
            let mut last = None;
            loop {
                let held = this.shared.health_changed.notified();
                let devices = this.list();
                if last.as_ref() != Some(&devices) {
                    let msg = v1beta1::ListAndWatchResponse { devices: devices.clone() };
                    if tx.send(Ok(msg)).await.is_err() {
                        return;
                    }
                    last = Some(devices);
                }
                tokio::select! {
                    e = events.recv() => {
                        if let Err(broadcast::error::RecvError::Closed) = e {
                            return;
                        }
                        // Lagged: the list is read again from the snapshot, which is current.
                    }
                    _ = held => {}
                    _ = stopped.wait_for(|s| *s) => return,
                    _ = tx.closed() => return,
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<v1beta1::PreferredAllocationRequest>,
    ) -> Result<Response<v1beta1::PreferredAllocationResponse>, Status> {
        let snap = self.shared.handle.snapshot();
        let pool = self.pool_of(&snap)?;
        let mut container_responses = Vec::new();
        for r in request.into_inner().container_requests {
            let ids = devices::preferred(
                &pool,
                &snap.topology,
                self.shared.millis_per_device,
                &r.available_device_i_ds,
                &r.must_include_device_i_ds,
                r.allocation_size,
            )
            .map_err(|e| refused(&e))?;
            container_responses.push(v1beta1::ContainerPreferredAllocationResponse { device_i_ds: ids });
        }
        Ok(Response::new(v1beta1::PreferredAllocationResponse { container_responses }))
    }

    async fn allocate(
        &self,
        request: Request<v1beta1::AllocateRequest>,
    ) -> Result<Response<v1beta1::AllocateResponse>, Status> {
        let snap = self.shared.handle.snapshot();
        let pool = self.pool_of(&snap)?;
        // Decode every container first: a malformed request changes nothing.
        let allocations = request
            .into_inner()
            .container_requests
            .iter()
            .map(|r| {
                devices::allocation(&pool, &snap.topology, self.shared.millis_per_device, &r.devices_ids)
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| refused(&e))?;
        let mut made: Vec<AssignmentId> = Vec::new();
        let mut responses = Vec::new();
        for alloc in &allocations {
            // The kubelet repeats Allocate for the same devices (container restart): the
            // existing assignment answers, wherever it has been retargeted since.
            let existing = alloc.spec.id.as_ref().and_then(|id| snap.state.assignments().get(id));
            let result = match existing {
                Some(a) if devices::same(a, alloc) => Ok(Outcome::Identity(a.clone())),
                _ => match self.shared.handle.assign(alloc.spec.clone()).await {
                    Err(EngineError::State(e)) => match self.release_freed(&pool, alloc, &made).await {
                        0 => Err(EngineError::State(e)),
                        _ => self.shared.handle.assign(alloc.spec.clone()).await,
                    },
                    r => r,
                },
            };
            match result {
                Ok(out) => {
                    let changed = out.changed();
                    let a = out.into_inner();
                    if changed {
                        made.push(a.id.clone());
                    }
                    if a.kind == PoolKind::Shared {
                        self.shared.set_held(a.id.as_str(), Some(alloc.devices.iter().cloned().collect()));
                    }
                    responses.push(v1beta1::ContainerAllocateResponse {
                        envs: devices::envs(&a),
                        ..Default::default()
                    });
                }
                Err(e) => {
                    // Undo this call's earlier containers: all or nothing.
                    for id in made.iter().rev() {
                        if let Err(e2) = self.shared.handle.release(id.as_str()).await {
                            log::error!("Allocate: releasing `{id}` after a failure: {e2}");
                        }
                        self.shared.set_held(id.as_str(), None);
                    }
                    log::warn!(POOL = self.pool.as_str(); "Allocate {:?} refused: {}", alloc.devices, crate::engine::error_chain(&e));
                    return Err(engine_status(&e));
                }
            }
        }
        Ok(Response::new(v1beta1::AllocateResponse { container_responses: responses }))
    }

    async fn pre_start_container(
        &self,
        _: Request<v1beta1::PreStartContainerRequest>,
    ) -> Result<Response<v1beta1::PreStartContainerResponse>, Status> {
        Ok(Response::new(v1beta1::PreStartContainerResponse {}))
    }
}

/// What the plugin tells the kubelet about itself.
pub fn options() -> v1beta1::DevicePluginOptions {
    v1beta1::DevicePluginOptions { pre_start_required: false, get_preferred_allocation_available: true }
}
