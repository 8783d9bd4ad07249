//! The sidecar-backed workload: one real `regolith-sidecar` per sidecar host (`s1`..`s3`), in
//! its namespace, with both NICs; workload clients on that host talk to it over its Unix
//! socket with the Rust client ([`regolith_client::AsyncClient`]), as a vLLM worker would.
//!
//! Values are [`value::bytes`] of `(key, write id)`, from a few KiB to a few MiB (the size is
//! derived from the write, so a read can be checked byte for byte), so puts and gets move real
//! slices over the data plane. Client results are classified strictly:
//!
//! * put — `Ok` → stored (replicas with the segment generation known when the put began, see
//!   [`Generations`]); `AlreadyExists` → a definite "no"; errors decided before anything was
//!   reserved (no space, invalid argument, sidecar known down) → failed; every other error
//!   (lost connection, metad or data plane unavailable, timeout: the commit may have been sent)
//!   → indeterminate.
//! * get — bytes → [`Reply::Found`] when they decode to a write of this key, else
//!   [`Reply::Corrupt`] (an anomaly); `NotFound` → [`Reply::NotFound`]; `Corrupt` (the
//!   checksum failed on every replica, no bytes returned) → [`Reply::CorruptMiss`], which is
//!   fine; other errors → failed.
//! * exists — the answer, or failed. remove — removed / not found, or indeterminate.
//!
//! Node faults: [`Workload::crash_node`] is kill -9 of the sidecar (its segment's memory is
//! gone: the generation is recorded as gone at once), [`Workload::restart_node`] starts it again
//! with the same `--state-dir` and node name, so it mounts a new generation. A poller reads
//! every sidecar's `/status` and records each generation change (a remount after being
//! declared dead) as [`EventKind::GenerationGone`].
//!
//! Data-port latency: the data ports of one host ([`SidecarConfig::proxied_host`]) sit behind
//! [`Proxy`]s. The sidecar has no flag to advertise a data address other than the one it
//! listens on, so peers are routed to the proxies by an nftables DNAT rule inside that host
//! (`tcp dport DATA_PORT` → `PROXY_PORT` on the same address); the proxies forward to the real
//! port locally.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use regolith_client::{AsyncClient, ClientConfig, Error as ClientError, ReplicateConfig};
use regolith_proto::launch::SidecarLaunch;
use regolith_test_support::bins;
use serde::Deserialize;

use crate::error::{Error, Result};
use crate::history::{EventKind, History, OpKind, OpResult, ReplicaLoc, Reply};
use crate::netns::{self, Host};
use crate::proxy::{Proxy, ProxyControl};
use crate::status::http_get;
use crate::value;
use crate::workload::{HostCtx, Workload, WorkloadClient};

/// The data-plane port of every sidecar (on each NIC).
pub const DATA_PORT: u16 = 7600;
/// Where the proxies in front of the proxied host's data ports listen (same addresses).
pub const PROXY_PORT: u16 = 7601;
/// The sidecars' HTTP port (`/status`, `/metrics`), on the first NIC.
pub const METRICS_PORT: u16 = 9300;

/// Which sidecar binary to start, and flags every sidecar gets beyond its own
/// ([`SidecarLaunch::extra`]).
#[derive(Clone, Debug)]
pub struct SidecarProgram {
    pub program: PathBuf,
    pub extra_args: Vec<String>,
}

impl SidecarProgram {
    /// Starts `program`.
    pub fn new(program: impl Into<PathBuf>) -> Self {
        Self {
            program: program.into(),
            extra_args: Vec::new(),
        }
    }

    /// The real `regolith-sidecar` of this build ([`bins`]).
    pub fn built() -> Self {
        Self::new(bins::path(bins::SIDECAR))
    }
}

/// The sizes of values: a share of small ones (inline on the UDS), medium ones (staging, one
/// slice) and large ones (several 1 MiB slices, striped over the NICs).
#[derive(Clone, Debug)]
pub struct ValueSizes {
    pub small: (usize, usize),
    pub medium: (usize, usize),
    pub large: (usize, usize),
    /// Percent of small and of medium values; the rest are large.
    pub small_pct: u64,
    pub medium_pct: u64,
}

impl Default for ValueSizes {
    fn default() -> Self {
        Self {
            small: (2 << 10, 60 << 10),
            medium: (64 << 10, 1 << 20),
            large: (1 << 20, 4 << 20),
            small_pct: 45,
            medium_pct: 40,
        }
    }
}

impl ValueSizes {
    /// The length of the value of write `write_id` of `key` (derived, so it needs no record).
    pub fn len_of(&self, key: &str, write_id: u64) -> usize {
        let h = value::tag(key, write_id.wrapping_mul(0x9e37_79b9) & 0xffff_ffff) & 0xffff_ffff;
        let (lo, hi) = match h % 100 {
            p if p < self.small_pct => self.small,
            p if p < self.small_pct + self.medium_pct => self.medium,
            _ => self.large,
        };
        let span = hi.saturating_sub(lo).max(1) as u64;
        lo.max(value::HEADER_LEN) + ((h / 100) % span) as usize
    }

    /// The largest value.
    pub fn max(&self) -> usize {
        self.small.1.max(self.medium.1).max(self.large.1)
    }
}

/// Keys of the sidecar workload with its disk tier: enough that the working set (about
/// 0.9 MiB per key with one or two replicas) is larger than the sidecars' memory
/// ([`SidecarConfig::segment_size`]), so objects are offloaded to the disks all the time.
pub const DISK_TIER_KEYS: usize = 64;

/// Settings of the sidecar workload.
#[derive(Clone, Debug)]
pub struct SidecarConfig {
    pub launch: SidecarProgram,
    /// Memory each sidecar contributes. With a disk tier, smaller than the working set: metad
    /// offloads objects to the disks above its offload watermark (the checker follows them in
    /// metad's change feed). Without one, large against keys × value size × replicas, so that
    /// nothing is evicted (the checker can account for evictions, but they blunt it).
    pub segment_size: u64,
    /// Each sidecar's disk tier (`--disk DIR:SIZE`, the directory in the run directory),
    /// when set. At least 8 × the largest value: a bucket is an eighth of the disk and must
    /// hold a whole record.
    pub disk_size: Option<u64>,
    pub worker_threads: usize,
    /// Staging area each client asks for.
    pub staging_size: u64,
    pub sizes: ValueSizes,
    /// The host whose data ports sit behind proxies (the data-port latency fault).
    pub proxied_host: Option<String>,
    /// How long a (re)started sidecar may take to serve.
    pub start_timeout: Duration,
    /// How often each sidecar's `/status` is read for generation changes.
    pub poll_every: Duration,
}

impl SidecarConfig {
    /// Without a disk tier: segments large enough that nothing is evicted.
    pub fn memory_only(launch: SidecarProgram) -> Self {
        Self {
            segment_size: 96 << 20,
            disk_size: None,
            ..Self::new(launch)
        }
    }

    pub fn new(launch: SidecarProgram) -> Self {
        Self {
            launch,
            segment_size: 16 << 20,
            disk_size: Some(64 << 20),
            worker_threads: 2,
            staging_size: 16 << 20,
            sizes: ValueSizes::default(),
            proxied_host: Some("s1".into()),
            start_timeout: Duration::from_secs(30),
            poll_every: Duration::from_millis(200),
        }
    }
}

// ---------------------------------------------------------------------------- status

/// The fields of the sidecar's `/status` the workload uses (untrusted input: a body that does
/// not parse is skipped, never a panic).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct SidecarStatus {
    pub node_id: u64,
    pub generation: u64,
    /// metad declared `generation` gone and the sidecar is mounting a new one.
    #[serde(default)]
    pub generation_lost: bool,
    #[serde(default)]
    pub puts: u64,
    #[serde(default)]
    pub gets: u64,
    #[serde(default)]
    pub checksum_mismatches: u64,
    #[serde(default)]
    pub disks: Vec<DiskStatus>,
}

/// One disk of a sidecar's `/status` (docs/ssd.md, "Operations").
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct DiskStatus {
    pub path: String,
    pub healthy: bool,
    #[serde(default)]
    pub failure: Option<String>,
    #[serde(default)]
    pub objects: u64,
}

pub fn parse_sidecar_status(body: &[u8]) -> std::result::Result<SidecarStatus, String> {
    serde_json::from_slice(body).map_err(|e| {
        format!(
            "{e}; body starts {:?}",
            String::from_utf8_lossy(&body[..body.len().min(120)])
        )
    })
}

/// Per-NIC data-plane bytes (in + out) from a sidecar's `/metrics`, by NIC address. Lines that
/// do not parse are skipped.
pub fn parse_nic_bytes(metrics: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for line in metrics.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = line
            .strip_prefix("regolith_sidecar_nic_bytes_in{")
            .or_else(|| line.strip_prefix("regolith_sidecar_nic_bytes_out{"))
        else {
            continue;
        };
        let Some((labels, value)) = rest.split_once('}') else {
            continue;
        };
        let nic = labels
            .split(',')
            .find_map(|l| l.trim().strip_prefix("nic=\""))
            .and_then(|v| v.strip_suffix('"'));
        let value = value.trim().parse::<f64>().ok().filter(|v| *v >= 0.0);
        if let (Some(nic), Some(v)) = (nic, value) {
            *out.entry(nic.to_string()).or_insert(0) += v as u64;
        }
    }
    out
}

/// The sum of every sample of `name` (any labels), e.g. a per-disk gauge over a node's disks.
pub fn sum_metric(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with(' ') || r.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v.max(0.0) as u64)
        .sum()
}

/// Objects a sidecar's disks dropped by themselves since it started: their own eviction,
/// damaged records, a failed disk's objects (docs/ssd.md, "Operations").
pub fn disk_drops(metrics: &str) -> u64 {
    [
        "regolith_sidecar_disk_evicted",
        "regolith_sidecar_disk_corrupt_records",
        "regolith_sidecar_disk_lost",
    ]
    .iter()
    .map(|m| sum_metric(metrics, m))
    .sum()
}

/// A Prometheus counter's value (first sample of `name`, any labels).
pub fn parse_metric(metrics: &str, name: &str) -> Option<u64> {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with(' ') || r.starts_with('{'))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map(|v| v.max(0.0) as u64)
}

// ---------------------------------------------------------------------------- generations

/// The segment generation of every node, as last seen in the sidecars' `/status`. A put
/// records its replicas with the generations known when it began: the generation it landed in
/// is that one or a later one (our view lags metad's, never leads it), so a loss is excused only
/// when that generation, or an earlier one, went away (never a false alarm for a put placed
/// after a remount).
#[derive(Debug, Default)]
pub struct Generations {
    by_node: Mutex<HashMap<u64, u64>>,
}

impl Generations {
    pub fn snapshot(&self) -> HashMap<u64, u64> {
        self.by_node.lock().clone()
    }

    fn set(&self, loc: ReplicaLoc) {
        self.by_node.lock().insert(loc.node, loc.generation);
    }
}

/// The replicas of a stored put, with the generations of `gens`.
fn replica_locs(info: &regolith_client::PutInfo, gens: &HashMap<u64, u64>) -> Vec<ReplicaLoc> {
    info.replicas
        .iter()
        .map(|r| ReplicaLoc {
            node: r.node_id,
            generation: gens.get(&r.node_id).copied().unwrap_or(0),
        })
        .collect()
}

// ---------------------------------------------------------------------------- one node

/// One sidecar host and its sidecar process.
struct Node {
    host: Host,
    launch: SidecarProgram,
    /// This sidecar's flags ([`sidecar_launch`]).
    args: Vec<OsString>,
    log: PathBuf,
    socket: PathBuf,
    metrics_addr: String,
    /// The directory of its disk tier, if it has one.
    disk: Option<PathBuf>,
    /// A read-only bind mount is over the disk directory (in the sidecar's mount namespace).
    disk_read_only: AtomicBool,
    /// Objects offloaded to disk by this node's earlier processes (its counter starts at 0 in
    /// each process).
    offloads_before: AtomicU64,
    child: Mutex<Option<Child>>,
    /// Set between a crash and the restart: clients fail at once.
    down: AtomicBool,
    segment: Mutex<Option<ReplicaLoc>>,
    /// The last generation reported lost by the sidecar itself (reported once).
    lost: Mutex<Option<ReplicaLoc>>,
    generations: Arc<Generations>,
    history: History,
    /// The host's runtime (inside its namespace), for HTTP to the sidecar.
    rt: tokio::runtime::Handle,
}

impl Node {
    fn spawn(&self) -> Result<()> {
        let child = netns::spawn_in_env(
            &self.host.ns,
            &self.launch.program,
            &self.args,
            &self.log,
            &sidecar_env(),
        )?;
        tracing::info!(host = %self.host.name, pid = child.id(), "sidecar started");
        *self.child.lock() = Some(child);
        Ok(())
    }

    /// kill -9; returns whether a process was running.
    fn kill(&self) -> bool {
        match self.child.lock().take() {
            Some(mut c) => {
                let _ = c.kill();
                let _ = c.wait();
                true
            }
            None => false,
        }
    }

    /// The exit status, if the sidecar exited by itself (the child is then forgotten).
    fn exited(&self) -> Option<String> {
        let mut guard = self.child.lock();
        let status = guard.as_mut()?.try_wait().ok()??;
        *guard = None;
        Some(status.to_string())
    }

    fn segment(&self) -> Option<ReplicaLoc> {
        *self.segment.lock()
    }

    /// Records the generation the sidecar now serves; every earlier one of this node is gone.
    fn observe(&self, now: ReplicaLoc, why: &str) {
        let old = self.segment.lock().replace(now);
        self.generations.set(now);
        let Some(old) = old.filter(|o| *o != now) else {
            return;
        };
        // Every generation of this node from the old one up to the new one is gone (a poll may
        // have missed some in between); a new node id (state file lost) ends the old node's.
        let gone = if old.node == now.node && now.generation > old.generation {
            old.generation..now.generation
        } else {
            old.generation..old.generation + 1
        };
        for generation in gone {
            let loc = ReplicaLoc {
                node: old.node,
                generation,
            };
            if *self.lost.lock() == Some(loc) {
                continue; // reported when the sidecar said so
            }
            let why = format!(
                "{}: {why}, now generation {}",
                self.host.name, now.generation
            );
            self.gone(loc, why);
        }
    }

    /// The sidecar says metad dropped its generation `loc` and it is mounting a new one: the
    /// objects there are gone now, even if the new mount takes long (a lost reply).
    fn lost(&self, loc: ReplicaLoc) {
        if self.lost.lock().replace(loc) == Some(loc) {
            return;
        }
        let why = format!(
            "{}: metad dropped it (the sidecar is mounting a new generation)",
            self.host.name
        );
        self.gone(loc, why);
    }

    fn gone(&self, loc: ReplicaLoc, why: String) {
        tracing::info!(host = %self.host.name, node = loc.node, generation = loc.generation, %why, "segment generation gone");
        self.history.event(EventKind::GenerationGone {
            loc,
            why,
            heard_at_us: None,
        });
    }

    async fn status(addr: String) -> std::result::Result<SidecarStatus, String> {
        match http_get(&addr, "/status", Duration::from_millis(500)).await? {
            (200, body) => parse_sidecar_status(&body),
            (code, _) => Err(format!("HTTP {code}")),
        }
    }

    /// Runs `fut` on the host's runtime (inside its namespace) and waits for it.
    fn on_host<F>(&self, fut: F) -> Result<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let task = self.rt.spawn(fut);
        futures_block_on(&self.rt, task)
            .map_err(|e| Error::Cluster(format!("task on {}: {e}", self.host.name)))
    }

    fn pid(&self) -> Option<u32> {
        self.child.lock().as_ref().map(|c| c.id())
    }

    /// The sidecar's first disk in `/status` (the harness gives each sidecar one).
    fn disk_status(&self) -> Result<DiskStatus> {
        let addr = self.metrics_addr.clone();
        let st = self
            .on_host(Node::status(addr))?
            .map_err(|e| Error::Cluster(format!("{}: /status: {e}", self.host.name)))?;
        st.disks
            .into_iter()
            .next()
            .ok_or_else(|| Error::Cluster(format!("{}: /status lists no disk", self.host.name)))
    }

    /// Waits until the sidecar's disk is (or is no longer) in service.
    fn wait_disk(&self, healthy: bool, timeout: Duration) -> Result<DiskStatus> {
        let end = Instant::now() + timeout;
        loop {
            let d = self.disk_status();
            if let Ok(d) = &d {
                if d.healthy == healthy {
                    return Ok(d.clone());
                }
            }
            if Instant::now() > end {
                let state = if healthy {
                    "back in service"
                } else {
                    "taken out"
                };
                return Err(Error::Cluster(format!(
                    "the disk of {} was not {state} within {timeout:?} (last: {d:?})",
                    self.host.name
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Adds the running process's offload counter to the node's total (before it goes).
    fn keep_offloads(&self) {
        if let Ok(m) = self.metrics_text() {
            let n = parse_metric(&m, "regolith_sidecar_disk_offloads_total").unwrap_or(0);
            self.offloads_before.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Runs `args` inside the running sidecar's mount namespace (where its disk is seen).
    fn in_mount_ns(&self, args: &[&str]) -> Result<()> {
        let pid = self.pid().ok_or_else(|| {
            Error::Cluster(format!("the sidecar of {} is not running", self.host.name))
        })?;
        let out = std::process::Command::new("nsenter")
            .arg("--target")
            .arg(pid.to_string())
            .arg("--mount")
            .arg("--")
            .args(args)
            .output()
            .map_err(|e| Error::io("nsenter", e))?;
        if !out.status.success() {
            return Err(Error::Cluster(format!(
                "nsenter -t {pid} -m {args:?}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(())
    }

    fn metrics_text(&self) -> Result<String> {
        let addr = self.metrics_addr.clone();
        match self
            .on_host(async move { http_get(&addr, "/metrics", Duration::from_secs(2)).await })?
        {
            Ok((200, body)) => Ok(String::from_utf8_lossy(&body).to_string()),
            Ok((code, _)) => Err(Error::Cluster(format!(
                "{}: /metrics answered HTTP {code}",
                self.host.name
            ))),
            Err(e) => Err(Error::Cluster(format!("{}: /metrics: {e}", self.host.name))),
        }
    }

    /// Waits until the sidecar serves (its socket accepts and `/status` answers) with a
    /// generation newer than `after`; returns it.
    async fn wait_serving(
        self: Arc<Self>,
        after: Option<ReplicaLoc>,
        timeout: Duration,
    ) -> Result<ReplicaLoc> {
        let end = Instant::now() + timeout;
        let mut last = String::from("not asked yet");
        while Instant::now() < end {
            if let Some(status) = self.exited() {
                return Err(Error::Cluster(format!(
                    "sidecar of {} exited during start-up ({status}):\n{}",
                    self.host.name,
                    log_tail(&self.log, 30)
                )));
            }
            match Self::status(self.metrics_addr.clone()).await {
                Ok(s) => {
                    let loc = ReplicaLoc {
                        node: s.node_id,
                        generation: s.generation,
                    };
                    let newer =
                        after.is_none_or(|a| a.node != loc.node || loc.generation > a.generation);
                    if newer && std::os::unix::net::UnixStream::connect(&self.socket).is_ok() {
                        return Ok(loc);
                    }
                    last = format!(
                        "serving generation {} (waiting for a newer one or the socket)",
                        s.generation
                    );
                }
                Err(e) => last = e,
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(Error::Cluster(format!(
            "sidecar of {} did not serve within {timeout:?} ({last}):\n{}",
            self.host.name,
            log_tail(&self.log, 30)
        )))
    }

    /// Reads `/status` every `every` until `stop`, recording generation changes.
    async fn poll(self: Arc<Self>, every: Duration, stop: Arc<AtomicBool>) {
        while !stop.load(Ordering::Relaxed) {
            tokio::time::sleep(every).await;
            if self.down.load(Ordering::Relaxed) {
                continue;
            }
            match Self::status(self.metrics_addr.clone()).await {
                Ok(s) => {
                    let loc = ReplicaLoc {
                        node: s.node_id,
                        generation: s.generation,
                    };
                    // A crash-restart in progress is recorded by the nemesis itself.
                    if !self.down.load(Ordering::Relaxed) {
                        self.observe(loc, "the sidecar remounted (metad asked it to)");
                        if s.generation_lost {
                            self.lost(loc);
                        }
                    }
                }
                Err(e) => tracing::trace!(host = %self.host.name, error = %e, "status poll failed"),
            }
        }
    }
}

/// The line a sidecar logs once its disks are reconciled with metad (after every start with
/// disks); the warm restart waits for it.
const RECONCILED_LINE: &str = "disk tier reconciled with metad";

/// The sidecars' environment: a `RUST_LOG` given to the run (which replaces the sidecar's own
/// levels) still logs [`RECONCILED_LINE`] (target `regolith_sidecar::offload`, info).
fn sidecar_env() -> Vec<(String, String)> {
    match std::env::var("RUST_LOG") {
        Ok(f) if !f.trim().is_empty() => vec![(
            "RUST_LOG".into(),
            format!("{f},regolith_sidecar::offload=info"),
        )],
        _ => Vec::new(),
    }
}

/// Blocks on a task of `rt` from a thread outside it (the task runs on the runtime's threads).
fn futures_block_on<T: Send + 'static>(
    rt: &tokio::runtime::Handle,
    task: tokio::task::JoinHandle<T>,
) -> std::result::Result<T, tokio::task::JoinError> {
    // Handle::block_on only polls the JoinHandle here; the work itself runs on a runtime
    // thread, inside the namespace.
    rt.block_on(task)
}

fn log_tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The directory of `host`'s disk tier in the run directory, when the sidecars have one.
fn disk_dir(cfg: &SidecarConfig, ctx: &HostCtx) -> Option<PathBuf> {
    cfg.disk_size
        .map(|_| ctx.run_dir.join(format!("sidecar-{}-disk", ctx.host.name)))
}

/// The sidecar of `host`.
fn sidecar_launch(
    cfg: &SidecarConfig,
    ctx: &HostCtx,
    socket: &Path,
    metrics: &str,
) -> SidecarLaunch {
    let host = &ctx.host;
    let mut extra: Vec<OsString> = cfg.launch.extra_args.iter().map(Into::into).collect();
    if let (Some(dir), Some(size)) = (disk_dir(cfg, ctx), cfg.disk_size) {
        extra.push("--disk".into());
        extra.push(format!("{}:{size}", dir.display()).into());
    }
    SidecarLaunch {
        node_name: Some(host.name.clone()),
        state_dir: Some(ctx.run_dir.join(format!("sidecar-{}-state", host.name))),
        segment_size: Some(cfg.segment_size.to_string()),
        metad: ctx.metad_addrs.clone(),
        cluster_token_file: Some(ctx.token_file.clone()),
        data_port: Some(DATA_PORT),
        socket: Some(socket.to_path_buf()),
        metrics_addr: Some(metrics.to_string()),
        worker_threads: Some(cfg.worker_threads),
        huge_pages: Some("never".into()),
        test_hooks: true,
        nics: host.nics.iter().map(|nic| nic.addr.to_string()).collect(),
        extra,
        ..SidecarLaunch::default()
    }
}

/// The nftables table that routes peers' data-plane connections to `host`'s proxies.
fn proxy_nat_script(host: &Host) -> String {
    let mut s = String::from("table ip rgc_dataproxy {\n  chain prerouting {\n");
    s.push_str("    type nat hook prerouting priority -100; policy accept;\n");
    for nic in &host.nics {
        s.push_str(&format!(
            "    ip daddr {a} tcp dport {DATA_PORT} dnat to {a}:{PROXY_PORT}\n",
            a = nic.addr
        ));
    }
    s.push_str("  }\n}\n");
    s
}

// ---------------------------------------------------------------------------- the workload

/// The Unix socket of `host`'s sidecar in run directory `run_dir`.
pub fn socket_path(run_dir: &Path, host: &str) -> PathBuf {
    run_dir.join(format!("{host}.sock"))
}

/// The sidecar-backed workload (see the module documentation).
pub struct SidecarWorkload {
    cfg: SidecarConfig,
    nodes: Mutex<BTreeMap<String, Arc<Node>>>,
    generations: Arc<Generations>,
    proxies: Mutex<Vec<Proxy>>,
    stop: Arc<AtomicBool>,
}

impl SidecarWorkload {
    pub fn new(cfg: SidecarConfig) -> Self {
        Self {
            cfg,
            nodes: Mutex::new(BTreeMap::new()),
            generations: Arc::new(Generations::default()),
            proxies: Mutex::new(Vec::new()),
            stop: Arc::new(AtomicBool::new(false)),
        }
    }

    fn node(&self, host: &str) -> Result<Arc<Node>> {
        self.nodes
            .lock()
            .get(host)
            .cloned()
            .ok_or_else(|| Error::Config(format!("sidecar host {host} was not started")))
    }

    /// Puts proxies in front of `host`'s data ports and routes peers to them.
    async fn start_proxies(&self, ctx: &HostCtx) -> Result<()> {
        let mut started = Vec::new();
        for nic in &ctx.host.nics {
            let listen = SocketAddr::new(nic.addr.into(), PROXY_PORT);
            let upstream = SocketAddr::new(nic.addr.into(), DATA_PORT);
            started.push(Proxy::start(listen, upstream).await?);
        }
        netns::nft_apply(
            &ctx.host.ns,
            &ctx.run_dir,
            &format!("{}-dataproxy", ctx.host.name),
            &proxy_nat_script(&ctx.host),
        )?;
        tracing::info!(host = %ctx.host.name, proxies = started.len(), "data ports behind proxies");
        self.proxies.lock().extend(started);
        Ok(())
    }
}

impl Drop for SidecarWorkload {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for node in self.nodes.lock().values() {
            node.kill();
        }
    }
}

impl Workload for SidecarWorkload {
    type Client = SidecarClient;

    fn name(&self) -> &'static str {
        "sidecar"
    }

    /// The sidecars run their object index (on by default) unless the launch turns it off.
    fn read_staleness(&self) -> Option<std::time::Duration> {
        let off = self
            .cfg
            .launch
            .extra_args
            .iter()
            .any(|a| a == "--index=false");
        (!off).then_some(crate::checker::INDEX_READ_STALENESS)
    }

    async fn start_host(&self, ctx: HostCtx) -> Result<()> {
        let host = &ctx.host;
        if !self.cfg.launch.program.exists() {
            return Err(Error::MissingBinary(self.cfg.launch.program.clone()));
        }
        let socket = socket_path(&ctx.run_dir, &host.name);
        let metrics_addr = format!("{}:{METRICS_PORT}", host.addr());
        let node = Arc::new(Node {
            args: sidecar_launch(&self.cfg, &ctx, &socket, &metrics_addr).args(),
            launch: self.cfg.launch.clone(),
            log: ctx.run_dir.join(format!("sidecar-{}.log", host.name)),
            socket,
            metrics_addr,
            disk: disk_dir(&self.cfg, &ctx),
            disk_read_only: AtomicBool::new(false),
            offloads_before: AtomicU64::new(0),
            child: Mutex::new(None),
            down: AtomicBool::new(false),
            segment: Mutex::new(None),
            lost: Mutex::new(None),
            generations: self.generations.clone(),
            history: ctx.history.clone(),
            rt: tokio::runtime::Handle::current(),
            host: host.clone(),
        });
        node.spawn()?;
        let loc = node
            .clone()
            .wait_serving(None, self.cfg.start_timeout)
            .await?;
        node.observe(loc, "started");
        tracing::info!(host = %host.name, node = loc.node, generation = loc.generation, "sidecar serving");
        if self.cfg.proxied_host.as_deref() == Some(host.name.as_str()) {
            self.start_proxies(&ctx).await?;
        }
        tokio::spawn(node.clone().poll(self.cfg.poll_every, self.stop.clone()));
        self.nodes.lock().insert(host.name.clone(), node);
        Ok(())
    }

    fn client(&self, host: &str, process: u32) -> Result<SidecarClient> {
        let node = self.node(host)?;
        let mut cfg = ClientConfig::new(&node.socket);
        cfg.staging_size = self.cfg.staging_size;
        cfg.name = format!("chaos-p{process}");
        Ok(SidecarClient {
            node,
            cfg,
            client: tokio::sync::OnceCell::new(),
            sizes: self.cfg.sizes.clone(),
        })
    }

    fn crash_node(&self, host: &str) -> Result<()> {
        let node = self.node(host)?;
        node.keep_offloads();
        node.down.store(true, Ordering::Relaxed);
        if !node.kill() {
            return Err(Error::Cluster(format!(
                "the sidecar of {host} was not running"
            )));
        }
        if let Some(loc) = node.segment() {
            node.gone(
                loc,
                format!("{host}: kill -9 of the sidecar (its memory is gone)"),
            );
        }
        Ok(())
    }

    fn restart_node(&self, host: &str) -> Result<()> {
        let node = self.node(host)?;
        let before = node.segment();
        node.spawn()?;
        let (n, timeout) = (node.clone(), self.cfg.start_timeout);
        let loc = node.on_host(async move { n.wait_serving(before, timeout).await })??;
        node.observe(loc, "restarted");
        node.down.store(false, Ordering::Relaxed);
        tracing::info!(
            host,
            node = loc.node,
            generation = loc.generation,
            "sidecar restarted"
        );
        Ok(())
    }

    fn freeze_index(&self, host: &str, on: bool) -> Result<String> {
        let node = self.node(host)?;
        let addr = node.metrics_addr.clone();
        let path = format!("/debug/freeze-index?on={}", u8::from(on));
        let answer = node.on_host(async move {
            crate::status::http_request("POST", &addr, &path, Duration::from_secs(2)).await
        })?;
        match answer {
            Ok((200, _)) if on => Ok(format!("the index of {host}'s sidecar frozen")),
            Ok((200, _)) => Ok(format!("the index of {host}'s sidecar thawed (it resyncs)")),
            Ok((code, body)) => Err(Error::Cluster(format!(
                "{host}: freeze-index answered HTTP {code}: {}",
                String::from_utf8_lossy(&body)
            ))),
            Err(e) => Err(Error::Cluster(format!("{host}: freeze-index: {e}"))),
        }
    }

    fn upgrade_node(&self, host: &str) -> Result<String> {
        let node = self.node(host)?;
        let before = node.segment().ok_or_else(|| {
            Error::Cluster(format!("the sidecar of {host} serves no segment yet"))
        })?;
        node.keep_offloads();
        let mut args = node.args.clone();
        args.push("--takeover".into());
        let new = netns::spawn_in_env(
            &node.host.ns,
            &node.launch.program,
            &args,
            &node.log,
            &sidecar_env(),
        )?;
        let new_pid = new.id();
        // The new process is the node's from now on; the old one must exit 0 by itself once
        // it handed over.
        let old = node.child.lock().replace(new);
        let Some(mut old) = old else {
            return Err(Error::Cluster(format!(
                "the sidecar of {host} was not running"
            )));
        };
        let end = Instant::now() + self.cfg.start_timeout;
        let status = loop {
            if let Some(st) = old.try_wait().map_err(|e| Error::Cluster(e.to_string()))? {
                break st;
            }
            let new_exited = node.exited();
            if Instant::now() > end || new_exited.is_some() {
                // The old process serves on after a failed hand-over: it stays the node's.
                node.kill();
                *node.child.lock() = Some(old);
                return Err(Error::Cluster(format!(
                    "the hand-over of {host}'s sidecar did not complete (new process: {}):\n{}",
                    new_exited.unwrap_or_else(|| "still running, killed".into()),
                    log_tail(&node.log, 30)
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        if !status.success() {
            return Err(Error::Cluster(format!(
                "the old sidecar of {host} exited with {status} after the hand-over"
            )));
        }
        let (n, timeout) = (node.clone(), self.cfg.start_timeout);
        let loc = node.on_host(async move { n.wait_serving(None, timeout).await })??;
        node.observe(loc, "upgraded");
        if loc != before {
            return Err(Error::Cluster(format!(
                "the upgraded sidecar of {host} serves node {} generation {}, not {} generation {} (a remount loses the cache)",
                loc.node, loc.generation, before.node, before.generation
            )));
        }
        tracing::info!(
            host,
            pid = new_pid,
            generation = loc.generation,
            "sidecar upgraded"
        );
        // A hand-over does not carry the disks yet (docs/ssd.md): the successor cannot open
        // a disk its predecessor still holds, serves without it, and metad drops what it held.
        let disk = match node.disk.as_ref().map(|_| node.disk_status()) {
            Some(Ok(d)) if !d.healthy => format!(
                "; its disk did not come along ({})",
                d.failure.unwrap_or_default()
            ),
            _ => String::new(),
        };
        Ok(format!(
            "sidecar of {host} upgraded (pid {new_pid}), still generation {}{disk}",
            loc.generation
        ))
    }

    fn data_proxies(&self) -> Vec<Arc<ProxyControl>> {
        self.proxies
            .lock()
            .iter()
            .map(|p| p.control().clone())
            .collect()
    }

    fn nic_traffic(&self, host: &str) -> Result<BTreeMap<String, u64>> {
        Ok(parse_nic_bytes(&self.node(host)?.metrics_text()?))
    }

    fn exited(&self) -> Vec<(String, String)> {
        self.nodes
            .lock()
            .iter()
            .filter_map(|(name, n)| n.exited().map(|s| (name.clone(), s)))
            .collect()
    }

    fn report(&self) -> Vec<String> {
        let nodes: Vec<Arc<Node>> = self.nodes.lock().values().cloned().collect();
        nodes.iter().map(|n| node_report(n)).collect()
    }

    fn log_tails(&self, n: usize) -> String {
        let mut s = String::new();
        for node in self.nodes.lock().values() {
            s.push_str(&format!("----- sidecar of {} -----\n", node.host.name));
            s.push_str(&log_tail(&node.log, n));
            s.push('\n');
        }
        s
    }

    fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    fn value_len(&self, key: &str, write_id: u64) -> Option<u64> {
        Some(self.cfg.sizes.len_of(key, write_id) as u64)
    }

    /// With disks, objects move after their put: the checker follows them in the feed.
    fn follows_feed(&self) -> bool {
        self.cfg.disk_size.is_some()
    }

    fn node_id(&self, host: &str) -> Option<u64> {
        self.node(host).ok()?.segment().map(|s| s.node)
    }

    fn fail_disk(&self, host: &str, how: crate::nemesis::DiskFailure) -> Result<String> {
        use crate::nemesis::DiskFailure;
        let node = self.node(host)?;
        let dir = node
            .disk
            .clone()
            .ok_or_else(|| Error::Config(format!("the sidecar of {host} has no disk tier")))?;
        // A disk failure that loses nothing tests nothing: wait (bounded) until it holds objects.
        let end = Instant::now() + HOLDING_TIMEOUT;
        let mut before = node.disk_status()?;
        while before.healthy && before.objects == 0 && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(100));
            before = node.disk_status()?;
        }
        let d = dir.display().to_string();
        match how {
            DiskFailure::Removed => {
                std::fs::remove_dir_all(&dir).map_err(|e| Error::io(format!("remove {d}"), e))?
            }
            DiskFailure::ReadOnly => {
                node.in_mount_ns(&["mount", "--bind", &d, &d])?;
                node.disk_read_only.store(true, Ordering::Relaxed);
                node.in_mount_ns(&["mount", "-o", "remount,bind,ro", &d])?;
            }
        }
        let t0 = Instant::now();
        // The sidecar probes its disks every 5 s.
        let after = node.wait_disk(false, Duration::from_secs(15))?;
        let lost = node
            .metrics_text()
            .map(|m| sum_metric(&m, "regolith_sidecar_disk_lost"))
            .unwrap_or(0);
        let was = if before.healthy {
            String::new()
        } else {
            format!(" (it was out of service already: {:?})", before.failure)
        };
        Ok(format!(
            "{how}: {d} of {host}, {} objects on it{was}; taken out after {:.1}s ({}); \
             {lost} objects lost with it",
            before.objects,
            t0.elapsed().as_secs_f64(),
            after.failure.unwrap_or_default()
        ))
    }

    /// What an operator does: replaces the device (an empty directory at the same path), then
    /// upgrades the sidecar in place (`--takeover`, the hand-over of docs/sidecar.md) so that
    /// the new process opens the new disk while keeping the node's memory and generation — a
    /// plain restart would lose the node's memory, a SIGTERM unmounts it and drops the cache.
    fn replace_disk(&self, host: &str) -> Result<String> {
        let node = self.node(host)?;
        let dir = node
            .disk
            .clone()
            .ok_or_else(|| Error::Config(format!("the sidecar of {host} has no disk tier")))?;
        let d = dir.display().to_string();
        if node.disk_read_only.swap(false, Ordering::Relaxed) {
            node.in_mount_ns(&["umount", &d])?;
        }
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|e| Error::io(format!("remove {d}"), e))?;
        }
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(format!("create {d}"), e))?;
        let upgraded = Workload::upgrade_node(self, host)?;
        let disk = node.wait_disk(true, Duration::from_secs(10))?;
        Ok(format!(
            "an empty disk at {d}; {upgraded}; the new disk is in service ({} objects)",
            disk.objects
        ))
    }

    fn disk_drops(&self, host: &str) -> Result<u64> {
        Ok(disk_drops(&self.node(host)?.metrics_text()?))
    }

    fn disks_reconciled(&self, host: &str) -> Result<usize> {
        let node = self.node(host)?;
        let text = std::fs::read_to_string(&node.log)
            .map_err(|e| Error::io(node.log.display().to_string(), e))?;
        Ok(text.lines().filter(|l| l.contains(RECONCILED_LINE)).count())
    }

    fn read_through(&self, host: &str, process: u32, keys: &[String]) -> Result<Vec<OpResult>> {
        let node = self.node(host)?;
        let client = self.client(host, process)?;
        let history = node.history.clone();
        let keys = keys.to_vec();
        node.on_host(async move {
            let mut out = Vec::with_capacity(keys.len());
            for key in keys {
                let r = history
                    .record(process, &key, OpKind::Get, async {
                        crate::workload::run_op(&client, &key, &OpKind::Get, READ_TIMEOUT).await
                    })
                    .await;
                out.push(r);
            }
            out
        })
    }

    fn disk_offloads(&self) -> Option<u64> {
        self.cfg.disk_size?;
        let nodes: Vec<Arc<Node>> = self.nodes.lock().values().cloned().collect();
        Some(
            nodes
                .iter()
                .map(|n| {
                    let now = n
                        .metrics_text()
                        .ok()
                        .and_then(|m| parse_metric(&m, "regolith_sidecar_disk_offloads_total"))
                        .unwrap_or(0);
                    n.offloads_before.load(Ordering::Relaxed) + now
                })
                .sum(),
        )
    }
}

/// How long a disk fault waits for its disk to hold objects.
pub const HOLDING_TIMEOUT: Duration = Duration::from_secs(20);

/// How long one get of the harness's own reads may take.
const READ_TIMEOUT: Duration = Duration::from_secs(8);

/// One line about a sidecar at the end of the run.
fn node_report(n: &Node) -> String {
    let seg = n
        .segment()
        .map(|s| format!("node {} generation {}", s.node, s.generation))
        .unwrap_or_else(|| "no segment".into());
    let addr = n.metrics_addr.clone();
    let status = n
        .on_host(Node::status(addr))
        .map_err(|e| e.to_string())
        .and_then(|r| r);
    let counts = match status {
        Ok(s) => format!("puts {}, gets {}", s.puts, s.gets),
        Err(e) => format!("status unavailable ({e})"),
    };
    match n.metrics_text() {
        Ok(m) => {
            let nics: Vec<String> = parse_nic_bytes(&m)
                .iter()
                .map(|(nic, b)| format!("{nic} {:.1} MiB", *b as f64 / (1u64 << 20) as f64))
                .collect();
            format!(
                "sidecar {}: {seg}; {counts}; checksum mismatches {}, remounts {}; data plane {}",
                n.host.name,
                parse_metric(&m, "regolith_sidecar_checksum_mismatches_total").unwrap_or(0),
                parse_metric(&m, "regolith_sidecar_remounts_total").unwrap_or(0),
                nics.join(", ")
            )
        }
        Err(e) => format!(
            "sidecar {}: {seg}; {counts}; metrics unavailable: {e}",
            n.host.name
        ),
    }
}

// ---------------------------------------------------------------------------- one client

/// A workload client: one connection to its host's sidecar.
pub struct SidecarClient {
    node: Arc<Node>,
    cfg: ClientConfig,
    /// Connected at the first operation (the client reconnects by itself afterwards).
    client: tokio::sync::OnceCell<AsyncClient>,
    sizes: ValueSizes,
}

/// Whether a put prefers a local first replica (half of them, derived from the write).
fn prefers_local(write_id: u64) -> bool {
    write_id & 1 == 0
}

/// Classifies a failed put. Only outcomes decided before anything was reserved, or answers
/// that say nothing was written, are failures; everything else may have been committed.
pub fn put_error(e: &ClientError) -> OpResult {
    match e {
        ClientError::AlreadyExists { .. } => OpResult::Ok(Reply::AlreadyExists),
        ClientError::NoSpace { .. }
        | ClientError::InvalidArgument(_)
        | ClientError::BufferTooSmall { .. }
        | ClientError::Connect { .. }
        | ClientError::Hello { .. } => OpResult::Fail(format!("put: {e}")),
        _ => OpResult::Indeterminate(format!("put: {e}")),
    }
}

/// Classifies a get's answer.
pub fn get_outcome(key: &str, r: std::result::Result<Vec<u8>, ClientError>) -> OpResult {
    match r {
        Ok(bytes) => match value::decode_bytes(key, &bytes) {
            Ok(write_id) => OpResult::Ok(Reply::Found { write_id }),
            Err(detail) => OpResult::Ok(Reply::Corrupt { detail }),
        },
        Err(ClientError::NotFound { .. }) => OpResult::Ok(Reply::NotFound),
        Err(e @ ClientError::Corrupt { .. }) => OpResult::Ok(Reply::CorruptMiss {
            detail: e.to_string(),
        }),
        Err(e) => OpResult::Fail(format!("get: {e}")),
    }
}

/// Classifies a remove's answer (a lost connection or an unavailable metad may have removed).
pub fn remove_outcome(r: std::result::Result<(), ClientError>) -> OpResult {
    match r {
        Ok(()) => OpResult::Ok(Reply::Removed(true)),
        Err(ClientError::NotFound { .. }) => OpResult::Ok(Reply::Removed(false)),
        Err(e @ (ClientError::InvalidArgument(_) | ClientError::Connect { .. })) => {
            OpResult::Fail(format!("remove: {e}"))
        }
        Err(e) => OpResult::Indeterminate(format!("remove: {e}")),
    }
}

impl SidecarClient {
    /// The connected client, or why the operation cannot start (it then had no effect).
    async fn connected(&self) -> std::result::Result<&AsyncClient, OpResult> {
        if self.node.down.load(Ordering::Relaxed) {
            return Err(OpResult::Fail("sidecar down".into()));
        }
        self.client
            .get_or_try_init(|| AsyncClient::connect(self.cfg.clone()))
            .await
            .map_err(|e| OpResult::Fail(format!("connect: {e}")))
    }
}

impl WorkloadClient for SidecarClient {
    async fn put(&self, key: &str, write_id: u64, replicas: u32) -> OpResult {
        let client = match self.connected().await {
            Ok(c) => c,
            Err(r) => return r,
        };
        let data = value::bytes(key, write_id, self.sizes.len_of(key, write_id));
        let cfg = ReplicateConfig {
            replica_num: replicas,
            prefer_local: prefers_local(write_id),
            ..Default::default()
        };
        let gens = self.node.generations.snapshot();
        match client.put(key, &data, &cfg).await {
            Ok(info) => OpResult::Ok(Reply::Stored {
                replicas: replica_locs(&info, &gens),
                extents: Vec::new(),
            }),
            Err(e) => put_error(&e),
        }
    }

    async fn get(&self, key: &str) -> OpResult {
        match self.connected().await {
            Ok(c) => get_outcome(key, c.get(key).await),
            Err(r) => r,
        }
    }

    async fn exists(&self, key: &str) -> OpResult {
        match self.connected().await {
            Ok(c) => match c.exists(key).await {
                Ok(b) => OpResult::Ok(Reply::Exists(b)),
                Err(e) => OpResult::Fail(format!("exists: {e}")),
            },
            Err(r) => r,
        }
    }

    async fn remove(&self, key: &str) -> OpResult {
        match self.connected().await {
            Ok(c) => remove_outcome(c.remove(key).await),
            Err(r) => r,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_and_metrics_parse_and_refuse_garbage() {
        let s = parse_sidecar_status(br#"{"node_id":3,"generation":2,"puts":5,"x":1}"#).unwrap();
        assert_eq!((s.node_id, s.generation, s.puts), (3, 2, 5));
        assert!(parse_sidecar_status(b"\xff\x00not json").is_err());
        assert!(parse_sidecar_status(br#"{"node_id":"three"}"#).is_err());
        let m = "# HELP x\n\
                 regolith_sidecar_nic_bytes_in{nic=\"10.77.0.21\"} 100\n\
                 regolith_sidecar_nic_bytes_out{nic=\"10.77.0.21\"} 50\n\
                 regolith_sidecar_nic_bytes_in{nic=\"10.77.1.21\"} 7\n\
                 regolith_sidecar_nic_bytes_in{nic=\"bad\"} -3\n\
                 regolith_sidecar_nic_bytes_in{nic=\"10.77.1.21\" 9\n\
                 regolith_sidecar_checksum_mismatches_total 2\n\
                 garbage line {{{\n";
        let nics = parse_nic_bytes(m);
        assert_eq!(nics.get("10.77.0.21"), Some(&150));
        assert_eq!(nics.get("10.77.1.21"), Some(&7));
        assert_eq!(nics.len(), 2);
        assert_eq!(
            parse_metric(m, "regolith_sidecar_checksum_mismatches_total"),
            Some(2)
        );
        assert_eq!(parse_metric(m, "regolith_sidecar_nic"), None);
    }

    #[test]
    fn value_sizes_span_kib_to_mib_and_are_derived_from_the_write() {
        let s = ValueSizes::default();
        let lens: Vec<usize> = (0..2000).map(|w| s.len_of("key-001", w)).collect();
        assert_eq!(
            lens,
            (0..2000)
                .map(|w| s.len_of("key-001", w))
                .collect::<Vec<_>>()
        );
        assert!(lens.iter().all(|l| (2 << 10..=4 << 20).contains(l)));
        let small = lens.iter().filter(|l| **l < 64 << 10).count();
        let large = lens.iter().filter(|l| **l >= 1 << 20).count();
        assert!((700..1100).contains(&small), "{small}");
        assert!((200..400).contains(&large), "{large}");
    }

    #[test]
    fn client_errors_are_classified_by_what_they_prove() {
        let key = || "k".to_string();
        assert_eq!(
            put_error(&ClientError::AlreadyExists { key: key() }),
            OpResult::Ok(Reply::AlreadyExists)
        );
        assert!(matches!(
            put_error(&ClientError::NoSpace {
                key: key(),
                message: String::new()
            }),
            OpResult::Fail(_)
        ));
        for e in [
            ClientError::Disconnected("eof".into()),
            ClientError::Server {
                key: key(),
                code: regolith_client::pb::Code::Unavailable,
                message: String::new(),
            },
            ClientError::Protocol("x".into()),
        ] {
            assert!(matches!(put_error(&e), OpResult::Indeterminate(_)), "{e}");
        }
        let v = value::bytes("k", 4, 5000);
        assert_eq!(
            get_outcome("k", Ok(v.clone())),
            OpResult::Ok(Reply::Found { write_id: 4 })
        );
        assert!(matches!(
            get_outcome("other", Ok(v)),
            OpResult::Ok(Reply::Corrupt { .. })
        ));
        assert!(matches!(
            get_outcome("k", Err(ClientError::Corrupt { key: key() })),
            OpResult::Ok(Reply::CorruptMiss { .. })
        ));
        assert_eq!(
            get_outcome("k", Err(ClientError::NotFound { key: key() })),
            OpResult::Ok(Reply::NotFound)
        );
        assert!(matches!(
            get_outcome("k", Err(ClientError::Disconnected("x".into()))),
            OpResult::Fail(_)
        ));
        assert_eq!(
            remove_outcome(Err(ClientError::NotFound { key: key() })),
            OpResult::Ok(Reply::Removed(false))
        );
        assert!(matches!(
            remove_outcome(Err(ClientError::Disconnected("x".into()))),
            OpResult::Indeterminate(_)
        ));
    }

    #[test]
    fn generation_changes_mark_every_earlier_generation_gone() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let history = History::new();
        let node = Node {
            host: Host {
                name: "s1".into(),
                ns: "none".into(),
                nics: vec![],
            },
            launch: SidecarProgram::new("/nonexistent"),
            args: vec![],
            log: PathBuf::from("/nonexistent"),
            socket: PathBuf::from("/nonexistent"),
            metrics_addr: String::new(),
            disk: None,
            disk_read_only: AtomicBool::new(false),
            offloads_before: AtomicU64::new(0),
            child: Mutex::new(None),
            down: AtomicBool::new(false),
            segment: Mutex::new(None),
            lost: Mutex::new(None),
            generations: Arc::new(Generations::default()),
            history: history.clone(),
            rt: rt.handle().clone(),
        };
        let loc = |generation| ReplicaLoc {
            node: 4,
            generation,
        };
        node.observe(loc(1), "started");
        node.observe(loc(1), "poll");
        node.observe(loc(4), "remount");
        // Generation 4 dropped by metad while the new mount hangs: gone at once, once.
        node.lost(loc(4));
        node.lost(loc(4));
        node.observe(loc(5), "remount");
        let gone: Vec<u64> = history
            .snapshot()
            .events
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::GenerationGone { loc, .. } => Some(loc.generation),
                _ => None,
            })
            .collect();
        assert_eq!(gone, vec![1, 2, 3, 4]);
        assert_eq!(node.generations.snapshot().get(&4), Some(&5));
    }
}
