//! Configuration from the cluster: the ConfigMaps `cpupoold-config.node.<node>`,
//! `cpupoold-config.group.<group>` (the node's `cpupool.io/group` label) and
//! `cpupoold-config.default` in the daemon's namespace. The most specific one that exists wins;
//! its `config.toml` key is one more fragment, merged after every local file.
//!
//! ```text
//! node watch (label) ─┐
//!                     ├─► choose ─► check like a local drop-in (load_with + resolve_pools)
//! ConfigMap watch ────┘               │ valid: write <runtime_dir>/cluster.toml atomically,
//!                                     │        handle.reload_from_disk() (as SIGHUP does)
//!                                     └ invalid: keep the running config and the file,
//!                                              ConfigInvalid=True in the node report
//! ```
//!
//! None of the three: the cluster file is removed and the local files alone apply. A ConfigMap
//! is decided once per resourceVersion, so a rejected one is not retried until it changes.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::sync::{mpsc, watch};

use super::ClusterStatus;
use crate::engine::{ConfigSource, Handle};
use crate::error_chain;
use crate::host::fsutil::{FsError, Root};

/// Every ConfigMap the daemon reads is named with this prefix.
pub const PREFIX: &str = "cpupoold-config.";
/// The node label that names the node's group.
pub const GROUP_LABEL: &str = "cpupool.io/group";
/// The ConfigMap key that holds the fragment.
pub const KEY: &str = "config.toml";

/// The names to look for, most specific first.
pub fn candidates(node: &str, group: Option<&str>) -> Vec<String> {
    let mut names = vec![format!("{PREFIX}node.{node}")];
    if let Some(g) = group.filter(|g| !g.is_empty()) {
        names.push(format!("{PREFIX}group.{g}"));
    }
    names.push(format!("{PREFIX}default"));
    names
}

/// The ConfigMap that applies to `node` in group `group`, if any exists in `maps`.
pub fn choose<'a>(
    maps: &'a BTreeMap<String, ConfigMap>,
    node: &str,
    group: Option<&str>,
) -> Option<&'a ConfigMap> {
    candidates(node, group).iter().find_map(|n| maps.get(n))
}

/// What the two watches tell the decision loop.
enum Msg {
    /// The node's group label (`None`: no label, or no such node).
    Group(Option<String>),
    /// A fresh list of our ConfigMaps.
    Listed(Vec<ConfigMap>),
    Applied(ConfigMap),
    Deleted(ConfigMap),
}

/// Applies what the cluster says to the running daemon.
pub struct Applier {
    handle: Handle,
    source: ConfigSource,
    /// `<runtime_dir>/cluster.toml`.
    path: PathBuf,
    /// (name, resourceVersion) of the last ConfigMap decided on; `Some(None)`: none applied.
    last: Option<Option<(String, String)>>,
    status: watch::Sender<ClusterStatus>,
}

impl Applier {
    /// An applier that writes `path` (which `source` must read as its cluster fragment).
    pub fn new(
        handle: Handle,
        source: ConfigSource,
        path: PathBuf,
        status: watch::Sender<ClusterStatus>,
    ) -> Self {
        Applier { handle, source, path, last: None, status }
    }

    /// Makes `chosen` the cluster fragment, or removes it when `None`.
    pub async fn decide(&mut self, chosen: Option<&ConfigMap>) {
        let key = chosen.map(|cm| {
            (
                cm.metadata.name.clone().unwrap_or_default(),
                cm.metadata.resource_version.clone().unwrap_or_default(),
            )
        });
        if self.last.as_ref() == Some(&key) {
            return;
        }
        self.last = Some(key.clone());
        let Some((name, version)) = key else {
            self.remove().await;
            return;
        };
        let generation = format!("{name}@{version}");
        let text = chosen.and_then(|cm| cm.data.as_ref()).and_then(|d| d.get(KEY));
        let result = match text {
            None => Err(format!("ConfigMap `{name}` has no `{KEY}` key")),
            Some(text) => self.apply(text).await,
        };
        match result {
            Ok(changed) => {
                log::info!(
                    "k8s: configuration from ConfigMap {generation} applied{}",
                    if changed { "" } else { " (nothing changed)" }
                );
                self.status.send_modify(|s| {
                    s.generation = Some(generation.clone());
                    s.rejected = None;
                });
            }
            Err(reason) => {
                log::error!(
                    "k8s: configuration from ConfigMap {generation} rejected, the running one stays: {reason}"
                );
                self.status.send_modify(|s| s.rejected = Some(format!("ConfigMap {generation}: {reason}")));
            }
        }
    }

    /// Checks `text` as the cluster fragment, then writes and applies it. `Ok(changed)`.
    async fn apply(&mut self, text: &str) -> Result<bool, String> {
        let settings = self.source.load(Some((&self.path, Some(text)))).map_err(|e| error_chain(&e))?;
        settings.resolve_pools(&self.handle.snapshot().topology).map_err(|e| error_chain(&e))?;
        let previous = match fs::read_to_string(&self.path) {
            Ok(t) => Some(t),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(format!("reading `{}`: {e}", self.path.display())),
        };
        write_atomically(&self.path, text).map_err(|e| error_chain(&e))?;
        match self.handle.reload_from_disk().await {
            Ok(r) => Ok(r.any()),
            Err(e) => {
                // The engine kept the running configuration: put back the file it came from.
                let restored = match &previous {
                    Some(t) => write_atomically(&self.path, t).map_err(|e| error_chain(&e)),
                    None => remove(&self.path).map_err(|e| e.to_string()),
                };
                if let Err(re) = restored {
                    log::error!("k8s: restoring `{}`: {re}", self.path.display());
                }
                let _ = self.handle.reload_from_disk().await;
                Err(error_chain(&e))
            }
        }
    }

    /// No ConfigMap applies: the local files alone.
    async fn remove(&mut self) {
        let existed = self.path.exists();
        if let Err(e) = remove(&self.path) {
            log::error!("k8s: removing `{}`: {e}", self.path.display());
            return;
        }
        self.status.send_modify(|s| {
            s.generation = None;
            s.rejected = None;
        });
        if existed {
            match self.handle.reload_from_disk().await {
                Ok(_) => log::info!(
                    "k8s: no cpupoold-config ConfigMap applies any more; the local files alone apply"
                ),
                Err(e) => log::error!("k8s: reloading the local files: {}", error_chain(&e)),
            }
        }
    }
}

fn remove(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// The durable write ([`Root::replace`]): the file is the old or the new one, and a symbolic link
/// at its name is replaced, not written through.
fn write_atomically(path: &Path, text: &str) -> Result<(), FsError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let root = Root::create(dir, 0o755)?;
    root.replace(path.file_name().unwrap_or_default(), text.as_bytes(), 0o644)
}

/// Follows the node's group label and the ConfigMaps in `namespace` until `stop` is set,
/// applying the one that wins through `applier`.
pub async fn run(
    client: Client,
    node: String,
    namespace: String,
    mut applier: Applier,
    stop: watch::Receiver<bool>,
) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let node_task = tokio::spawn(watch_node(client.clone(), node.clone(), tx.clone(), stop.clone()));
    let map_task = tokio::spawn(watch_configmaps(client, namespace, tx, stop.clone()));

    // Nothing is decided before both the node and the ConfigMaps were listed once.
    let mut group: Option<Option<String>> = None;
    let mut configmaps: Option<BTreeMap<String, ConfigMap>> = None;
    let mut stop = stop;
    loop {
        let msg = tokio::select! {
            m = rx.recv() => m,
            _ = crate::kubernetes::apiserver::stopped(&mut stop) => None,
        };
        let Some(msg) = msg else { break };
        match msg {
            Msg::Group(g) => group = Some(g),
            Msg::Listed(list) => {
                configmaps =
                    Some(list.into_iter().filter_map(|cm| Some((cm.metadata.name.clone()?, cm))).collect())
            }
            Msg::Applied(cm) => {
                if let (Some(maps), Some(name)) = (configmaps.as_mut(), cm.metadata.name.clone()) {
                    maps.insert(name, cm);
                }
            }
            Msg::Deleted(cm) => {
                if let (Some(maps), Some(name)) = (configmaps.as_mut(), cm.metadata.name.as_ref()) {
                    maps.remove(name);
                }
            }
        }
        // Take what is queued first: a relist and the changes after it are one decision.
        if !rx.is_empty() {
            continue;
        }
        if let (Some(group), Some(maps)) = (&group, &configmaps) {
            applier.decide(choose(maps, &node, group.as_deref())).await;
        }
    }
    let _ = node_task.await;
    let _ = map_task.await;
}

/// Follows this node's group label: [`Msg::Group`] after the first listing and on every change.
async fn watch_node(
    client: Client,
    node: String,
    tx: mpsc::UnboundedSender<Msg>,
    mut stop: watch::Receiver<bool>,
) {
    let nodes: Api<Node> = Api::all(client);
    let node_config = watcher::Config::default().fields(&format!("metadata.name={node}"));
    let mut found: Option<String> = None;
    let label = |n: &Node| n.metadata.labels.as_ref().and_then(|l| l.get(GROUP_LABEL)).cloned();
    super::watch::follow(
        "the node",
        nodes,
        node_config,
        |event| match event {
            watcher::Event::Init => found = None,
            watcher::Event::InitApply(n) => found = label(&n),
            watcher::Event::InitDone => {
                let _ = tx.send(Msg::Group(found.clone()));
            }
            watcher::Event::Apply(n) => {
                let _ = tx.send(Msg::Group(label(&n)));
            }
            watcher::Event::Delete(_) => {
                let _ = tx.send(Msg::Group(None));
            }
        },
        &mut stop,
    )
    .await;
}

/// Follows our ConfigMaps in `namespace`: the whole listing ([`Msg::Listed`]), then each change.
async fn watch_configmaps(
    client: Client,
    namespace: String,
    tx: mpsc::UnboundedSender<Msg>,
    mut stop: watch::Receiver<bool>,
) {
    let maps: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let mut listing = Vec::new();
    let ours = |cm: &ConfigMap| cm.metadata.name.as_deref().is_some_and(|n| n.starts_with(PREFIX));
    super::watch::follow(
        "ConfigMaps",
        maps,
        watcher::Config::default(),
        |event| match event {
            watcher::Event::Init => listing.clear(),
            watcher::Event::InitApply(cm) if ours(&cm) => listing.push(cm),
            watcher::Event::InitApply(_) => {}
            watcher::Event::InitDone => {
                let _ = tx.send(Msg::Listed(std::mem::take(&mut listing)));
            }
            watcher::Event::Apply(cm) if ours(&cm) => {
                let _ = tx.send(Msg::Applied(cm));
            }
            watcher::Event::Delete(cm) if ours(&cm) => {
                let _ = tx.send(Msg::Deleted(cm));
            }
            watcher::Event::Apply(_) | watcher::Event::Delete(_) => {}
        },
        &mut stop,
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cm(name: &str) -> (String, ConfigMap) {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name.to_owned());
        (name.to_owned(), cm)
    }

    #[test]
    fn the_most_specific_configmap_wins() {
        let name = |m: Option<&ConfigMap>| m.and_then(|c| c.metadata.name.clone());
        let mut maps: BTreeMap<String, ConfigMap> = BTreeMap::new();
        assert_eq!(name(choose(&maps, "n1", Some("g"))), None);
        maps.extend([
            cm("cpupoold-config.default"),
            cm("cpupoold-config.group.g"),
            cm("cpupoold-config.node.n2"),
        ]);
        assert_eq!(name(choose(&maps, "n1", None)).as_deref(), Some("cpupoold-config.default"));
        assert_eq!(name(choose(&maps, "n1", Some("g"))).as_deref(), Some("cpupoold-config.group.g"));
        assert_eq!(name(choose(&maps, "n1", Some("h"))).as_deref(), Some("cpupoold-config.default"));
        maps.extend([cm("cpupoold-config.node.n1")]);
        assert_eq!(name(choose(&maps, "n1", Some("g"))).as_deref(), Some("cpupoold-config.node.n1"));
        assert_eq!(candidates("n", Some("")), ["cpupoold-config.node.n", "cpupoold-config.default"]);
    }

    #[test]
    fn the_cluster_fragment_is_written_durably_and_never_through_a_link() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = tmp.path().join("run/cpupoold/cluster.toml");
        write_atomically(&path, "[pools]\n").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(fs::read_to_string(&path).unwrap_or_default(), "[pools]\n");
        let outside = tmp.path().join("passwd");
        fs::write(&outside, "root:x:0:0\n").unwrap_or_else(|e| panic!("{e}"));
        fs::remove_file(&path).unwrap_or_else(|e| panic!("{e}"));
        std::os::unix::fs::symlink(&outside, &path).unwrap_or_else(|e| panic!("{e}"));
        // Links at the temporary names, the one used before and the one used now.
        for tmp_name in ["cluster.toml.tmp", ".cluster.toml.tmp"] {
            std::os::unix::fs::symlink(&outside, path.with_file_name(tmp_name))
                .unwrap_or_else(|e| panic!("{e}"));
        }
        write_atomically(&path, "[daemon]\n").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(fs::read_to_string(&outside).unwrap_or_default(), "root:x:0:0\n");
        assert!(fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_file()));
        assert_eq!(fs::read_to_string(&path).unwrap_or_default(), "[daemon]\n");
    }
}
