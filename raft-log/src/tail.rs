//! The newest entries of the log, encoded, in memory: what replication and apply read (entries
//! appended a moment ago) comes from here rather than from sled.
//!
//! Why: sled keeps the log in records of at most 8 KiB (see `log_store`), which it evicts from
//! its page cache like any other page; reading an entry back then meant paging its records in
//! again, behind the purge thread paging in the old ones it deletes. At ten million objects
//! that slowed the followers' apply to tens of entries a second while a snapshot was built.
//!
//! The cache is always a suffix of the log (contiguous indexes up to the last entry): appends
//! push at the back, a truncation pops from the back, a purge and the byte bound pop from the
//! front, and an append that would leave a gap empties it first.

use std::collections::VecDeque;
use std::sync::Arc;

/// One encoded entry (its bincode bytes, as stored).
pub(crate) type Encoded = Arc<Vec<u8>>;

#[derive(Debug)]
pub(crate) struct TailCache {
    entries: VecDeque<(u64, Encoded)>,
    bytes: u64,
    cap: u64,
}

impl TailCache {
    pub(crate) fn new(cap: u64) -> Self {
        Self {
            entries: VecDeque::new(),
            bytes: 0,
            cap,
        }
    }

    /// The entry appended at `index`, the log's new last entry.
    pub(crate) fn push(&mut self, index: u64, value: Encoded) {
        if self.cap == 0 {
            return;
        }
        if self
            .entries
            .back()
            .is_some_and(|(last, _)| last.checked_add(1) != Some(index))
        {
            self.clear();
        }
        self.bytes += value.len() as u64;
        self.entries.push_back((index, value));
        while self.bytes > self.cap {
            let Some((_, v)) = self.entries.pop_front() else {
                break;
            };
            self.bytes -= v.len() as u64;
        }
    }

    /// The log was truncated: entries from `index` on are gone.
    pub(crate) fn truncate(&mut self, index: u64) {
        while self.entries.back().is_some_and(|(i, _)| *i >= index) {
            if let Some((_, v)) = self.entries.pop_back() {
                self.bytes -= v.len() as u64;
            }
        }
    }

    /// The log was purged: entries up to `index` are gone.
    pub(crate) fn purge(&mut self, upto: u64) {
        while self.entries.front().is_some_and(|(i, _)| *i <= upto) {
            if let Some((_, v)) = self.entries.pop_front() {
                self.bytes -= v.len() as u64;
            }
        }
    }

    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }

    /// The entries from `start` to `end` (exclusive; `None`: to the last), when the cache holds
    /// `start`. Everything from `start` on that exists is then in the cache (it is a suffix).
    pub(crate) fn from(&self, start: u64, end: Option<u64>) -> Option<Vec<(u64, Encoded)>> {
        let (first, _) = self.entries.front()?;
        if start < *first {
            return None;
        }
        let skip = usize::try_from(start - first).ok()?;
        Some(
            self.entries
                .iter()
                .skip(skip)
                .take_while(|(i, _)| end.is_none_or(|e| *i < e))
                .map(|(i, v)| (*i, v.clone()))
                .collect(),
        )
    }

    /// The last entry, if cached.
    pub(crate) fn last(&self) -> Option<(u64, Encoded)> {
        self.entries.back().map(|(i, v)| (*i, v.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(n: usize) -> Encoded {
        Arc::new(vec![0u8; n])
    }

    fn indexes(c: &TailCache, start: u64) -> Option<Vec<u64>> {
        c.from(start, None)
            .map(|e| e.into_iter().map(|(i, _)| i).collect())
    }

    #[test]
    fn it_keeps_the_newest_entries_within_its_bound() {
        let mut c = TailCache::new(100);
        for i in 1..=10 {
            c.push(i, v(30));
        }
        assert_eq!(indexes(&c, 8), Some(vec![8, 9, 10]));
        assert_eq!(indexes(&c, 7), None, "evicted: read from sled");
        assert_eq!(
            indexes(&c, 11),
            Some(vec![]),
            "past the end: nothing exists"
        );
        assert_eq!(
            c.from(8, Some(10)).map(|e| e.len()),
            Some(2),
            "the end is exclusive"
        );
    }

    #[test]
    fn truncation_purge_and_gaps_keep_it_a_suffix() {
        let mut c = TailCache::new(1 << 20);
        for i in 1..=10 {
            c.push(i, v(1));
        }
        c.truncate(8);
        assert_eq!(c.last().map(|(i, _)| i), Some(7));
        c.push(8, v(1));
        c.purge(3);
        assert_eq!(indexes(&c, 4), Some(vec![4, 5, 6, 7, 8]));
        assert_eq!(indexes(&c, 3), None);
        // An append that does not follow the last entry (a snapshot installed, say) empties it.
        c.push(20, v(1));
        assert_eq!(indexes(&c, 20), Some(vec![20]));
        assert_eq!(indexes(&c, 8), None);
        let mut off = TailCache::new(0);
        off.push(1, v(1));
        assert_eq!(indexes(&off, 1), None, "a cache of 0 bytes holds nothing");
    }
}
