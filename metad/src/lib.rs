//! regolith-metad: one replica of Regolith's metadata service.
//!
//! The core is sans-I/O — plain types with plain methods, tested without a runtime:
//! * [`types`] — segments, extents, versions, objects.
//! * [`command`] — the replicated commands and their outcomes.
//! * [`state`] — the replicated state machine (`apply`, snapshots).
//! * [`alloc`] — the free-range allocator used by the state machine and the shadow allocator.
//! * [`leader`] — leader-only logic: shadow allocator, reservations, leases, placement,
//!   eviction, liveness.
//! * [`core`] — the state machine and the leader state under one lock.
//! * [`config`] — the cache knobs and the clock pair the core is given.
//! * [`error`] — the crate's error enum.

pub mod alloc;
pub mod command;
pub mod config;
pub mod core;
pub mod error;
pub mod leader;
pub mod state;
pub mod types;

pub use error::{Error, Result};
