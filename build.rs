//! Generates the kubelet gRPC APIs (device plugin v1beta1, PodResources v1, the DRA plugin v1 and
//! the plugin watcher's registration, the CRI subset) and
//! NRI's messages into `OUT_DIR`
//! from the `.proto` files in `proto/`. protox parses them in-process, so no `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let kubelet = [
        "proto/deviceplugin/v1beta1/api.proto",
        "proto/podresources/v1/api.proto",
        "proto/dra/v1/api.proto",
        "proto/pluginregistration/v1/api.proto",
    ];
    let cri = ["proto/cri/v1/api.proto"];
    for p in kubelet.iter().chain(&cri) {
        println!("cargo:rerun-if-changed={p}");
    }
    // The kubelet's APIs: every server method must be written (the daemon serves the device
    // plugin, the DRA plugin and its registration whole).
    let fds = protox::compile(kubelet, ["proto"])?;
    tonic_prost_build::configure().build_client(true).build_server(true).compile_fds(fds)?;
    // The CRI: cpupoold calls ListContainers, the test peer the pod and container lifecycle; a
    // fake runtime serves only ListContainers, so the methods it leaves out answer Unimplemented.
    let fds = protox::compile(cri, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .generate_default_stubs(true)
        .compile_fds(fds)?;
    // NRI speaks ttRPC, not gRPC: its messages only (src/kubernetes/nri/ttrpc.rs carries the calls).
    let nri = "proto/nri/v1alpha1/api.proto";
    println!("cargo:rerun-if-changed={nri}");
    let fds = protox::compile([nri], ["proto"])?;
    tonic_prost_build::configure().build_client(false).build_server(false).compile_fds(fds)?;
    Ok(())
}
