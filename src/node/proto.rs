//! The generated gRPC code (see `build.rs`): messages, clients and servers.
#![allow(missing_docs, clippy::all, clippy::pedantic, clippy::unwrap_used)]

/// `v1beta1`: the device plugin API.
pub mod v1beta1 {
    tonic::include_proto!("v1beta1");
}

/// `v1`: the PodResources API.
pub mod podresources {
    tonic::include_proto!("v1");
}

/// `k8s.io.kubelet.pkg.apis.dra.v1`: the kubelet's DRA plugin API (`v1.DRAPlugin`).
pub mod dra {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}

/// `pluginregistration`: the kubelet plugin watcher's registration (`Registration`).
pub mod pluginregistration {
    tonic::include_proto!("pluginregistration");
}

/// `runtime.v1`: the container runtime's CRI (only ListContainers).
pub mod cri {
    tonic::include_proto!("runtime.v1");
}

#[cfg(test)]
mod tests {
    //! Field numbers checked against bytes worked out by hand from the published .proto files:
    //! a key is `(field << 3) | wire type` (0 varint, 2 length-delimited).
    use std::collections::HashMap;

    use prost::Message;

    use super::{cri, dra, pluginregistration, podresources, v1beta1};

    #[test]
    fn register_request_bytes() {
        let m = v1beta1::RegisterRequest {
            version: "v1beta1".into(),
            endpoint: "cpupoold-dp.sock".into(),
            resource_name: "cpupool.io/dp".into(),
            options: Some(v1beta1::DevicePluginOptions {
                pre_start_required: false,
                get_preferred_allocation_available: true,
            }),
        };
        let mut want = vec![0x0a, 7];
        want.extend_from_slice(b"v1beta1");
        want.extend_from_slice(&[0x12, 16]);
        want.extend_from_slice(b"cpupoold-dp.sock");
        want.extend_from_slice(&[0x1a, 13]);
        want.extend_from_slice(b"cpupool.io/dp");
        // options = 4, holding get_preferred_allocation_available = 2 (true); false is omitted.
        want.extend_from_slice(&[0x22, 2, 0x10, 1]);
        assert_eq!(m.encode_to_vec(), want);
    }

    #[test]
    fn device_and_allocation_bytes() {
        let d = v1beta1::Device {
            id: "core-3".into(),
            health: "Healthy".into(),
            topology: Some(v1beta1::TopologyInfo { nodes: vec![v1beta1::NumaNode { id: 1 }] }),
        };
        let mut want = vec![0x0a, 6];
        want.extend_from_slice(b"core-3");
        want.extend_from_slice(&[0x12, 7]);
        want.extend_from_slice(b"Healthy");
        want.extend_from_slice(&[0x1a, 4, 0x0a, 2, 0x08, 1]);
        assert_eq!(d.encode_to_vec(), want);

        let p = v1beta1::ContainerPreferredAllocationRequest {
            available_device_i_ds: vec!["a".into()],
            must_include_device_i_ds: vec!["b".into()],
            allocation_size: 2,
        };
        assert_eq!(p.encode_to_vec(), vec![0x0a, 1, b'a', 0x12, 1, b'b', 0x18, 2]);

        let r = v1beta1::ContainerAllocateResponse {
            envs: HashMap::from([("A".to_owned(), "1".to_owned())]),
            cdi_devices: vec![v1beta1::CdiDevice { name: "x".into() }],
            ..Default::default()
        };
        assert_eq!(r.encode_to_vec(), vec![0x0a, 6, 0x0a, 1, b'A', 0x12, 1, b'1', 0x2a, 3, 0x0a, 1, b'x']);
        let a = v1beta1::ContainerAllocateRequest { devices_ids: vec!["cpu-1".into()] };
        assert_eq!(a.encode_to_vec(), [&[0x0a, 5][..], b"cpu-1"].concat());
    }

    #[test]
    fn pod_resources_and_cri_bytes() {
        let c = podresources::ContainerResources {
            name: "c".into(),
            devices: vec![podresources::ContainerDevices {
                resource_name: "r".into(),
                device_ids: vec!["d".into()],
                topology: None,
            }],
            cpu_ids: vec![5],
            memory: vec![],
        };
        // cpu_ids = 3 is packed (proto3 repeated scalars).
        assert_eq!(c.encode_to_vec(), vec![0x0a, 1, b'c', 0x12, 6, 0x0a, 1, b'r', 0x12, 1, b'd', 0x1a, 1, 5]);
        let pod = podresources::PodResources { name: "p".into(), namespace: "n".into(), containers: vec![] };
        assert_eq!(pod.encode_to_vec(), vec![0x0a, 1, b'p', 0x12, 1, b'n']);

        let k = cri::Container {
            id: "c".into(),
            state: cri::ContainerState::ContainerRunning as i32,
            labels: HashMap::from([("k".to_owned(), "v".to_owned())]),
            ..Default::default()
        };
        // state = 6 (varint), labels = 8 (a map entry: key 1, value 2).
        assert_eq!(k.encode_to_vec(), vec![0x0a, 1, b'c', 0x30, 1, 0x42, 6, 0x0a, 1, b'k', 0x12, 1, b'v']);
    }

    #[test]
    fn dra_and_registration_bytes() {
        let c = dra::Claim { namespace: "n".into(), uid: "u".into(), name: "c".into() };
        assert_eq!(c.encode_to_vec(), vec![0x0a, 1, b'n', 0x12, 1, b'u', 0x1a, 1, b'c']);
        let d = dra::Device {
            request_names: vec!["r".into()],
            pool_name: "p".into(),
            device_name: "d".into(),
            cdi_device_ids: vec!["x".into()],
        };
        assert_eq!(d.encode_to_vec(), vec![0x0a, 1, b'r', 0x12, 1, b'p', 0x1a, 1, b'd', 0x22, 1, b'x']);
        let r = dra::NodePrepareResourceResponse { devices: vec![], error: "e".into() };
        assert_eq!(r.encode_to_vec(), vec![0x12, 1, b'e']);
        // claims = 1 is a map: entries of key 1 and value 2.
        let u = dra::NodeUnprepareResourcesResponse {
            claims: HashMap::from([(
                "u".to_owned(),
                dra::NodeUnprepareResourceResponse { error: "e".into() },
            )]),
        };
        assert_eq!(u.encode_to_vec(), vec![0x0a, 8, 0x0a, 1, b'u', 0x12, 3, 0x0a, 1, b'e']);
        let i = pluginregistration::PluginInfo {
            r#type: "DRAPlugin".into(),
            name: "n".into(),
            endpoint: "e".into(),
            supported_versions: vec!["v".into()],
        };
        let mut want = vec![0x0a, 9];
        want.extend_from_slice(b"DRAPlugin");
        want.extend_from_slice(&[0x12, 1, b'n', 0x1a, 1, b'e', 0x22, 1, b'v']);
        assert_eq!(i.encode_to_vec(), want);
        let s = pluginregistration::RegistrationStatus { plugin_registered: true, error: "x".into() };
        assert_eq!(s.encode_to_vec(), vec![0x08, 1, 0x12, 1, b'x']);
    }
}
