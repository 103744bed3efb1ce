// Compiles proto/virga.proto (the envelope), the protocols' packages (proto/rainblock.proto,
// proto/health.proto) the distributed store's layout messages (proto/dkv.proto) and ChainifyDB's (proto/chainify.proto) with
// protox (a protobuf compiler written in Rust), so building needs no `protoc` on the machine.
const PROTOS: [&str; 5] =
    ["proto/virga.proto", "proto/rainblock.proto", "proto/health.proto", "proto/dkv.proto", "proto/chainify.proto"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(PROTOS, ["proto"])?;
    let grpc = std::env::var_os("CARGO_FEATURE_GRPC").is_some();
    tonic_prost_build::configure().build_client(grpc).build_server(grpc).compile_fds(descriptors)?;
    Ok(())
}
