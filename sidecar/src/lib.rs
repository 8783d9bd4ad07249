//! regolith-sidecar: one per node, beside the vLLM workers (design §1).
//!
//! Modules:
//! * [`segment`] — memfd-backed memory (the node's segment, staging areas, client-registered
//!   memfds): allocated with `fallocate`, sealed, mapped shared, pre-faulted, bounds-checked.
//! * [`mem`] — [`mem::RawRange`] and socket I/O on mappings: the one place where mapped memory
//!   becomes slices or pointers handed to the kernel.
//! * [`transport`] — the data plane: the [`transport::Transport`] trait, transport-independent
//!   slicing and NIC-pair scheduling, the connection pool, per-NIC counters, and
//!   [`transport::tcp`], the TCP implementation (server and client).
//! * [`error`] — the crate's error enum.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod error;
pub mod mem;
pub mod segment;
pub mod transport;

pub use error::{Error, Result};
