//! The change feed behind `Watch` (metadata at the node, design §5): the object-level changes
//! of every applied entry, by log index, in a bounded ring.
//!
//! Every replica records the feed as it applies (apply is deterministic, so every replica holds
//! the same changes at the same indices): a watcher that reconnects to a new leader resumes
//! from its last index without a full resync whenever the new leader's ring still reaches back
//! that far. A watcher that fell behind the ring, or a replica that installed a snapshot (whose
//! ring starts over), gets a full snapshot instead.
//!
//! A change carries the whole new state of what it names (an object's placement, a segment's
//! addresses), never a difference, so replaying changes over a state taken at or after their
//! start converges to the same index (what makes the shard-by-shard snapshot of `Watch` safe).

use std::collections::VecDeque;
use std::sync::Arc;

use crate::types::{Object, Replica, SegmentId, Version};

/// One object as a watcher indexes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeedObject {
    pub size: u64,
    pub checksum: u64,
    pub version: Version,
    pub replicas: Vec<Replica>,
}

impl FeedObject {
    pub fn of(o: &Object) -> Self {
        FeedObject {
            size: o.size,
            checksum: o.checksum,
            version: o.version,
            replicas: o.replicas.to_vec(),
        }
    }
}

/// One change to the index a watcher keeps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// The key now has this placement (a commit, or a replica lost with its segment).
    Put { key: String, obj: FeedObject },
    /// The key is gone (removed, evicted, expired, or its last replica lost).
    Removed { key: String },
    /// Every object was removed (`RemoveAll`).
    RemovedAll,
    /// A segment was mounted, with the node's name and data-plane addresses.
    SegmentUp {
        segment: SegmentId,
        node_name: String,
        data_addrs: Vec<String>,
    },
    /// A segment was unmounted (every change to the objects on it came before this).
    SegmentDown { segment: SegmentId },
}

/// The changes of one applied entry.
pub type EntryChanges = (u64, Arc<[Change]>);

/// What [`Feed::since`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Since {
    /// The changes after the asked index, oldest first (possibly none), and the index they
    /// bring a watcher to: every change up to it is in them or before.
    Changes {
        entries: Vec<EntryChanges>,
        upto: u64,
    },
    /// The ring no longer reaches back to the asked index: the watcher must resync.
    TooOld,
    /// The asked index is beyond what this replica has applied (it may catch up).
    Ahead,
}

/// The ring of recent changes.
#[derive(Debug)]
pub struct Feed {
    ring: VecDeque<EntryChanges>,
    /// Changes held in the ring (the bound is on these).
    held: usize,
    cap: usize,
    /// Every entry after this index is in the ring (or had no change); `None` until the first
    /// entry applied since start or since a snapshot was installed.
    base: Option<u64>,
    /// The last applied index recorded.
    last: u64,
}

impl Feed {
    /// A ring holding up to `cap` changes (at least one entry's worth, whatever its size).
    pub fn new(cap: usize) -> Self {
        Feed {
            ring: VecDeque::new(),
            held: 0,
            cap: cap.max(1),
            base: None,
            last: 0,
        }
    }

    /// The last applied index recorded.
    pub fn last(&self) -> u64 {
        self.last
    }

    /// The oldest index a watcher may resume after, if any.
    pub fn base(&self) -> Option<u64> {
        self.base
    }

    /// Records the changes of the entry at `index` (applied in index order).
    pub fn record(&mut self, index: u64, changes: Vec<Change>) {
        if self.base.is_none() {
            self.base = Some(index.saturating_sub(1));
        }
        self.last = self.last.max(index);
        if changes.is_empty() {
            return;
        }
        self.held += changes.len();
        self.ring.push_back((index, changes.into()));
        while self.held > self.cap && self.ring.len() > 1 {
            if let Some((i, c)) = self.ring.pop_front() {
                self.held -= c.len();
                self.base = Some(i);
            }
        }
    }

    /// A snapshot replaced the state: the changes before it are no longer known here.
    pub fn reset(&mut self) {
        self.ring.clear();
        self.held = 0;
        self.base = None;
    }

    /// The changes after `after`, at most about `max_changes` of them (whole entries; at least
    /// one entry when there is any).
    pub fn since(&self, after: u64, max_changes: usize) -> Since {
        let Some(base) = self.base else {
            return Since::TooOld;
        };
        if after < base {
            return Since::TooOld;
        }
        if after > self.last {
            return Since::Ahead;
        }
        let start = self.ring.partition_point(|(i, _)| *i <= after);
        let mut entries = Vec::new();
        let mut n = 0;
        let mut upto = self.last;
        for (i, c) in self.ring.iter().skip(start) {
            if n > 0 && n + c.len() > max_changes {
                // Stop before this entry: everything before it is covered.
                upto = i - 1;
                break;
            }
            n += c.len();
            entries.push((*i, c.clone()));
        }
        Since::Changes { entries, upto }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rm(k: &str) -> Change {
        Change::Removed { key: k.into() }
    }

    fn keys(s: &Since) -> Vec<(u64, usize)> {
        match s {
            Since::Changes { entries, .. } => entries.iter().map(|(i, c)| (*i, c.len())).collect(),
            _ => vec![],
        }
    }

    #[test]
    fn resumes_after_any_index_the_ring_still_covers() {
        let mut f = Feed::new(100);
        assert_eq!(f.since(0, 10), Since::TooOld, "nothing applied yet");
        f.record(5, vec![rm("a")]);
        f.record(6, vec![]);
        f.record(7, vec![rm("b"), rm("c")]);
        assert_eq!(f.base(), Some(4));
        assert_eq!(f.since(3, 10), Since::TooOld);
        assert_eq!(keys(&f.since(4, 10)), vec![(5, 1), (7, 2)]);
        assert_eq!(keys(&f.since(5, 10)), vec![(7, 2)]);
        assert_eq!(keys(&f.since(6, 10)), vec![(7, 2)]);
        match f.since(7, 10) {
            Since::Changes { entries, upto } => assert!(entries.is_empty() && upto == 7),
            other => panic!("{other:?}"),
        }
        assert_eq!(f.since(8, 10), Since::Ahead);
    }

    #[test]
    fn a_full_ring_drops_its_oldest_entries_and_moves_its_base() {
        let mut f = Feed::new(3);
        f.record(1, vec![rm("a"), rm("b")]);
        f.record(2, vec![rm("c")]);
        f.record(3, vec![rm("d")]);
        assert_eq!(f.base(), Some(1), "entry 1 was dropped");
        assert_eq!(f.since(0, 10), Since::TooOld);
        assert_eq!(keys(&f.since(1, 10)), vec![(2, 1), (3, 1)]);
        // One entry larger than the whole ring is still held.
        f.record(4, vec![rm("e"), rm("f"), rm("g"), rm("h")]);
        assert_eq!(keys(&f.since(3, 10)), vec![(4, 4)]);
    }

    #[test]
    fn pages_stop_at_whole_entries_and_say_how_far_they_reach() {
        let mut f = Feed::new(100);
        for i in 1..=5 {
            f.record(i, vec![rm("x"), rm("y")]);
        }
        match f.since(0, 3) {
            Since::Changes { entries, upto } => {
                assert_eq!(entries.len(), 1);
                assert_eq!(upto, 1);
            }
            other => panic!("{other:?}"),
        }
        match f.since(1, 4) {
            Since::Changes { entries, upto } => {
                assert_eq!(entries.len(), 2);
                assert_eq!(upto, 3);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_snapshot_install_forces_a_resync_until_the_next_entry() {
        let mut f = Feed::new(100);
        f.record(1, vec![rm("a")]);
        f.reset();
        assert_eq!(f.since(1, 10), Since::TooOld);
        f.record(40, vec![rm("b")]);
        assert_eq!(
            f.since(1, 10),
            Since::TooOld,
            "entries 2..39 are unknown here"
        );
        assert_eq!(keys(&f.since(39, 10)), vec![(40, 1)]);
    }
}
