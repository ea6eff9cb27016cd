//! The gRPC clients more than one adapter uses, each over a unix socket and waited for at most
//! 5 s: the kubelet's `PodResourcesLister` and the container runtime's CRI `RuntimeService`
//! (only `ListContainers`), and the channel and the answer's wait the device plugin's
//! `Registration` call uses too. Errors come back in words, for the logs: every caller retries.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;

use super::proto::{cri, podresources};
use crate::core::cpuset::CpuSet;
use crate::core::devices;
use crate::error_chain;

/// How long the kubelet or the runtime may take to answer.
pub(crate) const ANSWER_WITHIN: Duration = Duration::from_secs(5);

/// A gRPC channel over a unix socket (tonic needs a URI; it is not used).
pub async fn unix_channel(path: PathBuf) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
}

/// A gRPC channel to the kubelet's or the runtime's `socket`, the error in words.
pub(crate) async fn channel(socket: &Path) -> Result<tonic::transport::Channel, String> {
    unix_channel(socket.to_owned()).await.map_err(|e| error_chain(&e))
}

/// The answer to a call to the kubelet or the runtime, waited for at most 5 s; the error in
/// words.
pub(crate) async fn answer<T>(
    call: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, String> {
    tokio::time::timeout(ANSWER_WITHIN, call)
        .await
        .map_err(|_| "no answer within 5 s".to_owned())?
        .map(tonic::Response::into_inner)
        .map_err(|s| format!("{}: {}", s.code(), s.message()))
}

/// The kubelet's PodResources `List`.
pub async fn pod_resources(socket: &Path) -> Result<podresources::ListPodResourcesResponse, String> {
    let mut client =
        podresources::pod_resources_lister_client::PodResourcesListerClient::new(channel(socket).await?);
    answer(client.list(podresources::ListPodResourcesRequest {})).await
}

/// The kubelet's PodResources, its connection kept between calls (the NRI plugin asks at every
/// container creation; a new connection each time was most of that request's cost). A failed
/// call drops it, and the next one connects again.
pub struct PodResources {
    socket: PathBuf,
    channel: tokio::sync::Mutex<Option<tonic::transport::Channel>>,
}

impl PodResources {
    /// A client of the kubelet listening on `socket`; nothing is connected yet.
    pub fn new(socket: PathBuf) -> PodResources {
        PodResources { socket, channel: tokio::sync::Mutex::new(None) }
    }

    /// The socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// `List`.
    pub async fn list(&self) -> Result<podresources::ListPodResourcesResponse, String> {
        let mut kept = self.channel.lock().await;
        let channel = match kept.as_ref() {
            Some(c) => c.clone(),
            None => channel(&self.socket).await?,
        };
        let mut client =
            podresources::pod_resources_lister_client::PodResourcesListerClient::new(channel.clone());
        let r = answer(client.list(podresources::ListPodResourcesRequest {})).await;
        *kept = r.is_ok().then_some(channel);
        r
    }
}

/// The CPUs the kubelet's CPU manager allocates from (PodResources `GetAllocatableResources`).
pub async fn allocatable_cpus(socket: &Path) -> Result<CpuSet, String> {
    let mut client =
        podresources::pod_resources_lister_client::PodResourcesListerClient::new(channel(socket).await?);
    let reply =
        answer(client.get_allocatable_resources(podresources::AllocatableResourcesRequest {})).await?;
    Ok(reply.cpu_ids.into_iter().filter_map(|c| u32::try_from(c).ok()).collect())
}

/// Running containers by (namespace, pod, container name): (pod UID, container id).
pub type Containers = HashMap<(String, String, String), (String, String)>;

/// The runtime's running containers (CRI `ListContainers`), by their Kubernetes labels.
pub async fn cri_containers(endpoint: &Path) -> Result<Containers, String> {
    let mut client = cri::runtime_service_client::RuntimeServiceClient::new(channel(endpoint).await?);
    let reply = answer(client.list_containers(cri::ListContainersRequest {
        filter: Some(cri::ContainerFilter {
            state: Some(cri::ContainerStateValue { state: cri::ContainerState::ContainerRunning as i32 }),
            ..Default::default()
        }),
    }))
    .await?;
    let label = |c: &cri::Container, k: &str| c.labels.get(k).cloned().unwrap_or_default();
    Ok(reply
        .containers
        .into_iter()
        .map(|c| {
            let key = (
                label(&c, "io.kubernetes.pod.namespace"),
                label(&c, "io.kubernetes.pod.name"),
                label(&c, "io.kubernetes.container.name"),
            );
            (key, (label(&c, "io.kubernetes.pod.uid"), c.id))
        })
        .collect())
}

/// The ready pod sandboxes (the pause containers the kubelet does not list among a pod's
/// containers), as (pod UID, sandbox id).
pub async fn cri_sandboxes(endpoint: &Path) -> Result<Vec<(String, String)>, String> {
    let mut client = cri::runtime_service_client::RuntimeServiceClient::new(channel(endpoint).await?);
    let reply = answer(client.list_pod_sandbox(cri::ListPodSandboxRequest {
        filter: Some(cri::PodSandboxFilter {
            state: Some(cri::PodSandboxStateValue { state: cri::PodSandboxState::SandboxReady as i32 }),
            ..Default::default()
        }),
    }))
    .await?;
    Ok(reply.items.into_iter().map(|s| (s.metadata.map(|m| m.uid).unwrap_or_default(), s.id)).collect())
}

/// Who holds one allocation.
#[derive(Debug, Clone)]
pub struct Holder {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod.
    pub pod: String,
    /// The container's name.
    pub container: String,
    /// The pool: the resource's name without the prefix.
    pub pool: String,
    /// The devices it holds.
    pub devices: BTreeSet<String>,
}

/// Who holds which allocation, by assignment id (`kubelet-<first device>`). The kubelet lists a
/// container's devices one `ContainerDevices` entry per device (and per NUMA node of it), so
/// the entries of one container and resource are gathered into the one allocation its
/// Allocate made.
pub fn holders(list: podresources::ListPodResourcesResponse, prefix: &str) -> HashMap<String, Holder> {
    let mut held: BTreeMap<(String, String, String, String), BTreeSet<String>> = BTreeMap::new();
    for pod in list.pod_resources {
        for c in pod.containers {
            for d in c.devices.into_iter().filter(|d| d.resource_name.starts_with(prefix)) {
                held.entry((pod.namespace.clone(), pod.name.clone(), c.name.clone(), d.resource_name))
                    .or_default()
                    .extend(d.device_ids);
            }
        }
    }
    held.into_iter()
        .filter_map(|((namespace, pod, container, resource), devices)| {
            let id = format!("{}{}", devices::ID_PREFIX, devices::first_device(&devices)?);
            let pool = resource.strip_prefix(prefix).unwrap_or(&resource).to_owned();
            Some((id, Holder { namespace, pod, container, pool, devices }))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(resource: &str, id: &str, node: i64) -> podresources::ContainerDevices {
        podresources::ContainerDevices {
            resource_name: resource.into(),
            device_ids: vec![id.into()],
            topology: Some(podresources::TopologyInfo { nodes: vec![podresources::NumaNode { id: node }] }),
        }
    }

    /// The shape the kubelet sends (`containerDevicesFromResourceDeviceInstances`): one entry per
    /// device and NUMA node, in map order.
    #[test]
    fn one_entry_per_device_is_one_allocation() {
        let container = |name: &str, devices| podresources::ContainerResources {
            name: name.into(),
            devices,
            ..Default::default()
        };
        let list = podresources::ListPodResourcesResponse {
            pod_resources: vec![podresources::PodResources {
                name: "p1".into(),
                namespace: "default".into(),
                containers: vec![
                    container(
                        "app",
                        vec![
                            entry("cpupool.io/web", "milli-web-00003", 0),
                            entry("cpupool.io/dp", "core-7", 1),
                            entry("cpupool.io/web", "milli-web-00001", 0),
                            entry("other.io/gpu", "gpu-0", 0),
                            entry("cpupool.io/dp", "core-6", 1),
                            entry("cpupool.io/web", "milli-web-00002", 0),
                        ],
                    ),
                    container("side", vec![entry("cpupool.io/web", "milli-web-00004", 0)]),
                ],
            }],
        };
        let h = holders(list, "cpupool.io/");
        let mut ids: Vec<&str> = h.keys().map(String::as_str).collect();
        ids.sort();
        assert_eq!(ids, ["kubelet-core-6", "kubelet-milli-web-00001", "kubelet-milli-web-00004"]);
        let devs = |id: &str| h[id].devices.iter().map(String::as_str).collect::<Vec<_>>();
        assert_eq!(devs("kubelet-core-6"), ["core-6", "core-7"]);
        assert_eq!(
            devs("kubelet-milli-web-00001"),
            ["milli-web-00001", "milli-web-00002", "milli-web-00003"]
        );
        assert_eq!(h["kubelet-milli-web-00004"].container, "side");
        assert_eq!(h["kubelet-core-6"].container, "app");
    }
}
