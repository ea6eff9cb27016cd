//! Preparing and unpreparing one claim. Prepare: the record answers a claim prepared before
//! (the kubelet asks again after its restart, or ours); otherwise the claim is read from the
//! API server, its results of this driver on this node's pool decoded ([`core::dra::resolve`]),
//! and its CPUs booked as one engine transaction ([`Handle::assign_all`]: all or nothing,
//! durable before it answers), assignment `dra-<uid>-<n>` per device; then the CDI spec and
//! the record are written, and a failure there gives the CPUs back. Every refusal names the
//! claim, and the field, device and pool at fault.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::{Api, Client};

use super::Options;
use crate::core::cpuset::CpuSet;
use crate::core::dra::{self as model, Millis};
use crate::core::pool::PoolKind;
use crate::core::state::{AssignSpec, Assignment, AssignmentId, Target};
use crate::engine::Handle;
use crate::error_chain;
use crate::host::cdi::{self, CdiDir};
use crate::host::kubelet::claims::{self, Claims, PreparedClaim, PreparedDevice};
use crate::host::kubelet::proto::dra;

/// Prepares and unprepares claims; shared by every call of the endpoint.
pub(super) struct Driver {
    handle: Handle,
    client: Client,
    opts: Options,
    records: Claims,
    cdi: CdiDir,
}

/// One result of the claim for this driver and node.
struct Ours {
    request: String,
    device: String,
    consumed: Option<Millis>,
}

impl Driver {
    pub(super) fn new(handle: Handle, client: Client, opts: Options) -> Driver {
        let (records, cdi) = (Claims::new(&opts.state_dir), CdiDir::new(&opts.cdi_dir));
        Driver { handle, client, opts, records, cdi }
    }

    /// Prepares `c`; the devices to answer, or why not (naming the claim).
    pub(super) async fn prepare(&self, c: &dra::Claim) -> Result<Vec<dra::Device>, String> {
        let who = format!("claim {}/{} (uid {})", c.namespace, c.name, c.uid);
        if !claims::valid_uid(&c.uid) {
            return Err(format!("{who}: uid: not 1-{} characters of A-Z a-z 0-9 -", claims::MAX_UID));
        }
        if let Err(e) = cdi::check_device_name(&c.uid) {
            return Err(format!("{who}: uid: not a CDI device name: {e}"));
        }
        if let Some(rec) = self.records.load(&c.uid).map_err(|e| format!("{who}: {}", error_chain(&e)))? {
            if !self.cdi.has(&c.uid) {
                self.write_cdi(&rec).map_err(|e| format!("{who}: {e}"))?;
            }
            return Ok(rec.devices.iter().map(to_wire).collect());
        }
        let claim = Api::<ResourceClaim>::namespaced(self.client.clone(), &c.namespace)
            .get(&c.name)
            .await
            .map_err(|e| format!("{who}: reading it from the API server: {}", crate::k8s::describe(&e)))?;
        let uid = claim.metadata.uid.clone().unwrap_or_default();
        if uid != c.uid {
            return Err(format!(
                "{who}: metadata.uid is `{uid}` on the API server: not the claim the kubelet names"
            ));
        }
        let ours = ours(&claim, &self.opts).map_err(|e| format!("{who}: {e}"))?;
        let made = self.book(&c.uid, &ours).await.map_err(|e| format!("{who}: {e}"))?;
        let rec = record(c, &claim, &ours, &made, &self.opts);
        if let Err(e) = self.write_cdi(&rec).and_then(|()| {
            self.records.save(&rec).map_err(|e| {
                format!("recording it in `{}`: {}", self.opts.state_dir.display(), error_chain(&e))
            })
        }) {
            self.give_back(&rec.assignments).await;
            let _ = self.cdi.remove(&c.uid);
            return Err(format!("{who}: {e}; its CPUs were given back"));
        }
        log::info!(
            "DRA: prepared {who}: CPUs {} ({})",
            union(&made),
            made.iter().map(|a| format!("{} of pool {}", a.id, a.pool)).collect::<Vec<_>>().join(", ")
        );
        Ok(rec.devices.iter().map(to_wire).collect())
    }

    /// Books the CPUs of `ours` in one engine transaction.
    async fn book(&self, uid: &str, ours: &[Ours]) -> Result<Vec<Assignment>, String> {
        let snap = self.handle.snapshot();
        let results: Vec<(String, Option<Millis>)> =
            ours.iter().map(|o| (o.device.clone(), o.consumed)).collect();
        let wanted = model::resolve(&snap.state, &snap.topology, self.opts.millis_per_device, &results)
            .map_err(|e| format!("status.allocation.devices.results: {e} (pool {})", self.opts.node))?;
        let devices: Vec<String> = wanted.iter().map(|w| w.device.clone()).collect();
        let mut specs = Vec::new();
        for (n, w) in wanted.into_iter().enumerate() {
            let name = claims::assignment_name(uid, n);
            let id = AssignmentId::new(&name).map_err(|e| e.to_string())?;
            let exclusive = snap.state.pools().get(&w.pool).is_some_and(|p| p.kind == PoolKind::Exclusive);
            specs.push(AssignSpec {
                reclaim: false,
                within: exclusive.then_some(w.within),
                ..AssignSpec::new(w.pool.to_string(), Target::Kubelet(name), w.size, Some(id))
            });
        }
        match self.handle.assign_all(specs).await {
            Ok(made) => Ok(made.into_iter().map(|o| o.into_inner()).collect()),
            Err(e) => Err(format!(
                "device(s) {} of pool {}: {}; nothing was booked",
                devices.join(", "),
                self.opts.node,
                error_chain(&e)
            )),
        }
    }

    /// Writes the CDI spec of `rec`, its environment from the CPUs its assignments hold now.
    fn write_cdi(&self, rec: &PreparedClaim) -> Result<(), String> {
        let snap = self.handle.snapshot();
        let held: Vec<Assignment> =
            rec.assignments.iter().filter_map(|id| snap.state.assignments().get(id).cloned()).collect();
        if held.len() != rec.assignments.len() {
            return Err(
                "its CPUs are no longer held (released behind the driver's back); unprepare it".into()
            );
        }
        let spec = cdi::spec(&self.opts.driver, &rec.uid, &env(&rec.uid, &held))
            .map_err(|e| format!("its CDI spec: {e}"))?;
        self.cdi.write(&rec.uid, &spec).map_err(|e| {
            format!("writing its CDI spec in `{}`: {}", self.cdi.path().display(), error_chain(&e))
        })
    }

    async fn give_back(&self, ids: &[AssignmentId]) {
        for id in ids {
            if let Err(e) = self.handle.release(id.as_str()).await {
                log::warn!("DRA: giving back {id}: {}", error_chain(&e));
            }
        }
    }

    /// Unprepares `c`: its CPUs released, its CDI spec and record removed. A claim not
    /// prepared here is done already.
    pub(super) async fn unprepare(&self, c: &dra::Claim) -> Result<(), String> {
        let who = format!("claim {}/{} (uid {})", c.namespace, c.name, c.uid);
        if !claims::valid_uid(&c.uid) {
            return Ok(());
        }
        // The record names the assignments; without one (a crash between the booking and the
        // record), they are found by their names.
        let prefix = format!("dra-{}-", c.uid);
        let ids: Vec<AssignmentId> = self
            .handle
            .snapshot()
            .state
            .assignments()
            .keys()
            .filter(|id| {
                id.as_str().strip_prefix(&prefix).is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
            })
            .cloned()
            .collect();
        for id in &ids {
            match self.handle.release(id.as_str()).await {
                Ok(a) => {
                    log::info!("DRA: unprepared {who}: released {id} (CPUs {} of pool {})", a.cpus, a.pool)
                }
                Err(e) if self.handle.snapshot().state.assignments().contains_key(id) => {
                    return Err(format!("{who}: releasing {id}: {}", error_chain(&e)));
                }
                Err(_) => {}
            }
        }
        self.cdi.remove(&c.uid).map_err(|e| format!("{who}: removing its CDI spec: {}", error_chain(&e)))?;
        self.records.remove(&c.uid).map_err(|e| format!("{who}: {}", error_chain(&e)))
    }
}

/// The claim's results of this driver, all on this node's pool: each field at fault named.
fn ours(claim: &ResourceClaim, opts: &Options) -> Result<Vec<Ours>, String> {
    let Some(alloc) = claim.status.as_ref().and_then(|s| s.allocation.as_ref()) else {
        return Err("status.allocation: the claim is not allocated".into());
    };
    let results = alloc.devices.as_ref().and_then(|d| d.results.as_ref()).map(Vec::as_slice).unwrap_or(&[]);
    let mut out = Vec::new();
    for (i, r) in results.iter().enumerate().filter(|(_, r)| r.driver == opts.driver) {
        let field = format!("status.allocation.devices.results[{i}]");
        if r.pool != opts.node {
            return Err(format!(
                "{field}.pool is `{}`: device `{}` is not on this node (pool {})",
                r.pool, r.device, opts.node
            ));
        }
        let consumed = match r.consumed_capacity.as_ref().and_then(|c| c.get(model::CAPACITY)) {
            Some(q) => Some(Millis::parse(&q.0).map_err(|e| format!("{field}.consumedCapacity.cpu: {e}"))?),
            None => None,
        };
        out.push(Ours { request: r.request.clone(), device: r.device.clone(), consumed });
    }
    if out.is_empty() {
        return Err(format!("status.allocation.devices.results: no result of driver {}", opts.driver));
    }
    Ok(out)
}

/// The record of a claim just booked: one device answered per device of ours, with the
/// requests it serves and the claim's one CDI device.
fn record(
    c: &dra::Claim,
    claim: &ResourceClaim,
    ours: &[Ours],
    made: &[Assignment],
    opts: &Options,
) -> PreparedClaim {
    let mut requests: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for o in ours {
        let r = requests.entry(o.device.as_str()).or_default();
        if !r.contains(&o.request) {
            r.push(o.request.clone());
        }
    }
    let cdi_id = cdi::device_id(&opts.driver, &c.uid);
    let pods = claim
        .status
        .as_ref()
        .and_then(|s| s.reserved_for.as_ref())
        .map(|r| r.iter().filter(|c| c.resource == "pods").map(|c| c.uid.clone()).collect())
        .unwrap_or_default();
    PreparedClaim {
        uid: c.uid.clone(),
        namespace: c.namespace.clone(),
        name: c.name.clone(),
        assignments: made.iter().map(|a| a.id.clone()).collect(),
        pods,
        devices: requests
            .into_iter()
            .map(|(device, request_names)| PreparedDevice {
                request_names,
                pool_name: opts.node.clone(),
                device_name: device.to_owned(),
                cdi_device_ids: vec![cdi_id.clone()],
            })
            .collect(),
    }
}

fn to_wire(d: &PreparedDevice) -> dra::Device {
    dra::Device {
        request_names: d.request_names.clone(),
        pool_name: d.pool_name.clone(),
        device_name: d.device_name.clone(),
        cdi_device_ids: d.cdi_device_ids.clone(),
    }
}

fn union(held: &[Assignment]) -> CpuSet {
    held.iter().fold(CpuSet::new(), |acc, a| acc.union(&a.cpus))
}

/// The container environment of a claim holding `held`: as the device plugin gives its
/// containers, with the claim named for the NRI plugin.
fn env(uid: &str, held: &[Assignment]) -> Vec<(String, String)> {
    use cpupool_wire::names as n;
    let cpus = union(held).to_string();
    let join = |f: &dyn Fn(&Assignment) -> String| held.iter().map(f).collect::<Vec<_>>().join(",");
    let exclusive = held.iter().all(|a| a.kind == PoolKind::Exclusive);
    vec![
        (n::ENV_CPUS.to_owned(), cpus.clone()),
        (n::ENV_POOL.to_owned(), join(&|a| a.pool.to_string())),
        ((if exclusive { n::ENV_EXCLUSIVE_CPUS } else { n::ENV_SHARED_CPUS }).to_owned(), cpus),
        (n::ENV_ASSIGNMENT.to_owned(), join(&|a| a.id.to_string())),
        (n::ENV_CLAIM.to_owned(), uid.to_owned()),
    ]
}
