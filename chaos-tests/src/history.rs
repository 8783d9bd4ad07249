//! The history of a run: every operation with its invoke and complete times and its result,
//! and the events around them (faults, segment generations that went away).
//!
//! Times are microseconds since the run started, on one monotonic clock shared by every thread
//! of this process, so invoke/complete intervals of different clients are comparable.

use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

/// What an operation asked for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OpKind {
    /// A put of the value derived from `(key, write_id)` ([`crate::value`]).
    Put {
        write_id: u64,
        replicas: u32,
    },
    Get,
    Exists,
    Remove,
}

/// Where a replica of a stored object lives: a segment `(node id, generation)`, or one of the
/// node's disks, named by a reserved disk generation ([`regolith_proto::disk_tier`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ReplicaLoc {
    pub node: u64,
    pub generation: u64,
}

impl ReplicaLoc {
    /// Whether this replica is on a disk of its node (not in its memory segment).
    pub fn is_disk(&self) -> bool {
        regolith_proto::disk_tier::is_disk_generation(self.generation)
    }
}

impl std::fmt::Display for ReplicaLoc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match regolith_proto::disk_tier::disk_of(self.generation) {
            Some(d) => write!(f, "n{}d{d}", self.node),
            None => write!(f, "n{}g{}", self.node, self.generation),
        }
    }
}

/// An object as metad's change feed names it: key, version `(term, id)`, size.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FeedObject {
    pub key: String,
    pub version: (u64, u64),
    pub size: u64,
}

/// A byte range of a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Extent {
    pub offset: u64,
    pub len: u64,
}

/// A definite answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    /// Put: stored. `replicas` is where, when the client knows it (empty when it does not);
    /// `extents[i]`, when known, are the byte ranges of `replicas[i]` (invariant 2 is checked
    /// on them).
    Stored {
        replicas: Vec<ReplicaLoc>,
        #[serde(default)]
        extents: Vec<Vec<Extent>>,
    },
    /// Put: the key already exists (or is being written); nothing was written.
    AlreadyExists,
    /// Get: bytes that decode to the value of this write id of this key.
    Found {
        write_id: u64,
    },
    /// Get: bytes that are not the value of any write of this key.
    Corrupt {
        detail: String,
    },
    /// Get: the store found the bytes failed their checksum on every replica and answered a
    /// miss (no bytes returned). Says nothing about whether the key exists; never an anomaly.
    CorruptMiss {
        detail: String,
    },
    /// Get: no such key.
    NotFound,
    Exists(bool),
    /// Remove: whether the key was there.
    Removed(bool),
}

/// How an operation ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OpResult {
    Ok(Reply),
    /// Definitely had no effect.
    Fail(String),
    /// May or may not have taken effect (a timeout, a lost reply, a proposal of unknown fate).
    Indeterminate(String),
}

impl OpResult {
    pub fn class(&self) -> ResultClass {
        match self {
            OpResult::Ok(_) => ResultClass::Ok,
            OpResult::Fail(_) => ResultClass::Fail,
            OpResult::Indeterminate(_) => ResultClass::Indeterminate,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResultClass {
    Ok,
    Fail,
    Indeterminate,
}

/// One operation of one client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Op {
    /// Index in the history.
    pub id: usize,
    /// The client (process) that ran it.
    pub process: u32,
    pub key: String,
    pub kind: OpKind,
    pub invoke_us: u64,
    pub complete_us: u64,
    pub result: OpResult,
}

impl Op {
    pub fn write_id(&self) -> Option<u64> {
        match self.kind {
            OpKind::Put { write_id, .. } => Some(write_id),
            _ => None,
        }
    }
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.kind {
            OpKind::Put { write_id, replicas } => format!("put w{write_id} r{replicas}"),
            OpKind::Get => "get".into(),
            OpKind::Exists => "exists".into(),
            OpKind::Remove => "remove".into(),
        };
        let result = match &self.result {
            OpResult::Ok(Reply::Stored { replicas, .. }) => {
                let at: Vec<String> = replicas
                    .iter()
                    .map(|r| format!("n{}g{}", r.node, r.generation))
                    .collect();
                format!("ok stored on [{}]", at.join(" "))
            }
            OpResult::Ok(Reply::Found { write_id }) => format!("ok found w{write_id}"),
            OpResult::Ok(r) => format!("ok {r:?}"),
            OpResult::Fail(e) => format!("FAIL {e}"),
            OpResult::Indeterminate(e) => format!("INDETERMINATE {e}"),
        };
        write!(
            f,
            "#{:<6} p{:<4} {:>10.3}s..{:>10.3}s {:<14} {} -> {}",
            self.id,
            self.process,
            self.invoke_us as f64 / 1e6,
            self.complete_us as f64 / 1e6,
            kind,
            self.key,
            result
        )
    }
}

/// Something that happened outside the operations.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventKind {
    /// Segment generation `loc` is gone (declared dead, or replaced by a remount): objects
    /// whose every replica was there may have been dropped (metad counts them).
    GenerationGone {
        loc: ReplicaLoc,
        why: String,
        /// When metad said so in a heartbeat reply: the time the last heartbeat of `loc`
        /// that the same leader (same term) acknowledged was sent. A leader must not declare
        /// a node dead within a node TTL of hearing it.
        #[serde(default)]
        heard_at_us: Option<u64>,
    },
    FaultInjected {
        fault: String,
        detail: String,
    },
    FaultHealed {
        fault: String,
        detail: String,
    },
    Note(String),
    /// metad's change feed ([`crate::feed`]) listed this object with these replicas (a new
    /// object, or one whose replicas changed: offloaded to a disk, a replica dropped).
    Listed {
        object: FeedObject,
        replicas: Vec<ReplicaLoc>,
    },
    /// The feed no longer lists this object (removed by a client, evicted, dropped with its
    /// segment or its disk); `last` is where its replicas were.
    Unlisted {
        object: FeedObject,
        last: Vec<ReplicaLoc>,
    },
    /// The feed's copy holds every change metad acknowledged before `as_of_us` (the
    /// leader's lease guarantee, on this recorder's clock).
    FeedCurrent {
        as_of_us: u64,
    },
    /// The feed resynced from a snapshot between `from_us` and this event: objects put and
    /// removed meanwhile were never seen.
    FeedResynced {
        from_us: u64,
    },
    /// Before the restart of `node`'s sidecar after its kill -9 (`sidecar-restart-warm`): the
    /// objects metad listed with a replica on one of its disks at the kill, every one of which
    /// must still be there after the restart unless its disk dropped it (counted by the
    /// sidecar). Recorded at the restart, so that what metad applied before it (reports the
    /// killed process sent) is not taken for what the restart forgot.
    DiskHeld {
        host: String,
        node: u64,
        objects: Vec<FeedObject>,
    },
    /// The warm restart of `node` is complete (its disks reconciled with metad, the feed
    /// current): `drops_counted` objects are allowed to have left its disks since
    /// [`EventKind::DiskHeld`] (its disks' own eviction, damaged records, a failed disk, and
    /// objects dropped with the node if metad declared it dead).
    WarmRestarted {
        host: String,
        node: u64,
        drops_counted: u64,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub at_us: u64,
    pub kind: EventKind,
}

/// Everything recorded, as a plain value for the checker.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Recorded {
    pub ops: Vec<Op>,
    pub events: Vec<Event>,
}

/// The shared recorder (cheap to clone; every client holds one).
#[derive(Clone, Debug)]
pub struct History {
    start: Instant,
    /// Unix time of `start`, in µs (to place metad's Unix-time guarantees on this clock).
    start_unix_us: u64,
    inner: Arc<Mutex<Recorded>>,
}

impl Default for History {
    fn default() -> Self {
        Self::new()
    }
}

impl History {
    pub fn new() -> Self {
        let start_unix_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        Self {
            start: Instant::now(),
            start_unix_us,
            inner: Arc::new(Mutex::new(Recorded::default())),
        }
    }

    /// A Unix time in ms on this recorder's clock (µs since the run started; 0 before it).
    pub fn unix_ms_to_us(&self, unix_ms: u64) -> u64 {
        (unix_ms * 1000).saturating_sub(self.start_unix_us)
    }

    /// Microseconds since the run started.
    pub fn now_us(&self) -> u64 {
        self.start.elapsed().as_micros() as u64
    }

    /// Runs one operation and records it with its invoke and complete times.
    pub async fn record<F>(&self, process: u32, key: &str, kind: OpKind, op: F) -> OpResult
    where
        F: std::future::Future<Output = OpResult>,
    {
        let invoke_us = self.now_us();
        let result = op.await;
        let complete_us = self.now_us();
        let mut inner = self.inner.lock();
        let id = inner.ops.len();
        inner.ops.push(Op {
            id,
            process,
            key: key.to_string(),
            kind,
            invoke_us,
            complete_us,
            result: result.clone(),
        });
        result
    }

    pub fn event(&self, kind: EventKind) {
        let at_us = self.now_us();
        tracing::debug!(?kind, at_us, "event");
        self.inner.lock().events.push(Event { at_us, kind });
    }

    pub fn snapshot(&self) -> Recorded {
        self.inner.lock().clone()
    }

    /// Operations invoked at or after `since_us` (for watching recovery while the run goes on).
    pub fn ops_since(&self, since_us: u64) -> Vec<Op> {
        let inner = self.inner.lock();
        // Ops are pushed at completion; an op invoked after `since_us` completes after it too,
        // so it lies in the tail. Walk back until completions are older than since_us.
        let mut out: Vec<Op> = inner
            .ops
            .iter()
            .rev()
            .take_while(|o| o.complete_us >= since_us)
            .filter(|o| o.invoke_us >= since_us)
            .cloned()
            .collect();
        out.reverse();
        out
    }
}
