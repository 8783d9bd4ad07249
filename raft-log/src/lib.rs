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
//! * `core` — the [`StateMachineCore`] trait the application implements, and the
//!   [`SnapshotView`] it hands out for a snapshot.
//! * `config` — [`StorageConfig`].
//! * `error` — the crate's [`Error`] and [`Result`].
//! * `log_store` — [`SledLogStore`]: log, vote and commit index in sled; the sled layout and the
//!   durability rules.
//! * `flusher` — group commit: one fsync for many appends.
//! * `state_machine` — [`SledStateMachine`]: applies entries to `S`, builds and installs
//!   snapshots.
//! * `snapshot` — the snapshot file format and the snapshot directory.
//! * `offline` — [`seed_snapshot`] (restore a new member from a backup),
//!   [`force_single_member`] (a survivor of a lost quorum becomes a one-member cluster) and
//!   [`no_restored_leader`] (a leader that stopped starts as a follower).
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
mod offline;
mod snapshot;
mod state_machine;
mod stats;
mod tail;

pub use crate::config::{SledMode, StorageConfig};
pub use crate::core::{SnapshotView, StateMachineCore};
pub use crate::error::{Error, Result};
pub use crate::flusher::FlusherPause;
pub use crate::log_store::{SledLogStore, CHUNK_BYTES, LOG_LAYOUT_VERSION};
pub use crate::offline::{force_single_member, no_restored_leader, seed_snapshot};
pub use crate::snapshot::SNAPSHOT_FORMAT_VERSION;
pub use crate::state_machine::{AppliedHandle, SledSnapshotBuilder, SledStateMachine};
pub use crate::stats::{LatencyHistogram, StorageStats};

/// The decoders of what this crate reads back from disk and from a leader (sled records, snapshot
/// files), for `regolith-fuzz`. Not an API: nothing else should call these.
#[doc(hidden)]
pub mod fuzz {
    use std::path::Path;

    use openraft::{BasicNode, Entry, RaftTypeConfig, SnapshotMeta};
    use serde::de::DeserializeOwned;

    use crate::Result;

    /// A log-tree record: the entry stored under the 8-byte big-endian index `key`.
    pub fn log_entry<C>(key: &[u8], value: &[u8]) -> Result<Entry<C>>
    where
        C: RaftTypeConfig<NodeId = u64, Node = BasicNode, Entry = Entry<C>>,
    {
        crate::log_store::decode_entry(key, value, Path::new("<fuzz>"))
    }

    /// A meta-tree record (vote, committed, last purged).
    pub fn meta_record<T: DeserializeOwned>(key: &str, bytes: &[u8]) -> Result<T> {
        crate::log_store::decode_meta(key, bytes, Path::new("<fuzz>"))
    }

    /// Writes a snapshot file of `meta` and `payload` at `path` (seeds for the snapshot target).
    pub fn write_snapshot_file(
        path: &Path,
        meta: &SnapshotMeta<u64, BasicNode>,
        payload: &[u8],
    ) -> Result<u64> {
        use std::io::Write;
        let mut w = crate::snapshot::SnapshotWriter::create(path, meta)?;
        w.write_all(payload)
            .map_err(|e| crate::Error::io("write snapshot payload", path, e))?;
        w.finish()
    }

    /// Validates the snapshot file at `path` as on open or install: its meta and payload length.
    pub fn snapshot_file(path: &Path) -> Result<(SnapshotMeta<u64, BasicNode>, u64)> {
        crate::snapshot::validate(path).map(|h| (h.meta, h.payload_len))
    }
}

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
