//! [`Ctx`]: what a subcommand talks to, resolved from flags, `REGOLITH_*` variables and the
//! `regolith up` cluster in `--dir`.
//!
//! * socket: `--socket` / `REGOLITH_SOCKET`, else sidecar 0 of `DIR/cluster.json`, else
//!   `/run/regolith/sidecar.sock`.
//! * metad: `--metad` / `REGOLITH_METAD`, else the replicas of `DIR/cluster.json`, else
//!   `127.0.0.1:50051`.
//! * token: `--cluster-token-file` / `REGOLITH_CLUSTER_TOKEN_FILE`, else the `token` of the
//!   `regolith up` cluster (in `--dir`, or in the directory of `--socket`) whose replicas the
//!   metad addresses name, else none. The token is never sent to a cluster it was not made for.
//! * TLS: `--tls-ca` (with `--tls-cert`/`--tls-key`) / `REGOLITH_TLS_*`, else the CA and
//!   client certificate of the `regolith up --tls` cluster that the metad addresses name,
//!   else clear.

use std::future::Future;
use std::path::{Path, PathBuf};

use regolith_client::{Client, ClientConfig};
use regolith_proto::client::{parse_addrs, ClientConfig as MetadConfig, MetadClient};
use regolith_proto::tls::{Tls, TlsArgs};

use crate::args::Global;
use crate::cluster_file::{ClusterFile, TOKEN};
use crate::error::{Error, Result};

/// metad's address when nothing else names one.
pub const DEFAULT_METAD: &str = "127.0.0.1:50051";

#[derive(Debug, Clone)]
pub struct Ctx {
    pub global: Global,
    /// `--metad` addresses (after the subcommand, else before it).
    pub metad: Option<String>,
}

impl Ctx {
    pub fn new(global: Global, metad: Option<String>) -> Self {
        Self { global, metad }
    }

    /// The cluster file in `dir`, when there is a readable one.
    fn cluster_in(dir: &Path) -> Option<ClusterFile> {
        match ClusterFile::load(dir) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "ignoring the cluster file");
                None
            }
        }
    }

    /// The `regolith up` cluster of `--dir`, if any.
    pub fn cluster(&self) -> Option<ClusterFile> {
        Self::cluster_in(&self.global.dir)
    }

    pub fn socket(&self) -> PathBuf {
        if let Some(s) = &self.global.socket {
            return s.clone();
        }
        self.cluster()
            .and_then(|c| c.sidecars.first().map(|s| s.socket.clone()))
            .unwrap_or_else(|| PathBuf::from(regolith_client::DEFAULT_SOCKET))
    }

    /// Connects to the sidecar of [`Ctx::socket`].
    pub fn sidecar(&self) -> Result<Client> {
        Ok(Client::connect(ClientConfig::new(self.socket()))?)
    }

    pub fn metad_addrs(&self) -> Result<Vec<String>> {
        if let Some(list) = &self.metad {
            return parse_addrs(list).map_err(|e| Error::usage(format!("--metad: {e}")));
        }
        Ok(self
            .cluster()
            .map(|c| c.metad_addrs())
            .filter(|a| !a.is_empty())
            .unwrap_or_else(|| vec![DEFAULT_METAD.to_string()]))
    }

    /// The cluster token for `addrs` (see the module doc for where it comes from).
    pub fn token(&self, addrs: &[String]) -> Result<Option<String>> {
        if let Some(f) = &self.global.cluster_token_file {
            return read_token(f).map(Some);
        }
        let mut dirs = vec![self.global.dir.clone()];
        if let Some(parent) = self.global.socket.as_deref().and_then(Path::parent) {
            dirs.push(parent.to_path_buf());
        }
        for dir in dirs {
            let Some(c) = Self::cluster_in(&dir) else {
                continue;
            };
            if !c.names_metad(addrs) {
                continue;
            }
            let file = if c.token_file.is_absolute() {
                c.token_file.clone()
            } else {
                dir.join(TOKEN)
            };
            if file.exists() {
                tracing::debug!(file = %file.display(), "using the token of the regolith up cluster");
                return read_token(&file).map(Some);
            }
        }
        Ok(None)
    }

    /// TLS for metad calls to `addrs`: the `--tls-*` flags, else the material of the
    /// `regolith up --tls` cluster whose replicas `addrs` names, else none (clear).
    pub fn tls(&self, addrs: &[String]) -> Result<Option<Tls>> {
        let g = &self.global;
        let mut flags = TlsArgs {
            tls_ca: g.tls_ca.clone(),
            tls_cert: g.tls_cert.clone(),
            tls_key: g.tls_key.clone(),
            tls_server_name: g.tls_server_name.clone(),
            tls_reload_interval: None,
        };
        if flags.tls_ca.is_none() {
            let up = self.cluster().filter(|c| c.names_metad(addrs));
            if let Some(t) = up.and_then(|c| c.tls) {
                flags.tls_ca = Some(t.ca);
                if flags.tls_cert.is_none() && flags.tls_key.is_none() {
                    flags.tls_cert = Some(t.client_cert);
                    flags.tls_key = Some(t.client_key);
                }
            }
        }
        flags.load(false).map_err(|e| Error::usage(e.to_string()))
    }

    /// A metad client for the resolved addresses, token and TLS.
    pub fn metad_client(&self) -> Result<Metad> {
        let addrs = self.metad_addrs()?;
        let token = self.token(&addrs)?;
        let tls = self.tls(&addrs)?;
        Metad::connect(addrs, token, tls, self.global.timeout)
    }

    /// The same client, for a caller that runs its own runtime (`bench`); made inside it.
    pub fn metad_async(&self) -> Result<MetadClient> {
        let addrs = self.metad_addrs()?;
        let token = self.token(&addrs)?;
        let tls = self.tls(&addrs)?;
        Ok(MetadClient::new(metad_config(
            addrs,
            token,
            tls,
            self.global.timeout,
        ))?)
    }
}

fn metad_config(
    addrs: Vec<String>,
    token: Option<String>,
    tls: Option<Tls>,
    retry: std::time::Duration,
) -> MetadConfig {
    let mut cfg = MetadConfig::new(addrs);
    cfg.token = token;
    cfg.tls = tls;
    cfg.retry_deadline = retry;
    cfg.request_timeout = retry.clamp(
        std::time::Duration::from_millis(100),
        std::time::Duration::from_secs(5),
    );
    cfg
}

fn read_token(path: &Path) -> Result<String> {
    regolith_proto::auth::read_token_file(path).map_err(|e| Error::Failed(e.to_string()))
}

/// A [`MetadClient`] with the runtime its calls run on.
pub struct Metad {
    rt: tokio::runtime::Runtime,
    client: MetadClient,
}

impl Metad {
    pub fn connect(
        addrs: Vec<String>,
        token: Option<String>,
        tls: Option<Tls>,
        retry: std::time::Duration,
    ) -> Result<Self> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let client = MetadClient::new(metad_config(addrs, token, tls, retry))?;
        Ok(Self { rt, client })
    }

    pub fn client(&self) -> &MetadClient {
        &self.client
    }

    /// Runs a call to completion.
    pub fn block_on<F: Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster_file::{MetadEntry, SidecarEntry};
    use std::time::Duration;

    fn global(dir: &Path) -> Global {
        Global {
            socket: None,
            cluster_token_file: None,
            tls_ca: None,
            tls_cert: None,
            tls_key: None,
            tls_server_name: None,
            dir: dir.to_path_buf(),
            timeout: Duration::from_secs(1),
            verbose: 0,
        }
    }

    fn write_cluster(dir: &Path) {
        std::fs::write(dir.join(TOKEN), "secret-1\n").unwrap();
        ClusterFile {
            up_pid: 1,
            token_file: dir.join(TOKEN),
            metad: vec![MetadEntry {
                id: 1,
                grpc: "127.0.0.1:41000".into(),
                http_metadata: "127.0.0.1:41010".into(),
                metrics: "127.0.0.1:41020".into(),
                data_dir: dir.join("metad-1"),
                log: dir.join("metad-1.log"),
                pid: None,
            }],
            sidecars: vec![SidecarEntry {
                name: "node-0".into(),
                socket: dir.join("node-0.sock"),
                nics: vec!["127.0.10.1".into()],
                data_port: 41040,
                metrics: "127.0.0.1:41030".into(),
                state_dir: dir.join("node-0"),
                log: dir.join("node-0.log"),
                pid: None,
            }],
            tls: None,
        }
        .save(dir)
        .unwrap();
    }

    #[test]
    fn defaults_come_from_the_up_cluster() {
        let d = tempfile::tempdir().unwrap();
        let ctx = Ctx::new(global(d.path()), None);
        assert_eq!(ctx.metad_addrs().unwrap(), vec![DEFAULT_METAD.to_string()]);
        assert_eq!(ctx.socket(), PathBuf::from(regolith_client::DEFAULT_SOCKET));
        assert_eq!(ctx.token(&ctx.metad_addrs().unwrap()).unwrap(), None);
        write_cluster(d.path());
        let addrs = ctx.metad_addrs().unwrap();
        assert_eq!(addrs, vec!["127.0.0.1:41000".to_string()]);
        assert_eq!(ctx.socket(), d.path().join("node-0.sock"));
        assert_eq!(ctx.token(&addrs).unwrap().as_deref(), Some("secret-1"));
        // Another cluster's addresses never get this token.
        assert_eq!(ctx.token(&["10.1.1.1:50051".into()]).unwrap(), None);
    }

    #[test]
    fn the_socket_directory_finds_the_token_too() {
        let d = tempfile::tempdir().unwrap();
        write_cluster(d.path());
        let elsewhere = tempfile::tempdir().unwrap();
        let mut g = global(elsewhere.path());
        g.socket = Some(d.path().join("node-0.sock"));
        let ctx = Ctx::new(g, Some("127.0.0.1:41000".into()));
        let addrs = ctx.metad_addrs().unwrap();
        assert_eq!(ctx.token(&addrs).unwrap().as_deref(), Some("secret-1"));
    }

    #[test]
    fn flags_win_and_bad_ones_say_so() {
        let d = tempfile::tempdir().unwrap();
        write_cluster(d.path());
        let tok = d.path().join("other-token");
        std::fs::write(&tok, "flag-token").unwrap();
        let mut g = global(d.path());
        g.cluster_token_file = Some(tok);
        let ctx = Ctx::new(g, Some("h:1,h:2".into()));
        assert_eq!(ctx.metad_addrs().unwrap(), vec!["h:1", "h:2"]);
        assert_eq!(ctx.token(&[]).unwrap().as_deref(), Some("flag-token"));
        let bad = Ctx::new(global(d.path()), Some("nohost".into()));
        assert!(matches!(bad.metad_addrs().unwrap_err(), Error::Usage(_)));
        let mut g = global(d.path());
        g.cluster_token_file = Some(d.path().join("missing"));
        let e = Ctx::new(g, None).token(&[]).unwrap_err().to_string();
        assert!(e.contains("missing"), "{e}");
    }
}
