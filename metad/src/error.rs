//! The crate's error enum. Each variant names what failed and on which key, node or address.

use crate::types::Version;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("key {key:?} already exists")]
    AlreadyExists { key: String },
    #[error("key {key:?} not found")]
    NotFound { key: String },
    #[error("no space for {key:?} ({size} bytes x {replicas} replicas)")]
    NoSpace {
        key: String,
        size: u64,
        replicas: u32,
    },
    /// An upsert of a key another put or upsert is still writing: retryable.
    #[error("key {key:?} is being written by another put; retry")]
    KeyBusy { key: String },
    #[error("no live segment can take {key:?}")]
    NoSegments { key: String },
    /// Placement failed only because segments that could take the put have not heartbeated to
    /// this leader yet (nothing is placed on a segment before that): retryable.
    #[error(
        "no segment can take {key:?} yet: {waiting} segment(s) have not heartbeated to the \
         leader of term {term} since its election; retry"
    )]
    SegmentsNotReady {
        key: String,
        waiting: usize,
        term: u64,
    },
    #[error("hard-pin quota exceeded for {key:?}: {pinned} of {limit} bytes pinned")]
    QuotaExceeded {
        key: String,
        pinned: u64,
        limit: u64,
    },
    #[error("metadata KV full: {0}")]
    MetaQuota(String),
    #[error("reservation {version} is not known to this leader (other term, or already ended)")]
    StaleReservation { version: Version },
    #[error("reservation {version} expired and is quarantined")]
    Expired { version: Version },
    #[error("commit of reservation {version} refused at apply: {reason}")]
    Conflict { version: Version, reason: String },
    /// The client's deadline for this request passed before metad acted on it (a delayed or
    /// abandoned attempt; see `deadline`).
    #[error(
        "the request's deadline (header regolith-deadline-ms) passed {late_ms} ms ago: not acted \
         on, the client gave up on it; if every request says so, this replica's clock is ahead \
         of the client's"
    )]
    DeadlinePassed { late_ms: u64 },
    #[error("this replica is not the leader")]
    NotLeader { leader: Option<(u64, String)> },
    #[error("leader not ready: {0}")]
    NotReady(String),
    /// Leader by Raft's account, but the core's leader state (shadow allocator, reservations)
    /// is not built yet.
    #[error("leader state not built yet")]
    NoLeaderState,
    /// A command was applied but answered something its caller does not expect (a bug).
    #[error("{0}")]
    Internal(String),
    /// A named node, segment or member that does not exist (the message names it).
    #[error("{0}")]
    NoSuch(String),
    /// The request is valid but the cluster's state refuses it now (a membership change
    /// openraft refused, a drain that did not take).
    #[error("{0}")]
    Precondition(String),
    /// The caller may not do this (a node's call without a certificate naming the node).
    #[error("{0}")]
    PermissionDenied(String),
    /// This replica cannot serve the request now (openraft stopped).
    #[error("{0}")]
    Unavailable(String),
    #[error("raft: {0}")]
    Raft(String),
    #[error("storage at {path}: {reason}")]
    Storage { path: String, reason: String },
    #[error("configuration: {0}")]
    Config(String),
    /// `--restore-from` or `--force-new-cluster` refused (a bad snapshot file, a data dir in the
    /// wrong state); the message says what to do.
    #[error("{0}")]
    Recovery(String),
    #[error("io on {what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
}
