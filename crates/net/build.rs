// Compiles proto/virga.proto (the envelope every protocol travels in) and proto/health.proto
// (the health protocol) with protox (a protobuf compiler written in Rust), so building needs
// no `protoc` on the machine. Each other protocol compiles its own messages in its crate.
const PROTOS: [&str; 2] = ["proto/virga.proto", "proto/health.proto"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(PROTOS, ["proto"])?;
    let grpc = std::env::var_os("CARGO_FEATURE_GRPC").is_some();
    tonic_prost_build::configure().build_client(grpc).build_server(grpc).compile_fds(descriptors)?;
    Ok(())
}
