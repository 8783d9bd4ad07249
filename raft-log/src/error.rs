//! The crate's error type.
//!
//! Every variant names what failed and, where there is one, the path it failed on, so that a log
//! line is enough to find the broken file. Inside the openraft traits these errors are wrapped in
//! [`openraft::StorageError`] (see [`Error::into_storage`]), which tells openraft the subject
//! (log, vote, snapshot, ...) and the verb (read, write, ...).

use std::io;
use std::path::PathBuf;

use openraft::{AnyError, ErrorSubject, ErrorVerb, StorageError, StorageIOError};

/// The `Result` alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in `raft-log`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file system operation failed.
    #[error("cannot {op} {path}: {source}")]
    Io {
        /// What was being done, e.g. "create snapshot file".
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    /// A sled operation failed.
    #[error("sled: cannot {op} in {path}: {source}")]
    Sled {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: sled::Error,
    },

    /// A value could not be encoded with bincode.
    #[error("cannot encode {what}: {source}")]
    Encode {
        what: &'static str,
        #[source]
        source: bincode::Error,
    },

    /// A value read from disk could not be decoded.
    #[error("cannot decode {what} read from {path}: {source}")]
    Decode {
        what: String,
        path: PathBuf,
        #[source]
        source: bincode::Error,
    },

    /// The sled database holds something this build does not understand or does not expect.
    #[error("log store {path} is inconsistent: {reason}")]
    CorruptLog { path: PathBuf, reason: String },

    /// The log store was written by a build with another on-disk layout.
    #[error("log store {path} has layout version {found}; this build reads version {supported}")]
    UnsupportedLogLayout {
        path: PathBuf,
        found: u32,
        supported: u32,
    },

    /// A snapshot file is damaged (bad magic, truncated, checksum mismatch, undecodable meta).
    #[error("snapshot file {path} is corrupt: {reason}")]
    CorruptSnapshot { path: PathBuf, reason: String },

    /// A snapshot file was written in a format version this build cannot read.
    #[error(
        "snapshot file {path} has format version {found}; this build reads version {supported} \
         (was it written by a newer Regolith?)"
    )]
    UnsupportedSnapshotVersion {
        path: PathBuf,
        found: u32,
        supported: u32,
    },

    /// A received snapshot file does not describe the snapshot openraft says it is installing.
    #[error("snapshot file {path} holds snapshot {found}, but openraft is installing {expected}")]
    SnapshotMetaMismatch {
        path: PathBuf,
        expected: String,
        found: String,
    },

    /// The application's `StateMachineCore` failed to write or read its snapshot payload.
    #[error("state machine failed to {op} snapshot {path}: {source}")]
    StateMachine {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    /// An offline operation on a data directory refused to run (it names why).
    #[error("{path}: {reason}")]
    Refused { path: PathBuf, reason: String },

    /// The background flusher thread is gone (it panicked or the store is shutting down).
    #[error("the log flusher thread of {path} has stopped")]
    FlusherStopped { path: PathBuf },

    /// A blocking task running storage work was cancelled or panicked.
    #[error("storage task for {path} did not complete: {reason}")]
    TaskFailed { path: PathBuf, reason: String },
}

impl Error {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        Error::Io {
            op,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn sled(op: &'static str, path: impl Into<PathBuf>, source: sled::Error) -> Self {
        Error::Sled {
            op,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn corrupt_snapshot(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        Error::CorruptSnapshot {
            path: path.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn corrupt_log(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        Error::CorruptLog {
            path: path.into(),
            reason: reason.into(),
        }
    }

    /// Wraps this error for openraft, which needs to know what was being read or written.
    pub fn into_storage(self, subject: ErrorSubject<u64>, verb: ErrorVerb) -> StorageError<u64> {
        StorageIOError::new(subject, verb, AnyError::new(&self)).into()
    }
}
