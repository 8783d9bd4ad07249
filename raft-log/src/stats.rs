//! Storage counters, kept in atomics so that the I/O paths never take a lock to count.
//!
//! The application holds an `Arc<StorageStats>` (from [`crate::SledLogStore::stats`] or
//! [`crate::SledStateMachine::stats`]) and exports the values as Prometheus metrics. Counters only
//! grow; `last_snapshot_bytes` is a gauge. [`StorageStats::flush_latency`] returns a cumulative
//! histogram in the shape Prometheus expects (`le` bounds in seconds, plus sum and count).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the flush-latency histogram buckets, in microseconds. Chosen around the ~4 ms
/// fsync of the target machines: the interesting question is "one fsync or several".
const FLUSH_BUCKETS_US: [u64; 10] = [
    250, 500, 1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 64_000, 128_000,
];

/// Counters of the log store and the state machine's snapshots.
#[derive(Debug, Default)]
pub struct StorageStats {
    fsyncs: AtomicU64,
    fsync_errors: AtomicU64,
    append_batches: AtomicU64,
    appended_entries: AtomicU64,
    appended_bytes: AtomicU64,
    durable_callbacks: AtomicU64,
    flush_latency_us_sum: AtomicU64,
    /// One counter per bucket of `FLUSH_BUCKETS_US`, plus one for "slower than the last bound".
    flush_latency_buckets: [AtomicU64; FLUSH_BUCKETS_US.len() + 1],
    snapshot_builds: AtomicU64,
    snapshot_installs: AtomicU64,
    last_snapshot_bytes: AtomicU64,
    committed_index: AtomicU64,
}

/// A cumulative latency histogram, ready to be exported as a Prometheus histogram.
#[derive(Debug, Clone, PartialEq)]
pub struct LatencyHistogram {
    /// `(upper bound in seconds, number of observations <= bound)`, ascending; the last bound is
    /// `f64::INFINITY` and its count equals `count`.
    pub buckets: Vec<(f64, u64)>,
    /// Sum of all observations, in seconds.
    pub sum_seconds: f64,
    /// Number of observations.
    pub count: u64,
}

impl StorageStats {
    /// Number of `fsync`s (sled flushes) issued, successful or not.
    pub fn fsyncs(&self) -> u64 {
        self.fsyncs.load(Ordering::Relaxed)
    }

    /// Number of flushes that failed.
    pub fn fsync_errors(&self) -> u64 {
        self.fsync_errors.load(Ordering::Relaxed)
    }

    /// Number of `append` calls (each is one sled batch).
    pub fn append_batches(&self) -> u64 {
        self.append_batches.load(Ordering::Relaxed)
    }

    /// Number of log entries appended.
    pub fn appended_entries(&self) -> u64 {
        self.appended_entries.load(Ordering::Relaxed)
    }

    /// Encoded bytes of the log entries appended.
    pub fn appended_bytes(&self) -> u64 {
        self.appended_bytes.load(Ordering::Relaxed)
    }

    /// Number of durability waiters (append callbacks, vote saves, truncations) completed by a
    /// flush. `durable_callbacks / fsyncs` is the average group-commit size.
    pub fn durable_callbacks(&self) -> u64 {
        self.durable_callbacks.load(Ordering::Relaxed)
    }

    /// Number of snapshots built by this node.
    pub fn snapshot_builds(&self) -> u64 {
        self.snapshot_builds.load(Ordering::Relaxed)
    }

    /// Number of snapshots received from a leader and installed.
    pub fn snapshot_installs(&self) -> u64 {
        self.snapshot_installs.load(Ordering::Relaxed)
    }

    /// Size in bytes of the newest snapshot file (built, installed or loaded at open).
    pub fn last_snapshot_bytes(&self) -> u64 {
        self.last_snapshot_bytes.load(Ordering::Relaxed)
    }

    /// The flush latency histogram.
    pub fn flush_latency(&self) -> LatencyHistogram {
        let mut cumulative = 0;
        let mut buckets = Vec::with_capacity(self.flush_latency_buckets.len());
        for (i, counter) in self.flush_latency_buckets.iter().enumerate() {
            cumulative += counter.load(Ordering::Relaxed);
            let bound = FLUSH_BUCKETS_US
                .get(i)
                .map_or(f64::INFINITY, |us| *us as f64 / 1e6);
            buckets.push((bound, cumulative));
        }
        LatencyHistogram {
            buckets,
            sum_seconds: self.flush_latency_us_sum.load(Ordering::Relaxed) as f64 / 1e6,
            count: cumulative,
        }
    }

    /// Index of the last entry openraft reported committed (0 before any).
    pub fn committed_index(&self) -> u64 {
        self.committed_index.load(Ordering::Relaxed)
    }

    pub(crate) fn record_committed(&self, index: u64) {
        self.committed_index.store(index, Ordering::Relaxed);
    }

    pub(crate) fn record_append(&self, entries: u64, bytes: u64) {
        self.append_batches.fetch_add(1, Ordering::Relaxed);
        self.appended_entries.fetch_add(entries, Ordering::Relaxed);
        self.appended_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(crate) fn record_flush(&self, took: Duration, ok: bool, waiters: u64) {
        self.fsyncs.fetch_add(1, Ordering::Relaxed);
        if !ok {
            self.fsync_errors.fetch_add(1, Ordering::Relaxed);
        }
        self.durable_callbacks.fetch_add(waiters, Ordering::Relaxed);
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.flush_latency_us_sum.fetch_add(us, Ordering::Relaxed);
        let bucket = FLUSH_BUCKETS_US
            .iter()
            .position(|bound| us <= *bound)
            .unwrap_or(FLUSH_BUCKETS_US.len());
        self.flush_latency_buckets[bucket].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn record_snapshot_build(&self, bytes: u64) {
        self.snapshot_builds.fetch_add(1, Ordering::Relaxed);
        self.set_last_snapshot_bytes(bytes);
    }

    pub(crate) fn record_snapshot_install(&self, bytes: u64) {
        self.snapshot_installs.fetch_add(1, Ordering::Relaxed);
        self.set_last_snapshot_bytes(bytes);
    }

    pub(crate) fn set_last_snapshot_bytes(&self, bytes: u64) {
        self.last_snapshot_bytes.store(bytes, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative_and_ends_at_infinity() {
        let stats = StorageStats::default();
        stats.record_flush(Duration::from_micros(100), true, 3);
        stats.record_flush(Duration::from_millis(3), true, 1);
        stats.record_flush(Duration::from_secs(1), false, 2);

        let h = stats.flush_latency();
        assert_eq!(h.count, 3);
        assert_eq!(h.buckets.first(), Some(&(0.00025, 1)));
        assert_eq!(h.buckets.last(), Some(&(f64::INFINITY, 3)));
        let le_4ms = h.buckets.iter().find(|(le, _)| *le == 0.004).map(|b| b.1);
        assert_eq!(le_4ms, Some(2));
        assert!((h.sum_seconds - 1.0031).abs() < 1e-9);
        assert_eq!(stats.fsyncs(), 3);
        assert_eq!(stats.fsync_errors(), 1);
        assert_eq!(stats.durable_callbacks(), 6);
    }
}
