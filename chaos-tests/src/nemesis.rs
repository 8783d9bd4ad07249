//! The faults. Each is a named [`Nemesis`] with `inject` and `heal`; a [`Fault`] is the plain
//! description a schedule is made of (seeded, printable, repeatable).
//!
//! Network faults are nftables tables inside the hosts' namespaces ([`crate::firewall`]);
//! process faults are signals to the daemons; latency goes through [`crate::proxy`].

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::byzantine;
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::feed::Feed;
use crate::firewall::{self, Rule};
use crate::history::{EventKind, FeedObject, History, OpResult, Reply};
use crate::netns::{Host, Topology};
use crate::proxy::ProxyControl;

/// Crash and restart of a node's sidecar, its disks, and its per-NIC traffic (implemented by
/// the workload, which owns the sidecars; see [`crate::workload::Workload`]).
pub trait NodeControl {
    fn crash_node(&self, host: &str) -> Result<()>;
    fn restart_node(&self, host: &str) -> Result<()>;
    fn upgrade_node(&self, host: &str) -> Result<String>;
    fn freeze_index(&self, host: &str, on: bool) -> Result<String>;
    fn nic_traffic(&self, host: &str) -> Result<BTreeMap<String, u64>>;
    fn node_id(&self, host: &str) -> Option<u64>;
    fn fail_disk(&self, host: &str, how: DiskFailure) -> Result<String>;
    fn replace_disk(&self, host: &str) -> Result<String>;
    fn disk_drops(&self, host: &str) -> Result<u64>;
    fn disks_reconciled(&self, host: &str) -> Result<usize>;
    fn read_through(&self, host: &str, process: u32, keys: &[String]) -> Result<Vec<OpResult>>;
}

impl<W: crate::workload::Workload> NodeControl for W {
    fn node_id(&self, host: &str) -> Option<u64> {
        crate::workload::Workload::node_id(self, host)
    }
    fn fail_disk(&self, host: &str, how: DiskFailure) -> Result<String> {
        crate::workload::Workload::fail_disk(self, host, how)
    }
    fn replace_disk(&self, host: &str) -> Result<String> {
        crate::workload::Workload::replace_disk(self, host)
    }
    fn disk_drops(&self, host: &str) -> Result<u64> {
        crate::workload::Workload::disk_drops(self, host)
    }
    fn disks_reconciled(&self, host: &str) -> Result<usize> {
        crate::workload::Workload::disks_reconciled(self, host)
    }
    fn read_through(&self, host: &str, process: u32, keys: &[String]) -> Result<Vec<OpResult>> {
        crate::workload::Workload::read_through(self, host, process, keys)
    }
    fn crash_node(&self, host: &str) -> Result<()> {
        crate::workload::Workload::crash_node(self, host)
    }
    fn restart_node(&self, host: &str) -> Result<()> {
        crate::workload::Workload::restart_node(self, host)
    }
    fn upgrade_node(&self, host: &str) -> Result<String> {
        crate::workload::Workload::upgrade_node(self, host)
    }
    fn freeze_index(&self, host: &str, on: bool) -> Result<String> {
        crate::workload::Workload::freeze_index(self, host, on)
    }
    fn nic_traffic(&self, host: &str) -> Result<BTreeMap<String, u64>> {
        crate::workload::Workload::nic_traffic(self, host)
    }
}

/// What a nemesis may touch.
pub struct FaultCtx<'a> {
    pub topo: &'a Topology,
    pub cluster: &'a mut Cluster,
    pub history: &'a History,
    pub nodes: &'a dyn NodeControl,
    /// Proxies in front of data ports (empty until a data-plane workload provides them).
    pub data_proxies: &'a [Arc<ProxyControl>],
    /// metad's change feed, when the harness follows it.
    pub feed: Option<&'a Feed>,
}

/// One fault: `inject` starts it, `heal` ends it; both return a line saying what they did.
pub trait Nemesis: Send {
    fn name(&self) -> String;
    fn inject(&mut self, ctx: &mut FaultCtx<'_>) -> Result<String>;
    fn heal(&mut self, ctx: &mut FaultCtx<'_>) -> Result<String>;
}

/// Direction of a one-way partition, seen from the leader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OneWay {
    /// The leader hears nothing from the other replicas (its messages still arrive).
    LeaderDeaf,
    /// Nothing the leader sends reaches the other replicas (it still hears them).
    LeaderMute,
}

/// How `disk-fail` makes a disk directory unusable. Root ignores permission bits, so
/// "unreadable" is a read-only bind mount over the directory, made inside the sidecar's mount
/// namespace (`ip netns exec` gives each daemon its own).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiskFailure {
    /// The directory and everything in it removed (a device gone, a volume unmounted).
    Removed,
    /// A read-only bind mount over it (a file system remounted read-only after errors).
    ReadOnly,
}

impl std::fmt::Display for DiskFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DiskFailure::Removed => "directory removed",
            DiskFailure::ReadOnly => "read-only bind mount",
        })
    }
}

/// Every fault the suite knows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// kill -9 of the metad leader; heal restarts it.
    KillLeader,
    /// SIGSTOP of the leader (held past the election timeout); heal sends SIGCONT.
    PauseLeader,
    /// The leader's host cut off from every host (symmetric).
    IsolateLeader,
    /// A one-way partition between the leader and the other replicas.
    OneWayLeader(OneWay),
    /// The cluster split 2/1 (sidecar hosts split too) with the leader in the minority.
    SplitLeaderMinority,
    /// Random loss of this share of the leader's packets (nftables `numgen`).
    PacketLoss { percent: u8 },
    /// kill -9 of every metad replica; heal restarts them all.
    RestartAll,
    /// SIGTERM to the leader, as a rolling upgrade stops it: it must hand its office over
    /// before it exits (`--leader-handover-timeout`); heal starts it again.
    LeaderHandover,
    /// SIGSTOP of every metad replica for longer than the node TTL (a frozen VM host);
    /// heal sends SIGCONT. Nobody was cut off, so nobody may be declared dead.
    PauseAll,
    /// A fourth replica added, then the old leader removed, under load.
    MembershipChange,
    /// A sidecar host cut off from every host.
    HostCutoff { host: String },
    /// One NIC of a sidecar host cut.
    NicCut { host: String, nic: u8 },
    /// The sidecar of a host crashed (its segment lost) and restarted.
    SidecarCrash { host: String },
    /// The sidecar of a host upgraded in place: a new process started with `--takeover`
    /// takes its segment over (same generation: nothing may be lost) while clients run.
    SidecarUpgrade { host: String },
    /// The object index of a host's sidecar stops following metad while it keeps answering
    /// (a lagging index: it misses removes made through other nodes); heal resyncs it. Held
    /// below the index's staleness bound, which the checker then holds reads to.
    IndexLag { host: String },
    /// Delay added by the proxies in front of the data ports.
    DataPortLatency { delay: Duration },
    /// A sidecar host's disk directory made unusable while the sidecar runs; the sidecar
    /// must take that disk out alone (its objects dropped and counted). Heal: the operator's
    /// replacement, an empty directory at the same path, and the sidecar upgraded in place
    /// (`--takeover`) so that it opens the new disk without losing its memory.
    DiskFail { host: String, how: DiskFailure },
    /// kill -9 of a sidecar holding objects on its disk, restarted with the same node name,
    /// state and disk directories: what its disk held must be readable again (warm restart).
    SidecarRestartWarm { host: String },
    /// A client on every sidecar host sending malformed and hostile frames to the sidecars'
    /// sockets and data ports and to metad ([`crate::byzantine`]); heal stops it and fails
    /// when a daemon took what it must refuse.
    ByzantineClient,
}

impl Fault {
    pub fn name(&self) -> String {
        match self {
            Fault::KillLeader => "kill-leader".into(),
            Fault::LeaderHandover => "leader-handover".into(),
            Fault::PauseLeader => "pause-leader".into(),
            Fault::IsolateLeader => "isolate-leader".into(),
            Fault::OneWayLeader(OneWay::LeaderDeaf) => "one-way-leader-deaf".into(),
            Fault::OneWayLeader(OneWay::LeaderMute) => "one-way-leader-mute".into(),
            Fault::SplitLeaderMinority => "split-2/1-leader-minority".into(),
            Fault::PacketLoss { percent } => format!("packet-loss-{percent}%"),
            Fault::RestartAll => "restart-all-metad".into(),
            Fault::PauseAll => "pause-all-metad".into(),
            Fault::MembershipChange => "membership-change".into(),
            Fault::HostCutoff { host } => format!("host-cutoff-{host}"),
            Fault::NicCut { host, nic } => format!("nic-cut-{host}-eth{nic}"),
            Fault::SidecarCrash { host } => format!("sidecar-crash-{host}"),
            Fault::SidecarUpgrade { host } => format!("sidecar-upgrade-{host}"),
            Fault::IndexLag { host } => format!("index-lag-{host}"),
            Fault::DataPortLatency { delay } => format!("data-latency-{}ms", delay.as_millis()),
            Fault::ByzantineClient => "byzantine-client".into(),
            Fault::DiskFail { host, .. } => format!("disk-fail-{host}"),
            Fault::SidecarRestartWarm { host } => format!("sidecar-restart-warm-{host}"),
        }
    }

    /// The fault's kind: its name without parameters (which host, how much).
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::KillLeader => "kill-leader",
            Fault::LeaderHandover => "leader-handover",
            Fault::PauseLeader => "pause-leader",
            Fault::IsolateLeader => "isolate-leader",
            Fault::OneWayLeader(OneWay::LeaderDeaf) => "one-way-leader-deaf",
            Fault::OneWayLeader(OneWay::LeaderMute) => "one-way-leader-mute",
            Fault::SplitLeaderMinority => "split-2/1-leader-minority",
            Fault::PacketLoss { .. } => "packet-loss",
            Fault::RestartAll => "restart-all-metad",
            Fault::PauseAll => "pause-all-metad",
            Fault::MembershipChange => "membership-change",
            Fault::HostCutoff { .. } => "host-cutoff",
            Fault::NicCut { .. } => "nic-cut",
            Fault::SidecarCrash { .. } => "sidecar-crash",
            Fault::SidecarUpgrade { .. } => "sidecar-upgrade",
            Fault::IndexLag { .. } => "index-lag",
            Fault::DataPortLatency { .. } => "data-latency",
            Fault::ByzantineClient => "byzantine-client",
            Fault::DiskFail { .. } => "disk-fail",
            Fault::SidecarRestartWarm { .. } => "sidecar-restart-warm",
        }
    }

    /// Faults whose effect only a workload that moves bytes between sidecars can observe, or
    /// that act on real sidecars (their sockets and data ports).
    pub fn needs_data_plane(&self) -> bool {
        matches!(
            self,
            Fault::NicCut { .. }
                | Fault::DataPortLatency { .. }
                | Fault::ByzantineClient
                | Fault::SidecarUpgrade { .. }
                | Fault::IndexLag { .. }
                | Fault::DiskFail { .. }
                | Fault::SidecarRestartWarm { .. }
        )
    }

    pub fn nemesis(&self) -> Box<dyn Nemesis> {
        let name = self.name();
        match self.clone() {
            Fault::KillLeader => Box::new(KillLeader { victim: None }),
            Fault::LeaderHandover => Box::new(LeaderHandover { victim: None }),
            Fault::PauseLeader => Box::new(PauseLeader { victim: None }),
            Fault::IsolateLeader => Box::new(Net::new(name, NetKind::IsolateLeader)),
            Fault::OneWayLeader(d) => Box::new(Net::new(name, NetKind::OneWay(d))),
            Fault::SplitLeaderMinority => Box::new(Net::new(name, NetKind::Split)),
            Fault::PacketLoss { percent } => Box::new(Net::new(name, NetKind::Loss(percent))),
            Fault::HostCutoff { host } => Box::new(Net::new(name, NetKind::Cutoff(host))),
            Fault::NicCut { host, nic } => Box::new(Net::new(name, NetKind::Nic(host, nic))),
            Fault::RestartAll => Box::new(RestartAll {
                stopped: Vec::new(),
            }),
            Fault::PauseAll => Box::new(PauseAll { paused: Vec::new() }),
            Fault::MembershipChange => Box::new(MembershipChange),
            Fault::SidecarCrash { host } => Box::new(SidecarCrash { host }),
            Fault::SidecarUpgrade { host } => Box::new(SidecarUpgrade { host }),
            Fault::IndexLag { host } => Box::new(IndexLag { host }),
            Fault::DataPortLatency { delay } => Box::new(DataPortLatency {
                delay,
                bytes_before: 0,
            }),
            Fault::ByzantineClient => Box::new(ByzantineClient::default()),
            Fault::DiskFail { host, how } => Box::new(DiskFail { host, how }),
            Fault::SidecarRestartWarm { host } => Box::new(SidecarRestartWarm::new(host)),
        }
    }
}

fn leader(ctx: &FaultCtx<'_>) -> Result<u64> {
    ctx.cluster.wait_leader(Duration::from_secs(15))
}

/// A leader that has led for `settle` (the same replica answering throughout), or, after
/// 15 s of changes, whichever leads then.
fn settled_leader(ctx: &FaultCtx<'_>, settle: Duration) -> Result<u64> {
    let end = std::time::Instant::now() + Duration::from_secs(15);
    let mut current = leader(ctx)?;
    let mut since = std::time::Instant::now();
    while since.elapsed() < settle && std::time::Instant::now() < end {
        std::thread::sleep(Duration::from_millis(100));
        let now = leader(ctx)?;
        if now != current {
            current = now;
            since = std::time::Instant::now();
        }
    }
    Ok(current)
}

// ---------------------------------------------------------------------------- processes

/// Heal of a fault that stopped a replica: start it again on its data.
fn restart_victim(victim: &mut Option<u64>, ctx: &mut FaultCtx<'_>) -> Result<String> {
    let Some(id) = victim.take() else {
        return Ok("nothing to restart".into());
    };
    ctx.cluster.restart(id)?;
    Ok(format!("restarted metad {id}"))
}

struct KillLeader {
    victim: Option<u64>,
}

impl Nemesis for KillLeader {
    fn name(&self) -> String {
        Fault::KillLeader.name()
    }
    fn inject(&mut self, ctx: &mut FaultCtx<'_>) -> Result<String> {
        let id = leader(ctx)?;
        ctx.cluster.kill(id)?;
        self.victim = Some(id);
        Ok(format!("kill -9 metad {id}"))
    }
    fn heal(&mut self, ctx: &mut FaultCtx<'_>) -> Result<String> {
        restart_victim(&mut self.victim, ctx)
    }
}

struct LeaderHandover {
    victim: Option<u64>,
}

impl Nemesis for LeaderHandover {
    fn name(&self) -> String {
        Fault::LeaderHandover.name()
    }
    fn inject(&mut self, ctx: &mut FaultCtx<'_>) -> Result<String> {
        // A leader elected a moment ago (a fault just healed) may still be catching a
        // follower up from a replication backoff: the hand-over is asked of a settled one.
        let id = settled_leader(ctx, Duration::from_secs(2))?;
        let status = ctx.cluster.stop(id, Duration::from_secs(20))?;
        self.victim = Some(id);
        if !status.success() {
            return Err(Error::Cluster(format!(
                "leader {id} stopped on SIGTERM with {status}"
            )));
        }
        // The replica logs this only once it has seen another replica lead a later term.
        let log = std::fs::read_to_string(&ctx.cluster.replica(id)?.log).unwrap_or_default();
        if !log.contains("handed over; stopping") {
            return Err(Error::Cluster(format!(
                "leader {id} stopped without handing over: {}",
                log.lines()
                    .filter(|l| l.contains("regolith_metad") && l.contains("hand"))
                    .collect::<Vec<_>>()
                    .join(" | ")
            )));
        }
        Ok(format!(
            "SIGTERM leader {id}: it handed over, then exited 0"
        ))
    }
    fn heal(&mut self, ctx: &mut FaultCtx<'_>) -> Result<String> {
        restart_victim(&mut self.victim, ctx)
    }
}

struct PauseLeader {
    victim: Option<u64>,
}

impl Nemesis for PauseLeader {
    fn name(&self) -> String {
        Fault::PauseLeader.name()
    }
    fn inject(&mut self, ctx: &mut FaultCtx<'_>) -> Result<String> {
        let id = leader(ctx)?;
        ctx.cluster.signal(id, Signal::SIGSTOP)?;
        self.victim = Some(id);
        Ok(format!("SIGSTOP metad {id}"))
    }
    fn heal(&mut self, ctx: &mut FaultCtx<'_>) -> Result<String> {
        let Some(id) = self.victim.take() else {
            return Ok("nothing paused".into());
        };
        ctx.cluster.signal(id, Signal::SIGCONT)?;
        Ok(format!("SIGCONT metad {id}"))
    }
}

struct RestartAll {
    stopped: Vec<u64>,
}

impl Nemesis for RestartAll {
    fn name(&self) -> String {
        Fault::RestartAll.name()
    }
    fn inject(&mut self, ctx: &mut FaultCtx<'_>) -> Result<String> {
        self.stopped = ctx.cluster.member_ids();
        for id in &self.stopped {
            ctx.cluster.kill(*id)?;
        }
        Ok(format!("kill -9 metad {:?}", self.stopped))
    }
    fn heal(&mut self, ctx: &mut FaultCtx<'_>) -> Result<String> {
        for id in &self.stopped {
            ctx.cluster.restart(*id)?;
        }
        Ok(format!(
            "restarted metad {:?}",
            std::mem::take(&mut self.stopped)
        ))
    }
}

struct PauseAll {
    paused: Vec<u64>,
}

impl Nemesis for PauseAll {
    fn name(&self) -> String {
        Fault::PauseAll.name()
    }
    fn inject(&mut self, ctx: &mut FaultCtx<'_>) -> Result<String> {
        for id in ctx.cluster.member_ids() {
            ctx.cluster.signal(id, Signal::SIGSTOP)?;
            self.paused.push(id);
        }
        Ok(format!("SIGSTOP metad {:?}", self.paused))
    }
    fn heal(&mut self, ctx: &mut FaultCtx<'_>) -> Result<String> {
        for id in &self.paused {
            ctx.cluster.signal(*id, Signal::SIGCONT)?;
        }
        Ok(format!(
            "SIGCONT metad {:?}",
            std::mem::take(&mut self.paused)
        ))
    }
}

struct MembershipChange;

impl Nemesis for MembershipChange {
    fn name(&self) -> String {
        Fault::MembershipChange.name()
    }
    fn inject(&mut self, ctx: &mut FaultCtx<'_>) -> Result<String> {
        let old = leader(ctx)?;
        let new = ctx.cluster.add_member()?;
        ctx.cluster.remove_member(old)?;
        Ok(format!(
            "added metad {new}, removed old leader {old}; members {:?}",
            ctx.cluster.member_ids()
        ))
    }
    fn heal(&mut self, _ctx: &mut FaultCtx<'_>) -> Result<String> {
        Ok("nothing to heal (membership stays changed)".into())
    }
}

struct SidecarCrash {
    host: String,
}

impl Nemesis for SidecarCrash {
    fn name(&self) -> String {
        format!("sidecar-crash-{}", self.host)
    }
    fn inject(&mut self, ctx: &mut FaultCtx<'_>) -> Result<String> {
        ctx.nodes.crash_node(&self.host)?;
        Ok(format!("sidecar of {} crashed", self.host))
    }
    fn heal(&mut self, ctx: &mut FaultCtx<'_>) -> Result<String> {
        ctx.nodes.restart_node(&self.host)?;
        Ok(format!("sidecar of {} restarted", self.host))
    }
}

struct SidecarUpgrade {
    host: String,
}

impl Nemesis for SidecarUpgrade {
    fn name(&self) -> String {
        format!("sidecar-upgrade-{}", self.host)
    }
    fn inject(&mut self, ctx: &mut FaultCtx<'_>) -> Result<String> {
        ctx.nodes.upgrade_node(&self.host)
    }
    fn heal(&mut self, _ctx: &mut FaultCtx<'_>) -> Result<String> {
        Ok("nothing to heal (the new process serves)".into())
    }
}

struct DiskFail {
    host: String,
    how: DiskFailure,
}

impl Nemesis for DiskFail {
    fn name(&self) -> String {
        format!("disk-fail-{}", self.host)
    }
    fn inject(&mut self, ctx: &mut FaultCtx<'_>) -> Result<String> {
        ctx.nodes.fail_disk(&self.host, self.how)
    }
    fn heal(&mut self, ctx: &mut FaultCtx<'_>) -> Result<String> {
        ctx.nodes.replace_disk(&self.host)
    }
}

/// How long a restarted sidecar may take to reconcile its disks with metad.
const RECONCILE_TIMEOUT: Duration = Duration::from_secs(20);
/// How long the feed may take to be current before and after a warm restart.
const FEED_CURRENT_TIMEOUT: Duration = Duration::from_secs(5);
/// Read-back attempts of a disk object after a warm restart (250 ms apart).
const READ_BACK_ATTEMPTS: usize = 8;

struct SidecarRestartWarm {
    host: String,
    node: u64,
    held: Vec<FeedObject>,
    /// Drops the old process's disks counted while the held objects were being taken.
    drops_while_taken: u64,
    reconciled_before: usize,
    killed: Option<std::time::Instant>,
}

impl SidecarRestartWarm {
    fn new(host: String) -> Self {
        Self {
            host,
            node: 0,
            held: Vec::new(),
            drops_while_taken: 0,
            reconciled_before: 0,
            killed: None,
        }
    }

    /// Another sidecar host than this one (reads from there are remote disk reads).
    fn reader(&self, ctx: &FaultCtx<'_>) -> Option<String> {
        sidecar_hosts(ctx.topo)
            .into_iter()
            .map(|h| h.name)
            .find(|h| *h != self.host)
    }

    /// Reads the held objects metad still lists on the node's disk through another host until
    /// each is found or found absent; answers (found, absent, still unreadable keys).
    fn read_back(
        &self,
        ctx: &FaultCtx<'_>,
        feed: &Feed,
    ) -> Result<(String, usize, usize, Vec<String>)> {
        let reader = self
            .reader(ctx)
            .ok_or_else(|| Error::Config("no other sidecar host to read from".into()))?;
        let mut pending: Vec<String> = self
            .held
            .iter()
            .filter(|o| {
                feed.listed(&o.key).is_some_and(|(now, replicas)| {
                    now.version == o.version
                        && replicas.iter().any(|r| r.node == self.node && r.is_disk())
                })
            })
            .map(|o| o.key.clone())
            .collect();
        let (mut found, mut absent) = (0, 0);
        for attempt in 0..READ_BACK_ATTEMPTS {
            if pending.is_empty() {
                break;
            }
            if attempt > 0 {
                std::thread::sleep(Duration::from_millis(250));
            }
            let results = ctx
                .nodes
                .read_through(&reader, read_back_process(&reader), &pending)?;
            let mut again = Vec::new();
            for (key, r) in pending.into_iter().zip(results) {
                match r {
                    OpResult::Ok(Reply::Found { .. }) => found += 1,
                    OpResult::Ok(Reply::NotFound) => absent += 1,
                    _ => again.push(key),
                }
            }
            pending = again;
        }
        Ok((reader, found, absent, pending))
    }
}

/// The client process id of the warm restart's read-back through `host` (`sN`): numbered as
/// that host's clients are (`crate::checker::node_of` gives the host), past the workload's.
pub fn read_back_process(host: &str) -> u32 {
    let n: u32 = host.trim_start_matches('s').parse().unwrap_or(0);
    n * 100 + 90
}

impl Nemesis for SidecarRestartWarm {
    fn name(&self) -> String {
        format!("sidecar-restart-warm-{}", self.host)
    }
    fn inject(&mut self, ctx: &mut FaultCtx<'_>) -> Result<String> {
        let feed = ctx
            .feed
            .ok_or_else(|| Error::Config("the warm restart needs metad's change feed".into()))?;
        self.node = ctx.nodes.node_id(&self.host).ok_or_else(|| {
            Error::Cluster(format!("the sidecar of {} serves no segment", self.host))
        })?;
        // A warm restart of a node with nothing on disk tests nothing: wait (bounded) until
        // metad lists objects on its disk.
        let end = std::time::Instant::now() + crate::sidecars::HOLDING_TIMEOUT;
        while feed.on_disks_of(self.node).is_empty() && std::time::Instant::now() < end {
            std::thread::sleep(Duration::from_millis(100));
        }
        // Drops the disks count from here on may not have reached metad (and the copy)
        // before the kill: they are allowed beside the restarted process's own.
        let drops_before = ctx.nodes.disk_drops(&self.host)?;
        if !feed.wait_current(FEED_CURRENT_TIMEOUT) {
            return Err(Error::Cluster("metad's change feed is not current".into()));
        }
        self.held = feed.on_disks_of(self.node);
        self.drops_while_taken = ctx
            .nodes
            .disk_drops(&self.host)?
            .saturating_sub(drops_before);
        self.reconciled_before = ctx.nodes.disks_reconciled(&self.host)?;
        ctx.nodes.crash_node(&self.host)?;
        self.killed = Some(std::time::Instant::now());
        Ok(format!(
            "kill -9 of the sidecar of {} (node {}) holding {} objects on its disk",
            self.host,
            self.node,
            self.held.len()
        ))
    }
    fn heal(&mut self, ctx: &mut FaultCtx<'_>) -> Result<String> {
        let feed = ctx
            .feed
            .ok_or_else(|| Error::Config("the warm restart needs metad's change feed".into()))?;
        // Recorded now, not at the kill: what metad changed before the restart (a report the
        // killed process sent, committed after its death: its own eviction) is not the
        // restart's doing; what the restart forgot shows after this, when it reconciles.
        ctx.history.event(EventKind::DiskHeld {
            host: self.host.clone(),
            node: self.node,
            objects: self.held.clone(),
        });
        ctx.nodes.restart_node(&self.host)?;
        let down = self.killed.map(|k| k.elapsed()).unwrap_or_default();
        let end = std::time::Instant::now() + RECONCILE_TIMEOUT;
        while ctx.nodes.disks_reconciled(&self.host)? <= self.reconciled_before {
            if std::time::Instant::now() > end {
                return Err(Error::Cluster(format!(
                    "the restarted sidecar of {} did not reconcile its disks within {RECONCILE_TIMEOUT:?}",
                    self.host
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if !feed.wait_current(FEED_CURRENT_TIMEOUT) {
            return Err(Error::Cluster("metad's change feed is not current".into()));
        }
        // Down past the node TTL, metad may have declared the node dead and dropped its disk
        // replicas (counted as dead-node drops): then every held object may have gone.
        let past_ttl = down >= crate::cluster::NODE_TTL;
        let dead = if past_ttl { self.held.len() as u64 } else { 0 };
        let counted = ctx.nodes.disk_drops(&self.host)? + self.drops_while_taken + dead;
        ctx.history.event(EventKind::WarmRestarted {
            host: self.host.clone(),
            node: self.node,
            drops_counted: counted,
        });
        let (reader, found, absent, unreadable) = self.read_back(ctx, feed)?;
        if !unreadable.is_empty() {
            return Err(Error::Cluster(format!(
                "after the warm restart of {}, metad lists {} objects on its disk that {reader} \
                 cannot read: {unreadable:?}",
                self.host,
                unreadable.len()
            )));
        }
        let late = if past_ttl {
            format!(" (down {down:?}, past the node TTL: its disk objects may have been dropped)")
        } else {
            String::new()
        };
        Ok(format!(
            "restarted after {:.1}s (node {}, same state and disk), disks reconciled{late}; of \
             {} objects held on its disk, {found} read back through {reader}, {absent} found \
             absent; drops counted {counted}",
            down.as_secs_f64(),
            self.node,
            self.held.len()
        ))
    }
}

struct IndexLag {
    host: String,
}

impl Nemesis for IndexLag {
    fn name(&self) -> String {
        format!("index-lag-{}", self.host)
    }
    fn inject(&mut self, ctx: &mut FaultCtx<'_>) -> Result<String> {
        ctx.nodes.freeze_index(&self.host, true)
    }
    fn heal(&mut self, ctx: &mut FaultCtx<'_>) -> Result<String> {
        ctx.nodes.freeze_index(&self.host, false)
    }
}

struct DataPortLatency {
    delay: Duration,
    /// Bytes the proxies had forwarded when the delay began.
    bytes_before: u64,
}

impl Nemesis for DataPortLatency {
    fn name(&self) -> String {
        Fault::DataPortLatency { delay: self.delay }.name()
    }
    fn inject(&mut self, ctx: &mut FaultCtx<'_>) -> Result<String> {
        if ctx.data_proxies.is_empty() {
            return Err(Error::Config(
                "no proxy in front of any data port (the workload moves no bytes)".into(),
            ));
        }
        self.bytes_before = ctx.data_proxies.iter().map(|p| p.bytes()).sum();
        for p in ctx.data_proxies {
            p.set_delay(self.delay);
        }
        Ok(format!(
            "{} data-port proxies delay {:?}",
            ctx.data_proxies.len(),
            self.delay
        ))
    }
    fn heal(&mut self, ctx: &mut FaultCtx<'_>) -> Result<String> {
        for p in ctx.data_proxies {
            p.set_delay(Duration::ZERO);
        }
        let moved = ctx
            .data_proxies
            .iter()
            .map(|p| p.bytes())
            .sum::<u64>()
            .saturating_sub(self.bytes_before);
        Ok(format!(
            "data-port delay removed; {:.1} MiB went through the delayed proxies",
            moved as f64 / (1u64 << 20) as f64
        ))
    }
}

// ---------------------------------------------------------------------------- hostile clients

#[derive(Default)]
struct ByzantineClient {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<byzantine::Tally>>,
}

/// What the attacker on each sidecar host aims at: its sidecar's socket, every sidecar's data
/// ports, the running metad replicas' gRPC and HTTP ports.
fn byzantine_targets(ctx: &FaultCtx<'_>) -> Result<Vec<byzantine::Targets>> {
    let sidecars = sidecar_hosts(ctx.topo);
    let mut data_ports = Vec::new();
    for h in &sidecars {
        let status = format!("{}:{}", h.addr(), crate::sidecars::METRICS_PORT);
        for nic in &h.nics {
            let addr = SocketAddr::new(nic.addr.into(), crate::sidecars::DATA_PORT);
            data_ports.push((addr, status.clone()));
        }
    }
    let replicas: Vec<Ipv4Addr> = ctx
        .cluster
        .member_ids()
        .into_iter()
        .filter_map(|id| ctx.cluster.replica(id).ok())
        .filter(|r| r.running())
        .map(|r| r.host.addr())
        .collect();
    let at = |port: u16| -> Vec<SocketAddr> {
        replicas
            .iter()
            .map(|a| SocketAddr::new((*a).into(), port))
            .collect()
    };
    let mut metad_http = at(crate::cluster::METRICS_PORT);
    metad_http.extend(at(crate::cluster::KV_PORT));
    let mut targets = Vec::new();
    for host in sidecars {
        let socket = crate::sidecars::socket_path(&ctx.topo.dir, &host.name);
        if !socket.exists() {
            return Err(Error::Config(format!(
                "no sidecar socket at {} (the byzantine client needs real sidecars)",
                socket.display()
            )));
        }
        targets.push(byzantine::Targets {
            host,
            socket,
            data_ports: data_ports.clone(),
            metad_grpc: at(crate::cluster::GRPC_PORT),
            metad_http: metad_http.clone(),
            token: ctx.cluster.token().to_string(),
        });
    }
    Ok(targets)
}

impl Nemesis for ByzantineClient {
    fn name(&self) -> String {
        Fault::ByzantineClient.name()
    }
    fn inject(&mut self, ctx: &mut FaultCtx<'_>) -> Result<String> {
        let targets = byzantine_targets(ctx)?;
        let hosts: Vec<String> = targets.iter().map(|t| t.host.name.clone()).collect();
        self.stop.store(false, Ordering::Relaxed);
        self.threads = byzantine::start(targets, self.stop.clone())?;
        Ok(format!("hostile clients on {hosts:?}"))
    }
    fn heal(&mut self, _ctx: &mut FaultCtx<'_>) -> Result<String> {
        self.stop.store(true, Ordering::Relaxed);
        let mut tally = byzantine::Tally::default();
        for t in self.threads.drain(..) {
            match t.join() {
                Ok(part) => tally.merge(part),
                Err(_) => tally.violation_line("an attacker thread panicked".into()),
            }
        }
        let summary = tally.summary();
        let failures = tally.failures();
        if !failures.is_empty() {
            return Err(Error::Cluster(format!(
                "byzantine client: {}; counts: {summary}",
                failures.join("; ")
            )));
        }
        Ok(format!("hostile clients stopped; {summary}"))
    }
}

// ---------------------------------------------------------------------------- network

#[derive(Clone)]
enum NetKind {
    IsolateLeader,
    OneWay(OneWay),
    Split,
    Loss(u8),
    Cutoff(String),
    Nic(String, u8),
}

/// A network fault: fault tables on some hosts, removed on heal.
struct Net {
    name: String,
    kind: NetKind,
    installed: Vec<Host>,
    /// A NIC cut's host traffic per NIC when it was cut (when the workload moves bytes).
    traffic_before: Option<BTreeMap<String, u64>>,
}

impl Net {
    fn new(name: String, kind: NetKind) -> Self {
        Self {
            name,
            kind,
            installed: Vec::new(),
            traffic_before: None,
        }
    }

    /// What each NIC of a cut host carried while the cut lasted, e.g. "10.77.0.21 3.2 MiB,
    /// 10.77.1.21 0.0 MiB" (the surviving NIC should carry the transfers).
    fn traffic_during_cut(&mut self, ctx: &FaultCtx<'_>) -> Option<String> {
        let NetKind::Nic(host, _) = &self.kind else {
            return None;
        };
        let before = self.traffic_before.take()?;
        let after = ctx.nodes.nic_traffic(host).ok()?;
        let moved: Vec<String> = after
            .iter()
            .map(|(nic, b)| {
                let d = b.saturating_sub(before.get(nic).copied().unwrap_or(0));
                format!("{nic} {:.1} MiB", d as f64 / (1u64 << 20) as f64)
            })
            .collect();
        Some(format!("during the cut {host} moved {}", moved.join(", ")))
    }

    fn install(&mut self, ctx: &FaultCtx<'_>, host: &Host, rules: &[Rule]) -> Result<()> {
        firewall::install(host, &ctx.topo.dir, &self.name, rules)?;
        self.installed.push(host.clone());
        Ok(())
    }

    /// Splits the hosts into groups that cannot reach each other (both directions).
    fn partition(&mut self, ctx: &FaultCtx<'_>, groups: &[Vec<Host>]) -> Result<()> {
        for (gi, group) in groups.iter().enumerate() {
            let others: Vec<Ipv4Addr> = groups
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != gi)
                .flat_map(|(_, g)| g.iter().flat_map(addrs_of))
                .collect();
            for host in group {
                self.install(
                    ctx,
                    host,
                    &[Rule::DropFrom(others.clone()), Rule::DropTo(others.clone())],
                )?;
            }
        }
        Ok(())
    }
}

fn addrs_of(h: &Host) -> Vec<Ipv4Addr> {
    h.nics.iter().map(|n| n.addr).collect()
}

fn sidecar_hosts(topo: &Topology) -> Vec<Host> {
    topo.hosts
        .values()
        .filter(|h| h.name.starts_with('s'))
        .cloned()
        .collect()
}

impl Nemesis for Net {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn inject(&mut self, ctx: &mut FaultCtx<'_>) -> Result<String> {
        match self.kind.clone() {
            NetKind::IsolateLeader => {
                let id = leader(ctx)?;
                let host = ctx.cluster.replica(id)?.host.clone();
                self.install(ctx, &host, &[Rule::DropAll])?;
                Ok(format!(
                    "metad {id} ({}) cut off from every host",
                    host.name
                ))
            }
            NetKind::OneWay(dir) => {
                let id = leader(ctx)?;
                let host = ctx.cluster.replica(id)?.host.clone();
                let peers: Vec<Ipv4Addr> = ctx
                    .cluster
                    .member_ids()
                    .into_iter()
                    .filter(|m| *m != id)
                    .filter_map(|m| ctx.cluster.replica(m).ok().map(|r| r.host.addr()))
                    .collect();
                let rule = match dir {
                    OneWay::LeaderDeaf => Rule::DropFrom(peers.clone()),
                    OneWay::LeaderMute => Rule::DropTo(peers.clone()),
                };
                self.install(ctx, &host, &[rule])?;
                Ok(format!("metad {id}: {dir:?} towards {peers:?}"))
            }
            NetKind::Split => {
                let id = leader(ctx)?;
                let leader_host = ctx.cluster.replica(id)?.host.clone();
                let sidecars = sidecar_hosts(ctx.topo);
                let mut minority = vec![leader_host.clone()];
                minority.extend(sidecars.first().cloned());
                let majority: Vec<Host> = ctx
                    .cluster
                    .hosts()
                    .iter()
                    .filter(|h| h.name != leader_host.name)
                    .cloned()
                    .chain(sidecars.iter().skip(1).cloned())
                    .collect();
                let describe = |g: &[Host]| g.iter().map(|h| h.name.clone()).collect::<Vec<_>>();
                let detail = format!(
                    "minority {:?} (leader {id}) | majority {:?}",
                    describe(&minority),
                    describe(&majority)
                );
                self.partition(ctx, &[minority, majority])?;
                Ok(detail)
            }
            NetKind::Loss(p) => {
                let id = leader(ctx)?;
                let host = ctx.cluster.replica(id)?.host.clone();
                self.install(ctx, &host, &[Rule::Loss { percent: p }])?;
                Ok(format!("metad {id} loses {p}% of its packets"))
            }
            NetKind::Cutoff(name) => {
                let host = ctx.topo.host(&name)?.clone();
                self.install(ctx, &host, &[Rule::DropAll])?;
                Ok(format!("{name} cut off from every host"))
            }
            NetKind::Nic(name, nic) => {
                let host = ctx.topo.host(&name)?.clone();
                let ifname = host
                    .nics
                    .get(nic as usize)
                    .map(|n| n.ifname.clone())
                    .ok_or_else(|| Error::Config(format!("{name} has no NIC {nic}")))?;
                self.traffic_before = ctx.nodes.nic_traffic(&name).ok();
                self.install(ctx, &host, &[Rule::DropInterface(ifname.clone())])?;
                Ok(format!(
                    "{name} {ifname} ({}) cut",
                    host.nics[nic as usize].addr
                ))
            }
        }
    }

    fn heal(&mut self, ctx: &mut FaultCtx<'_>) -> Result<String> {
        let traffic = self.traffic_during_cut(ctx);
        let mut healed = Vec::new();
        for host in self.installed.drain(..) {
            firewall::remove(&host, &self.name)?;
            healed.push(host.name);
        }
        Ok(match traffic {
            Some(t) => format!("rules removed on {healed:?}; {t}"),
            None => format!("rules removed on {healed:?}"),
        })
    }
}
