//! Our client of the Kubernetes API server (the `k8s` cargo feature), which the cluster
//! objects ([`crate::kubernetes::cluster`]) and the DRA driver ([`crate::kubernetes::dra`])
//! share: the options `[k8s]` and the environment give, the client once one can be made (a
//! kubeconfig that is not there yet is tried again while the local files apply), and the
//! server's errors in words that say what to fix.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::Client;

use crate::error_chain;

/// The namespace when neither `k8s.namespace` nor `POD_NAMESPACE` says.
pub const DEFAULT_NAMESPACE: &str = "cpupool-system";

/// What the integration runs with: `[k8s]` with the environment's defaults filled in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// `k8s.kubeconfig` (`None`: in-cluster, then `$KUBECONFIG` / `~/.kube/config`).
    pub kubeconfig: Option<PathBuf>,
    /// `k8s.node_name`, else `$NODE_NAME`, else the host name.
    pub node: String,
    /// `k8s.namespace`, else `$POD_NAMESPACE`, else [`DEFAULT_NAMESPACE`].
    pub namespace: String,
    /// `k8s.report_interval_ms`.
    pub report_interval: Duration,
}

impl Options {
    /// The options for `k8s`, reading the environment and the host name for what it leaves out:
    /// the host name is `sys/kernel/hostname` under the procfs root, so a sandbox names its
    /// own node.
    pub fn from_settings(k8s: &crate::config::K8s, procfs_root: &Path) -> Result<Options, K8sError> {
        Options::with_env(k8s, procfs_root, |k| std::env::var(k).ok())
    }

    /// [`Options::from_settings`] with the environment's variables from `var`.
    fn with_env(
        k8s: &crate::config::K8s,
        procfs_root: &Path,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Options, K8sError> {
        let env = |k: &str| var(k).filter(|v| !v.is_empty());
        let node = match k8s.node_name.clone().or_else(|| env("NODE_NAME")) {
            Some(n) => n,
            None => std::fs::read_to_string(procfs_root.join("sys/kernel/hostname"))
                .map(|h| h.trim().to_lowercase())
                .map_err(K8sError::Hostname)?,
        };
        if !crate::config::is_node_name(&node) {
            return Err(K8sError::NodeName(node));
        }
        let namespace =
            k8s.namespace.clone().or_else(|| env("POD_NAMESPACE")).unwrap_or(DEFAULT_NAMESPACE.into());
        Ok(Options {
            kubeconfig: k8s.kubeconfig.clone(),
            node,
            namespace,
            report_interval: k8s.report_interval,
        })
    }
}

/// Why the integration could not start.
#[derive(Debug, thiserror::Error)]
pub enum K8sError {
    /// The host name could not be read for the node name.
    #[error("reading the host name for k8s.node_name (set it, or NODE_NAME)")]
    Hostname(#[source] std::io::Error),
    /// The node name is not one Kubernetes accepts.
    #[error(
        "the node name `{0}` (from NODE_NAME or the host name) is not a DNS subdomain; set k8s.node_name"
    )]
    NodeName(String),
    /// The kubeconfig named by `k8s.kubeconfig` could not be read.
    #[error("k8s.kubeconfig: reading `{}`", path.display())]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// Neither the in-cluster account nor a kubeconfig could be used.
    #[error("k8s.kubeconfig is empty and neither the in-cluster service account nor $KUBECONFIG / ~/.kube/config can be used")]
    NoConfig(#[source] kube::config::KubeconfigError),
    /// The client could not be built from the configuration.
    #[error("building the Kubernetes client")]
    Client(#[source] kube::Error),
}

/// The client for `opts`: the kubeconfig file, or the in-cluster account, then the default
/// kubeconfig.
pub async fn client(opts: &Options) -> Result<Client, K8sError> {
    let config = match &opts.kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .map_err(|source| K8sError::Kubeconfig { path: path.clone(), source })?;
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|source| K8sError::Kubeconfig { path: path.clone(), source })?
        }
        None => match kube::Config::incluster() {
            Ok(c) => c,
            Err(_) => kube::Config::from_kubeconfig(&KubeConfigOptions::default())
                .await
                .map_err(K8sError::NoConfig)?,
        },
    };
    Client::try_from(without_tls_roots_for_http(config)).map_err(K8sError::Client)
}

/// An `http://` API server (a local `kubectl proxy`, a test's fake) is spoken to without TLS,
/// yet the client still builds its TLS settings, and with no CA in the kubeconfig they come
/// from the host's CA bundle: a node without one (no `ca-certificates` package) could not
/// reach the server at all. Such a server gets an empty set of roots, which nothing uses.
fn without_tls_roots_for_http(mut config: kube::Config) -> kube::Config {
    if config.cluster_url.scheme_str() == Some("http") && config.root_cert.is_none() {
        config.root_cert = Some(Vec::new());
    }
    config
}

/// A client, once one can be made: a kubeconfig that is not there yet (the host-package route
/// writes it when the node joins) or not valid is tried again, 1 s doubling to 60 s, while the
/// local configuration files apply. `None` when `stop` is set first.
pub(crate) async fn client_when_ready(
    opts: &Options,
    stop: &mut tokio::sync::watch::Receiver<bool>,
) -> Option<Client> {
    let mut backoff =
        crate::backoff::Backoff::new(std::time::Duration::from_secs(1), std::time::Duration::from_secs(60));
    let mut pause = backoff.fail();
    let mut failing = false;
    loop {
        match client(opts).await {
            Ok(c) => {
                if failing {
                    log::info!("k8s: the client is ready");
                }
                return Some(c);
            }
            Err(e) if !failing => {
                log::error!(
                    "k8s: {}; the local configuration files alone apply until it can be made (trying again)",
                    error_chain(&e)
                );
                failing = true;
            }
            Err(e) => log::debug!("k8s: {}", error_chain(&e)),
        }
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = stopped(stop) => return None,
        }
        pause = backoff.fail();
    }
}

/// Resolves once `stop` is set (or its sender is gone).
pub(crate) async fn stopped(stop: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// A client error in words that say what to fix.
pub fn describe(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(r) => describe_status(r),
        other => error_chain(other),
    }
}

/// An API server `Status` in words.
pub fn describe_status(r: &kube::core::ErrorResponse) -> String {
    match r.code {
        401 => format!(
            "the API server refused our credentials (401 Unauthorized: {}); check the token or certificate in \
             k8s.kubeconfig or the service account",
            r.message
        ),
        403 => format!(
            "forbidden (403: {}); the daemon's role needs what deploy/rbac.yaml grants",
            r.message
        ),
        code => format!("{code} {}: {}", r.reason, r.message),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::{without_tls_roots_for_http, K8sError, Options, DEFAULT_NAMESPACE};
    use crate::config::K8s;

    fn procfs_with_hostname(name: Option<&str>) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("a temporary procfs: {e}"));
        if let Some(name) = name {
            let kernel = dir.path().join("sys/kernel");
            std::fs::create_dir_all(&kernel).unwrap_or_else(|e| panic!("{}: {e}", kernel.display()));
            std::fs::write(kernel.join("hostname"), format!("{name}\n"))
                .unwrap_or_else(|e| panic!("the host name: {e}"));
        }
        dir
    }

    fn options(k8s: &K8s, procfs: &Path, vars: &[(&str, &str)]) -> Result<Options, K8sError> {
        Options::with_env(k8s, procfs, |k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string()))
    }

    #[test]
    fn the_node_is_the_setting_then_node_name_then_the_host_name_under_the_procfs_root() {
        let procfs = procfs_with_hostname(Some("Worker-7.Example.Com"));
        let none = K8s::default();
        let from_host = options(&none, procfs.path(), &[]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(from_host.node, "worker-7.example.com", "lower-cased, as the kubelet names it");
        assert_eq!(from_host.namespace, DEFAULT_NAMESPACE);
        // An empty variable is no variable, as in a manifest's `value: ""`.
        let empty = options(&none, procfs.path(), &[("NODE_NAME", "")]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(empty.node, "worker-7.example.com");
        let env = [("NODE_NAME", "node-from-env"), ("POD_NAMESPACE", "kube-system")];
        let from_env = options(&none, procfs.path(), &env).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((from_env.node.as_str(), from_env.namespace.as_str()), ("node-from-env", "kube-system"));
        let set =
            K8s { node_name: Some("node-set".into()), namespace: Some("ns-set".into()), ..K8s::default() };
        let from_setting = options(&set, procfs.path(), &env).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((from_setting.node.as_str(), from_setting.namespace.as_str()), ("node-set", "ns-set"));
    }

    #[test]
    fn a_host_name_that_cannot_be_read_or_is_no_node_name_is_an_error_naming_the_setting() {
        let missing = procfs_with_hostname(None);
        let e = options(&K8s::default(), missing.path(), &[]).err();
        assert!(matches!(e, Some(K8sError::Hostname(_))), "{e:?}");
        assert!(e.map(|e| e.to_string()).unwrap_or_default().contains("k8s.node_name"));
        let bad = procfs_with_hostname(Some("under_score"));
        let e = options(&K8s::default(), bad.path(), &[]).err();
        assert!(matches!(&e, Some(K8sError::NodeName(n)) if n == "under_score"), "{e:?}");
    }

    #[test]
    fn an_http_server_needs_no_ca_bundle_and_https_keeps_its_roots() {
        let url = |u: &str| u.parse().unwrap_or_else(|e| panic!("{u}: {e}"));
        let http = without_tls_roots_for_http(kube::Config::new(url("http://127.0.0.1:8001")));
        assert_eq!(http.root_cert, Some(Vec::new()));
        let https = without_tls_roots_for_http(kube::Config::new(url("https://10.0.0.1:6443")));
        assert_eq!(https.root_cert, None, "the host's CA bundle still checks an https server");
        let mut given = kube::Config::new(url("http://127.0.0.1:8001"));
        given.root_cert = Some(vec![vec![1, 2, 3]]);
        assert_eq!(without_tls_roots_for_http(given).root_cert, Some(vec![vec![1, 2, 3]]));
    }
}
