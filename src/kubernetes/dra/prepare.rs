//! Preparing and unpreparing one claim. Prepare: a claim the engine has recorded answers as
//! recorded (the kubelet asks again after its restart, or ours); otherwise the claim is read
//! from the API server, its results of this driver on this node's pool decoded (the snapshot's
//! [`dra_wanted`](crate::engine::Snapshot::dra_wanted)), and the claim sent to the engine as
//! one request ([`Handle::prepare_claim`]): its assignments `dra-<uid>-<n>`, one per device,
//! booked and the claim recorded in one commit, durable before it answers, and its CDI spec
//! written by the engine after it. Every refusal names the claim, and the field, device and
//! pool at fault, echoing what the peer sent only in part ([`crate::core::echo`]): a kubelet
//! takes at most 4 MiB in an answer for all its claims.
//!
//! The engine owns the claim: it takes one request at a time, so two prepares of one claim
//! (two pods sharing it) book it once and answer the same, and an unprepare landing while a
//! prepare runs finds either nothing or the whole of it. What is left inconsistent by hand (a
//! claim's assignment released by root) or by an earlier release's crash (CPUs booked with no
//! record) is put right when the driver starts ([`Driver::recover`]), before it serves.

use std::collections::BTreeMap;

use http_body_util::BodyExt;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::core::params::GetParams;
use kube::{Client, Resource};

use super::proto::dra;
use super::Options;
use crate::core::cpuset::CpuSet;
use crate::core::dra::names;
use crate::core::dra::{self as model, Millis};
use crate::core::echo;
use crate::core::state::{AssignSpec, AssignmentId, PreparedClaim, PreparedDevice, Target};
use crate::engine::{Handle, PrepareClaim};
use crate::error_chain;
use crate::kubernetes::cdi;

/// Prepares and unprepares claims; shared by every call of the endpoint.
pub(super) struct Driver {
    handle: Handle,
    client: Client,
    opts: Options,
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
    let res = client
        .send(req.map(kube::client::Body::from))
        .await
        .map_err(|e| crate::kubernetes::apiserver::describe(&e))?;
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
            Ok(r) => crate::kubernetes::apiserver::describe_status(&r),
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
        Driver { handle, client, opts }
    }

    /// Prepares `c`; the devices to answer, or why not (naming the claim).
    pub(super) async fn prepare(&self, c: &dra::Claim) -> Result<Vec<dra::Device>, String> {
        let who = who(c);
        if !names::valid_uid(&c.uid) {
            return Err(format!("{who}: uid: not 1-{} characters of A-Z a-z 0-9 -", names::MAX_UID));
        }
        if let Err(e) = cdi::check_device_name(&c.uid) {
            return Err(format!("{who}: uid: not a CDI device name: {e}"));
        }
        if let Some(rec) = self.handle.snapshot().claim(&c.uid).cloned() {
            match self.handle.prepare_claim(PrepareClaim { claim: rec, specs: Vec::new() }).await {
                Ok(out) => return Ok(out.into_inner().devices.iter().map(to_wire).collect()),
                Err(e) if self.handle.snapshot().claim(&c.uid).is_some() => {
                    return Err(format!("{who}: {}", error_chain(&e)))
                }
                // Unprepared meanwhile: prepared anew.
                Err(_) => {}
            }
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
        let specs = self.bookings(&c.uid, &ours).map_err(|e| format!("{who}: {e}"))?;
        let devices = ours.iter().map(|o| o.device.as_str()).collect::<std::collections::BTreeSet<_>>();
        let out =
            self.handle.prepare_claim(PrepareClaim { claim: rec, specs }).await.map_err(|e| match e {
                crate::engine::EngineError::Claim(why) => format!("{who}: {why}"),
                e => format!(
                    "{who}: device(s) {} of pool {}: {}; nothing was booked",
                    devices.into_iter().collect::<Vec<_>>().join(", "),
                    self.opts.node,
                    error_chain(&e)
                ),
            })?;
        if out.changed() {
            let snap = self.handle.snapshot();
            let held = out.clone().into_inner().assignments;
            let held = snap.claim_assignments(&held).unwrap_or_default();
            log::info!(
                "DRA: prepared {who}: CPUs {} ({})",
                held.iter().fold(CpuSet::new(), |acc, a| acc.union(&a.cpus)),
                held.iter().map(|a| format!("{} of pool {}", a.id, a.pool)).collect::<Vec<_>>().join(", ")
            );
        }
        Ok(out.into_inner().devices.iter().map(to_wire).collect())
    }

    /// The bookings of `ours`, one per device, named `dra-<uid>-<n>`.
    fn bookings(&self, uid: &str, ours: &[Ours]) -> Result<Vec<AssignSpec>, String> {
        let snap = self.handle.snapshot();
        let results: Vec<(String, Option<Millis>)> =
            ours.iter().map(|o| (o.device.clone(), o.consumed)).collect();
        let wanted = snap
            .dra_wanted(&results, self.opts.millis_per_device)
            .map_err(|e| format!("status.allocation.devices.results: {e} (pool {})", self.opts.node))?;
        let mut specs = Vec::new();
        for (n, w) in wanted.into_iter().enumerate() {
            let name = names::assignment_name(uid, n);
            let id = AssignmentId::new(&name).map_err(|e| e.to_string())?;
            specs.push(AssignSpec {
                reclaim: false,
                within: w.within,
                ..AssignSpec::new(w.pool.to_string(), Target::Kubelet(name), w.size, Some(id))
            });
        }
        Ok(specs)
    }

    /// Unprepares `c`: its CPUs released and the claim forgotten in one commit, its CDI spec
    /// removed. A claim not prepared here is done already.
    pub(super) async fn unprepare(&self, c: &dra::Claim) -> Result<(), String> {
        let who = who(c);
        if !names::valid_uid(&c.uid) {
            return Ok(());
        }
        self.forget(&c.uid).await.map_err(|e| format!("{who}: {e}"))?;
        log::info!("DRA: unprepared {who}");
        Ok(())
    }

    async fn forget(&self, uid: &str) -> Result<(), String> {
        let gone = self.handle.unprepare_claim(uid).await.map_err(|e| error_chain(&e))?;
        for a in gone {
            log::info!("DRA: claim {uid}: released {} (CPUs {} of pool {})", a.id, a.cpus, a.pool);
        }
        Ok(())
    }

    /// Puts right, before the driver serves, what was left inconsistent: a claim whose CPUs
    /// are not all held any more (released by hand) is unprepared (the kubelet asks again, or
    /// unprepares); CPUs booked for a claim with no record (an earlier release's crash before
    /// it answered; the kubelet asks again) are given back.
    pub(super) async fn recover(&self) {
        let snap = self.handle.snapshot();
        for (uid, gone) in snap.claims_not_held() {
            log::warn!("DRA: claim {uid} is recorded as prepared but {gone} is not held: unpreparing it");
            if let Err(e) = self.forget(&uid).await {
                log::error!("DRA: claim {uid}: {e}");
            }
        }
        let orphans: Vec<String> =
            snap.booked_claims().into_iter().filter(|uid| snap.claim(uid).is_none()).collect();
        for uid in orphans {
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

/// The record of a claim about to be booked: its assignments as [`Driver::bookings`] names them,
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
    // One assignment per distinct device, as `bookings` makes them.
    let devices = {
        let mut seen = std::collections::BTreeSet::new();
        ours.iter().filter(|o| seen.insert(o.device.as_str())).count()
    };
    let assignments = (0..devices)
        .map(|n| AssignmentId::new(&names::assignment_name(&c.uid, n)).map_err(|e| e.to_string()))
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
    rec.encode().map_err(|e| format!("{e}; nothing was booked"))?;
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

#[cfg(test)]
mod tests;
