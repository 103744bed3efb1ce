// Compiles the client API (proto/kv.proto, package `virga.kv.v1`) and the store's own
// protocol between its roles (proto/dkv.proto, package `virga.dkv.v1`, which uses the API's
// timestamps and virga-raft's Raft messages) with protox, a protobuf compiler written in
// Rust, so building needs no `protoc`. The messages are always built; tonic's client and
// server of the API only with the `grpc` feature (the fuzz build goes without).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    for proto in ["proto/kv.proto", "proto/dkv.proto", "../raft/proto/raft.proto"] {
        println!("cargo:rerun-if-changed={proto}");
    }
    let grpc = std::env::var_os("CARGO_FEATURE_GRPC").is_some();
    // The API alone: programs in other languages compile kv.proto by itself.
    let api = protox::compile(["proto/kv.proto"], ["proto"])?;
    tonic_prost_build::configure().build_client(grpc).build_server(grpc).compile_fds(api)?;
    // The internal protocol, its imports taken from where they are generated.
    let internal = protox::compile(["proto/dkv.proto"], ["proto", "../raft/proto"])?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(false)
        .extern_path(".virga.raft.v1", "::virga_raft::proto")
        .extern_path(".virga.kv.v1", "crate::api::proto")
        .compile_fds(internal)?;
    Ok(())
}
