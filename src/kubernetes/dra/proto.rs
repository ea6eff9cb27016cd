//! The kubelet's DRA plugin API (`k8s.io.kubelet.pkg.apis.dra.v1`, the `v1.DRAPlugin` service
//! we serve) and its plugin watcher's registration (`pluginregistration`, the `Registration`
//! service we serve on the registration socket), generated from their published api.proto files
//! (see `build.rs`).
#![allow(missing_docs, clippy::all, clippy::pedantic, clippy::unwrap_used)]

/// `k8s.io.kubelet.pkg.apis.dra.v1`: the kubelet's DRA plugin API (`v1.DRAPlugin`).
pub mod dra {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}

/// `pluginregistration`: the kubelet plugin watcher's registration (`Registration`).
pub mod pluginregistration {
    tonic::include_proto!("pluginregistration");
}

#[cfg(test)]
mod tests {
    //! Field numbers checked against bytes worked out by hand from the published .proto files:
    //! a key is `(field << 3) | wire type` (0 varint, 2 length-delimited).
    use std::collections::HashMap;

    use prost::Message;

    use super::{dra, pluginregistration};

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
