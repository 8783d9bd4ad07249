//! The crate's one error enum.

use std::path::PathBuf;

/// Everything the harness can fail with. Anomalies found by the checker are not errors: they
/// are findings, reported by [`crate::checker::Report`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The machine cannot run the suite (not root, a tool missing). Tests fail with this rather
    /// than skip, so a CI image without the tools is noticed.
    #[error("chaos suite precondition failed: {0}")]
    Precondition(String),

    /// An external command (`ip`, `nft`) failed.
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        command: String,
        status: String,
        stderr: String,
    },

    #[error("I/O error on {what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },

    /// A system call (setns, kill) failed.
    #[error("{what}: {source}")]
    Sys {
        what: String,
        #[source]
        source: nix::Error,
    },

    #[error("metad client: {0}")]
    Metad(#[from] regolith_proto::Error),

    /// A daemon did not come up, no leader was elected, and the like.
    #[error("cluster: {0}")]
    Cluster(String),

    /// The message names the `cargo build` command that makes the binary.
    #[error("{}", missing_binary(.0))]
    MissingBinary(PathBuf),

    #[error("bad argument: {0}")]
    Config(String),
}

impl Error {
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            what: what.into(),
            source,
        }
    }

    pub fn sys(what: impl Into<String>, source: nix::Error) -> Self {
        Error::Sys {
            what: what.into(),
            source,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

fn missing_binary(p: &std::path::Path) -> String {
    let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
    regolith_test_support::bins::missing(name.as_deref().unwrap_or("binary"), p)
}
