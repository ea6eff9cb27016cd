#![allow(clippy::unwrap_used)]
use std::path::PathBuf;

use serde_json::json;

use super::*;

fn opts() -> Options {
    Options {
        driver: "dra.cpupool.io".into(),
        node: "node-a".into(),
        kubelet_dir: PathBuf::from("/nonexistent"),
        cdi_dir: PathBuf::from("/nonexistent"),
        millis_per_device: 100,
    }
}

/// A claim as the API server stores it, one result per `(device, consumedCapacity)`.
fn claim(results: &[(&str, serde_json::Value)]) -> ResourceClaim {
    let results: Vec<_> = results
        .iter()
        .map(|(device, consumed)| {
            let mut r =
                json!({"driver": "dra.cpupool.io", "pool": "node-a", "device": device, "request": "cpus"});
            if !consumed.is_null() {
                r["consumedCapacity"] = consumed.clone();
                r["shareID"] = json!("0a1b2");
            }
            r
        })
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": "default", "name": "c", "uid": "01a1c1a1-0000-4000-8000-0000000000d1"},
        "spec": {"devices": {"requests": [{"name": "cpus", "exactly": {"deviceClassName": "web.dra.cpupool.io"}}]}},
        "status": {"allocation": {"devices": {"results": results}}},
    }))
    .unwrap()
}

fn consumed(results: &[(&str, serde_json::Value)]) -> Result<Vec<Option<Millis>>, String> {
    ours(&claim(results), &opts()).map(|o| o.into_iter().map(|o| o.consumed).collect())
}

/// Real quantities, under either key the API allows for the capacity the slice publishes as
/// `cpu`: the bare name, or qualified by the driver's domain.
#[test]
fn consumed_cpu_is_read_under_the_bare_or_the_driver_qualified_name() {
    for key in ["cpu", "dra.cpupool.io/cpu"] {
        for (q, m) in [("2", 2000), ("1500m", 1500), ("100m", 100), ("1", 1000)] {
            assert_eq!(consumed(&[("web", json!({ key: q }))]), Ok(vec![Some(Millis(m))]), "{key}: {q}");
        }
    }
    // No amount: the step (the policy's default); a capacity of another domain is not ours.
    assert_eq!(consumed(&[("web", json!(null))]), Ok(vec![None]));
    assert_eq!(consumed(&[("web", json!({"other.example.com/cpu": "4"}))]), Ok(vec![None]));
    // Several results, each read.
    assert_eq!(
        consumed(&[("dp-numa0", json!({"cpu": "2"})), ("web", json!({"dra.cpupool.io/cpu": "100m"}))]),
        Ok(vec![Some(Millis(2000)), Some(Millis(100))])
    );
}

#[test]
fn a_bad_or_doubled_consumed_cpu_is_refused_naming_the_field() {
    let e = consumed(&[("web", json!({"dra.cpupool.io/cpu": "1Gi"}))]).unwrap_err();
    assert!(
        e.starts_with("status.allocation.devices.results[0].consumedCapacity.dra.cpupool.io/cpu: "),
        "{e}"
    );
    let e = consumed(&[("web", json!({"cpu": "1", "dra.cpupool.io/cpu": "1"}))]).unwrap_err();
    assert_eq!(
        e,
        "status.allocation.devices.results[0].consumedCapacity names the capacity twice, as `cpu` and as \
         `dra.cpupool.io/cpu`"
    );
}
