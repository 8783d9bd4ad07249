//! The metad-only workload: each sidecar host runs a *fake sidecar* that mounts a segment and
//! heartbeats like the real one would (reporting in-flight reservations on its segment and
//! releasing quarantined ones), and clients that put and get through metad alone.
//!
//! A put is `Reserve` + `Commit` with the object's checksum set to [`value::tag`] of
//! `(key, write id)`; a get returns the placement's checksum as the value read. No bytes move,
//! so this finds metadata bugs (lost commits, stale or split-brain reads, double puts) until the
//! sidecar-backed workload replaces it behind the same traits.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use regolith_proto::client::{ClientConfig, MetadClient};
use regolith_proto::metad as pb;

use crate::error::{Error, Result};
use crate::history::{EventKind, Extent, History, OpResult, ReplicaLoc, Reply};
use crate::value;
use crate::workload::{HostCtx, Workload, WorkloadClient};

/// Port the fake sidecars advertise as their data port (nothing listens: no bytes move).
pub const FAKE_DATA_PORT: u16 = 7600;

/// How long after an attempt's deadline it may still be acted on, as this process sees it: the
/// header is in whole milliseconds and metad's clock is the same host's here (its own in a
/// real cluster, which NTP keeps within a few milliseconds).
const DEADLINE_MARGIN: Duration = Duration::from_millis(50);

#[derive(Clone, Debug)]
pub struct MetadOnlyConfig {
    /// Size of every object (only metadata: nothing is allocated).
    pub value_size: u64,
    /// Capacity each fake sidecar mounts; large against keys × size so nothing is evicted.
    pub capacity: u64,
    pub heartbeat_every: Duration,
}

impl Default for MetadOnlyConfig {
    fn default() -> Self {
        Self {
            value_size: 4096,
            capacity: 1 << 30,
            heartbeat_every: Duration::from_millis(300),
        }
    }
}

/// Extents of each reservation `(term, id)` in flight on one segment.
type SegmentInFlight = HashMap<(u64, u64), Vec<pb::Extent>>;

/// Reservations in flight on each segment, shared by every fake sidecar (in a real cluster
/// the owner of a segment knows them from the slices it receives).
#[derive(Default, Debug)]
struct InFlight {
    by_segment: Mutex<HashMap<ReplicaLoc, SegmentInFlight>>,
}

impl InFlight {
    fn add(&self, version: (u64, u64), replicas: &[pb::Replica]) {
        let mut m = self.by_segment.lock();
        for r in replicas {
            let loc = ReplicaLoc {
                node: r.node_id,
                generation: r.generation,
            };
            m.entry(loc).or_default().insert(version, r.extents.clone());
        }
    }

    fn remove(&self, version: (u64, u64)) {
        let mut m = self.by_segment.lock();
        for v in m.values_mut() {
            v.remove(&version);
        }
    }

    fn on(&self, loc: ReplicaLoc) -> Vec<pb::InFlight> {
        self.by_segment
            .lock()
            .get(&loc)
            .map(|m| {
                m.iter()
                    .map(|((term, id), extents)| pb::InFlight {
                        version: Some(pb::Version {
                            term: *term,
                            id: *id,
                        }),
                        extents: extents.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    fn contains(&self, loc: ReplicaLoc, version: (u64, u64)) -> bool {
        self.by_segment
            .lock()
            .get(&loc)
            .is_some_and(|m| m.contains_key(&version))
    }
}

/// Removes a reservation from [`InFlight`] when the put ends, however it ends (also when the
/// operation's future is dropped at its timeout).
struct InFlightGuard<'a> {
    inflight: &'a InFlight,
    version: (u64, u64),
}

impl Drop for InFlightGuard<'_> {
    fn drop(&mut self) {
        self.inflight.remove(self.version);
    }
}

/// A heartbeat acknowledged by the leader of `term`, sent at `sent_us`.
#[derive(Clone, Copy, Debug)]
struct Ack {
    term: u64,
    loc: ReplicaLoc,
    sent_us: u64,
}

/// One host's fake sidecar.
struct FakeSidecar {
    name: String,
    /// For the clients' operations.
    client: MetadClient,
    /// For mount and heartbeats: short attempts, so that after a leader change a heartbeat
    /// reaches the new leader well within the node TTL (as the real sidecar's 1 s cadence
    /// with capped back-off does).
    control: MetadClient,
    data_addrs: Vec<String>,
    capacity: u64,
    segment: Mutex<Option<ReplicaLoc>>,
    crashed: AtomicBool,
    /// Set by a restart: mount a new generation at the next heartbeat.
    remount: AtomicBool,
    highest_term: AtomicU64,
    /// The last heartbeat a leader acknowledged without asking for a remount.
    last_ack: Mutex<Option<Ack>>,
    released: Mutex<Vec<pb::Version>>,
    inflight: Arc<InFlight>,
    history: History,
}

impl FakeSidecar {
    fn segment(&self) -> Option<ReplicaLoc> {
        *self.segment.lock()
    }

    /// Mounts (a new generation of) this node's segment.
    async fn mount(&self) -> Result<ReplicaLoc> {
        let old = self.segment();
        let r = self
            .control
            .mount(pb::MountSegmentRequest {
                node_name: self.name.clone(),
                node_id: old.map(|s| s.node).unwrap_or(0),
                capacity: self.capacity,
                data_addrs: self.data_addrs.clone(),
            })
            .await?;
        let new = ReplicaLoc {
            node: r.node_id,
            generation: r.generation,
        };
        if let Some(old) = old.filter(|o| *o != new) {
            self.history.event(EventKind::GenerationGone {
                loc: old,
                why: format!("{} mounted generation {}", self.name, new.generation),
                heard_at_us: None,
            });
        }
        *self.segment.lock() = Some(new);
        tracing::info!(host = %self.name, node = new.node, generation = new.generation, "fake sidecar mounted");
        Ok(new)
    }

    async fn heartbeat_once(&self) {
        if self.crashed.load(Ordering::Relaxed) {
            return;
        }
        let seg = match self.segment() {
            Some(s) if !self.remount.swap(false, Ordering::Relaxed) => s,
            _ => {
                if let Err(e) = self.mount().await {
                    tracing::debug!(host = %self.name, error = %e, "mount failed; retrying");
                    self.remount.store(true, Ordering::Relaxed);
                }
                return;
            }
        };
        let released = std::mem::take(&mut *self.released.lock());
        let req = pb::HeartbeatRequest {
            node_id: seg.node,
            generation: seg.generation,
            highest_term_seen: self.highest_term.load(Ordering::Relaxed),
            in_flight: self.inflight.on(seg),
            released: released.clone(),
            used_bytes: 0,
            accessed: vec![],
            ..Default::default()
        };
        // Taken before the call (which may retry): never later than the send that was heard.
        let sent_us = self.history.now_us();
        match self.control.heartbeat(req).await {
            Ok((resp, _)) => self.on_heartbeat_reply(seg, resp, sent_us),
            Err(e) => {
                // Not delivered (or the reply lost): report the releases again next time.
                self.released.lock().extend(released);
                tracing::debug!(host = %self.name, error = %e, "heartbeat failed");
            }
        }
    }

    fn on_heartbeat_reply(&self, seg: ReplicaLoc, resp: pb::HeartbeatResponse, sent_us: u64) {
        self.highest_term.fetch_max(resp.term, Ordering::Relaxed);
        let mut last_ack = self.last_ack.lock();
        if resp.remount {
            let heard_at_us = last_ack
                .filter(|a| a.term == resp.term && a.loc == seg)
                .map(|a| a.sent_us);
            self.history.event(EventKind::GenerationGone {
                loc: seg,
                why: format!(
                    "heartbeat of {} answered remount (term {}, leader {})",
                    self.name, resp.term, resp.leader_id
                ),
                heard_at_us,
            });
            self.remount.store(true, Ordering::Relaxed);
            return;
        }
        *last_ack = Some(Ack {
            term: resp.term,
            loc: seg,
            sent_us,
        });
        drop(last_ack);
        // Fence and release what is quarantined, unless a local put is still on it (then the
        // next heartbeat sees it again, once the put has ended).
        let release: Vec<pb::Version> = resp
            .quarantined
            .into_iter()
            .filter(|v| !self.inflight.contains(seg, (v.term, v.id)))
            .collect();
        self.released.lock().extend(release);
    }
}

/// The metad-only workload.
pub struct MetadOnly {
    cfg: MetadOnlyConfig,
    hosts: Mutex<HashMap<String, Arc<FakeSidecar>>>,
    inflight: Arc<InFlight>,
    stop: Arc<AtomicBool>,
}

impl MetadOnly {
    pub fn new(cfg: MetadOnlyConfig) -> Self {
        Self {
            cfg,
            hosts: Mutex::new(HashMap::new()),
            inflight: Arc::new(InFlight::default()),
            stop: Arc::new(AtomicBool::new(false)),
        }
    }

    fn sidecar(&self, host: &str) -> Result<Arc<FakeSidecar>> {
        self.hosts
            .lock()
            .get(host)
            .cloned()
            .ok_or_else(|| Error::Config(format!("host {host} was not started")))
    }
}

/// Client settings: short enough that an operation during a fault ends within seconds.
fn client_config(ctx: &HostCtx) -> ClientConfig {
    let mut cfg = ClientConfig::new(ctx.metad_addrs.clone());
    cfg.token = Some(ctx.token.clone());
    cfg.connect_timeout = Duration::from_millis(700);
    cfg.request_timeout = Duration::from_secs(2);
    cfg.retry_deadline = Duration::from_secs(4);
    cfg
}

/// Heartbeat settings: a dead leader costs well under a second per attempt.
fn control_config(ctx: &HostCtx) -> ClientConfig {
    let mut cfg = client_config(ctx);
    cfg.connect_timeout = Duration::from_millis(400);
    cfg.request_timeout = Duration::from_millis(800);
    cfg.retry_deadline = Duration::from_millis(2500);
    cfg
}

impl Workload for MetadOnly {
    type Client = MetadOnlyClient;

    fn name(&self) -> &'static str {
        "metad-only"
    }

    async fn start_host(&self, ctx: HostCtx) -> Result<()> {
        let sc = Arc::new(FakeSidecar {
            name: ctx.host.name.clone(),
            client: MetadClient::new(client_config(&ctx))?,
            control: MetadClient::new(control_config(&ctx))?,
            data_addrs: ctx
                .host
                .nics
                .iter()
                .map(|n| format!("{}:{FAKE_DATA_PORT}", n.addr))
                .collect(),
            capacity: self.cfg.capacity,
            segment: Mutex::new(None),
            crashed: AtomicBool::new(false),
            remount: AtomicBool::new(false),
            highest_term: AtomicU64::new(0),
            last_ack: Mutex::new(None),
            released: Mutex::new(Vec::new()),
            inflight: self.inflight.clone(),
            history: ctx.history.clone(),
        });
        let mut last = None;
        for _ in 0..10 {
            match sc.mount().await {
                Ok(_) => {
                    last = None;
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        if let Some(e) = last {
            return Err(e);
        }
        let (hb, stop, every) = (sc.clone(), self.stop.clone(), self.cfg.heartbeat_every);
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                hb.heartbeat_once().await;
                tokio::time::sleep(every).await;
            }
        });
        self.hosts.lock().insert(ctx.host.name.clone(), sc);
        Ok(())
    }

    fn client(&self, host: &str, _process: u32) -> Result<MetadOnlyClient> {
        Ok(MetadOnlyClient {
            sc: self.sidecar(host)?,
            value_size: self.cfg.value_size,
        })
    }

    fn crash_node(&self, host: &str) -> Result<()> {
        self.sidecar(host)?.crashed.store(true, Ordering::Relaxed);
        Ok(())
    }

    fn restart_node(&self, host: &str) -> Result<()> {
        let sc = self.sidecar(host)?;
        // A restarted sidecar has a new, empty segment: it mounts a new generation, which
        // drops the old one's objects.
        sc.remount.store(true, Ordering::Relaxed);
        sc.crashed.store(false, Ordering::Relaxed);
        Ok(())
    }

    fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A client of the metad-only workload.
pub struct MetadOnlyClient {
    sc: Arc<FakeSidecar>,
    value_size: u64,
}

fn code_name(code: i32) -> String {
    pb::Code::try_from(code)
        .map(|c| format!("{c:?}"))
        .unwrap_or_else(|_| format!("code {code}"))
}

/// Classifies a commit's per-item status.
fn commit_outcome(
    status: Option<pb::Status>,
    replicas: Vec<ReplicaLoc>,
    extents: Vec<Vec<Extent>>,
) -> OpResult {
    let st = status.unwrap_or_default();
    let why = || format!("commit: {} {}", code_name(st.code), st.message);
    match pb::Code::try_from(st.code) {
        Ok(pb::Code::Ok) => OpResult::Ok(Reply::Stored { replicas, extents }),
        Ok(pb::Code::AlreadyExists) => OpResult::Ok(Reply::AlreadyExists),
        // metad's contract: these are decided before or at apply; nothing was written.
        Ok(
            pb::Code::StaleReservation
            | pb::Code::Expired
            | pb::Code::Conflict
            | pb::Code::InvalidArgument
            | pb::Code::NoSpace
            | pb::Code::NotEnoughNodes
            | pb::Code::QuotaExceeded
            | pb::Code::NotFound,
        ) => OpResult::Fail(why()),
        _ => OpResult::Indeterminate(why()),
    }
}

/// Classifies a commit that got no per-item answer.
fn commit_error(e: &regolith_proto::Error) -> OpResult {
    use regolith_proto::Error as E;
    match e {
        // A deposed leader answers NOT_LEADER also for a proposal it had already appended,
        // which a new leader may still commit: the fate is unknown.
        E::NotLeader { .. } => OpResult::Indeterminate(format!("commit: {e}")),
        E::Rpc {
            code:
                tonic::Code::Unauthenticated
                | tonic::Code::InvalidArgument
                | tonic::Code::PermissionDenied,
            ..
        } => OpResult::Fail(format!("commit refused: {e}")),
        E::BadAddress { .. } | E::Config(_) => OpResult::Fail(format!("commit not sent: {e}")),
        _ => OpResult::Indeterminate(format!("commit: {e}")),
    }
}

impl MetadOnlyClient {
    fn node(&self) -> std::result::Result<ReplicaLoc, OpResult> {
        if self.sc.crashed.load(Ordering::Relaxed) {
            return Err(OpResult::Fail("sidecar down".into()));
        }
        self.sc
            .segment()
            .ok_or_else(|| OpResult::Fail("segment not mounted".into()))
    }

    async fn put_inner(&self, key: &str, write_id: u64, replicas: u32) -> OpResult {
        let node = match self.node() {
            Ok(n) => n,
            Err(r) => return r,
        };
        let req = pb::ReserveRequest {
            key: key.to_string(),
            size: self.value_size,
            options: Some(pb::PutOptions {
                replicas,
                ..Default::default()
            }),
            requester_node_id: node.node,
        };
        // A reservation lives in the leader's memory only: a failed reserve wrote nothing.
        let (resp, leader_addr) = match self.sc.client.reserve(req).await {
            Ok(r) => r,
            Err(e) => return OpResult::Fail(format!("reserve: {e}")),
        };
        let st = resp.status.unwrap_or_default();
        match pb::Code::try_from(st.code) {
            Ok(pb::Code::Ok) => {}
            Ok(pb::Code::AlreadyExists) => return OpResult::Ok(Reply::AlreadyExists),
            _ => return OpResult::Fail(format!("reserve: {} {}", code_name(st.code), st.message)),
        }
        let Some(res) = resp.reservation else {
            return OpResult::Fail("reserve answered OK without a reservation".into());
        };
        let Some(version) = res.version else {
            return OpResult::Fail("reservation without a version".into());
        };
        let v = (version.term, version.id);
        self.sc.inflight.add(v, &res.replicas);
        let _guard = InFlightGuard {
            inflight: &self.sc.inflight,
            version: v,
        };
        let locs: Vec<ReplicaLoc> = res
            .replicas
            .iter()
            .map(|r| ReplicaLoc {
                node: r.node_id,
                generation: r.generation,
            })
            .collect();
        let extents: Vec<Vec<Extent>> = res
            .replicas
            .iter()
            .map(|r| {
                r.extents
                    .iter()
                    .map(|e| Extent {
                        offset: e.offset,
                        len: e.len,
                    })
                    .collect()
            })
            .collect();
        let commit = pb::CommitRequest {
            version: Some(version),
            checksum: value::tag(key, write_id),
        };
        match self.sc.client.commit_at(&leader_addr, commit).await {
            Ok(cr) => commit_outcome(cr.status, locs, extents),
            Err(e) => commit_error(&e),
        }
    }

    /// One remove, attempted at one replica at a time (never blindly retried: a retry after an
    /// attempt of unknown fate would answer not-found for a key the first attempt removed).
    /// After such an attempt, the answer waits until that attempt's deadline has passed: metad
    /// may act on it until then (it may be delivered late), and an effect after the answer
    /// would fall outside the operation.
    async fn remove_inner(&self, key: &str) -> OpResult {
        let r = self.remove_attempts(key).await;
        if let Some(at) = r.1 {
            tokio::time::sleep_until(at).await;
        }
        r.0
    }

    /// [`Self::remove_inner`]'s attempts; with the result, when the last attempt of unknown
    /// fate stops counting.
    async fn remove_attempts(&self, key: &str) -> (OpResult, Option<tokio::time::Instant>) {
        let client = &self.sc.client;
        let addrs = client.addrs().to_vec();
        let mut target = client.leader_addr();
        let mut maybe_done = false;
        let mut settled_at: Option<tokio::time::Instant> = None;
        let mut last = String::new();
        for attempt in 0..(addrs.len() * 2) {
            let addr = target
                .take()
                .unwrap_or_else(|| addrs[attempt % addrs.len()].clone());
            let req = pb::RemoveRequest {
                keys: vec![key.to_string()],
            };
            // The attempt's deadline (stamped when it is sent, once connected), plus room for
            // the two clocks and the header's rounding.
            let counts_until = tokio::time::Instant::now()
                + client.connect_timeout()
                + client.request_timeout()
                + DEADLINE_MARGIN;
            let sent = client
                .call_at(&addr, |mut c| async move { c.remove(req).await })
                .await;
            if sent.is_err() {
                settled_at = settled_at.max(Some(counts_until));
            }
            let result = match sent {
                Ok(resp) => {
                    let code = resp.codes.first().copied().unwrap_or(-1);
                    Some(match pb::Code::try_from(code) {
                        Ok(pb::Code::Ok) => OpResult::Ok(Reply::Removed(true)),
                        Ok(pb::Code::NotFound) if !maybe_done => {
                            OpResult::Ok(Reply::Removed(false))
                        }
                        Ok(pb::Code::NotFound) => OpResult::Indeterminate(format!(
                            "not found, after an attempt of unknown fate ({last})"
                        )),
                        _ => OpResult::Indeterminate(format!("remove: {}", code_name(code))),
                    })
                }
                Err(regolith_proto::Error::NotLeader { leader, .. }) => {
                    // Possibly a deposed leader that had proposed it.
                    maybe_done = true;
                    last = format!("{addr}: not leader");
                    target = leader.map(|h| h.addr);
                    None
                }
                Err(
                    e @ regolith_proto::Error::Rpc {
                        code: tonic::Code::Unauthenticated | tonic::Code::InvalidArgument,
                        ..
                    },
                ) => Some(if maybe_done {
                    OpResult::Indeterminate(format!("remove: {e} after {last}"))
                } else {
                    OpResult::Fail(format!("remove: {e}"))
                }),
                Err(e) => {
                    maybe_done = true;
                    last = e.to_string();
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    None
                }
            };
            if let Some(r) = result {
                return (r, settled_at);
            }
        }
        (
            OpResult::Indeterminate(format!("remove: no leader answered ({last})")),
            settled_at,
        )
    }
}

impl WorkloadClient for MetadOnlyClient {
    async fn put(&self, key: &str, write_id: u64, replicas: u32) -> OpResult {
        self.put_inner(key, write_id, replicas).await
    }

    async fn get(&self, key: &str) -> OpResult {
        let node = match self.node() {
            Ok(n) => n,
            Err(r) => return r,
        };
        match self.sc.client.get(key, node.node).await {
            Ok(p) => {
                let st = p.status.unwrap_or_default();
                match pb::Code::try_from(st.code) {
                    Ok(pb::Code::Ok) => match value::decode_tag(key, p.checksum) {
                        Ok(write_id) => OpResult::Ok(Reply::Found { write_id }),
                        Err(detail) => OpResult::Ok(Reply::Corrupt { detail }),
                    },
                    Ok(pb::Code::NotFound) => OpResult::Ok(Reply::NotFound),
                    _ => OpResult::Fail(format!("get: {} {}", code_name(st.code), st.message)),
                }
            }
            Err(e) => OpResult::Fail(format!("get: {e}")),
        }
    }

    async fn exists(&self, key: &str) -> OpResult {
        if let Err(r) = self.node() {
            return r;
        }
        match self.sc.client.exists(key).await {
            Ok(b) => OpResult::Ok(Reply::Exists(b)),
            Err(e) => OpResult::Fail(format!("exists: {e}")),
        }
    }

    async fn remove(&self, key: &str) -> OpResult {
        if let Err(r) = self.node() {
            return r;
        }
        self.remove_inner(key).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_statuses_are_classified_by_the_contract() {
        let st = |c: pb::Code| {
            Some(pb::Status {
                code: c as i32,
                message: String::new(),
            })
        };
        assert!(matches!(
            commit_outcome(st(pb::Code::Ok), vec![], vec![]),
            OpResult::Ok(Reply::Stored { .. })
        ));
        assert!(matches!(
            commit_outcome(None, vec![], vec![]),
            OpResult::Ok(Reply::Stored { .. })
        ));
        assert!(matches!(
            commit_outcome(st(pb::Code::Expired), vec![], vec![]),
            OpResult::Fail(_)
        ));
        assert!(matches!(
            commit_outcome(st(pb::Code::Internal), vec![], vec![]),
            OpResult::Indeterminate(_)
        ));
        let not_leader = regolith_proto::Error::NotLeader {
            addr: "a:1".into(),
            leader: None,
        };
        assert!(matches!(
            commit_error(&not_leader),
            OpResult::Indeterminate(_)
        ));
    }

    #[test]
    fn in_flight_is_tracked_per_segment_and_cleared_by_the_guard() {
        let f = InFlight::default();
        let rep = |node| pb::Replica {
            node_id: node,
            generation: 1,
            extents: vec![pb::Extent { offset: 0, len: 8 }],
            ..Default::default()
        };
        f.add((3, 9), &[rep(1), rep(2)]);
        let loc = |node| ReplicaLoc {
            node,
            generation: 1,
        };
        assert_eq!(f.on(loc(1)).len(), 1);
        assert!(f.contains(loc(2), (3, 9)));
        {
            let _g = InFlightGuard {
                inflight: &f,
                version: (3, 9),
            };
        }
        assert!(f.on(loc(1)).is_empty() && !f.contains(loc(2), (3, 9)));
    }
}
