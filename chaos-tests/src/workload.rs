//! The workload: concurrent clients on the sidecar hosts doing put (1 or 2 replicas), get,
//! exists and remove on a bounded key space, every operation recorded in the [`History`].
//!
//! How an operation reaches the store is pluggable: a [`Workload`] prepares each sidecar host
//! and hands out [`WorkloadClient`]s. [`crate::sidecars::SidecarWorkload`] runs a real sidecar
//! per host and talks to it over its Unix socket; [`crate::metad_only::MetadOnly`] talks to
//! metad directly (a fake sidecar per host, no bytes move). Clients run on their host's
//! [`NsRuntime`], so their traffic leaves from that host.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::error::{Error, Result};
use crate::history::{History, OpKind, OpResult, Reply};
use crate::netns::{Host, NsRuntime};

/// What a workload needs to know to set up one sidecar host.
#[derive(Clone, Debug)]
pub struct HostCtx {
    pub host: Host,
    /// gRPC addresses of every metad host.
    pub metad_addrs: Vec<String>,
    pub token: String,
    /// The file holding the cluster token.
    pub token_file: PathBuf,
    /// The run directory (logs, state directories, sockets).
    pub run_dir: PathBuf,
    pub history: History,
}

/// One client. Implementations classify every outcome: `Ok` only for a definite answer, `Fail`
/// only when the operation certainly had no effect, `Indeterminate` otherwise. A put writes
/// the value derived from `(key, write_id)` ([`crate::value`]); a get decodes what it read
/// back to a write id ([`Reply::Found`]) or reports [`Reply::Corrupt`].
pub trait WorkloadClient: Send + Sync + 'static {
    fn put(&self, key: &str, write_id: u64, replicas: u32)
        -> impl Future<Output = OpResult> + Send;
    fn get(&self, key: &str) -> impl Future<Output = OpResult> + Send;
    fn exists(&self, key: &str) -> impl Future<Output = OpResult> + Send;
    fn remove(&self, key: &str) -> impl Future<Output = OpResult> + Send;
}

/// A way of running operations against the store.
pub trait Workload: Send + Sync + 'static {
    type Client: WorkloadClient;

    fn name(&self) -> &'static str;

    /// Prepares a sidecar host (mount a segment, connect to the local sidecar). Runs on that
    /// host's runtime, inside its namespace; background tasks it spawns stay there.
    fn start_host(&self, ctx: HostCtx) -> impl Future<Output = Result<()>> + Send;

    /// A client for `process` on `host` (after [`Workload::start_host`]).
    fn client(&self, host: &str, process: u32) -> Result<Self::Client>;

    /// Crashes the node's sidecar (its segment's contents are lost). Workloads that cannot
    /// answer "unsupported" and the nemesis reports it.
    fn crash_node(&self, host: &str) -> Result<()> {
        Err(Error::Config(format!(
            "workload {} cannot crash the sidecar of {host}",
            self.name()
        )))
    }

    /// Restarts a crashed node's sidecar (it mounts a new generation).
    fn restart_node(&self, host: &str) -> Result<()> {
        Err(Error::Config(format!(
            "workload {} cannot restart the sidecar of {host}",
            self.name()
        )))
    }

    /// Upgrades the node's sidecar in place (a new process takes the segment over with
    /// `--takeover`: same generation, nothing lost); returns what happened.
    fn upgrade_node(&self, host: &str) -> Result<String> {
        Err(Error::Config(format!(
            "workload {} cannot upgrade the sidecar of {host}",
            self.name()
        )))
    }

    /// Freezes (`on`) or thaws the object index of `host`'s sidecar (its test hook): frozen,
    /// it keeps answering from a copy that no longer follows metad (a lagging index); thawed,
    /// it resyncs.
    fn freeze_index(&self, host: &str, _on: bool) -> Result<String> {
        Err(Error::Config(format!(
            "workload {} has no object index on {host}",
            self.name()
        )))
    }

    /// Controls of the proxies in front of the sidecars' data ports (the data-port latency
    /// fault acts on them); none for a workload that moves no bytes.
    fn data_proxies(&self) -> Vec<Arc<crate::proxy::ProxyControl>> {
        Vec::new()
    }

    /// Data-plane bytes (in + out) so far through each NIC of `host`'s sidecar, by address.
    fn nic_traffic(&self, host: &str) -> Result<BTreeMap<String, u64>> {
        Err(Error::Config(format!(
            "workload {} moves no bytes on {host}",
            self.name()
        )))
    }

    /// Processes of the workload (sidecars) that exited by themselves since the last call:
    /// (host, exit status). The harness reports them as crashes and restarts them.
    fn exited(&self) -> Vec<(String, String)> {
        Vec::new()
    }

    /// Lines about the workload's processes for the end-of-run report.
    fn report(&self) -> Vec<String> {
        Vec::new()
    }

    /// The last `n` log lines of the workload's processes (for failure reports).
    fn log_tails(&self, _n: usize) -> String {
        String::new()
    }

    /// How stale a get through one node may be after a change made through another (the
    /// sidecars' object index); `None`: every read is held to linearizability.
    fn read_staleness(&self) -> Option<std::time::Duration> {
        None
    }

    /// Stops background tasks (heartbeats) at the end of the run.
    fn stop(&self) {}

    /// The size of the value a put of `(key, write id)` writes, when the workload derives it
    /// (the checker matches puts to the objects metad's change feed lists).
    fn value_len(&self, _key: &str, _write_id: u64) -> Option<u64> {
        None
    }

    /// Whether the checker needs metad's change feed (objects move between tiers after their
    /// put): the harness then follows it ([`crate::feed`]).
    fn follows_feed(&self) -> bool {
        false
    }

    /// The node id of `host`'s sidecar, once it serves.
    fn node_id(&self, _host: &str) -> Option<u64> {
        None
    }

    /// Makes `host`'s disk directory unusable while its sidecar runs; returns what happened
    /// once the sidecar took the disk out.
    fn fail_disk(&self, host: &str, _how: crate::nemesis::DiskFailure) -> Result<String> {
        Err(Error::Config(format!(
            "workload {} has no disk tier on {host}",
            self.name()
        )))
    }

    /// Gives `host`'s sidecar a usable, empty disk again (see the implementation).
    fn replace_disk(&self, host: &str) -> Result<String> {
        Err(Error::Config(format!(
            "workload {} has no disk tier on {host}",
            self.name()
        )))
    }

    /// Objects the disks of `host`'s running sidecar dropped by themselves since it started
    /// (their eviction, damaged records, a failed disk).
    fn disk_drops(&self, host: &str) -> Result<u64> {
        Err(Error::Config(format!(
            "workload {} has no disk tier on {host}",
            self.name()
        )))
    }

    /// How many times a sidecar of `host` has reconciled its disks with metad (once per
    /// start with disks).
    fn disks_reconciled(&self, host: &str) -> Result<usize> {
        Err(Error::Config(format!(
            "workload {} has no disk tier on {host}",
            self.name()
        )))
    }

    /// Gets `keys` through `host`'s sidecar as client `process`, each recorded in the history.
    fn read_through(&self, host: &str, _process: u32, _keys: &[String]) -> Result<Vec<OpResult>> {
        Err(Error::Config(format!(
            "workload {} cannot read through {host}",
            self.name()
        )))
    }

    /// Objects the sidecars moved from memory to disk over the run (every process of every
    /// node), when they have disks.
    fn disk_offloads(&self) -> Option<u64> {
        None
    }
}

/// The shape of the load.
#[derive(Clone, Debug)]
pub struct WorkloadConfig {
    /// Keys are `key-000` .. `key-{keys-1}`.
    pub keys: usize,
    pub clients_per_host: usize,
    /// Pause between two operations of one client.
    pub think: Duration,
    /// An operation with no answer by then is recorded (put/remove indeterminate, reads failed).
    pub op_timeout: Duration,
    pub seed: u64,
}

impl Default for WorkloadConfig {
    fn default() -> Self {
        Self {
            keys: 40,
            clients_per_host: 2,
            think: Duration::from_millis(15),
            op_timeout: Duration::from_secs(8),
            seed: 1,
        }
    }
}

pub fn key_name(i: usize) -> String {
    format!("key-{i:03}")
}

/// The operation mix: puts 40 % (half with 2 replicas), gets 35 %, exists 15 %, removes 10 %.
fn choose_op(rng: &mut StdRng, write_ids: &AtomicU64) -> OpKind {
    match rng.gen_range(0..100) {
        0..=39 => OpKind::Put {
            write_id: write_ids.fetch_add(1, Ordering::Relaxed),
            replicas: rng.gen_range(1..=2),
        },
        40..=74 => OpKind::Get,
        75..=89 => OpKind::Exists,
        _ => OpKind::Remove,
    }
}

/// Runs one operation with the timeout, returning its result.
pub async fn run_op<C: WorkloadClient>(
    client: &C,
    key: &str,
    kind: &OpKind,
    timeout: Duration,
) -> OpResult {
    let fut = async {
        match kind {
            OpKind::Put { write_id, replicas } => client.put(key, *write_id, *replicas).await,
            OpKind::Get => client.get(key).await,
            OpKind::Exists => client.exists(key).await,
            OpKind::Remove => client.remove(key).await,
        }
    };
    match tokio::time::timeout(timeout, fut).await {
        Ok(r) => r,
        Err(_) => {
            let why = format!("no answer within {timeout:?}");
            match kind {
                OpKind::Put { .. } | OpKind::Remove => OpResult::Indeterminate(why),
                OpKind::Get | OpKind::Exists => OpResult::Fail(why),
            }
        }
    }
}

/// Running clients; [`Running::stop`] ends them.
pub struct Running {
    stop: Arc<AtomicBool>,
    tasks: Vec<(Arc<NsRuntime>, tokio::task::JoinHandle<()>)>,
}

impl Running {
    /// Signals every client to stop and waits for their current operation to finish.
    pub fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for (rt, task) in self.tasks {
            let _ = rt.handle().block_on(task);
        }
    }
}

/// Starts `cfg.clients_per_host` client loops on every host.
pub fn start_clients<W: Workload>(
    workload: &Arc<W>,
    hosts: &[(Host, Arc<NsRuntime>)],
    cfg: &WorkloadConfig,
    history: &History,
    write_ids: &Arc<AtomicU64>,
) -> Result<Running> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for (hi, (host, rt)) in hosts.iter().enumerate() {
        for ci in 0..cfg.clients_per_host {
            let process = (hi as u32 + 1) * 100 + ci as u32;
            let client = workload.client(&host.name, process)?;
            let (stop, history, write_ids, cfg) = (
                stop.clone(),
                history.clone(),
                write_ids.clone(),
                cfg.clone(),
            );
            let task = rt.spawn(async move {
                let mut rng = StdRng::seed_from_u64(cfg.seed ^ (u64::from(process) << 20));
                while !stop.load(Ordering::Relaxed) {
                    let key = key_name(rng.gen_range(0..cfg.keys.max(1)));
                    let kind = choose_op(&mut rng, &write_ids);
                    history
                        .record(process, &key, kind.clone(), async {
                            run_op(&client, &key, &kind, cfg.op_timeout).await
                        })
                        .await;
                    tokio::time::sleep(cfg.think).await;
                }
            });
            tasks.push((rt.clone(), task));
        }
    }
    Ok(Running { stop, tasks })
}

/// Reads every key once more after the faults healed (retrying failures a few times), so
/// that every acknowledged put meets a final observation.
pub async fn final_reads<C: WorkloadClient>(
    client: &C,
    process: u32,
    keys: usize,
    history: &History,
    timeout: Duration,
) -> usize {
    let mut failed = 0;
    for i in 0..keys {
        let key = key_name(i);
        for attempt in 0..4 {
            let r = history
                .record(process, &key, OpKind::Get, async {
                    run_op(client, &key, &OpKind::Get, timeout).await
                })
                .await;
            if matches!(r, OpResult::Ok(Reply::Found { .. } | Reply::NotFound)) {
                break;
            }
            if attempt == 3 {
                failed += 1;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    failed
}
