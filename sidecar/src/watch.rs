//! The node's index kept current: [`NodeIndex`] (the shared [`Index`] with its health and the
//! accesses to report) and [`run`], the task that follows metad's `Watch` stream.
//!
//! The task keeps the last index its copy is complete up to and asks the leader to resume
//! after it: across a reconnect or a leader change that costs no resync when the new leader's
//! feed reaches back that far. The index answers only while it is *synced*: a stream is open,
//! no resync is under way, and the leader's last guarantee is younger than [`STALE_AFTER`]
//! (each message that brings the copy up to the leader's applied state carries the Unix time
//! at which the leader confirmed its quorum lease, at least every 500 ms while idle: the copy
//! then holds every change acknowledged before that time); otherwise every exists and get asks
//! metad. So a read the index answers misses no change acknowledged more than [`STALE_AFTER`]
//! before it, whatever node made it (changes made through this node show at once: the
//! read-your-writes overrides), and a leader cut off from its quorum, or a stream delayed in
//! the network, turns the index off instead of serving an old copy.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use regolith_proto::client::MetadClient;
use regolith_proto::common::Version;
use regolith_proto::leader;
use regolith_proto::metad as mpb;
use regolith_proto::shutdown::Shutdown;

use crate::index::{Index, SegmentInfo};
use crate::metrics::Metrics;
use crate::ops::{Placement, Replica};

/// The index stops answering when the leader's last guarantee (see the module) is this old:
/// the bound on how stale an answer of the index can be.
pub const STALE_AFTER: Duration = Duration::from_millis(2000);
/// Most accessed keys one heartbeat reports.
pub const MAX_ACCESSES: usize = 16_384;

#[derive(Debug, Default)]
struct Health {
    /// When the last stream message arrived (None: no stream).
    last_message: Option<Instant>,
    /// The copy holds every change acknowledged before this moment (the leader's last
    /// guarantee, converted from Unix time); None: no guarantee yet on this stream.
    current_as_of: Option<Instant>,
    resyncing: bool,
    /// The leader's last applied index, as the last message said.
    leader_applied: u64,
    /// Since when the copy has been behind the leader.
    behind_since: Option<Instant>,
}

/// The index shared by the workflows and the watch task.
pub struct NodeIndex {
    index: RwLock<Index>,
    health: Mutex<Health>,
    accessed: Mutex<HashSet<String>>,
    enabled: bool,
    epoch: Instant,
    metrics: Arc<Metrics>,
    /// Test hook: messages are received but not applied.
    frozen: AtomicBool,
    /// Test hook: drop the stream and resync.
    resync: AtomicBool,
    /// The node's disk tier: records of objects the stream removes are deleted from it.
    disks: std::sync::OnceLock<Arc<crate::disk::Tier>>,
}

impl NodeIndex {
    /// Deletes the disk records of objects the stream removes (set once, at start).
    pub fn set_disks(&self, disks: Arc<crate::disk::Tier>) {
        let _ = self.disks.set(disks);
    }

    pub fn new(enabled: bool, metrics: Arc<Metrics>) -> Self {
        NodeIndex {
            index: RwLock::new(Index::new(rand::random())),
            health: Mutex::new(Health::default()),
            accessed: Mutex::new(HashSet::new()),
            enabled,
            epoch: Instant::now(),
            metrics,
            frozen: AtomicBool::new(false),
            disks: std::sync::OnceLock::new(),
            resync: AtomicBool::new(false),
        }
    }

    /// An index that never answers (tests and `--no-index`).
    pub fn disabled(metrics: Arc<Metrics>) -> Self {
        Self::new(false, metrics)
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Whether the index may answer now.
    pub fn synced(&self) -> bool {
        if !self.enabled {
            return false;
        }
        let h = self.health.lock();
        !h.resyncing
            && h.last_message.is_some()
            && h.current_as_of.is_some_and(|t| t.elapsed() < STALE_AFTER)
    }

    /// Whether each key exists, when the index may answer.
    pub fn exists(&self, keys: &[String]) -> Option<Vec<bool>> {
        if !self.synced() {
            return None;
        }
        let ix = self.index.read();
        Some(keys.iter().map(|k| ix.contains(k)).collect())
    }

    /// The indexed placement of each key (None where not indexed), when the index may answer.
    pub fn placements(&self, keys: &[&str]) -> Option<Vec<Option<Placement>>> {
        if !self.synced() {
            return None;
        }
        let ix = self.index.read();
        Some(keys.iter().map(|k| ix.get(k)).collect())
    }

    /// A put through this node was acknowledged (read-your-writes).
    pub fn local_put(&self, key: &str, p: Placement) {
        if self.enabled {
            let now = self.now_ms();
            self.index.write().local_put(key, p, now);
        }
    }

    /// A remove through this node removed `key`.
    pub fn local_remove(&self, key: &str) {
        if self.enabled {
            let now = self.now_ms();
            self.index.write().local_remove(key, now);
        }
    }

    /// A remove-all through this node succeeded.
    pub fn local_remove_all(&self) {
        if self.enabled {
            let now = self.now_ms();
            self.index.write().local_remove_all(now);
        }
    }

    /// A get was served from the index: the leader hears of it with the next heartbeat.
    pub fn note_access(&self, key: &str) {
        let mut a = self.accessed.lock();
        if a.len() < MAX_ACCESSES {
            a.insert(key.to_string());
        } else if !a.contains(key) {
            self.metrics.accesses_dropped.inc();
        }
    }

    /// The accesses to report, emptied.
    pub fn take_accesses(&self) -> Vec<String> {
        std::mem::take(&mut *self.accessed.lock())
            .into_iter()
            .collect()
    }

    /// The indexed placement of `key` did not verify: drop it if it still is that version (the
    /// stream will bring whatever replaced it).
    pub fn forget(&self, key: &str, version: Version) {
        let now = self.now_ms();
        let mut ix = self.index.write();
        if ix.get(key).is_some_and(|p| p.version == version) {
            ix.stream_remove(key, now);
        }
    }

    pub fn applied(&self) -> u64 {
        self.index.read().applied()
    }

    /// Test hook (`--test-hooks`): while frozen, the stream is read but not applied, and the
    /// index keeps answering as if current; thawing resyncs it.
    pub fn freeze_for_test(&self, on: bool) {
        self.frozen.store(on, Ordering::Release);
        if !on {
            // The lagging copy stops answering at once, not at the next message.
            self.health.lock().current_as_of = None;
            self.resync.store(true, Ordering::Release);
        }
    }

    /// A resync was asked for: the copy is dropped and the stream must start over.
    fn take_resync(&self) -> bool {
        if !self.resync.swap(false, Ordering::AcqRel) {
            return false;
        }
        self.index.write().clear();
        true
    }

    /// Applies one stream message; answers the index the copy is complete up to.
    fn apply(&self, m: mpb::WatchMessage) -> u64 {
        use mpb::watch_message::Kind;
        let kind = Kind::try_from(m.kind).unwrap_or(Kind::Changes);
        if self.frozen.load(Ordering::Acquire) {
            // The test hook keeps a lagging copy answering on purpose (it races reuse).
            let mut h = self.health.lock();
            h.last_message = Some(Instant::now());
            h.current_as_of = Some(Instant::now());
            return self.applied();
        }
        let now = self.now_ms();
        let mut ix = self.index.write();
        match kind {
            Kind::Reset => {
                ix.clear();
                self.health.lock().resyncing = true;
                self.metrics.index_resyncs.inc();
            }
            Kind::Snapshot | Kind::Changes => {}
            Kind::SnapshotEnd => {}
        }
        let tier = self.disks.get().filter(|t| !t.is_empty());
        let mut removed: Vec<(String, Version)> = Vec::new();
        for c in m.changes {
            if let (Some(_), Some(mpb::watch_change::Change::Removed(k))) = (tier, &c.change) {
                if let Some(v) = ix.indexed_version(k) {
                    removed.push((k.clone(), v));
                }
            }
            apply_change(&mut ix, c, now);
        }
        match kind {
            Kind::SnapshotEnd => {
                ix.set_applied(m.index);
                ix.expire_overrides(now);
                self.health.lock().resyncing = false;
            }
            Kind::Changes => {
                ix.set_applied(m.index);
                ix.expire_overrides(now);
            }
            Kind::Reset | Kind::Snapshot => {}
        }
        let applied = ix.applied();
        self.metrics.index_objects.set(ix.len() as i64);
        self.metrics.index_bytes.set(ix.heap_bytes() as i64);
        self.metrics.index_applied_index.set(applied as i64);
        drop(ix);
        if let Some(t) = tier {
            // Only the version the stream removed: a newer one put and offloaded since is kept.
            for (k, v) in &removed {
                for d in t.disks() {
                    d.remove(k, Some(*v));
                }
            }
        }
        let mut h = self.health.lock();
        h.last_message = Some(Instant::now());
        if let Some(t) = guarantee_instant(m.as_of_unix_ms) {
            h.current_as_of = Some(h.current_as_of.map_or(t, |c| c.max(t)));
        }
        h.leader_applied = h.leader_applied.max(m.applied_index);
        let behind = !h.resyncing && applied < h.leader_applied;
        match (behind, h.behind_since) {
            (true, None) => h.behind_since = Some(Instant::now()),
            (false, _) => h.behind_since = None,
            _ => {}
        }
        self.metrics
            .index_lag_entries
            .set(h.leader_applied.saturating_sub(applied) as i64);
        self.metrics
            .index_lag_ms
            .set(h.behind_since.map_or(0, |t| t.elapsed().as_millis() as i64));
        applied
    }

    /// The stream ended: the index stops answering until the next one catches up.
    fn disconnected(&self) {
        let mut h = self.health.lock();
        h.last_message = None;
        h.current_as_of = None;
        drop(h);
        self.metrics.index_synced.set(0);
    }
}

/// The leader's guarantee time (Unix ms) as an instant of this process's clock; None for no
/// guarantee (0). A time in the future (clocks apart) counts as now.
fn guarantee_instant(as_of_unix_ms: u64) -> Option<Instant> {
    if as_of_unix_ms == 0 {
        return None;
    }
    let age = regolith_proto::auth::unix_ms().saturating_sub(as_of_unix_ms);
    let now = Instant::now();
    Some(now.checked_sub(Duration::from_millis(age)).unwrap_or(now))
}

fn replica_of(r: mpb::Replica) -> Replica {
    Replica {
        node_id: r.node_id,
        generation: r.generation,
        node_name: r.node_name,
        data_addrs: vec![],
        extents: r.extents,
        grants: crate::ops::metad::grants_of(&r.grants),
    }
}

fn apply_change(ix: &mut Index, c: mpb::WatchChange, now_ms: u64) {
    use mpb::watch_change::Change as C;
    match c.change {
        Some(C::Put(o)) => {
            let Some(v) = o.version else { return };
            let p = Placement {
                version: v,
                size: o.size,
                checksum: o.checksum,
                replicas: o.replicas.into_iter().map(replica_of).collect(),
            };
            ix.stream_put(&o.key, &p);
        }
        Some(C::Removed(k)) => ix.stream_remove(&k, now_ms),
        Some(C::SegmentUp(s)) => ix.segment_up(SegmentInfo {
            node_id: s.node_id,
            generation: s.generation,
            node_name: s.node_name,
            data_addrs: s.data_addrs.iter().filter_map(|a| a.parse().ok()).collect(),
        }),
        Some(C::SegmentDown(s)) => ix.segment_down(s.node_id, s.generation),
        Some(C::RemovedAll(_)) => ix.stream_remove_all(),
        None => {}
    }
}

/// Follows metad's watch stream until shutdown: resumes after the last complete index on every
/// reconnect, finds the leader by its hints, backs off while none answers.
pub async fn run(index: Arc<NodeIndex>, metad: MetadClient, node_id: u64, shutdown: Shutdown) {
    if !index.enabled {
        return;
    }
    let addrs = metad.addrs().to_vec();
    let mut next = 0usize;
    let mut target: Option<String> = None;
    let mut backoff = Duration::from_millis(50);
    loop {
        let addr = target
            .take()
            .or_else(|| metad.leader_addr())
            .unwrap_or_else(|| {
                next += 1;
                addrs[next % addrs.len()].clone()
            });
        let after = index.applied();
        let followed = tokio::select! {
            r = follow(&index, &metad, &addr, after, node_id) => r,
            _ = shutdown.wait() => return,
        };
        index.disconnected();
        match followed {
            Ok(()) => backoff = Duration::from_millis(50),
            Err(s) if leader::is_not_leader(&s) => {
                target = leader::hint_of(&s).map(|h| h.addr).filter(|a| *a != addr);
                tracing::debug!(%addr, next = ?target, "watch: not the leader");
            }
            Err(s) => {
                tracing::debug!(%addr, code = ?s.code(), msg = s.message(), "watch stream ended")
            }
        }
        if target.is_none() {
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = shutdown.wait() => return,
            }
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
    }
}

/// One stream: opened at `addr`, applied message by message until it ends or goes silent.
async fn follow(
    index: &NodeIndex,
    metad: &MetadClient,
    addr: &str,
    after: u64,
    node_id: u64,
) -> Result<(), tonic::Status> {
    let mut stub = metad
        .stub(addr)
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let req = mpb::WatchRequest {
        after_index: after,
        node_id,
    };
    let mut stream = stub.watch(req).await?.into_inner();
    index.metrics.index_reconnects.inc();
    tracing::info!(%addr, after, "watch stream open");
    loop {
        let m = match tokio::time::timeout(STALE_AFTER, stream.message()).await {
            Ok(Ok(Some(m))) => m,
            Ok(Ok(None)) => return Err(tonic::Status::unavailable("stream closed")),
            Ok(Err(s)) => return Err(s),
            Err(_) => return Err(tonic::Status::deadline_exceeded("watch stream silent")),
        };
        index.apply(m);
        if index.take_resync() {
            return Err(tonic::Status::aborted("resync asked"));
        }
        index.metrics.index_synced.set(i64::from(index.synced()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mpb::watch_change::Change as C;
    use mpb::watch_message::Kind;

    fn msg(kind: Kind, index: u64, changes: Vec<C>) -> mpb::WatchMessage {
        mpb::WatchMessage {
            kind: kind as i32,
            index,
            changes: changes
                .into_iter()
                .map(|c| mpb::WatchChange { change: Some(c) })
                .collect(),
            applied_index: index,
            term: 1,
            as_of_unix_ms: match kind {
                Kind::Changes => regolith_proto::auth::unix_ms(),
                _ => 0,
            },
        }
    }

    fn put(key: &str, id: u64) -> C {
        C::Put(mpb::WatchObject {
            key: key.into(),
            size: 10,
            checksum: 1,
            version: Some(Version { term: 1, id }),
            replicas: vec![mpb::Replica {
                node_id: 1,
                generation: 1,
                extents: vec![regolith_proto::common::Extent { offset: 0, len: 10 }],
                ..Default::default()
            }],
        })
    }

    fn seg() -> C {
        C::SegmentUp(mpb::WatchSegment {
            node_id: 1,
            generation: 1,
            node_name: "n1".into(),
            data_addrs: vec!["127.0.0.1:7600".into()],
        })
    }

    #[test]
    fn answers_only_after_a_complete_snapshot_and_while_messages_arrive() {
        let ix = NodeIndex::new(true, Metrics::new());
        let keys = vec!["a".to_string(), "b".to_string()];
        assert_eq!(ix.exists(&keys), None, "no stream yet");
        ix.apply(msg(Kind::Reset, 7, vec![seg()]));
        ix.apply(msg(Kind::Snapshot, 7, vec![put("a", 1)]));
        assert_eq!(ix.exists(&keys), None, "mid-snapshot");
        assert_eq!(ix.apply(msg(Kind::SnapshotEnd, 7, vec![])), 7);
        assert_eq!(ix.exists(&keys), None, "complete, but no guarantee yet");
        assert_eq!(ix.apply(msg(Kind::Changes, 7, vec![])), 7);
        assert_eq!(ix.exists(&keys), Some(vec![true, false]));
        assert_eq!(ix.apply(msg(Kind::Changes, 9, vec![put("b", 2)])), 9);
        assert_eq!(ix.exists(&keys), Some(vec![true, true]));
        let p = ix.placements(&["b"]).unwrap().remove(0).unwrap();
        assert_eq!(p.replicas[0].node_name, "n1");
        assert_eq!(p.replicas[0].data_addrs.len(), 1);
        ix.disconnected();
        assert_eq!(ix.exists(&keys), None, "a lost stream stops the answers");
    }

    #[test]
    fn answers_stop_when_the_leaders_last_guarantee_is_too_old() {
        let ix = NodeIndex::new(true, Metrics::new());
        let keys = vec!["a".to_string()];
        ix.apply(msg(Kind::Reset, 3, vec![seg()]));
        ix.apply(msg(Kind::SnapshotEnd, 3, vec![put("a", 1)]));
        let mut old = msg(Kind::Changes, 3, vec![]);
        let stale_ms = STALE_AFTER.as_millis() as u64 + 100;
        old.as_of_unix_ms = regolith_proto::auth::unix_ms() - stale_ms;
        ix.apply(old);
        assert_eq!(
            ix.exists(&keys),
            None,
            "messages arrive, but their guarantee is old"
        );
        let mut none = msg(Kind::Changes, 4, vec![]);
        none.as_of_unix_ms = 0;
        ix.apply(none);
        assert_eq!(
            ix.exists(&keys),
            None,
            "a message without a guarantee renews nothing"
        );
        ix.apply(msg(Kind::Changes, 4, vec![]));
        assert_eq!(ix.exists(&keys), Some(vec![true]));
    }

    #[test]
    fn a_disabled_index_never_answers_nor_records() {
        let ix = NodeIndex::disabled(Metrics::new());
        ix.apply(msg(Kind::Reset, 1, vec![]));
        ix.apply(msg(Kind::SnapshotEnd, 1, vec![]));
        assert_eq!(ix.exists(&["a".into()]), None);
    }

    #[test]
    fn accesses_are_deduplicated_and_capped() {
        let ix = NodeIndex::new(true, Metrics::new());
        ix.note_access("a");
        ix.note_access("a");
        assert_eq!(ix.take_accesses(), vec!["a".to_string()]);
        for i in 0..MAX_ACCESSES + 5 {
            ix.note_access(&format!("k{i}"));
        }
        assert_eq!(ix.take_accesses().len(), MAX_ACCESSES);
        assert_eq!(ix.metrics.accesses_dropped.get(), 5);
    }
}
