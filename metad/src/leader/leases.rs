//! Read leases (design §5, invariant 5). A get grants a short lease per object version in the
//! leader's memory; extents of a removed or evicted object are reused only after the leases this
//! leader granted on it have ended. `Exists` never grants or extends one.

use std::collections::{BTreeMap, HashMap};

use crate::types::{Extent, SegmentId, Version};

#[derive(Debug, Default)]
pub struct Leases {
    /// Per leased version: until when, and the key (so that a `RemoveAll` finds the leased
    /// objects without a walk of every object).
    until: HashMap<Version, (u64, Box<str>)>,
    /// Freed extents waiting for their object's lease to end: (end, seq) → what to free.
    waiting: BTreeMap<(u64, u64), (SegmentId, Vec<Extent>)>,
    /// Bytes of `waiting`.
    waiting_bytes: u64,
    seq: u64,
}

fn bytes_of(extents: &[Extent]) -> u64 {
    extents.iter().map(|e| e.len).sum()
}

impl Leases {
    /// Grants (or extends) a lease on `v` until `until_ms`.
    pub fn grant(&mut self, v: Version, key: &str, until_ms: u64) {
        let e = self.until.entry(v).or_insert_with(|| (0, key.into()));
        e.0 = e.0.max(until_ms);
    }

    pub fn active(&self, v: &Version, now_ms: u64) -> bool {
        self.until.get(v).is_some_and(|(t, _)| *t > now_ms)
    }

    /// The versions leased at `now_ms`, with their keys.
    pub fn active_keys(&self, now_ms: u64) -> Vec<(Version, Box<str>)> {
        self.until
            .iter()
            .filter(|(_, (t, _))| *t > now_ms)
            .map(|(v, (_, k))| (*v, k.clone()))
            .collect()
    }

    /// When `v` is leased, keeps its freed extents until the lease ends and returns None;
    /// otherwise hands them back to be freed now.
    pub fn hold_if_leased(
        &mut self,
        v: &Version,
        seg: SegmentId,
        extents: Vec<Extent>,
        now_ms: u64,
    ) -> Option<Vec<Extent>> {
        match self.until.get(v) {
            Some(&(t, _)) if t > now_ms => {
                self.seq += 1;
                self.waiting_bytes += bytes_of(&extents);
                self.waiting.insert((t, self.seq), (seg, extents));
                None
            }
            _ => Some(extents),
        }
    }

    /// Forgets ended leases and returns the extents whose wait is over.
    pub fn expire(&mut self, now_ms: u64) -> Vec<(SegmentId, Vec<Extent>)> {
        self.until.retain(|_, (t, _)| *t > now_ms);
        let mut out = Vec::new();
        while let Some(entry) = self.waiting.first_entry() {
            if entry.key().0 > now_ms {
                break;
            }
            let (seg, extents) = entry.remove();
            self.waiting_bytes -= bytes_of(&extents).min(self.waiting_bytes);
            out.push((seg, extents));
        }
        out
    }

    /// Drops waiting extents of an unmounted segment.
    pub fn drop_segment(&mut self, seg: &SegmentId) {
        self.waiting.retain(|_, (s, _)| s != seg);
        self.waiting_bytes = self.waiting.values().map(|(_, es)| bytes_of(es)).sum();
    }

    /// Bytes freed but held until a lease ends: in use now, free within a lease's time.
    pub fn waiting_bytes(&self) -> u64 {
        self.waiting_bytes
    }

    /// Every extent waiting for a lease to end.
    pub fn waiting_extents(&self) -> Vec<(SegmentId, Extent)> {
        self.waiting
            .values()
            .flat_map(|(s, es)| es.iter().map(move |e| (*s, *e)))
            .collect()
    }

    pub fn waiting_on(&self, seg: &SegmentId) -> bool {
        self.waiting.values().any(|(s, _)| s == seg)
    }

    pub fn len(&self) -> usize {
        self.until.len()
    }

    pub fn is_empty(&self) -> bool {
        self.until.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leased_extents_wait_for_the_lease() {
        let mut l = Leases::default();
        let v = Version { term: 1, id: 1 };
        let seg = SegmentId {
            node: 1,
            generation: 1,
        };
        l.grant(v, "a", 100);
        assert!(l.active(&v, 50));
        assert_eq!(l.active_keys(50), vec![(v, "a".into())]);
        assert!(l
            .hold_if_leased(&v, seg, vec![Extent::new(0, 64)], 50)
            .is_none());
        assert_eq!(l.waiting_bytes(), 64);
        assert!(l.expire(99).is_empty());
        assert_eq!(l.waiting_bytes(), 64);
        assert_eq!(l.expire(100), vec![(seg, vec![Extent::new(0, 64)])]);
        assert_eq!(l.waiting_bytes(), 0);
        assert!(!l.active(&v, 100));
        assert!(l.active_keys(100).is_empty());
        let other = Version { term: 1, id: 2 };
        assert_eq!(
            l.hold_if_leased(&other, seg, vec![Extent::new(64, 64)], 0),
            Some(vec![Extent::new(64, 64)])
        );
    }
}
