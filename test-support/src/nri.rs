//! A fake container runtime's end of NRI, shaped on containerd's: it listens on the socket,
//! takes a plugin's `RegisterPlugin` on multiplexer connection 2, and calls the plugin's
//! methods on connection 1 with a deadline, as ttRPC requests with odd, increasing stream ids.
//!
//! Its framing is written here on purpose, not borrowed from the daemon: the daemon's
//! multiplexer and ttRPC are what it checks. Like Go's writer, it sends a message longer than
//! 4096 bytes as a 4096-byte frame and then the rest, so the daemon's reassembly is exercised.
//! Blocking (std) I/O: a test drives it step by step.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::{Duration, Instant};

use cpupoold::kubernetes::deviceplugin::proto::v1beta1 as dp;
use cpupoold::kubernetes::grpc::clients::unix_channel;
use cpupoold::kubernetes::nri::proto as api;
use prost::Message;

use crate::kubelet::{self, MemoryPods};

const PLUGIN_CONN: u32 = 1;
const RUNTIME_CONN: u32 = 2;
const REQUEST: u8 = 1;
const RESPONSE: u8 = 2;

/// ttRPC's Request, declared here (field numbers from ttRPC's request.proto).
#[derive(Clone, PartialEq, Message)]
struct Request {
    #[prost(string, tag = "1")]
    service: String,
    #[prost(string, tag = "2")]
    method: String,
    #[prost(bytes = "vec", tag = "3")]
    payload: Vec<u8>,
    #[prost(int64, tag = "4")]
    timeout_nano: i64,
}

/// google.rpc.Status.
#[derive(Clone, PartialEq, Message)]
struct Status {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
}

/// ttRPC's Response.
#[derive(Clone, PartialEq, Message)]
struct Response {
    #[prost(message, optional, tag = "1")]
    status: Option<Status>,
    #[prost(bytes = "vec", tag = "2")]
    payload: Vec<u8>,
}

/// The runtime's socket.
pub struct FakeRuntime {
    listener: UnixListener,
}

/// An error status a plugin answered: its gRPC code and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The code.
    pub code: i32,
    /// The message.
    pub message: String,
}

impl FakeRuntime {
    /// Listens at `path` (its directory is made).
    pub fn bind(path: &Path) -> io::Result<FakeRuntime> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let _ = std::fs::remove_file(path);
        Ok(FakeRuntime { listener: UnixListener::bind(path)? })
    }

    /// Waits (up to `within`) for a plugin to connect and register; answers the registration.
    pub fn accept(&self, within: Duration) -> io::Result<Plugin> {
        self.listener.set_nonblocking(true)?;
        let deadline = Instant::now() + within;
        let stream = loop {
            match self.listener.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(e),
            }
        };
        stream.set_nonblocking(false)?;
        stream.set_read_timeout(Some(within))?;
        let mut p = Plugin {
            stream,
            buffers: HashMap::new(),
            next: 1,
            name: String::new(),
            index: String::new(),
            updates: Vec::new(),
        };
        let (stream_id, req) = p.next_request()?;
        if req.method != "RegisterPlugin" || req.service != "nri.pkg.api.v1alpha1.Runtime" {
            return Err(io::Error::other(format!(
                "expected RegisterPlugin, got {}/{}",
                req.service, req.method
            )));
        }
        let r = api::RegisterPluginRequest::decode(req.payload.as_slice()).map_err(io::Error::other)?;
        (p.name, p.index) = (r.plugin_name, r.plugin_idx);
        p.respond(stream_id, &api::Empty {})?;
        Ok(p)
    }
}

/// One registered plugin.
pub struct Plugin {
    stream: UnixStream,
    buffers: HashMap<u32, Vec<u8>>,
    next: u32,
    /// The name it registered.
    pub name: String,
    /// The index it registered.
    pub index: String,
    /// `UpdateContainers` requests it sent, answered with success.
    pub updates: Vec<api::UpdateContainersRequest>,
}

impl Plugin {
    fn write(&mut self, conn: u32, stream: u32, kind: u8, payload: &[u8]) -> io::Result<()> {
        let mut msg = Vec::with_capacity(10 + payload.len());
        msg.extend((payload.len() as u32).to_be_bytes());
        msg.extend(stream.to_be_bytes());
        msg.extend([kind, 0]);
        msg.extend(payload);
        // As Go's buffered writer does: 4096 bytes, then the rest in one frame.
        let (first, rest) = msg.split_at(msg.len().min(4096));
        for part in [first, rest] {
            if part.is_empty() {
                continue;
            }
            let mut frame = Vec::with_capacity(8 + part.len());
            frame.extend(conn.to_be_bytes());
            frame.extend((part.len() as u32).to_be_bytes());
            frame.extend(part);
            self.stream.write_all(&frame)?;
        }
        Ok(())
    }

    /// The next whole ttRPC message on any connection: (conn, stream, type, payload).
    fn read_message(&mut self) -> io::Result<(u32, u32, u8, Vec<u8>)> {
        loop {
            for (&conn, buf) in &mut self.buffers {
                if buf.len() >= 10 {
                    let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
                    if buf.len() >= 10 + len {
                        let stream = u32::from_be_bytes([buf[4], buf[5], buf[6], buf[7]]);
                        let kind = buf[8];
                        let payload = buf[10..10 + len].to_vec();
                        buf.drain(..10 + len);
                        return Ok((conn, stream, kind, payload));
                    }
                }
            }
            let mut header = [0u8; 8];
            self.stream.read_exact(&mut header)?;
            let conn = u32::from_be_bytes([header[0], header[1], header[2], header[3]]);
            let len = u32::from_be_bytes([header[4], header[5], header[6], header[7]]) as usize;
            if len > 4096 {
                // Go's runtime reads each connection through a 4096-byte buffer.
                return Err(io::Error::other(format!("a frame of {len} bytes: containerd fails on it")));
            }
            let mut payload = vec![0u8; len];
            self.stream.read_exact(&mut payload)?;
            self.buffers.entry(conn).or_default().extend(payload);
        }
    }

    /// The next request the plugin sends the runtime (on connection 2).
    fn next_request(&mut self) -> io::Result<(u32, Request)> {
        loop {
            let (conn, stream, kind, payload) = self.read_message()?;
            if conn == RUNTIME_CONN && kind == REQUEST {
                return Ok((stream, Request::decode(payload.as_slice()).map_err(io::Error::other)?));
            }
        }
    }

    fn respond<M: Message>(&mut self, stream: u32, m: &M) -> io::Result<()> {
        let r =
            Response { status: Some(Status { code: 0, message: String::new() }), payload: m.encode_to_vec() };
        self.write(RUNTIME_CONN, stream, RESPONSE, &r.encode_to_vec())
    }

    /// Calls the plugin's `method` with a 2 s deadline, as containerd does; answers the
    /// plugin's own requests (UpdateContainers) that come meanwhile.
    pub fn call<Req: Message, Resp: Message + Default>(
        &mut self,
        method: &str,
        req: &Req,
    ) -> io::Result<Result<Resp, Refused>> {
        let stream = self.next;
        self.next += 2;
        let r = Request {
            service: "nri.pkg.api.v1alpha1.Plugin".into(),
            method: method.into(),
            payload: req.encode_to_vec(),
            timeout_nano: 2_000_000_000,
        };
        self.write(PLUGIN_CONN, stream, REQUEST, &r.encode_to_vec())?;
        loop {
            let (conn, id, kind, payload) = self.read_message()?;
            match (conn, kind) {
                (PLUGIN_CONN, RESPONSE) if id == stream => {
                    let resp = Response::decode(payload.as_slice()).map_err(io::Error::other)?;
                    return Ok(match resp.status {
                        Some(s) if s.code != 0 => Err(Refused { code: s.code, message: s.message }),
                        _ => Ok(Resp::decode(resp.payload.as_slice()).map_err(io::Error::other)?),
                    });
                }
                (RUNTIME_CONN, REQUEST) => {
                    let req = Request::decode(payload.as_slice()).map_err(io::Error::other)?;
                    if req.method == "UpdateContainers" {
                        let u = api::UpdateContainersRequest::decode(req.payload.as_slice())
                            .map_err(io::Error::other)?;
                        self.updates.push(u);
                    }
                    self.respond(id, &api::UpdateContainersResponse::default())?;
                }
                _ => {}
            }
        }
    }

    /// Configure, as containerd 1.7 sends it: the events the plugin subscribes to.
    pub fn configure(&mut self) -> io::Result<i32> {
        let req = api::ConfigureRequest {
            config: String::new(),
            runtime_name: "fake-runtime".into(),
            runtime_version: "1.7.24".into(),
            registration_timeout: 0,
            request_timeout: 0,
        };
        let r: Result<api::ConfigureResponse, Refused> = self.call("Configure", &req)?;
        r.map(|c| c.events).map_err(|e| io::Error::other(e.message))
    }

    /// Synchronize with these pods and containers.
    pub fn synchronize(
        &mut self,
        pods: Vec<api::PodSandbox>,
        containers: Vec<api::Container>,
    ) -> io::Result<api::SynchronizeResponse> {
        let req = api::SynchronizeRequest { pods, containers, more: false };
        let r: Result<api::SynchronizeResponse, Refused> = self.call("Synchronize", &req)?;
        r.map_err(|e| io::Error::other(e.message))
    }

    /// CreateContainer of `c` in `pod`.
    pub fn create(
        &mut self,
        pod: &api::PodSandbox,
        c: &api::Container,
    ) -> io::Result<Result<api::CreateContainerResponse, Refused>> {
        let req = api::CreateContainerRequest { pod: Some(pod.clone()), container: Some(c.clone()) };
        self.call("CreateContainer", &req)
    }

    /// An event as NRI v0.6 sends it (StateChange), for `pod` and `c` (none for pod events).
    pub fn event(
        &mut self,
        e: api::Event,
        pod: &api::PodSandbox,
        c: Option<&api::Container>,
    ) -> io::Result<Result<api::Empty, Refused>> {
        let ev = api::StateChangeEvent { event: e as i32, pod: Some(pod.clone()), container: c.cloned() };
        self.call("StateChange", &ev)
    }

    /// StopContainer of `c` in `pod`.
    pub fn stop(
        &mut self,
        pod: &api::PodSandbox,
        c: &api::Container,
    ) -> io::Result<Result<api::StopContainerResponse, Refused>> {
        let req = api::StopContainerRequest { pod: Some(pod.clone()), container: Some(c.clone()) };
        self.call("StopContainer", &req)
    }

    /// Whether the plugin closed the connection (a read finds the end).
    pub fn closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(self.stream.read(&mut b), Ok(0))
    }
}

/// A BestEffort pod as the kubelet makes it, with the systemd cgroup driver's names.
pub fn pod(id: &str, uid: &str, name: &str) -> api::PodSandbox {
    let slice = format!("kubepods-besteffort-pod{}.slice", uid.replace('-', "_"));
    api::PodSandbox {
        id: id.into(),
        name: name.into(),
        uid: uid.into(),
        namespace: "default".into(),
        linux: Some(api::LinuxPodSandbox {
            cgroup_parent: format!("/kubepods.slice/kubepods-besteffort.slice/{slice}"),
            cgroups_path: format!("{slice}:cri-containerd:{id}"),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A container of `pod` with `env`, as containerd's CRI describes it at creation.
pub fn container(pod: &api::PodSandbox, id: &str, name: &str, env: &[(&str, &str)]) -> api::Container {
    let slice = pod
        .linux
        .as_ref()
        .map(|l| l.cgroups_path.split(':').next().unwrap_or("").to_owned())
        .unwrap_or_default();
    api::Container {
        id: id.into(),
        pod_sandbox_id: pod.id.clone(),
        name: name.into(),
        env: env.iter().map(|(k, v)| format!("{k}={v}")).chain(["PATH=/bin".to_owned()]).collect(),
        linux: Some(api::LinuxContainer {
            resources: None,
            cgroups_path: format!("{slice}:cri-containerd:{id}"),
        }),
        ..Default::default()
    }
}

/// The cgroup (relative to the cgroup root) of a container or sandbox with id `id` in `pod`.
pub fn cgroup(pod: &api::PodSandbox, id: &str) -> String {
    let uid = pod.uid.replace('-', "_");
    format!("kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid}.slice/cri-containerd-{id}.scope")
}

/// A node for the NRI path in sandbox `sb`: the kubelet's registration socket, PodResources
/// (listing no pod) and the CRI the poll would ask, and the runtime's NRI socket, all ready
/// before the daemon starts.
pub struct Node {
    /// The sandbox directory.
    pub sb: std::path::PathBuf,
    /// The runtime's NRI socket.
    pub runtime: FakeRuntime,
    _kubelet: kubelet::Kubelet,
    registered: tokio::sync::mpsc::UnboundedReceiver<dp::RegisterRequest>,
    seen: std::collections::BTreeSet<String>,
    /// What the kubelet's PodResources lists: each allocation's container and devices.
    pub pods: MemoryPods,
}

impl Node {
    /// Serves them in `sb`.
    pub fn serve(sb: &Path) -> Node {
        let plugins = sb.join("kubelet/device-plugins");
        std::fs::create_dir_all(&plugins).unwrap_or_else(|e| panic!("{e}"));
        std::fs::create_dir_all(sb.join("kubelet/pod-resources")).unwrap_or_else(|e| panic!("{e}"));
        let (tx, registered) = tokio::sync::mpsc::unbounded_channel();
        let registration = kubelet::Registration::new(move |r| {
            let _ = tx.send(r);
        });
        let k = kubelet::Kubelet::serve(&plugins, registration).unwrap_or_else(|e| panic!("{e}"));
        let pods = MemoryPods::default();
        kubelet::serve_pod_resources(&sb.join("kubelet/pod-resources/kubelet.sock"), pods.clone())
            .unwrap_or_else(|e| panic!("{e}"));
        kubelet::serve_runtime(&sb.join("run/containerd.sock"), pods.clone())
            .unwrap_or_else(|e| panic!("{e}"));
        let runtime = FakeRuntime::bind(&sb.join("run/nri/nri.sock")).unwrap_or_else(|e| panic!("{e}"));
        Node { sb: sb.to_owned(), runtime, _kubelet: k, registered, seen: Default::default(), pods }
    }

    /// Allocate as the kubelet calls it for container `who` (`NAMESPACE/POD/CONTAINER`), once
    /// `pool` is registered; from then on PodResources lists the container holding the
    /// devices, as the kubelet's does. Returns the container's environment, sorted.
    pub async fn allocate(&mut self, pool: &str, devices: &[&str], who: &str) -> Vec<(String, String)> {
        let want = format!("cpupool.io/{pool}");
        while !self.seen.contains(&want) {
            let r = tokio::time::timeout(crate::wait::PATIENCE, self.registered.recv())
                .await
                .unwrap_or_else(|_| panic!("{want} was not registered"))
                .unwrap_or_else(|| panic!("the registration server ended"));
            self.seen.insert(r.resource_name);
        }
        let sock = self.sb.join(format!("kubelet/device-plugins/cpupoold-{pool}.sock"));
        let channel = unix_channel(sock).await.unwrap_or_else(|e| panic!("{e}"));
        let mut c = dp::device_plugin_client::DevicePluginClient::new(channel);
        let req = dp::AllocateRequest {
            container_requests: vec![dp::ContainerAllocateRequest {
                devices_ids: devices.iter().map(|d| (*d).to_owned()).collect(),
            }],
        };
        let r = c.allocate(req).await.unwrap_or_else(|e| panic!("{e}")).into_inner();
        self.holds(who, pool, devices);
        let mut env: Vec<(String, String)> = r.container_responses[0].envs.clone().into_iter().collect();
        env.sort();
        env
    }

    /// PodResources lists container `who` (`NAMESPACE/POD/CONTAINER`) holding `devices` of
    /// `pool`, one entry per device as the kubelet lists them.
    pub fn holds(&self, who: &str, pool: &str, devices: &[&str]) {
        use cpupoold::kubernetes::grpc::proto::podresources as pr;
        let mut parts = who.splitn(3, '/');
        let (ns, pod, name) =
            (parts.next().unwrap_or(""), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        let entries = devices.iter().map(|d| pr::ContainerDevices {
            resource_name: format!("cpupool.io/{pool}"),
            device_ids: vec![(*d).to_owned()],
            ..Default::default()
        });
        let mut pods = self.pods.pods.lock().unwrap_or_else(|e| e.into_inner());
        if !pods.iter().any(|p| p.namespace == ns && p.name == pod) {
            pods.push(pr::PodResources { name: pod.into(), namespace: ns.into(), containers: Vec::new() });
        }
        for p in pods.iter_mut().filter(|p| p.namespace == ns && p.name == pod) {
            p.containers.push(pr::ContainerResources {
                name: name.into(),
                devices: entries.clone().collect(),
                ..Default::default()
            });
        }
    }

    /// What runc does between CreateContainer and StartContainer: the container's cgroup in
    /// the sandbox, with the CPUs of the (adjusted) spec.
    pub fn runc_creates(&self, cgroup: &str, cpus: &str) {
        let dir = self.sb.join("cgroup").join(cgroup);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(dir.join("cpuset.cpus"), format!("{cpus}\n")).unwrap_or_else(|e| panic!("{e}"));
    }
}
