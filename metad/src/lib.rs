//! regolith-metad: one replica of Regolith's metadata service.
//!
//! The core is sans-I/O — plain types with plain methods, tested without a runtime:
//! * [`types`] — segments, extents, versions, objects.
//! * [`command`] — the replicated commands and their outcomes.
//! * [`state`] — the replicated state machine (`apply`, snapshots); [`objects`] — its sharded
//!   object table.
//! * [`alloc`] — the free-range allocator used by the state machine and the shadow allocator.
//! * [`leader`] — leader-only logic: shadow allocator, reservations, leases, placement,
//!   eviction, liveness.
//! * [`core`] — the state machine and the leader state under one lock.
//! * [`feed`] — the change feed of applied entries that `Watch` streams to sidecars.
//! * [`config`] — the cache knobs, the limits on one request, and the clock pair the core is
//!   given.
//! * [`error`] — the crate's error enum.
//!
//! The edges (tokio, tonic, hyper, sled through `raft-log`):
//! * [`raft_types`] — the openraft type configuration; [`sm`] plugs the core into `raft-log`.
//! * [`network`] — Raft messages between replicas over gRPC, capped by bytes.
//! * [`proposer`] — group commit: concurrent proposals coalesced into one entry.
//! * [`deadline`] — requests past their client's deadline are not acted on.
//! * [`gate`] — when reads may be served from the applied state (design §5); leadership changes.
//! * [`elect`] — a fresh random election timeout for each campaign after a split vote.
//! * [`transfer`] — leadership hand-over without an election timeout (rolling upgrades,
//!   `regolith metad transfer-leader`, SIGTERM to a leader).
//! * [`ops`] — the operations, free of any transport: reserve with eviction, commit batching,
//!   reads, removal, segments, membership, the metadata KV, the stats snapshot.
//! * [`grpc`] — the `Metad` and `Raft` gRPC services: wire ↔ [`ops`], errors → `Status`.
//! * [`http`] — `/metrics`, `/health`, `/ready`, `/status` and the HTTP metadata KV (on
//!   [`ops`] when leader, forwarded over one kept client otherwise).
//! * [`metrics`] — Prometheus metrics.
//! * [`node`] — a running replica: storage, Raft and the [`ops`] handles, housekeeping, the
//!   summary log.
//! * [`restore`] — `--restore-from` (seed a new member from a snapshot file) and
//!   `--force-new-cluster` (a survivor of a lost quorum alone), before storage opens.
//! * [`args`] — flags, TOML file, `REGOLITH_*` environment; [`run`] — the process entry point
//!   (the shared `regolith_proto::daemon::main` shell), the listeners (bound before storage and
//!   Raft) and the servers on them.
//! * [`clock`] — the clocks handed to the core.
//!
//! Imports point one way (`run` → `grpc`, `http`, `node`; `http` → `node` → `ops`; `grpc` →
//! `ops` → the core): no module imports one that imports it back.

// No unwrap/expect outside tests: nothing a peer, a client or a config file sends may panic
// a process; the few invariants that are ours alone say so where they are allowed.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod alloc;
pub mod args;
pub mod clock;
pub mod command;
pub mod config;
pub mod core;
pub mod deadline;
pub mod elect;
pub mod error;
pub mod feed;
pub mod gate;
pub mod grpc;
pub mod http;
pub mod leader;
pub mod master_flags;
pub mod metrics;
pub mod network;
pub mod node;
pub mod objects;
pub mod ops;
pub mod proposer;
pub mod raft_types;
pub mod restore;
pub mod run;
pub mod sm;
pub mod state;
pub mod transfer;
pub mod types;

pub use error::{Error, Result};
