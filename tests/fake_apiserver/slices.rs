//! The fake's `resource.k8s.io/v1` ResourceSlices and DeviceClasses (both cluster-scoped), as
//! the real API server serves them:
//!
//! - `GET /apis/resource.k8s.io/v1/resourceslices` (and `deviceclasses`) lists and watches
//!   through the shared collection code, with the field selectors `spec.nodeName=` and
//!   `spec.driver=` the real API supports on ResourceSlices;
//! - `GET .../NAME` answers the object or `404 NotFound`;
//! - `PATCH .../NAME` with `application/apply-patch+yaml` is server-side apply: `fieldManager`
//!   is required (`400`), the body's `apiVersion`, `kind` and `metadata.name` must match
//!   (`400`), a missing object is created (`201`), an existing one takes the applied `spec`
//!   (`200`); a different field manager without `force=true` gets `409 Conflict`; the API's
//!   validation answers `422 Invalid` (more than 128 devices, more than 32 attributes and
//!   capacities on a device, a device name that is no DNS label, a request policy whose
//!   `min + step` passes the capacity, an immutable field changed: `driver`, `nodeName`,
//!   `pool.name`);
//! - `DELETE .../NAME` removes it (`200` with the object, `404` when there is none).
//!
//! Every change goes to the watch log, so watches see it, and `metadata.generation` counts the
//! spec's changes as the API server does. [`Fake::consumable_capacity_off`] drops the fields of
//! that feature gate (`allowMultipleAllocations`, `capacity.*.requestPolicy`) from what is
//! stored, as an API server with the gate off does with fields no stored object uses.

use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use tokio::sync::broadcast;

use super::{status_body, Fake, Request, State};

const PREFIX: &str = "/apis/resource.k8s.io/v1/";
/// (collection, kind) of the resources served here.
const RESOURCES: [(&str, &str); 2] = [("resourceslices", "ResourceSlice"), ("deviceclasses", "DeviceClass")];
const API_VERSION: &str = "resource.k8s.io/v1";

/// (collection, kind) for a collection path of ours.
pub(super) fn collection(path: &str) -> Option<(&'static str, &'static str)> {
    let rest = path.strip_prefix(PREFIX)?;
    RESOURCES.into_iter().find(|(c, _)| *c == rest)
}

/// The answer to a request on one of our objects (`.../NAME`); `None` for any other request.
pub(super) fn answer(
    req: &Request,
    state: &Arc<Mutex<State>>,
    events: &broadcast::Sender<(u64, String, String, Value)>,
) -> Option<(u16, Value)> {
    let rest = req.path.strip_prefix(PREFIX)?;
    let (coll, name) = rest.split_once('/')?;
    let (coll, kind) = RESOURCES.into_iter().find(|(c, _)| *c == coll)?;
    let mut s = state.lock().unwrap();
    let key = (coll.to_owned(), name.to_owned());
    let not_found = || {
        let mut body = status_body(404, &format!("{coll}.resource.k8s.io \"{name}\" not found"));
        body["details"] = json!({"name": name, "group": "resource.k8s.io", "kind": coll});
        (404, body)
    };
    Some(match req.method.as_str() {
        "GET" => s.objects.get(&key).cloned().map_or_else(not_found, |o| (200, o)),
        "DELETE" => match s.objects.remove(&key) {
            None => not_found(),
            Some(mut obj) => {
                s.rv += 1;
                obj["metadata"]["resourceVersion"] = json!(s.rv.to_string());
                let rv = s.rv;
                s.log.push((rv, coll.to_owned(), "DELETED".to_owned(), obj.clone()));
                let _ = events.send((rv, coll.to_owned(), "DELETED".to_owned(), obj.clone()));
                (200, obj)
            }
        },
        "PATCH" => match apply(req, &mut s, coll, kind, name) {
            Err(e) => e,
            Ok((code, obj)) => {
                let rv = s.rv;
                let change = if code == 201 { "ADDED" } else { "MODIFIED" };
                s.log.push((rv, coll.to_owned(), change.to_owned(), obj.clone()));
                let _ = events.send((rv, coll.to_owned(), change.to_owned(), obj.clone()));
                (code, obj)
            }
        },
        _ => (405, status_body(405, &format!("{} is not supported on {coll}", req.method))),
    })
}

fn failure(code: u16, reason: &str, message: String) -> (u16, Value) {
    let mut body = status_body(code, &message);
    body["reason"] = json!(reason);
    (code, body)
}

/// Server-side apply of `req`'s body to `coll/name`: (201 or 200, the object) or the error.
fn apply(
    req: &Request,
    s: &mut State,
    coll: &str,
    kind: &str,
    name: &str,
) -> Result<(u16, Value), (u16, Value)> {
    let bad = |m: String| failure(400, "BadRequest", m);
    let Some(manager) = req.query.get("fieldManager").filter(|m| !m.is_empty()) else {
        return Err(bad("PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch".into()));
    };
    let patch: Value =
        serde_json::from_str(&req.body).map_err(|e| bad(format!("decoding the apply patch: {e}")))?;
    if patch["apiVersion"] != API_VERSION || patch["kind"] != kind {
        return Err(bad(format!(
            "the apply patch is {} {}, not {API_VERSION} {kind}",
            patch["apiVersion"], patch["kind"]
        )));
    }
    if patch["metadata"]["name"] != name {
        return Err(bad(format!(
            "the name of the object ({}) does not match the name on the URL ({name})",
            patch["metadata"]["name"]
        )));
    }
    let key = (coll.to_owned(), name.to_owned());
    let existing = s.objects.get(&key).cloned();
    if let Some(old) = &existing {
        let others = old["metadata"]["managedFields"]
            .as_array()
            .is_some_and(|m| m.iter().any(|f| f["manager"] != manager.as_str()));
        if others && req.query.get("force").map(String::as_str) != Some("true") {
            return Err(failure(
                409,
                "Conflict",
                format!("Apply failed with 1 conflict: conflict with another manager on {coll}/{name}"),
            ));
        }
    }
    let invalid =
        |m: String| failure(422, "Invalid", format!("{kind}.resource.k8s.io \"{name}\" is invalid: {m}"));
    if coll == "resourceslices" {
        validate_slice(&patch["spec"], existing.as_ref().map(|o| &o["spec"])).map_err(invalid)?;
    }
    s.rv += 1;
    let created = existing.is_none();
    let mut obj = existing.unwrap_or_else(|| {
        json!({"metadata": {"name": name, "uid": format!("uid-{coll}-{name}"), "generation": 0,
                            "creationTimestamp": "2026-11-27T00:00:00Z"}})
    });
    let before = obj["spec"].clone();
    obj["apiVersion"] = json!(API_VERSION);
    obj["kind"] = json!(kind);
    obj["spec"] = patch["spec"].clone();
    if s.consumable_capacity_off {
        for d in obj["spec"]["devices"].as_array_mut().into_iter().flatten() {
            if let Some(d) = d.as_object_mut() {
                d.remove("allowMultipleAllocations");
            }
            for c in d["capacity"].as_object_mut().into_iter().flat_map(|c| c.values_mut()) {
                if let Some(c) = c.as_object_mut() {
                    c.remove("requestPolicy");
                }
            }
        }
    }
    if obj["spec"] != before {
        let generation = obj["metadata"]["generation"].as_i64().unwrap_or(0) + 1;
        obj["metadata"]["generation"] = json!(generation);
    }
    obj["metadata"]["resourceVersion"] = json!(s.rv.to_string());
    // With force, the applier takes every field: it is the one manager left.
    obj["metadata"]["managedFields"] = json!([{"manager": manager, "operation": "Apply", "apiVersion": API_VERSION, "fieldsType": "FieldsV1"}]);
    s.objects.insert(key, obj.clone());
    Ok((if created { 201 } else { 200 }, obj))
}

/// A quantity as millis: `4`, `1500m`, `1.5` (what the fake needs to check request policies).
fn millis(q: &Value) -> Option<i64> {
    let q = q.as_str()?;
    if let Some(m) = q.strip_suffix('m') {
        return m.parse().ok();
    }
    let (whole, frac) = q.split_once('.').unwrap_or((q, ""));
    let frac = format!("{frac:0<3}");
    Some(whole.parse::<i64>().ok()? * 1000 + frac.get(..3)?.parse::<i64>().ok()?)
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// The ResourceSlice rules the fake checks, as the API server's validation states them.
fn validate_slice(spec: &Value, old: Option<&Value>) -> Result<(), String> {
    if let Some(old) = old {
        for (field, new, was) in [
            ("spec.driver", &spec["driver"], &old["driver"]),
            ("spec.nodeName", &spec["nodeName"], &old["nodeName"]),
            ("spec.pool.name", &spec["pool"]["name"], &old["pool"]["name"]),
        ] {
            if new != was {
                return Err(format!("{field}: Invalid value: field is immutable"));
            }
        }
    }
    if spec["pool"]["resourceSliceCount"].as_i64().unwrap_or(0) < 1 {
        return Err("spec.pool.resourceSliceCount: Invalid value: must be greater than zero".into());
    }
    let devices = spec["devices"].as_array().map(Vec::as_slice).unwrap_or_default();
    if devices.len() > 128 {
        return Err(format!("spec.devices: Too many: {}: must have at most 128 items", devices.len()));
    }
    for (i, d) in devices.iter().enumerate() {
        let name = d["name"].as_str().unwrap_or_default();
        if !is_dns_label(name) {
            return Err(format!("spec.devices[{i}].name: Invalid value: \"{name}\": a DNS label"));
        }
        let n = d["attributes"].as_object().map_or(0, |a| a.len())
            + d["capacity"].as_object().map_or(0, |c| c.len());
        if n > 32 {
            return Err(format!(
                "spec.devices[{i}]: Too many: {n}: attributes and capacities must be at most 32"
            ));
        }
        for (cap_name, cap) in d["capacity"].as_object().into_iter().flatten() {
            let range = &cap["requestPolicy"]["validRange"];
            let (Some(value), Some(min)) = (millis(&cap["value"]), millis(&range["min"])) else { continue };
            let step = millis(&range["step"]).unwrap_or(0);
            if min > value || (step > 0 && min + step > value) {
                return Err(format!(
                    "spec.devices[{i}].capacity[{cap_name}].requestPolicy.validRange: Invalid value: \
                     one step {} is larger than capacity value: {}",
                    min + step,
                    value
                ));
            }
        }
    }
    Ok(())
}

impl Fake {
    /// Turns the `DRAConsumableCapacity` feature gate off: its fields are dropped from the
    /// slices applied from now on.
    pub fn consumable_capacity_off(&self) {
        self.state.lock().unwrap().consumable_capacity_off = true;
    }

    /// The ResourceSlices of `node`, in name order.
    pub fn slices(&self, node: &str) -> Vec<Value> {
        let s = self.state.lock().unwrap();
        s.objects
            .iter()
            .filter(|((c, _), o)| c == "resourceslices" && o["spec"]["nodeName"] == node)
            .map(|(_, o)| o.clone())
            .collect()
    }

    /// Write requests (`PATCH`, `DELETE`) on `collection`'s objects.
    pub fn writes(&self, collection: &str) -> usize {
        let path = format!("{PREFIX}{collection}/");
        self.count(|r| (r.method == "PATCH" || r.method == "DELETE") && r.path.starts_with(&path))
    }
}
