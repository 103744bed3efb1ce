// Compiles Raft's wire messages (proto/raft.proto, package `virga.raft.v1`) with protox, a
// protobuf compiler written in Rust, so building needs no `protoc`.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/raft.proto");
    let descriptors = protox::compile(["proto/raft.proto"], ["proto"])?;
    tonic_prost_build::configure().build_client(false).build_server(false).compile_fds(descriptors)?;
    Ok(())
}
