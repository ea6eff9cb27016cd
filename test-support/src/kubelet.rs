//! A kubelet-shaped peer: what the kubelet and its container runtime serve to a device plugin,
//! on unix sockets, in the real protobuf. The answers come from a [`PodSource`]: [`MemoryPods`]
//! that a test edits in place, or one of the test's own (the guest checks' peer reads a file).
//!
//! Servers are spawned on the current tokio runtime.

use std::path::Path;
use std::sync::{Arc, Mutex};

use cpupoold::kubernetes::deviceplugin::proto::v1beta1 as dp;
use cpupoold::kubernetes::grpc::proto::{cri, podresources as pr};
use tokio::net::UnixListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

/// Binds `path`, making its directory and removing a file left there.
pub fn bind(path: &Path) -> std::io::Result<UnixListenerStream> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    Ok(UnixListenerStream::new(UnixListener::bind(path)?))
}

/// The kubelet's `v1beta1.Registration`: every Register is handed to a callback.
#[derive(Clone)]
pub struct Registration(Arc<dyn Fn(dp::RegisterRequest) + Send + Sync>);

impl Registration {
    /// Calls `on_register` with each request, then answers it.
    pub fn new(on_register: impl Fn(dp::RegisterRequest) + Send + Sync + 'static) -> Registration {
        Registration(Arc::new(on_register))
    }
}

#[tonic::async_trait]
impl dp::registration_server::Registration for Registration {
    async fn register(&self, r: Request<dp::RegisterRequest>) -> Result<Response<dp::Empty>, Status> {
        (self.0)(r.into_inner());
        Ok(Response::new(dp::Empty {}))
    }
}

/// Where the peer's PodResources and CRI answers come from.
pub trait PodSource: Clone + Send + Sync + 'static {
    /// PodResources `List`.
    fn pods(&self) -> Result<Vec<pr::PodResources>, Status>;
    /// PodResources `GetAllocatableResources`: the CPUs the CPU manager allocates from (none
    /// with the `none` policy).
    fn allocatable_cpus(&self) -> Result<Vec<i64>, Status> {
        Ok(Vec::new())
    }
    /// CRI `ListContainers`.
    fn containers(&self) -> Result<Vec<cri::Container>, Status> {
        Ok(Vec::new())
    }
}

/// Answers held in memory, changed by the test as it goes (clones share them).
#[derive(Clone, Default)]
pub struct MemoryPods {
    /// What PodResources `List` answers.
    pub pods: Arc<Mutex<Vec<pr::PodResources>>>,
    /// What `GetAllocatableResources` answers as CPU ids.
    pub allocatable: Arc<Mutex<Vec<i64>>>,
    /// What the CRI's `ListContainers` answers.
    pub containers: Arc<Mutex<Vec<cri::Container>>>,
}

fn locked<T: Clone>(m: &Mutex<T>) -> Result<T, Status> {
    m.lock().map(|v| v.clone()).map_err(|_| Status::internal("a test thread panicked holding the answers"))
}

impl PodSource for MemoryPods {
    fn pods(&self) -> Result<Vec<pr::PodResources>, Status> {
        locked(&self.pods)
    }
    fn allocatable_cpus(&self) -> Result<Vec<i64>, Status> {
        locked(&self.allocatable)
    }
    fn containers(&self) -> Result<Vec<cri::Container>, Status> {
        locked(&self.containers)
    }
}

/// A [`PodSource`] served as PodResources and as the CRI.
#[derive(Clone)]
pub struct Served<S>(pub S);

#[tonic::async_trait]
impl<S: PodSource> pr::pod_resources_lister_server::PodResourcesLister for Served<S> {
    async fn list(
        &self,
        _: Request<pr::ListPodResourcesRequest>,
    ) -> Result<Response<pr::ListPodResourcesResponse>, Status> {
        Ok(Response::new(pr::ListPodResourcesResponse { pod_resources: self.0.pods()? }))
    }

    async fn get_allocatable_resources(
        &self,
        _: Request<pr::AllocatableResourcesRequest>,
    ) -> Result<Response<pr::AllocatableResourcesResponse>, Status> {
        Ok(Response::new(pr::AllocatableResourcesResponse {
            cpu_ids: self.0.allocatable_cpus()?,
            ..Default::default()
        }))
    }
}

#[tonic::async_trait]
impl<S: PodSource> cri::runtime_service_server::RuntimeService for Served<S> {
    async fn list_containers(
        &self,
        _: Request<cri::ListContainersRequest>,
    ) -> Result<Response<cri::ListContainersResponse>, Status> {
        Ok(Response::new(cri::ListContainersResponse { containers: self.0.containers()? }))
    }
}

/// A server task; its error, if it fails.
pub type ServerTask = JoinHandle<Result<(), tonic::transport::Error>>;

/// Serves `source` as the kubelet's PodResources on `socket`.
pub fn serve_pod_resources<S: PodSource>(socket: &Path, source: S) -> std::io::Result<ServerTask> {
    let incoming = bind(socket)?;
    Ok(tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(pr::pod_resources_lister_server::PodResourcesListerServer::new(Served(source)))
            .serve_with_incoming(incoming),
    ))
}

/// Serves `source` as the container runtime's CRI on `socket`.
pub fn serve_runtime<S: PodSource>(socket: &Path, source: S) -> std::io::Result<ServerTask> {
    let incoming = bind(socket)?;
    Ok(tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(cri::runtime_service_server::RuntimeServiceServer::new(Served(source)))
            .serve_with_incoming(incoming),
    ))
}

/// The kubelet's registration socket `kubelet.sock` in a device-plugin directory, until
/// [`Kubelet::exit`].
pub struct Kubelet {
    stop: oneshot::Sender<()>,
    task: ServerTask,
}

impl Kubelet {
    /// Serves `registration` on `plugins/kubelet.sock`.
    pub fn serve(plugins: &Path, registration: Registration) -> std::io::Result<Kubelet> {
        let incoming = bind(&plugins.join("kubelet.sock"))?;
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(dp::registration_server::RegistrationServer::new(registration))
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                }),
        );
        Ok(Kubelet { stop, task })
    }

    /// Stops like a kubelet process exiting: the listener is closed before a new kubelet binds.
    pub async fn exit(self) {
        let _ = self.stop.send(());
        match self.task.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => panic!("the kubelet's registration server failed: {e}"),
            Err(e) => panic!("the kubelet's registration server task: {e}"),
        }
    }
}
