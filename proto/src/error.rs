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
