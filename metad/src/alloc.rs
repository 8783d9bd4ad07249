//! A best-fit free-range allocator over `[0, capacity)`.
//!
//! Used twice: the state machine keeps one per segment to re-check at apply that a commit's
//! extents are free, and the leader's shadow allocator keeps one per segment to pick extents for
//! reservations. Free ranges are coalesced, so memory is proportional to fragmentation, not to
//! the number of objects. A second index by length makes every allocation O(log n) in the
//! number of free ranges, however fragmented the segment (a first-fit scan by offset cost
//! ~40 µs per allocation with 50 000 holes; see `benches/alloc.rs`).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize, Serializer};

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

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(from = "Repr")]
pub struct RangeAlloc {
    capacity: u64,
    /// start → end of each free range; ranges never touch (they are coalesced).
    free: BTreeMap<u64, u64>,
    /// (length, start) of every free range: the same ranges, by length. Derived from `free`,
    /// so not part of the serialized form.
    by_len: BTreeSet<(u64, u64)>,
    free_bytes: u64,
}

/// The serialized form (unchanged from before the length index existed).
#[derive(Deserialize)]
struct Repr {
    capacity: u64,
    free: BTreeMap<u64, u64>,
    free_bytes: u64,
}

#[derive(Serialize)]
struct ReprRef<'a> {
    capacity: u64,
    free: &'a BTreeMap<u64, u64>,
    free_bytes: u64,
}

impl From<Repr> for RangeAlloc {
    fn from(r: Repr) -> Self {
        let by_len = r.free.iter().map(|(s, e)| (e - s, *s)).collect();
        Self {
            capacity: r.capacity,
            free: r.free,
            by_len,
            free_bytes: r.free_bytes,
        }
    }
}

impl Serialize for RangeAlloc {
    fn serialize<S: Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        ReprRef {
            capacity: self.capacity,
            free: &self.free,
            free_bytes: self.free_bytes,
        }
        .serialize(ser)
    }
}

impl RangeAlloc {
    pub fn new(capacity: u64) -> Self {
        let mut a = Self {
            capacity,
            free: BTreeMap::new(),
            by_len: BTreeSet::new(),
            free_bytes: capacity,
        };
        if capacity > 0 {
            a.insert_range(0, capacity);
        }
        a
    }

    /// The allocator of a segment of `capacity` whose used extents are `used` (offset,
    /// length), built in one pass over them sorted: what restoring a snapshot of millions of
    /// objects needs (a `take` per object cost six tree operations each, most of a restart).
    /// Refuses, answering the offending extent, one that is empty, out of range or overlaps
    /// another.
    pub fn from_used(capacity: u64, used: &mut [(u64, u64)]) -> Result<Self, Extent> {
        used.sort_unstable();
        let mut free = Vec::new();
        let mut at = 0u64;
        for &(offset, len) in used.iter() {
            let e = Extent::new(offset, len);
            if len == 0 || offset.checked_add(len).is_none_or(|end| end > capacity) || offset < at {
                return Err(e);
            }
            if at < offset {
                free.push((at, offset));
            }
            at = offset + len;
        }
        if at < capacity {
            free.push((at, capacity));
        }
        let free_bytes = free.iter().map(|(s, e)| e - s).sum();
        Ok(Self {
            capacity,
            by_len: free.iter().map(|(s, e)| (e - s, *s)).collect(),
            free: free.into_iter().collect(),
            free_bytes,
        })
    }

    fn insert_range(&mut self, start: u64, end: u64) {
        self.free.insert(start, end);
        self.by_len.insert((end - start, start));
    }

    fn remove_range(&mut self, start: u64) {
        if let Some(end) = self.free.remove(&start) {
            self.by_len.remove(&(end - start, start));
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
        self.by_len.last().map_or(0, |(len, _)| *len)
    }

    /// Allocates `len` bytes (rounded up to [`ALIGN`]) contiguously, best fit: the shortest free
    /// range that holds it (the lowest one among equals), which leaves large ranges whole for
    /// large objects.
    pub fn alloc(&mut self, len: u64) -> Option<Extent> {
        if len == 0 {
            return None;
        }
        let want = align_up(len);
        let &(have, start) = self.by_len.range((want, 0)..).next()?;
        let end = start + have;
        self.remove_range(start);
        if start + want < end {
            self.insert_range(start + want, end);
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
        let mut picked = Vec::new();
        let mut left = want;
        for &(len, s) in self.by_len.iter().rev() {
            let e = s + len;
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
        // `is_free` found this range; a miss would be a bug, answered as "not free".
        let Some((&start, &end)) = self.free.range(..=e.offset).next_back() else {
            return false;
        };
        self.remove_range(start);
        if start < e.offset {
            self.insert_range(start, e.offset);
        }
        if e.end() < end {
            self.insert_range(e.end(), end);
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
                self.remove_range(ps);
                start = ps;
            }
        }
        if let Some((ns, nend)) = next {
            if ns == e.end() {
                self.remove_range(ns);
                end = nend;
            }
        }
        self.insert_range(start, end);
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
        fn allocations_never_overlap(ops in proptest::collection::vec((0u8..5, 1u64..5000), 1..200)) {
            let mut a = RangeAlloc::new(64 * 1024);
            let mut live: Vec<Extent> = Vec::new();
            for (op, n) in ops {
                match op {
                    0 | 1 => if let Some(e) = a.alloc(n) {
                        for l in &live { prop_assert!(!l.overlaps(&e)); }
                        live.push(e);
                    },
                    3 => if let Some(es) = a.alloc_fragmented(n * 8, 4) {
                        for e in es {
                            for l in &live { prop_assert!(!l.overlaps(&e)); }
                            live.push(e);
                        }
                    },
                    4 => {
                        let e = Extent::new((n * 13) % (60 * 1024), n);
                        for p in a.take_overlapping(&e) {
                            for l in &live { prop_assert!(!l.overlaps(&p)); }
                            live.push(p);
                        }
                    }
                    _ => if !live.is_empty() {
                        let e = live.swap_remove((n as usize) % live.len());
                        prop_assert!(a.free(&e));
                    },
                }
                let used: u64 = live.iter().map(|e| e.len).sum();
                prop_assert_eq!(a.used_bytes(), used);
                let by_len: BTreeSet<(u64, u64)> = a.free.iter().map(|(s, e)| (e - s, *s)).collect();
                prop_assert_eq!(&a.by_len, &by_len, "the length index follows the free map");
            }
            let json = serde_json::to_string(&a).unwrap();
            prop_assert!(!json.contains("by_len"), "the index is not serialized: {}", json);
            let back: RangeAlloc = serde_json::from_str(&json).unwrap();
            prop_assert_eq!(&back, &a);
            // Built in one pass from the live extents (a snapshot restore): the same allocator.
            let mut used: Vec<(u64, u64)> = live.iter().map(|e| (e.offset, e.len)).collect();
            prop_assert_eq!(RangeAlloc::from_used(64 * 1024, &mut used).unwrap(), a);
        }
    }

    #[test]
    fn from_used_refuses_overlaps_empty_and_out_of_range_extents() {
        let ok = RangeAlloc::from_used(1000, &mut [(500, 100), (0, 100)]).unwrap();
        assert_eq!(ok.free_bytes(), 800);
        assert_eq!(ok.fragments(), 2);
        let overlap = RangeAlloc::from_used(1000, &mut [(0, 100), (50, 10)]).unwrap_err();
        assert_eq!(overlap, Extent::new(50, 10));
        assert!(RangeAlloc::from_used(1000, &mut [(10, 0)]).is_err());
        assert!(RangeAlloc::from_used(1000, &mut [(990, 20)]).is_err());
        assert!(RangeAlloc::from_used(1000, &mut [(u64::MAX, 2)]).is_err());
        assert_eq!(
            RangeAlloc::from_used(0, &mut []).unwrap(),
            RangeAlloc::new(0)
        );
    }
}
