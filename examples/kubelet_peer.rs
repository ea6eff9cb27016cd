//! A kubelet-shaped peer for the guest checks (`tests/vm/checks/57-kubelet.sh`): it speaks the
//! real protobuf to an installed cpupoold, standing in for the kubelet and its container runtime.
//!
//! ```text
//! kubelet_peer serve KUBELET_DIR RUNTIME_SOCKET PODS_JSON
//!     Like a starting kubelet, removes every file in KUBELET_DIR/device-plugins/, then serves
//!     v1beta1.Registration on device-plugins/kubelet.sock (one line per Register on stdout:
//!     `registered RESOURCE ENDPOINT MS`, MS counted from the bind), v1.PodResourcesLister on
//!     pod-resources/kubelet.sock and the CRI RuntimeService.ListContainers on RUNTIME_SOCKET.
//!     Both answer from PODS_JSON, read on every call:
//!     {"pods": [{"namespace", "name", "uid", "containers": [{"name", "id",
//!                "devices": {"RESOURCE": ["ID", ...]}}]}]}
//!     Runs until killed.
//! kubelet_peer allocate KUBELET_DIR POOL COUNT PODS_JSON NAMESPACE/POD/UID/CONTAINER/ID
//!     What the kubelet does for a container asking for COUNT devices of POOL: the first
//!     ListAndWatch message, GetPreferredAllocation over the healthy devices, Allocate; then,
//!     as the kubelet's PodResources would from then on, the container holds the devices in
//!     PODS_JSON (added to its pod, which is added if new). Prints
//!     {"devices": [...], "envs": {...}}.
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use cpupoold::kubelet::proto::{cri, podresources as pr, v1beta1 as dp};
use cpupoold::kubelet::unix_channel;
use serde_json::{json, Value};
use test_support::kubelet::{self, PodSource};
use tonic::Status;

type Failure = Box<dyn std::error::Error + Send + Sync>;

/// The pods file, read on every call: edits by the check take effect at once.
#[derive(Clone)]
struct Pods(PathBuf);

impl Pods {
    fn read(&self) -> Result<Vec<Value>, Status> {
        let text = std::fs::read_to_string(&self.0).map_err(|e| Status::unavailable(e.to_string()))?;
        let v: Value = serde_json::from_str(&text).map_err(|e| Status::internal(e.to_string()))?;
        Ok(v["pods"].as_array().cloned().unwrap_or_default())
    }
}

fn s(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_owned()
}

fn containers(pod: &Value) -> Vec<Value> {
    pod["containers"].as_array().cloned().unwrap_or_default()
}

impl PodSource for Pods {
    fn pods(&self) -> Result<Vec<pr::PodResources>, Status> {
        Ok(self
            .read()?
            .iter()
            .map(|p| pr::PodResources {
                name: s(&p["name"]),
                namespace: s(&p["namespace"]),
                containers: containers(p)
                    .iter()
                    .map(|c| pr::ContainerResources {
                        name: s(&c["name"]),
                        devices: c["devices"]
                            .as_object()
                            .map(|m| {
                                // As the kubelet lists them: one entry per device.
                                m.iter()
                                    .flat_map(|(resource, ids)| {
                                        ids.as_array().into_iter().flatten().map(|id| pr::ContainerDevices {
                                            resource_name: resource.clone(),
                                            device_ids: vec![s(id)],
                                            topology: None,
                                        })
                                    })
                                    .collect()
                            })
                            .unwrap_or_default(),
                        ..Default::default()
                    })
                    .collect(),
            })
            .collect())
    }

    fn containers(&self) -> Result<Vec<cri::Container>, Status> {
        let mut out = Vec::new();
        for p in self.read()? {
            for c in containers(&p) {
                out.push(cri::Container {
                    id: s(&c["id"]),
                    state: cri::ContainerState::ContainerRunning as i32,
                    labels: HashMap::from([
                        ("io.kubernetes.pod.namespace".to_owned(), s(&p["namespace"])),
                        ("io.kubernetes.pod.name".to_owned(), s(&p["name"])),
                        ("io.kubernetes.pod.uid".to_owned(), s(&p["uid"])),
                        ("io.kubernetes.container.name".to_owned(), s(&c["name"])),
                    ]),
                    ..Default::default()
                });
            }
        }
        Ok(out)
    }
}

async fn serve(kubelet_dir: &Path, runtime: &Path, pods: PathBuf) -> Result<(), Failure> {
    let plugins = kubelet_dir.join("device-plugins");
    std::fs::create_dir_all(&plugins)?;
    for e in std::fs::read_dir(&plugins)? {
        std::fs::remove_file(e?.path())?;
    }
    let pods = Pods(pods);
    let resources =
        kubelet::serve_pod_resources(&kubelet_dir.join("pod-resources/kubelet.sock"), pods.clone())?;
    let cri = kubelet::serve_runtime(runtime, pods)?;
    let bound = Instant::now();
    let registration = kubelet::Registration::new(move |r| {
        println!("registered {} {} {}", r.resource_name, r.endpoint, bound.elapsed().as_millis());
    });
    let kubelet = kubelet::Kubelet::serve(&plugins, registration)?;
    // Runs until killed, or until a server fails.
    tokio::select! {
        r = resources => r??,
        r = cri => r??,
    }
    drop(kubelet);
    Ok(())
}

async fn allocate(
    kubelet_dir: &Path,
    pool: &str,
    count: i32,
    pods: &Path,
    who: &str,
) -> Result<Value, Failure> {
    let [namespace, pod, uid, container, id] = who.split('/').collect::<Vec<_>>()[..] else {
        return Err(format!("`{who}` is not NAMESPACE/POD/UID/CONTAINER/ID").into());
    };
    let sock = kubelet_dir.join(format!("device-plugins/cpupoold-{pool}.sock"));
    let mut c = dp::device_plugin_client::DevicePluginClient::new(unix_channel(sock).await?);
    let mut stream = c.list_and_watch(dp::Empty {}).await?.into_inner();
    let first = stream.message().await?.ok_or("ListAndWatch ended without a message")?;
    let available: Vec<String> =
        first.devices.into_iter().filter(|d| d.health == "Healthy").map(|d| d.id).collect();
    let preferred = c
        .get_preferred_allocation(dp::PreferredAllocationRequest {
            container_requests: vec![dp::ContainerPreferredAllocationRequest {
                available_device_i_ds: available,
                must_include_device_i_ds: Vec::new(),
                allocation_size: count,
            }],
        })
        .await?
        .into_inner();
    let devices = preferred.container_responses.first().ok_or("no preferred allocation")?.device_i_ds.clone();
    let r = c
        .allocate(dp::AllocateRequest {
            container_requests: vec![dp::ContainerAllocateRequest { devices_ids: devices.clone() }],
        })
        .await?
        .into_inner();
    let envs = r.container_responses.first().ok_or("no allocate response")?.envs.clone();
    let mut all: Value = serde_json::from_str(&std::fs::read_to_string(pods)?)?;
    let list = all["pods"].as_array_mut().ok_or("no \"pods\" array")?;
    if !list.iter().any(|p| p["uid"] == uid) {
        list.push(json!({ "namespace": namespace, "name": pod, "uid": uid, "containers": [] }));
    }
    for p in list.iter_mut().filter(|p| p["uid"] == uid) {
        let resource = format!("cpupool.io/{pool}");
        let entry = json!({ "name": container, "id": id, "devices": { resource: devices } });
        p["containers"].as_array_mut().ok_or("no \"containers\" array")?.push(entry);
    }
    let tmp = pods.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec(&all)?)?;
    std::fs::rename(&tmp, pods)?;
    Ok(json!({ "devices": devices, "envs": envs }))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Failure> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["serve", dir, runtime, pods] => serve(Path::new(dir), Path::new(runtime), pods.into()).await,
        ["allocate", dir, pool, count, pods, who] => {
            println!("{}", allocate(Path::new(dir), pool, count.parse()?, Path::new(pods), who).await?);
            Ok(())
        }
        _ => Err("usage: kubelet_peer serve KUBELET_DIR RUNTIME_SOCKET PODS_JSON | \
                  kubelet_peer allocate KUBELET_DIR POOL COUNT PODS_JSON NAMESPACE/POD/UID/CONTAINER/ID"
            .into()),
    }
}
