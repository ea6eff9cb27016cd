//! Generates the kubelet gRPC APIs (device plugin v1beta1, PodResources v1, the CRI subset) and
//! NRI's messages into `OUT_DIR`
//! from the `.proto` files in `proto/`. protox parses them in-process, so no `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos =
        ["proto/deviceplugin/v1beta1/api.proto", "proto/podresources/v1/api.proto", "proto/cri/v1/api.proto"];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure().build_client(true).build_server(true).compile_fds(fds)?;
    // NRI speaks ttRPC, not gRPC: its messages only (src/nri/ttrpc.rs carries the calls).
    let nri = "proto/nri/v1alpha1/api.proto";
    println!("cargo:rerun-if-changed={nri}");
    let fds = protox::compile([nri], ["proto"])?;
    tonic_prost_build::configure().build_client(false).build_server(false).compile_fds(fds)?;
    Ok(())
}
