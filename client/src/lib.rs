//! regolith-client: the Rust client of the Regolith sidecar (design §8).
//!
//! Local extents are a single memcpy by the client into or out of the mapped segment, with the
//! checksum computed chunk by chunk while the bytes are cache-hot; remote replicas go through
//! the staging area or a registered buffer; batch calls are one round trip.
//!
//! Modules:
//! * [`client`] — [`AsyncClient`]: the session, key operations, shared buffers; its puts in
//!   `client/put.rs` and its gets in `client/get.rs`.
//! * [`blocking`] — [`Client`], the blocking API over it.
//! * [`conn`] — one pipelined connection: hello, frames, replies routed by id.
//! * [`reconnect`] — back-off between reconnection attempts to a sidecar that went away.
//! * [`shm`] — mapped memfds (segment, staging, [`ShmBuffer`]) and the fused copy+hash.
//! * [`share`] — registered caller memory moved onto a memfd in place, so that the sidecar
//!   reads and writes it without a staging copy.
//! * [`staging`] — windows of the staging area, one per request in flight.
//! * `gather` — scatter/gather lists: objects put from, or read into, several pieces.
//! * [`error`] — the crate's error enum.

// No unwrap/expect outside tests: nothing a peer, a client or a config file sends may panic
// a process; the few invariants that are ours alone say so where they are allowed.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod blocking;
pub mod client;
pub mod conn;
pub mod error;
mod gather;
pub mod reconnect;
pub mod share;
pub mod shm;
pub mod staging;

pub use blocking::Client;
pub use client::{
    AsyncClient, ClientConfig, Dest, Located, PutInfo, ReplicaLocation, ReplicateConfig, Source,
    DEFAULT_SOCKET,
};
pub use error::{Error, Result};
pub use regolith_proto::uds::pb;
pub use shm::ShmBuffer;
