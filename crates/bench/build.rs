// Compiles proto/etcd_kv.proto (the part of etcd's v3 key-value API the etcd peer calls) with
// protox, a protobuf compiler written in Rust, so building needs no `protoc`; client code only.
const PROTO: &str = "proto/etcd_kv.proto";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed={PROTO}");
    let descriptors = protox::compile([PROTO], ["proto"])?;
    tonic_prost_build::configure().build_client(true).build_server(false).compile_fds(descriptors)?;
    Ok(())
}
