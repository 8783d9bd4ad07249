//! The metadata cluster: real metad processes in the metad host namespaces, driven from
//! outside (signals, restarts, the admin gRPC calls), and a sampler that polls every replica's
//! `/status` from the observer for leader discovery and check (c).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use parking_lot::Mutex;
use regolith_proto::client::{ClientConfig, MetadClient};
use regolith_proto::launch;
use regolith_test_support::bins;

use crate::error::{Error, Result};
use crate::history::History;
use crate::netns::{self, Host, NsRuntime, Topology};
use crate::status::{self, Sample, SampleResult, Status};
use crate::workload::HostCtx;

pub const GRPC_PORT: u16 = 50051;
pub const METRICS_PORT: u16 = 9003;
pub const KV_PORT: u16 = 8080;

/// Which metad binary to start, and the flags every replica gets beyond its own
/// ([`launch::MetadLaunch::extra`]).
#[derive(Clone, Debug)]
pub struct MetadProgram {
    pub program: PathBuf,
    pub extra_args: Vec<String>,
}

impl MetadProgram {
    /// Starts `program` with [`chaos_flags`].
    pub fn new(program: impl Into<PathBuf>) -> Self {
        Self {
            program: program.into(),
            extra_args: chaos_flags(),
        }
    }

    /// The real `regolith-metad` of this build ([`bins`]), with [`chaos_flags`].
    pub fn built() -> Self {
        Self::new(bins::path(bins::METAD))
    }
}

/// The node TTL of chaos runs ([`chaos_flags`]).
pub const NODE_TTL: Duration = Duration::from_secs(4);

/// Timings that make faults bite within seconds: a node silent for 4 s is declared dead (so a
/// longer host cut-off drops its segment), reservations expire after 5 s, elections take ~1 s.
pub fn chaos_flags() -> Vec<String> {
    [
        "--node-ttl",
        "4s",
        "--put-timeout",
        "5s",
        "--heartbeat-interval",
        "150ms",
        "--election-timeout-min",
        "600ms",
        "--sled-cache",
        "16MiB",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// One metad replica.
#[derive(Debug)]
pub struct Replica {
    pub id: u64,
    pub host: Host,
    pub data_dir: PathBuf,
    pub log: PathBuf,
    child: Option<Child>,
    pub paused: bool,
}

impl Replica {
    pub fn grpc(&self) -> String {
        grpc_addr(&self.host)
    }
    pub fn http(&self) -> String {
        format!("{}:{METRICS_PORT}", self.host.addr())
    }
    pub fn running(&self) -> bool {
        self.child.is_some()
    }
    pub fn pid(&self) -> Option<i32> {
        self.child.as_ref().map(|c| c.id() as i32)
    }
}

pub fn grpc_addr(host: &Host) -> String {
    format!("{}:{GRPC_PORT}", host.addr())
}

// ---------------------------------------------------------------------------- sampler

#[derive(Default)]
struct SamplerState {
    samples: Vec<Sample>,
    latest: BTreeMap<String, Sample>,
}

/// Polls `/status` of every metad host every `interval` from the observer.
struct Sampler {
    state: Arc<Mutex<SamplerState>>,
    stop: Arc<AtomicBool>,
}

impl Sampler {
    fn start(observer: &NsRuntime, hosts: &[Host], history: &History, interval: Duration) -> Self {
        let state = Arc::new(Mutex::new(SamplerState::default()));
        let stop = Arc::new(AtomicBool::new(false));
        for host in hosts {
            let (state, stop, history) = (state.clone(), stop.clone(), history.clone());
            let name = host.name.clone();
            let addr = format!("{}:{METRICS_PORT}", host.addr());
            observer.spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let result = status::sample(&addr, Duration::from_millis(400)).await;
                    let s = Sample {
                        at_us: history.now_us(),
                        host: name.clone(),
                        result,
                    };
                    {
                        let mut st = state.lock();
                        st.latest.insert(name.clone(), s.clone());
                        st.samples.push(s);
                    }
                    tokio::time::sleep(interval).await;
                }
            });
        }
        Self { state, stop }
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

// ---------------------------------------------------------------------------- cluster

/// The metad replicas of a run.
pub struct Cluster {
    launch: MetadProgram,
    run_dir: PathBuf,
    token_file: PathBuf,
    token: String,
    /// Current members (running or not), by id.
    replicas: BTreeMap<u64, Replica>,
    /// Metad hosts with no member on them (membership changes take one).
    spare: Vec<Host>,
    /// Every metad host, member or spare.
    hosts: Vec<Host>,
    next_id: u64,
    observer: Arc<NsRuntime>,
    history: History,
    sampler: Sampler,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("members", &self.replicas.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Cluster {
    /// Starts `initial` replicas bootstrapped together on hosts `m1..`, leaving the other
    /// metad hosts spare, and waits for a ready leader.
    pub fn start(
        topo: &Topology,
        launch: MetadProgram,
        observer: Arc<NsRuntime>,
        history: History,
        initial: usize,
    ) -> Result<Self> {
        let hosts: Vec<Host> = topo
            .hosts
            .values()
            .filter(|h| h.name.starts_with('m'))
            .cloned()
            .collect();
        if hosts.len() < initial {
            return Err(Error::Config(format!(
                "{} metad hosts for {initial} replicas",
                hosts.len()
            )));
        }
        if !launch.program.exists() {
            return Err(Error::MissingBinary(launch.program.clone()));
        }
        let token = format!("chaos-token-{}", topo.run_id);
        let token_file = topo.dir.join("cluster-token");
        std::fs::write(&token_file, format!("{token}\n"))
            .map_err(|e| Error::io(token_file.display().to_string(), e))?;
        let sampler = Sampler::start(&observer, &hosts, &history, Duration::from_millis(100));
        let mut c = Cluster {
            launch,
            run_dir: topo.dir.clone(),
            token_file,
            token,
            replicas: BTreeMap::new(),
            spare: hosts[initial..].iter().rev().cloned().collect(),
            hosts: hosts.clone(),
            next_id: initial as u64 + 1,
            observer,
            history,
            sampler,
        };
        let peers: Vec<(u64, String)> = hosts[..initial]
            .iter()
            .enumerate()
            .map(|(i, h)| (i as u64 + 1, grpc_addr(h)))
            .collect();
        for (i, host) in hosts[..initial].iter().enumerate() {
            let id = i as u64 + 1;
            c.replicas.insert(id, c.new_replica(id, host.clone()));
            c.spawn(id, Some(&peers))?;
        }
        c.wait_leader(Duration::from_secs(30))?;
        Ok(c)
    }

    fn new_replica(&self, id: u64, host: Host) -> Replica {
        Replica {
            id,
            data_dir: self.run_dir.join(format!("metad-{id}")),
            log: self.run_dir.join(format!("metad-{id}.log")),
            host,
            child: None,
            paused: false,
        }
    }

    fn args(&self, r: &Replica, peers: Option<&[(u64, String)]>) -> Vec<OsString> {
        let ip = r.host.addr();
        launch::MetadLaunch {
            listen: Some(r.grpc()),
            advertise: Some(r.grpc()),
            data_dir: Some(r.data_dir.clone()),
            metrics_addr: Some(r.http()),
            cluster_token_file: Some(self.token_file.clone()),
            http_metadata_addr: Some(format!("{ip}:{KV_PORT}")),
            peers: peers.map(<[_]>::to_vec).unwrap_or_default(),
            bootstrap: peers.is_some(),
            extra: self.launch.extra_args.iter().map(Into::into).collect(),
            ..launch::MetadLaunch::new(r.id)
        }
        .args()
    }

    /// Starts replica `id` (`peers`: bootstrap a new cluster; `None`: restart, or join empty).
    fn spawn(&mut self, id: u64, peers: Option<&[(u64, String)]>) -> Result<()> {
        let r = self.replica(id)?;
        if r.running() {
            return Ok(());
        }
        let args = self.args(r, peers);
        let (ns, log) = (r.host.ns.clone(), r.log.clone());
        let child = netns::spawn_in(&ns, &self.launch.program, &args, &log)?;
        tracing::info!(id, pid = child.id(), host = %ns, "metad started");
        let r = self.replica_mut(id)?;
        r.child = Some(child);
        r.paused = false;
        Ok(())
    }

    pub fn replica(&self, id: u64) -> Result<&Replica> {
        self.replicas
            .get(&id)
            .ok_or_else(|| Error::Cluster(format!("no replica {id}")))
    }

    fn replica_mut(&mut self, id: u64) -> Result<&mut Replica> {
        self.replicas
            .get_mut(&id)
            .ok_or_else(|| Error::Cluster(format!("no replica {id}")))
    }

    pub fn member_ids(&self) -> Vec<u64> {
        self.replicas.keys().copied().collect()
    }

    pub fn token(&self) -> &str {
        &self.token
    }

    /// The file holding the cluster token (daemons read it with `--cluster-token-file`).
    pub fn token_file(&self) -> &std::path::Path {
        &self.token_file
    }

    /// gRPC addresses of every metad host (members and spares: a spare refuses connections,
    /// which the client skips), for workload clients.
    pub fn metad_addrs(&self) -> Vec<String> {
        self.hosts.iter().map(grpc_addr).collect()
    }

    /// What a workload needs to set up sidecar host `host` of `topo` against this cluster.
    pub fn host_ctx(&self, host: &Host, topo: &Topology, history: &History) -> HostCtx {
        HostCtx {
            host: host.clone(),
            metad_addrs: self.metad_addrs(),
            token: self.token().to_string(),
            token_file: self.token_file().to_path_buf(),
            run_dir: topo.dir.clone(),
            history: history.clone(),
        }
    }

    /// Every metad host.
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    pub fn observer(&self) -> &Arc<NsRuntime> {
        &self.observer
    }

    /// A metad client for the observer (admin calls).
    pub fn admin_client(&self) -> Result<MetadClient> {
        self.client(
            Duration::from_secs(1),
            Duration::from_secs(5),
            Duration::from_secs(20),
        )
    }

    /// A metad client for heartbeats from the observer: attempts short enough that a dead or
    /// paused leader costs well under a node TTL (the fake sidecars' settings).
    pub fn heartbeat_client(&self) -> Result<MetadClient> {
        self.client(
            Duration::from_millis(400),
            Duration::from_millis(800),
            Duration::from_millis(2500),
        )
    }

    fn client(&self, connect: Duration, request: Duration, retry: Duration) -> Result<MetadClient> {
        let mut cfg = ClientConfig::new(self.metad_addrs());
        cfg.token = Some(self.token.clone());
        cfg.connect_timeout = connect;
        cfg.request_timeout = request;
        cfg.retry_deadline = retry;
        Ok(MetadClient::new(cfg)?)
    }

    // ------------------------------------------------------------------ processes

    /// kill -9 of replica `id`.
    pub fn kill(&mut self, id: u64) -> Result<()> {
        let r = self.replica_mut(id)?;
        if let Some(mut c) = r.child.take() {
            let _ = c.kill();
            let _ = c.wait();
            tracing::info!(id, "metad killed (-9)");
        }
        r.paused = false;
        Ok(())
    }

    /// SIGTERM to replica `id`, then waits up to `within` for it to exit; returns its status.
    pub fn stop(&mut self, id: u64, within: Duration) -> Result<std::process::ExitStatus> {
        self.signal(id, Signal::SIGTERM)?;
        let r = self.replica_mut(id)?;
        let end = Instant::now() + within;
        loop {
            let Some(c) = r.child.as_mut() else {
                return Err(Error::Cluster(format!("replica {id} is not running")));
            };
            if let Some(st) = c
                .try_wait()
                .map_err(|e| Error::Cluster(format!("wait {id}: {e}")))?
            {
                r.child = None;
                tracing::info!(id, %st, "metad stopped (SIGTERM)");
                return Ok(st);
            }
            if Instant::now() >= end {
                return Err(Error::Cluster(format!(
                    "replica {id} still running {within:?} after SIGTERM"
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Restarts a stopped replica from its data directory.
    pub fn restart(&mut self, id: u64) -> Result<()> {
        self.spawn(id, None)
    }

    pub fn signal(&mut self, id: u64, sig: Signal) -> Result<()> {
        let r = self.replica_mut(id)?;
        let pid = r
            .pid()
            .ok_or_else(|| Error::Cluster(format!("replica {id} is not running")))?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig)
            .map_err(|e| Error::sys(format!("kill -{sig} {pid}"), e))?;
        r.paused = sig == Signal::SIGSTOP;
        Ok(())
    }

    /// Whether any member process has exited by itself (a crash).
    pub fn crashed(&mut self) -> Vec<(u64, String)> {
        let mut out = Vec::new();
        for r in self.replicas.values_mut() {
            if let Some(c) = r.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    out.push((r.id, status.to_string()));
                    r.child = None;
                }
            }
        }
        out
    }

    // ------------------------------------------------------------------ membership

    /// Starts a new replica on a spare host and adds it as a voter; returns its id.
    pub fn add_member(&mut self) -> Result<u64> {
        let host = self
            .spare
            .pop()
            .ok_or_else(|| Error::Cluster("no spare metad host".into()))?;
        let id = self.next_id;
        self.next_id += 1;
        let r = self.new_replica(id, host);
        let _ = std::fs::remove_dir_all(&r.data_dir);
        let addr = r.grpc();
        self.replicas.insert(id, r);
        self.spawn(id, None)?;
        let client = self.admin_client()?;
        let members = self
            .observer
            .run(async move { client.add_member(id, &addr).await })?;
        tracing::info!(id, ?members, "member added");
        Ok(id)
    }

    /// Removes member `id` from the cluster, stops it and frees its host.
    pub fn remove_member(&mut self, id: u64) -> Result<()> {
        let client = self.admin_client()?;
        let members = self
            .observer
            .run(async move { client.remove_member(id).await })?;
        tracing::info!(id, ?members, "member removed");
        self.kill(id)?;
        if let Some(r) = self.replicas.remove(&id) {
            let _ = std::fs::remove_dir_all(&r.data_dir);
            self.spare.push(r.host);
        }
        Ok(())
    }

    // ------------------------------------------------------------------ observation

    /// Every sample so far.
    pub fn samples(&self) -> Vec<Sample> {
        self.sampler.state.lock().samples.clone()
    }

    /// The latest status of each host answered within `fresh`.
    pub fn fresh_statuses(&self, fresh: Duration) -> Vec<Status> {
        let now = self.history.now_us();
        let limit = fresh.as_micros() as u64;
        self.sampler
            .state
            .lock()
            .latest
            .values()
            .filter(|s| now.saturating_sub(s.at_us) <= limit)
            .filter_map(|s| match &s.result {
                SampleResult::Status(st) => Some(st.clone()),
                _ => None,
            })
            .collect()
    }

    /// The ready leader of the highest term among running, unpaused members, if any.
    pub fn leader(&self) -> Option<u64> {
        self.fresh_statuses(Duration::from_millis(1500))
            .into_iter()
            .filter(|s| s.is_leader() && s.leader_ready)
            .filter(|s| {
                self.replicas
                    .get(&s.id)
                    .is_some_and(|r| r.running() && !r.paused)
            })
            .max_by_key(|s| s.term)
            .map(|s| s.id)
    }

    pub fn wait_leader(&self, timeout: Duration) -> Result<u64> {
        let end = Instant::now() + timeout;
        loop {
            if let Some(id) = self.leader() {
                return Ok(id);
            }
            if Instant::now() > end {
                return Err(Error::Cluster(format!(
                    "no ready leader within {timeout:?}; logs:\n{}",
                    self.log_tails(30)
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The highest `evicted_objects` and `dead_node_dropped_objects` seen in any sample.
    pub fn counters(&self) -> crate::checker::Counters {
        let st = self.sampler.state.lock();
        let mut c = crate::checker::Counters::default();
        for s in &st.samples {
            if let SampleResult::Status(x) = &s.result {
                c.evicted_objects = c.evicted_objects.max(x.evicted_objects);
                c.dead_node_dropped_objects =
                    c.dead_node_dropped_objects.max(x.dead_node_dropped_objects);
            }
        }
        c
    }

    /// The last `n` log lines of every replica (for failure reports).
    pub fn log_tails(&self, n: usize) -> String {
        let mut s = String::new();
        for r in self.replicas.values() {
            let text = std::fs::read_to_string(&r.log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            s.push_str(&format!("----- metad {} ({}) -----\n", r.id, r.host.name));
            for l in &lines[lines.len().saturating_sub(n)..] {
                s.push_str(l);
                s.push('\n');
            }
        }
        s
    }

    pub fn stop_sampling(&self) {
        self.sampler.stop.store(true, Ordering::Relaxed);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop_sampling();
        for r in self.replicas.values_mut() {
            if let Some(mut c) = r.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}
