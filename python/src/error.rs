//! The crate's one error type, the Python exception classes it becomes, and Mooncake's error
//! codes (carried by every exception as `code`, returned by `regolith.mooncake`).

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use regolith_client::{pb, Error as ClientError};

create_exception!(
    regolith,
    RegolithError,
    PyException,
    "Base class of Regolith errors. Attributes: `key` (the key concerned, or None), `reason` \
     (a short reason) and `code` (Mooncake's error code, e.g. -704)."
);
create_exception!(
    regolith,
    NotFoundError,
    RegolithError,
    "The key is not in the cache (Mooncake -704)."
);
create_exception!(
    regolith,
    CorruptError,
    NotFoundError,
    "The stored bytes failed their checksum on every replica: a miss, never data."
);
create_exception!(
    regolith,
    AlreadyExistsError,
    RegolithError,
    "The key exists already; objects are immutable (Mooncake -705)."
);
create_exception!(
    regolith,
    NoSpaceError,
    RegolithError,
    "The cache has no room for the object, even after eviction."
);
create_exception!(
    regolith,
    BufferTooSmallError,
    RegolithError,
    "The destination is smaller than the object."
);
create_exception!(
    regolith,
    InvalidArgumentError,
    RegolithError,
    "A bad argument: unregistered address, mismatched batch lengths, bad key."
);
create_exception!(
    regolith,
    ConnectError,
    RegolithError,
    "No sidecar answers at the socket."
);
create_exception!(
    regolith,
    DisconnectedError,
    RegolithError,
    "The connection to the sidecar was lost."
);
create_exception!(
    regolith,
    ClosedError,
    RegolithError,
    "The client (or store) is closed."
);
create_exception!(
    regolith,
    UnavailableError,
    RegolithError,
    "metad or a replica could not be reached in time (retryable)."
);
create_exception!(
    regolith,
    InternalError,
    RegolithError,
    "An internal or protocol error."
);

/// Mooncake Store's error codes (`mooncake-store/include/types.h`) that Regolith answers with.
pub mod codes {
    pub const OK: i32 = 0;
    pub const INTERNAL_ERROR: i32 = -1;
    pub const BUFFER_OVERFLOW: i32 = -10;
    pub const NO_AVAILABLE_HANDLE: i32 = -200;
    pub const INVALID_PARAMS: i32 = -600;
    pub const OBJECT_NOT_FOUND: i32 = -704;
    pub const OBJECT_ALREADY_EXISTS: i32 = -705;
    pub const TRANSFER_FAIL: i32 = -800;
    pub const RPC_FAIL: i32 = -900;
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("the Regolith client is closed")]
    Closed,
    #[error(
        "address {addr:#x} (+{len} bytes) lies in no registered buffer and no alloc_buffer \
         region: register the memory first with register_buffer(address, size)"
    )]
    BadAddress { addr: usize, len: usize },
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

impl Error {
    /// The key the error is about, when there is one.
    pub fn key(&self) -> Option<&str> {
        match self {
            Error::Client(
                ClientError::NotFound { key }
                | ClientError::AlreadyExists { key }
                | ClientError::Corrupt { key }
                | ClientError::NoSpace { key, .. }
                | ClientError::BufferTooSmall { key, .. }
                | ClientError::Server { key, .. },
            ) if !key.is_empty() => Some(key),
            _ => None,
        }
    }

    /// A short reason, without the key.
    pub fn reason(&self) -> String {
        match self {
            Error::Client(e) => client_reason(e),
            Error::Closed => "closed".into(),
            Error::BadAddress { .. } => "address not registered".into(),
            Error::InvalidArgument(m) => m.clone(),
        }
    }

    /// Mooncake's code for this error.
    pub fn mooncake_code(&self) -> i32 {
        match self {
            Error::Client(e) => client_code(e),
            Error::Closed => codes::INTERNAL_ERROR,
            Error::BadAddress { .. } | Error::InvalidArgument(_) => codes::INVALID_PARAMS,
        }
    }

    /// The Python exception, with `key`, `reason` and `code` set on it.
    pub fn into_pyerr(self, py: Python<'_>) -> PyErr {
        let err = self.exception();
        let value = err.value(py);
        // Attribute assignment on a fresh exception instance cannot fail short of memory
        // exhaustion; the exception is still raised without them then.
        let _ = value.setattr("key", self.key());
        let _ = value.setattr("reason", self.reason());
        let _ = value.setattr("code", self.mooncake_code());
        err
    }

    fn exception(&self) -> PyErr {
        let msg = self.to_string();
        match self {
            Error::Client(e) => client_exception(e, msg),
            Error::Closed => ClosedError::new_err(msg),
            Error::BadAddress { .. } | Error::InvalidArgument(_) => {
                InvalidArgumentError::new_err(msg)
            }
        }
    }
}

fn client_reason(e: &ClientError) -> String {
    match e {
        ClientError::NotFound { .. } => "not found".into(),
        ClientError::AlreadyExists { .. } => "already exists".into(),
        ClientError::Corrupt { .. } => "checksum mismatch on every replica".into(),
        ClientError::NoSpace { message, .. } => format!("no space: {message}"),
        ClientError::BufferTooSmall { have, need, .. } => {
            format!("buffer too small: {have} bytes for an object of {need}")
        }
        ClientError::Server { code, message, .. } => format!("{code:?}: {message}"),
        ClientError::Connect { source, .. } => format!("cannot connect: {source}"),
        other => other.to_string(),
    }
}

fn client_code(e: &ClientError) -> i32 {
    match e {
        ClientError::NotFound { .. } | ClientError::Corrupt { .. } => codes::OBJECT_NOT_FOUND,
        ClientError::AlreadyExists { .. } => codes::OBJECT_ALREADY_EXISTS,
        ClientError::NoSpace { .. } => codes::NO_AVAILABLE_HANDLE,
        ClientError::BufferTooSmall { .. } => codes::BUFFER_OVERFLOW,
        ClientError::InvalidArgument(_) => codes::INVALID_PARAMS,
        ClientError::Connect { .. } | ClientError::Hello { .. } | ClientError::Disconnected(_) => {
            codes::RPC_FAIL
        }
        ClientError::Server { code, .. } => server_code(*code),
        _ => codes::INTERNAL_ERROR,
    }
}

fn server_code(code: pb::Code) -> i32 {
    match code {
        pb::Code::Unavailable | pb::Code::Busy => codes::RPC_FAIL,
        pb::Code::Timeout => codes::TRANSFER_FAIL,
        pb::Code::NeedSpace => codes::BUFFER_OVERFLOW,
        pb::Code::InvalidArgument => codes::INVALID_PARAMS,
        _ => codes::INTERNAL_ERROR,
    }
}

fn client_exception(e: &ClientError, msg: String) -> PyErr {
    match e {
        ClientError::NotFound { .. } => NotFoundError::new_err(msg),
        ClientError::Corrupt { .. } => CorruptError::new_err(msg),
        ClientError::AlreadyExists { .. } => AlreadyExistsError::new_err(msg),
        ClientError::NoSpace { .. } => NoSpaceError::new_err(msg),
        ClientError::BufferTooSmall { .. } => BufferTooSmallError::new_err(msg),
        ClientError::InvalidArgument(_) => InvalidArgumentError::new_err(msg),
        ClientError::Connect { .. } | ClientError::Hello { .. } => ConnectError::new_err(msg),
        ClientError::Disconnected(_) => DisconnectedError::new_err(msg),
        ClientError::Server { code, .. } => server_exception(*code, msg),
        _ => InternalError::new_err(msg),
    }
}

fn server_exception(code: pb::Code, msg: String) -> PyErr {
    match code {
        pb::Code::Unavailable | pb::Code::Timeout | pb::Code::Busy => {
            UnavailableError::new_err(msg)
        }
        pb::Code::NeedSpace => BufferTooSmallError::new_err(msg),
        pb::Code::InvalidArgument => InvalidArgumentError::new_err(msg),
        _ => InternalError::new_err(msg),
    }
}

impl From<Error> for PyErr {
    fn from(e: Error) -> PyErr {
        Python::attach(|py| e.into_pyerr(py))
    }
}

/// Registers the exception classes on the module, with class-level defaults of `key`,
/// `reason` and `code` (so that exceptions raised from Python code carry them too).
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let classes = [
        (
            "RegolithError",
            py.get_type::<RegolithError>(),
            codes::INTERNAL_ERROR,
        ),
        (
            "NotFoundError",
            py.get_type::<NotFoundError>(),
            codes::OBJECT_NOT_FOUND,
        ),
        (
            "CorruptError",
            py.get_type::<CorruptError>(),
            codes::OBJECT_NOT_FOUND,
        ),
        (
            "AlreadyExistsError",
            py.get_type::<AlreadyExistsError>(),
            codes::OBJECT_ALREADY_EXISTS,
        ),
        (
            "NoSpaceError",
            py.get_type::<NoSpaceError>(),
            codes::NO_AVAILABLE_HANDLE,
        ),
        (
            "BufferTooSmallError",
            py.get_type::<BufferTooSmallError>(),
            codes::BUFFER_OVERFLOW,
        ),
        (
            "InvalidArgumentError",
            py.get_type::<InvalidArgumentError>(),
            codes::INVALID_PARAMS,
        ),
        (
            "ConnectError",
            py.get_type::<ConnectError>(),
            codes::RPC_FAIL,
        ),
        (
            "DisconnectedError",
            py.get_type::<DisconnectedError>(),
            codes::RPC_FAIL,
        ),
        (
            "ClosedError",
            py.get_type::<ClosedError>(),
            codes::INTERNAL_ERROR,
        ),
        (
            "UnavailableError",
            py.get_type::<UnavailableError>(),
            codes::RPC_FAIL,
        ),
        (
            "InternalError",
            py.get_type::<InternalError>(),
            codes::INTERNAL_ERROR,
        ),
    ];
    for (name, class, code) in classes {
        class.setattr("key", py.None())?;
        class.setattr("reason", py.None())?;
        class.setattr("code", code)?;
        m.add(name, class)?;
    }
    Ok(())
}
