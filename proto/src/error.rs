//! The crate's error enum.

use crate::leader::LeaderHint;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("configuration: {0}")]
    Config(String),
    #[error("invalid metad address {addr:?}: {reason}")]
    BadAddress { addr: String, reason: String },
    #[error("metad at {addr} is not the leader (leader: {leader:?})")]
    NotLeader {
        addr: String,
        leader: Option<LeaderHint>,
    },
    #[error("metad at {addr} answered {code:?}: {message}")]
    Rpc {
        addr: String,
        code: tonic::Code,
        message: String,
    },
    /// A snapshot file (`regolith metad snapshot save`) that is damaged, truncated or foreign.
    #[error("snapshot file {}: {reason}", .path.display())]
    BadSnapshotFile {
        path: std::path::PathBuf,
        reason: String,
    },
    #[error(
        "snapshot file {} has format version {found}; this build reads version {supported} \
         (was it written by a newer Regolith?)", .path.display()
    )]
    SnapshotFileVersion {
        path: std::path::PathBuf,
        found: u32,
        supported: u32,
    },
    #[error("cannot {op} {}: {source}", .path.display())]
    File {
        op: &'static str,
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no metad leader reachable among [{tried}] within {waited_ms} ms: last error: {last}")]
    NoLeader {
        tried: String,
        waited_ms: u64,
        last: String,
    },
}

impl Error {
    /// The gRPC code when the error came from a reply.
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            Error::Rpc { code, .. } => Some(*code),
            _ => None,
        }
    }
}
