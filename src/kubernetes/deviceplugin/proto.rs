//! The device plugin API (`v1beta1`), generated from its published api.proto (see `build.rs`):
//! the `DevicePlugin` service we serve and the kubelet's `Registration` we call.
#![allow(missing_docs, clippy::all, clippy::pedantic, clippy::unwrap_used)]

/// `v1beta1`: the device plugin API.
pub mod v1beta1 {
    tonic::include_proto!("v1beta1");
}

#[cfg(test)]
mod tests {
    //! Field numbers checked against bytes worked out by hand from the published .proto files:
    //! a key is `(field << 3) | wire type` (0 varint, 2 length-delimited).
    use std::collections::HashMap;

    use prost::Message;

    use super::v1beta1;

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
}
