//! How to start a daemon: one typed description per daemon, turned into its command line.
//!
//! Every Rust launcher of `regolith-metad` and `regolith-sidecar` (`regolith up`, the e2e and
//! chaos harnesses, metad's integration tests and its bench) fills in a [`MetadLaunch`] or a
//! [`SidecarLaunch`] and starts the binary with [`MetadLaunch::args`] /
//! [`SidecarLaunch::args`], so the flag names live here and nowhere else on the launching side.
//! The flag names are a contract with operators' scripts: they are never renamed. The daemons'
//! own unit tests (`metad/src/args.rs`, `sidecar/src/args.rs`) parse what these produce with the
//! daemons' clap `Args`, so a flag the daemon does not accept fails there.
//!
//! A field left at its default (`None`, empty, `false`, 0) gives no flag: the daemon's own
//! default (or its `REGOLITH_*` variable, or its `--config` file) applies. `extra` is appended
//! last, verbatim, for what has no field (timings, test settings).

use std::ffi::OsString;
use std::path::PathBuf;

/// `--tls-ca`, `--tls-cert`, `--tls-key`: a daemon's mutual-TLS material.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsLaunch {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Argv {
    fn tls(&mut self, tls: Option<&TlsLaunch>) {
        if let Some(t) = tls {
            self.opt("--tls-ca", Some(t.ca.clone()));
            self.opt("--tls-cert", Some(t.cert.clone()));
            self.opt("--tls-key", Some(t.key.clone()));
        }
    }
}

/// The command line of one `regolith-metad` replica.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MetadLaunch {
    /// `--id`: the replica's Raft id (> 0).
    pub id: u64,
    /// `--listen`: gRPC listen address.
    pub listen: Option<String>,
    /// `--advertise`: the address peers and clients reach this replica at.
    pub advertise: Option<String>,
    /// `--peers ID=HOST:PORT,...`: the initial members.
    pub peers: Vec<(u64, String)>,
    /// `--bootstrap`: create the cluster from `peers`.
    pub bootstrap: bool,
    /// `--data-dir`.
    pub data_dir: Option<PathBuf>,
    /// `--metrics-addr`: HTTP `/metrics`, `/status`.
    pub metrics_addr: Option<String>,
    /// `--cluster-token-file`.
    pub cluster_token_file: Option<PathBuf>,
    /// `--peer-token-file`: the Raft peer credential, the same file on every replica.
    pub peer_token_file: Option<PathBuf>,
    /// `--enable-http-metadata-server --http-metadata-addr ADDR`: the HTTP metadata KV.
    pub http_metadata_addr: Option<String>,
    /// Mutual TLS on gRPC (clients and Raft).
    pub tls: Option<TlsLaunch>,
    /// `--tls-node-identity`: a node's calls need a certificate naming the node.
    pub tls_node_identity: bool,
    /// `--worker-threads`.
    pub worker_threads: Option<usize>,
    /// `-v` this many times.
    pub verbose: u8,
    /// Appended last, verbatim.
    pub extra: Vec<OsString>,
}

/// The command line of one `regolith-sidecar`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SidecarLaunch {
    /// `--node-name`: the node's persistent name.
    pub node_name: Option<String>,
    /// `--state-dir`: where the node's identity is kept.
    pub state_dir: Option<PathBuf>,
    /// `--segment-size`: a size (`256MiB`, or bytes; `0` for a consumer-only node).
    pub segment_size: Option<String>,
    /// `--metad HOST:PORT,...`: the metad replicas.
    pub metad: Vec<String>,
    /// `--cluster-token-file`.
    pub cluster_token_file: Option<PathBuf>,
    /// `--nic IP`, once per NIC.
    pub nics: Vec<String>,
    /// `--data-port`.
    pub data_port: Option<u16>,
    /// `--socket`: the Unix socket local clients connect to.
    pub socket: Option<PathBuf>,
    /// `--metrics-addr`: HTTP `/metrics`, `/status`.
    pub metrics_addr: Option<String>,
    /// `--huge-pages`: `auto`, `never` or `require`.
    pub huge_pages: Option<String>,
    /// Mutual TLS on the data plane and to metad.
    pub tls: Option<TlsLaunch>,
    /// `--worker-threads`.
    pub worker_threads: Option<usize>,
    /// `--test-hooks`: the test-only hooks on the metrics port.
    pub test_hooks: bool,
    /// `-v` this many times.
    pub verbose: u8,
    /// Appended last, verbatim.
    pub extra: Vec<OsString>,
}

/// Collects `--flag value` pairs and switches.
#[derive(Default)]
struct Argv(Vec<OsString>);

impl Argv {
    fn opt(&mut self, flag: &str, value: Option<impl Into<OsString>>) {
        if let Some(v) = value {
            self.0.push(flag.into());
            self.0.push(v.into());
        }
    }

    fn switch(&mut self, flag: &str, on: bool) {
        if on {
            self.0.push(flag.into());
        }
    }

    fn verbose(&mut self, n: u8) {
        self.0
            .extend(std::iter::repeat_n(OsString::from("-v"), n.into()));
    }

    fn done(mut self, extra: &[OsString]) -> Vec<OsString> {
        self.0.extend(extra.iter().cloned());
        self.0
    }
}

/// `1=HOST:PORT,2=HOST:PORT`, the value of metad's `--peers`.
pub fn peers_arg(peers: &[(u64, String)]) -> String {
    peers
        .iter()
        .map(|(id, addr)| format!("{id}={addr}"))
        .collect::<Vec<_>>()
        .join(",")
}

impl MetadLaunch {
    /// A replica with this id and nothing else set.
    pub fn new(id: u64) -> Self {
        Self {
            id,
            ..Self::default()
        }
    }

    /// The arguments after the program name.
    pub fn args(&self) -> Vec<OsString> {
        let mut a = Argv::default();
        a.opt("--id", Some(self.id.to_string()));
        a.opt("--listen", self.listen.clone());
        a.opt("--advertise", self.advertise.clone());
        a.opt(
            "--peers",
            (!self.peers.is_empty()).then(|| peers_arg(&self.peers)),
        );
        a.switch("--bootstrap", self.bootstrap);
        a.opt("--data-dir", self.data_dir.clone());
        a.opt("--metrics-addr", self.metrics_addr.clone());
        a.opt("--cluster-token-file", self.cluster_token_file.clone());
        a.opt("--peer-token-file", self.peer_token_file.clone());
        a.switch(
            "--enable-http-metadata-server",
            self.http_metadata_addr.is_some(),
        );
        a.opt("--http-metadata-addr", self.http_metadata_addr.clone());
        a.tls(self.tls.as_ref());
        a.switch("--tls-node-identity", self.tls_node_identity);
        a.opt(
            "--worker-threads",
            self.worker_threads.map(|n| n.to_string()),
        );
        a.verbose(self.verbose);
        a.done(&self.extra)
    }
}

impl SidecarLaunch {
    /// The arguments after the program name.
    pub fn args(&self) -> Vec<OsString> {
        let mut a = Argv::default();
        a.opt("--node-name", self.node_name.clone());
        a.opt("--state-dir", self.state_dir.clone());
        a.opt("--segment-size", self.segment_size.clone());
        a.opt(
            "--metad",
            (!self.metad.is_empty()).then(|| self.metad.join(",")),
        );
        a.opt("--cluster-token-file", self.cluster_token_file.clone());
        for nic in &self.nics {
            a.opt("--nic", Some(nic.clone()));
        }
        a.opt("--data-port", self.data_port.map(|p| p.to_string()));
        a.opt("--socket", self.socket.clone());
        a.opt("--metrics-addr", self.metrics_addr.clone());
        a.opt("--huge-pages", self.huge_pages.clone());
        a.tls(self.tls.as_ref());
        a.opt(
            "--worker-threads",
            self.worker_threads.map(|n| n.to_string()),
        );
        a.switch("--test-hooks", self.test_hooks);
        a.verbose(self.verbose);
        a.done(&self.extra)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strs(a: Vec<OsString>) -> Vec<String> {
        a.into_iter().map(|a| a.into_string().unwrap()).collect()
    }

    #[test]
    fn unset_fields_give_no_flags_and_extra_comes_last() {
        assert_eq!(strs(MetadLaunch::new(3).args()), ["--id", "3"]);
        assert!(SidecarLaunch::default().args().is_empty());
        let m = MetadLaunch {
            peers: vec![(1, "h:1".into()), (2, "h:2".into())],
            bootstrap: true,
            http_metadata_addr: Some("h:8080".into()),
            verbose: 2,
            extra: vec!["--node-ttl".into(), "4s".into()],
            ..MetadLaunch::new(1)
        };
        assert_eq!(
            strs(m.args()),
            [
                "--id",
                "1",
                "--peers",
                "1=h:1,2=h:2",
                "--bootstrap",
                "--enable-http-metadata-server",
                "--http-metadata-addr",
                "h:8080",
                "-v",
                "-v",
                "--node-ttl",
                "4s"
            ]
        );
        let s = SidecarLaunch {
            metad: vec!["a:1".into(), "b:2".into()],
            nics: vec!["127.0.0.2".into(), "127.0.0.3".into()],
            test_hooks: true,
            ..SidecarLaunch::default()
        };
        assert_eq!(
            strs(s.args()),
            [
                "--metad",
                "a:1,b:2",
                "--nic",
                "127.0.0.2",
                "--nic",
                "127.0.0.3",
                "--test-hooks"
            ]
        );
    }
}
