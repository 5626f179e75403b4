//! Compiles the kubelet's device-plugin, pod-resources, DRA and plugin-registration protos with protox
//! (pure Rust; no protoc needed).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let files = [
        proto_root.join("k8s/deviceplugin/v1beta1/api.proto"),
        proto_root.join("k8s/podresources/v1/api.proto"),
        proto_root.join("k8s/dra/v1/api.proto"),
        proto_root.join("k8s/dra/v1beta1/api.proto"),
        proto_root.join("k8s/pluginregistration/v1/api.proto"),
    ];
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    let fds = protox::compile(&files, [&proto_root])?;
    tonic_prost_build::configure().build_client(true).build_server(true).compile_fds(fds)?;
    Ok(())
}
