//! `DIR/cluster.json`: what `regolith up` started in `DIR` (addresses, sockets, logs, process
//! ids). `up` writes it; the other subcommands read their defaults from it (the metad
//! addresses, sidecar 0's socket, and `DIR/token` for metad calls).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// File name of the cluster description inside `--dir`.
pub const FILE: &str = "cluster.json";
/// File name of the cluster token inside `--dir`.
pub const TOKEN: &str = "token";
/// The Raft peer credential the metad replicas share (`--peer-token-file`), mode 0600; only
/// metad reads it.
pub const PEER_TOKEN: &str = "peer-token";
/// File name of the shell snippet with the `export REGOLITH_...` lines.
pub const ENV: &str = "env";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterFile {
    /// Process id of the `regolith up` that wrote this.
    pub up_pid: u32,
    pub token_file: PathBuf,
    pub metad: Vec<MetadEntry>,
    pub sidecars: Vec<SidecarEntry>,
    /// The cluster's TLS material (`regolith up --tls`); absent in clear.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsEntry>,
}

/// Where `regolith up --tls` keeps the CA and the certificate its CLI calls present.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TlsEntry {
    pub ca: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetadEntry {
    pub id: u64,
    pub grpc: String,
    pub http_metadata: String,
    pub metrics: String,
    pub data_dir: PathBuf,
    pub log: PathBuf,
    /// Set once the process is started.
    pub pid: Option<u32>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SidecarEntry {
    pub name: String,
    pub socket: PathBuf,
    pub nics: Vec<String>,
    pub data_port: u16,
    pub metrics: String,
    pub state_dir: PathBuf,
    pub log: PathBuf,
    pub pid: Option<u32>,
}

impl ClusterFile {
    pub fn path(dir: &Path) -> PathBuf {
        dir.join(FILE)
    }

    /// The file in `dir`, or None when there is none.
    pub fn load(dir: &Path) -> Result<Option<Self>> {
        let path = Self::path(dir);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(Error::File {
                    what: "cannot read",
                    path,
                    source,
                })
            }
        };
        serde_json::from_str(&text).map(Some).map_err(|e| {
            Error::Failed(format!(
                "{} is not a cluster file written by `regolith up` ({e})",
                path.display()
            ))
        })
    }

    /// Writes the file atomically (a temporary file renamed over it).
    pub fn save(&self, dir: &Path) -> Result<()> {
        let path = Self::path(dir);
        let text = serde_json::to_string_pretty(self)
            .map_err(|e| Error::Failed(format!("cannot encode {}: {e}", path.display())))?;
        write_atomically(&path, text.as_bytes())
    }

    pub fn metad_addrs(&self) -> Vec<String> {
        self.metad.iter().map(|m| m.grpc.clone()).collect()
    }

    /// Whether every address of `addrs` is one of this cluster's metad replicas.
    pub fn names_metad(&self, addrs: &[String]) -> bool {
        !addrs.is_empty()
            && addrs
                .iter()
                .all(|a| self.metad.iter().any(|m| &m.grpc == a))
    }
}

/// Writes `bytes` to `path` through a temporary file in the same directory and a rename, so a
/// reader never sees half a file.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "out".into());
    let tmp = path.with_file_name(format!(".{name}.tmp-{}", std::process::id()));
    let file_err = |what, source| Error::File {
        what,
        path: path.to_path_buf(),
        source,
    };
    std::fs::write(&tmp, bytes).map_err(|e| file_err("cannot write", e))?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        file_err("cannot write", e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(dir: &Path) -> ClusterFile {
        ClusterFile {
            up_pid: 1,
            token_file: dir.join(TOKEN),
            metad: (1..=3)
                .map(|id| MetadEntry {
                    id,
                    grpc: format!("127.0.0.1:{}", 50050 + id),
                    http_metadata: format!("127.0.0.1:{}", 8079 + id),
                    metrics: format!("127.0.0.1:{}", 9002 + id),
                    data_dir: dir.join(format!("metad-{id}")),
                    log: dir.join(format!("logs/metad-{id}.log")),
                    pid: None,
                })
                .collect(),
            sidecars: vec![],
            tls: None,
        }
    }

    #[test]
    fn round_trips_and_matches_addresses() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(ClusterFile::load(d.path()).unwrap(), None);
        let c = sample(d.path());
        c.save(d.path()).unwrap();
        assert_eq!(ClusterFile::load(d.path()).unwrap(), Some(c.clone()));
        assert!(c.names_metad(&["127.0.0.1:50052".into()]));
        assert!(c.names_metad(&c.metad_addrs()));
        assert!(!c.names_metad(&["127.0.0.1:50051".into(), "10.0.0.1:50051".into()]));
        assert!(!c.names_metad(&[]));
        std::fs::write(ClusterFile::path(d.path()), "{").unwrap();
        assert!(ClusterFile::load(d.path()).is_err());
    }
}
