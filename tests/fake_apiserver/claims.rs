//! ResourceClaims (`resource.k8s.io/v1`) in the fake API server: `GET
//! /apis/resource.k8s.io/v1/namespaces/NS/resourceclaims/NAME` answers the claim put with
//! [`Fake::put_claim`], or a `404 NotFound` `Status` as the API server words it. A claim is
//! shaped as the real API defines it: `spec.devices.requests`, and a `status` with
//! `allocation.devices.results` (driver, pool, device, request, `consumedCapacity`) and
//! `reservedFor` (pods by name and uid).

use serde_json::{json, Value};

use super::{status_body, Fake, Request, State};

/// Where claims are kept among the fake's objects, keyed `NS/NAME`.
const COLLECTION: &str = "resourceclaims";
const PREFIX: &str = "/apis/resource.k8s.io/v1/namespaces/";

/// One allocation result: (driver, pool, device, the request it serves, consumed `cpu`, or
/// none).
pub struct Result<'a> {
    pub driver: &'a str,
    pub pool: &'a str,
    pub device: &'a str,
    pub request: &'a str,
    pub cpu: Option<&'a str>,
}

/// A claim `ns/name` with `uid`, allocated `results` (each for its request, of the class of
/// its device's pool), reserved for the pods `(name, uid)`.
pub fn claim(ns: &str, name: &str, uid: &str, results: &[Result<'_>], pods: &[(&str, &str)]) -> Value {
    let mut requests: Vec<Value> = Vec::new();
    for r in results {
        if !requests.iter().any(|q| q["name"] == r.request) {
            let pool = r.device.split("-numa").next().unwrap_or(r.device);
            let class = format!("{pool}.{}", r.driver);
            requests.push(json!({"name": r.request, "exactly": {"deviceClassName": class}}));
        }
    }
    let results: Vec<Value> = results
        .iter()
        .map(|r| {
            let mut v = json!({"driver": r.driver, "pool": r.pool, "device": r.device, "request": r.request});
            if let Some(cpu) = r.cpu {
                v["consumedCapacity"] = json!({"cpu": cpu});
                // The scheduler makes a share id as the API server makes uids: a random UUID.
                v["shareID"] = json!(test_support::apiserver::uid());
            }
            v
        })
        .collect();
    let reserved: Vec<Value> =
        pods.iter().map(|(n, u)| json!({"resource": "pods", "name": n, "uid": u})).collect();
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns, "uid": uid},
        "spec": {"devices": {"requests": requests}},
        "status": {"allocation": {"devices": {"results": results}}, "reservedFor": reserved},
    })
}

impl Fake {
    /// Creates or replaces the claim (its `metadata.namespace` and `name` say where).
    pub fn put_claim(&self, mut obj: Value) {
        let mut s = self.state.lock().unwrap();
        s.rv += 1;
        obj["metadata"]["resourceVersion"] = json!(s.rv.to_string());
        let key = format!(
            "{}/{}",
            obj["metadata"]["namespace"].as_str().unwrap(),
            obj["metadata"]["name"].as_str().unwrap()
        );
        s.objects.insert((COLLECTION.to_owned(), key), obj);
    }
}

/// The answer to `req` when it asks for a claim; `None` when it is about something else.
pub(super) fn get(req: &Request, state: &State) -> Option<(u16, Value)> {
    if req.method != "GET" {
        return None;
    }
    let rest = req.path.strip_prefix(PREFIX)?;
    let (ns, name) = rest.split_once("/resourceclaims/")?;
    Some(match state.objects.get(&(COLLECTION.to_owned(), format!("{ns}/{name}"))) {
        Some(obj) => (200, obj.clone()),
        None => {
            let mut body = status_body(404, &format!("resourceclaims.resource.k8s.io \"{name}\" not found"));
            body["details"] = json!({"name": name, "group": "resource.k8s.io", "kind": "resourceclaims"});
            (404, body)
        }
    })
}
