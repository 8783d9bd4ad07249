//! Regolith's wire formats and the leader-following metad client.
//!
//! This crate depends on no other Regolith crate, so the sidecar, the CLI and the Python wheel can
//! talk to metad without linking the server.
//!
//! Modules:
//! * [`common`] — generated code of the messages both services share (`proto/common.proto`).
//! * [`metad`] — generated gRPC code of the metadata API (`proto/metad.proto`).
//! * [`raft`] — generated gRPC code of the Raft RPCs between replicas (`proto/raft.proto`).
//! * [`checksum`] — the object checksum: xxh3-64 per 64 KiB chunk, seeded with the version.
//! * [`auth`] — the cluster token carried on gRPC calls and data-plane connections.
//! * [`leader`] — how followers name the leader in a `NOT_LEADER` answer.
//! * [`units`] — parsing of sizes (`1GiB`) and durations (`500ms`) in flags and config files.
//! * [`client`] — [`client::MetadClient`], which finds the leader, follows redirects and retries
//!   idempotent calls across elections.
//! * [`frame`] — the UDS frame codec (`length | opcode | request id | body`).
//! * [`fdpass`] — file descriptors over a Unix socket (SCM_RIGHTS).
//! * [`dataplane`] — the sidecar-to-sidecar data-plane wire protocol (handshake, slices).
//! * [`uds`] — the client-to-sidecar protocol: opcodes and messages (`proto/uds.proto`).
//! * [`daemon`] — logging, runtime and signal handling shared by the daemons.
//! * [`shutdown`] — [`shutdown::Shutdown`], how tasks learn that the process is stopping.
//! * [`ports`] — free loopback ports outside the kernel's ephemeral range (harnesses, tools).
//! * [`error`] — the crate's error enum.

// No unwrap/expect outside tests: nothing a peer, a client or a config file sends may panic
// a process; the few invariants that are ours alone say so where they are allowed.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod auth;
pub mod checksum;
pub mod client;
pub mod daemon;
pub mod dataplane;
pub mod error;
pub mod fdpass;
pub mod frame;
pub mod leader;
pub mod ports;
pub mod shutdown;
pub mod uds;
pub mod units;

/// Generated code of `proto/common.proto`: the messages both services share.
pub mod common {
    #![allow(clippy::all, missing_docs)]
    include!(concat!(env!("OUT_DIR"), "/regolith.common.v1.rs"));

    impl Version {
        /// The checksum seed of the object this reservation writes.
        pub fn seed(&self) -> u64 {
            crate::checksum::seed(self.term, self.id)
        }
    }
}

/// Generated code of `proto/metad.proto`; the shared messages are re-exported under their names.
pub mod metad {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("regolith.metad.v1");
    pub use crate::common::{Extent, PinKind, PutOptions, Version};
}

/// Generated code of `proto/raft.proto`.
pub mod raft {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("regolith.raft.v1");
}

pub use error::{Error, Result};
