//! Where records lie on one disk, sans-I/O: buckets, their epochs and fill, the key → record
//! map, space accounting, the disk's own eviction order (least recently used bucket first) and
//! the choice of buckets worth compacting. [`super::store`] does the I/O this plans.
//!
//! Records are only appended, to the one open bucket; a bucket whose records are all dead is
//! free again, and reopening it raises its epoch (older records in it can never be read as
//! current). Two live records never share a byte: each is placed at its bucket's tail, and a
//! bucket's tail only moves back when no live record is left in it.

use std::collections::HashMap;

use regolith_proto::common::Version;

use super::format::{RecordShape, BLOCK};

/// One live record.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub bucket: u32,
    /// The record's offset in its bucket file.
    pub offset: u64,
    pub shape: RecordShape,
    pub version: Version,
    pub checksum: u64,
    /// The bucket's epoch the record was written in.
    pub epoch: u64,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum BucketState {
    /// Holds no live record; may be reopened.
    Free,
    /// Takes appends.
    Open,
    /// Full, or closed for appends; freed when its last record dies.
    Sealed,
}

#[derive(Clone, Debug)]
pub struct Bucket {
    pub epoch: u64,
    pub state: BucketState,
    /// Where the next record goes.
    pub tail: u64,
    pub live_bytes: u64,
    pub live: u32,
    /// Records planned here ([`Layout::plan_append`]) and not yet linked or abandoned
    /// ([`Layout::landed`]): a bucket with any is never free, or a reuse would write over
    /// them while they are written.
    pub pending: u32,
    /// Logical time of the last append to or read from the bucket.
    pub last_access: u64,
}

impl Bucket {
    /// Nothing live in it and nothing being written to it.
    fn is_empty(&self) -> bool {
        self.live == 0 && self.pending == 0
    }

    /// A bucket never opened (or whose file was not found by a scan).
    fn empty() -> Self {
        Bucket {
            epoch: 0,
            state: BucketState::Free,
            tail: BLOCK,
            live_bytes: 0,
            live: 0,
            pending: 0,
            last_access: 0,
        }
    }
}

/// A place for a record, planned by [`Layout::plan_append`].
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Append {
    pub bucket: u32,
    pub offset: u64,
    pub epoch: u64,
    /// The bucket was (re)opened for this record: its header must be written first.
    pub opened: bool,
    /// The bucket's file does not exist yet.
    pub created: bool,
}

/// Why a record cannot be placed.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum NoRoom {
    /// Larger than a bucket can hold.
    TooLarge { len: u64, max: u64 },
    /// Every bucket the capacity allows is in use: evict or compact first.
    Full,
}

/// Space of one disk, in bytes.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// What the disk may hold (buckets allowed × bucket size).
    pub capacity: u64,
    /// Bytes of bucket files created.
    pub allocated: u64,
    /// Bytes of live records.
    pub live: u64,
    pub objects: u64,
    pub free_buckets: u32,
}

pub struct Layout {
    bucket_size: u64,
    max_buckets: u32,
    buckets: Vec<Bucket>,
    open: Option<u32>,
    entries: HashMap<String, Entry>,
    /// Version → key of every live record (versions are unique cluster-wide; data-plane reads
    /// name an object by its version only).
    by_version: HashMap<Version, String>,
    clock: u64,
    live_bytes: u64,
    /// Highest bucket epoch ever used on the disk: each (re)opening takes the next, so no
    /// record left anywhere on the disk can carry the epoch of a newer use of its bucket.
    epoch: u64,
}

impl Layout {
    pub fn new(bucket_size: u64, max_buckets: u32) -> Self {
        Self {
            bucket_size,
            max_buckets,
            buckets: Vec::new(),
            open: None,
            entries: HashMap::new(),
            by_version: HashMap::new(),
            clock: 0,
            live_bytes: 0,
            epoch: 0,
        }
    }

    pub fn bucket_size(&self) -> u64 {
        self.bucket_size
    }

    /// The largest record a bucket holds.
    pub fn max_record(&self) -> u64 {
        self.bucket_size.saturating_sub(BLOCK)
    }

    /// Capacity re-checked against the file system: buckets past it are not (re)opened.
    pub fn set_max_buckets(&mut self, n: u32) {
        self.max_buckets = n;
    }

    pub fn max_buckets(&self) -> u32 {
        self.max_buckets
    }

    pub fn bucket_count(&self) -> u32 {
        self.buckets.len() as u32
    }

    pub fn bucket(&self, b: u32) -> Option<&Bucket> {
        self.buckets.get(b as usize)
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// An epoch seen on the disk by a scan (in a bucket header or a record).
    pub fn note_epoch(&mut self, epoch: u64) {
        self.epoch = self.epoch.max(epoch);
    }

    /// A bucket found by a scan: its epoch and where its log ends (restore it before its
    /// records). Gaps in the numbers become free buckets.
    pub fn restore_bucket(&mut self, b: u32, epoch: u64, tail: u64) {
        self.note_epoch(epoch);
        while self.buckets.len() <= b as usize {
            self.buckets.push(Bucket::empty());
        }
        let t = self.tick();
        let bk = &mut self.buckets[b as usize];
        bk.epoch = epoch;
        bk.tail = tail.max(BLOCK);
        bk.last_access = t;
        // A restored bucket takes no more appends: its tail may sit after a torn record.
        bk.state = BucketState::Sealed;
    }

    /// A record found by a scan. Of two records of one key the later version stays; the other
    /// is returned, dead.
    pub fn restore_record(&mut self, key: &str, e: Entry) -> Option<Entry> {
        match self.entries.get(key) {
            Some(old) if old.version >= e.version => Some(e),
            _ => self.insert(key, e),
        }
    }

    /// Ends a restore: buckets without a live record are free.
    pub fn finish_restore(&mut self) {
        for bk in &mut self.buckets {
            if bk.live == 0 {
                bk.state = BucketState::Free;
            }
        }
    }

    /// Plans the place of a record of `len` bytes (a multiple of [`BLOCK`]) and reserves it.
    pub fn plan_append(&mut self, len: u64) -> Result<Append, NoRoom> {
        if len > self.max_record() {
            return Err(NoRoom::TooLarge {
                len,
                max: self.max_record(),
            });
        }
        if let Some(b) = self.open {
            let bk = &self.buckets[b as usize];
            if bk.tail + len <= self.bucket_size {
                return Ok(self.place(b, len, false, false));
            }
            self.seal(b);
        }
        let reuse = (0..self.buckets.len().min(self.max_buckets as usize))
            .find(|&i| self.buckets[i].state == BucketState::Free);
        let (b, created) = match reuse {
            Some(i) => (i as u32, false),
            None if (self.buckets.len() as u32) < self.max_buckets => {
                self.buckets.push(Bucket::empty());
                (self.buckets.len() as u32 - 1, true)
            }
            None => return Err(NoRoom::Full),
        };
        self.epoch += 1;
        let epoch = self.epoch;
        let bk = &mut self.buckets[b as usize];
        bk.epoch = epoch;
        bk.state = BucketState::Open;
        bk.tail = BLOCK;
        self.open = Some(b);
        Ok(self.place(b, len, true, created))
    }

    fn place(&mut self, b: u32, len: u64, opened: bool, created: bool) -> Append {
        let t = self.tick();
        let bk = &mut self.buckets[b as usize];
        let offset = bk.tail;
        bk.tail += len;
        bk.pending += 1;
        bk.last_access = t;
        Append {
            bucket: b,
            offset,
            epoch: bk.epoch,
            opened,
            created,
        }
    }

    fn seal(&mut self, b: u32) {
        if self.open == Some(b) {
            self.open = None;
        }
        let bk = &mut self.buckets[b as usize];
        bk.state = if bk.is_empty() {
            BucketState::Free
        } else {
            BucketState::Sealed
        };
    }

    /// A record planned in bucket `b` was linked ([`Layout::insert`] first) or abandoned: a
    /// sealed bucket left with nothing live or pending is free.
    pub fn landed(&mut self, b: u32) {
        let Some(bk) = self.buckets.get_mut(b as usize) else {
            return;
        };
        bk.pending = bk.pending.saturating_sub(1);
        if bk.is_empty() && bk.state == BucketState::Sealed {
            bk.state = BucketState::Free;
        }
    }

    /// Closes the open bucket for appends (before compacting into a fresh one, or when a
    /// write to it failed part-way).
    pub fn seal_open(&mut self) {
        if let Some(b) = self.open {
            self.seal(b);
        }
    }

    /// Links a written record to its key; returns the record it replaces, now dead.
    pub fn insert(&mut self, key: &str, e: Entry) -> Option<Entry> {
        let bk = &mut self.buckets[e.bucket as usize];
        bk.live += 1;
        bk.live_bytes += e.shape.len;
        self.live_bytes += e.shape.len;
        let old = self.entries.insert(key.to_owned(), e);
        if let Some(o) = old {
            self.unlink(&o);
        }
        self.by_version.insert(e.version, key.to_owned());
        old
    }

    fn unlink(&mut self, e: &Entry) {
        if self.by_version.get(&e.version).is_some_and(|k| {
            self.entries
                .get(k)
                .is_none_or(|cur| cur.version != e.version)
        }) {
            self.by_version.remove(&e.version);
        }
        self.live_bytes -= e.shape.len;
        let bk = &mut self.buckets[e.bucket as usize];
        bk.live -= 1;
        bk.live_bytes -= e.shape.len;
        if bk.is_empty() && bk.state == BucketState::Sealed {
            bk.state = BucketState::Free;
        }
    }

    /// The record of `key`, marking its bucket used now.
    pub fn get(&mut self, key: &str) -> Option<Entry> {
        let e = *self.entries.get(key)?;
        let t = self.tick();
        self.buckets[e.bucket as usize].last_access = t;
        Some(e)
    }

    /// The record of `key`, leaving the eviction order alone.
    pub fn peek(&self, key: &str) -> Option<&Entry> {
        self.entries.get(key)
    }

    /// The key of the live record of `version`.
    pub fn key_of(&self, version: &Version) -> Option<&str> {
        self.by_version.get(version).map(|k| k.as_str())
    }

    /// Unlinks `key`'s record if it is of `version` (any version when None).
    pub fn remove(&mut self, key: &str, version: Option<Version>) -> Option<Entry> {
        let e = *self.entries.get(key)?;
        if version.is_some_and(|v| v != e.version) {
            return None;
        }
        self.entries.remove(key);
        self.unlink(&e);
        Some(e)
    }

    /// The disk's own eviction order: the sealed bucket used least recently.
    pub fn lru_bucket(&self) -> Option<u32> {
        self.buckets
            .iter()
            .enumerate()
            .filter(|(_, b)| b.state == BucketState::Sealed)
            .min_by_key(|(_, b)| b.last_access)
            .map(|(i, _)| i as u32)
    }

    /// A sealed bucket at most half live, the emptiest: compacting it frees a bucket for the
    /// price of copying what is left.
    pub fn compaction_candidate(&self) -> Option<u32> {
        self.buckets
            .iter()
            .enumerate()
            .filter(|(_, b)| b.state == BucketState::Sealed && b.live_bytes * 2 <= self.bucket_size)
            .min_by_key(|(_, b)| b.live_bytes)
            .map(|(i, _)| i as u32)
    }

    /// The live records of bucket `b`.
    pub fn records_in(&self, b: u32) -> Vec<(String, Entry)> {
        self.entries
            .iter()
            .filter(|(_, e)| e.bucket == b)
            .map(|(k, e)| (k.clone(), *e))
            .collect()
    }

    /// Drops every record of bucket `b` and frees it; returns what was dropped.
    pub fn free_bucket(&mut self, b: u32) -> Vec<(String, Entry)> {
        let dropped = self.records_in(b);
        for (k, _) in &dropped {
            self.remove(k, None);
        }
        if self.open == Some(b) {
            self.open = None;
        }
        if let Some(bk) = self.buckets.get_mut(b as usize) {
            bk.state = BucketState::Free;
        }
        dropped
    }

    /// Drops every record (a failed disk); returns what was dropped.
    pub fn clear(&mut self) -> Vec<(String, Entry)> {
        let all: Vec<_> = self.entries.drain().collect();
        self.by_version.clear();
        for bk in &mut self.buckets {
            bk.live = 0;
            bk.live_bytes = 0;
            bk.pending = 0;
            bk.state = BucketState::Free;
        }
        self.open = None;
        self.live_bytes = 0;
        all
    }

    pub fn keys(&self) -> impl Iterator<Item = (&str, &Entry)> {
        self.entries.iter().map(|(k, e)| (k.as_str(), e))
    }

    pub fn usage(&self) -> Usage {
        Usage {
            capacity: self.max_buckets as u64 * self.bucket_size,
            allocated: self.buckets.len() as u64 * self.bucket_size,
            live: self.live_bytes,
            objects: self.entries.len() as u64,
            free_buckets: self
                .buckets
                .iter()
                .take(self.max_buckets as usize)
                .filter(|b| b.state == BucketState::Free)
                .count() as u32
                + self.max_buckets.saturating_sub(self.buckets.len() as u32),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIB: u64 = 1 << 20;

    fn entry(a: &Append, len: u64, v: u64) -> Entry {
        Entry {
            bucket: a.bucket,
            offset: a.offset,
            shape: RecordShape {
                key_len: 1,
                value_off: 72,
                value_len: len - 72,
                len,
            },
            version: Version { term: 1, id: v },
            checksum: v,
            epoch: a.epoch,
        }
    }

    fn put(l: &mut Layout, key: &str, len: u64, v: u64) -> Result<Append, NoRoom> {
        let a = l.plan_append(len)?;
        l.insert(key, entry(&a, len, v));
        l.landed(a.bucket);
        Ok(a)
    }

    /// One batch planned whole before any of it is linked (as a disk writes it): a bucket
    /// opened for the first record and sealed for the second is not free meanwhile, so the
    /// second is not planned over the first.
    #[test]
    fn records_planned_but_not_yet_linked_keep_their_bucket() {
        let rec = MIB * 3 / 4;
        let mut l = Layout::new(MIB, 2);
        let a = l.plan_append(rec).unwrap();
        let b = l.plan_append(rec).unwrap();
        assert_ne!((a.bucket, a.offset), (b.bucket, b.offset));
        assert_eq!(
            l.plan_append(rec),
            Err(NoRoom::Full),
            "both buckets hold a pending record"
        );
        l.insert("a", entry(&a, rec, 1));
        l.landed(a.bucket);
        l.insert("b", entry(&b, rec, 2));
        l.landed(b.bucket);
        l.remove("a", None);
        assert_eq!(l.bucket(a.bucket).unwrap().state, BucketState::Free);
        // An abandoned plan (a relocation whose record died meanwhile) frees its bucket too.
        let c = l.plan_append(rec).unwrap();
        l.seal_open();
        assert_eq!(l.bucket(c.bucket).unwrap().state, BucketState::Sealed);
        l.landed(c.bucket);
        assert_eq!(l.bucket(c.bucket).unwrap().state, BucketState::Free);
    }

    #[test]
    fn records_are_appended_after_the_bucket_header() {
        let mut l = Layout::new(MIB, 4);
        let a = put(&mut l, "a", 8192, 1).unwrap();
        assert_eq!(
            (a.bucket, a.offset, a.epoch, a.opened, a.created),
            (0, BLOCK, 1, true, true)
        );
        let b = put(&mut l, "b", 4096, 2).unwrap();
        assert_eq!((b.bucket, b.offset, b.opened), (0, BLOCK + 8192, false));
        assert_eq!(l.usage().live, 12288);
        assert_eq!(l.usage().objects, 2);
    }

    #[test]
    fn a_full_disk_says_so_and_its_least_recently_used_bucket_goes_first() {
        let rec = MIB / 2;
        let mut l = Layout::new(MIB, 2);
        put(&mut l, "a", rec, 1).unwrap(); // bucket 0
        put(&mut l, "b", rec, 2).unwrap(); // bucket 1 (0 is sealed)
        assert_eq!(l.plan_append(rec), Err(NoRoom::Full));
        // A read of bucket 0 makes bucket 1 the least recently used.
        assert!(l.get("a").is_some());
        assert_eq!(l.lru_bucket(), Some(1));
        let dropped = l.free_bucket(1);
        assert_eq!(dropped.len(), 1);
        assert_eq!(dropped[0].0, "b");
        let c = put(&mut l, "c", rec, 3).unwrap();
        assert_eq!(
            (c.bucket, c.epoch, c.opened, c.created),
            (1, 3, true, false)
        );
    }

    #[test]
    fn a_record_larger_than_a_bucket_is_refused() {
        let mut l = Layout::new(MIB, 8);
        assert_eq!(
            l.plan_append(MIB),
            Err(NoRoom::TooLarge {
                len: MIB,
                max: MIB - BLOCK
            })
        );
    }

    #[test]
    fn a_bucket_whose_records_all_died_is_free_and_reopens_in_a_new_epoch() {
        let rec = MIB / 2;
        let mut l = Layout::new(MIB, 1);
        put(&mut l, "a", rec, 1).unwrap();
        assert_eq!(l.plan_append(rec), Err(NoRoom::Full));
        assert!(
            l.remove("a", Some(Version { term: 1, id: 9 })).is_none(),
            "other version"
        );
        assert!(l.remove("a", None).is_some());
        let b = put(&mut l, "b", rec, 2).unwrap();
        assert_eq!((b.bucket, b.offset, b.epoch), (0, BLOCK, 2));
    }

    #[test]
    fn a_sparse_bucket_is_a_compaction_candidate() {
        let rec = MIB / 4;
        let mut l = Layout::new(MIB, 4);
        for (i, k) in ["a", "b", "c"].iter().enumerate() {
            put(&mut l, k, rec, i as u64).unwrap();
        }
        put(&mut l, "d", rec, 9).unwrap(); // seals bucket 0, opens bucket 1
        assert_eq!(l.compaction_candidate(), None, "bucket 0 is 3/4 live");
        l.remove("a", None);
        l.remove("b", None);
        assert_eq!(l.compaction_candidate(), Some(0));
        assert_eq!(l.records_in(0).len(), 1);
    }

    #[test]
    fn a_scan_keeps_the_later_version_of_a_key() {
        let mut l = Layout::new(MIB, 4);
        l.restore_bucket(0, 3, BLOCK + 8192);
        let mk = |off: u64, v: u64| Entry {
            bucket: 0,
            offset: off,
            shape: RecordShape::new(1, 100).unwrap(),
            version: Version { term: 2, id: v },
            checksum: 0,
            epoch: 3,
        };
        assert!(l.restore_record("k", mk(BLOCK, 5)).is_none());
        assert_eq!(
            l.restore_record("k", mk(BLOCK + 4096, 4))
                .map(|e| e.version.id),
            Some(4)
        );
        assert_eq!(
            l.restore_record("k", mk(BLOCK + 4096, 6))
                .map(|e| e.version.id),
            Some(5)
        );
        l.finish_restore();
        assert_eq!(l.peek("k").map(|e| e.version.id), Some(6));
        assert_eq!(l.usage().objects, 1);
        assert_eq!(l.usage().live, 4096);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Put(u8, u64),
        /// Records planned together, then linked together (a disk's write batch).
        Batch(Vec<(u8, u64)>),
        Remove(u8),
        EvictLru,
        Compact,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u8..40, 1u64..64).prop_map(|(k, blocks)| Op::Put(k, blocks * BLOCK)),
            2 => proptest::collection::vec((0u8..40, 1u64..64), 1..6)
                .prop_map(|v| Op::Batch(v.into_iter().map(|(k, b)| (k, b * BLOCK)).collect())),
            2 => (0u8..40).prop_map(Op::Remove),
            1 => Just(Op::EvictLru),
            1 => Just(Op::Compact),
        ]
    }

    proptest! {
        /// Whatever happens, live records never overlap, stay inside their bucket after its
        /// header, and the accounting adds up.
        #[test]
        fn live_records_never_overlap(ops in proptest::collection::vec(op(), 1..300)) {
            let mut l = Layout::new(64 * BLOCK, 6);
            let mut v = 0;
            for o in ops {
                match o {
                    Op::Put(k, len) => {
                        v += 1;
                        let key = format!("k{k}");
                        match l.plan_append(len) {
                            Ok(a) => { l.insert(&key, entry(&a, len, v)); l.landed(a.bucket); }
                            Err(NoRoom::Full) => {}
                            Err(e) => prop_assert!(false, "{e:?}"),
                        }
                    }
                    Op::Batch(items) => {
                        let mut planned = Vec::new();
                        for (k, len) in items {
                            match l.plan_append(len) {
                                Ok(a) => planned.push((format!("k{k}"), a, len)),
                                Err(NoRoom::Full) => break,
                                Err(e) => prop_assert!(false, "{e:?}"),
                            }
                        }
                        // Planned places overlap neither each other nor a live record.
                        let mut places: Vec<(u32, u64, u64)> = l.keys().map(|(_, e)| (e.bucket, e.offset, e.offset + e.shape.len)).collect();
                        places.extend(planned.iter().map(|(_, a, len)| (a.bucket, a.offset, a.offset + len)));
                        places.sort();
                        for w in places.windows(2) {
                            prop_assert!(w[0].0 != w[1].0 || w[0].2 <= w[1].1, "planned over {:?}", w);
                        }
                        for (key, a, len) in planned {
                            v += 1;
                            l.insert(&key, entry(&a, len, v));
                            l.landed(a.bucket);
                        }
                    }
                    Op::Remove(k) => { l.remove(&format!("k{k}"), None); }
                    Op::EvictLru => { if let Some(b) = l.lru_bucket() { l.free_bucket(b); } }
                    Op::Compact => {
                        if let Some(b) = l.compaction_candidate() {
                            l.seal_open();
                            for (k, e) in l.records_in(b) {
                                v += 1;
                                if let Ok(a) = l.plan_append(e.shape.len) {
                                    if a.bucket != b { l.insert(&k, entry(&a, e.shape.len, v)); }
                                    l.landed(a.bucket);
                                }
                            }
                        }
                    }
                }
                let mut live: Vec<(u32, u64, u64)> = l.keys().map(|(_, e)| (e.bucket, e.offset, e.offset + e.shape.len)).collect();
                live.sort();
                for w in live.windows(2) {
                    prop_assert!(w[0].0 != w[1].0 || w[0].2 <= w[1].1, "overlap {:?}", w);
                }
                let mut total = 0;
                for (b, s, e) in &live {
                    prop_assert!(*s >= BLOCK && *e <= l.bucket_size());
                    let bk = l.bucket(*b).unwrap();
                    prop_assert!(*e <= bk.tail);
                    prop_assert!(bk.state != BucketState::Free);
                    total += e - s;
                }
                prop_assert_eq!(total, l.usage().live);
            }
        }
    }
}
