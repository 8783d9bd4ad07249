//! regolith-e2e: a loopback cluster of real processes for end-to-end tests.
//!
//! * [`Cluster`] — three (or more) `regolith-metad` replicas and N `regolith-sidecar`s, each
//!   sidecar with two NIC addresses of its own in 127.0.0.0/8, a cluster token, temp dirs; kill,
//!   restart, `/metrics` and `/status` of every process. Everything it starts it kills on drop.
//! * The processes are the real `regolith-metad` and `regolith-sidecar` binaries of this build
//!   ([`regolith_test_support::bins`]: beside the test executable, or `$REGOLITH_BIN_DIR`),
//!   started with [`MetadLaunch`] / [`SidecarLaunch`] command lines. `cargo test --workspace`
//!   builds them before any test runs; alone, `cargo test -p regolith-e2e` needs them built
//!   first (`cargo build -p regolith-metad -p regolith-sidecar -p regolith-cli`).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use regolith_client::{Client, ClientConfig};
use regolith_proto::client::{ClientConfig as MetadConfig, MetadClient};
use regolith_proto::launch::{MetadLaunch, SidecarLaunch, TlsLaunch};
use regolith_test_support::bins;

/// The real `regolith-metad` of this build (panics, naming the `cargo build` command, when it
/// is missing).
pub fn metad_bin() -> PathBuf {
    bins::require(bins::METAD)
}

/// The real `regolith-sidecar` of this build.
pub fn sidecar_bin() -> PathBuf {
    bins::require(bins::SIDECAR)
}

/// The real `regolith` CLI of this build.
pub fn regolith_bin() -> PathBuf {
    bins::require(bins::CLI)
}

/// A current-thread runtime for the tests' async calls (metad clients).
pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Polls `f` every 20 ms until it holds; panics naming `what` after `timeout`.
pub fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("timed out after {timeout:?} waiting for {what}");
}

/// The value the tests put under `key`: bytes derived from the key, so any byte read can be
/// traced to the key that wrote it.
pub fn value(key: &str, len: usize) -> Vec<u8> {
    let seed = key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |a, b| {
        (a ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A free loopback port outside the ephemeral range (see `regolith_test_support::ports`).
pub fn free_port() -> u16 {
    regolith_test_support::free_loopback_port()
}

/// A minimal HTTP GET over a plain socket.
pub fn http_get(addr: &str, path: &str) -> std::io::Result<(u16, String)> {
    http_request(addr, "GET", path)
}

/// An empty-bodied POST (the sidecar's `--test-hooks` endpoints).
pub fn http_post(addr: &str, path: &str) -> std::io::Result<(u16, String)> {
    http_request(addr, "POST", path)
}

fn http_request(addr: &str, method: &str, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    let text = String::from_utf8_lossy(&buf).to_string();
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((code, body))
}

/// Value of a Prometheus sample line `name{labels} value` (first match of `prefix`).
pub fn metric(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

pub struct Proc {
    pub child: Option<Child>,
    pub log: PathBuf,
}

impl Proc {
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        if let Some(c) = &self.child {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), sig);
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }
}

pub struct MetadProc {
    pub id: u64,
    pub grpc: String,
    pub http: String,
    pub dir: PathBuf,
    pub proc: Proc,
}

pub struct SidecarProc {
    pub name: String,
    pub nics: Vec<String>,
    pub data_port: u16,
    pub socket: PathBuf,
    pub http: String,
    pub state_dir: PathBuf,
    pub segment_size: String,
    pub extra: Vec<String>,
    pub proc: Proc,
}

pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub metad: Vec<MetadProc>,
    pub sidecars: Vec<SidecarProc>,
    pub token_file: PathBuf,
    /// The replicas' peer credential (`--peer-token-file`), which no sidecar or client holds.
    pub peer_token_file: PathBuf,
    pub metad_bin: PathBuf,
    pub sidecar_bin: PathBuf,
    /// The cluster's mutual-TLS material when it runs TLS ([`Cluster::start_tls`]): a CA
    /// (`DIR/tls/ca.crt`) and `DIR/tls/NAME.{crt,key}` for `metad-ID`, every sidecar's name
    /// and `client`.
    pub tls_dir: Option<PathBuf>,
}

/// Sidecar `i`'s node name: node-a, node-b, …
fn sidecar_name(i: usize) -> String {
    format!("node-{}", (b'a' + i as u8) as char)
}

/// What every certificate of a TLS cluster names: loopback and every sidecar's NICs (one
/// list for all keeps the material simple; production certificates name their own host).
fn tls_sans(sidecars: usize) -> Vec<String> {
    let mut sans = vec!["127.0.0.1".to_string(), "localhost".to_string()];
    sans.extend((0..sidecars).flat_map(nic_ips));
    sans
}

/// Where a sidecar's two loopback NICs live: 127.0.<base+i>.1 and .2.
fn nic_ips(i: usize) -> Vec<String> {
    let b = 100 + i;
    vec![format!("127.0.{b}.1"), format!("127.0.{b}.2")]
}

impl Cluster {
    /// Three metad replicas and one sidecar per entry of `segment_sizes` (e.g. "256MiB", "0").
    pub fn start(segment_sizes: &[&str]) -> Self {
        Self::start_with(segment_sizes, &[], &[])
    }

    pub fn start_with(
        segment_sizes: &[&str],
        metad_extra: &[&str],
        sidecar_extra: &[&str],
    ) -> Self {
        Self::start_full(segment_sizes, metad_extra, sidecar_extra, false)
    }

    /// As [`Cluster::start_with`], with mutual TLS on gRPC (clients and Raft) and on the
    /// data plane: one CA, a certificate per process naming 127.0.0.1 and every sidecar NIC.
    pub fn start_tls(segment_sizes: &[&str], metad_extra: &[&str], sidecar_extra: &[&str]) -> Self {
        Self::start_full(segment_sizes, metad_extra, sidecar_extra, true)
    }

    fn start_full(
        segment_sizes: &[&str],
        metad_extra: &[&str],
        sidecar_extra: &[&str],
        tls: bool,
    ) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let tls_dir = tls.then(|| {
            let d = dir.path().join("tls");
            std::fs::create_dir_all(&d).expect("tls dir");
            let mut names: Vec<String> = (1..=3).map(|id| format!("metad-{id}")).collect();
            names.extend((0..segment_sizes.len()).map(sidecar_name));
            names.push("client".into());
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            regolith_proto::pki::make_cluster(&d, &names, &tls_sans(segment_sizes.len()))
                .expect("TLS material");
            d
        });
        let token_file = dir.path().join("token");
        std::fs::write(&token_file, format!("e2e-{}\n", rand::random::<u64>())).expect("token");
        // As `regolith up` does: replicas authenticate each other, and sign data-plane grants,
        // with a credential no sidecar or client holds.
        let peer_token_file = dir.path().join("peer-token");
        std::fs::write(
            &peer_token_file,
            format!("e2e-peer-{}\n", rand::random::<u64>()),
        )
        .expect("peer token");
        let mut c = Cluster {
            peer_token_file,
            metad: Vec::new(),
            sidecars: Vec::new(),
            token_file,
            metad_bin: metad_bin(),
            sidecar_bin: sidecar_bin(),
            tls_dir,
            dir,
        };
        for id in 1..=3u64 {
            c.metad.push(MetadProc {
                id,
                grpc: format!("127.0.0.1:{}", free_port()),
                http: format!("127.0.0.1:{}", free_port()),
                dir: c.dir.path().join(format!("metad-{id}")),
                proc: Proc {
                    child: None,
                    log: c.dir.path().join(format!("metad-{id}.log")),
                },
            });
        }
        let peers: Vec<(u64, String)> = c.metad.iter().map(|m| (m.id, m.grpc.clone())).collect();
        for i in 0..c.metad.len() {
            let launch = MetadLaunch {
                peers: peers.clone(),
                bootstrap: true,
                extra: metad_extra.iter().map(Into::into).collect(),
                ..c.metad_launch(i)
            };
            c.spawn_metad(i, &launch, &[("RUST_LOG", "info,regolith_metad=debug")]);
        }
        c.wait_leader(Duration::from_secs(20));
        for (i, size) in segment_sizes.iter().enumerate() {
            let name = sidecar_name(i);
            c.sidecars.push(SidecarProc {
                socket: c.dir.path().join(format!("{name}.sock")),
                http: format!("127.0.0.1:{}", free_port()),
                state_dir: c.dir.path().join(format!("{name}-state")),
                nics: nic_ips(i),
                data_port: free_port(),
                segment_size: size.to_string(),
                extra: sidecar_extra.iter().map(|s| s.to_string()).collect(),
                proc: Proc {
                    child: None,
                    log: c.dir.path().join(format!("{name}.log")),
                },
                name,
            });
            c.start_sidecar(i);
        }
        for i in 0..c.sidecars.len() {
            c.wait_sidecar(i, Duration::from_secs(30));
        }
        c
    }

    /// Replica `i`'s own flags: addresses, data dir, token; no `--peers`/`--bootstrap` (a
    /// restart of a member needs neither).
    pub fn metad_launch(&self, i: usize) -> MetadLaunch {
        let m = &self.metad[i];
        MetadLaunch {
            listen: Some(m.grpc.clone()),
            advertise: Some(m.grpc.clone()),
            metrics_addr: Some(m.http.clone()),
            worker_threads: Some(1),
            data_dir: Some(m.dir.clone()),
            cluster_token_file: Some(self.token_file.clone()),
            peer_token_file: Some(self.peer_token_file.clone()),
            tls: self.tls_launch(&format!("metad-{}", m.id)),
            tls_node_identity: self.tls_dir.is_some(),
            ..MetadLaunch::new(m.id)
        }
    }

    /// `NAME`'s TLS flags, when the cluster runs TLS.
    pub fn tls_launch(&self, name: &str) -> Option<TlsLaunch> {
        self.tls_dir.as_ref().map(|d| TlsLaunch {
            ca: d.join("ca.crt"),
            cert: d.join(format!("{name}.crt")),
            key: d.join(format!("{name}.key")),
        })
    }

    /// The client certificate's TLS (for metad calls), when the cluster runs TLS.
    pub fn client_tls(&self) -> Option<regolith_proto::tls::Tls> {
        let t = self.tls_launch("client")?;
        regolith_proto::tls::TlsArgs {
            tls_ca: Some(t.ca),
            tls_cert: Some(t.cert),
            tls_key: Some(t.key),
            ..Default::default()
        }
        .load(false)
        .expect("client TLS")
    }

    /// Starts replica `i` with `launch`'s flags and `env`, appending its stderr to its log.
    pub fn spawn_metad(&mut self, i: usize, launch: &MetadLaunch, env: &[(&str, &str)]) {
        let m = &mut self.metad[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&m.proc.log)
            .expect("log");
        let child = Command::new(&self.metad_bin)
            .args(launch.args())
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn metad");
        m.proc.child = Some(child);
    }

    pub fn metad_addrs(&self) -> String {
        self.metad
            .iter()
            .map(|m| m.grpc.clone())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// (Re)starts sidecar `i` with its persistent state dir.
    pub fn start_sidecar(&mut self, i: usize) {
        let child = self.spawn_sidecar(i, &[]);
        self.sidecars[i].proc.child = Some(child);
    }

    /// Upgrades sidecar `i` in place, as an operator would: a new process of the same binary
    /// with the same flags plus `--takeover` (and `extra`) takes the running one's segment
    /// over. Returns the old process, which exits once the hand-over is committed; the new
    /// one becomes `sidecars[i].proc`.
    pub fn upgrade_sidecar(&mut self, i: usize, extra: &[&str]) -> Proc {
        let mut flags = vec!["--takeover"];
        flags.extend_from_slice(extra);
        let child = self.spawn_sidecar(i, &flags);
        let s = &mut self.sidecars[i];
        Proc {
            child: s.proc.child.replace(child),
            log: s.proc.log.clone(),
        }
    }

    /// Spawns a process of sidecar `i` (its flags and `extra`), logging to its log.
    pub fn spawn_sidecar(&self, i: usize, extra: &[&str]) -> Child {
        self.spawn_sidecar_env(i, extra, &[])
    }

    /// [`Cluster::spawn_sidecar`] with these environment variables set too.
    pub fn spawn_sidecar_env(
        &self,
        i: usize,
        extra: &[&str],
        env: &[(&str, &std::ffi::OsStr)],
    ) -> Child {
        let metad = self.metad_addrs();
        let tls = self.tls_launch(&self.sidecars[i].name);
        let s = &self.sidecars[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&s.proc.log)
            .expect("log");
        let launch = SidecarLaunch {
            node_name: Some(s.name.clone()),
            metad: vec![metad],
            segment_size: Some(s.segment_size.clone()),
            data_port: Some(s.data_port),
            metrics_addr: Some(s.http.clone()),
            worker_threads: Some(2),
            socket: Some(s.socket.clone()),
            state_dir: Some(s.state_dir.clone()),
            cluster_token_file: Some(self.token_file.clone()),
            nics: s.nics.clone(),
            tls,
            extra: s
                .extra
                .iter()
                .map(Into::into)
                .chain(extra.iter().map(Into::into))
                .collect(),
            ..SidecarLaunch::default()
        };
        let mut cmd = Command::new(&self.sidecar_bin);
        cmd.args(launch.args())
            .env("RUST_LOG", "info,regolith_sidecar=debug")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(log);
        cmd.spawn().expect("spawn sidecar")
    }

    /// Waits until sidecar `i` accepts clients.
    pub fn wait_sidecar(&mut self, i: usize, timeout: Duration) {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            if std::os::unix::net::UnixStream::connect(&self.sidecars[i].socket).is_ok() {
                return;
            }
            if !self.sidecars[i].proc.is_running() {
                self.dump_logs();
                panic!("sidecar {} exited during start-up", self.sidecars[i].name);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.dump_logs();
        panic!(
            "sidecar {} did not serve within {timeout:?}",
            self.sidecars[i].name
        );
    }

    pub fn token(&self) -> String {
        std::fs::read_to_string(&self.token_file)
            .expect("token")
            .trim()
            .to_string()
    }

    pub fn metad_client(&self) -> MetadClient {
        let mut cfg = MetadConfig::new(self.metad.iter().map(|m| m.grpc.clone()).collect());
        cfg.token = Some(self.token());
        cfg.tls = self.client_tls();
        cfg.retry_deadline = Duration::from_secs(20);
        MetadClient::new(cfg).expect("metad client")
    }

    pub fn client(&self, i: usize) -> Client {
        Client::connect(ClientConfig::new(&self.sidecars[i].socket)).expect("connect to sidecar")
    }

    pub fn socket(&self, i: usize) -> &Path {
        &self.sidecars[i].socket
    }

    pub fn sidecar_metrics(&self, i: usize) -> String {
        http_get(&self.sidecars[i].http, "/metrics")
            .map(|(_, b)| b)
            .unwrap_or_default()
    }

    /// Sidecar `i`'s `/status` document (`Null` when it does not answer).
    pub fn sidecar_status(&self, i: usize) -> serde_json::Value {
        http_get(&self.sidecars[i].http, "/status")
            .ok()
            .and_then(|(_, b)| serde_json::from_str(&b).ok())
            .unwrap_or_default()
    }

    pub fn metad_status(&self, i: usize) -> Option<serde_json::Value> {
        let (code, body) = http_get(&self.metad[i].http, "/status").ok()?;
        (code == 200)
            .then(|| serde_json::from_str(&body).ok())
            .flatten()
    }

    /// Index (into `metad`) of the ready leader.
    pub fn wait_leader(&self, timeout: Duration) -> usize {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            for i in 0..self.metad.len() {
                if self.metad[i].proc.child.is_none() {
                    continue;
                }
                if let Some(s) = self.metad_status(i) {
                    if s["role"] == "leader" && s["leader_ready"] == true {
                        return i;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.dump_logs();
        panic!("no metad leader within {timeout:?}");
    }

    pub fn dump_logs(&self) {
        let procs = self
            .metad
            .iter()
            .map(|m| (format!("metad-{}", m.id), &m.proc.log))
            .chain(self.sidecars.iter().map(|s| (s.name.clone(), &s.proc.log)));
        for (name, log) in procs {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            eprintln!("----- {name} (last 30 lines) -----");
            for l in &lines[lines.len().saturating_sub(30)..] {
                eprintln!("{l}");
            }
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // A failing test shows what the daemons said (REGOLITH_E2E_LOGS=1 to see them).
        if std::thread::panicking() && std::env::var_os("REGOLITH_E2E_LOGS").is_some() {
            self.dump_logs();
        }
        for s in &mut self.sidecars {
            s.proc.kill();
        }
        for m in &mut self.metad {
            m.proc.kill();
        }
    }
}
