//! Generates the gRPC code with protox (a pure-Rust protobuf compiler): no `protoc` binary is
//! needed on any machine.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/metad.proto", "proto/raft.proto", "proto/uds.proto"];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
