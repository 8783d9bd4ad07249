//! Flags of `regolith-sidecar` (clap), the optional TOML file (`--config`) and `REGOLITH_*`
//! environment variables. Precedence: flag, then environment, then file, then default.
//! Mooncake's spellings are accepted where they mean the same (`--global_segment_size`,
//! `--master_server_address`).

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use regolith_proto::units::{parse_duration, parse_size};
use serde::Deserialize;

use crate::error::{Error, Result};
use crate::segment::HugePages;

#[derive(Parser, Debug, Default, Clone)]
#[command(
    name = "regolith-sidecar",
    version,
    about = "Regolith's per-node sidecar: owns the node's memory segment"
)]
pub struct Args {
    /// Persistent name of this node (default: the host name).
    #[arg(long, env = "REGOLITH_NODE_NAME")]
    pub node_name: Option<String>,
    /// Where the node's identity (name, id) is kept.
    #[arg(long, env = "REGOLITH_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// Memory this node contributes, e.g. 20GiB (0: a consumer-only node).
    #[arg(long, alias = "global_segment_size", env = "REGOLITH_SEGMENT_SIZE")]
    pub segment_size: Option<String>,
    /// metad replicas, HOST:PORT,HOST:PORT,...
    #[arg(long, alias = "master_server_address", env = "REGOLITH_METAD")]
    pub metad: Option<String>,
    #[arg(long, env = "REGOLITH_CLUSTER_TOKEN_FILE")]
    pub cluster_token_file: Option<PathBuf>,
    /// Data-plane address of one NIC (repeatable).
    #[arg(long = "nic", env = "REGOLITH_NIC", value_delimiter = ',')]
    pub nics: Vec<String>,
    #[arg(long, env = "REGOLITH_DATA_PORT")]
    pub data_port: Option<u16>,
    /// Slice size of transfers (a multiple of 64 KiB), e.g. 1MiB.
    #[arg(long, env = "REGOLITH_SLICE_SIZE")]
    pub slice_size: Option<String>,
    /// Connections per (local NIC, remote NIC) pair.
    #[arg(long, env = "REGOLITH_CONNS_PER_NIC_PAIR")]
    pub conns_per_nic_pair: Option<usize>,
    /// Data-plane transport: auto (RDMA to peers where both ends have an active port, TCP
    /// elsewhere), tcp, or rdma (RDMA or nothing). docs/rdma.md.
    #[arg(long, env = "REGOLITH_TRANSPORT")]
    pub transport: Option<String>,
    /// An RDMA device to use, e.g. mlx5_0 (repeatable or comma-separated, in rail order).
    /// Default: every device with an active port.
    #[arg(
        long = "rdma-device",
        env = "REGOLITH_RDMA_DEVICE",
        value_delimiter = ','
    )]
    pub rdma_devices: Vec<String>,
    /// Memory the staging windows of peers' RDMA writes may take together, e.g. 256MiB.
    #[arg(long, env = "REGOLITH_RDMA_STAGING_BYTES")]
    pub rdma_staging_bytes: Option<String>,
    /// The Unix socket local clients connect to.
    #[arg(long, env = "REGOLITH_SOCKET")]
    pub socket: Option<PathBuf>,
    /// Group owning the socket (mode 0660): every process of this group can use the cache.
    #[arg(long, env = "REGOLITH_SOCKET_GROUP")]
    pub socket_group: Option<String>,
    /// HTTP address of /metrics, /health, /status.
    #[arg(long, env = "REGOLITH_METRICS_ADDR")]
    pub metrics_addr: Option<String>,
    /// Unix socket on which this sidecar hands its segment, listeners and state to a
    /// successor started with --takeover (mode 0600, same user only). Default: the --socket
    /// path with `.handover` appended.
    #[arg(long, env = "REGOLITH_HANDOVER_SOCKET")]
    pub handover_socket: Option<PathBuf>,
    /// Take over the segment (the cache), the listeners and the generation of the sidecar
    /// running on --handover-socket instead of mounting a new segment (an upgrade that keeps
    /// the cache); fails if no sidecar answers there.
    #[arg(long, env = "REGOLITH_TAKEOVER", value_parser = clap::builder::BoolishValueParser::new())]
    pub takeover: bool,
    /// Take over like --takeover when a sidecar answers on --handover-socket, else mount as
    /// usual (a DaemonSet pod that may start beside its predecessor, or alone).
    #[arg(long, env = "REGOLITH_TAKEOVER_IF_RUNNING", value_parser = clap::builder::BoolishValueParser::new())]
    pub takeover_if_running: bool,
    /// What this sidecar does once it has handed over: `exit` (0), or `wait` for SIGTERM
    /// doing nothing (a Kubernetes pod whose container must not end, or it would be restarted).
    #[arg(long, env = "REGOLITH_AFTER_HANDOVER")]
    pub after_handover: Option<String>,
    /// Drain this node (no new placements) before unmounting on SIGTERM.
    #[arg(long, env = "REGOLITH_DRAIN_ON_EXIT")]
    pub drain_on_exit: bool,
    /// How long a drain on exit may take.
    #[arg(long, env = "REGOLITH_DRAIN_TIMEOUT")]
    pub drain_timeout: Option<String>,
    /// Default staging area per client connection, e.g. 64MiB.
    #[arg(long, env = "REGOLITH_STAGING_SIZE")]
    pub staging_size: Option<String>,
    /// Requests one client connection may have in flight.
    #[arg(long, env = "REGOLITH_MAX_IN_FLIGHT")]
    pub max_in_flight: Option<u32>,
    /// After each request, how long (µs) a client connection keeps polling for the next one
    /// before it sleeps: a back-to-back request then costs no wake-up. 0 sleeps at once.
    #[arg(long, env = "REGOLITH_UDS_SPIN_US")]
    pub uds_spin_us: Option<u64>,
    /// Client connections served at once on the socket; more are refused with BUSY.
    #[arg(long, env = "REGOLITH_MAX_CLIENTS")]
    pub max_clients: Option<usize>,
    /// Time limit of one transfer, e.g. 30s.
    #[arg(long, env = "REGOLITH_TRANSFER_TIMEOUT")]
    pub transfer_timeout: Option<String>,
    /// `auto`, `never` or `require`.
    #[arg(long, env = "REGOLITH_HUGE_PAGES")]
    pub huge_pages: Option<String>,
    /// Runtime worker threads (default: one per core).
    #[arg(long, env = "REGOLITH_WORKER_THREADS")]
    pub worker_threads: Option<usize>,
    /// Keep the object index (metadata at the node; on by default, `--index=false` turns it
    /// off): exists of present keys and most gets are answered without a metad round trip; a
    /// remove made through another node may show up to 2 s late (docs/sidecar.md, "The object
    /// index").
    #[arg(
        long,
        env = "REGOLITH_INDEX",
        value_name = "BOOL",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub index: Option<bool>,
    /// A disk of this node's disk tier, `PATH[:SIZE]` (repeatable, or comma-separated): one
    /// directory per device; SIZE caps what Regolith uses there (default: the file system's
    /// free space less 5 %, at least 1 GiB kept free). docs/ssd.md.
    #[arg(long = "disk", env = "REGOLITH_DISK", value_delimiter = ',')]
    pub disks: Vec<String>,
    /// Enable test hooks on the metrics port (`POST /debug/close-nic?ip=IP` closes that NIC's
    /// data-plane listener and connections). For tests only.
    #[arg(long, hide = true, env = "REGOLITH_TEST_HOOKS")]
    pub test_hooks: bool,
    /// TOML file with any of these settings (keys are the flag names with `_`).
    /// Mutual TLS on the data plane (served and dialled) and to metad: --tls-ca, --tls-cert,
    /// --tls-key.
    #[command(flatten)]
    pub tls: regolith_proto::tls::TlsArgs,
    #[arg(long, env = "REGOLITH_CONFIG")]
    pub config: Option<PathBuf>,
    #[arg(short = 'v', long = "verbose", action = clap::ArgAction::Count)]
    pub verbose: u8,
    #[arg(long, env = "REGOLITH_LOG_FORMAT")]
    pub log_format: Option<String>,
}

/// Default of `--uds-spin-us`.
pub const DEFAULT_UDS_SPIN_US: u64 = 50;
/// Largest `--uds-spin-us`.
pub const MAX_UDS_SPIN_US: u64 = 1_000;

#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub node_name: Option<String>,
    pub state_dir: Option<PathBuf>,
    pub segment_size: Option<String>,
    pub metad: Option<String>,
    pub cluster_token_file: Option<PathBuf>,
    pub nic: Option<Vec<String>>,
    pub disk: Option<Vec<String>>,
    pub data_port: Option<u16>,
    pub slice_size: Option<String>,
    pub conns_per_nic_pair: Option<usize>,
    pub transport: Option<String>,
    pub rdma_device: Option<Vec<String>>,
    pub rdma_staging_bytes: Option<String>,
    pub socket: Option<PathBuf>,
    pub socket_group: Option<String>,
    pub handover_socket: Option<PathBuf>,
    pub takeover: Option<bool>,
    pub takeover_if_running: Option<bool>,
    pub after_handover: Option<String>,
    pub metrics_addr: Option<String>,
    pub drain_on_exit: Option<bool>,
    pub index: Option<bool>,
    pub drain_timeout: Option<String>,
    pub staging_size: Option<String>,
    pub max_in_flight: Option<u32>,
    pub uds_spin_us: Option<u64>,
    pub max_clients: Option<usize>,
    pub transfer_timeout: Option<String>,
    pub huge_pages: Option<String>,
    pub worker_threads: Option<usize>,
    pub log_format: Option<String>,
    pub tls_ca: Option<PathBuf>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub tls_server_name: Option<String>,
    pub tls_reload_interval: Option<String>,
}

/// What a sidecar that handed its node over does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterHandover {
    /// Exit 0 (a service manager adopts the successor: systemd's `MAINPID=`).
    Exit,
    /// Stay, idle, until SIGTERM, then exit 0 (a container whose end would restart it).
    Wait,
}

#[derive(Clone, Debug)]
pub struct Settings {
    pub node_name: String,
    pub state_dir: PathBuf,
    pub segment_size: u64,
    pub metad: Vec<String>,
    pub token: Option<String>,
    /// Mutual TLS (data plane and metad), if configured.
    pub tls: Option<regolith_proto::tls::Tls>,
    pub nics: Vec<IpAddr>,
    pub data_port: u16,
    pub slice_size: u32,
    pub conns_per_nic_pair: usize,
    /// `--transport`.
    pub transport: crate::transport::rdma::TransportMode,
    /// `--rdma-device`, in order.
    pub rdma_devices: Vec<String>,
    pub rdma_staging_bytes: u64,
    pub socket: PathBuf,
    pub socket_group: Option<String>,
    pub metrics_addr: SocketAddr,
    /// Where this sidecar offers the hand-over of its segment to a successor.
    pub handover_socket: PathBuf,
    /// Take over from the sidecar on `handover_socket` instead of mounting.
    pub takeover: bool,
    /// Take over when a sidecar answers on `handover_socket`, else mount.
    pub takeover_if_running: bool,
    pub after_handover: AfterHandover,
    pub drain_on_exit: bool,
    /// Keep the object index fed by metad's watch stream (`--index`, default on).
    pub index: bool,
    pub drain_timeout: Duration,
    pub staging_size: u64,
    pub max_in_flight: u32,
    /// See `--uds-spin-us`.
    pub uds_spin: Duration,
    pub max_clients: usize,
    pub transfer_timeout: Duration,
    pub huge_pages: HugePages,
    pub worker_threads: Option<usize>,
    /// `--disk`, in order: the node's disk tier (empty: DRAM only).
    pub disks: Vec<crate::disk::DiskSpec>,
    pub test_hooks: bool,
    pub verbose: u8,
    pub json_logs: bool,
}

fn cfg(msg: String) -> Error {
    Error::Config(msg)
}

/// `--disk` values: each `PATH[:SIZE]`, no directory given twice or inside another.
fn parse_disks(raw: Vec<String>) -> Result<Vec<crate::disk::DiskSpec>> {
    let mut out: Vec<crate::disk::DiskSpec> = Vec::new();
    for r in raw {
        let d: crate::disk::DiskSpec = r.parse().map_err(cfg)?;
        if let Some(o) = out
            .iter()
            .find(|o| o.path.starts_with(&d.path) || d.path.starts_with(&o.path))
        {
            return Err(cfg(format!(
                "--disk {}: overlaps --disk {} (one directory per device, none inside another)",
                d.path.display(),
                o.path.display()
            )));
        }
        out.push(d);
    }
    Ok(out)
}

fn host_name() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

pub use regolith_proto::daemon::normalize_argv;

impl Settings {
    /// What the daemons' `main` shell needs: logging and runtime threads.
    pub fn process(&self) -> regolith_proto::daemon::Process {
        regolith_proto::daemon::Process {
            verbose: self.verbose,
            json_logs: self.json_logs,
            worker_threads: self.worker_threads,
        }
    }
}

/// A NIC address: an IP, optionally with a port (the port must then equal --data-port).
fn parse_nic(s: &str) -> Result<(IpAddr, Option<u16>)> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Ok((ip, None));
    }
    if let Ok(sa) = s.parse::<SocketAddr>() {
        return Ok((sa.ip(), Some(sa.port())));
    }
    Err(cfg(format!(
        "--nic {s:?}: expected an IP address (optionally IP:PORT)"
    )))
}

impl Args {
    pub fn resolve(self) -> Result<Settings> {
        let file: FileConfig = match &self.config {
            None => FileConfig::default(),
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .map_err(|e| cfg(format!("cannot read config file {}: {e}", p.display())))?;
                toml::from_str(&text)
                    .map_err(|e| cfg(format!("config file {}: {e}", p.display())))?
            }
        };
        let node_name = self.node_name.or(file.node_name).unwrap_or_else(host_name);
        if node_name.is_empty()
            || node_name.len() > 255
            || node_name.chars().any(|c| c.is_control() || c == '/')
        {
            return Err(cfg(format!(
                "--node-name {node_name:?}: 1..=255 printable characters, no '/'"
            )));
        }
        let size = |flag: &str, v: Option<String>, d: u64| -> Result<u64> {
            v.map_or(Ok(d), |s| {
                parse_size(&s).map_err(|e| cfg(format!("--{flag}: {e}")))
            })
        };
        let dur = |flag: &str, v: Option<String>, d: Duration| -> Result<Duration> {
            v.map_or(Ok(d), |s| {
                parse_duration(&s).map_err(|e| cfg(format!("--{flag}: {e}")))
            })
        };
        let segment_size = size(
            "segment-size",
            self.segment_size.or(file.segment_size),
            1 << 30,
        )?;
        let metad_list = self
            .metad
            .or(file.metad)
            .ok_or_else(|| cfg("--metad HOST:PORT[,HOST:PORT...] is required".into()))?;
        let metad = regolith_proto::client::parse_addrs(&metad_list)
            .map_err(|e| cfg(format!("--metad: {e}")))?;
        let token = match self.cluster_token_file.or(file.cluster_token_file) {
            Some(p) => {
                Some(regolith_proto::auth::read_token_file(&p).map_err(|e| cfg(e.to_string()))?)
            }
            None => None,
        };
        let tls = self
            .tls
            .or(regolith_proto::tls::TlsArgs {
                tls_ca: file.tls_ca,
                tls_cert: file.tls_cert,
                tls_key: file.tls_key,
                tls_server_name: file.tls_server_name,
                tls_reload_interval: file.tls_reload_interval,
            })
            .load(true)
            .map_err(|e| cfg(e.to_string()))?;
        let data_port = self.data_port.or(file.data_port).unwrap_or(7600);
        let nic_args = if self.nics.is_empty() {
            file.nic.unwrap_or_default()
        } else {
            self.nics
        };
        let mut nics = Vec::new();
        for n in &nic_args {
            let (ip, port) = parse_nic(n)?;
            if port.is_some_and(|p| p != data_port) {
                return Err(cfg(format!(
                    "--nic {n}: its port differs from --data-port {data_port}"
                )));
            }
            if !nics.contains(&ip) {
                nics.push(ip);
            }
        }
        if nics.is_empty() {
            nics.push(IpAddr::from([127, 0, 0, 1]));
        }
        let disks = parse_disks(if self.disks.is_empty() {
            file.disk.unwrap_or_default()
        } else {
            self.disks
        })?;
        let slice = size("slice-size", self.slice_size.or(file.slice_size), 1 << 20)?;
        let chunk = regolith_proto::checksum::CHUNK as u64;
        if slice == 0
            || slice % chunk != 0
            || slice > regolith_proto::dataplane::MAX_SLICE_LEN as u64
        {
            return Err(cfg(format!(
                "--slice-size {slice}: must be a multiple of {chunk} bytes, at most {}",
                regolith_proto::dataplane::MAX_SLICE_LEN
            )));
        }
        let conns = self
            .conns_per_nic_pair
            .or(file.conns_per_nic_pair)
            .unwrap_or(2);
        if conns == 0 || conns > 64 {
            return Err(cfg(format!("--conns-per-nic-pair {conns}: must be 1..=64")));
        }
        let transport = match self
            .transport
            .or(file.transport)
            .as_deref()
            .unwrap_or("auto")
        {
            "auto" => crate::transport::rdma::TransportMode::Auto,
            "tcp" => crate::transport::rdma::TransportMode::Tcp,
            "rdma" => crate::transport::rdma::TransportMode::Rdma,
            other => return Err(cfg(format!("--transport {other:?}: auto, tcp or rdma"))),
        };
        let rdma_devices = if self.rdma_devices.is_empty() {
            file.rdma_device.unwrap_or_default()
        } else {
            self.rdma_devices
        };
        for d in &rdma_devices {
            if !regolith_proto::rdma::valid_device_name(d) {
                return Err(cfg(format!(
                    "--rdma-device {d:?}: not a device name (1 to 64 of A-Z a-z 0-9 _ . -)"
                )));
            }
        }
        let rdma_staging_bytes = size(
            "rdma-staging-bytes",
            self.rdma_staging_bytes.or(file.rdma_staging_bytes),
            256 << 20,
        )?;
        if rdma_staging_bytes < u64::from(regolith_proto::rdma::MIN_WINDOW) {
            return Err(cfg(format!(
                "--rdma-staging-bytes {rdma_staging_bytes}: at least 64KiB"
            )));
        }
        let metrics_addr: SocketAddr = self
            .metrics_addr
            .or(file.metrics_addr)
            .unwrap_or_else(|| "127.0.0.1:9300".into())
            .parse()
            .map_err(|_| cfg("--metrics-addr: expected IP:PORT".into()))?;
        let staging_size = size(
            "staging-size",
            self.staging_size.or(file.staging_size),
            regolith_proto::uds::DEFAULT_STAGING,
        )?
        .max(regolith_proto::uds::MIN_STAGING);
        let huge_pages = match self
            .huge_pages
            .or(file.huge_pages)
            .as_deref()
            .unwrap_or("auto")
        {
            "auto" => HugePages::Auto,
            "never" => HugePages::Never,
            "require" => HugePages::Require,
            other => {
                return Err(cfg(format!(
                    "--huge-pages {other:?}: auto, never or require"
                )))
            }
        };
        let after_handover = match self
            .after_handover
            .or(file.after_handover)
            .as_deref()
            .unwrap_or("exit")
        {
            "exit" => AfterHandover::Exit,
            "wait" => AfterHandover::Wait,
            other => return Err(cfg(format!("--after-handover {other:?}: exit or wait"))),
        };
        let json_logs = match self
            .log_format
            .or(file.log_format)
            .as_deref()
            .unwrap_or("text")
        {
            "text" => false,
            "json" => true,
            other => return Err(cfg(format!("--log-format {other:?}: text or json"))),
        };
        let max_in_flight = self.max_in_flight.or(file.max_in_flight).unwrap_or(256);
        if max_in_flight == 0 {
            return Err(cfg("--max-in-flight must be at least 1".into()));
        }
        let uds_spin_us = self
            .uds_spin_us
            .or(file.uds_spin_us)
            .unwrap_or(DEFAULT_UDS_SPIN_US);
        if uds_spin_us > MAX_UDS_SPIN_US {
            return Err(cfg(format!(
                "--uds-spin-us {uds_spin_us}: at most {MAX_UDS_SPIN_US} (spinning longer only burns a core)"
            )));
        }
        let max_clients = self.max_clients.or(file.max_clients).unwrap_or(1024);
        if max_clients == 0 {
            return Err(cfg("--max-clients must be at least 1".into()));
        }
        let socket = self
            .socket
            .or(file.socket)
            .unwrap_or_else(|| PathBuf::from("/run/regolith/sidecar.sock"));
        let handover_socket = self
            .handover_socket
            .or(file.handover_socket)
            .unwrap_or_else(|| {
                let mut p = socket.clone().into_os_string();
                p.push(".handover");
                PathBuf::from(p)
            });
        if handover_socket == socket {
            return Err(cfg("--handover-socket must differ from --socket".into()));
        }
        Ok(Settings {
            state_dir: self
                .state_dir
                .or(file.state_dir)
                .unwrap_or_else(|| PathBuf::from("/var/lib/regolith/sidecar")),
            node_name,
            segment_size,
            metad,
            token,
            tls,
            nics,
            data_port,
            slice_size: slice as u32,
            conns_per_nic_pair: conns,
            transport,
            rdma_devices,
            rdma_staging_bytes,
            socket,
            socket_group: self.socket_group.or(file.socket_group),
            metrics_addr,
            handover_socket,
            takeover: self.takeover || file.takeover.unwrap_or(false),
            takeover_if_running: self.takeover_if_running
                || file.takeover_if_running.unwrap_or(false),
            after_handover,
            drain_on_exit: self.drain_on_exit || file.drain_on_exit.unwrap_or(false),
            index: self.index.or(file.index).unwrap_or(true),
            drain_timeout: dur(
                "drain-timeout",
                self.drain_timeout.or(file.drain_timeout),
                Duration::from_secs(60),
            )?,
            staging_size,
            max_in_flight,
            uds_spin: Duration::from_micros(uds_spin_us),
            max_clients,
            transfer_timeout: dur(
                "transfer-timeout",
                self.transfer_timeout.or(file.transfer_timeout),
                Duration::from_secs(30),
            )?,
            huge_pages,
            disks,
            worker_threads: regolith_proto::daemon::worker_threads(
                self.worker_threads.or(file.worker_threads),
            )
            .map_err(cfg)?,
            test_hooks: self.test_hooks,
            verbose: self.verbose,
            json_logs,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Settings> {
        let argv = std::iter::once("regolith-sidecar").chain(args.iter().copied());
        regolith_proto::daemon::parse_argv::<Args>(argv.map(String::from))
            .map_err(|e| Error::Config(e.to_string()))?
            .resolve()
    }

    #[test]
    fn the_handover_socket_defaults_beside_the_socket() {
        let m = ["--metad", "127.0.0.1:50051"];
        let s = parse(&[m[0], m[1], "--socket", "/tmp/x/side.sock"]).unwrap();
        assert_eq!(
            s.handover_socket,
            PathBuf::from("/tmp/x/side.sock.handover")
        );
        assert!(!s.takeover);
        let s = parse(&[m[0], m[1], "--handover-socket", "/tmp/h", "--takeover"]).unwrap();
        assert_eq!(s.handover_socket, PathBuf::from("/tmp/h"));
        assert!(s.takeover);
        let same = ["--socket", "/tmp/s", "--handover-socket", "/tmp/s"];
        assert!(parse(&[m[0], m[1], same[0], same[1], same[2], same[3]]).is_err());
    }

    #[test]
    fn a_pod_takes_over_if_a_sidecar_runs_and_waits_after_handing_over() {
        let m = ["--metad", "127.0.0.1:50051"];
        let s = parse(&m).unwrap();
        assert!(!s.takeover_if_running);
        assert_eq!(s.after_handover, AfterHandover::Exit);
        let s = parse(&[
            m[0],
            m[1],
            "--takeover-if-running",
            "--after-handover",
            "wait",
        ])
        .unwrap();
        assert!(s.takeover_if_running && !s.takeover);
        assert_eq!(s.after_handover, AfterHandover::Wait);
        let err = parse(&[m[0], m[1], "--after-handover", "linger"]).unwrap_err();
        assert!(err.to_string().contains("exit or wait"), "{err}");
    }

    #[test]
    fn the_index_is_on_unless_turned_off() {
        let m = ["--metad", "127.0.0.1:50051"];
        assert!(parse(&m).unwrap().index);
        assert!(parse(&[m[0], m[1], "--index"]).unwrap().index);
        assert!(parse(&[m[0], m[1], "--index=true"]).unwrap().index);
        assert!(!parse(&[m[0], m[1], "--index=false"]).unwrap().index);
        assert!(!parse(&[m[0], m[1], "--index=0"]).unwrap().index);
        assert!(parse(&[m[0], m[1], "--index=maybe"]).is_err());
    }

    #[test]
    fn mooncake_spellings_and_defaults() {
        let s = parse(&[
            "--master_server_address",
            "127.0.0.1:50051",
            "--global_segment_size",
            "2GiB",
            "-v=1",
        ])
        .unwrap();
        assert_eq!(s.segment_size, 2 << 30);
        assert_eq!(s.metad, vec!["127.0.0.1:50051".to_string()]);
        assert_eq!(s.data_port, 7600);
        assert_eq!(
            s.metrics_addr.to_string(),
            "127.0.0.1:9300",
            "finding 13: loopback by default"
        );
        assert_eq!(s.verbose, 1);
        assert_eq!(s.socket, PathBuf::from("/run/regolith/sidecar.sock"));
        let s = parse(&[
            "--metad",
            "h:1",
            "--nic",
            "127.0.0.2",
            "--nic",
            "127.0.0.3:7600",
            "--segment-size",
            "0",
        ])
        .unwrap();
        assert_eq!(s.nics.len(), 2);
        assert_eq!(s.segment_size, 0);
    }

    #[test]
    fn the_uds_spin_defaults_to_50_us_and_0_turns_it_off() {
        let s = parse(&["--metad", "h:1"]).unwrap();
        assert_eq!(s.uds_spin, Duration::from_micros(DEFAULT_UDS_SPIN_US));
        let s = parse(&["--metad", "h:1", "--uds-spin-us", "0"]).unwrap();
        assert_eq!(s.uds_spin, Duration::ZERO);
        let s = parse(&["--metad", "h:1", "--uds-spin-us", "1000"]).unwrap();
        assert_eq!(s.uds_spin, Duration::from_micros(1000));
    }

    #[test]
    fn disks_are_repeatable_with_optional_sizes_and_never_nested() {
        let s = parse(&["--metad", "h:1"]).unwrap();
        assert!(s.disks.is_empty(), "no disk tier unless asked");
        let s = parse(&[
            "--metad",
            "h:1",
            "--disk",
            "/mnt/nvme0/regolith:2TiB",
            "--disk",
            "/mnt/nvme1/regolith",
        ])
        .unwrap();
        assert_eq!(s.disks.len(), 2);
        assert_eq!(s.disks[0].size, Some(2 << 40));
        assert_eq!(s.disks[1].size, None);
        let s = parse(&["--metad", "h:1", "--disk", "/a:1GiB,/b:2GiB"]).unwrap();
        assert_eq!(s.disks.len(), 2);
        for (bad, why) in [
            ("/mnt/a,/mnt/a/b", "overlaps"),
            ("/mnt/a,/mnt/a", "overlaps"),
            ("rel", "absolute"),
            ("/mnt/a:0", "size of 0"),
        ] {
            let e = parse(&["--metad", "h:1", "--disk", bad]).unwrap_err();
            assert!(e.to_string().contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn bad_values_name_the_flag() {
        for (args, flag) in [
            (vec!["--metad", "h:1", "--slice-size", "100"], "slice-size"),
            (vec!["--metad", "h:1", "--nic", "nonsense"], "--nic"),
            (
                vec!["--metad", "h:1", "--segment-size", "lots"],
                "segment-size",
            ),
            (vec!["--segment-size", "1GiB"], "--metad"),
            (
                vec!["--metad", "h:1", "--huge-pages", "maybe"],
                "huge-pages",
            ),
            (
                vec!["--metad", "h:1", "--uds-spin-us", "5000"],
                "--uds-spin-us",
            ),
            (
                vec!["--metad", "h:1", "--uds-spin-us", "soon"],
                "uds-spin-us",
            ),
        ] {
            let e = parse(&args).unwrap_err().to_string();
            assert!(e.contains(flag), "{args:?}: {e}");
        }
    }

    #[test]
    fn every_field_of_the_launch_description_is_a_flag_the_sidecar_accepts() {
        use regolith_proto::launch::SidecarLaunch;
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "launch-token\n").unwrap();
        let certs =
            regolith_proto::pki::make_cluster(dir.path(), &["node-x"], &["127.0.0.2".into()])
                .unwrap();
        let launch = SidecarLaunch {
            node_name: Some("node-x".into()),
            state_dir: Some(dir.path().join("state")),
            segment_size: Some("64MiB".into()),
            metad: vec!["127.0.0.1:1".into(), "127.0.0.1:2".into()],
            cluster_token_file: Some(token),
            nics: vec!["127.0.0.2".into(), "127.0.0.3".into()],
            data_port: Some(7700),
            socket: Some(dir.path().join("s.sock")),
            metrics_addr: Some("127.0.0.1:9400".into()),
            huge_pages: Some("never".into()),
            tls: Some(regolith_proto::launch::TlsLaunch {
                ca: certs[0].ca.clone(),
                cert: certs[0].cert.clone(),
                key: certs[0].key.clone(),
            }),
            worker_threads: Some(2),
            test_hooks: true,
            verbose: 1,
            extra: vec!["--max-in-flight".into(), "7".into()],
        };
        let argv = std::iter::once("regolith-sidecar".into()).chain(launch.args());
        let s = Args::try_parse_from(normalize_argv(argv))
            .unwrap()
            .resolve()
            .unwrap();
        assert_eq!(s.node_name, "node-x");
        assert_eq!(s.state_dir, dir.path().join("state"));
        assert_eq!(s.segment_size, 64 << 20);
        assert_eq!(s.metad.len(), 2);
        assert_eq!(s.token.as_deref(), Some("launch-token"));
        assert_eq!(s.nics.len(), 2);
        assert_eq!(s.data_port, 7700);
        assert_eq!(s.socket, dir.path().join("s.sock"));
        assert_eq!(s.metrics_addr.to_string(), "127.0.0.1:9400");
        assert_eq!(s.huge_pages, HugePages::Never);
        assert_eq!(s.worker_threads, Some(2));
        assert!(s.test_hooks);
        assert_eq!(s.verbose, 1);
        assert_eq!(s.max_in_flight, 7);
        assert_eq!(
            s.tls.as_ref().map(|t| t.settings().files.cert.clone()),
            Some(Some(certs[0].cert.clone()))
        );
    }

    /// Every flag `python/regolith/_launch.py` starts a sidecar with is one of ours, and the
    /// Python spawner names no flag of its own.
    #[test]
    fn the_python_spawners_flags_are_sidecar_flags() {
        use clap::CommandFactory;
        use regolith_test_support::python;
        let text = std::fs::read_to_string(python::launch_file()).unwrap();
        let cmd = Args::command();
        for (_, flag) in python::flag_table(&text, "SIDECAR") {
            let name = flag.strip_prefix("--").unwrap_or(&flag);
            assert!(
                cmd.get_arguments().any(|a| a.get_long() == Some(name)
                    || a.get_all_aliases().is_some_and(|al| al.contains(&name))),
                "_launch.py: regolith-sidecar has no flag {flag}"
            );
        }
        let spawn = python::launch_file().with_file_name("_spawn.py");
        let spawn = std::fs::read_to_string(spawn).unwrap();
        python::assert_spells_none(
            &spawn,
            "_spawn.py",
            cmd.get_arguments().filter_map(|a| a.get_long()),
        );
    }
}
