//! Raft persistence for Regolith: openraft 0.9 `RaftLogStorage` and `RaftStateMachine` on sled.
//!
//! The crate knows openraft and sled, not Regolith's commands: the application plugs its state
//! machine in through [`StateMachineCore`], and gets back the two halves openraft wants from
//! [`open`]:
//!
//! ```text
//! <data_dir>/
//!   raft.sled/    log entries, vote, commit index, last purged id   (log_store)
//!   snapshots/    the current snapshot file, and temp files         (snapshot)
//! ```
//!
//! Modules (see each for details):
//! * `core` — the [`StateMachineCore`] trait the application implements.
//! * `config` — [`StorageConfig`].
//! * `error` — the crate's [`Error`] and [`Result`].
//! * `log_store` — [`SledLogStore`]: log, vote and commit index in sled; the sled layout and the
//!   durability rules.
//! * `flusher` — group commit: one fsync for many appends.
//! * `state_machine` — [`SledStateMachine`]: applies entries to `S`, builds and installs
//!   snapshots.
//! * `snapshot` — the snapshot file format and the snapshot directory.
//! * `stats` — [`StorageStats`], atomics the application exports as metrics.

// No unwrap/expect outside tests: nothing a peer, a client or a config file sends may panic
// a process; the few invariants that are ours alone say so where they are allowed.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use std::path::Path;
use std::sync::Arc;

mod config;
mod core;
mod error;
mod flusher;
mod log_store;
mod snapshot;
mod state_machine;
mod stats;

pub use crate::config::{SledMode, StorageConfig};
pub use crate::core::StateMachineCore;
pub use crate::error::{Error, Result};
pub use crate::flusher::FlusherPause;
pub use crate::log_store::{SledLogStore, LOG_LAYOUT_VERSION};
pub use crate::snapshot::SNAPSHOT_FORMAT_VERSION;
pub use crate::state_machine::{AppliedHandle, SledSnapshotBuilder, SledStateMachine};
pub use crate::stats::{LatencyHistogram, StorageStats};

/// Opens (creating if needed) the Raft storage in `dir`: the log store in `<dir>/raft.sled` and
/// the state machine, restored from the newest snapshot in `<dir>/snapshots`. Both share one
/// [`StorageStats`].
pub fn open<S: StateMachineCore>(
    dir: &Path,
    cfg: &StorageConfig,
    s: S,
) -> Result<(SledLogStore<S::C>, SledStateMachine<S>)> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io("create data directory", dir, e))?;
    let stats = Arc::new(StorageStats::default());
    let log = SledLogStore::open_with_stats(dir, cfg, stats.clone())?;
    let sm = SledStateMachine::open_with_stats(dir, s, stats)?;
    Ok((log, sm))
}

/// Whether `dir` holds Raft state: a vote, log entries (or a purge mark) or a snapshot. A member
/// with state must ignore `--bootstrap`. Call it before [`open`]: sled locks an open database.
pub fn has_state(dir: &Path) -> Result<bool> {
    Ok(log_store::has_log_state(dir)? || snapshot::SnapshotDir::has_snapshot(dir)?)
}
