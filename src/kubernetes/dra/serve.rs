//! The driver's two sockets and their thin gRPC services: `Registration` (the plugin watcher's
//! GetInfo and NotifyRegistrationStatus) on the registration socket, `v1.DRAPlugin` on the
//! endpoint, each claim of a request handed to [`Driver`] and its answer encoded.

use std::sync::Arc;

use tokio::sync::{watch, Semaphore};
use tonic::{Request, Response, Status};

use super::prepare::Driver;
use super::proto::{dra, pluginregistration as reg};
use super::{Options, PLUGIN_TYPE, VERSIONS};
use crate::fds::Refusals;
use crate::host::kubelet::{file_id, FileId};
use crate::kubernetes::grpc::incoming;

/// Connections both sockets hold at once: the kubelet keeps one to the endpoint, and dials the
/// registration socket now and then.
const CONNECTIONS: usize = 16;

/// Refused connections to the driver's sockets.
static REFUSALS: Refusals = Refusals::new("DRA plugin");

/// Why the sockets could not be served.
#[derive(Debug)]
pub(super) struct StartError {
    /// What failed, with the cause.
    pub(super) message: String,
    /// The cause was a read-only file system: under systemd, a directory of the kubelet's that
    /// did not exist when the unit started (its `ReadWritePaths=` take only what exists then).
    pub(super) read_only: bool,
}

impl StartError {
    fn io(what: String, e: &std::io::Error) -> StartError {
        StartError {
            message: format!("{what}: {e}"),
            read_only: e.kind() == std::io::ErrorKind::ReadOnlyFilesystem,
        }
    }

    fn other(what: &str) -> StartError {
        StartError { message: what.to_owned(), read_only: false }
    }
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Both sockets served, until dropped.
pub(super) struct Serving {
    sockets: [(std::path::PathBuf, Option<FileId>); 2],
    stop: watch::Sender<bool>,
}

impl Serving {
    /// Binds the endpoint, then the registration socket (the plugin watcher dials the endpoint
    /// as soon as it read the registration), and serves both.
    pub(super) fn start(opts: &Options, driver: Arc<Driver>) -> Result<Serving, StartError> {
        let (endpoint, registration) = (opts.endpoint(), opts.registration());
        let slots = Arc::new(Semaphore::new(CONNECTIONS));
        let (stop, stopped) = watch::channel(false);
        let mut sockets = Vec::new();
        for (sock, what) in [(&endpoint, "the DRA endpoint"), (&registration, "the registration socket")] {
            if let Some(dir) = sock.parent() {
                std::fs::create_dir_all(dir)
                    .map_err(|e| StartError::io(format!("making `{}`", dir.display()), &e))?;
            }
            let listener = incoming::bind_private(sock)
                .map_err(|e| StartError::io(format!("binding {what} `{}`", sock.display()), &e))?;
            let incoming = incoming::capped(listener, slots.clone(), &REFUSALS);
            let mut until = stopped.clone();
            let shutdown = async move {
                let _ = until.wait_for(|s| *s).await;
            };
            let router = if sockets.is_empty() {
                tonic::transport::Server::builder()
                    .add_service(dra::dra_plugin_server::DraPluginServer::new(Endpoint(driver.clone())))
            } else {
                let info = reg::PluginInfo {
                    r#type: PLUGIN_TYPE.into(),
                    name: opts.driver.clone(),
                    endpoint: endpoint.display().to_string(),
                    supported_versions: VERSIONS.iter().map(|v| (*v).to_owned()).collect(),
                };
                tonic::transport::Server::builder()
                    .add_service(reg::registration_server::RegistrationServer::new(Registration(info)))
            };
            let what = what.to_owned();
            tokio::spawn(async move {
                if let Err(e) = router.serve_with_incoming_shutdown(incoming, shutdown).await {
                    log::error!("DRA: {what} failed: {e}");
                }
            });
            sockets.push((sock.clone(), file_id(sock)));
        }
        let [e, r]: [(std::path::PathBuf, Option<FileId>); 2] =
            sockets.try_into().map_err(|_| StartError::other("the sockets were not both bound"))?;
        Ok(Serving { sockets: [e, r], stop })
    }

    /// Whether both sockets are still the ones bound (not removed with the kubelet's directory).
    pub(super) fn intact(&self) -> bool {
        self.sockets.iter().all(|(p, id)| id.is_some() && file_id(p) == *id)
    }
}

impl Drop for Serving {
    /// Stops both servers and removes the sockets that are still ours.
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        for (p, id) in &self.sockets {
            if id.is_some() && file_id(p) == *id {
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

/// The plugin watcher's side.
struct Registration(reg::PluginInfo);

#[tonic::async_trait]
impl reg::registration_server::Registration for Registration {
    async fn get_info(&self, _: Request<reg::InfoRequest>) -> Result<Response<reg::PluginInfo>, Status> {
        Ok(Response::new(self.0.clone()))
    }

    async fn notify_registration_status(
        &self,
        r: Request<reg::RegistrationStatus>,
    ) -> Result<Response<reg::RegistrationStatusResponse>, Status> {
        let r = r.into_inner();
        if r.plugin_registered {
            log::info!("DRA: the kubelet registered driver {}", self.0.name);
        } else {
            log::error!("DRA: the kubelet refused driver {}: {}", self.0.name, r.error);
        }
        Ok(Response::new(reg::RegistrationStatusResponse {}))
    }
}

/// The most claims one call names. The kubelet names the claims of one pod that this driver
/// serves, a handful; a call naming more is refused whole, before any claim is read, so that
/// one call cannot hold the API server's connections and the daemon's descriptors.
pub(super) const MAX_CLAIMS_PER_CALL: usize = 256;
/// The claims of one call worked on at once (each may read its ResourceClaim from the API
/// server, one connection each): the rest wait their turn, in order.
const AT_ONCE: usize = 8;

/// Refuses a call naming more than [`MAX_CLAIMS_PER_CALL`] claims.
fn within_cap(n: usize) -> Result<(), Status> {
    if n > MAX_CLAIMS_PER_CALL {
        return Err(Status::invalid_argument(format!(
            "claims: {n} in one call, over the {MAX_CLAIMS_PER_CALL} cpupoold takes; nothing was done"
        )));
    }
    Ok(())
}

/// The outputs of `calls` in their order, at most [`AT_ONCE`] running at a time.
async fn at_most_some_at_once<T, F: std::future::Future<Output = T>>(calls: Vec<F>) -> Vec<T> {
    use futures_util::StreamExt;
    futures_util::stream::iter(calls).buffered(AT_ONCE).collect().await
}

/// The `v1.DRAPlugin` endpoint.
struct Endpoint(Arc<Driver>);

#[tonic::async_trait]
impl dra::dra_plugin_server::DraPlugin for Endpoint {
    async fn node_prepare_resources(
        &self,
        r: Request<dra::NodePrepareResourcesRequest>,
    ) -> Result<Response<dra::NodePrepareResourcesResponse>, Status> {
        let claims = r.into_inner().claims;
        within_cap(claims.len())?;
        let answers = at_most_some_at_once(claims.iter().map(|c| self.0.prepare(c)).collect()).await;
        let claims = claims
            .into_iter()
            .zip(answers)
            .map(|(c, answer)| {
                let resp = match answer {
                    Ok(devices) => dra::NodePrepareResourceResponse { devices, error: String::new() },
                    Err(error) => dra::NodePrepareResourceResponse { devices: Vec::new(), error },
                };
                (c.uid, resp)
            })
            .collect();
        Ok(Response::new(dra::NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        r: Request<dra::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<dra::NodeUnprepareResourcesResponse>, Status> {
        let claims = r.into_inner().claims;
        within_cap(claims.len())?;
        let answers = at_most_some_at_once(claims.iter().map(|c| self.0.unprepare(c)).collect()).await;
        let claims = claims
            .into_iter()
            .zip(answers)
            .map(|(c, answer)| {
                (c.uid, dra::NodeUnprepareResourceResponse { error: answer.err().unwrap_or_default() })
            })
            .collect();
        Ok(Response::new(dra::NodeUnprepareResourcesResponse { claims }))
    }
}
