//! Write reservations `(term, id)` and their lifecycle (design §4).
//!
//! A reservation holds its extents in the shadow allocator from `reserve` until it ends:
//! * committed: the extents become the object's;
//! * refused at apply: the writer is done, so they are freed;
//! * expired (`put_timeout`) or aborted: **quarantined** — held until every segment owner
//!   confirms in a heartbeat that it accepts no more slices for it and no local client is still
//!   copying into it.
//!
//! Reservations of earlier leaders that sidecars report in their first heartbeat to this leader
//! are adopted as quarantined holds.

use std::collections::{HashMap, HashSet, VecDeque};

use crate::types::{Extent, Pin, Replica, SegmentId, Version};

/// How many recently committed versions are remembered for idempotent re-sent commits.
pub const RECENT_COMMITS: usize = 65_536;

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ResState {
    Live,
    /// Its `CommitPut` is being replicated.
    Committing,
    Quarantined,
}

#[derive(Clone, Debug)]
pub struct Reservation {
    pub version: Version,
    /// Empty for reservations adopted from an earlier leader (the key is unknown).
    pub key: String,
    pub size: u64,
    /// The extents held, per segment.
    pub replicas: Vec<Replica>,
    pub pin: Pin,
    pub ttl_ms: u64,
    pub soft_pin_ttl_ms: u64,
    /// Monotonic deadline for the commit.
    pub deadline_ms: u64,
    pub state: ResState,
    /// Commits as an `UpsertPut` (replacing an existing object under the key).
    pub upsert: bool,
    /// A promotion of the object of this version back to memory (commits as
    /// `PromoteToMemory`); the key is not held against puts (the object exists).
    pub promote: Option<Version>,
}

impl Reservation {
    pub fn footprint(&self) -> u64 {
        self.replicas.iter().map(Replica::bytes).sum()
    }
}

#[derive(Debug, Default)]
pub struct Reservations {
    by_version: HashMap<Version, Reservation>,
    by_key: HashMap<String, Version>,
    next_id: u64,
    /// Recently committed versions, oldest first, with the monotonic time they may be
    /// forgotten: a commit re-sent to the same leader (its reply was lost) is answered OK again.
    /// Bounded by [`RECENT_COMMITS`] so a burst of puts cannot grow it without limit.
    recent_commits: VecDeque<(Version, u64)>,
    recent_set: HashSet<Version>,
}

impl Reservations {
    pub fn next_version(&mut self, term: u64) -> Version {
        self.next_id += 1;
        Version {
            term,
            id: self.next_id,
        }
    }

    pub fn insert(&mut self, r: Reservation) {
        if !r.key.is_empty() && r.promote.is_none() {
            self.by_key.insert(r.key.clone(), r.version);
        }
        self.by_version.insert(r.version, r);
    }

    pub fn get(&self, v: &Version) -> Option<&Reservation> {
        self.by_version.get(v)
    }

    pub fn get_mut(&mut self, v: &Version) -> Option<&mut Reservation> {
        self.by_version.get_mut(v)
    }

    pub fn key_reserved(&self, key: &str) -> bool {
        self.by_key.contains_key(key)
    }

    pub fn remove(&mut self, v: &Version) -> Option<Reservation> {
        let r = self.by_version.remove(v)?;
        if self.by_key.get(&r.key) == Some(v) {
            self.by_key.remove(&r.key);
        }
        Some(r)
    }

    /// Stops a reservation from being committable; its extents stay held. The key may be
    /// reserved again at once (the quarantined bytes are not the new object's).
    pub fn quarantine(&mut self, v: &Version) {
        if let Some(r) = self.by_version.get_mut(v) {
            r.state = ResState::Quarantined;
            if self.by_key.get(&r.key) == Some(v) {
                self.by_key.remove(&r.key);
            }
        }
    }

    /// Adds an extent held on behalf of an earlier leader's reservation.
    pub fn adopt(&mut self, v: Version, seg: SegmentId, extents: Vec<Extent>) {
        let r = self.by_version.entry(v).or_insert_with(|| Reservation {
            version: v,
            key: String::new(),
            size: 0,
            replicas: Vec::new(),
            pin: Pin::None,
            ttl_ms: 0,
            soft_pin_ttl_ms: 0,
            deadline_ms: 0,
            state: ResState::Quarantined,
            upsert: false,
            promote: None,
        });
        match r.replicas.iter_mut().find(|x| x.segment == seg) {
            Some(rep) => rep.extents.extend(extents),
            None => r.replicas.push(Replica {
                segment: seg,
                extents,
            }),
        }
    }

    /// Removes a segment's share of a quarantined reservation once its owner released it;
    /// returns the extents to free. The reservation ends when no segment is left.
    pub fn release(&mut self, v: &Version, seg: &SegmentId) -> Vec<Extent> {
        let Some(r) = self.by_version.get_mut(v) else {
            return Vec::new();
        };
        if r.state != ResState::Quarantined {
            return Vec::new();
        }
        let Some(i) = r.replicas.iter().position(|x| &x.segment == seg) else {
            return Vec::new();
        };
        let rep = r.replicas.swap_remove(i);
        if r.replicas.is_empty() {
            self.remove(v);
        }
        rep.extents
    }

    /// Forgets a segment that was unmounted: its held extents no longer exist.
    pub fn drop_segment(&mut self, seg: &SegmentId) {
        let mut emptied = Vec::new();
        for (v, r) in self.by_version.iter_mut() {
            r.replicas.retain(|x| &x.segment != seg);
            if r.replicas.is_empty() {
                emptied.push(*v);
            }
        }
        for v in emptied {
            self.remove(&v);
        }
    }

    /// Quarantines live reservations past their deadline (and commits stuck past twice that);
    /// returns how many.
    pub fn expire(&mut self, now_ms: u64, put_timeout_ms: u64) -> usize {
        let due: Vec<Version> = self
            .by_version
            .values()
            .filter(|r| match r.state {
                ResState::Live => now_ms > r.deadline_ms,
                ResState::Committing => now_ms > r.deadline_ms.saturating_add(put_timeout_ms),
                ResState::Quarantined => false,
            })
            .map(|r| r.version)
            .collect();
        for v in &due {
            self.quarantine(v);
        }
        due.len()
    }

    pub fn remember_commit(&mut self, v: Version, forget_at_ms: u64) {
        if self.recent_commits.len() >= RECENT_COMMITS {
            if let Some((old, _)) = self.recent_commits.pop_front() {
                self.recent_set.remove(&old);
            }
        }
        self.recent_commits.push_back((v, forget_at_ms));
        self.recent_set.insert(v);
    }

    pub fn recently_committed(&self, v: &Version) -> bool {
        self.recent_set.contains(v)
    }

    pub fn forget_old_commits(&mut self, now_ms: u64) {
        while self
            .recent_commits
            .front()
            .is_some_and(|(_, t)| *t <= now_ms)
        {
            if let Some((old, _)) = self.recent_commits.pop_front() {
                self.recent_set.remove(&old);
            }
        }
    }

    /// Quarantined reservations holding extents on `seg`.
    pub fn quarantined_on(&self, seg: &SegmentId) -> Vec<Version> {
        let mut v: Vec<Version> = self
            .by_version
            .values()
            .filter(|r| {
                r.state == ResState::Quarantined && r.replicas.iter().any(|x| &x.segment == seg)
            })
            .map(|r| r.version)
            .collect();
        v.sort();
        v
    }

    /// Whether any reservation holds extents on `seg`.
    pub fn holds_on(&self, seg: &SegmentId) -> bool {
        self.by_version
            .values()
            .any(|r| r.replicas.iter().any(|x| &x.segment == seg))
    }

    pub fn iter(&self) -> impl Iterator<Item = &Reservation> {
        self.by_version.values()
    }

    pub fn len(&self) -> usize {
        self.by_version.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_version.is_empty()
    }

    pub fn quarantined(&self) -> usize {
        self.by_version
            .values()
            .filter(|r| r.state == ResState::Quarantined)
            .count()
    }

    /// Hard-pinned bytes of live and committing reservations (counted against the quota).
    pub fn hard_pinned_bytes(&self) -> u64 {
        self.by_version
            .values()
            .filter(|r| r.pin == Pin::Hard && r.state != ResState::Quarantined)
            .map(Reservation::footprint)
            .sum()
    }
}
