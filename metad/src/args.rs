//! Flags of `regolith-metad` (clap), the optional TOML file (`--config`) and `REGOLITH_*`
//! environment variables. Precedence: flag, then environment, then file, then default.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use regolith_proto::units::{parse_duration, parse_size};
use serde::Deserialize;

use crate::config::CacheConfig;
use crate::error::{Error, Result};

#[derive(Parser, Debug, Default, Clone)]
#[command(
    name = "regolith-metad",
    version,
    about = "One replica of Regolith's Raft-replicated metadata service"
)]
pub struct Args {
    /// Numeric id of this replica (unique in the cluster, > 0).
    #[arg(long, env = "REGOLITH_ID")]
    pub id: Option<u64>,
    /// gRPC listen address for clients and Raft peers.
    #[arg(long, env = "REGOLITH_LISTEN")]
    pub listen: Option<String>,
    /// Address peers and clients use to reach this replica (default: this replica's entry in
    /// --peers, else --listen).
    #[arg(long, env = "REGOLITH_ADVERTISE")]
    pub advertise: Option<String>,
    /// Initial members: `1=HOST:PORT,2=HOST:PORT,3=HOST:PORT`.
    #[arg(long, env = "REGOLITH_PEERS")]
    pub peers: Option<String>,
    /// Create the cluster from --peers. Give it to every initial member on first start; ignored
    /// when the data dir already has state. An empty member without it waits to be added.
    #[arg(long, env = "REGOLITH_BOOTSTRAP")]
    pub bootstrap: bool,
    #[arg(long, env = "REGOLITH_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Restore a brand-new cluster from a snapshot file (`regolith metad snapshot save`): with
    /// --bootstrap, on every initial member (same file, same --peers); the state starts as the
    /// snapshot's. Ignored when the data dir already has state. See docs/metad.md "Backup and
    /// recovery".
    #[arg(long, env = "REGOLITH_RESTORE_FROM", value_name = "FILE")]
    pub restore_from: Option<PathBuf>,
    /// With --restore-from: start the new cluster's terms this far above the snapshot's, past
    /// any term sidecars of the old cluster may have seen since it was taken (they fence writes
    /// of older terms). At most 2^32.
    #[arg(long, env = "REGOLITH_RESTORE_TERM_BUMP", value_name = "N")]
    pub restore_term_bump: Option<u64>,
    /// Recovery from a lost quorum: make this replica, from its own data, the only member of
    /// its cluster (then add members back with `regolith members add`). Once: a later start
    /// with the flag is refused. No environment variable or config key, on purpose.
    #[arg(long)]
    pub force_new_cluster: bool,
    /// HTTP address of /metrics, /health, /ready, /status.
    #[arg(long, env = "REGOLITH_METRICS_ADDR")]
    pub metrics_addr: Option<String>,
    /// File holding the cluster token every gRPC peer and client must present.
    #[arg(long, env = "REGOLITH_CLUSTER_TOKEN_FILE")]
    pub cluster_token_file: Option<PathBuf>,
    /// File holding the Raft peer credential: the same on every replica, apart from the cluster
    /// token; Raft messages without it are refused (PERMISSION_DENIED).
    #[arg(long, env = "REGOLITH_PEER_TOKEN_FILE")]
    pub peer_token_file: Option<PathBuf>,
    /// Serve the Mooncake-compatible metadata KV at --http-metadata-addr (a value may follow,
    /// as Mooncake's `--enable_http_metadata_server=1`: true/false, 1/0, yes/no, on/off).
    #[arg(
        long,
        alias = "enable_http_metadata_server",
        env = "REGOLITH_ENABLE_HTTP_METADATA_SERVER",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value = "false",
        action = clap::ArgAction::Set,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub enable_http_metadata_server: bool,
    /// Mooncake master's flags for the same settings.
    #[command(flatten)]
    pub master: crate::master_flags::MasterFlags,
    #[arg(
        long,
        alias = "http_metadata_addr",
        env = "REGOLITH_HTTP_METADATA_ADDR"
    )]
    pub http_metadata_addr: Option<String>,

    /// Read lease a get grants (e.g. 5s).
    #[arg(long, env = "REGOLITH_LEASE_TTL")]
    pub lease_ttl: Option<String>,
    /// A node not heard from for this long is declared dead (e.g. 10s).
    #[arg(long, env = "REGOLITH_NODE_TTL")]
    pub node_ttl: Option<String>,
    /// A reservation not committed within this is quarantined (e.g. 30s).
    #[arg(long, env = "REGOLITH_PUT_TIMEOUT")]
    pub put_timeout: Option<String>,
    #[arg(
        long,
        alias = "eviction_high_watermark_ratio",
        env = "REGOLITH_EVICTION_HIGH_WATERMARK"
    )]
    pub eviction_high_watermark: Option<f64>,
    #[arg(long, alias = "eviction_ratio", env = "REGOLITH_EVICTION_RATIO")]
    pub eviction_ratio: Option<f64>,
    /// Above this share of the pool in use, nodes with a disk tier offload their least
    /// recently used objects to disk (docs/ssd.md); at most the eviction high watermark.
    #[arg(long, env = "REGOLITH_OFFLOAD_WATERMARK")]
    pub offload_watermark: Option<f64>,
    /// Copy a disk-only object back into memory when a get hits it and the pool has room
    /// (default true; `--promote-on-hit=false` keeps hits on disk).
    #[arg(
        long,
        env = "REGOLITH_PROMOTE_ON_HIT",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        action = clap::ArgAction::Set,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub promote_on_hit: Option<bool>,
    /// Copy every put to the disk tier of the nodes that hold it, keeping the memory copy
    /// (default false: objects reach disk only when memory pressure offloads them).
    #[arg(
        long,
        env = "REGOLITH_WRITE_THROUGH",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        action = clap::ArgAction::Set,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub write_through: Option<bool>,
    #[arg(long, env = "REGOLITH_HARD_PIN_MAX_RATIO")]
    pub hard_pin_max_ratio: Option<f64>,
    #[arg(long, env = "REGOLITH_SOFT_PIN_TTL")]
    pub soft_pin_ttl: Option<String>,
    #[arg(long, env = "REGOLITH_DRAIN_TIMEOUT")]
    pub drain_timeout: Option<String>,
    #[arg(long, env = "REGOLITH_MAX_KEY_LEN")]
    pub max_key_len: Option<usize>,
    /// Changes of recent entries kept for watchers that reconnect (sidecar indexes resume from
    /// them; one further behind gets a full snapshot).
    #[arg(long, env = "REGOLITH_WATCH_BACKLOG_CHANGES")]
    pub watch_backlog_changes: Option<usize>,
    /// Most bytes (keys and values) the metadata KV holds, e.g. 64MiB.
    #[arg(long, env = "REGOLITH_META_MAX_BYTES")]
    pub meta_max_bytes: Option<String>,
    /// Most keys the metadata KV holds.
    #[arg(long, env = "REGOLITH_META_MAX_KEYS")]
    pub meta_max_keys: Option<usize>,
    /// File holding a token the HTTP metadata KV requires (`Authorization: Bearer TOKEN`).
    /// Off by default: Mooncake's transfer engine sends none.
    #[arg(long, env = "REGOLITH_HTTP_METADATA_TOKEN_FILE")]
    pub http_metadata_token_file: Option<PathBuf>,
    /// Mutual TLS on gRPC (clients and Raft): --tls-ca, --tls-cert, --tls-key.
    #[command(flatten)]
    pub tls: regolith_proto::tls::TlsArgs,
    /// With TLS: a sidecar's mount, heartbeats and unmount must come with a client certificate
    /// that names its node (a DNS name equal to the node name); others are PERMISSION_DENIED.
    #[arg(long, env = "REGOLITH_TLS_NODE_IDENTITY")]
    pub tls_node_identity: bool,

    /// Raft heartbeat interval (e.g. 100ms).
    #[arg(long, env = "REGOLITH_HEARTBEAT_INTERVAL")]
    pub heartbeat_interval: Option<String>,
    /// Lower bound of the randomized election timeout (e.g. 500ms); also the leader lease.
    #[arg(long, env = "REGOLITH_ELECTION_TIMEOUT_MIN")]
    pub election_timeout_min: Option<String>,
    #[arg(long, env = "REGOLITH_ELECTION_TIMEOUT_MAX")]
    pub election_timeout_max: Option<String>,
    /// On SIGTERM, a leader first hands its office to the most caught-up voter (a rolling
    /// upgrade keeps a leader throughout), holding writes at most this long; 0 turns it off
    /// (default 5s).
    #[arg(long, env = "REGOLITH_LEADER_HANDOVER_TIMEOUT")]
    pub leader_handover_timeout: Option<String>,
    /// On SIGTERM, build a snapshot of the log written since the last one, so that the restart
    /// loads it instead of replaying that log; the stop waits at most this long for it; 0 turns
    /// it off (default 20s).
    #[arg(long, env = "REGOLITH_STOP_SNAPSHOT_TIMEOUT")]
    pub stop_snapshot_timeout: Option<String>,
    /// Build a snapshot (and purge the log) after this many entries.
    #[arg(long, env = "REGOLITH_SNAPSHOT_LOGS")]
    pub snapshot_logs: Option<u64>,
    /// Also build a snapshot once this many bytes were appended to the log since the last one
    /// (entries carry batches, so a count alone bounds the log poorly), e.g. 16MiB.
    #[arg(long, env = "REGOLITH_SNAPSHOT_BYTES")]
    pub snapshot_bytes: Option<String>,
    /// Largest Raft entry (a batch of commands), e.g. 1MiB.
    #[arg(long, env = "REGOLITH_MAX_ENTRY_BYTES")]
    pub max_entry_bytes: Option<String>,
    /// Largest Raft message (AppendEntries are cut to fit), e.g. 16MiB.
    #[arg(long, env = "REGOLITH_RAFT_MAX_MESSAGE_BYTES")]
    pub raft_max_message_bytes: Option<String>,
    /// sled's page cache (its default of 1 GiB is far more than metad needs).
    #[arg(long, env = "REGOLITH_SLED_CACHE")]
    pub sled_cache: Option<String>,
    /// The newest log entries kept in memory for replication and apply, e.g. 64MiB (0: none).
    #[arg(long, env = "REGOLITH_LOG_CACHE")]
    pub log_cache: Option<String>,

    /// Runtime worker threads (default: one per core). Replicas sharing a small machine (as
    /// `regolith up` runs them) do better with 1.
    #[arg(long, env = "REGOLITH_WORKER_THREADS")]
    pub worker_threads: Option<usize>,
    /// TOML file with any of these settings (keys are the flag names with `_`).
    #[arg(long, env = "REGOLITH_CONFIG")]
    pub config: Option<PathBuf>,
    /// More logging (-v, -vv); Mooncake's `-v=1` is accepted too.
    #[arg(short = 'v', long = "verbose", action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// `text` or `json`.
    #[arg(long, env = "REGOLITH_LOG_FORMAT")]
    pub log_format: Option<String>,
}

/// The TOML file: the same settings as the flags.
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub id: Option<u64>,
    pub listen: Option<String>,
    pub advertise: Option<String>,
    pub peers: Option<String>,
    pub bootstrap: Option<bool>,
    pub data_dir: Option<PathBuf>,
    pub restore_from: Option<PathBuf>,
    pub restore_term_bump: Option<u64>,
    pub metrics_addr: Option<String>,
    pub cluster_token_file: Option<PathBuf>,
    pub peer_token_file: Option<PathBuf>,
    pub enable_http_metadata_server: Option<bool>,
    pub http_metadata_addr: Option<String>,
    pub lease_ttl: Option<String>,
    pub node_ttl: Option<String>,
    pub put_timeout: Option<String>,
    pub eviction_high_watermark: Option<f64>,
    pub eviction_ratio: Option<f64>,
    pub offload_watermark: Option<f64>,
    pub promote_on_hit: Option<bool>,
    pub write_through: Option<bool>,
    pub hard_pin_max_ratio: Option<f64>,
    pub soft_pin_ttl: Option<String>,
    pub drain_timeout: Option<String>,
    pub max_key_len: Option<usize>,
    pub watch_backlog_changes: Option<usize>,
    pub meta_max_bytes: Option<String>,
    pub meta_max_keys: Option<usize>,
    pub http_metadata_token_file: Option<PathBuf>,
    pub tls_ca: Option<PathBuf>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub tls_server_name: Option<String>,
    pub tls_reload_interval: Option<String>,
    pub tls_node_identity: Option<bool>,
    pub heartbeat_interval: Option<String>,
    pub election_timeout_min: Option<String>,
    pub election_timeout_max: Option<String>,
    pub leader_handover_timeout: Option<String>,
    pub stop_snapshot_timeout: Option<String>,
    pub snapshot_logs: Option<u64>,
    pub snapshot_bytes: Option<String>,
    pub max_entry_bytes: Option<String>,
    pub raft_max_message_bytes: Option<String>,
    pub sled_cache: Option<String>,
    pub log_cache: Option<String>,
    pub worker_threads: Option<usize>,
    pub log_format: Option<String>,
}

/// Resolved settings.
#[derive(Clone, Debug)]
pub struct Settings {
    pub id: u64,
    pub listen: SocketAddr,
    pub advertise: String,
    pub peers: BTreeMap<u64, String>,
    pub bootstrap: bool,
    pub data_dir: PathBuf,
    /// `--restore-from`: seed an empty data dir from this snapshot file before bootstrap.
    pub restore_from: Option<PathBuf>,
    /// `--restore-term-bump`: added to the snapshot's term for the restored vote.
    pub restore_term_bump: u64,
    /// `--force-new-cluster`: rewrite the membership to this replica alone before start.
    pub force_new_cluster: bool,
    pub metrics_addr: SocketAddr,
    pub token: Option<String>,
    /// The Raft peer credential, if any (`--peer-token-file`).
    pub peer_token: Option<String>,
    pub http_metadata_addr: Option<SocketAddr>,
    /// The token the HTTP metadata KV requires, if any.
    pub http_metadata_token: Option<String>,
    /// Mutual TLS on gRPC, served and dialled (Raft peers), if configured.
    pub tls: Option<regolith_proto::tls::Tls>,
    /// Node-scoped calls need a client certificate naming the node (`--tls-node-identity`).
    pub tls_node_identity: bool,
    pub cache: CacheConfig,
    pub heartbeat_interval: Duration,
    pub election_timeout_min: Duration,
    pub election_timeout_max: Duration,
    /// How long a leader stopping on SIGTERM may spend handing over (zero: it does not).
    pub leader_handover_timeout: Duration,
    /// How long a replica stopping on SIGTERM may spend on a last snapshot (zero: none).
    pub stop_snapshot_timeout: Duration,
    pub snapshot_logs: u64,
    pub snapshot_bytes: u64,
    pub max_entry_bytes: usize,
    pub raft_max_message_bytes: usize,
    pub sled_cache_bytes: u64,
    pub log_cache_bytes: u64,
    pub worker_threads: Option<usize>,
    pub verbose: u8,
    pub json_logs: bool,
    /// Started with neither `--id` nor `--peers`: a single-replica cluster (id 1).
    pub single_replica: bool,
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

/// Parses `1=HOST:PORT,2=HOST:PORT`.
pub fn parse_peers(s: &str) -> Result<BTreeMap<u64, String>> {
    let mut out = BTreeMap::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, addr) = part.split_once('=').ok_or_else(|| {
            Error::Config(format!("--peers entry {part:?}: expected ID=HOST:PORT"))
        })?;
        let id: u64 = id
            .trim()
            .parse()
            .map_err(|_| Error::Config(format!("--peers entry {part:?}: id is not a number")))?;
        if id == 0 {
            return Err(Error::Config(format!(
                "--peers entry {part:?}: ids start at 1"
            )));
        }
        regolith_proto::client::parse_addrs(addr.trim())
            .map_err(|e| Error::Config(format!("--peers entry {part:?}: {e}")))?;
        if out.insert(id, addr.trim().to_string()).is_some() {
            return Err(Error::Config(format!("--peers names id {id} twice")));
        }
    }
    Ok(out)
}

/// Where listeners bind when not told: loopback, so a daemon started without flags is not on
/// the network (finding 13 of the hardening review). Operators name the interface.
pub const LOOPBACK: &str = "127.0.0.1";

/// The gRPC listener's default: port 50051 on the IP of this replica's advertised address (its
/// `--advertise`, else its `--peers` entry) when that is an IP literal, else loopback. Host
/// names are not resolved here (a resolver may hang at startup): give `--listen` with them.
fn default_listen(advertised: Option<&str>) -> SocketAddr {
    let ip = advertised
        .and_then(|a| regolith_proto::client::parse_addrs(a).ok())
        .and_then(|list| list.into_iter().next())
        .and_then(|a| a.parse::<SocketAddr>().ok())
        .map(|sa| sa.ip())
        .unwrap_or(std::net::IpAddr::from([127, 0, 0, 1]));
    SocketAddr::new(ip, 50051)
}

fn sock(flag: &str, v: &str) -> Result<SocketAddr> {
    v.parse()
        .map_err(|_| Error::Config(format!("--{flag} {v:?}: expected IP:PORT")))
}

fn dur(flag: &str, v: Option<String>, default: Duration) -> Result<Duration> {
    match v {
        None => Ok(default),
        Some(s) => parse_duration(&s).map_err(|e| Error::Config(format!("--{flag}: {e}"))),
    }
}

fn size(flag: &str, v: Option<String>, default: u64) -> Result<u64> {
    match v {
        None => Ok(default),
        Some(s) => parse_size(&s).map_err(|e| Error::Config(format!("--{flag}: {e}"))),
    }
}

impl Args {
    /// Merges flags, environment (already in `self` through clap), the TOML file and defaults.
    pub fn resolve(self) -> Result<Settings> {
        let file: FileConfig = match &self.config {
            None => FileConfig::default(),
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|e| {
                    Error::Config(format!("cannot read config file {}: {e}", p.display()))
                })?;
                toml::from_str(&text)
                    .map_err(|e| Error::Config(format!("config file {}: {e}", p.display())))?
            }
        };
        let master = self.master.clone();
        let peers_arg = self.peers.or(file.peers);
        // Neither an id nor peers: a single-replica cluster on the defaults, as `mooncake_master`
        // alone runs one master (it can grow with `regolith members add`).
        let single = self.id.or(file.id).is_none() && peers_arg.is_none();
        let id = match self.id.or(file.id) {
            Some(id) => id,
            None if single => 1,
            None => return Err(Error::Config("--id is required with --peers".into())),
        };
        if id == 0 {
            return Err(Error::Config("--id must be positive".into()));
        }
        let mut peers = match peers_arg {
            Some(p) => parse_peers(&p)?,
            None => BTreeMap::new(),
        };
        let advertise_flag = self.advertise.or(file.advertise);
        let listen = match self.listen.or(file.listen) {
            Some(l) => sock("listen", &l)?,
            None => {
                let d = default_listen(
                    advertise_flag
                        .as_deref()
                        .or(peers.get(&id).map(|s| s.as_str())),
                );
                master.listen(d)?.unwrap_or(d)
            }
        };
        if single {
            let reach = if listen.ip().is_unspecified() {
                SocketAddr::new(std::net::IpAddr::from([127, 0, 0, 1]), listen.port())
            } else {
                listen
            };
            peers.insert(
                id,
                advertise_flag.clone().unwrap_or_else(|| reach.to_string()),
            );
        }
        let bootstrap = self.bootstrap
            || file.bootstrap.unwrap_or(false)
            || (single && !self.force_new_cluster);
        if bootstrap && !peers.contains_key(&id) {
            return Err(Error::Config(format!(
                "--bootstrap needs --peers to include this replica (id {id})"
            )));
        }
        let restore_from = self.restore_from.or(file.restore_from);
        if restore_from.is_some() && !bootstrap {
            return Err(Error::Config(
                "--restore-from creates a new cluster: give it with --bootstrap and --peers, on every initial member".into(),
            ));
        }
        let restore_term_bump = self
            .restore_term_bump
            .or(file.restore_term_bump)
            .unwrap_or(0);
        if restore_term_bump > 0 && restore_from.is_none() {
            return Err(Error::Config(
                "--restore-term-bump only applies with --restore-from".into(),
            ));
        }
        if restore_term_bump > 1 << 32 {
            return Err(Error::Config(format!(
                "--restore-term-bump {restore_term_bump}: at most 2^32 (peers refuse terms far above their own)"
            )));
        }
        if self.force_new_cluster && (bootstrap || restore_from.is_some()) {
            return Err(Error::Config(
                "--force-new-cluster restarts an existing member from its own data: it does not go with --bootstrap or --restore-from".into(),
            ));
        }
        let advertise = advertise_flag
            .or_else(|| peers.get(&id).cloned())
            .unwrap_or_else(|| listen.to_string());
        let data_dir = self
            .data_dir
            .or(file.data_dir)
            .unwrap_or_else(|| PathBuf::from(format!("metad-{id}")));
        let default_metrics = sock("metrics-addr", &format!("{LOOPBACK}:9003"))?;
        let metrics_addr = match self.metrics_addr.or(file.metrics_addr) {
            Some(m) => sock("metrics-addr", &m)?,
            None => master.metrics(default_metrics).unwrap_or(default_metrics),
        };
        let token = match self.cluster_token_file.or(file.cluster_token_file) {
            Some(p) => Some(
                regolith_proto::auth::read_token_file(&p)
                    .map_err(|e| Error::Config(e.to_string()))?,
            ),
            None => None,
        };
        let peer_token = match self.peer_token_file.or(file.peer_token_file) {
            Some(p) => {
                let t = regolith_proto::auth::read_token_file(&p)
                    .map_err(|e| Error::Config(format!("--peer-token-file: {e}")))?;
                if token.as_deref() == Some(t.as_str()) {
                    return Err(Error::Config(
                        "--peer-token-file holds the cluster token: the peer credential must differ, or every token holder can act as a Raft member".into(),
                    ));
                }
                Some(t)
            }
            None => None,
        };
        let http_enabled =
            self.enable_http_metadata_server || file.enable_http_metadata_server.unwrap_or(false);
        let http_metadata_addr = if http_enabled {
            let default_kv = sock("http-metadata-addr", &format!("{LOOPBACK}:8080"))?;
            Some(match self.http_metadata_addr.or(file.http_metadata_addr) {
                Some(a) => sock("http-metadata-addr", &a)?,
                None => master.http_metadata(default_kv)?.unwrap_or(default_kv),
            })
        } else {
            None
        };
        let d = CacheConfig::default();
        let ms = |d: Duration| d.as_millis() as u64;
        let cache = CacheConfig {
            lease_ttl_ms: ms(dur(
                "lease-ttl",
                self.lease_ttl.or(file.lease_ttl).or(master.lease_ttl()),
                Duration::from_millis(d.lease_ttl_ms),
            )?),
            node_ttl_ms: ms(dur(
                "node-ttl",
                self.node_ttl.or(file.node_ttl).or(master.node_ttl()),
                Duration::from_millis(d.node_ttl_ms),
            )?),
            put_timeout_ms: ms(dur(
                "put-timeout",
                self.put_timeout.or(file.put_timeout),
                Duration::from_millis(d.put_timeout_ms),
            )?),
            eviction_high_watermark: self
                .eviction_high_watermark
                .or(file.eviction_high_watermark)
                .unwrap_or(d.eviction_high_watermark),
            eviction_ratio: self
                .eviction_ratio
                .or(file.eviction_ratio)
                .unwrap_or(d.eviction_ratio),
            offload_watermark: self
                .offload_watermark
                .or(file.offload_watermark)
                .unwrap_or(d.offload_watermark),
            promote_on_hit: self
                .promote_on_hit
                .or(file.promote_on_hit)
                .unwrap_or(d.promote_on_hit),
            write_through: self
                .write_through
                .or(file.write_through)
                .unwrap_or(d.write_through),
            hard_pin_max_ratio: self
                .hard_pin_max_ratio
                .or(file.hard_pin_max_ratio)
                .unwrap_or(d.hard_pin_max_ratio),
            soft_pin_ttl_ms: ms(dur(
                "soft-pin-ttl",
                self.soft_pin_ttl
                    .or(file.soft_pin_ttl)
                    .or(master.soft_pin_ttl()),
                Duration::from_millis(d.soft_pin_ttl_ms),
            )?),
            drain_timeout_ms: ms(dur(
                "drain-timeout",
                self.drain_timeout.or(file.drain_timeout),
                Duration::from_millis(d.drain_timeout_ms),
            )?),
            max_key_len: self
                .max_key_len
                .or(file.max_key_len)
                .unwrap_or(d.max_key_len),
            watch_backlog_changes: self
                .watch_backlog_changes
                .or(file.watch_backlog_changes)
                .unwrap_or(d.watch_backlog_changes),
            meta_max_bytes: size(
                "meta-max-bytes",
                self.meta_max_bytes.or(file.meta_max_bytes),
                d.meta_max_bytes,
            )?,
            meta_max_keys: self
                .meta_max_keys
                .or(file.meta_max_keys)
                .unwrap_or(d.meta_max_keys),
            ..d
        };
        let http_metadata_token = match self
            .http_metadata_token_file
            .or(file.http_metadata_token_file)
        {
            Some(p) => Some(
                regolith_proto::auth::read_token_file(&p)
                    .map_err(|e| Error::Config(e.to_string()))?,
            ),
            None => None,
        };
        cache.validate().map_err(Error::Config)?;
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
            .map_err(|e| Error::Config(e.to_string()))?;
        let tls_node_identity = self.tls_node_identity || file.tls_node_identity.unwrap_or(false);
        if tls_node_identity && tls.is_none() {
            return Err(Error::Config(
                "--tls-node-identity needs TLS (--tls-ca, --tls-cert, --tls-key): the node is \
                 named by the client's certificate"
                    .into(),
            ));
        }
        let heartbeat_interval = dur(
            "heartbeat-interval",
            self.heartbeat_interval.or(file.heartbeat_interval),
            Duration::from_millis(100),
        )?;
        let election_timeout_min = dur(
            "election-timeout-min",
            self.election_timeout_min.or(file.election_timeout_min),
            Duration::from_millis(500),
        )?;
        let election_timeout_max = dur(
            "election-timeout-max",
            self.election_timeout_max.or(file.election_timeout_max),
            election_timeout_min * 8 / 5,
        )?;
        if election_timeout_min <= heartbeat_interval * 2
            || election_timeout_max <= election_timeout_min
        {
            return Err(Error::Config(format!(
                "need heartbeat-interval ({heartbeat_interval:?}) < election-timeout-min/2 ({election_timeout_min:?}) and election-timeout-min < election-timeout-max ({election_timeout_max:?})"
            )));
        }
        let leader_handover_timeout = dur(
            "leader-handover-timeout",
            self.leader_handover_timeout
                .or(file.leader_handover_timeout),
            crate::transfer::DEFAULT_TIMEOUT,
        )?;
        if leader_handover_timeout > Duration::from_secs(60) {
            return Err(Error::Config(format!(
                "--leader-handover-timeout {leader_handover_timeout:?}: at most 60s (writes wait that long)"
            )));
        }
        let stop_snapshot_timeout = dur(
            "stop-snapshot-timeout",
            self.stop_snapshot_timeout.or(file.stop_snapshot_timeout),
            Duration::from_secs(20),
        )?;
        if stop_snapshot_timeout > Duration::from_secs(600) {
            return Err(Error::Config(format!(
                "--stop-snapshot-timeout {stop_snapshot_timeout:?}: at most 600s"
            )));
        }
        let max_entry_bytes = size(
            "max-entry-bytes",
            self.max_entry_bytes.or(file.max_entry_bytes),
            1 << 20,
        )? as usize;
        let raft_max_message_bytes = size(
            "raft-max-message-bytes",
            self.raft_max_message_bytes.or(file.raft_max_message_bytes),
            16 << 20,
        )? as usize;
        if max_entry_bytes * 2 > raft_max_message_bytes || max_entry_bytes < 4096 {
            return Err(Error::Config(format!(
                "--max-entry-bytes ({max_entry_bytes}) must be at least 4096 and at most half of --raft-max-message-bytes ({raft_max_message_bytes})"
            )));
        }
        let log_format = self
            .log_format
            .or(file.log_format)
            .unwrap_or_else(|| "text".into());
        let json_logs = match log_format.as_str() {
            "text" => false,
            "json" => true,
            other => {
                return Err(Error::Config(format!(
                    "--log-format {other:?}: use text or json"
                )))
            }
        };
        Ok(Settings {
            id,
            listen,
            advertise,
            peers,
            bootstrap,
            data_dir,
            restore_from,
            restore_term_bump,
            force_new_cluster: self.force_new_cluster,
            metrics_addr,
            token,
            peer_token,
            http_metadata_addr,
            http_metadata_token,
            tls,
            tls_node_identity,
            cache,
            heartbeat_interval,
            election_timeout_min,
            election_timeout_max,
            leader_handover_timeout,
            stop_snapshot_timeout,
            snapshot_logs: self
                .snapshot_logs
                .or(file.snapshot_logs)
                .unwrap_or(20_000)
                .max(100),
            snapshot_bytes: size(
                "snapshot-bytes",
                self.snapshot_bytes.or(file.snapshot_bytes),
                16 << 20,
            )?
            .max(1 << 20),
            max_entry_bytes,
            raft_max_message_bytes,
            sled_cache_bytes: size("sled-cache", self.sled_cache.or(file.sled_cache), 32 << 20)?,
            log_cache_bytes: size("log-cache", self.log_cache.or(file.log_cache), 64 << 20)?,
            worker_threads: regolith_proto::daemon::worker_threads(
                self.worker_threads
                    .or(file.worker_threads)
                    .or(master.rpc_thread_num),
            )
            .map_err(Error::Config)?,
            verbose: self.verbose,
            json_logs,
            single_replica: single,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Settings> {
        let argv = std::iter::once("regolith-metad").chain(args.iter().copied());
        regolith_proto::daemon::parse_argv::<Args>(argv.map(String::from))
            .map_err(|e| Error::Config(e.to_string()))?
            .resolve()
    }

    #[test]
    fn flags_resolve_with_defaults() {
        let s = parse(&[
            "--id",
            "2",
            "--peers",
            "1=127.0.0.1:1,2=127.0.0.1:2",
            "--bootstrap",
            "-v=2",
        ])
        .unwrap();
        assert_eq!(s.advertise, "127.0.0.1:2");
        assert_eq!(s.listen.to_string(), "127.0.0.1:50051");
        assert_eq!(s.metrics_addr.to_string(), "127.0.0.1:9003");
        assert_eq!(s.verbose, 2);
        assert!(s.http_metadata_addr.is_none());
        let s = parse(&[
            "--id",
            "1",
            "--enable_http_metadata_server",
            "--lease-ttl",
            "2s",
        ])
        .unwrap();
        assert_eq!(s.http_metadata_addr.unwrap().to_string(), "127.0.0.1:8080");
        assert_eq!(s.cache.lease_ttl_ms, 2000);
    }

    /// Issue 13, item 6: Mooncake master's command line starts a replica as it is.
    #[test]
    fn mooncake_master_flags_map_to_their_settings() {
        // `mooncake_master --enable_http_metadata_server=1`: no id, no peers, values on bools.
        let s = parse(&["--enable_http_metadata_server=1"]).unwrap();
        assert!(s.single_replica && s.bootstrap);
        assert_eq!(s.id, 1);
        assert_eq!(s.listen.to_string(), "127.0.0.1:50051");
        assert_eq!(s.peers.get(&1).map(String::as_str), Some("127.0.0.1:50051"));
        assert_eq!(s.metrics_addr.to_string(), "127.0.0.1:9003");
        assert_eq!(s.http_metadata_addr.unwrap().to_string(), "127.0.0.1:8080");
        assert_eq!(s.data_dir, PathBuf::from("metad-1"));
        for (v, on) in [
            ("true", true),
            ("0", false),
            ("false", false),
            ("yes", true),
        ] {
            let s = parse(&[&format!("--enable_http_metadata_server={v}")]).unwrap();
            assert_eq!(s.http_metadata_addr.is_some(), on, "{v}");
        }
        assert!(parse(&["--enable_http_metadata_server=maybe"]).is_err());
        // The ports, addresses, TTLs and threads, gflags' single dash included.
        let s = parse(&[
            "-rpc_port",
            "6000",
            "--rpc_address",
            "127.0.0.2",
            "-metrics_port=6001",
            "--enable_http_metadata_server",
            "--http_metadata_server_port",
            "6002",
            "--default_kv_lease_ttl",
            "1500",
            "--default_kv_soft_pin_ttl",
            "60000",
            "--client_ttl",
            "7",
            "-max_threads",
            "3",
            "--eviction_ratio",
            "0.1",
            "--v=1",
        ])
        .unwrap();
        assert_eq!(s.cache.eviction_ratio, 0.1);
        assert_eq!(s.listen.to_string(), "127.0.0.2:6000");
        assert_eq!(s.peers.get(&1).map(String::as_str), Some("127.0.0.2:6000"));
        assert_eq!(s.metrics_addr.to_string(), "127.0.0.1:6001");
        assert_eq!(s.http_metadata_addr.unwrap().to_string(), "127.0.0.1:6002");
        assert_eq!(s.cache.lease_ttl_ms, 1500);
        assert_eq!(s.cache.soft_pin_ttl_ms, 60_000);
        assert_eq!(s.cache.node_ttl_ms, 7000);
        assert_eq!(s.worker_threads, Some(3));
        assert_eq!(s.verbose, 1);
        // `-port` is rpc_port's old name; Regolith's own flags win over Mooncake's.
        let s = parse(&["-port", "50001", "--listen", "127.0.0.1:7000"]).unwrap();
        assert_eq!(s.listen.to_string(), "127.0.0.1:7000");
        let s = parse(&["-port", "50001"]).unwrap();
        assert_eq!(s.listen.to_string(), "127.0.0.1:50001");
        // Bound to every interface, the replica still names a reachable address.
        let s = parse(&["--rpc_address", "0.0.0.0"]).unwrap();
        assert_eq!(s.peers.get(&1).map(String::as_str), Some("127.0.0.1:50051"));
        assert!(parse(&["--rpc_address", "somewhere"]).is_err());
        // A multi-replica command line still needs its id.
        let e = parse(&["--peers", "1=127.0.0.1:1,2=127.0.0.1:2"]).unwrap_err();
        assert!(e.to_string().contains("--id"), "{e}");
        // With an id, nothing is implied.
        let s = parse(&["--id", "3"]).unwrap();
        assert!(!s.single_replica && !s.bootstrap && s.peers.is_empty());
    }

    /// Finding 13 (issue 14): standalone daemons bound every interface by default.
    #[test]
    fn finding_13_listeners_default_to_loopback_or_the_advertised_ip() {
        let s = parse(&["--id", "1"]).unwrap();
        for (what, a) in [("grpc", s.listen), ("metrics", s.metrics_addr)] {
            assert!(a.ip().is_loopback(), "{what} listens on {a}");
        }
        let s = parse(&["--id", "1", "--enable-http-metadata-server"]).unwrap();
        assert!(s.http_metadata_addr.unwrap().ip().is_loopback());
        let s = parse(&["--id", "2", "--peers", "1=10.1.0.1:50051,2=10.1.0.2:50051"]).unwrap();
        assert_eq!(s.listen.to_string(), "10.1.0.2:50051");
        assert!(s.metrics_addr.ip().is_loopback());
        let s = parse(&["--id", "2", "--advertise", "10.9.0.2:7000"]).unwrap();
        assert_eq!(s.listen.to_string(), "10.9.0.2:50051");
        let s = parse(&["--id", "2", "--advertise", "metad-2.svc:50051"]).unwrap();
        assert_eq!(s.listen.to_string(), "127.0.0.1:50051");
        let s = parse(&["--id", "2", "--listen", "0.0.0.0:6000"]).unwrap();
        assert_eq!(s.listen.to_string(), "0.0.0.0:6000");
    }

    #[test]
    fn bad_values_say_which_flag() {
        let e = parse(&["--id", "1", "--lease-ttl", "forever"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("lease-ttl"), "{e}");
        let e = parse(&["--id", "1", "--peers", "1=nohost"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--peers"), "{e}");
        let e = parse(&["--id", "3", "--peers", "1=h:1", "--bootstrap"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("id 3"), "{e}");
        assert!(parse(&["--peers", "1=h:1"]).is_err(), "--id required");
        assert!(parse(&["--id", "1", "--eviction-ratio", "3"]).is_err());
    }

    #[test]
    fn restore_and_force_flags_go_with_the_right_others() {
        let peers = "1=127.0.0.1:1,2=127.0.0.1:2";
        let s = parse(&[
            "--id",
            "1",
            "--peers",
            peers,
            "--bootstrap",
            "--restore-from",
            "/b.snap",
        ])
        .unwrap();
        assert_eq!(
            s.restore_from.as_deref(),
            Some(std::path::Path::new("/b.snap"))
        );
        let e = parse(&["--id", "1", "--restore-from", "/b.snap"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--bootstrap"), "{e}");
        assert!(
            parse(&["--id", "1", "--force-new-cluster"])
                .unwrap()
                .force_new_cluster
        );
        let e = parse(&[
            "--id",
            "1",
            "--peers",
            peers,
            "--bootstrap",
            "--force-new-cluster",
        ])
        .unwrap_err()
        .to_string();
        assert!(e.contains("--force-new-cluster"), "{e}");
        let mut args = vec!["--id", "1", "--peers", peers, "--bootstrap"];
        args.extend(["--restore-from", "/b.snap", "--restore-term-bump", "1000"]);
        assert_eq!(parse(&args).unwrap().restore_term_bump, 1000);
        let e = parse(&["--id", "1", "--restore-term-bump", "5"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--restore-from"), "{e}");
        args.pop();
        args.push("8589934592");
        assert!(parse(&args).is_err(), "2^33 is too far");
    }

    #[test]
    fn config_file_fills_in_and_flags_win() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("metad.toml");
        std::fs::write(
            &p,
            "id = 7\nlisten = \"127.0.0.1:6000\"\nnode_ttl = \"3s\"\n",
        )
        .unwrap();
        let s = parse(&[
            "--config",
            p.to_str().unwrap(),
            "--listen",
            "127.0.0.1:6001",
        ])
        .unwrap();
        assert_eq!(s.id, 7);
        assert_eq!(s.listen.port(), 6001);
        assert_eq!(s.cache.node_ttl_ms, 3000);
        std::fs::write(&p, "idd = 7\n").unwrap();
        let e = parse(&["--config", p.to_str().unwrap()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("idd"), "{e}");
    }

    #[test]
    fn every_field_of_the_launch_description_is_a_flag_metad_accepts() {
        use regolith_proto::launch::MetadLaunch;
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "launch-token\n").unwrap();
        let peer = dir.path().join("peer-token");
        std::fs::write(&peer, "launch-peer\n").unwrap();
        let certs =
            regolith_proto::pki::make_cluster(dir.path(), &["metad-2"], &["127.0.0.1".into()])
                .unwrap();
        let launch = MetadLaunch {
            listen: Some("127.0.0.1:6001".into()),
            advertise: Some("10.0.0.1:6001".into()),
            peers: vec![(1, "127.0.0.1:6000".into()), (2, "127.0.0.1:6001".into())],
            bootstrap: true,
            data_dir: Some(dir.path().join("data")),
            metrics_addr: Some("127.0.0.1:6002".into()),
            cluster_token_file: Some(token),
            peer_token_file: Some(peer),
            http_metadata_addr: Some("127.0.0.1:6003".into()),
            tls: Some(regolith_proto::launch::TlsLaunch {
                ca: certs[0].ca.clone(),
                cert: certs[0].cert.clone(),
                key: certs[0].key.clone(),
            }),
            tls_node_identity: true,
            worker_threads: Some(3),
            verbose: 2,
            extra: vec!["--node-ttl".into(), "3s".into()],
            ..MetadLaunch::new(2)
        };
        let argv = std::iter::once("regolith-metad".into()).chain(launch.args());
        let s = Args::try_parse_from(normalize_argv(argv))
            .unwrap()
            .resolve()
            .unwrap();
        assert_eq!(s.id, 2);
        assert_eq!(s.listen.to_string(), "127.0.0.1:6001");
        assert_eq!(s.advertise, "10.0.0.1:6001");
        assert_eq!(s.peers.len(), 2);
        assert!(s.bootstrap);
        assert_eq!(s.data_dir, dir.path().join("data"));
        assert_eq!(s.metrics_addr.to_string(), "127.0.0.1:6002");
        assert_eq!(s.token.as_deref(), Some("launch-token"));
        assert_eq!(s.peer_token.as_deref(), Some("launch-peer"));
        assert_eq!(s.http_metadata_addr.unwrap().to_string(), "127.0.0.1:6003");
        assert_eq!(s.worker_threads, Some(3));
        assert_eq!(s.verbose, 2);
        assert_eq!(s.cache.node_ttl_ms, 3000);
        assert_eq!(
            s.tls.as_ref().map(|t| t.settings().files.ca.clone()),
            Some(certs[0].ca.clone())
        );
        assert!(s.tls_node_identity);
    }
}
