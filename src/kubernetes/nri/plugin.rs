//! The plugin's ttRPC service: each method decodes its request, asks the engine's snapshot
//! ([`Snapshot::container_decision`](crate::engine::Snapshot::container_decision)) and the
//! engine, and encodes the answer. Requests are served one at a time (the runtime sends
//! them so, and the containers seen alive are one record).
//!
//! What fails closed and what fails open (the runtime fails a container when a plugin answers
//! an error, and drops a plugin that misses its deadline):
//! - a pooled container whose assignment cannot be held (its CPUs taken since) or whose
//!   environment is malformed is not created; one whose cgroup does not hold its CPUs at start
//!   is not started. Neither runs on CPUs the books do not show.
//! - an engine that does not answer within three quarters of the runtime's deadline fails the
//!   creation of a pooled container (nothing was decided for it), but not its start: the
//!   adjustment gave it its CPUs already, and the binding completes in the engine.
//! - keeping unpooled containers and pod sandboxes off the exclusive CPUs never fails a
//!   container: a write that fails is logged and tried again at the next event or resync.
//! - cpupoold writes only cgroups an assignment could target (not a host slice, `init.scope`,
//!   `cpupool.slice`, a pool's slice or an ancestor of one, nor one nested with an
//!   assignment's target): an unpooled container or sandbox whose `cgroups_path` names such a
//!   cgroup fails open (created and started with no CPUs adjusted, its cgroup left alone, the
//!   refusal logged once); a pooled one fails closed (not created).

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prost::Message;
use tokio::sync::Mutex;

use super::bind::owner_of;
use super::context::{env_of, name_of, Call, Seen};
use super::proto::{self as api, Event};
use super::ttrpc::{code, Reply, Service, Status};
use super::{Options, DEFAULT_REQUEST_TIMEOUT, PLUGIN_SERVICE};
use crate::core::container::{self, Decision};
use crate::core::cpuset::CpuSet;
use crate::core::state::{AssignSpec, AssignmentId, CgroupPath, Target};
use crate::engine::Handle;
use crate::error_chain;
use crate::kubernetes::grpc::clients::{self, Holder};

mod confine;
use confine::{confine, ours, release_orphans};

/// The events followed. Every bit is within NRI v0.6.1's mask (0x7FF), which refuses a plugin
/// that asks for one it does not know.
pub(super) const EVENTS: i32 = bit(Event::RunPodSandbox)
    | bit(Event::StopPodSandbox)
    | bit(Event::RemovePodSandbox)
    | bit(Event::CreateContainer)
    | bit(Event::StartContainer)
    | bit(Event::UpdateContainer)
    | bit(Event::StopContainer)
    | bit(Event::RemoveContainer);

const fn bit(e: Event) -> i32 {
    1 << (e as i32 - 1)
}

/// The plugin's record of the runtime, rebuilt at every Synchronize.
#[derive(Default)]
struct Live {
    containers: HashMap<String, Seen>,
    /// Pod sandboxes (their pause containers' cgroups), by sandbox id.
    sandboxes: HashMap<String, CgroupPath>,
    /// The unpooled cgroups last given to the engine.
    unpooled: BTreeSet<CgroupPath>,
    /// Cgroups of live containers and sandboxes cpupoold may not write (said once each).
    refused: BTreeSet<CgroupPath>,
    /// A split Synchronize's parts so far (newer runtimes).
    pending: Option<(Vec<api::PodSandbox>, Vec<api::Container>)>,
    /// `containerd 1.7.24`, from Configure.
    runtime: String,
    /// The runtime's request timeout.
    timeout: Option<Duration>,
}

/// The plugin: one per connection.
pub(super) struct Plugin {
    handle: Handle,
    opts: Options,
    kubelet: clients::PodResources,
    live: Mutex<Live>,
    synced: AtomicBool,
}

impl Service for Plugin {
    fn call(
        self: Arc<Self>,
        service: &str,
        method: &str,
        payload: Vec<u8>,
        deadline: Option<Duration>,
    ) -> Reply {
        let (service, method) = (service.to_owned(), method.to_owned());
        Box::pin(async move { self.dispatch(&service, &method, payload, deadline).await })
    }
}

fn decode<M: Message + Default>(payload: &[u8]) -> Result<M, Status> {
    M::decode(payload)
        .map_err(|e| Status::new(code::INVALID_ARGUMENT, format!("cpupoold: decoding the request: {e}")))
}

fn empty() -> Vec<u8> {
    api::Empty {}.encode_to_vec()
}

fn cgroup_of(c: &api::Container) -> Option<CgroupPath> {
    c.linux.as_ref().and_then(|l| container::cgroup_of(&l.cgroups_path))
}

/// The CPUs a request already pins the container to (the kubelet's static CPU manager, or a
/// plugin before us): empty when none.
fn pinned(resources: Option<&api::LinuxResources>) -> &str {
    resources.and_then(|r| r.cpu.as_ref()).map_or("", |c| c.cpus.as_str())
}

fn resources(cpus: &CpuSet, mems: &CpuSet) -> api::LinuxResources {
    api::LinuxResources {
        cpu: Some(api::LinuxCpu { cpus: cpus.to_string(), mems: mems.to_string(), ..Default::default() }),
        memory: None,
    }
}

fn adjustment(cpus: &CpuSet, mems: &CpuSet) -> api::ContainerAdjustment {
    api::ContainerAdjustment {
        linux: Some(api::LinuxContainerAdjustment {
            resources: Some(resources(cpus, mems)),
            cgroups_path: String::new(),
        }),
        ..Default::default()
    }
}

impl Plugin {
    pub(super) fn new(handle: Handle, opts: Options) -> Plugin {
        let kubelet = clients::PodResources::new(opts.pod_resources.clone());
        Plugin { handle, opts, kubelet, live: Mutex::new(Live::default()), synced: AtomicBool::new(false) }
    }

    /// Whether the runtime synchronized with the plugin (it sends events only after).
    pub(super) fn synchronized(&self) -> bool {
        self.synced.load(Ordering::Relaxed)
    }

    async fn dispatch(
        &self,
        service: &str,
        method: &str,
        payload: Vec<u8>,
        deadline: Option<Duration>,
    ) -> Result<Vec<u8>, Status> {
        if service != PLUGIN_SERVICE {
            return Err(Status::new(code::UNIMPLEMENTED, format!("service {service}")));
        }
        let mut live = self.live.lock().await;
        // Engine calls get three quarters of what the runtime waits: the answer must be back
        // before it gives up on the plugin.
        let budget = deadline.or(live.timeout).unwrap_or(DEFAULT_REQUEST_TIMEOUT).mul_f32(0.75);
        let call = Call { handle: &self.handle, opts: &self.opts, kubelet: &self.kubelet, budget };
        match method {
            "Configure" => Ok(self.configure(&mut live, decode(&payload)?).encode_to_vec()),
            "Synchronize" => Ok(self.synchronize(&mut live, &call, decode(&payload)?).await.encode_to_vec()),
            "CreateContainer" => {
                let req: api::CreateContainerRequest = decode(&payload)?;
                let (pod, c) = (req.pod.unwrap_or_default(), req.container.unwrap_or_default());
                Ok(create(&mut live, &call, &pod, &c).await?.encode_to_vec())
            }
            "UpdateContainer" => Ok(update(&live, &call, decode(&payload)?).encode_to_vec()),
            "StopContainer" => {
                let req: api::StopContainerRequest = decode(&payload)?;
                let (pod, c) = (req.pod.unwrap_or_default(), req.container.unwrap_or_default());
                gone(&mut live, &call, &pod, &c, "stopped").await;
                Ok(api::StopContainerResponse::default().encode_to_vec())
            }
            "StateChange" => {
                let e: api::StateChangeEvent = decode(&payload)?;
                let event = e.event();
                event_of(&mut live, &call, event, e.pod.unwrap_or_default(), e.container).await?;
                Ok(empty())
            }
            // Newer runtimes call a method per event first.
            "RunPodSandbox" | "StopPodSandbox" | "RemovePodSandbox" => {
                let req: api::PodRequest = decode(&payload)?;
                let event = match method {
                    "RunPodSandbox" => Event::RunPodSandbox,
                    "StopPodSandbox" => Event::StopPodSandbox,
                    _ => Event::RemovePodSandbox,
                };
                event_of(&mut live, &call, event, req.pod.unwrap_or_default(), None).await?;
                Ok(empty())
            }
            "StartContainer" | "RemoveContainer" => {
                let req: api::ContainerRequest = decode(&payload)?;
                let event =
                    if method == "StartContainer" { Event::StartContainer } else { Event::RemoveContainer };
                event_of(&mut live, &call, event, req.pod.unwrap_or_default(), req.container).await?;
                Ok(empty())
            }
            "Shutdown" => Ok(empty()),
            _ => Err(Status::new(code::UNIMPLEMENTED, format!("method {method}"))),
        }
    }

    fn configure(&self, live: &mut Live, req: api::ConfigureRequest) -> api::ConfigureResponse {
        live.runtime = format!("{} {}", req.runtime_name, req.runtime_version).trim().to_owned();
        live.timeout =
            u64::try_from(req.request_timeout).ok().filter(|&ms| ms > 0).map(Duration::from_millis);
        log::info!(
            "NRI: registered with {} as {}-{}; containers get their pool's CPUs when they are created",
            live.runtime,
            super::PLUGIN_INDEX,
            super::PLUGIN_NAME
        );
        api::ConfigureResponse { events: EVENTS }
    }

    /// Every pod and container the runtime has, after every (re)connect: running pooled
    /// containers are bound to their assignments, the others kept off the exclusive CPUs, and
    /// kubelet assignments whose container is gone are released.
    async fn synchronize(
        &self,
        live: &mut Live,
        call: &Call<'_>,
        req: api::SynchronizeRequest,
    ) -> api::SynchronizeResponse {
        let (mut pods, mut containers) = live.pending.take().unwrap_or_default();
        pods.extend(req.pods);
        containers.extend(req.containers);
        if req.more {
            live.pending = Some((pods, containers));
            return api::SynchronizeResponse { update: Vec::new(), more: true };
        }
        live.containers.clear();
        live.sandboxes = pods.iter().filter_map(|p| Some((p.id.clone(), sandbox_cgroup(p)?))).collect();
        let by_id: HashMap<&str, &api::PodSandbox> = pods.iter().map(|p| (p.id.as_str(), p)).collect();
        let none = api::PodSandbox::default();
        let word = Word::ask(call).await;
        // Every cgroup the runtime says a container lives in, whether or not what it runs on
        // could be learnt below: a container whose devices the kubelet could not name now
        // still runs on its CPUs, and they are not an orphan's to release.
        let mut listed = BTreeSet::new();
        for c in &containers {
            use api::ContainerState as S;
            let started = match c.state() {
                S::ContainerRunning | S::ContainerPaused => true,
                S::ContainerCreated => false,
                S::ContainerStopped | S::ContainerUnknown => continue,
            };
            listed.extend(cgroup_of(c));
            let pod = by_id.get(c.pod_sandbox_id.as_str()).copied().unwrap_or(&none);
            match seen_for(call, &word, pod, c).await {
                Ok(seen) => {
                    let pooled = seen.assignment.is_some() || seen.claim.is_some();
                    live.containers.insert(c.id.clone(), Seen { started: started && !pooled, ..seen });
                    // A pooled one is bound (and read back) as at its start; the unpooled are
                    // confined together below.
                    if started && pooled {
                        if let Err(e) = start(live, call, pod, c).await {
                            log::warn!("NRI: {}", e.message);
                        }
                    }
                }
                Err(e) => log::warn!("NRI: {}", e.message),
            }
        }
        release_orphans(live, call, &listed).await;
        super::claim::alive(call, &live.containers).await;
        confine(live, call).await;
        self.synced.store(true, Ordering::Relaxed);
        let _ = self.handle.set_nri(Some(live.runtime.clone())).await;
        log::info!(
            "NRI: synchronized with {}: {} pod(s), {} container(s)",
            live.runtime,
            pods.len(),
            live.containers.len()
        );
        api::SynchronizeResponse { update: Vec::new(), more: false }
    }
}

/// The kubelet's word on which container holds which of our devices (PodResources).
enum Word {
    /// No kubelet here (no PodResources socket): nobody holds a device.
    NoKubelet,
    /// It could not be asked.
    Unreachable(String),
    /// The holders, by (namespace, pod, container).
    Holders(HashMap<(String, String, String), (String, Holder)>),
}

impl Word {
    async fn ask(call: &Call<'_>) -> Word {
        if !call.kubelet.socket().exists() {
            return Word::NoKubelet;
        }
        let list = match tokio::time::timeout(call.budget / 2, call.kubelet.list()).await {
            Ok(Ok(l)) => l,
            Ok(Err(e)) => return Word::Unreachable(e),
            Err(_) => return Word::Unreachable(format!("no answer within {:?}", call.budget / 2)),
        };
        let prefix = format!("{}/", call.opts.resource_prefix);
        let by_container = clients::holders(list, &prefix)
            .into_iter()
            .map(|(id, h)| ((h.namespace.clone(), h.pod.clone(), h.container.clone()), (id, h)))
            .collect();
        Word::Holders(by_container)
    }
}

/// The pause container's cgroup.
fn sandbox_cgroup(p: &api::PodSandbox) -> Option<CgroupPath> {
    p.linux.as_ref().and_then(|l| container::cgroup_of(&l.cgroups_path))
}

/// What `c` runs on: the assignment of the allocation the kubelet says it holds (held again
/// if it was released), or none. The container's own `CPUPOOL_ASSIGNMENT` is only compared:
/// a pod's author writes its environment, and could name another pod's CPUs there.
async fn seen_for(
    call: &Call<'_>,
    word: &Word,
    pod: &api::PodSandbox,
    c: &api::Container,
) -> Result<Seen, Status> {
    let snap = call.handle.snapshot();
    let who = name_of(pod, c);
    if let Some(held) = super::claim::held_for(&snap, pod, c, &who)? {
        return Ok(Seen {
            owner: owner_of(pod, c),
            cgroup: cgroup_of(c),
            assignment: None,
            started: false,
            claim: Some(held),
        });
    }
    let claimed = env_of(c, cpupool_wire::names::ENV_ASSIGNMENT);
    let holder = match word {
        Word::Holders(h) => h.get(&(pod.namespace.clone(), pod.name.clone(), c.name.clone())),
        Word::NoKubelet => None,
        // Whether it holds devices cannot be told: a container that says it does is not
        // created (the kubelet tries again); one that does not say so gets no pool's CPUs.
        Word::Unreachable(e) => match claimed {
            Some(_) => {
                return Err(Status::new(
                    code::UNAVAILABLE,
                    format!("cpupoold: container {who}: the kubelet's PodResources cannot say which CPUs it holds: {e}"),
                ))
            }
            None => None,
        },
    };
    let alloc = match holder {
        Some((id, h)) => {
            if let Some(claim) = claimed.filter(|c| c != id) {
                log::warn!("NRI: container {who} names {claim} in its environment, but the kubelet says it holds {id}");
            }
            Some((h.pool.as_str(), h.devices.iter().cloned().collect::<Vec<String>>()))
        }
        None => {
            if let Some(claim) = claimed {
                log::warn!(
                    "NRI: container {who} names {claim} in its environment, but the kubelet says it holds none of \
                     our devices: it gets no pool's CPUs"
                );
            }
            None
        }
    };
    let held = alloc.as_ref().map(|(pool, ids)| (*pool, ids.as_slice()));
    let decision = snap
        .container_decision(held, call.opts.millis_per_device)
        .map_err(|e| Status::new(code::FAILED_PRECONDITION, format!("cpupoold: container {who}: {e}")))?;
    let assignment = match decision {
        Decision::Pooled { id, .. } => Some(id),
        Decision::Rebook(spec) => Some(rebook(call, &who, spec).await?),
        Decision::Unpooled { .. } => None,
    };
    Ok(Seen { owner: owner_of(pod, c), cgroup: cgroup_of(c), assignment, started: false, claim: None })
}

/// Holds again the allocation of a container whose assignment was released when its previous
/// container stopped: the kubelet restarts a container with the devices it had.
async fn rebook(call: &Call<'_>, who: &str, spec: AssignSpec) -> Result<AssignmentId, Status> {
    let pool = spec.pool.clone();
    let made = match call.within(call.handle.assign_all(vec![spec])).await {
        Some(Ok(made)) => made,
        Some(Err(e)) => {
            return Err(Status::new(
                code::FAILED_PRECONDITION,
                format!(
                    "cpupoold: container {who}: its CPUs of pool {pool} cannot be held again: {}",
                    error_chain(&e)
                ),
            ))
        }
        None => {
            return Err(Status::new(
                code::UNAVAILABLE,
                format!("cpupoold: container {who}: the engine did not answer within {:?}", call.budget),
            ))
        }
    };
    let Some(a) = made.into_iter().next().map(|o| o.into_inner()) else {
        return Err(Status::new(
            code::INTERNAL,
            format!("cpupoold: container {who}: the engine held nothing"),
        ));
    };
    log::info!(
        POOL = pool.as_str(), ASSIGNMENT = a.id.as_str();
        "NRI: CPUs {} of pool {pool} held again for container {who} ({})", a.cpus, a.id
    );
    Ok(a.id)
}

/// CreateContainer: the adjustment.
async fn create(
    live: &mut Live,
    call: &Call<'_>,
    pod: &api::PodSandbox,
    c: &api::Container,
) -> Result<api::CreateContainerResponse, Status> {
    let who = name_of(pod, c);
    let seen = seen_for(call, &Word::ask(call).await, pod, c).await?;
    let snap = call.handle.snapshot();
    let before = pinned(c.linux.as_ref().and_then(|l| l.resources.as_ref())).to_owned();
    if let Some(cg) = &seen.cgroup {
        let except = seen.assignment.clone().unwrap_or_else(AssignmentId::none);
        if let Err(reason) = ours(live, &snap, cg, &except, &format!("container {who}")) {
            if let Some(id) = &seen.assignment {
                return Err(Status::new(
                    code::FAILED_PRECONDITION,
                    format!("cpupoold: container {who} would not run on the CPUs of {id}: {reason}"),
                ));
            }
            live.containers.insert(c.id.clone(), seen);
            return Ok(api::CreateContainerResponse::default());
        }
    }
    let (cpus, mems) = match (&seen.assignment, &seen.claim) {
        (_, Some(held)) => (held.cpus.clone(), snap.mems_of(&held.cpus)),
        (Some(id), None) => {
            let Some(a) = snap.assignment(id) else {
                return Err(Status::new(
                    code::FAILED_PRECONDITION,
                    format!("cpupoold: container {who}: {id} is gone"),
                ));
            };
            if !before.is_empty() && CpuSet::parse(&before).ok().as_ref() != Some(&a.cpus) {
                log::warn!(
                    "NRI: container {who} was pinned to CPUs {before} before cpupoold (the kubelet's static CPU \
                     manager?); it gets {} of pool {} instead. Set the kubelet's cpuManagerPolicy to none.",
                    a.cpus,
                    a.pool
                );
            }
            (a.cpus.clone(), snap.mems_of(&a.cpus))
        }
        (None, None) => {
            if !before.is_empty() {
                // Someone else decided (the kubelet's static CPU manager gives Guaranteed pods
                // their own CPUs): theirs stands; said when it reaches the exclusive pools.
                let exclusive = snap.exclusive_cpus();
                if CpuSet::parse(&before).is_ok_and(|b| !b.is_disjoint(&exclusive)) {
                    log::warn!(
                        "NRI: container {who} is pinned to CPUs {before} by someone else (the kubelet's static \
                         CPU manager?), which include exclusive pool CPUs {exclusive}; cpupoold leaves it. Keep \
                         those CPUs in the kubelet's reservedSystemCPUs, or set cpuManagerPolicy: none."
                    );
                }
                live.containers.insert(c.id.clone(), Seen { assignment: None, ..seen });
                return Ok(api::CreateContainerResponse::default());
            }
            let cpus = snap.unpooled_cpus();
            let mems = snap.mems_of(&cpus);
            (cpus, mems)
        }
    };
    log::debug!("NRI: container {who} is created on CPUs {cpus}");
    live.containers.insert(c.id.clone(), seen);
    Ok(api::CreateContainerResponse { adjust: Some(adjustment(&cpus, &mems)), ..Default::default() })
}

/// StartContainer: the container's cgroup exists (its first instruction has not run): a
/// pooled container's assignment is pointed at it and read back; an unpooled one joins the
/// containers kept off the exclusive CPUs.
async fn start(
    live: &mut Live,
    call: &Call<'_>,
    pod: &api::PodSandbox,
    c: &api::Container,
) -> Result<(), Status> {
    let who = name_of(pod, c);
    let seen = match live.containers.get(&c.id) {
        Some(s) => s.clone(),
        None => seen_for(call, &Word::ask(call).await, pod, c).await?,
    };
    live.containers.insert(c.id.clone(), Seen { started: true, ..seen.clone() });
    if let Some(held) = &seen.claim {
        // A start refused is no survivor to bind the claim to (claim::unbind).
        let r = super::claim::start(call, pod, c, held, seen.cgroup).await;
        live.containers.entry(c.id.clone()).and_modify(|s| s.started = r.is_ok());
        return r;
    }
    let Some(id) = seen.assignment else {
        confine(live, call).await;
        return Ok(());
    };
    let Some(cgroup) = seen.cgroup else {
        log::warn!("NRI: container {who} has no cgroup cpupoold can name; {id} stays unbound");
        return Ok(());
    };
    super::bind::bind(call, pod, c, &id, cgroup, id.as_str()).await
}

/// StopContainer, RemoveContainer: a pooled container's assignment is released when it is
/// bound to this container (or to none, and no other live container uses it); an unpooled one
/// leaves the confined set.
async fn gone(live: &mut Live, call: &Call<'_>, pod: &api::PodSandbox, c: &api::Container, how: &str) {
    let who = name_of(pod, c);
    let seen = live.containers.remove(&c.id);
    let (cgroup, assignment) = match seen {
        Some(s) => (s.cgroup, s.assignment),
        None => {
            // Not seen alive (cpupoold restarted since it stopped): the kubelet assignment
            // bound to its cgroup, if one is.
            let cgroup = cgroup_of(c);
            let bound = cgroup.as_ref().and_then(|cg| call.handle.snapshot().kubelet_bound_to(cg));
            (cgroup, bound)
        }
    };
    let why = format!("container {who} {how}");
    super::claim::unbind(call, &live.containers, |p| Some(p) == cgroup.as_ref(), &why).await;
    if let Some(cg) = &cgroup {
        if let Some(Err(e)) = call.within(call.handle.stopped(BTreeSet::from([cg.clone()]))).await {
            log::warn!("NRI: recording that {why}: {}", error_chain(&e));
        }
    }
    let Some(id) = assignment else {
        confine(live, call).await;
        return;
    };
    let snap = call.handle.snapshot();
    let Some(a) = snap.assignment(&id) else { return };
    let bound_here = matches!((&a.target, &cgroup), (Target::Cgroup(t), Some(cg)) if t == cg);
    let unbound = matches!(a.target, Target::Kubelet(_))
        && !live.containers.values().any(|s| s.assignment.as_ref() == Some(&id));
    if !(bound_here || unbound) {
        return;
    }
    match call.within(call.handle.release(id.as_str())).await {
        Some(Ok(a)) => log::info!(
            POOL = a.pool.as_str(), ASSIGNMENT = id.as_str();
            "NRI: released {id} (CPUs {} of pool {}): container {who} {how}", a.cpus, a.pool
        ),
        Some(Err(e)) => log::warn!("NRI: releasing {id} of container {who}: {}", error_chain(&e)),
        None => log::warn!("NRI: releasing {id} of container {who} took longer than {:?}", call.budget),
    }
}

/// UpdateContainer: a pooled container keeps its CPUs whatever the update asks (the kubelet's
/// static CPU manager sends its own); the update is answered with them, and said.
fn update(live: &Live, call: &Call<'_>, req: api::UpdateContainerRequest) -> api::UpdateContainerResponse {
    let (pod, c) = (req.pod.unwrap_or_default(), req.container.unwrap_or_default());
    let asked = pinned(req.linux_resources.as_ref());
    let Some(Seen { assignment: Some(id), .. }) = live.containers.get(&c.id) else {
        return api::UpdateContainerResponse::default();
    };
    let snap = call.handle.snapshot();
    let Some(a) = snap.assignment(id) else { return api::UpdateContainerResponse::default() };
    if asked.is_empty() || CpuSet::parse(asked).ok().as_ref() == Some(&a.cpus) {
        return api::UpdateContainerResponse::default();
    }
    log::warn!(
        "NRI: an update asked container {} onto CPUs {asked} (the kubelet's static CPU manager?); it keeps \
         CPUs {} of pool {} ({id}). Set the kubelet's cpuManagerPolicy to none.",
        name_of(&pod, &c),
        a.cpus,
        a.pool
    );
    let update = api::ContainerUpdate {
        container_id: c.id.clone(),
        linux: Some(api::LinuxContainerUpdate {
            resources: Some(resources(&a.cpus, &snap.mems_of(&a.cpus))),
        }),
        ignore_failure: false,
    };
    api::UpdateContainerResponse { update: vec![update], evict: Vec::new() }
}

/// The events that come as StateChange (NRI before v0.12), or as methods of their own.
async fn event_of(
    live: &mut Live,
    call: &Call<'_>,
    event: Event,
    pod: api::PodSandbox,
    c: Option<api::Container>,
) -> Result<(), Status> {
    match (event, c) {
        (Event::RunPodSandbox, _) => {
            if let Some(cg) = sandbox_cgroup(&pod) {
                live.sandboxes.insert(pod.id.clone(), cg);
                confine(live, call).await;
            }
        }
        (Event::StopPodSandbox | Event::RemovePodSandbox, _) if live.sandboxes.remove(&pod.id).is_some() => {
            confine(live, call).await;
        }
        (Event::StartContainer, Some(c)) => start(live, call, &pod, &c).await?,
        (Event::StopContainer, Some(c)) => gone(live, call, &pod, &c, "stopped").await,
        (Event::RemoveContainer, Some(c)) => gone(live, call, &pod, &c, "was removed").await,
        _ => {}
    }
    Ok(())
}
