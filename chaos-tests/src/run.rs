//! A whole chaos run: topology, metad cluster, workload clients on the sidecar hosts, a fault
//! schedule, final reads, and the checker.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::checker::{self, CheckInput, FaultWindow, Report};
use crate::cluster::{Cluster, MetadProgram};
use crate::error::Result;
use crate::feed::Feed;
use crate::history::{EventKind, History};
use crate::nemesis::{FaultCtx, Nemesis};
use crate::netns::{self, Host, NsRuntime, Topology};
use crate::preload::Preload;
use crate::schedule::Step;
use crate::status::{self, SampleResult};
use crate::workload::{self, Running, Workload, WorkloadConfig};

/// Settings of a run.
#[derive(Clone, Debug)]
pub struct HarnessConfig {
    pub metad: MetadProgram,
    pub workload: WorkloadConfig,
    /// Check (d): puts and gets succeed again within this after a heal.
    pub recovery_limit: Duration,
    /// Quiet time after recovery before the next fault.
    pub settle: Duration,
    /// Load before the first fault.
    pub warmup: Duration,
    /// The node TTL metad runs with (check (f)); must match `metad.extra_args`.
    pub node_ttl: Duration,
    /// Objects loaded before the workload starts, so that faults meet a large state
    /// ([`crate::preload`]); 0 for none.
    pub preload: u64,
}

impl HarnessConfig {
    pub fn new(metad: MetadProgram) -> Self {
        Self {
            metad,
            workload: WorkloadConfig::default(),
            recovery_limit: Duration::from_secs(10),
            settle: Duration::from_millis(750),
            warmup: Duration::from_secs(2),
            node_ttl: crate::cluster::NODE_TTL,
            preload: 0,
        }
    }
}

/// The result of a run.
#[derive(Debug)]
pub struct RunOutcome {
    pub report: Report,
    /// Harness-level failures (a fault that could not be injected, a leader never elected).
    pub errors: Vec<String>,
    /// metad and sidecar processes that exited by themselves.
    pub crashes: Vec<String>,
    /// The workload's own end-of-run lines (per-sidecar counters and traffic).
    pub notes: Vec<String>,
    /// `/status` answers that did not parse (recorded, not fatal).
    pub malformed_samples: usize,
    pub elapsed: Duration,
    /// The tail of every metad and sidecar log, for failure reports.
    pub logs: String,
    /// Everything recorded (operations and events), for tests that look closer.
    pub recorded: crate::history::Recorded,
    /// Objects the sidecars moved from memory to their disks over the run (every process),
    /// when they have disks.
    pub disk_offloads: Option<u64>,
}

impl RunOutcome {
    /// Distinct objects metad's change feed listed with a replica on a disk during the run.
    pub fn objects_listed_on_disk(&self) -> usize {
        let mut seen = std::collections::BTreeSet::new();
        for e in &self.recorded.events {
            if let EventKind::Listed { object, replicas } = &e.kind {
                if replicas.iter().any(|r| r.is_disk()) {
                    seen.insert((object.key.clone(), object.version));
                }
            }
        }
        seen.len()
    }
}

impl RunOutcome {
    pub fn passed(&self) -> bool {
        self.report.passed() && self.errors.is_empty() && self.crashes.is_empty()
    }
}

impl std::fmt::Display for RunOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.report)?;
        for n in &self.notes {
            writeln!(f, "{n}")?;
        }
        writeln!(
            f,
            "run took {:.1}s; {} malformed status samples",
            self.elapsed.as_secs_f64(),
            self.malformed_samples
        )?;
        for e in &self.errors {
            writeln!(f, "harness error: {e}")?;
        }
        for c in &self.crashes {
            writeln!(f, "crashed: {c}")?;
        }
        if !self.passed() {
            writeln!(f, "{}", self.logs)?;
        }
        Ok(())
    }
}

/// Everything a run holds. Fields drop in order: clients, runtimes, daemons, then the
/// topology, so nothing outlives its namespace.
pub struct Harness<W: Workload> {
    running: Option<Running>,
    /// metad's change feed, followed when the workload's checks need it.
    feed: Option<Feed>,
    pub workload: Arc<W>,
    preload: Option<Preload>,
    hosts: Vec<(Host, Arc<NsRuntime>)>,
    pub cluster: Cluster,
    pub history: History,
    write_ids: Arc<AtomicU64>,
    windows: Vec<FaultWindow>,
    data_proxies: Vec<Arc<crate::proxy::ProxyControl>>,
    errors: Vec<String>,
    crashes: Vec<String>,
    cfg: HarnessConfig,
    started: Instant,
    pub topo: Topology,
}

impl<W: Workload> Harness<W> {
    /// Builds the hosts, starts metad and the workload's clients.
    pub fn start(cfg: HarnessConfig, workload: W) -> Result<Self> {
        let started = Instant::now();
        let topo = Topology::build(&netns::standard_hosts())?;
        let history = History::new();
        let observer = Arc::new(NsRuntime::new(&topo.bridge_ns, 1)?);
        let cluster = Cluster::start(
            &topo,
            cfg.metad.clone(),
            observer.clone(),
            history.clone(),
            3,
        )?;
        let workload = Arc::new(workload);
        // Before the sidecars mount: the feed then sees every object from its first listing.
        let feed = if workload.follows_feed() {
            Some(Feed::start(
                &observer,
                cluster.admin_client()?,
                history.clone(),
            ))
        } else {
            None
        };
        let mut hosts = Vec::new();
        for host in topo.hosts.values().filter(|h| h.name.starts_with('s')) {
            let rt = Arc::new(NsRuntime::new(&host.ns, 1)?);
            let ctx = cluster.host_ctx(host, &topo, &history);
            let w = workload.clone();
            rt.run(async move { w.start_host(ctx).await })?;
            hosts.push((host.clone(), rt));
        }
        // After the hosts mounted their segments: the preloaded objects are a small share of
        // the pool, far below the eviction watermark.
        let preload = match cfg.preload {
            0 => None,
            n => Some(Preload::start(
                &observer,
                cluster.admin_client()?,
                cluster.heartbeat_client()?,
                n,
            )?),
        };
        let write_ids = Arc::new(AtomicU64::new(1));
        let running =
            workload::start_clients(&workload, &hosts, &cfg.workload, &history, &write_ids)?;
        tracing::info!(
            elapsed = ?started.elapsed(),
            workload = workload.name(),
            "harness up"
        );
        let data_proxies = workload.data_proxies();
        Ok(Self {
            data_proxies,
            feed,
            running: Some(running),
            workload,
            preload,
            hosts,
            cluster,
            history,
            write_ids,
            windows: Vec::new(),
            errors: Vec::new(),
            crashes: Vec::new(),
            cfg,
            started,
            topo,
        })
    }

    /// Sleeps `d` while watching for metad and sidecar processes that exit by themselves.
    fn watch(&mut self, d: Duration) {
        let end = Instant::now() + d;
        loop {
            self.restart_exited_sidecars();
            for (id, status) in self.cluster.crashed() {
                let line = format!("metad {id} exited by itself ({status})");
                tracing::error!("{line}");
                self.history.event(EventKind::Note(line.clone()));
                self.crashes.push(line);
                // Keep the run going: a crash is reported, and the replica comes back.
                if let Err(e) = self.cluster.restart(id) {
                    self.errors
                        .push(format!("restart of crashed metad {id}: {e}"));
                }
            }
            let now = Instant::now();
            if now >= end {
                return;
            }
            std::thread::sleep((end - now).min(Duration::from_millis(100)));
        }
    }

    /// A sidecar that exited by itself is a crash (reported), and comes back like a crashed
    /// metad replica does.
    fn restart_exited_sidecars(&mut self) {
        for (host, status) in self.workload.exited() {
            let line = format!("sidecar of {host} exited by itself ({status})");
            tracing::error!("{line}");
            self.history.event(EventKind::Note(line.clone()));
            self.crashes.push(line);
            if let Err(e) = self.workload.restart_node(&host) {
                self.errors
                    .push(format!("restart of crashed sidecar of {host}: {e}"));
            }
        }
    }

    pub fn warm_up(&mut self) {
        self.watch(self.cfg.warmup);
    }

    fn ctx(&mut self) -> FaultCtx<'_> {
        FaultCtx {
            topo: &self.topo,
            cluster: &mut self.cluster,
            history: &self.history,
            nodes: &*self.workload,
            data_proxies: &self.data_proxies,
            feed: self.feed.as_ref(),
        }
    }

    /// Injects, holds and heals one fault, then waits for recovery and settles.
    pub fn run_step(&mut self, step: &Step) {
        let mut nemesis: Box<dyn Nemesis> = step.fault.nemesis();
        let name = nemesis.name();
        let kind = step.fault.kind().to_string();
        let injected_us = self.history.now_us();
        let detail = match nemesis.inject(&mut self.ctx()) {
            Ok(d) => d,
            Err(e) => {
                let line = format!("{name}: inject failed: {e}");
                tracing::error!("{line}");
                self.errors.push(line.clone());
                line
            }
        };
        tracing::info!(fault = %name, %detail, hold = ?step.hold, "fault injected");
        self.history.event(EventKind::FaultInjected {
            fault: name.clone(),
            detail: detail.clone(),
        });
        self.watch(step.hold);
        let healed = nemesis.heal(&mut self.ctx());
        let healed_us = self.history.now_us();
        let heal_detail = match healed {
            Ok(d) => d,
            Err(e) => {
                let line = format!("{name}: heal failed: {e}");
                self.errors.push(line.clone());
                line
            }
        };
        tracing::info!(fault = %name, detail = %heal_detail, "fault healed");
        self.history.event(EventKind::FaultHealed {
            fault: name.clone(),
            detail: heal_detail,
        });
        self.wait_recovery(healed_us);
        self.watch(self.cfg.settle);
        self.windows.push(FaultWindow {
            name,
            kind,
            detail,
            injected_us,
            healed_us,
            end_us: self.history.now_us(),
        });
    }

    /// Waits until a put and a get invoked after the heal succeeded (or a little past the
    /// limit: the checker then reports the missing recovery).
    fn wait_recovery(&mut self, healed_us: u64) {
        let end = Instant::now() + self.cfg.recovery_limit + Duration::from_secs(2);
        while Instant::now() < end {
            let ops = self.history.ops_since(healed_us);
            if let Some(d) = checker::recovery_after(&ops, healed_us) {
                tracing::info!(recovery = ?d, "recovered");
                return;
            }
            self.watch(Duration::from_millis(100));
        }
    }

    /// Stops the load, reads every key once more, and checks the history.
    pub fn finish(mut self) -> Result<RunOutcome> {
        if let Err(e) = self.cluster.wait_leader(Duration::from_secs(20)) {
            self.errors.push(format!("no leader at the end: {e}"));
        }
        if let Some(r) = self.running.take() {
            r.stop();
        }
        let keys = self.cfg.workload.keys;
        let timeout = self.cfg.workload.op_timeout;
        if let Some((host, rt)) = self.hosts.first() {
            let client = self.workload.client(&host.name, 9000)?;
            let history = self.history.clone();
            let failed = rt.run(async move {
                workload::final_reads(&client, 9000, keys, &history, timeout).await
            });
            if failed > 0 {
                self.errors.push(format!(
                    "{failed} final reads failed after every fault healed"
                ));
            }
        }
        self.restart_exited_sidecars();
        let mut notes = self.workload.report();
        let disk_offloads = self.workload.disk_offloads();
        if let Some(feed) = &self.feed {
            // Every observation must be covered by a guarantee of the feed, or the checker
            // cannot tell what metad dropped before it.
            if !feed.wait_current(Duration::from_secs(10)) {
                self.errors
                    .push("metad's change feed did not catch up with the final reads".into());
            }
            let (listed, on_disk) = feed.counts();
            notes.push(format!(
                "metad's change feed: {} messages; at the end {listed} objects listed, \
                 {on_disk} with a disk replica; objects moved to disk by the sidecars: {}",
                feed.messages(),
                disk_offloads.map_or("-".into(), |n| n.to_string())
            ));
        }
        if let Some(p) = &self.preload {
            notes.push(format!(
                "preloaded {} objects in {:.1}s before the first fault",
                p.objects, p.load_secs
            ));
            if let Err(e) = p.finish(self.cluster.observer()) {
                self.errors.push(format!("preloaded state: {e}"));
            }
        }
        self.workload.stop();
        self.cluster.stop_sampling();
        let samples = self.cluster.samples();
        let malformed = samples
            .iter()
            .filter(|s| matches!(s.result, SampleResult::Malformed(_)))
            .count();
        let claims = status::leader_claims(&samples);
        let recorded = self.history.snapshot();
        let workload = self.workload.clone();
        let value_len = move |key: &str, write_id: u64| workload.value_len(key, write_id);
        let derived = self.workload.value_len("key-000", 1).is_some();
        let value_len = move |key: &str, write_id: u64| value_len(key, write_id).unwrap_or(0);
        let report = checker::check(&CheckInput {
            recorded: &recorded,
            claims: &claims,
            windows: &self.windows,
            counters: self.cluster.counters(),
            recovery_limit: self.cfg.recovery_limit,
            node_ttl: Some(self.cfg.node_ttl),
            read_staleness: self.workload.read_staleness(),
            value_len: derived.then_some(&value_len as checker::ValueLen<'_>),
        });
        let logs = self.cluster.log_tails(40) + &self.workload.log_tails(40);
        Ok(RunOutcome {
            report,
            errors: std::mem::take(&mut self.errors),
            crashes: std::mem::take(&mut self.crashes),
            notes,
            malformed_samples: malformed,
            elapsed: self.started.elapsed(),
            logs,
            recorded,
            disk_offloads,
        })
    }

    /// How many write ids were handed out (puts attempted).
    pub fn puts_attempted(&self) -> u64 {
        self.write_ids.load(std::sync::atomic::Ordering::Relaxed) - 1
    }
}

/// Runs `steps` (stopping once `duration` has passed, if given) and checks the history.
pub fn run_profile<W: Workload>(
    cfg: HarnessConfig,
    workload: W,
    steps: impl IntoIterator<Item = Step>,
    duration: Option<Duration>,
) -> Result<RunOutcome> {
    let mut h = Harness::start(cfg, workload)?;
    h.warm_up();
    let deadline = duration.map(|d| Instant::now() + d);
    for step in steps {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        h.run_step(&step);
    }
    h.finish()
}
