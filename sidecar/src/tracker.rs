//! What the sidecar knows about reservations on its own segment (design §4): the data-plane
//! admission check, the reservations in flight that every heartbeat reports, and the fencing of
//! quarantined ones.
//!
//! * A write slice is admitted only for the current generation, under a write grant of the
//!   leader that covers it (when metad gave this generation a grant key; checked before the
//!   term, so a forged term changes nothing), a term not below the highest term seen (slices
//!   and heartbeat replies raise it), and a reservation not fenced; the term and the fence are
//!   checked again once the body has arrived. A read needs a read grant likewise.
//! * Reservations that slices arrived for are remembered (with their extents) until long after
//!   the writer could still commit them; local clients copying into a reservation are tracked
//!   by connection. Both are listed in every heartbeat: a new leader holds them as quarantined
//!   until they are reported released.
//! * A reservation metad lists as quarantined is fenced at once (no more slices); it is
//!   reported released once no slice of it is in progress and no local client holds it.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use regolith_proto::common::{Extent, Version};
use regolith_proto::dataplane::{Kind, Request, Status};
use regolith_proto::grant::NodeKey;

use crate::transport::{Admission, GrantCheck, WriteGuard, WriteSlice};

/// A reservation, by its version.
pub type Key = Version;

/// How long a reservation that received slices is remembered after its last slice: past
/// metad's put timeout (30 s by default) its writer can no longer commit it, and slices of an
/// older term are refused anyway once a newer term was seen.
pub const REMEMBER: Duration = Duration::from_secs(40);

/// Adds `[off, off+len)` to a list of extents, merging it with an adjacent or overlapping one
/// (slices of one transfer arrive in pieces of one range).
/// The offset and length come from a peer's request, before any range check: the end saturates
/// at `u64::MAX` rather than wrap (the length kept is clipped to it).
fn add_extent(v: &mut Vec<Extent>, off: u64, len: u64) {
    let new_end = off.saturating_add(len);
    for e in v.iter_mut() {
        let (s, e_end) = (e.offset, e.offset.saturating_add(e.len));
        if off <= e_end && s <= new_end {
            let start = s.min(off);
            let end = e_end.max(new_end);
            *e = Extent {
                offset: start,
                len: end - start,
            };
            return;
        }
    }
    v.push(Extent {
        offset: off,
        len: new_end - off,
    });
}

#[derive(Debug, Default)]
struct Remote {
    extents: Vec<Extent>,
    active: usize,
    last: Option<Instant>,
}

/// How long a reservation handed over by a sidecar upgrade counts as busy in the successor
/// when it was in progress at the hand-over (a local client copying into it, whose session the
/// old process closed, or a slice the old process was receiving): past metad's put timeout,
/// and far past any copy a client could still be finishing after its socket closed.
pub const HOLD: Duration = REMEMBER;

/// A reservation and its extents, as a sidecar upgrade hands it over (`crate::handover`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Held {
    pub term: u64,
    pub id: u64,
    /// `(offset, len)` in the segment.
    pub extents: Vec<(u64, u64)>,
}

/// What the tracker knows, as a sidecar upgrade hands it to the successor process.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TrackerState {
    pub highest_term: u64,
    /// Reservations metad quarantined: `(term, id)`.
    pub fenced: Vec<(u64, u64)>,
    /// Fenced and idle, reported released.
    pub released: Vec<(u64, u64)>,
    /// Reservations slices arrived for, none in progress (remembered as [`REMEMBER`] says).
    pub remote: Vec<Held>,
    /// Reservations in progress at the hand-over: busy for [`HOLD`] in the successor.
    pub held: Vec<Held>,
}

fn held(key: Key, extents: &[Extent]) -> Held {
    Held {
        term: key.term,
        id: key.id,
        extents: extents.iter().map(|e| (e.offset, e.len)).collect(),
    }
}

fn unheld(h: &Held) -> (Key, Vec<Extent>) {
    (
        Version {
            term: h.term,
            id: h.id,
        },
        h.extents
            .iter()
            .map(|&(offset, len)| Extent { offset, len })
            .collect(),
    )
}

#[derive(Debug, Default)]
struct Inner {
    /// Reservations that count as busy until the instant given (handed over while in
    /// progress, or whose client's session a hand-over closed).
    held: HashMap<Key, (Vec<Extent>, Instant)>,
    fenced: HashSet<Key>,
    remote: HashMap<Key, Remote>,
    /// Reservations local clients are copying into: key → (connection, extents).
    local: HashMap<Key, (u64, Vec<Extent>)>,
    /// Fenced and idle: reported as released until metad stops listing them.
    released: BTreeSet<Key>,
}

#[derive(Debug)]
pub struct Tracker {
    grants: GrantCheck,
    generation: AtomicU64,
    highest_term: AtomicU64,
    inner: Mutex<Inner>,
    /// While a hand-over closes the client sessions: their local copies are held (for
    /// [`HOLD`]) instead of dropped, since the server, not the client, ended them.
    hold_closing: AtomicBool,
    /// The node's disk tier, which serves data-plane reads of disk replicas.
    disks: std::sync::OnceLock<Arc<crate::disk::Tier>>,
}

impl Tracker {
    pub fn new(generation: u64) -> Arc<Self> {
        Arc::new(Self {
            grants: GrantCheck::default(),
            generation: AtomicU64::new(generation),
            highest_term: AtomicU64::new(0),
            inner: Mutex::new(Inner::default()),
            hold_closing: AtomicBool::new(false),
            disks: std::sync::OnceLock::new(),
        })
    }

    /// The disk tier that serves reads of this node's disk replicas (set once, at start).
    pub fn set_disks(&self, disks: Arc<crate::disk::Tier>) {
        let _ = self.disks.set(disks);
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The grant key metad gave the mount of node `node`'s current generation (`None`: metad
    /// signs nothing, every slice passes). Set before [`Self::set_generation`].
    pub fn set_grant_key(&self, node: u64, key: Option<NodeKey>) {
        self.grants.set(node, key);
    }

    /// Whether slices need grants.
    pub fn grants_enforced(&self) -> bool {
        self.grants.enforced()
    }

    /// A new generation: everything known about the old one is moot (metad dropped it).
    pub fn set_generation(&self, generation: u64) {
        self.generation.store(generation, Ordering::Release);
        let mut g = self.inner.lock();
        g.remote.clear();
        g.local.clear();
        g.fenced.clear();
        g.released.clear();
        g.held.clear();
    }

    /// Whether a connection's close holds its local copies (see [`HOLD`]) rather than drops
    /// them: on while a hand-over closes the sessions.
    pub fn set_hold_closing(&self, on: bool) {
        self.hold_closing.store(on, Ordering::Release);
    }

    /// The grant key set last, with its node.
    pub fn grant_key(&self) -> Option<(u64, NodeKey)> {
        self.grants.get()
    }

    /// Everything a successor process needs to continue this generation (`crate::handover`).
    /// Reservations with work in progress are handed over as held.
    pub fn snapshot(&self) -> TrackerState {
        let g = self.inner.lock();
        let mut s = TrackerState {
            highest_term: self.highest_term(),
            fenced: g.fenced.iter().map(|k| (k.term, k.id)).collect(),
            released: g.released.iter().map(|k| (k.term, k.id)).collect(),
            ..TrackerState::default()
        };
        for (k, r) in &g.remote {
            if r.active > 0 {
                s.held.push(held(*k, &r.extents));
            } else {
                s.remote.push(held(*k, &r.extents));
            }
        }
        for (k, (_, ext)) in &g.local {
            s.held.push(held(*k, ext));
        }
        let now = Instant::now();
        for (k, (ext, until)) in &g.held {
            if *until > now {
                s.held.push(held(*k, ext));
            }
        }
        s.fenced.sort_unstable();
        s.remote.sort_by_key(|h| (h.term, h.id));
        s.held.sort_by_key(|h| (h.term, h.id));
        s
    }

    /// Takes over what a predecessor process's [`Tracker::snapshot`] said (on a fresh tracker
    /// of the same generation).
    pub fn restore(&self, s: &TrackerState) {
        self.observe_term(s.highest_term);
        let now = Instant::now();
        let mut g = self.inner.lock();
        let key = |&(term, id): &(u64, u64)| Version { term, id };
        g.fenced.extend(s.fenced.iter().map(key));
        g.released.extend(s.released.iter().map(key));
        for h in &s.remote {
            let (k, extents) = unheld(h);
            g.remote.insert(
                k,
                Remote {
                    extents,
                    active: 0,
                    last: Some(now),
                },
            );
        }
        for h in &s.held {
            let (k, extents) = unheld(h);
            let e = g.held.entry(k).or_insert((Vec::new(), now + HOLD));
            for x in extents {
                add_extent(&mut e.0, x.offset, x.len);
            }
        }
    }

    pub fn highest_term(&self) -> u64 {
        self.highest_term.load(Ordering::Acquire)
    }

    pub fn observe_term(&self, term: u64) {
        self.highest_term.fetch_max(term, Ordering::AcqRel);
    }

    pub fn track_local(&self, key: Key, conn: u64, extents: Vec<Extent>) {
        self.inner.lock().local.insert(key, (conn, extents));
    }

    pub fn untrack_local(&self, key: Key) {
        self.inner.lock().local.remove(&key);
    }

    /// A connection closed: its copies into local reservations are over.
    pub fn untrack_conn(&self, conn: u64) -> Vec<Key> {
        let hold = self.hold_closing.load(Ordering::Acquire);
        let mut g = self.inner.lock();
        let keys: Vec<Key> = g
            .local
            .iter()
            .filter(|(_, (c, _))| *c == conn)
            .map(|(k, _)| *k)
            .collect();
        let until = Instant::now() + HOLD;
        for k in &keys {
            if let Some((_, ext)) = g.local.remove(k) {
                if hold {
                    g.held.insert(*k, (ext, until));
                }
            }
        }
        keys
    }

    pub fn is_fenced(&self, key: Key) -> bool {
        self.inner.lock().fenced.contains(&key)
    }

    /// Every reservation in flight on this segment, with its extents (for the heartbeat).
    pub fn in_flight(&self) -> Vec<(Key, Vec<Extent>)> {
        let mut g = self.inner.lock();
        let now = Instant::now();
        g.remote
            .retain(|_, r| r.active > 0 || r.last.is_none_or(|t| now.duration_since(t) < REMEMBER));
        g.held.retain(|_, (_, until)| *until > now);
        let mut out: HashMap<Key, Vec<Extent>> = g
            .remote
            .iter()
            .map(|(k, r)| (*k, r.extents.clone()))
            .collect();
        let busy = g
            .local
            .iter()
            .map(|(k, (_, ext))| (k, ext))
            .chain(g.held.iter().map(|(k, (ext, _))| (k, ext)));
        for (k, ext) in busy {
            let v = out.entry(*k).or_default();
            for x in ext {
                add_extent(v, x.offset, x.len);
            }
        }
        let mut out: Vec<(Key, Vec<Extent>)> = out.into_iter().collect();
        out.sort();
        out
    }

    /// Applies metad's list of quarantined reservations on this segment: fences each, and
    /// returns those that can be reported released now (fenced, nothing in progress).
    pub fn quarantined(&self, keys: &[Key]) -> Vec<Key> {
        let mut g = self.inner.lock();
        let now = Instant::now();
        g.held.retain(|_, (_, until)| *until > now);
        let listed: HashSet<Key> = keys.iter().copied().collect();
        g.released.retain(|k| listed.contains(k));
        for k in keys {
            g.fenced.insert(*k);
            let busy = g.remote.get(k).is_some_and(|r| r.active > 0)
                || g.local.contains_key(k)
                || g.held.contains_key(k);
            if !busy {
                g.remote.remove(k);
                g.released.insert(*k);
            }
        }
        g.released.iter().copied().collect()
    }

    /// Released reservations to report in the next heartbeat.
    pub fn released(&self) -> Vec<Key> {
        self.inner.lock().released.iter().copied().collect()
    }

    fn verdict(&self, term: u64, key: Key) -> Result<(), Status> {
        if term < self.highest_term() {
            return Err(Status::StaleTerm);
        }
        if self.inner.lock().fenced.contains(&key) {
            return Err(Status::Fenced);
        }
        Ok(())
    }
}

struct Guard {
    tracker: Arc<Tracker>,
    key: Key,
    term: u64,
}

impl WriteSlice for Guard {
    fn complete(&mut self) -> Result<(), Status> {
        self.tracker.verdict(self.term, self.key)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let mut g = self.tracker.inner.lock();
        if let Some(r) = g.remote.get_mut(&self.key) {
            r.active = r.active.saturating_sub(1);
            r.last = Some(Instant::now());
        }
    }
}

/// The data-plane admission check, on a shared tracker.
#[derive(Clone, Debug)]
pub struct TrackerAdmission(pub Arc<Tracker>);

impl Admission for TrackerAdmission {
    fn generation(&self) -> u64 {
        self.0.generation()
    }

    fn admit_write(&self, req: &Request) -> Result<WriteGuard, Status> {
        let t = &self.0;
        if req.generation != t.generation() {
            return Err(Status::BadGeneration);
        }
        t.grants.check(Kind::Write, req)?;
        let before = t.highest_term.fetch_max(req.term, Ordering::AcqRel);
        if req.term < before {
            return Err(Status::StaleTerm);
        }
        let key = Version {
            term: req.term,
            id: req.res_id,
        };
        {
            let mut g = t.inner.lock();
            if g.fenced.contains(&key) {
                return Err(Status::Fenced);
            }
            let r = g.remote.entry(key).or_default();
            add_extent(&mut r.extents, req.offset, req.len as u64);
            r.active += 1;
            r.last = Some(Instant::now());
        }
        Ok(Box::new(Guard {
            tracker: t.clone(),
            key,
            term: req.term,
        }))
    }

    fn admit_read(&self, req: &Request) -> Result<(), Status> {
        if req.generation != self.0.generation() {
            return Err(Status::BadGeneration);
        }
        self.0.grants.check(Kind::Read, req)
    }

    fn read_disk(&self, req: &Request, dst: &mut [u8]) -> Result<(), Status> {
        let Some(disk) = regolith_proto::disk_tier::disk_of(req.generation) else {
            return Err(Status::BadGeneration);
        };
        self.0.grants.check(Kind::Read, req)?;
        let tier = self.0.disks.get().ok_or(Status::BadGeneration)?;
        let version = Version {
            term: req.term,
            id: req.res_id,
        };
        let (d, _) = tier
            .holder(&version, Some(disk))
            .ok_or(Status::BadGeneration)?;
        match d.read_range(&version, req.offset, dst) {
            Ok(true) => {
                if req.offset == 0 {
                    tier.note_hit();
                }
                Ok(())
            }
            Ok(false) => Err(Status::BadGeneration),
            Err(e) => {
                tracing::warn!(error = %e, "disk read for a peer failed");
                Err(Status::Internal)
            }
        }
    }

    fn highest_term(&self) -> u64 {
        self.0.highest_term()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use regolith_proto::dataplane::Kind;

    fn v(term: u64, id: u64) -> Version {
        Version { term, id }
    }

    fn e(offset: u64, len: u64) -> Extent {
        Extent { offset, len }
    }

    fn write(generation: u64, term: u64, id: u64, offset: u64) -> Request {
        Request {
            kind: Kind::Write,
            req_id: 1,
            generation,
            offset,
            len: 4096,
            term,
            res_id: id,
            grant: Default::default(),
        }
    }

    #[test]
    fn slices_of_one_range_merge() {
        let mut v = Vec::new();
        add_extent(&mut v, 0, 100);
        add_extent(&mut v, 100, 50);
        add_extent(&mut v, 500, 10);
        add_extent(&mut v, 20, 10);
        assert_eq!(v, vec![e(0, 150), e(500, 10)]);
    }

    #[test]
    fn finding_9_offset_near_u64_max_saturates() {
        // Offsets and lengths come from a peer before any range check: the ends saturate.
        let mut xs = Vec::new();
        add_extent(&mut xs, u64::MAX - 10, 4096);
        assert_eq!(xs, vec![e(u64::MAX - 10, 10)]);
        add_extent(&mut xs, u64::MAX - 20, u64::MAX);
        assert_eq!(xs, vec![e(u64::MAX - 20, 20)]);
        add_extent(&mut xs, 0, 100);
        assert_eq!(xs, vec![e(u64::MAX - 20, 20), e(0, 100)]);
        // Through the admission check of a real tracker: admitted (the segment refuses the
        // range later), remembered without wrapping, and the tracker keeps working.
        let t = Tracker::new(1);
        let a = TrackerAdmission(t.clone());
        let g = a.admit_write(&write(1, 1, 1, u64::MAX - 100)).unwrap();
        drop(g);
        assert_eq!(t.in_flight(), vec![(v(1, 1), vec![e(u64::MAX - 100, 100)])]);
        let g = a.admit_write(&write(1, 1, 2, 0)).unwrap();
        drop(g);
        assert_eq!(t.in_flight().len(), 2);
    }

    proptest::proptest! {
        #[test]
        fn finding_9_add_extent_never_wraps(
            ranges in proptest::collection::vec((proptest::num::u64::ANY, proptest::num::u64::ANY), 1..20)
        ) {
            let mut v = Vec::new();
            for (off, len) in &ranges {
                add_extent(&mut v, *off, *len);
            }
            for x in &v {
                proptest::prop_assert!(x.offset.checked_add(x.len).is_some(), "{x:?} wraps");
            }
            // Every byte asked for (up to the saturated end) is covered by some extent.
            for (off, len) in &ranges {
                let end = off.saturating_add(*len);
                for p in [*off, end.saturating_sub(1).max(*off)] {
                    if p < end {
                        proptest::prop_assert!(
                            v.iter().any(|x| x.offset <= p && p < x.offset + x.len),
                            "byte {p} of [{off}, +{len}) not covered by {v:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn in_flight_fencing_and_release() {
        let t = Tracker::new(1);
        let a = TrackerAdmission(t.clone());
        assert_eq!(
            a.admit_write(&write(2, 1, 1, 0)).err(),
            Some(Status::BadGeneration)
        );
        let g = a.admit_write(&write(1, 3, 1, 0)).unwrap();
        t.track_local(v(3, 2), 9, vec![e(8192, 100)]);
        let inf = t.in_flight();
        assert_eq!(
            inf,
            vec![(v(3, 1), vec![e(0, 4096)]), (v(3, 2), vec![e(8192, 100)])]
        );
        // Quarantined while a slice is in progress and a client copies: fenced, not released.
        assert!(t.quarantined(&[v(3, 1), v(3, 2)]).is_empty());
        assert_eq!(
            a.admit_write(&write(1, 3, 1, 4096)).err(),
            Some(Status::Fenced)
        );
        drop(g);
        assert_eq!(t.quarantined(&[v(3, 1), v(3, 2)]), vec![v(3, 1)]);
        assert_eq!(t.untrack_conn(9), vec![v(3, 2)]);
        assert_eq!(t.quarantined(&[v(3, 1), v(3, 2)]), vec![v(3, 1), v(3, 2)]);
        // metad stopped listing (3, 1): no longer reported.
        assert_eq!(t.quarantined(&[v(3, 2)]), vec![v(3, 2)]);
        // A higher term refuses older slices.
        t.observe_term(5);
        assert_eq!(
            a.admit_write(&write(1, 4, 7, 0)).err(),
            Some(Status::StaleTerm)
        );
        let mut g = a.admit_write(&write(1, 5, 7, 0)).unwrap();
        t.observe_term(6);
        assert_eq!(
            g.complete(),
            Err(Status::StaleTerm),
            "a slice of an older term is not finished"
        );
    }

    #[test]
    fn a_hand_over_carries_fences_terms_and_holds_copies_in_progress() {
        let t = Tracker::new(1);
        let a = TrackerAdmission(t.clone());
        // A remote reservation done, one with a slice in progress, a local copy, a fence.
        drop(a.admit_write(&write(1, 3, 1, 0)).unwrap());
        let busy = a.admit_write(&write(1, 3, 2, 8192)).unwrap();
        t.track_local(v(3, 3), 9, vec![e(65536, 4096)]);
        t.track_local(v(3, 4), 10, vec![e(131072, 4096)]);
        assert!(t.quarantined(&[v(3, 5)]) == vec![v(3, 5)]);
        // The hand-over closes connection 10 mid-copy: held, not dropped.
        t.set_hold_closing(true);
        t.untrack_conn(10);
        let s = t.snapshot();
        drop(busy);
        assert_eq!(s.highest_term, 3);
        assert_eq!(s.fenced, vec![(3, 5)]);
        assert_eq!(s.released, vec![(3, 5)]);
        assert_eq!(s.remote.iter().map(|h| h.id).collect::<Vec<_>>(), vec![1]);
        assert_eq!(
            s.held.iter().map(|h| h.id).collect::<Vec<_>>(),
            vec![2, 3, 4],
            "in progress: a slice, a local copy, a closed session's copy"
        );
        // Through the wire format into a fresh tracker of the same generation.
        let s: TrackerState = serde_json::from_slice(&serde_json::to_vec(&s).unwrap()).unwrap();
        let n = Tracker::new(1);
        n.restore(&s);
        assert_eq!(n.highest_term(), 3);
        assert!(n.is_fenced(v(3, 5)));
        let na = TrackerAdmission(n.clone());
        assert_eq!(
            na.admit_write(&write(1, 3, 5, 0)).err(),
            Some(Status::Fenced)
        );
        assert_eq!(
            na.admit_write(&write(1, 2, 9, 0)).err(),
            Some(Status::StaleTerm)
        );
        let listed: Vec<Key> = n.in_flight().into_iter().map(|(k, _)| k).collect();
        assert_eq!(listed, vec![v(3, 1), v(3, 2), v(3, 3), v(3, 4)]);
        // metad quarantines them all: the idle remote one is released at once, the held ones
        // are not (a copy may still run in a client whose session was closed).
        assert_eq!(
            n.quarantined(&[v(3, 1), v(3, 2), v(3, 3), v(3, 4), v(3, 5)]),
            vec![v(3, 1), v(3, 5)]
        );
        // Once the hold is over, they are.
        for h in n.inner.lock().held.values_mut() {
            h.1 = Instant::now();
        }
        assert_eq!(
            n.quarantined(&[v(3, 1), v(3, 2), v(3, 3), v(3, 4), v(3, 5)])
                .len(),
            5
        );
    }
}
