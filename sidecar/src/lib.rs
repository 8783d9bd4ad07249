//! regolith-sidecar: one per node, beside the vLLM workers (design §1).
//!
//! Modules:
//! * [`segment`] — memfd-backed memory (the node's segment, staging areas, client-registered
//!   memfds): allocated with `fallocate`, sealed, mapped shared, pre-faulted, bounds-checked.
//! * [`mem`] — [`mem::RawRange`] and socket I/O on mappings: the one place where mapped memory
//!   becomes slices or pointers handed to the kernel.
//! * [`transport`] — the data plane: the [`transport::Transport`] trait, transport-independent
//!   slicing and NIC-pair scheduling, the connection pool, per-NIC counters, and
//!   [`transport::tcp`], the TCP implementation (server and client), and [`transport::rdma`],
//!   the RDMA upgrade of a connection (feature `rdma`) with the transport a node dials with.
//! * [`tracker`] — reservations in flight on this segment: admission, heartbeat reports,
//!   fencing and release of quarantined ones.
//! * [`ops`] — what local clients ask for, one file per family (puts, gets, keys), on domain
//!   types, with metad behind [`ops::MetadApi`] and the replicas' I/O in [`ops::replica`].
//! * [`index`] — the node's compact index of the cluster's objects (sans-I/O), with
//!   read-your-writes overrides; [`watch`] — the task that keeps it current from metad's
//!   `Watch` stream, its health, and the accesses reported to the leader.
//! * [`handover`] — upgrades that keep the cache: the segment memfd, the listeners and the
//!   state handed to a successor process (`--takeover`) over a Unix socket (SCM_RIGHTS).
//! * [`disk`] — the node's disk tier (format, layout, one disk's I/O, the disks together);
//!   [`offload`] — its side of offload, drops and reconciliation with metad.
//! * [`node`] — the running sidecar: identity, mount, heartbeats, drain, unmount.
//! * [`uds`] — the UDS server: socket, sessions, hello with memfds, and the translation of
//!   requests and replies to and from [`ops`].
//! * [`http`] — `/metrics`, `/health`, `/ready`, `/status`; [`metrics`] — the Prometheus set.
//! * [`args`] — flags, TOML, environment; [`state_file`] — the node's persistent identity.
//! * [`run`] — the process entry point (start-up order, shutdown) inside the shared
//!   `regolith_proto::daemon::main` shell.
//! * [`error`] — the crate's error enum.

// No unwrap/expect outside tests: nothing a peer, a client or a config file sends may panic
// a process; the few invariants that are ours alone say so where they are allowed.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod args;
pub mod disk;
pub mod error;
pub mod handover;
pub mod http;
pub mod index;
pub mod mem;
pub mod metrics;
pub mod node;
pub mod offload;
pub mod ops;
pub mod run;
pub mod segment;
pub mod state_file;
pub mod tracker;
pub mod transport;
pub mod uds;
pub mod watch;

pub use error::{Error, Result};
