//! The kubelet's and the runtime's APIs that more than one adapter calls, generated from their
//! published .proto files (see `build.rs`): PodResources v1 and the CRI subset.
#![allow(missing_docs, clippy::all, clippy::pedantic, clippy::unwrap_used)]

/// `v1`: the PodResources API.
pub mod podresources {
    tonic::include_proto!("v1");
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

    use super::{cri, podresources};

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
}
