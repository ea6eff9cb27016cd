//! One pool's `v1beta1.DevicePlugin` service. Thin: each call asks the engine's snapshot to
//! decode its devices ([`crate::engine::view`]), calls the engine once, and encodes the answer
//! or maps the error to a gRPC status naming the field. What the device lists depend on besides the state (the CPUs
//! online, the devices the kubelet holds) comes from the engine's snapshot too.

use std::pin::Pin;

use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::reconcile::set_held;
use crate::core::devices::{self, Allocation, Device, Refused};
use crate::core::pool::{Pool, PoolKind, PoolName};
use crate::core::state::{self, AssignmentId, Outcome};
use crate::engine::{EngineError, Handle, Snapshot};
use crate::error_chain;
use crate::kubernetes::deviceplugin::proto::v1beta1::{self, device_plugin_server::DevicePlugin};
use crate::kubernetes::grpc::clients;

/// What every pool's service needs.
#[derive(Clone)]
pub struct Shared {
    /// The engine.
    pub handle: Handle,
    /// `kubelet.millicpus_per_device`.
    pub millis_per_device: u64,
    /// `kubelet.resource_prefix`.
    pub resource_prefix: String,
    /// The kubelet's PodResources socket.
    pub pod_resources: std::path::PathBuf,
}

/// The service of one pool.
pub struct PoolPlugin {
    /// The pool.
    pub pool: PoolName,
    /// Shared with the other pools.
    pub shared: Shared,
    /// `true` once the plugin is stopped: open ListAndWatch streams end.
    pub stopped: watch::Receiver<bool>,
}

fn refused(r: &Refused) -> Status {
    Status::invalid_argument(r.to_string())
}

/// Each engine error to a status by its kind; the message names the API error kind and the
/// argument.
fn engine_status(e: &EngineError) -> Status {
    use state::Error as S;
    let api = e.to_api();
    let msg = format!("{}: {}", api.kind, api.message);
    match e {
        EngineError::State(S::InvalidArgument { .. } | S::NotWholeCores { .. }) => {
            Status::invalid_argument(msg)
        }
        EngineError::State(
            S::InsufficientCapacity { .. }
            | S::TargetBusy { .. }
            | S::TargetNotAllowed { .. }
            | S::TargetOutsidePool { .. }
            | S::DuplicateId { .. }
            | S::NoSuchPool { .. }
            | S::ReservedPool { .. },
        ) => Status::failed_precondition(msg),
        EngineError::Stopped => Status::unavailable(msg),
        _ => Status::internal(msg),
    }
}

/// A device as the kubelet reads it.
fn encode(d: Device) -> v1beta1::Device {
    v1beta1::Device {
        health: d.health().to_owned(),
        id: d.id,
        topology: Some(v1beta1::TopologyInfo {
            nodes: d.nodes.into_iter().map(|n| v1beta1::NumaNode { id: i64::from(n) }).collect(),
        }),
    }
}

impl PoolPlugin {
    /// Releases this pool's kubelet assignments that stand in the way of `allocs` although the
    /// kubelet has freed their devices: no container holds them in PodResources. The kubelet
    /// hands a terminated pod's devices out again at once, and reconciliation waits out
    /// `release_grace_ms` before it lets go; until then, Allocate must not refuse what the
    /// kubelet has decided. Exclusive pools: those whose CPUs overlap, or with the same id;
    /// shared pools: every freed one (units are interchangeable). `keep`: the assignments this
    /// request asks for as they are. Returns how many went; none when PodResources cannot be
    /// asked (the refusal stands).
    async fn release_freed(&self, pool: &Pool, allocs: &[&Allocation], keep: &[&AssignmentId]) -> usize {
        let list = match clients::pod_resources(&self.shared.pod_resources).await {
            Ok(l) => l,
            Err(e) => {
                log::info!(POOL = pool.name.as_str(); "Allocate: PodResources not reachable ({e}); cannot tell whether the kubelet freed the devices in the way");
                return 0;
            }
        };
        let held = clients::holders(list, &format!("{}/", self.shared.resource_prefix));
        let freed =
            self.shared.handle.snapshot().freed_in_the_way(pool, allocs, keep, |id| held.contains_key(id));
        let mut released = 0;
        for id in freed {
            match self.shared.handle.release(id.as_str()).await {
                Ok(_) => {
                    released += 1;
                    set_held(&self.shared.handle, &id, None).await;
                    log::info!(POOL = pool.name.as_str(), ASSIGNMENT = id.as_str();
                        "Allocate: released {id}: the kubelet hands out its devices again and no container holds them");
                }
                Err(e) => {
                    log::warn!(
                        "Allocate: releasing `{id}`, whose devices the kubelet freed: {}",
                        error_chain(&e)
                    )
                }
            }
        }
        released
    }

    fn pool_of(&self, snap: &Snapshot) -> Result<Pool, Status> {
        snap.device_pool(&self.pool).cloned().ok_or_else(|| {
            Status::not_found(format!("pool `{}` is no longer offered to the kubelet", self.pool))
        })
    }

    fn list(&self, snap: &Snapshot) -> Vec<v1beta1::Device> {
        snap.device_list(&self.pool, self.shared.millis_per_device).into_iter().map(encode).collect()
    }

    /// All containers of the request get their CPUs, or none do: one engine call.
    async fn allocate_all(
        &self,
        request: Request<v1beta1::AllocateRequest>,
    ) -> Result<Response<v1beta1::AllocateResponse>, Status> {
        let snap = self.shared.handle.snapshot();
        let pool = self.pool_of(&snap)?;
        // Decode every container first: a malformed request changes nothing.
        let request = request.into_inner();
        let allocations = snap
            .device_allocations(
                &pool,
                self.shared.millis_per_device,
                request.container_requests.iter().map(|r| r.devices_ids.as_slice()),
            )
            .map_err(|e| refused(&e))?;
        // The kubelet repeats Allocate for the same devices (container restart): the existing
        // assignment answers, wherever it has been retargeted since.
        let existing = |alloc: &Allocation| snap.answering(alloc).cloned();
        let (asked, new): (Vec<&Allocation>, Vec<&Allocation>) =
            allocations.iter().partition(|a| existing(a).is_some());
        let keep: Vec<&AssignmentId> = asked.iter().filter_map(|a| a.spec.id.as_ref()).collect();
        let specs = || new.iter().map(|a| a.spec.clone()).collect::<Vec<_>>();
        let made = match self.shared.handle.assign_all(specs()).await {
            Err(EngineError::State(e)) => match self.release_freed(&pool, &new, &keep).await {
                0 => Err(EngineError::State(e)),
                _ => self.shared.handle.assign_all(specs()).await,
            },
            r => r,
        };
        let mut made = match made {
            Ok(made) => made.into_iter().map(Outcome::into_inner),
            Err(e) => {
                let devices: Vec<&Vec<String>> = new.iter().map(|a| &a.devices).collect();
                log::warn!(POOL = self.pool.as_str(); "Allocate {devices:?} refused: {}", error_chain(&e));
                return Err(engine_status(&e));
            }
        };
        let mut responses = Vec::with_capacity(allocations.len());
        for alloc in &allocations {
            let Some(a) = existing(alloc).or_else(|| made.next()) else {
                return Err(Status::internal("the engine answered fewer assignments than asked"));
            };
            if a.kind == PoolKind::Shared {
                set_held(&self.shared.handle, &a.id, Some(alloc.devices.iter().cloned().collect())).await;
            }
            responses
                .push(v1beta1::ContainerAllocateResponse { envs: devices::envs(&a), ..Default::default() });
        }
        Ok(Response::new(v1beta1::AllocateResponse { container_responses: responses }))
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
        // Every committed snapshot, the one current now first: no change falls between the
        // first list and the watch.
        let mut snapshots = self.shared.handle.watch();
        let mut stopped = self.stopped.clone();
        let this =
            PoolPlugin { pool: self.pool.clone(), shared: self.shared.clone(), stopped: stopped.clone() };
        tokio::spawn(async move {
            let mut last = None;
            loop {
                let snap = snapshots.borrow_and_update().clone();
                let devices = this.list(&snap);
                if last.as_ref() != Some(&devices) {
                    let msg = v1beta1::ListAndWatchResponse { devices: devices.clone() };
                    if tx.send(Ok(msg)).await.is_err() {
                        return;
                    }
                    last = Some(devices);
                }
                tokio::select! {
                    r = snapshots.changed() => if r.is_err() { return },
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
        let request = request.into_inner();
        let asked = request.container_requests.iter().map(|r| {
            (r.available_device_i_ds.as_slice(), r.must_include_device_i_ds.as_slice(), r.allocation_size)
        });
        let preferred =
            snap.preferred_devices(&pool, self.shared.millis_per_device, asked).map_err(|e| refused(&e))?;
        let container_responses = preferred
            .into_iter()
            .map(|ids| v1beta1::ContainerPreferredAllocationResponse { device_i_ds: ids })
            .collect();
        Ok(Response::new(v1beta1::PreferredAllocationResponse { container_responses }))
    }

    async fn allocate(
        &self,
        request: Request<v1beta1::AllocateRequest>,
    ) -> Result<Response<v1beta1::AllocateResponse>, Status> {
        let start = std::time::Instant::now();
        let r = self.allocate_all(request).await;
        crate::counters::counters().allocate(self.pool.as_str(), r.is_ok(), start.elapsed());
        r
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::core::cpuset::CpuSet;
    use crate::core::pool::Smt;
    use crate::core::state::State;
    use crate::core::topology::Topology;

    fn pool(name: &str, kind: PoolKind, cpus: &str, smt: Smt) -> Pool {
        Pool {
            name: PoolName::new(name).unwrap_or_else(|e| panic!("{e}")),
            kind,
            cpus: CpuSet::parse(cpus).unwrap_or_else(|e| panic!("{e}")),
            smt,
            isolate: false,
            kubelet: true,
            enforce_quota: false,
            dra: false,
        }
    }

    /// The `Healthy` / `Unhealthy` words and the NUMA nodes as the kubelet reads them.
    #[test]
    fn devices_encode_as_the_kubelet_reads_them() {
        let d = encode(Device { id: "core-3".into(), healthy: false, nodes: vec![0, 1] });
        assert_eq!(d.id, "core-3");
        assert_eq!(d.health, "Unhealthy");
        let nodes: Vec<i64> = d.topology.iter().flat_map(|t| t.nodes.iter().map(|n| n.id)).collect();
        assert_eq!(nodes, [0, 1]);
        assert_eq!(encode(Device { id: "x".into(), healthy: true, nodes: vec![] }).health, "Healthy");
    }

    /// Each refusal by the engine to its own status code, by its kind.
    #[test]
    fn engine_errors_map_by_kind() {
        let cases = [
            (
                EngineError::State(S::InvalidArgument { arg: "x", reason: "y".into() }),
                tonic::Code::InvalidArgument,
            ),
            (EngineError::State(S::DuplicateId { id: "a".into() }), tonic::Code::FailedPrecondition),
            (
                EngineError::State(S::InsufficientCapacity {
                    pool: "p".into(),
                    requested: 2,
                    free: 1,
                    unit: "cpus",
                }),
                tonic::Code::FailedPrecondition,
            ),
            (EngineError::State(S::NoSuchAssignment { id: "a".into() }), tonic::Code::Internal),
            (EngineError::Stopped, tonic::Code::Unavailable),
            (EngineError::NoConfigFiles, tonic::Code::Internal),
        ];
        for (e, code) in cases {
            let s = engine_status(&e);
            assert_eq!(s.code(), code, "{e}");
            assert!(s.message().ends_with(&e.to_string()), "{}", s.message());
        }
    }
    use state::Error as S;

    /// ListAndWatch message sizes, encoded: a 512-CPU, 8-node host's shared pool at the default
    /// unit, and the largest pool the configuration lets through (`MAX_SHARED_DEVICES` units of
    /// a 32-character pool, all `Unhealthy`, spanning 8 nodes) against the kubelet's 4 MiB.
    #[test]
    fn list_and_watch_messages_stay_well_under_4_mib() {
        use prost::Message;
        let t = Topology::synthetic(2, 128, 2, 8);
        let name = "a_shared_pool_named_32_chars_web";
        let web = pool(name, PoolKind::Shared, "1-511", Smt::Threads);
        let s = State::with_pools(vec![web.clone()]);
        let devices: Vec<v1beta1::Device> =
            devices::list(&s, &t, &web, 100, &BTreeSet::new(), &t.online()).into_iter().map(encode).collect();
        assert_eq!(devices.len(), 5110);
        let bytes = v1beta1::ListAndWatchResponse { devices }.encoded_len();
        assert!(bytes < 512 * 1024, "{bytes} bytes at the default unit");

        let max = crate::config::MAX_SHARED_DEVICES;
        let nodes: Vec<v1beta1::NumaNode> = (0..8).map(|id| v1beta1::NumaNode { id }).collect();
        let devices = (0..max)
            .map(|i| v1beta1::Device {
                id: format!("milli-{name}-{i:05}"),
                health: devices::UNHEALTHY.to_owned(),
                topology: Some(v1beta1::TopologyInfo { nodes: nodes.clone() }),
            })
            .collect();
        let bytes = v1beta1::ListAndWatchResponse { devices }.encoded_len();
        assert!(bytes < 2 * 1024 * 1024, "{bytes} bytes at {max} devices");
    }
}
