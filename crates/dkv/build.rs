// Compiles the client API (proto/kv.proto, package `virga.kv.v1`) with protox, a protobuf
// compiler written in Rust, so building needs no `protoc`. The messages are always built;
// tonic's client and server only with the `grpc` feature (the fuzz build goes without).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/kv.proto");
    let descriptors = protox::compile(["proto/kv.proto"], ["proto"])?;
    let grpc = std::env::var_os("CARGO_FEATURE_GRPC").is_some();
    tonic_prost_build::configure().build_client(grpc).build_server(grpc).compile_fds(descriptors)?;
    Ok(())
}
