//! This node's ResourceSlices: the pools served by DRA (`dra = true`), as the devices of
//! [`crate::core::dra`], published for the scheduler under the driver `dra.<resource_prefix>`.
//!
//! ```text
//! engine snapshots ──► Snapshot::dra_devices (core::dra::devices, capacity cut to the CPUs
//!                      │             a container can be given now: online, in the pod cgroup)
//! ResourceSlice watch ─┤ (spec.nodeName=<node>, spec.driver=<driver>: what the API server has)
//!                      ▼
//!                    plan: the slices wanted vs the slices seen ── equal: no write
//!                      │ different: generation + 1, server-side apply of every slice
//!                      ▼ (field manager cpupoold, force), then delete the slices left over
//!                    API server (a failure: retried with backoff, the plan made again)
//! ```
//!
//! One pool (in the API's sense) per node, named after the node, as node-local drivers do. Its
//! devices go into slices of at most [`MAX_DEVICES`] (the API's `ResourceSliceMaxDevices`),
//! `<node>-<driver>-<i>`; a node with more devices than that (pools × NUMA nodes over 128)
//! gets several slices of one generation, each with `resourceSliceCount` saying how many.
//! Every change of the devices bumps the pool's generation in all of them; a slice deleted or
//! edited by someone else (the kubelet removes its node's slices of a driver whose plugin is
//! not registered with it) is seen through the watch and written again. Nothing is written while
//! what the API server has is what the pools say, and nothing before the first listing, which
//! also lets a restarted daemon adopt its own slices without a write. A slice the API server
//! still has as this daemon wrote it (the resourceVersion of the write) counts as the spec that
//! was applied: an API server that drops fields it does not serve (its `DRAConsumableCapacity`
//! gate off) gets one warning, not a write for every change of the engine. With no pool served
//! by DRA there is no slice: any left from before are deleted.
//!
//! A device carries the attributes `pool`, `kind`, `isolated`, `wholeCores`, `l3Group` (its
//! one L3 group) or `l3Groups` (a list such as `0-3`), and `resource.kubernetes.io/numaNode`
//! when its CPUs are on one node: at most 8 of the 32 attributes and capacities a device may
//! have. Its one capacity `cpu` has the request policy `default` = `validRange.min` =
//! `validRange.step` = the device's step; where one step is all the capacity holds (the API
//! wants `min + step <= capacity`) the range is `min` = `max` = the step instead, which allows
//! the same single amount.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Device, DeviceAttribute, DeviceCapacity, ResourcePool,
    ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::sync::{mpsc, watch};

use super::report::FIELD_MANAGER;
use crate::backoff::Backoff;
use crate::core::cpuset::CpuSet;
use crate::core::dra::{self, DraDevice};
use crate::engine::Handle;

/// The most devices one ResourceSlice may list (`ResourceSliceMaxDevices`).
pub const MAX_DEVICES: usize = 128;
/// The most attributes and capacities one device may have together
/// (`ResourceSliceMaxAttributesAndCapacitiesPerDevice`).
pub const MAX_ATTRIBUTES_AND_CAPACITIES: usize = 32;
/// The longest string attribute value (`DeviceAttributeMaxValueLength`).
pub const MAX_STRING_ATTRIBUTE: usize = 64;
/// The longest object name (a DNS subdomain).
const MAX_NAME: usize = 253;

/// Whose slices these are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The node, which is also the pool's name.
    pub node: String,
    /// The driver ([`dra::driver_name`]).
    pub driver: String,
    /// `kubelet.millicpus_per_device`: a shared pool's step.
    pub millis_per_device: u64,
}

impl Target {
    /// The slices of `node`, under the driver and steps `kubelet` names
    /// (`kubelet.resource_prefix`, `kubelet.millicpus_per_device`).
    pub fn new(node: &str, kubelet: &crate::config::Kubelet) -> Target {
        Target {
            node: node.to_owned(),
            driver: dra::driver_name(&kubelet.resource_prefix),
            millis_per_device: kubelet.millicpus_per_device,
        }
    }
}

/// The name of slice `index` of `node`'s pool: `<node>-<driver>-<index>`. A node name too long
/// for that is cut, and a hash of the whole name keeps it apart from other nodes.
pub fn slice_name(node: &str, driver: &str, index: usize) -> String {
    let suffix = format!("-{driver}-{index}");
    let room = MAX_NAME.saturating_sub(suffix.len());
    if node.len() <= room {
        return format!("{node}{suffix}");
    }
    // FNV-1a: stable across builds and machines, which the names must be.
    let hash = node.bytes().fold(0x811c_9dc5u32, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193));
    let cut = node[..room.saturating_sub(9)].trim_end_matches(['-', '.']);
    format!("{cut}-{hash:08x}{suffix}")
}

fn string(s: impl Into<String>) -> DeviceAttribute {
    DeviceAttribute { string: Some(s.into()), ..DeviceAttribute::default() }
}

fn int(n: u32) -> DeviceAttribute {
    DeviceAttribute { int: Some(i64::from(n)), ..DeviceAttribute::default() }
}

fn boolean(b: bool) -> DeviceAttribute {
    DeviceAttribute { bool: Some(b), ..DeviceAttribute::default() }
}

/// The attributes of `d` (names without a domain are in the driver's).
fn attributes(d: &DraDevice) -> BTreeMap<String, DeviceAttribute> {
    let mut a = BTreeMap::from([
        ("pool".to_owned(), string(d.pool.as_str())),
        ("kind".to_owned(), string(d.kind.to_string())),
        ("isolated".to_owned(), boolean(d.isolated)),
        ("wholeCores".to_owned(), boolean(d.whole_cores)),
    ]);
    if let Some(node) = d.numa {
        a.insert(dra::ATTR_NUMA.to_owned(), int(node));
    }
    match d.l3.as_slice() {
        [] => {}
        [one] => drop(a.insert("l3Group".to_owned(), int(*one))),
        many => {
            // The ids as a list (`0-3,8`); a list longer than an attribute may be is left out.
            let list = many.iter().copied().collect::<CpuSet>().to_string();
            if list.len() <= MAX_STRING_ATTRIBUTE {
                a.insert("l3Groups".to_owned(), string(list));
            }
        }
    }
    a
}

/// What a request may consume of `d`'s `cpu`: whole steps, one step when it names no amount.
fn request_policy(d: &DraDevice) -> CapacityRequestPolicy {
    let step = Quantity(d.step.to_string());
    let valid_range = if d.capacity.0 >= d.step.0.saturating_mul(2) {
        CapacityRequestPolicyRange { min: step.clone(), step: Some(step.clone()), max: None }
    } else {
        CapacityRequestPolicyRange { min: step.clone(), step: None, max: Some(step.clone()) }
    };
    CapacityRequestPolicy { default: Some(step), valid_range: Some(valid_range), valid_values: None }
}

/// `d` as a ResourceSlice device.
pub fn device(d: &DraDevice) -> Device {
    let capacity =
        DeviceCapacity { value: Quantity(d.capacity.to_string()), request_policy: Some(request_policy(d)) };
    Device {
        name: d.name.clone(),
        attributes: Some(attributes(d)),
        capacity: Some(BTreeMap::from([(dra::CAPACITY.to_owned(), capacity)])),
        allow_multiple_allocations: Some(true),
        ..Device::default()
    }
}

/// The slices for `devices` at `generation`: none without devices, else one per
/// [`MAX_DEVICES`] devices, in device order.
pub fn build(node: &str, driver: &str, devices: &[DraDevice], generation: i64) -> Vec<ResourceSlice> {
    let chunks: Vec<&[DraDevice]> = devices.chunks(MAX_DEVICES).collect();
    let count = chunks.len() as i64;
    chunks
        .into_iter()
        .enumerate()
        .map(|(i, chunk)| {
            let mut slice = ResourceSlice {
                spec: ResourceSliceSpec {
                    driver: driver.to_owned(),
                    node_name: Some(node.to_owned()),
                    pool: ResourcePool { name: node.to_owned(), generation, resource_slice_count: count },
                    devices: Some(chunk.iter().map(device).collect()),
                    ..ResourceSliceSpec::default()
                },
                ..ResourceSlice::default()
            };
            slice.metadata.name = Some(slice_name(node, driver, i));
            slice
        })
        .collect()
}

/// The writes that make the API server's slices (`seen`, by name) say `devices`.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The pool's new generation.
    pub generation: i64,
    /// The slices to apply, in order.
    pub apply: Vec<ResourceSlice>,
    /// The slices to delete once they are applied.
    pub delete: Vec<String>,
}

fn generation(s: &ResourceSlice) -> i64 {
    s.spec.pool.generation
}

/// `None` when `seen` already says `devices` (every slice wanted, at one generation, and no
/// other); else every slice at a generation above both `seen`'s and `last` (the last one
/// written), and the slices to delete.
pub fn plan(
    seen: &BTreeMap<String, ResourceSlice>,
    target: &Target,
    devices: &[DraDevice],
    last: i64,
) -> Option<Plan> {
    let current = seen.values().map(generation).max().unwrap_or(0);
    let wanted = build(&target.node, &target.driver, devices, current);
    let same = seen.len() == wanted.len()
        && wanted.iter().all(|w| {
            let name = w.metadata.name.as_deref().unwrap_or_default();
            seen.get(name).is_some_and(|s| s.spec == w.spec)
        });
    if same {
        return None;
    }
    let generation = last.max(current) + 1;
    let apply = build(&target.node, &target.driver, devices, generation);
    let keep: Vec<&str> = apply.iter().filter_map(|s| s.metadata.name.as_deref()).collect();
    let delete = seen.keys().filter(|n| !keep.contains(&n.as_str())).cloned().collect();
    Some(Plan { generation, apply, delete })
}

/// What the slice watch tells the publisher.
enum Seen {
    /// A fresh listing.
    Listed(Vec<ResourceSlice>),
    Applied(ResourceSlice),
    Deleted(ResourceSlice),
}

/// Keeps this node's slices equal to its DRA pools until `stop` is set.
pub async fn run(client: Client, target: Target, handle: Handle, mut stop: watch::Receiver<bool>) {
    let api: Api<ResourceSlice> = Api::all(client);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let watch_task = tokio::spawn(watch_slices(api.clone(), target.clone(), tx, stop.clone()));
    let mut snapshots = handle.watch();
    let mut writer = Writer {
        api,
        target,
        seen: None,
        applied: BTreeMap::new(),
        ours: BTreeMap::new(),
        generation: 0,
        failing: false,
        dropped: false,
    };
    let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));
    let mut retry_at: Option<tokio::time::Instant> = None;
    loop {
        let retry = async {
            match retry_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = crate::kubernetes::apiserver::stopped(&mut stop) => break,
            r = snapshots.changed() => if r.is_err() { break },
            m = rx.recv() => match m {
                Some(m) => writer.observe(m),
                None => break,
            },
            _ = retry => retry_at = None,
        }
        // Take what is queued first (a listing and the changes after it are one decision),
        // and wait out the pause after a failure: the snapshot then is the latest.
        if !rx.is_empty() || retry_at.is_some() {
            continue;
        }
        let devices = snapshots.borrow_and_update().dra_devices(writer.target.millis_per_device);
        match writer.sync(&devices).await {
            Ok(()) => backoff.reset(),
            Err(()) => retry_at = Some(tokio::time::Instant::now() + backoff.fail()),
        }
    }
    let _ = watch_task.await;
}

/// Follows this node's slices of this driver: the listing, then each change.
async fn watch_slices(
    api: Api<ResourceSlice>,
    target: Target,
    tx: mpsc::UnboundedSender<Seen>,
    mut stop: watch::Receiver<bool>,
) {
    let fields = format!("spec.nodeName={},spec.driver={}", target.node, target.driver);
    let mut listing = Vec::new();
    super::watch::follow(
        "ResourceSlices",
        api,
        watcher::Config::default().fields(&fields),
        |event| match event {
            watcher::Event::Init => listing.clear(),
            watcher::Event::InitApply(s) => listing.push(s),
            watcher::Event::InitDone => drop(tx.send(Seen::Listed(std::mem::take(&mut listing)))),
            watcher::Event::Apply(s) => drop(tx.send(Seen::Applied(s))),
            watcher::Event::Delete(s) => drop(tx.send(Seen::Deleted(s))),
        },
        &mut stop,
    )
    .await;
}

/// `seen` with each slice that the API server still has as this daemon wrote it (the
/// resourceVersion its write returned) taken at the spec that was applied: an API server that
/// leaves out fields it does not serve (a feature gate off) must not make every later change
/// of the engine look like a change of the devices.
pub fn as_applied(
    seen: &BTreeMap<String, ResourceSlice>,
    applied: &BTreeMap<String, (String, ResourceSliceSpec)>,
) -> BTreeMap<String, ResourceSlice> {
    seen.iter()
        .map(|(name, s)| {
            let mut s = s.clone();
            if let Some((version, spec)) = applied.get(name) {
                if s.metadata.resource_version.as_ref() == Some(version) {
                    s.spec = spec.clone();
                }
            }
            (name.clone(), s)
        })
        .collect()
}

/// How many of its own writes' resourceVersions per slice the writer knows again.
const OWN_ECHOES: usize = 16;

/// Whether a watch event with `version` is the late echo of one of this daemon's writes
/// (`ours`, oldest first) other than the last: the write after it is already seen.
pub fn late_echo(ours: Option<&std::collections::VecDeque<String>>, version: Option<&str>) -> bool {
    let (Some(ours), Some(version)) = (ours, version) else { return false };
    ours.iter().rev().skip(1).any(|v| v == version)
}

/// Writes the slices; remembers what the API server has.
struct Writer {
    api: Api<ResourceSlice>,
    target: Target,
    /// The slices by name as last listed, watched or written; `None` before the first listing.
    seen: Option<BTreeMap<String, ResourceSlice>>,
    /// Each slice this daemon wrote: the resourceVersion the write returned, the spec applied.
    applied: BTreeMap<String, (String, ResourceSliceSpec)>,
    /// The resourceVersions this daemon's writes returned, the last [`OWN_ECHOES`] per slice:
    /// a watch event carrying one of them, other than the latest, is the late echo of an
    /// earlier write of ours and changes nothing. Any other event is what the API server has,
    /// whatever its generation says (someone else's edit may carry an older one).
    ours: BTreeMap<String, std::collections::VecDeque<String>>,
    /// The generation last written.
    generation: i64,
    failing: bool,
    /// Whether the API server was found dropping fields (logged once).
    dropped: bool,
}

impl Writer {
    fn observe(&mut self, m: Seen) {
        match m {
            Seen::Listed(list) => {
                self.seen =
                    Some(list.into_iter().filter_map(|s| Some((s.metadata.name.clone()?, s))).collect())
            }
            Seen::Applied(s) => {
                let (Some(seen), Some(name)) = (self.seen.as_mut(), s.metadata.name.clone()) else { return };
                if late_echo(self.ours.get(&name), s.metadata.resource_version.as_deref()) {
                    return;
                }
                seen.insert(name, s);
            }
            Seen::Deleted(s) => {
                if let (Some(seen), Some(name)) = (self.seen.as_mut(), s.metadata.name.as_ref()) {
                    seen.remove(name);
                }
            }
        }
    }

    /// Makes the API server's slices say `devices`. `Err` when it must be tried again later;
    /// the cause is logged, once per outage.
    async fn sync(&mut self, devices: &[DraDevice]) -> Result<(), ()> {
        let Some(seen) = self.seen.as_ref() else { return Ok(()) };
        let current = as_applied(seen, &self.applied);
        let Some(plan) = plan(&current, &self.target, devices, self.generation) else { return Ok(()) };
        self.generation = plan.generation;
        match self.write(&plan).await {
            Ok(()) => {
                if self.failing {
                    log::info!("k8s: the ResourceSlices are written again");
                }
                self.failing = false;
                log::info!(
                    "k8s: published {} DRA device(s) of node {} in {} ResourceSlice(s), pool generation {}{}",
                    devices.len(),
                    self.target.node,
                    plan.apply.len(),
                    plan.generation,
                    if plan.delete.is_empty() {
                        String::new()
                    } else {
                        format!("; deleted {}", plan.delete.join(", "))
                    }
                );
                Ok(())
            }
            Err((what, e)) => {
                let msg = crate::kubernetes::apiserver::describe(&e);
                if !self.failing {
                    log::warn!("k8s: {what}: {msg}; retrying with backoff");
                } else {
                    log::debug!("k8s: {what}: {msg}");
                }
                self.failing = true;
                Err(())
            }
        }
    }

    /// Applies `plan`'s slices, then deletes the ones left over; stops at the first failure,
    /// saying what failed.
    async fn write(&mut self, plan: &Plan) -> Result<(), (String, kube::Error)> {
        let params = PatchParams::apply(FIELD_MANAGER).force();
        for slice in &plan.apply {
            let name = slice.metadata.name.clone().unwrap_or_default();
            let what = || format!("applying ResourceSlice {name}");
            let body = serde_json::to_value(slice).map_err(|e| (what(), kube::Error::SerdeError(e)))?;
            let written =
                self.api.patch(&name, &params, &Patch::Apply(body)).await.map_err(|e| (what(), e))?;
            if written.spec != slice.spec && !self.dropped {
                log::warn!(
                    "k8s: the API server keeps ResourceSlice {name} otherwise than applied (fields it does not \
                     serve are dropped: are the DRAConsumableCapacity and DRAExtendedResource feature gates on?)"
                );
                self.dropped = true;
            }
            let version = written.metadata.resource_version.clone().unwrap_or_default();
            let ours = self.ours.entry(name.clone()).or_default();
            ours.push_back(version.clone());
            while ours.len() > OWN_ECHOES {
                ours.pop_front();
            }
            self.applied.insert(name.clone(), (version, slice.spec.clone()));
            self.seen.get_or_insert_with(BTreeMap::new).insert(name, written);
        }
        for name in &plan.delete {
            match self.api.delete(name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(r)) if r.code == 404 => {}
                Err(e) => return Err((format!("deleting ResourceSlice {name}"), e)),
            }
            self.applied.remove(name);
            self.ours.remove(name);
            if let Some(seen) = self.seen.as_mut() {
                seen.remove(name);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
