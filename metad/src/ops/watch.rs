//! `Watch`: the stream that feeds a sidecar's object index (metadata at the node, design §5).
//!
//! A stream resumes after the watcher's index when this leader's [`Feed`](crate::feed::Feed)
//! still reaches back to it; otherwise it sends a full snapshot first: RESET (with every
//! mounted segment) at the feed's index `i0`, the objects shard by shard (each shard copied
//! under the lock in one go, so no object of it is skipped or seen twice), SNAPSHOT_END at
//! `i0`, then the changes after `i0`, which fix whatever a shard copy caught mid-change. The
//! stream ends when this replica stops leading (the watcher finds the new leader and resumes).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::feed::{Change, Since};
use crate::objects::SHARDS;
use crate::ops::Ops;
use crate::{Error, Result};

/// Most changes in one message.
pub const MAX_CHANGES_PER_MESSAGE: usize = 4096;
/// An idle stream still sends one (empty) message this often: the watcher's proof that its
/// copy is current.
pub const WATCH_IDLE_TICK: Duration = Duration::from_millis(500);
/// How long a watcher whose index is ahead of this replica's (a new leader still applying) is
/// waited for before it gets a snapshot.
const AHEAD_WAIT: Duration = Duration::from_secs(5);

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    Changes,
    Reset,
    Snapshot,
    SnapshotEnd,
}

/// One message of a watch stream.
#[derive(Clone, Debug)]
pub struct WatchMessage {
    pub kind: Kind,
    pub index: u64,
    pub changes: Vec<Change>,
    /// This replica's last applied index when the message was made.
    pub applied: u64,
    pub term: u64,
    /// Unix ms at which this replica confirmed its quorum lease before reading the state the
    /// message brings the watcher up to; 0 when it brings no such guarantee.
    pub as_of_unix_ms: u64,
}

/// Where a stream is.
enum Step {
    Resync,
    From(u64),
}

impl Ops {
    /// Streams the index to `tx` from `after` on until this replica steps down (the last item
    /// is then an error) or the receiver goes away.
    pub async fn watch(
        self: Arc<Self>,
        after: u64,
        watcher: u64,
        tx: mpsc::Sender<Result<WatchMessage>>,
    ) {
        let term = match self.leader().await {
            Ok(o) => o.term,
            Err(e) => {
                let _ = tx.send(Err(e)).await;
                return;
            }
        };
        self.metrics.watch_streams.inc();
        let why = self.stream(after, term, &tx).await;
        self.metrics.watch_streams.dec();
        tracing::debug!(watcher, ?why, "watch stream ended");
        if let Err(e) = why {
            let _ = tx.send(Err(e)).await;
        }
    }

    async fn stream(
        &self,
        after: u64,
        term: u64,
        tx: &mpsc::Sender<Result<WatchMessage>>,
    ) -> Result<()> {
        let mut applied = self.applied.clone();
        let mut step = if after == 0 {
            Step::Resync
        } else {
            Step::From(after)
        };
        let mut ahead_since: Option<tokio::time::Instant> = None;
        // A message is owed to the watcher even without changes: after a snapshot (its copy
        // becomes current) and on every idle tick (its proof that the copy still is).
        let mut owed = false;
        loop {
            self.check_still_leader(term)?;
            let at = match step {
                Step::Resync => {
                    self.metrics.watch_resyncs.inc();
                    step = Step::From(self.snapshot(term, tx).await?);
                    owed = true;
                    continue;
                }
                Step::From(at) => at,
            };
            // Marks the current apply as seen before reading the feed, so that `changed` wakes
            // for any apply after this read.
            applied.borrow_and_update();
            let as_of = self.confirm_lease().await?;
            let (since, applied_now) = {
                let core = self.core.lock();
                let feed = core.feed();
                (feed.since(at, MAX_CHANGES_PER_MESSAGE), feed.last())
            };
            match since {
                Since::TooOld => step = Step::Resync,
                Since::Ahead => {
                    let since = *ahead_since.get_or_insert_with(tokio::time::Instant::now);
                    if since.elapsed() > AHEAD_WAIT {
                        step = Step::Resync;
                    } else {
                        wait_applied(&mut applied).await;
                    }
                }
                Since::Changes { entries, upto } => {
                    ahead_since = None;
                    let caught_up = upto >= applied_now;
                    let changes: Vec<Change> = entries
                        .iter()
                        .flat_map(|(_, c)| c.iter().cloned())
                        .collect();
                    if !changes.is_empty() || upto != at || owed {
                        let fresh = if caught_up { as_of } else { 0 };
                        send(tx, Kind::Changes, upto, changes, applied_now, term, fresh).await?;
                        owed = false;
                    }
                    step = Step::From(upto);
                    if caught_up {
                        // Wait for the next apply; when idle, the next round owes a message.
                        let woke = tokio::time::timeout(WATCH_IDLE_TICK, applied.changed()).await;
                        match woke {
                            Ok(Ok(())) => {}
                            Ok(Err(_)) => return Err(Error::Unavailable("shutting down".into())),
                            Err(_) => owed = true,
                        }
                    }
                }
            }
        }
    }

    /// Confirms this replica still leads (its quorum lease, else a quorum round) and answers
    /// the Unix ms taken just before: every write acknowledged before then is in the state
    /// applied here now. A leader cut off from its quorum fails here, so its watchers stop
    /// answering from their copies instead of serving them stale for as long as the cut lasts.
    async fn confirm_lease(&self) -> Result<u64> {
        let as_of = regolith_proto::auth::unix_ms();
        self.read().await?;
        Ok(as_of)
    }

    /// Sends a full snapshot; answers the index the changes must resume after.
    async fn snapshot(&self, term: u64, tx: &mpsc::Sender<Result<WatchMessage>>) -> Result<u64> {
        let (i0, segments) = {
            let core = self.core.lock();
            let segments = core
                .sm()
                .segments()
                .map(|s| Change::SegmentUp {
                    segment: s.id,
                    node_name: s.name.clone(),
                    data_addrs: s.data_addrs.clone(),
                })
                .collect();
            (core.feed().last(), segments)
        };
        send(tx, Kind::Reset, i0, segments, i0, term, 0).await?;
        for shard in 0..SHARDS {
            let objects: Vec<Change> = {
                let core = self.core.lock();
                core.sm()
                    .objects_in_shard(shard)
                    .map(|(k, o)| Change::Put {
                        key: k.to_string(),
                        obj: crate::feed::FeedObject::of(o),
                    })
                    .collect()
            };
            let mut rest = objects;
            while !rest.is_empty() {
                let tail = rest.split_off(rest.len().min(MAX_CHANGES_PER_MESSAGE));
                send(tx, Kind::Snapshot, i0, rest, i0, term, 0).await?;
                rest = tail;
            }
            self.check_still_leader(term)?;
        }
        send(tx, Kind::SnapshotEnd, i0, vec![], i0, term, 0).await?;
        Ok(i0)
    }

    fn check_still_leader(&self, term: u64) -> Result<()> {
        let leading = self.core.lock().leader().is_some_and(|l| l.term == term);
        if leading {
            Ok(())
        } else {
            Err(Error::NotLeader { leader: None })
        }
    }
}

async fn wait_applied(applied: &mut tokio::sync::watch::Receiver<u64>) {
    let _ = tokio::time::timeout(WATCH_IDLE_TICK, applied.changed()).await;
}

async fn send(
    tx: &mpsc::Sender<Result<WatchMessage>>,
    kind: Kind,
    index: u64,
    changes: Vec<Change>,
    applied: u64,
    term: u64,
    as_of_unix_ms: u64,
) -> Result<()> {
    let m = WatchMessage {
        kind,
        index,
        changes,
        applied,
        term,
        as_of_unix_ms,
    };
    tx.send(Ok(m))
        .await
        .map_err(|_| Error::Unavailable("the watcher went away".into()))
}
