//! The pod watch: this node's pods (`spec.nodeName=<node>`), indexed by (namespace, pod,
//! container) for the device plugin, which needs the pod UID and container id to find a
//! container's cgroup, and by container id for the node report's owners.
//!
//! The index is filled from the API server's view, so nothing is guessed from cgroup names;
//! the device plugin consults it before the CRI ([`crate::core::container::ContainerSource`]).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use kube::{Api, Client};

/// What the index knows of one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerInfo {
    /// The pod's UID.
    pub pod_uid: String,
    /// The pod's QoS class (`Guaranteed`, `Burstable`, `BestEffort`), when the pod has one yet.
    pub qos_class: Option<String>,
    /// The container's id without the runtime prefix (`containerd://`, `cri-o://`).
    pub container_id: String,
}

/// (namespace, pod name, container name).
type Key = (String, String, String);

/// This node's running containers, as the API server reports them. Cheap to clone (shared).
#[derive(Debug, Clone, Default)]
pub struct PodIndex {
    inner: Arc<RwLock<Inner>>,
    changed: Arc<tokio::sync::watch::Sender<u64>>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Per pod ((namespace, name)): its containers.
    pods: HashMap<(String, String), Vec<(String, ContainerInfo)>>,
}

impl PodIndex {
    /// An empty index.
    pub fn new() -> PodIndex {
        PodIndex::default()
    }

    /// The container `container` of pod `namespace/pod`, if it has an id yet.
    pub fn lookup(&self, namespace: &str, pod: &str, container: &str) -> Option<ContainerInfo> {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        let containers = inner.pods.get(&(namespace.to_owned(), pod.to_owned()))?;
        containers.iter().find(|(name, _)| name == container).map(|(_, info)| info.clone())
    }

    /// The (namespace, pod, container) and its info of the container whose id `text` contains
    /// (a cgroup path such as `kubepods/.../cri-containerd-<id>.scope`).
    pub fn find_by_id_in(&self, text: &str) -> Option<(Key, ContainerInfo)> {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        inner.pods.iter().find_map(|((ns, pod), containers)| {
            containers
                .iter()
                .find(|(_, info)| !info.container_id.is_empty() && text.contains(&info.container_id))
                .map(|(name, info)| ((ns.clone(), pod.clone(), name.clone()), info.clone()))
        })
    }

    /// How many containers are indexed.
    pub fn len(&self) -> usize {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        inner.pods.values().map(Vec::len).sum()
    }

    /// Whether no container is indexed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tells of every change to the index (the node report follows it).
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Adds or replaces `pod`.
    pub fn apply(&self, pod: &Pod) {
        let Some(key) = pod_key(pod) else { return };
        let containers = containers(pod);
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        if inner.pods.get(&key) == Some(&containers) {
            return;
        }
        inner.pods.insert(key, containers);
        drop(inner);
        self.bump();
    }

    /// Removes `pod`.
    pub fn delete(&self, pod: &Pod) {
        let Some(key) = pod_key(pod) else { return };
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        if inner.pods.remove(&key).is_some() {
            drop(inner);
            self.bump();
        }
    }

    /// Replaces everything with `pods` (after a list).
    pub fn replace(&self, pods: &[Pod]) {
        let fresh: HashMap<_, _> = pods.iter().filter_map(|p| Some((pod_key(p)?, containers(p)))).collect();
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        if inner.pods != fresh {
            inner.pods = fresh;
            drop(inner);
            self.bump();
        }
    }

    fn bump(&self) {
        self.changed.send_modify(|n| *n += 1);
    }
}

fn pod_key(pod: &Pod) -> Option<(String, String)> {
    Some((pod.metadata.namespace.clone()?, pod.metadata.name.clone()?))
}

/// The containers of `pod` that have an id (init containers included: they hold CPUs too).
fn containers(pod: &Pod) -> Vec<(String, ContainerInfo)> {
    let Some(status) = &pod.status else { return Vec::new() };
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let all =
        status.container_statuses.iter().flatten().chain(status.init_container_statuses.iter().flatten());
    let mut out: Vec<(String, ContainerInfo)> = all
        .filter_map(|c| {
            let id = strip_runtime(c.container_id.as_deref()?);
            (!id.is_empty()).then(|| {
                (
                    c.name.clone(),
                    ContainerInfo {
                        pod_uid: uid.clone(),
                        qos_class: status.qos_class.clone(),
                        container_id: id.to_owned(),
                    },
                )
            })
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// `containerd://abc` → `abc` (any `scheme://`).
pub fn strip_runtime(id: &str) -> &str {
    id.split_once("://").map_or(id, |(_, rest)| rest)
}

/// Follows this node's pods into `index` until `stop` is set.
pub async fn run(
    client: Client,
    node: String,
    index: PodIndex,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let api: Api<Pod> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let mut listing: Vec<Pod> = Vec::new();
    super::watch::follow(
        "pods",
        api,
        config,
        |event| match event {
            watcher::Event::Init => listing.clear(),
            watcher::Event::InitApply(p) => listing.push(p),
            watcher::Event::InitDone => index.replace(&std::mem::take(&mut listing)),
            watcher::Event::Apply(p) => index.apply(&p),
            watcher::Event::Delete(p) => index.delete(&p),
        },
        &mut stop,
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ns: &str, name: &str, uid: &str, containers: &[(&str, &str)]) -> Pod {
        let statuses: Vec<_> = containers
            .iter()
            .map(|(n, id)| serde_json::json!({"name": n, "containerID": id, "image": "i", "imageID": "", "ready": true, "restartCount": 0}))
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": ns, "name": name, "uid": uid},
            "status": {"qosClass": "Guaranteed", "containerStatuses": statuses}
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn index_follows_pods_and_strips_the_runtime_prefix() {
        let index = PodIndex::new();
        let rx = index.subscribe();
        index.apply(&pod("ns", "p", "u1", &[("a", "containerd://aaa"), ("b", "cri-o://bbb"), ("c", "")]));
        let a = index.lookup("ns", "p", "a").unwrap_or_else(|| panic!("a indexed"));
        assert_eq!((a.pod_uid.as_str(), a.container_id.as_str()), ("u1", "aaa"));
        assert_eq!(a.qos_class.as_deref(), Some("Guaranteed"));
        assert_eq!(index.lookup("ns", "p", "b").map(|i| i.container_id), Some("bbb".to_owned()));
        assert_eq!(index.lookup("ns", "p", "c"), None, "a container without an id yet");
        assert_eq!(index.lookup("other", "p", "a"), None);
        assert!(rx.has_changed().unwrap_or(false));
        let found = index.find_by_id_in("kubepods.slice/kubepods-podu1.slice/cri-containerd-bbb.scope");
        assert_eq!(found.map(|(k, _)| k), Some(("ns".into(), "p".into(), "b".into())));
        index.replace(&[pod("ns", "q", "u2", &[("x", "containerd://xxx")])]);
        assert_eq!(index.lookup("ns", "p", "a"), None);
        assert_eq!(index.len(), 1);
        index.delete(&pod("ns", "q", "u2", &[]));
        assert!(index.is_empty());
    }
}
