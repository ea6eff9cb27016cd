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
//! kubelet_peer dra-prepare KUBELET_DIR NAMESPACE/NAME/UID
//!     What the kubelet does for a pod's ResourceClaim: its plugin watcher registers the driver
//!     whose socket is in KUBELET_DIR/plugins_registry/ (GetInfo, NotifyRegistrationStatus),
//!     then NodePrepareResources. Prints {"cdi_devices": [...]}, which `cri-create` takes as
//!     ENVS. A claim the driver refuses fails with its error.
//! kubelet_peer dra-unprepare KUBELET_DIR NAMESPACE/NAME/UID
//!     NodeUnprepareResources of the claim.
//! ```
//!
//! The client side of the CRI, against a real runtime (containerd with the systemd cgroup
//! driver, as on a kubelet node; `tests/vm/checks-containers/`), asked what the kubelet asks:
//!
//! ```text
//! POD is NAMESPACE/NAME/UID/QOS, QOS one of besteffort, burstable, guaranteed.
//! kubelet_peer cri-run-pod RUNTIME_SOCKET POD
//!     As the kubelet's systemd cgroup driver, starts kubepods.slice, the QoS class's slice and
//!     the pod's slice as transient systemd slices (kubepods-besteffort-pod<UID>.slice, or
//!     kubepods-pod<UID>.slice for guaranteed; dashes in the UID become underscores), makes
//!     /var/log/pods/NAMESPACE_NAME_UID, then RunPodSandbox on the host's network with the
//!     pod's slice as the cgroup parent. Prints the sandbox id.
//! kubelet_peer cri-create RUNTIME_SOCKET SANDBOX_ID POD CONTAINER IMAGE ENVS -- COMMAND...
//!     CreateContainer with the kubelet's labels, the QoS class's linux resources, the log at
//!     /var/log/pods/NAMESPACE_NAME_UID/CONTAINER/0.log and ENVS: a JSON object of variables, or
//!     the output of `allocate` (its "envs" are taken); its "cdi_devices", a list of fully
//!     qualified CDI device names, go in the CRI's CDI_devices. Prints the container id.
//! kubelet_peer cri-start RUNTIME_SOCKET CONTAINER_ID
//! kubelet_peer cri-stop RUNTIME_SOCKET CONTAINER_ID [TIMEOUT_SECONDS]   (default 10)
//! kubelet_peer cri-remove RUNTIME_SOCKET CONTAINER_ID
//! kubelet_peer cri-status RUNTIME_SOCKET CONTAINER_ID
//!     Prints {"id", "state", "exit_code", "log_path", "pid", "cgroups_path"}: ContainerStatus,
//!     with the pid and the OCI cgroupsPath from the runtime's verbose info.
//! kubelet_peer cri-remove-pod RUNTIME_SOCKET SANDBOX_ID POD
//!     StopPodSandbox, RemovePodSandbox, then stops the pod's slice (the kubelet's pod cgroup
//!     clean-up).
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use cpupoold::kubernetes::deviceplugin::proto::v1beta1 as dp;
use cpupoold::kubernetes::grpc::clients::unix_channel;
use cpupoold::kubernetes::grpc::proto::{cri, podresources as pr};
use serde_json::{json, Value};
use test_support::dra;
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

/// What the kubelet does for a pod's ResourceClaim `NAMESPACE/NAME/UID` at its start
/// (`prepare`) or end: its plugin watcher registers the driver whose socket is in
/// `plugins_registry/`, then it calls NodePrepareResources or NodeUnprepareResources. Prints
/// `{"cdi_devices": [...]}` (what the kubelet hands the runtime), or `{}`; a claim's error fails.
async fn dra_call(kubelet_dir: &Path, claim: &str, prepare: bool) -> Result<Value, Failure> {
    let [namespace, name, uid] = claim.splitn(3, '/').collect::<Vec<_>>()[..] else {
        return Err(format!("`{claim}` is not NAMESPACE/NAME/UID").into());
    };
    let registry = kubelet_dir.join("plugins_registry");
    let socket = std::fs::read_dir(&registry)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().ends_with("-reg.sock"))
        .ok_or_else(|| format!("no registration socket in {}", registry.display()))?;
    let driver = dra::register(&socket).await?;
    let claims = vec![dra::claim(namespace, name, uid)];
    if !prepare {
        let r = driver.unprepare(claims).await?;
        return match r.claims.get(uid) {
            Some(c) if !c.error.is_empty() => Err(c.error.clone().into()),
            _ => Ok(json!({})),
        };
    }
    let r = driver.prepare(claims).await?;
    let c = r.claims.get(uid).ok_or_else(|| format!("NodePrepareResources did not answer claim {uid}"))?;
    if !c.error.is_empty() {
        return Err(c.error.clone().into());
    }
    let mut ids: Vec<&str> =
        c.devices.iter().flat_map(|d| d.cdi_device_ids.iter().map(String::as_str)).collect();
    ids.dedup();
    Ok(json!({ "cdi_devices": ids }))
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
        ["dra-prepare", dir, claim] => {
            println!("{}", dra_call(Path::new(dir), claim, true).await?);
            Ok(())
        }
        ["dra-unprepare", dir, claim] => {
            println!("{}", dra_call(Path::new(dir), claim, false).await?);
            Ok(())
        }
        ["cri-run-pod", sock, pod] => {
            println!("{}", runtime::run_pod(&runtime::Pod::parse(pod)?, sock).await?);
            Ok(())
        }
        ["cri-create", sock, sandbox, pod, name, image, envs, "--", ref command @ ..]
            if !command.is_empty() =>
        {
            let pod = runtime::Pod::parse(pod)?;
            println!("{}", runtime::create(sock, sandbox, &pod, name, image, envs, command).await?);
            Ok(())
        }
        ["cri-start", sock, id] => runtime::start(sock, id).await,
        ["cri-stop", sock, id] => runtime::stop(sock, id, 10).await,
        ["cri-stop", sock, id, timeout] => runtime::stop(sock, id, timeout.parse()?).await,
        ["cri-remove", sock, id] => runtime::remove(sock, id).await,
        ["cri-status", sock, id] => {
            println!("{}", runtime::status(sock, id).await?);
            Ok(())
        }
        ["cri-remove-pod", sock, sandbox, pod] => {
            runtime::remove_pod(sock, sandbox, &runtime::Pod::parse(pod)?).await
        }
        _ => Err("usage: kubelet_peer serve KUBELET_DIR RUNTIME_SOCKET PODS_JSON | \
                  kubelet_peer allocate KUBELET_DIR POOL COUNT PODS_JSON NAMESPACE/POD/UID/CONTAINER/ID | \
                  kubelet_peer dra-prepare|dra-unprepare KUBELET_DIR NAMESPACE/NAME/UID | \
                  kubelet_peer cri-run-pod RUNTIME_SOCKET POD | \
                  kubelet_peer cri-create RUNTIME_SOCKET SANDBOX_ID POD CONTAINER IMAGE ENVS -- COMMAND... | \
                  kubelet_peer cri-start|cri-remove|cri-status RUNTIME_SOCKET CONTAINER_ID | \
                  kubelet_peer cri-stop RUNTIME_SOCKET CONTAINER_ID [TIMEOUT_SECONDS] | \
                  kubelet_peer cri-remove-pod RUNTIME_SOCKET SANDBOX_ID POD \
                  (POD is NAMESPACE/NAME/UID/besteffort|burstable|guaranteed)"
            .into()),
    }
}

/// The kubelet's side of a real container runtime: its CRI calls, and the systemd slices its
/// systemd cgroup driver keeps for QoS classes and pods.
mod runtime {
    use std::collections::HashMap;
    use std::time::{Duration, Instant};

    use cpupoold::kubernetes::grpc::clients::unix_channel;
    use cpupoold::kubernetes::grpc::proto::cri;
    use serde_json::{json, Value};
    use zvariant::Value as V;

    use super::Failure;

    type Client = cri::runtime_service_client::RuntimeServiceClient<tonic::transport::Channel>;

    async fn client(sock: &str) -> Result<Client, Failure> {
        Ok(Client::new(unix_channel(sock.into()).await?))
    }

    /// What the kubelet knows of a pod here: NAMESPACE/NAME/UID/QOS.
    pub struct Pod {
        namespace: String,
        name: String,
        uid: String,
        qos: Qos,
    }

    #[derive(Clone, Copy, PartialEq)]
    enum Qos {
        BestEffort,
        Burstable,
        Guaranteed,
    }

    impl Pod {
        pub fn parse(spec: &str) -> Result<Pod, Failure> {
            let [namespace, name, uid, qos] = spec.split('/').collect::<Vec<_>>()[..] else {
                return Err(format!("`{spec}` is not NAMESPACE/NAME/UID/QOS").into());
            };
            let qos = match qos {
                "besteffort" => Qos::BestEffort,
                "burstable" => Qos::Burstable,
                "guaranteed" => Qos::Guaranteed,
                _ => {
                    return Err(format!("QoS class `{qos}` is not besteffort, burstable or guaranteed").into())
                }
            };
            Ok(Pod { namespace: namespace.into(), name: name.into(), uid: uid.into(), qos })
        }

        /// The systemd slices from kubepods.slice down to the pod's, each with its parent: the
        /// kubelet's cgroup names (kubepods, QoS class, pod<UID>) in the systemd driver's form,
        /// where a dash inside a name would read as a level, so it becomes an underscore.
        fn slices(&self) -> Vec<(String, String)> {
            let pod = format!("pod{}", self.uid.replace('-', "_"));
            let mut levels = vec!["kubepods".to_owned()];
            match self.qos {
                Qos::BestEffort => levels.push("besteffort".into()),
                Qos::Burstable => levels.push("burstable".into()),
                Qos::Guaranteed => {}
            }
            levels.push(pod);
            let mut out = Vec::new();
            let mut parent = "-.slice".to_owned();
            for i in 1..=levels.len() {
                let unit = format!("{}.slice", levels[..i].join("-"));
                out.push((unit.clone(), parent));
                parent = unit;
            }
            out
        }

        /// The pod's cgroup as the kubelet sends it: the slice path from the root,
        /// /kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<UID>.slice.
        fn cgroup_parent(&self) -> String {
            self.slices().iter().map(|(unit, _)| format!("/{unit}")).collect()
        }

        fn log_directory(&self) -> String {
            format!("/var/log/pods/{}_{}_{}", self.namespace, self.name, self.uid)
        }

        fn labels(&self) -> HashMap<String, String> {
            HashMap::from([
                ("io.kubernetes.pod.name".to_owned(), self.name.clone()),
                ("io.kubernetes.pod.namespace".to_owned(), self.namespace.clone()),
                ("io.kubernetes.pod.uid".to_owned(), self.uid.clone()),
            ])
        }

        /// Host network, as a hostNetwork pod; the kubelet's default PID (per container) and
        /// IPC (per pod) namespaces.
        fn namespaces() -> cri::NamespaceOption {
            cri::NamespaceOption {
                network: cri::NamespaceMode::Node as i32,
                pid: cri::NamespaceMode::Container as i32,
                ipc: cri::NamespaceMode::Pod as i32,
                target_id: String::new(),
            }
        }

        /// The kubelet sends Unconfined seccomp unless the pod or SeccompDefault asks otherwise,
        /// and no AppArmor profile unless the pod names one.
        fn seccomp() -> Option<cri::SecurityProfile> {
            Some(cri::SecurityProfile {
                profile_type: cri::security_profile::ProfileType::Unconfined as i32,
                localhost_ref: String::new(),
            })
        }

        fn sandbox_config(&self) -> cri::PodSandboxConfig {
            cri::PodSandboxConfig {
                metadata: Some(cri::PodSandboxMetadata {
                    name: self.name.clone(),
                    uid: self.uid.clone(),
                    namespace: self.namespace.clone(),
                    attempt: 0,
                }),
                // A hostNetwork pod shares the node's UTS namespace: the kubelet sends no hostname
                // (runc cannot set one without a UTS namespace of the container's own).
                hostname: String::new(),
                log_directory: self.log_directory(),
                labels: self.labels(),
                annotations: HashMap::from([("kubernetes.io/config.source".to_owned(), "api".to_owned())]),
                linux: Some(cri::LinuxPodSandboxConfig {
                    cgroup_parent: self.cgroup_parent(),
                    security_context: Some(cri::LinuxSandboxSecurityContext {
                        namespace_options: Some(Self::namespaces()),
                        seccomp: Self::seccomp(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
            }
        }

        /// One container's resources as the kubelet computes them: BestEffort gets the minimum
        /// CPU weight and the highest OOM score; Burstable here requests 100m CPU; Guaranteed
        /// here is 1 CPU and 128 MiB, requests equal to limits.
        fn resources(&self) -> cri::LinuxContainerResources {
            let (shares, quota, memory, oom) = match self.qos {
                Qos::BestEffort => (2, 0, 0, 1000),
                Qos::Burstable => (102, 0, 0, 999),
                Qos::Guaranteed => (1024, 100_000, 128 << 20, -997),
            };
            cri::LinuxContainerResources {
                cpu_period: 100_000,
                cpu_quota: quota,
                cpu_shares: shares,
                memory_limit_in_bytes: memory,
                oom_score_adj: oom,
                ..Default::default()
            }
        }
    }

    /// The systemd bus, for what the kubelet's cgroup driver asks of systemd.
    async fn systemd(
        bus: &zbus::Connection,
        method: &str,
        body: &(impl serde::Serialize + zvariant::DynamicType),
    ) -> zbus::Result<zbus::Message> {
        bus.call_method(
            Some("org.freedesktop.systemd1"),
            "/org/freedesktop/systemd1",
            Some("org.freedesktop.systemd1.Manager"),
            method,
            body,
        )
        .await
    }

    fn error_named(e: &zbus::Error, name: &str) -> bool {
        matches!(e, zbus::Error::MethodError(n, _, _) if n.as_str() == name)
    }

    async fn active_state(bus: &zbus::Connection, unit: &str) -> Result<String, Failure> {
        let path: zvariant::OwnedObjectPath =
            systemd(bus, "GetUnit", &(unit,)).await?.body().deserialize()?;
        let reply = bus
            .call_method(
                Some("org.freedesktop.systemd1"),
                &path,
                Some("org.freedesktop.DBus.Properties"),
                "Get",
                &("org.freedesktop.systemd1.Unit", "ActiveState"),
            )
            .await?;
        let v: zvariant::OwnedValue = reply.body().deserialize()?;
        Ok(String::try_from(v)?)
    }

    /// Starts `unit` as a transient slice under `parent`, as runc's systemd manager does for the
    /// kubelet (Wants= the parent, no default dependencies, accounting on), and waits until it
    /// is active. A slice that exists already is left as it is.
    async fn ensure_slice(bus: &zbus::Connection, unit: &str, parent: &str) -> Result<(), Failure> {
        let props: Vec<(&str, V<'_>)> = vec![
            ("Description", V::from(format!("libcontainer container {unit}"))),
            ("Wants", V::from(vec![parent])),
            ("DefaultDependencies", V::from(false)),
            ("CPUAccounting", V::from(true)),
            ("MemoryAccounting", V::from(true)),
            ("IOAccounting", V::from(true)),
            ("TasksAccounting", V::from(true)),
        ];
        let aux: Vec<(&str, Vec<(&str, V<'_>)>)> = Vec::new();
        match systemd(bus, "StartTransientUnit", &(unit, "replace", props, aux)).await {
            Ok(_) => {}
            Err(e) if error_named(&e, "org.freedesktop.systemd1.UnitExists") => return Ok(()),
            Err(e) => return Err(format!("starting {unit}: {e}").into()),
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let state = active_state(bus, unit).await?;
            if state == "active" {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("{unit} is {state}, not active, after 30 s").into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn run_pod(pod: &Pod, sock: &str) -> Result<String, Failure> {
        let bus = zbus::Connection::system().await?;
        for (unit, parent) in pod.slices() {
            ensure_slice(&bus, &unit, &parent).await?;
        }
        std::fs::create_dir_all(pod.log_directory())?;
        let r = client(sock)
            .await?
            .run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(pod.sandbox_config()),
                runtime_handler: String::new(),
            })
            .await?;
        Ok(r.into_inner().pod_sandbox_id)
    }

    /// The CDI devices in ENVS (`{"cdi_devices": ["vendor/class=name", ...], ...}`, as
    /// `dra-prepare` prints them), for the CRI's `CDI_devices`.
    fn cdi_devices(text: &str) -> Result<Vec<cri::CdiDevice>, Failure> {
        let v: Value = serde_json::from_str(text)?;
        let Some(list) = v.get("cdi_devices") else { return Ok(Vec::new()) };
        let names = list.as_array().ok_or("cdi_devices is not a JSON array")?;
        names
            .iter()
            .map(|n| {
                n.as_str()
                    .map(|name| cri::CdiDevice { name: name.to_owned() })
                    .ok_or_else(|| Failure::from("a cdi_devices entry is not a string"))
            })
            .collect()
    }

    /// ENVS: `{"NAME": "value", ...}`, or `allocate`'s `{"devices": [...], "envs": {...}}`.
    fn envs(text: &str) -> Result<Vec<cri::KeyValue>, Failure> {
        let v: Value = serde_json::from_str(text)?;
        let map = v.get("envs").unwrap_or(&v).as_object().ok_or("ENVS is not a JSON object")?;
        let mut out: Vec<cri::KeyValue> = map
            .iter()
            .filter(|(k, _)| *k != "cdi_devices")
            .map(|(k, v)| cri::KeyValue {
                key: k.clone(),
                value: v.as_str().map_or_else(|| v.to_string(), str::to_owned),
            })
            .collect();
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    pub async fn create(
        sock: &str,
        sandbox: &str,
        pod: &Pod,
        name: &str,
        image: &str,
        envs_json: &str,
        command: &[&str],
    ) -> Result<String, Failure> {
        // The kubelet makes the container's log directory; the runtime writes the file.
        std::fs::create_dir_all(format!("{}/{name}", pod.log_directory()))?;
        let mut labels = pod.labels();
        labels.insert("io.kubernetes.container.name".into(), name.into());
        let config = cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata { name: name.into(), attempt: 0 }),
            image: Some(cri::ImageSpec {
                image: image.into(),
                user_specified_image: image.into(),
                ..Default::default()
            }),
            command: command.iter().map(|s| (*s).to_owned()).collect(),
            envs: envs(envs_json)?,
            cdi_devices: cdi_devices(envs_json)?,
            labels,
            annotations: HashMap::from([
                ("io.kubernetes.container.restartCount".to_owned(), "0".to_owned()),
                (
                    "io.kubernetes.container.terminationMessagePath".to_owned(),
                    "/dev/termination-log".to_owned(),
                ),
                ("io.kubernetes.pod.terminationGracePeriod".to_owned(), "30".to_owned()),
            ]),
            log_path: format!("{name}/0.log"),
            linux: Some(cri::LinuxContainerConfig {
                resources: Some(pod.resources()),
                security_context: Some(cri::LinuxContainerSecurityContext {
                    namespace_options: Some(Pod::namespaces()),
                    seccomp: Pod::seccomp(),
                    ..Default::default()
                }),
            }),
            ..Default::default()
        };
        let r = client(sock)
            .await?
            .create_container(cri::CreateContainerRequest {
                pod_sandbox_id: sandbox.into(),
                config: Some(config),
                sandbox_config: Some(pod.sandbox_config()),
            })
            .await?;
        Ok(r.into_inner().container_id)
    }

    pub async fn start(sock: &str, id: &str) -> Result<(), Failure> {
        client(sock).await?.start_container(cri::StartContainerRequest { container_id: id.into() }).await?;
        Ok(())
    }

    pub async fn stop(sock: &str, id: &str, timeout: i64) -> Result<(), Failure> {
        client(sock)
            .await?
            .stop_container(cri::StopContainerRequest { container_id: id.into(), timeout })
            .await?;
        Ok(())
    }

    pub async fn remove(sock: &str, id: &str) -> Result<(), Failure> {
        client(sock).await?.remove_container(cri::RemoveContainerRequest { container_id: id.into() }).await?;
        Ok(())
    }

    pub async fn status(sock: &str, id: &str) -> Result<Value, Failure> {
        let r = client(sock)
            .await?
            .container_status(cri::ContainerStatusRequest { container_id: id.into(), verbose: true })
            .await?
            .into_inner();
        let s = r.status.ok_or("ContainerStatus without a status")?;
        // containerd's verbose info: {"pid": N, "runtimeSpec": {"linux": {"cgroupsPath": ...}}, ...}.
        let info: Value =
            r.info.get("info").and_then(|t| serde_json::from_str(t).ok()).unwrap_or(Value::Null);
        let state = cri::ContainerState::try_from(s.state).map_or("UNKNOWN", |st| st.as_str_name());
        Ok(json!({
            "id": s.id,
            "state": state,
            "exit_code": s.exit_code,
            "log_path": s.log_path,
            "pid": info["pid"],
            "cgroups_path": info["runtimeSpec"]["linux"]["cgroupsPath"],
        }))
    }

    pub async fn remove_pod(sock: &str, sandbox: &str, pod: &Pod) -> Result<(), Failure> {
        let mut c = client(sock).await?;
        c.stop_pod_sandbox(cri::StopPodSandboxRequest { pod_sandbox_id: sandbox.into() }).await?;
        c.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: sandbox.into() }).await?;
        // The kubelet removes the pod's cgroup once its containers are gone: the QoS slices stay.
        let (unit, _) = pod.slices().pop().ok_or("no pod slice")?;
        let bus = zbus::Connection::system().await?;
        match systemd(&bus, "StopUnit", &(unit.as_str(), "replace")).await {
            Ok(_) => Ok(()),
            Err(e) if error_named(&e, "org.freedesktop.systemd1.NoSuchUnit") => Ok(()),
            Err(e) => Err(format!("stopping {unit}: {e}").into()),
        }
    }
}
