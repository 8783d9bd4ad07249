//! The crate's error enum and the exit code each error maps to.
//!
//! Exit codes (a contract: operators' scripts test them): 0 ok, 1 the operation failed (a key
//! not found, a sidecar or metad unreachable, a file unreadable), 2 a usage error (bad flags or
//! values).

use std::path::PathBuf;
use std::process::ExitCode;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad flags or values: exit code 2.
    #[error("{0}")]
    Usage(String),
    /// A sidecar call failed (through `--socket`).
    #[error("{0}")]
    Sidecar(#[from] regolith_client::Error),
    /// A metad call failed (through `--metad`).
    #[error("{}", metad_message(.0))]
    Metad(#[from] regolith_proto::Error),
    #[error("{what} {}: {source}", .path.display())]
    File {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot find the {name} binary (looked {looked}); build it with `cargo build --release -p regolith-metad -p regolith-sidecar`, or pass {flag} PATH")]
    MissingBinary {
        name: &'static str,
        looked: String,
        flag: &'static str,
    },
    /// `regolith up` could not bring the cluster up.
    #[error("{0}")]
    Startup(String),
    /// Something else that failed (a message for the operator).
    #[error("{0}")]
    Failed(String),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

impl Error {
    pub fn usage(msg: impl Into<String>) -> Self {
        Error::Usage(msg.into())
    }

    pub fn exit_code(&self) -> ExitCode {
        match self {
            Error::Usage(_) => ExitCode::from(2),
            _ => ExitCode::FAILURE,
        }
    }
}

/// A metad error, with a hint when the cause is probably the cluster token.
fn metad_message(e: &regolith_proto::Error) -> String {
    match e.code() {
        Some(tonic::Code::Unauthenticated | tonic::Code::PermissionDenied) => format!(
            "{e} (metad refused the cluster token: pass --cluster-token-file FILE or set REGOLITH_CLUSTER_TOKEN_FILE; `regolith up` writes DIR/token)"
        ),
        _ => e.to_string(),
    }
}
