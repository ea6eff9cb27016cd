//! The CRI messages the kubelet stand-in (examples/kubelet_peer.rs) sends to a real containerd,
//! checked against bytes worked out by hand from the published k8s.io/cri-api runtime/v1
//! api.proto: a key is `(field << 3) | wire type` (0 varint, 2 length-delimited). A wrong field
//! number here would reach containerd as a different field, or as none.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;

use cpupoold::kubernetes::grpc::proto::cri;
use prost::Message;

#[test]
fn pod_sandbox_bytes() {
    let linux = cri::LinuxPodSandboxConfig {
        cgroup_parent: "p".into(),
        security_context: Some(cri::LinuxSandboxSecurityContext {
            namespace_options: Some(cri::NamespaceOption {
                network: cri::NamespaceMode::Node as i32,
                pid: cri::NamespaceMode::Container as i32,
                ..Default::default()
            }),
            seccomp: Some(cri::SecurityProfile {
                profile_type: cri::security_profile::ProfileType::Unconfined as i32,
                localhost_ref: String::new(),
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    // cgroup_parent = 1; security_context = 2 holding namespace_options = 1 (network = 1 NODE 2,
    // pid = 2 CONTAINER 1) and seccomp = 9 (profile_type = 1, Unconfined 1).
    let want = vec![0x0a, 1, b'p', 0x12, 10, 0x0a, 4, 0x08, 2, 0x10, 1, 0x4a, 2, 0x08, 1];
    assert_eq!(linux.encode_to_vec(), want);

    let config = cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: "n".into(),
            uid: "u".into(),
            namespace: "s".into(),
            attempt: 1,
        }),
        log_directory: "l".into(),
        labels: HashMap::from([("k".to_owned(), "v".to_owned())]),
        linux: Some(cri::LinuxPodSandboxConfig { cgroup_parent: "c".into(), ..Default::default() }),
        ..Default::default()
    };
    // metadata = 1 (name 1, uid 2, namespace 3, attempt 4), log_directory = 3, labels = 6,
    // linux = 8.
    let want = vec![
        0x0a, 11, 0x0a, 1, b'n', 0x12, 1, b'u', 0x1a, 1, b's', 0x20, 1, //
        0x1a, 1, b'l', //
        0x32, 6, 0x0a, 1, b'k', 0x12, 1, b'v', //
        0x42, 3, 0x0a, 1, b'c',
    ];
    assert_eq!(config.encode_to_vec(), want);
    let run = cri::RunPodSandboxRequest {
        config: Some(cri::PodSandboxConfig::default()),
        runtime_handler: "h".into(),
    };
    assert_eq!(run.encode_to_vec(), vec![0x0a, 0, 0x12, 1, b'h']);
}

#[test]
fn container_config_bytes() {
    let c = cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata { name: "a".into(), attempt: 0 }),
        image: Some(cri::ImageSpec {
            image: "i".into(),
            user_specified_image: "i".into(),
            ..Default::default()
        }),
        command: vec!["sh".into()],
        envs: vec![cri::KeyValue { key: "K".into(), value: "V".into() }],
        log_path: "a/0.log".into(),
        linux: Some(cri::LinuxContainerConfig {
            resources: Some(cri::LinuxContainerResources {
                cpu_period: 1,
                cpu_quota: 2,
                cpu_shares: 3,
                memory_limit_in_bytes: 4,
                oom_score_adj: 5,
                cpuset_cpus: "6".into(),
                ..Default::default()
            }),
            security_context: Some(cri::LinuxContainerSecurityContext {
                seccomp: Some(cri::SecurityProfile::default()),
                ..Default::default()
            }),
        }),
        ..Default::default()
    };
    let mut want = vec![0x0a, 3, 0x0a, 1, b'a']; // metadata = 1
                                                 // image = 2: image = 1, user_specified_image = 18 (key 0x92 0x01).
    want.extend_from_slice(&[0x12, 7, 0x0a, 1, b'i', 0x92, 0x01, 1, b'i']);
    want.extend_from_slice(&[0x1a, 2, b's', b'h']); // command = 3
    want.extend_from_slice(&[0x32, 6, 0x0a, 1, b'K', 0x12, 1, b'V']); // envs = 6
    want.extend_from_slice(&[0x5a, 7]); // log_path = 11
    want.extend_from_slice(b"a/0.log");
    // linux = 15: resources = 1 (fields 1..6), security_context = 2 holding seccomp = 15.
    want.extend_from_slice(&[0x7a, 19, 0x0a, 13, 0x08, 1, 0x10, 2, 0x18, 3, 0x20, 4, 0x28, 5, 0x32, 1, b'6']);
    want.extend_from_slice(&[0x12, 2, 0x7a, 0]);
    assert_eq!(c.encode_to_vec(), want);

    let create = cri::CreateContainerRequest {
        pod_sandbox_id: "p".into(),
        config: Some(cri::ContainerConfig::default()),
        sandbox_config: Some(cri::PodSandboxConfig::default()),
    };
    assert_eq!(create.encode_to_vec(), vec![0x0a, 1, b'p', 0x12, 0, 0x1a, 0]);
    let stop = cri::StopContainerRequest { container_id: "c".into(), timeout: 10 };
    assert_eq!(stop.encode_to_vec(), vec![0x0a, 1, b'c', 0x10, 10]);
}

#[test]
fn container_status_bytes() {
    // What containerd answers: state = 3, exit_code = 7, log_path = 15; info = 2 in the response.
    let status = cri::ContainerStatus {
        id: "c".into(),
        state: cri::ContainerState::ContainerExited as i32,
        exit_code: 1,
        log_path: "l".into(),
        ..Default::default()
    };
    let want = vec![0x0a, 1, b'c', 0x18, 2, 0x38, 1, 0x7a, 1, b'l'];
    assert_eq!(status.encode_to_vec(), want);
    let r = cri::ContainerStatusResponse {
        status: None,
        info: HashMap::from([("info".to_owned(), "{}".to_owned())]),
    };
    assert_eq!(r.encode_to_vec(), [&[0x12, 10, 0x0a, 4][..], b"info", &[0x12, 2], b"{}"].concat());
    let req = cri::ContainerStatusRequest { container_id: "c".into(), verbose: true };
    assert_eq!(req.encode_to_vec(), vec![0x0a, 1, b'c', 0x10, 1]);
}
