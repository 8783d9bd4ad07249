//! The crate's error enum.

use std::net::SocketAddr;

use regolith_proto::dataplane::{Kind, Status};

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("configuration: {0}")]
    Config(String),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("state file {path}: {reason}")]
    StateFile { path: String, reason: String },
    #[error("metad: {0}")]
    Metad(String),
    /// A sidecar upgrade's hand-over (`crate::handover`) failed or was refused.
    #[error("hand-over: {0}")]
    Handover(String),
    #[error("socket {path}: {reason}")]
    Socket { path: String, reason: String },
    #[error("{what}: {source}")]
    Os {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("segment {name}: {op}: {source}")]
    SegmentSys {
        name: String,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// A disk of the tier is out (I/O error, missing, read-only, unreadable label).
    #[error("disk {path}: {reason}")]
    DiskFailed { path: String, reason: String },
    #[error("segment {name}: {reason}")]
    SegmentInvalid { name: String, reason: String },
    #[error("range [{offset}, {offset}+{len}) lies outside {name} ({size} bytes)")]
    OutOfRange {
        name: String,
        offset: u64,
        len: u64,
        size: u64,
    },
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// A disk replica's record is no longer on this node's disks (its disk evicted or lost
    /// it; metad drops the replica once told).
    #[error("no record of version {version} on this node's disks")]
    DiskRecordGone { version: String },
    #[error("peer {peer}: handshake failed: {reason}")]
    Handshake { peer: SocketAddr, reason: String },
    #[error("peer {peer}: protocol violation: {reason}")]
    Protocol { peer: SocketAddr, reason: String },
    #[error("peer {peer}: {op}: {source}")]
    Io {
        peer: SocketAddr,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("peer {peer} refused {kind:?} of {len} bytes at offset {offset} of generation {generation}: {status} (peer's term {peer_term})")]
    Refused {
        peer: SocketAddr,
        kind: Kind,
        generation: u64,
        offset: u64,
        len: u64,
        status: Status,
        peer_term: u64,
    },
    #[error("node {node}: no NIC pair could carry the {kind:?} of {len} bytes at offset {offset} of generation {generation} (pairs: {pairs}); last error: {last}")]
    NoPath {
        node: u64,
        kind: Kind,
        generation: u64,
        offset: u64,
        len: u64,
        pairs: String,
        last: String,
    },
    #[error("node {node}: {kind:?} of {len} bytes at offset {offset} of generation {generation} timed out after {ms} ms")]
    Timeout {
        node: u64,
        kind: Kind,
        generation: u64,
        offset: u64,
        len: u64,
        ms: u64,
    },
}

impl Error {
    /// The data-plane status of a refusal, if this is one.
    pub fn status(&self) -> Option<Status> {
        match self {
            Error::Refused { status, .. } => Some(*status),
            _ => None,
        }
    }
}

impl Error {
    pub fn metad(e: regolith_proto::Error) -> Self {
        Error::Metad(e.to_string())
    }
}
