//! regolith-fuzz: one fuzz target per decoder that reads a peer's bytes, and a mutation runner
//! that works on the stable toolchain (CI runs it briefly on each target through
//! `cargo test -p regolith-fuzz`; `fuzz/libfuzzer/` wraps the same targets for cargo-fuzz).
//!
//! Modules:
//! * [`frame`] — the UDS frame codec, whole and incremental (`regolith_proto::frame`).
//! * [`uds`] — UDS request bodies (what the sidecar decodes) and reply bodies (what the client
//!   decodes), by opcode (`regolith_proto::uds`).
//! * [`dataplane`] — the data-plane handshake (`Hello`, `HelloReply`) and the request (48-byte
//!   version 1 and 80-byte version 2) and reply headers (`regolith_proto::dataplane`), and the
//!   RDMA upgrade's offer and accept (`regolith_proto::rdma`).
//! * [`raft`] — metad's Raft RPC payloads (`regolith_metad::network::decode`).
//! * [`snapshot`] — the snapshot file a follower installs (`regolith_raft_log`) and the
//!   state-machine payload inside it (`regolith_metad::state::StateMachine::read_snapshot`).
//! * [`sled`] — the records the Raft log store reads back from sled: log entries, vote,
//!   committed and last-purged ids (`regolith_raft_log`).
//! * [`runner`] — the stable-toolchain runner: replays `corpus/<target>/`, then mutates with a
//!   seeded RNG for `REGOLITH_FUZZ_SECS` seconds, each input under `catch_unwind`.
//! * [`seeds`] — valid encodings per target, which the `seed-corpus` bin writes to `corpus/`.
//!
//! Every target is a `pub fn <target>(data: &[u8])` that must not panic on any input; it
//! asserts the decoder's invariants: lengths within their caps and, where an encoder exists,
//! that what decodes re-encodes to bytes that decode to the same thing.

// No unwrap/expect on input bytes: a panic is what the targets look for, so the library must
// only panic in its assertions.
#![deny(clippy::unwrap_used, clippy::expect_used)]

pub mod dataplane;
pub mod frame;
pub mod raft;
pub mod runner;
pub mod seeds;
pub mod sled;
pub mod snapshot;
pub mod uds;

/// A fuzz target: its name (the corpus directory) and the function that takes the bytes.
#[derive(Clone, Copy)]
pub struct Target {
    pub name: &'static str,
    pub run: fn(&[u8]),
}

/// Every target, by name.
pub const TARGETS: &[Target] = &[
    Target {
        name: "uds_frame",
        run: frame::uds_frame,
    },
    Target {
        name: "uds_request",
        run: uds::uds_request,
    },
    Target {
        name: "uds_reply",
        run: uds::uds_reply,
    },
    Target {
        name: "dataplane_hello",
        run: dataplane::dataplane_hello,
    },
    Target {
        name: "dataplane_request",
        run: dataplane::dataplane_request,
    },
    Target {
        name: "dataplane_reply",
        run: dataplane::dataplane_reply,
    },
    Target {
        name: "rdma_upgrade",
        run: dataplane::rdma_upgrade,
    },
    Target {
        name: "raft_payload",
        run: raft::raft_payload,
    },
    Target {
        name: "snapshot_file",
        run: snapshot::snapshot_file,
    },
    Target {
        name: "snapshot_state",
        run: snapshot::snapshot_state,
    },
    Target {
        name: "sled_record",
        run: sled::sled_record,
    },
];

/// The target called `name`.
pub fn target(name: &str) -> Option<Target> {
    TARGETS.iter().copied().find(|t| t.name == name)
}
