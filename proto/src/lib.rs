//! Regolith's wire formats and the leader-following metad client.
//!
//! This crate depends on no other Regolith crate, so the sidecar, the CLI and the Python wheel can
//! talk to metad without linking the server.
//!
//! Modules:
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
//! * [`daemon`] — the daemons' shared `main` shell: argv, logging, runtime, signals, exit code.
//! * [`launch`] — [`launch::MetadLaunch`] / [`launch::SidecarLaunch`]: a daemon's command line,
//!   typed, for every Rust launcher.
//! * [`error`] — the crate's error enum.

pub mod auth;
pub mod checksum;
pub mod client;
pub mod daemon;
pub mod dataplane;
pub mod error;
pub mod fdpass;
pub mod frame;
pub mod launch;
pub mod leader;
pub mod uds;
pub mod units;

/// Generated code of `proto/metad.proto`.
pub mod metad {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("regolith.metad.v1");
}

/// Generated code of `proto/raft.proto`.
pub mod raft {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("regolith.raft.v1");
}

pub use error::{Error, Result};
