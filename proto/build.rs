//! Generates the gRPC code with protox (a pure-Rust protobuf compiler): no `protoc` binary is
//! needed on any machine.
//!
//! `common.proto` (the messages both services share) is generated once, into `crate::common`;
//! the service files refer to it there (`extern_path`), so a `Version` is one Rust type whether
//! it came from metad or from a local client.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/common.proto",
        "proto/metad.proto",
        "proto/raft.proto",
        "proto/uds.proto",
    ];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let common = protox::compile(["proto/common.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(false)
        // Ordered by term then id (versions) and by offset then length (extents), as the
        // tuples they replace: sets and sorted reports of them stay deterministic.
        .type_attribute(".regolith.common.v1.Version", "#[derive(PartialOrd, Ord)]")
        .type_attribute(".regolith.common.v1.Extent", "#[derive(PartialOrd, Ord)]")
        .compile_fds(common)?;
    // The services' descriptors include common.proto (they import it); prost emits no code for
    // an extern package, so its code is the one generated above.
    let services = protox::compile(&protos[1..], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .extern_path(".regolith.common.v1", "crate::common")
        .compile_fds(services)?;
    Ok(())
}
