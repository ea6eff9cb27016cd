//! Preparing and unpreparing one claim. Prepare: the record answers a claim prepared before
//! (the kubelet asks again after its restart, or ours); otherwise the claim is read from the
//! API server, its results of this driver on this node's pool decoded ([`core::dra::resolve`]),
//! and its CPUs booked as one engine transaction ([`Handle::assign_all`]: all or nothing,
//! durable before it answers), assignment `dra-<uid>-<n>` per device; then the CDI spec and
//! the record are written, and a failure there gives the CPUs back. Every refusal names the
//! claim, and the field, device and pool at fault, echoing what the peer sent only in part
//! ([`crate::core::echo`]): a kubelet takes at most 4 MiB in an answer for all its claims.
//!
//! One claim is worked on by one call at a time ([`Driver::claim`]): two pods sharing a claim
//! make the kubelet prepare it twice at once, and an unprepare may land while a prepare runs.
//! Serialized, the second prepare finds the first's record and answers the same, and an
//! unprepare finds either nothing or the whole of it. What a crash leaves half done (CPUs
//! booked with no record, a record whose CPUs are gone, a record without its CDI spec) is put
//! right when the driver starts ([`Driver::recover`]), before it serves.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, Weak};

use http_body_util::BodyExt;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::core::params::GetParams;
use kube::{Client, Resource};

use super::Options;
use crate::core::cpuset::CpuSet;
use crate::core::dra::{self as model, Millis};
use crate::core::echo;
use crate::core::pool::PoolKind;
use crate::core::state::{AssignSpec, Assignment, AssignmentId, Target};
use crate::engine::Handle;
use crate::error_chain;
use crate::node::cdi::{self, CdiDir};
use crate::node::claims::{self, Claims, PreparedClaim, PreparedDevice};
use crate::node::proto::dra;

/// Prepares and unprepares claims; shared by every call of the endpoint.
pub(super) struct Driver {
    handle: Handle,
    client: Client,
    opts: Options,
    records: Claims,
    cdi: CdiDir,
    /// The claims being worked on, each by one call at a time; an entry goes with its last user.
    busy: Mutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>,
}

/// The largest ResourceClaim read from the API server, in bytes of its JSON. No API server
/// holds a bigger one: etcd refuses a value over 1.5 MiB (its default `--max-request-bytes`),
/// and the API server takes no request body over 3 MiB. A claim of 32 results and 256 pods is
/// tens of KiB. Bigger is no claim at all, and is refused as it arrives, before it is all held
/// (a 150 MiB answer took 332 MB to read and decode).
pub const MAX_CLAIM_BYTES: usize = 3 << 20;

/// GET of the ResourceClaim `namespace/name`, reading at most [`MAX_CLAIM_BYTES`] of the
/// answer; the API server's refusals in words.
async fn read_claim(client: &Client, namespace: &str, name: &str) -> Result<ResourceClaim, String> {
    let url = ResourceClaim::url_path(&(), Some(namespace));
    let req = kube::core::Request::new(url).get(name, &GetParams::default()).map_err(|e| e.to_string())?;
    let res = client.send(req.map(kube::client::Body::from)).await.map_err(|e| crate::k8s::describe(&e))?;
    let status = res.status();
    let body = http_body_util::Limited::new(res.into_body(), MAX_CLAIM_BYTES)
        .collect()
        .await
        .map_err(|e| match e.downcast::<http_body_util::LengthLimitError>() {
            Ok(_) => format!("the answer is larger than {MAX_CLAIM_BYTES} bytes, which no API server holds"),
            Err(e) => e.to_string(),
        })?
        .to_bytes();
    if !status.is_success() {
        return Err(match serde_json::from_slice::<kube::core::ErrorResponse>(&body) {
            Ok(r) => crate::k8s::describe_status(&r),
            Err(_) => format!("{status}"),
        });
    }
    serde_json::from_slice(&body).map_err(|e| format!("not a ResourceClaim: {e}"))
}

/// The most pods a claim is reserved for (the API's `ResourceClaimReservedForMaxSize`).
const MAX_RESERVED_FOR: usize = 256;
/// The longest request name (a DNS label, as the API validates it).
const MAX_REQUEST_NAME: usize = 63;

/// One result of the claim for this driver and node.
struct Ours {
    request: String,
    device: String,
    consumed: Option<Millis>,
}

impl Driver {
    pub(super) fn new(handle: Handle, client: Client, opts: Options) -> Driver {
        let (records, cdi) = (Claims::new(&opts.state_dir), CdiDir::new(&opts.cdi_dir));
        Driver { handle, client, opts, records, cdi, busy: Mutex::new(HashMap::new()) }
    }

    /// Waits until no other call works on claim `uid`; the claim is this caller's while the
    /// guard lives.
    async fn claim(&self, uid: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = {
            let mut busy = self.busy.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            busy.retain(|_, w| w.strong_count() > 0);
            match busy.get(uid).and_then(Weak::upgrade) {
                Some(l) => l,
                None => {
                    let l = Arc::new(tokio::sync::Mutex::new(()));
                    busy.insert(uid.to_owned(), Arc::downgrade(&l));
                    l
                }
            }
        };
        lock.lock_owned().await
    }

    /// Prepares `c`; the devices to answer, or why not (naming the claim).
    pub(super) async fn prepare(&self, c: &dra::Claim) -> Result<Vec<dra::Device>, String> {
        let who = who(c);
        if !claims::valid_uid(&c.uid) {
            return Err(format!("{who}: uid: not 1-{} characters of A-Z a-z 0-9 -", claims::MAX_UID));
        }
        if let Err(e) = cdi::check_device_name(&c.uid) {
            return Err(format!("{who}: uid: not a CDI device name: {e}"));
        }
        let _mine = self.claim(&c.uid).await;
        if let Some(rec) = self.records.load(&c.uid).map_err(|e| format!("{who}: {}", error_chain(&e)))? {
            if !self.cdi.has(&c.uid) {
                self.write_cdi(&rec).map_err(|e| format!("{who}: {e}"))?;
            }
            return Ok(rec.devices.iter().map(to_wire).collect());
        }
        let claim = read_claim(&self.client, &c.namespace, &c.name)
            .await
            .map_err(|e| format!("{who}: reading it from the API server: {e}"))?;
        let uid = claim.metadata.uid.clone().unwrap_or_default();
        if uid != c.uid {
            return Err(format!(
                "{who}: metadata.uid is `{}` on the API server: not the claim the kubelet names",
                echo(&uid)
            ));
        }
        let ours = ours(&claim, &self.opts).map_err(|e| format!("{who}: {e}"))?;
        // The record is made, and checked to fit, before anything is booked.
        let rec = record(c, &claim, &ours, &self.opts).map_err(|e| format!("{who}: {e}"))?;
        let made = self.book(&c.uid, &ours).await.map_err(|e| format!("{who}: {e}"))?;
        if made.iter().map(|a| &a.id).ne(rec.assignments.iter()) {
            self.give_back(&made.iter().map(|a| a.id.clone()).collect::<Vec<_>>()).await;
            return Err(format!(
                "{who}: the engine booked other assignments than the record names; given back"
            ));
        }
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
        let wanted = snap
            .dra_wanted(&results, self.opts.millis_per_device)
            .map_err(|e| format!("status.allocation.devices.results: {e} (pool {})", self.opts.node))?;
        let devices: Vec<String> = wanted.iter().map(|w| w.device.clone()).collect();
        let mut specs = Vec::new();
        for (n, w) in wanted.into_iter().enumerate() {
            let name = claims::assignment_name(uid, n);
            let id = AssignmentId::new(&name).map_err(|e| e.to_string())?;
            specs.push(AssignSpec {
                reclaim: false,
                within: w.within,
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
        let Ok(held) = snap.claim_assignments(&rec.assignments) else {
            return Err(
                "its CPUs are no longer held (released behind the driver's back); unprepare it".into()
            );
        };
        let held: Vec<Assignment> = held.into_iter().cloned().collect();
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
        let who = who(c);
        if !claims::valid_uid(&c.uid) {
            return Ok(());
        }
        let _mine = self.claim(&c.uid).await;
        self.forget(&c.uid).await.map_err(|e| format!("{who}: {e}"))?;
        log::info!("DRA: unprepared {who}");
        Ok(())
    }

    /// Releases claim `uid`'s assignments (found by their names: the record may be gone, or
    /// not written yet after a crash), then removes its CDI spec and its record, in that order,
    /// so that no record is left without its CPUs.
    async fn forget(&self, uid: &str) -> Result<(), String> {
        let ids = self.handle.snapshot().claim_assignment_ids(uid);
        for id in &ids {
            match self.handle.release(id.as_str()).await {
                Ok(a) => log::info!("DRA: claim {uid}: released {id} (CPUs {} of pool {})", a.cpus, a.pool),
                Err(e) if self.handle.snapshot().assignment(id).is_some() => {
                    return Err(format!("releasing {id}: {}", error_chain(&e)));
                }
                Err(_) => {}
            }
        }
        self.cdi.remove(uid).map_err(|e| format!("removing its CDI spec: {}", error_chain(&e)))?;
        self.records.remove(uid).map_err(|e| error_chain(&e))
    }

    /// Puts right what a crash left half done, before the driver serves: CPUs booked for a
    /// claim with no record (the kubelet was not answered, and asks again) are given back; a
    /// record whose CPUs are not all held any more goes, with its CDI spec (the kubelet asks
    /// again, or unprepares); a record whose CDI spec is missing gets it written again. A record
    /// that cannot be trusted or read is left where it is and said, its claim not prepared.
    pub(super) async fn recover(&self) {
        let uids = match self.records.uids() {
            Ok(u) => u,
            Err(e) => return log::warn!("DRA: listing the prepared claims: {}", error_chain(&e)),
        };
        for uid in &uids {
            let _mine = self.claim(uid).await;
            let rec = match self.records.load(uid) {
                Ok(Some(rec)) => rec,
                Ok(None) => continue,
                Err(e) => {
                    log::error!("DRA: claim {uid}: {}; it is not served", error_chain(&e));
                    continue;
                }
            };
            if let Err(gone) = self.handle.snapshot().claim_assignments(&rec.assignments) {
                log::warn!("DRA: claim {uid} is recorded as prepared but {gone} is not held: unpreparing it");
                if let Err(e) = self.forget(uid).await {
                    log::error!("DRA: claim {uid}: {e}");
                }
            } else if !self.cdi.has(uid) {
                match self.write_cdi(&rec) {
                    Ok(()) => log::info!("DRA: claim {uid}: its CDI spec was missing and is written again"),
                    Err(e) => log::error!("DRA: claim {uid}: {e}"),
                }
            }
        }
        let orphans: Vec<String> = self
            .handle
            .snapshot()
            .booked_claims()
            .into_iter()
            .filter(|uid| uids.binary_search(uid).is_err())
            .collect();
        for uid in orphans {
            let _mine = self.claim(&uid).await;
            log::warn!("DRA: claim {uid} has CPUs booked but no record (a crash before it was answered): giving them back");
            if let Err(e) = self.forget(&uid).await {
                log::error!("DRA: claim {uid}: {e}");
            }
        }
    }
}

/// A claim as errors name it, what the peer sent echoed in part.
fn who(c: &dra::Claim) -> String {
    format!("claim {}/{} (uid {})", echo(&c.namespace), echo(&c.name), echo(&c.uid))
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
                echo(&r.pool),
                echo(&r.device),
                opts.node
            ));
        }
        if r.request.len() > MAX_REQUEST_NAME {
            return Err(format!(
                "{field}.request: `{}` is longer than the API's {MAX_REQUEST_NAME} characters",
                echo(&r.request)
            ));
        }
        let consumed = consumed_cpu(r.consumed_capacity.as_ref(), &opts.driver, &field)?;
        out.push(Ours { request: r.request.clone(), device: r.device.clone(), consumed });
    }
    if out.is_empty() {
        return Err(format!("status.allocation.devices.results: no result of driver {}", opts.driver));
    }
    Ok(out)
}

/// The `cpu` a result consumed, or `None` where it names none (the request policy's default
/// step). The API's key is a `QualifiedName`: `cpu` as the slice publishes it, or qualified by
/// the driver's own domain (`dra.cpupool.io/cpu`); the API does not say which the scheduler
/// writes (it writes the slice's form today, and may write the other), so both are the
/// capacity. Both at once is refused, naming them: the result would consume it twice.
fn consumed_cpu(
    consumed: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
    driver: &str,
    field: &str,
) -> Result<Option<Millis>, String> {
    let Some(consumed) = consumed else { return Ok(None) };
    let qualified = format!("{driver}/{}", model::CAPACITY);
    let found: Vec<(&str, &str)> = [model::CAPACITY, qualified.as_str()]
        .into_iter()
        .filter_map(|k| consumed.get(k).map(|q| (k, q.0.as_str())))
        .collect();
    match found.as_slice() {
        [] => Ok(None),
        [(key, q)] => Millis::parse(q).map(Some).map_err(|e| format!("{field}.consumedCapacity.{key}: {e}")),
        _ => Err(format!(
            "{field}.consumedCapacity names the capacity twice, as `{}` and as `{qualified}`",
            model::CAPACITY
        )),
    }
}

/// The record of a claim about to be booked: its assignments as [`Driver::book`] names them,
/// one device answered per device of ours, with the requests it serves and the claim's one CDI
/// device; an error when it names more pods than the API allows or would not fit a record.
fn record(
    c: &dra::Claim,
    claim: &ResourceClaim,
    ours: &[Ours],
    opts: &Options,
) -> Result<PreparedClaim, String> {
    let mut requests: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for o in ours {
        let r = requests.entry(o.device.as_str()).or_default();
        if !r.contains(&o.request) {
            r.push(o.request.clone());
        }
    }
    let cdi_id = cdi::device_id(&opts.driver, &c.uid);
    let reserved = claim.status.as_ref().and_then(|s| s.reserved_for.as_deref()).unwrap_or(&[]);
    if reserved.len() > MAX_RESERVED_FOR {
        return Err(format!(
            "status.reservedFor: {} entries, over the API's {MAX_RESERVED_FOR}; nothing was booked",
            reserved.len()
        ));
    }
    let pods = reserved.iter().filter(|c| c.resource == "pods").map(|c| c.uid.clone()).collect();
    // One assignment per distinct device, as `book` makes them.
    let devices = {
        let mut seen = std::collections::BTreeSet::new();
        ours.iter().filter(|o| seen.insert(o.device.as_str())).count()
    };
    let assignments = (0..devices)
        .map(|n| AssignmentId::new(&claims::assignment_name(&c.uid, n)).map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    let rec = PreparedClaim {
        uid: c.uid.clone(),
        namespace: c.namespace.clone(),
        name: c.name.clone(),
        assignments,
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
    };
    rec.encode().map_err(|e| format!("{}; nothing was booked", error_chain(&e)))?;
    Ok(rec)
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

#[cfg(test)]
mod tests;
