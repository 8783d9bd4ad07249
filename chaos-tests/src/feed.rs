//! metad's change feed, followed by the observer: the `Watch` stream the sidecars' object
//! index follows ([`regolith_proto::metad::WatchMessage`]), kept as a copy of every object's
//! placement and recorded in the [`History`] as [`EventKind::Listed`] / [`EventKind::Unlisted`]
//! events, with the leader's guarantees ([`EventKind::FeedCurrent`]) and resyncs.
//!
//! Why: with a disk tier, objects move between a node's memory and its disks after they were
//! put, and leave with a failed disk or a disk's own eviction. What the client knew when its
//! put was acknowledged (the memory replicas) no longer says where an object is, so the checker
//! asks the feed whether metad dropped an object before a read found it absent, and which of a
//! node's objects were on its disks when its sidecar was killed. The feed opens no lease and
//! touches no access time: following it changes nothing the cache decides.
//!
//! The copy resumes after the index it is complete up to on every reconnect (a leader change
//! costs no resync when the new leader's feed reaches back that far); a resync from a snapshot
//! is recorded, with what changed across it, as a gap in which short-lived objects were missed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use regolith_proto::client::MetadClient;
use regolith_proto::leader;
use regolith_proto::metad as mpb;

use crate::history::{EventKind, FeedObject, History, ReplicaLoc};
use crate::netns::NsRuntime;

/// A stream silent for this long is dropped and opened again (the leader sends a guarantee at
/// least every 500 ms while idle).
const SILENT_AFTER: Duration = Duration::from_secs(2);
/// Guarantees are recorded when they advance by at least this much (a later guarantee only
/// ever makes the checker count more of the feed as "before" an observation).
const RECORD_EVERY_US: u64 = 50_000;

#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    object: FeedObject,
    replicas: Vec<ReplicaLoc>,
}

#[derive(Default)]
struct State {
    objects: HashMap<String, Entry>,
    /// The log index the copy is complete up to.
    applied: u64,
    /// During a resync: when it began and the copy before it.
    resync: Option<(u64, HashMap<String, Entry>)>,
    /// The latest guarantee, and the latest one recorded (history µs).
    as_of_us: u64,
    recorded_as_of_us: Option<u64>,
    messages: u64,
}

/// The followed feed; stops when dropped.
pub struct Feed {
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    history: History,
}

impl Drop for Feed {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn entry_of(o: mpb::WatchObject) -> Option<Entry> {
    let v = o.version?;
    Some(Entry {
        object: FeedObject {
            key: o.key,
            version: (v.term, v.id),
            size: o.size,
        },
        replicas: o
            .replicas
            .iter()
            .map(|r| ReplicaLoc {
                node: r.node_id,
                generation: r.generation,
            })
            .collect(),
    })
}

impl State {
    fn listed(&mut self, history: &History, e: Entry) {
        if self.objects.get(&e.object.key) == Some(&e) {
            return;
        }
        if let Some(old) = self.objects.remove(&e.object.key) {
            if old.object.version != e.object.version {
                history.event(EventKind::Unlisted {
                    object: old.object,
                    last: old.replicas,
                });
            }
        }
        history.event(EventKind::Listed {
            object: e.object.clone(),
            replicas: e.replicas.clone(),
        });
        self.objects.insert(e.object.key.clone(), e);
    }

    fn unlisted(&mut self, history: &History, key: &str) {
        if let Some(old) = self.objects.remove(key) {
            history.event(EventKind::Unlisted {
                object: old.object,
                last: old.replicas,
            });
        }
    }

    fn apply_change(&mut self, history: &History, c: mpb::WatchChange) {
        use mpb::watch_change::Change as C;
        match c.change {
            Some(C::Put(o)) => {
                if let Some(e) = entry_of(o) {
                    if self.resync.is_some() {
                        self.objects.insert(e.object.key.clone(), e);
                    } else {
                        self.listed(history, e);
                    }
                }
            }
            Some(C::Removed(k)) => {
                if self.resync.is_some() {
                    self.objects.remove(&k);
                } else {
                    self.unlisted(history, &k);
                }
            }
            Some(C::RemovedAll(_)) if self.resync.is_some() => self.objects.clear(),
            Some(C::RemovedAll(_)) => {
                let keys: Vec<String> = self.objects.keys().cloned().collect();
                for k in keys {
                    self.unlisted(history, &k);
                }
            }
            Some(C::SegmentUp(_)) | Some(C::SegmentDown(_)) | None => {}
        }
    }

    /// The end of a resync: what differs from the copy before it is recorded.
    fn resynced(&mut self, history: &History) {
        let Some((from_us, old)) = self.resync.take() else {
            return;
        };
        let new = std::mem::replace(&mut self.objects, old);
        let mut gone: Vec<String> = self
            .objects
            .keys()
            .filter(|k| !new.contains_key(*k))
            .cloned()
            .collect();
        gone.sort();
        for k in gone {
            self.unlisted(history, &k);
        }
        let mut new: Vec<Entry> = new.into_values().collect();
        new.sort_by(|a, b| a.object.key.cmp(&b.object.key));
        for e in new {
            self.listed(history, e);
        }
        history.event(EventKind::FeedResynced { from_us });
    }

    fn apply(&mut self, history: &History, m: mpb::WatchMessage) {
        use mpb::watch_message::Kind;
        self.messages += 1;
        let kind = Kind::try_from(m.kind).unwrap_or(Kind::Changes);
        if kind == Kind::Reset {
            let old = std::mem::take(&mut self.objects);
            // A reset during a resync keeps the copy from before the first one.
            let (from, old) = match self.resync.take() {
                Some(r) => r,
                None => (history.now_us(), old),
            };
            self.resync = Some((from, old));
        }
        for c in m.changes {
            self.apply_change(history, c);
        }
        match kind {
            Kind::SnapshotEnd => {
                self.resynced(history);
                self.applied = m.index;
            }
            Kind::Changes if self.resync.is_none() => self.applied = m.index,
            _ => {}
        }
        if m.as_of_unix_ms > 0 && self.resync.is_none() && matches!(kind, Kind::Changes) {
            let as_of = history.unix_ms_to_us(m.as_of_unix_ms);
            self.as_of_us = self.as_of_us.max(as_of);
            if self
                .recorded_as_of_us
                .is_none_or(|r| self.as_of_us >= r + RECORD_EVERY_US)
            {
                self.recorded_as_of_us = Some(self.as_of_us);
                history.event(EventKind::FeedCurrent {
                    as_of_us: self.as_of_us,
                });
            }
        }
    }
}

impl Feed {
    /// Follows the feed of `client`'s metad cluster from the observer.
    pub fn start(observer: &NsRuntime, client: MetadClient, history: History) -> Self {
        let state = Arc::new(Mutex::new(State::default()));
        let stop = Arc::new(AtomicBool::new(false));
        observer.spawn(follow_leaders(
            state.clone(),
            client,
            history.clone(),
            stop.clone(),
        ));
        Feed {
            state,
            stop,
            history,
        }
    }

    /// The objects listed with a replica on a disk of `node`.
    pub fn on_disks_of(&self, node: u64) -> Vec<FeedObject> {
        let st = self.state.lock();
        let mut out: Vec<FeedObject> = st
            .objects
            .values()
            .filter(|e| e.replicas.iter().any(|r| r.node == node && r.is_disk()))
            .map(|e| e.object.clone())
            .collect();
        out.sort_by(|a, b| a.key.cmp(&b.key));
        out
    }

    /// The object listed under `key` and its replicas.
    pub fn listed(&self, key: &str) -> Option<(FeedObject, Vec<ReplicaLoc>)> {
        let st = self.state.lock();
        st.objects
            .get(key)
            .map(|e| (e.object.clone(), e.replicas.clone()))
    }

    /// Objects listed now, and how many of them have a replica on a disk.
    pub fn counts(&self) -> (usize, usize) {
        let st = self.state.lock();
        let on_disk = st
            .objects
            .values()
            .filter(|e| e.replicas.iter().any(|r| r.is_disk()))
            .count();
        (st.objects.len(), on_disk)
    }

    /// Waits until the copy holds every change acknowledged before now (a guarantee at least
    /// as late as this call, recorded); false when none came within `timeout`.
    pub fn wait_current(&self, timeout: Duration) -> bool {
        let want = self.history.now_us();
        let end = Instant::now() + timeout;
        loop {
            {
                let mut st = self.state.lock();
                if st.as_of_us >= want {
                    if st.recorded_as_of_us.is_none_or(|r| r < st.as_of_us) {
                        st.recorded_as_of_us = Some(st.as_of_us);
                        self.history.event(EventKind::FeedCurrent {
                            as_of_us: st.as_of_us,
                        });
                    }
                    return true;
                }
            }
            if Instant::now() > end {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stream messages applied so far.
    pub fn messages(&self) -> u64 {
        self.state.lock().messages
    }
}

/// Follows the leader's feed until `stop`: resumes after the copy's index on every reconnect,
/// follows NOT_LEADER hints, and tries every replica in turn when none is known.
async fn follow_leaders(
    state: Arc<Mutex<State>>,
    client: MetadClient,
    history: History,
    stop: Arc<AtomicBool>,
) {
    let addrs = client.addrs().to_vec();
    if addrs.is_empty() {
        return;
    }
    let mut next = 0usize;
    let mut target: Option<String> = None;
    while !stop.load(Ordering::Relaxed) {
        let addr = target.take().unwrap_or_else(|| {
            next += 1;
            addrs[next % addrs.len()].clone()
        });
        match follow(&state, &client, &addr, &history, &stop).await {
            Err(s) if leader::is_not_leader(&s) => {
                target = leader::hint_of(&s).map(|h| h.addr).filter(|a| *a != addr);
            }
            Err(s) => {
                tracing::debug!(%addr, code = ?s.code(), msg = s.message(), "feed: stream ended")
            }
            Ok(()) => return,
        }
        if target.is_none() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// One stream at `addr`, applied message by message; Ok when stopped.
async fn follow(
    state: &Mutex<State>,
    client: &MetadClient,
    addr: &str,
    history: &History,
    stop: &AtomicBool,
) -> Result<(), tonic::Status> {
    let mut stub = client
        .stub(addr)
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let after = state.lock().applied;
    let req = mpb::WatchRequest {
        after_index: after,
        node_id: 0,
    };
    let mut stream = stub.watch(req).await?.into_inner();
    tracing::debug!(%addr, after, "feed: stream open");
    while !stop.load(Ordering::Relaxed) {
        let m = match tokio::time::timeout(SILENT_AFTER, stream.message()).await {
            Ok(Ok(Some(m))) => m,
            Ok(Ok(None)) => return Err(tonic::Status::unavailable("stream closed")),
            Ok(Err(s)) => return Err(s),
            Err(_) => return Err(tonic::Status::deadline_exceeded("stream silent")),
        };
        state.lock().apply(history, m);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use mpb::watch_change::Change as C;
    use mpb::watch_message::Kind;
    use regolith_proto::common::Version;

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

    fn put(key: &str, id: u64, generation: u64) -> C {
        C::Put(mpb::WatchObject {
            key: key.into(),
            size: 10,
            checksum: 1,
            version: Some(Version { term: 1, id }),
            replicas: vec![mpb::Replica {
                node_id: 1,
                generation,
                ..Default::default()
            }],
        })
    }

    fn events(h: &History) -> Vec<String> {
        h.snapshot()
            .events
            .iter()
            .filter_map(|e| match &e.kind {
                EventKind::Listed { object, replicas } => Some(format!(
                    "+{}@{} {}",
                    object.key, object.version.1, replicas[0]
                )),
                EventKind::Unlisted { object, .. } => {
                    Some(format!("-{}@{}", object.key, object.version.1))
                }
                EventKind::FeedResynced { .. } => Some("resynced".into()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn changes_and_resyncs_are_recorded_as_listings() {
        let h = History::new();
        let mut st = State::default();
        let disk = regolith_proto::disk_tier::disk_generation(0);
        st.apply(&h, msg(Kind::Reset, 3, vec![]));
        st.apply(
            &h,
            msg(Kind::Snapshot, 3, vec![put("a", 1, 1), put("b", 2, 1)]),
        );
        st.apply(&h, msg(Kind::SnapshotEnd, 3, vec![]));
        assert_eq!(st.applied, 3);
        // a moves to disk; b is removed; c is put.
        st.apply(
            &h,
            msg(
                Kind::Changes,
                5,
                vec![put("a", 1, disk), C::Removed("b".into()), put("c", 3, 1)],
            ),
        );
        // Replayed change: nothing recorded.
        st.apply(&h, msg(Kind::Changes, 5, vec![put("c", 3, 1)]));
        assert_eq!(st.applied, 5);
        // A resync in which c was replaced by a new version and a disappeared.
        st.apply(&h, msg(Kind::Reset, 9, vec![]));
        st.apply(&h, msg(Kind::Snapshot, 9, vec![put("c", 7, 1)]));
        st.apply(&h, msg(Kind::SnapshotEnd, 9, vec![]));
        let ev = events(&h);
        assert_eq!(
            ev,
            vec![
                "+a@1 n1g1",
                "+b@2 n1g1",
                "resynced",
                "+a@1 n1d0",
                "-b@2",
                "+c@3 n1g1",
                "-a@1",
                "-c@3",
                "+c@7 n1g1",
                "resynced",
            ]
        );
        assert!(h
            .snapshot()
            .events
            .iter()
            .any(|e| matches!(e.kind, EventKind::FeedCurrent { .. })));
    }
}
