// Compiles proto/virga.proto (the envelope) and proto/rainblock.proto with protox (a protobuf compiler written in Rust), so building
// needs no `protoc` on the machine.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/virga.proto");
    println!("cargo:rerun-if-changed=proto/rainblock.proto");
    let descriptors = protox::compile(["proto/virga.proto", "proto/rainblock.proto"], ["proto"])?;
    let grpc = std::env::var_os("CARGO_FEATURE_GRPC").is_some();
    tonic_prost_build::configure().build_client(grpc).build_server(grpc).compile_fds(descriptors)?;
    Ok(())
}
