//! NRI's messages, generated from `proto/nri/v1alpha1/api.proto` (see `build.rs`).
#![allow(missing_docs, clippy::all, clippy::pedantic, clippy::unwrap_used)]

include!(concat!(env!("OUT_DIR"), "/nri.pkg.api.v1alpha1.rs"));

#[cfg(test)]
mod tests {
    //! Field numbers checked against bytes worked out by hand from NRI's published api.proto:
    //! a key is `(field << 3) | wire type` (0 varint, 2 length-delimited).
    use prost::Message;

    use super::*;

    #[test]
    fn register_plugin_request_bytes() {
        let m = RegisterPluginRequest {
            plugin_name: "ab".into(),
            plugin_idx: "90".into(),
            nri_version: String::new(),
        };
        assert_eq!(m.encode_to_vec(), [0x0a, 2, b'a', b'b', 0x12, 2, b'9', b'0']);
    }

    /// `events` is field 2 of ConfigureResponse (there is no field 1).
    #[test]
    fn configure_response_bytes() {
        assert_eq!(ConfigureResponse { events: 0x6a8 }.encode_to_vec(), [0x10, 0xa8, 0x0d]);
    }

    /// The adjustment's CPUs: ContainerAdjustment.linux (6) → LinuxContainerAdjustment.resources
    /// (2) → LinuxResources.cpu (2) → LinuxCPU.cpus (6) and mems (7).
    #[test]
    fn adjustment_bytes() {
        let cpu = LinuxCpu { cpus: "2".into(), mems: "0".into(), ..Default::default() };
        let adjust = ContainerAdjustment {
            linux: Some(LinuxContainerAdjustment {
                resources: Some(LinuxResources { cpu: Some(cpu), memory: None }),
                cgroups_path: String::new(),
            }),
            ..Default::default()
        };
        assert_eq!(adjust.encode_to_vec(), [0x32, 10, 0x12, 8, 0x12, 6, 0x32, 1, b'2', 0x3a, 1, b'0']);
    }

    /// A container as the runtime sends it: id (1), env (8), linux (11) → cgroups_path (5).
    #[test]
    fn container_decodes_from_hand_made_bytes() {
        let mut bytes = vec![0x0a, 1, b'c', 0x20, 3, 0x42, 3, b'A', b'=', b'1'];
        bytes.extend([0x5a, 3, 0x2a, 1, b'p']);
        let c = Container::decode(bytes.as_slice()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.id, "c");
        assert_eq!(c.state(), ContainerState::ContainerRunning);
        assert_eq!(c.env, ["A=1"]);
        assert_eq!(c.linux.map(|l| l.cgroups_path).as_deref(), Some("p"));
    }

    /// PodSandbox: uid (3), namespace (4), linux (8) → cgroups_path (4).
    #[test]
    fn pod_sandbox_decodes_from_hand_made_bytes() {
        let bytes = [0x1a, 1, b'u', 0x22, 1, b'n', 0x42, 3, 0x22, 1, b'p'];
        let p = PodSandbox::decode(bytes.as_slice()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((p.uid.as_str(), p.namespace.as_str()), ("u", "n"));
        assert_eq!(p.linux.map(|l| l.cgroups_path).as_deref(), Some("p"));
    }

    /// StateChangeEvent: event (1) as a varint, container (3).
    #[test]
    fn state_change_decodes_from_hand_made_bytes() {
        let bytes = [0x08, 6, 0x1a, 3, 0x0a, 1, b'c'];
        let e = StateChangeEvent::decode(bytes.as_slice()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(e.event(), Event::StartContainer);
        assert_eq!(e.container.map(|c| c.id).as_deref(), Some("c"));
    }
}
