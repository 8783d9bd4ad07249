//! A first-fit free-range allocator over `[0, capacity)`.
//!
//! Used twice: the state machine keeps one per segment to re-check at apply that a commit's
//! extents are free, and the leader's shadow allocator keeps one per segment to pick extents for
//! reservations. Free ranges are coalesced, so memory is proportional to fragmentation, not to
//! the number of objects.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::types::Extent;

/// Allocation alignment: extents start on 64-byte boundaries (cache lines; checksum chunks are
/// counted from the object's start, so nothing larger is needed).
pub const ALIGN: u64 = 64;

/// Length granule of all but the last extent of a fragmented replica: the checksum chunk size
/// (`regolith_proto::checksum::CHUNK`).
pub const GRANULE: u64 = 64 * 1024;

pub fn align_up(n: u64) -> u64 {
    n.div_ceil(ALIGN) * ALIGN
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RangeAlloc {
    capacity: u64,
    /// start → end of each free range; ranges never touch (they are coalesced).
    free: BTreeMap<u64, u64>,
    free_bytes: u64,
}

impl RangeAlloc {
    pub fn new(capacity: u64) -> Self {
        let mut free = BTreeMap::new();
        if capacity > 0 {
            free.insert(0, capacity);
        }
        Self {
            capacity,
            free,
            free_bytes: capacity,
        }
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    pub fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    pub fn used_bytes(&self) -> u64 {
        self.capacity - self.free_bytes
    }

    /// Number of free ranges (fragmentation).
    pub fn fragments(&self) -> usize {
        self.free.len()
    }

    /// The largest single free range.
    pub fn largest_free(&self) -> u64 {
        self.free.iter().map(|(s, e)| e - s).max().unwrap_or(0)
    }

    /// Allocates `len` bytes (rounded up to [`ALIGN`]) contiguously, first fit.
    pub fn alloc(&mut self, len: u64) -> Option<Extent> {
        if len == 0 {
            return None;
        }
        let want = align_up(len);
        let (&start, &end) = self.free.iter().find(|(s, e)| *e - *s >= want)?;
        self.free.remove(&start);
        if start + want < end {
            self.free.insert(start + want, end);
        }
        self.free_bytes -= want;
        Some(Extent::new(start, want))
    }

    /// Allocates `len` bytes in as few extents as possible (largest free ranges first), when no
    /// single range is large enough. All or nothing. The extents are in object order, and every
    /// one but the last is a multiple of [`GRANULE`] long, so that no checksum chunk of the
    /// object straddles two extents (slices are hashed per chunk where they land).
    pub fn alloc_fragmented(&mut self, len: u64, max_extents: usize) -> Option<Vec<Extent>> {
        if let Some(e) = self.alloc(len) {
            return Some(vec![e]);
        }
        let want = align_up(len);
        if self.free_bytes < want {
            return None;
        }
        let mut ranges: Vec<(u64, u64)> = self.free.iter().map(|(s, e)| (*s, *e)).collect();
        ranges.sort_by_key(|(s, e)| std::cmp::Reverse(e - s));
        let mut picked = Vec::new();
        let mut left = want;
        for (s, e) in ranges {
            if left == 0 || picked.len() == max_extents {
                break;
            }
            let take = if e - s >= left {
                left
            } else {
                (e - s) / GRANULE * GRANULE
            };
            if take == 0 {
                continue;
            }
            picked.push(Extent::new(s, take));
            left -= take;
        }
        if left > 0 {
            return None;
        }
        for e in &picked {
            let ok = self.take(e);
            debug_assert!(ok);
        }
        Some(picked)
    }

    /// Whether `e` lies entirely in free space.
    pub fn is_free(&self, e: &Extent) -> bool {
        if e.len == 0 || e.end() > self.capacity {
            return false;
        }
        match self.free.range(..=e.offset).next_back() {
            Some((_, &end)) => end >= e.end(),
            None => false,
        }
    }

    /// Marks `e` used if it lies entirely in free space; returns whether it did.
    pub fn take(&mut self, e: &Extent) -> bool {
        if !self.is_free(e) {
            return false;
        }
        let (&start, &end) = self
            .free
            .range(..=e.offset)
            .next_back()
            .expect("checked by is_free");
        self.free.remove(&start);
        if start < e.offset {
            self.free.insert(start, e.offset);
        }
        if e.end() < end {
            self.free.insert(e.end(), end);
        }
        self.free_bytes -= e.len;
        true
    }

    /// Marks as used whatever part of `e` is free; returns the parts taken.
    pub fn take_overlapping(&mut self, e: &Extent) -> Vec<Extent> {
        let end = e.end().min(self.capacity);
        let mut parts = Vec::new();
        let first = self
            .free
            .range(..=e.offset)
            .next_back()
            .map(|(s, _)| *s)
            .unwrap_or(e.offset);
        for (&s, &fe) in self.free.range(first..end) {
            let a = s.max(e.offset);
            let b = fe.min(end);
            if a < b {
                parts.push(Extent::new(a, b - a));
            }
        }
        for p in &parts {
            let ok = self.take(p);
            debug_assert!(ok);
        }
        parts
    }

    /// Returns `e` to free space. Refuses (returns false, changes nothing) when any byte of `e`
    /// is already free or out of range: a double free is a bug the caller must hear about.
    pub fn free(&mut self, e: &Extent) -> bool {
        if e.len == 0 || e.end() > self.capacity {
            return false;
        }
        let prev = self
            .free
            .range(..=e.offset)
            .next_back()
            .map(|(s, en)| (*s, *en));
        if let Some((_, pend)) = prev {
            if pend > e.offset {
                return false;
            }
        }
        let next = self.free.range(e.offset..).next().map(|(s, en)| (*s, *en));
        if let Some((ns, _)) = next {
            if ns < e.end() {
                return false;
            }
        }
        let mut start = e.offset;
        let mut end = e.end();
        if let Some((ps, pend)) = prev {
            if pend == e.offset {
                self.free.remove(&ps);
                start = ps;
            }
        }
        if let Some((ns, nend)) = next {
            if ns == e.end() {
                self.free.remove(&ns);
                end = nend;
            }
        }
        self.free.insert(start, end);
        self.free_bytes += e.len;
        true
    }

    /// The free ranges, in order.
    pub fn free_ranges(&self) -> impl Iterator<Item = Extent> + '_ {
        self.free.iter().map(|(s, e)| Extent::new(*s, e - s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn alloc_free_coalesces() {
        let mut a = RangeAlloc::new(1024);
        let x = a.alloc(100).unwrap();
        let y = a.alloc(100).unwrap();
        assert_eq!(x, Extent::new(0, 128));
        assert_eq!(y, Extent::new(128, 128));
        assert!(a.free(&x));
        assert!(!a.free(&x), "double free refused");
        assert!(a.free(&y));
        assert_eq!(a.fragments(), 1);
        assert_eq!(a.free_bytes(), 1024);
    }

    #[test]
    fn take_and_overlap() {
        let mut a = RangeAlloc::new(1000);
        assert!(a.take(&Extent::new(100, 100)));
        assert!(!a.take(&Extent::new(150, 100)));
        let parts = a.take_overlapping(&Extent::new(50, 300));
        assert_eq!(parts, vec![Extent::new(50, 50), Extent::new(200, 150)]);
        assert_eq!(a.free_bytes(), 1000 - 300);
        assert!(!a.is_free(&Extent::new(990, 20)), "past capacity");
    }

    #[test]
    fn fragmented_allocation_keeps_chunks_whole() {
        let g = GRANULE;
        let mut a = RangeAlloc::new(g * 10);
        let es: Vec<_> = (0..10).map(|_| a.alloc(g).unwrap()).collect();
        for e in es.iter().step_by(2) {
            a.free(e);
        }
        assert!(a.alloc(2 * g).is_none());
        let got = a.alloc_fragmented(2 * g + 100, 4).unwrap();
        assert_eq!(got.iter().map(|e| e.len).sum::<u64>(), 2 * g + 128);
        assert!(
            got[..got.len() - 1].iter().all(|e| e.len % g == 0),
            "{got:?}"
        );
        assert!(
            a.alloc_fragmented(g * 3, 8).is_none(),
            "only 2 granules left"
        );
        // A free range shorter than a granule cannot hold a non-final piece.
        let mut b = RangeAlloc::new(g * 4);
        let x = b.alloc(g).unwrap();
        let _y = b.alloc(g).unwrap();
        let z = b.alloc(g * 2).unwrap();
        b.free(&x);
        b.free(&z);
        let got = b.alloc_fragmented(g * 2 + g / 2, 4).unwrap();
        assert_eq!(
            got,
            vec![z, Extent::new(x.offset, g / 2)],
            "largest first, remainder last"
        );
        let mut c = RangeAlloc::new(g * 4);
        let x = c.alloc(g / 2).unwrap();
        let _y = c.alloc(g).unwrap();
        let z = c.alloc(g * 2 + g / 2).unwrap();
        c.free(&x);
        c.free(&z);
        assert!(
            c.alloc_fragmented(g * 2 + g / 2 + 64, 4).is_none(),
            "a half-granule hole holds no middle piece"
        );
    }

    proptest! {
        #[test]
        fn allocations_never_overlap(ops in proptest::collection::vec((0u8..3, 1u64..5000), 1..200)) {
            let mut a = RangeAlloc::new(64 * 1024);
            let mut live: Vec<Extent> = Vec::new();
            for (op, n) in ops {
                match op {
                    0 | 1 => if let Some(e) = a.alloc(n) {
                        for l in &live { prop_assert!(!l.overlaps(&e)); }
                        live.push(e);
                    },
                    _ => if !live.is_empty() {
                        let e = live.swap_remove((n as usize) % live.len());
                        prop_assert!(a.free(&e));
                    },
                }
                let used: u64 = live.iter().map(|e| e.len).sum();
                prop_assert_eq!(a.used_bytes(), used);
            }
        }
    }
}
