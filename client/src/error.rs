//! The crate's error enum: what failed, on which key or socket.

use std::path::PathBuf;
use std::sync::Arc;

use regolith_proto::uds::pb;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `Clone`, so that one failure can answer every item of a batch it sank (the I/O errors are
/// shared by `Arc`).
#[derive(Clone, Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot connect to the sidecar at {path}: {source} (is regolith-sidecar running? set REGOLITH_SOCKET or pass the socket path)")]
    Connect {
        path: PathBuf,
        source: Arc<std::io::Error>,
    },
    #[error("sidecar at {path} refused hello: {message}")]
    Hello { path: PathBuf, message: String },
    #[error("connection to the sidecar lost: {0}")]
    Disconnected(String),
    #[error("key {key:?} not found")]
    NotFound { key: String },
    #[error("key {key:?} already exists")]
    AlreadyExists { key: String },
    #[error(
        "key {key:?}: stored bytes failed their checksum on every replica (treated as a miss)"
    )]
    Corrupt { key: String },
    #[error("key {key:?}: no space in the cache: {message}")]
    NoSpace { key: String, message: String },
    #[error("key {key:?}: buffer of {have} bytes is too small for the object ({need} bytes)")]
    BufferTooSmall { key: String, have: u64, need: u64 },
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("key {key:?}: {code:?}: {message}")]
    Server {
        key: String,
        code: pb::Code,
        message: String,
    },
    #[error("protocol error: {0}")]
    Protocol(String),
    #[error("shared memory: {0}")]
    Shm(String),
    #[error("io: {0}")]
    Io(#[source] Arc<std::io::Error>),
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(Arc::new(e))
    }
}

impl Error {
    /// The error of a per-item status (None for OK).
    pub fn of_status(key: &str, st: Option<&pb::Status>) -> Option<Error> {
        let st = st?;
        let code = pb::Code::try_from(st.code).unwrap_or(pb::Code::Internal);
        let key = key.to_string();
        Some(match code {
            pb::Code::Ok => return None,
            pb::Code::NotFound => Error::NotFound { key },
            pb::Code::AlreadyExists => Error::AlreadyExists { key },
            pb::Code::Corrupt => Error::Corrupt { key },
            pb::Code::NoSpace => Error::NoSpace {
                key,
                message: st.message.clone(),
            },
            pb::Code::InvalidArgument => Error::InvalidArgument(format!("{key:?}: {}", st.message)),
            code => Error::Server {
                key,
                code,
                message: st.message.clone(),
            },
        })
    }

    /// Whether a retry with a fresh reservation may succeed (leader change, timeout).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::Server {
                code: pb::Code::Unavailable | pb::Code::Timeout | pb::Code::Busy,
                ..
            }
        )
    }

    /// Whether the object is simply absent (a miss): not found, or failed verification.
    pub fn is_miss(&self) -> bool {
        matches!(self, Error::NotFound { .. } | Error::Corrupt { .. })
    }
}
