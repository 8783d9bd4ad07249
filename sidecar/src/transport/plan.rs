//! The sans-I/O half of striping: cutting a transfer into slices, ordering NIC pairs, per-pair
//! back-off, and the per-transfer bookkeeping of which slices are pending, done or retried.
//! Everything here is plain data and plain methods, tested without a runtime; the driver in
//! [`super::stripe`] only adds I/O.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use regolith_proto::checksum::CHUNK;

use super::NicPair;

/// One slice of a transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slice {
    pub index: usize,
    /// Offset of the slice within the transfer (add the transfer's segment offset).
    pub start: u64,
    pub len: u32,
    /// Index of the slice's first checksum chunk within the transfer.
    pub first_chunk: usize,
    pub chunks: usize,
}

/// Cuts `len` bytes into slices of `slice_size` bytes (the last one may be short).
/// `slice_size` must be a positive multiple of [`CHUNK`] so no chunk straddles two slices.
pub fn plan_slices(len: u64, slice_size: u32) -> Vec<Slice> {
    assert!(
        slice_size > 0 && slice_size as usize % CHUNK == 0,
        "slice size {slice_size} is not a positive multiple of the checksum chunk"
    );
    let step = u64::from(slice_size);
    let n = len.div_ceil(step) as usize;
    (0..n)
        .map(|index| {
            let start = index as u64 * step;
            let this = (len - start).min(step) as u32;
            Slice {
                index,
                start,
                len: this,
                first_chunk: (start / CHUNK as u64) as usize,
                chunks: (this as usize).div_ceil(CHUNK),
            }
        })
        .collect()
}

/// Every (local NIC, remote NIC) pair, ordered so that any prefix spreads over as many distinct
/// local and remote NICs as possible: pair k of "diagonal" d uses local l and remote (l + d) % R.
/// No local NICs means one unbound local side (the kernel picks the route).
pub fn nic_pairs(local: &[IpAddr], remote: &[SocketAddr]) -> Vec<NicPair> {
    let locals: Vec<Option<IpAddr>> = if local.is_empty() {
        vec![None]
    } else {
        local.iter().copied().map(Some).collect()
    };
    let r = remote.len();
    let mut out = Vec::with_capacity(locals.len() * r);
    for d in 0..r {
        for (l, ip) in locals.iter().enumerate() {
            out.push(NicPair {
                local: *ip,
                remote: remote[(l + d) % r],
            });
        }
    }
    out
}

/// Back-off before re-dialling a pair after `failures` consecutive failures. The first failure
/// re-dials at once: it is usually a pooled connection the peer had closed, not a dead NIC.
pub fn backoff(failures: u32, base: Duration, cap: Duration) -> Duration {
    match failures {
        0 | 1 => Duration::ZERO,
        n => base.saturating_mul(1u32 << (n - 2).min(16)).min(cap),
    }
}

/// Health of one NIC pair towards one peer, kept across transfers.
#[derive(Clone, Copy, Debug, Default)]
pub struct PairHealth {
    pub consecutive_failures: u32,
    pub retry_at: Option<Instant>,
}

impl PairHealth {
    pub fn usable(&self, now: Instant) -> bool {
        self.retry_at.is_none_or(|t| now >= t)
    }

    pub fn on_failure(&mut self, now: Instant, base: Duration, cap: Duration) {
        self.consecutive_failures = self.consecutive_failures.saturating_add(1);
        let wait = backoff(self.consecutive_failures, base, cap);
        self.retry_at = (!wait.is_zero()).then(|| now + wait);
    }

    pub fn on_success(&mut self) {
        *self = Self::default();
    }
}

/// Chooses the pair for a new connection: among pairs not given up on in this transfer, a
/// healthy one carrying the fewest lanes (earlier pairs first, following [`nic_pairs`] order).
/// When none is healthy and `desperate` (nothing else is in flight), the pair whose back-off
/// ends first: a transfer with no other way forward probes it rather than wait.
pub fn pick_pair(
    health: &[PairHealth],
    lanes: &[usize],
    given_up: &[bool],
    now: Instant,
    desperate: bool,
    first: usize,
) -> Option<usize> {
    let n = health.len().max(1);
    // Ties go to the pair nearest `first` (in rotation): callers rotate it per transfer, so
    // the dials of many one-slice transfers spread over every pair instead of all landing on
    // pair 0 (where the pool, capped per pair, would drop them again at check-in).
    let rank = |p: usize| (p + n - first % n) % n;
    let alive = (0..health.len()).filter(|&p| !given_up[p]);
    let healthy = alive
        .clone()
        .filter(|&p| health[p].usable(now))
        .min_by_key(|&p| (lanes[p], rank(p)));
    if healthy.is_some() || !desperate {
        return healthy;
    }
    alive.min_by_key(|&p| (health[p].retry_at, rank(p)))
}

/// Why a transfer's schedule gave up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetriesExhausted {
    pub slice: usize,
    pub attempts: u32,
}

/// Per-transfer slice bookkeeping.
#[derive(Debug)]
pub struct Schedule {
    pending: VecDeque<usize>,
    attempts: Vec<u32>,
    done: usize,
    max_attempts: u32,
    retries: u32,
}

impl Schedule {
    pub fn new(slices: usize, max_attempts: u32) -> Self {
        Self {
            pending: (0..slices).collect(),
            attempts: vec![0; slices],
            done: 0,
            max_attempts: max_attempts.max(1),
            retries: 0,
        }
    }

    /// The next slice to send, counting the attempt.
    pub fn next_slice(&mut self) -> Option<usize> {
        let i = self.pending.pop_front()?;
        self.attempts[i] += 1;
        Some(i)
    }

    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    pub fn complete(&mut self, _slice: usize) {
        self.done += 1;
    }

    /// A slice's connection failed: queue it again (first, so it is not starved behind fresh
    /// slices) unless it has used up its attempts.
    pub fn failed(&mut self, slice: usize) -> Result<(), RetriesExhausted> {
        if self.attempts[slice] >= self.max_attempts {
            return Err(RetriesExhausted {
                slice,
                attempts: self.attempts[slice],
            });
        }
        self.retries += 1;
        self.pending.push_front(slice);
        Ok(())
    }

    pub fn is_done(&self) -> bool {
        self.done == self.attempts.len()
    }

    /// Slices not yet completed (pending or in flight).
    pub fn remaining(&self) -> usize {
        self.attempts.len() - self.done
    }

    pub fn retries(&self) -> u32 {
        self.retries
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u32 = 1 << 20;

    #[test]
    fn slices_cover_the_transfer_on_chunk_boundaries() {
        let len = 5 * u64::from(MIB) + 1234;
        let s = plan_slices(len, MIB);
        assert_eq!(s.len(), 6);
        assert_eq!(s.iter().map(|x| u64::from(x.len)).sum::<u64>(), len);
        assert_eq!(s[5].len, 1234);
        assert_eq!(s[5].first_chunk, 5 * 16);
        assert_eq!(s[5].chunks, 1);
        assert_eq!(s[1].start, u64::from(MIB));
        let total_chunks: usize = s.iter().map(|x| x.chunks).sum();
        assert_eq!(total_chunks, regolith_proto::checksum::chunk_count(len));
        assert!(plan_slices(0, MIB).is_empty());
    }

    #[test]
    #[should_panic]
    fn slice_size_must_be_chunk_multiple() {
        plan_slices(10, 1000);
    }

    #[test]
    fn pairs_spread_over_nics_first() {
        let l: Vec<IpAddr> = vec!["10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap()];
        let r: Vec<SocketAddr> = vec!["10.1.0.1:1".parse().unwrap(), "10.1.0.2:1".parse().unwrap()];
        let p = nic_pairs(&l, &r);
        assert_eq!(p.len(), 4);
        // The first two pairs already use both local and both remote NICs.
        assert_ne!(p[0].local, p[1].local);
        assert_ne!(p[0].remote, p[1].remote);
        let mut all: Vec<_> = p.iter().map(|x| (x.local, x.remote)).collect();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 4);
        let unbound = nic_pairs(&[], &r);
        assert_eq!(unbound.len(), 2);
        assert!(unbound.iter().all(|x| x.local.is_none()));
        // More local than remote NICs.
        let l3: Vec<IpAddr> = (1..=3)
            .map(|i| format!("10.0.0.{i}").parse().unwrap())
            .collect();
        assert_eq!(nic_pairs(&l3, &r[..1]).len(), 3);
    }

    #[test]
    fn backoff_grows_and_caps() {
        let b = Duration::from_millis(100);
        let c = Duration::from_secs(5);
        assert_eq!(backoff(1, b, c), Duration::ZERO);
        assert_eq!(backoff(2, b, c), b);
        assert_eq!(backoff(3, b, c), 2 * b);
        assert_eq!(backoff(40, b, c), c);
    }

    #[test]
    fn pair_choice_prefers_healthy_and_least_loaded() {
        let now = Instant::now();
        let b = Duration::from_millis(100);
        let c = Duration::from_secs(5);
        let mut h = vec![PairHealth::default(); 3];
        let lanes = [2, 1, 1];
        let none = [false; 3];
        assert_eq!(pick_pair(&h, &lanes, &none, now, false, 0), Some(1));
        h[1].on_failure(now, b, c);
        assert!(h[1].usable(now), "first failure re-dials at once");
        h[1].on_failure(now, b, c);
        assert!(!h[1].usable(now));
        assert!(h[1].usable(now + b));
        assert_eq!(pick_pair(&h, &lanes, &none, now, false, 0), Some(2));
        assert_eq!(
            pick_pair(&h, &lanes, &[false, false, true], now, false, 0),
            Some(0)
        );
        // All backed off: only a desperate transfer probes, the soonest first.
        let mut all = vec![PairHealth::default(); 2];
        for _ in 0..3 {
            all[0].on_failure(now, b, c);
        }
        for _ in 0..2 {
            all[1].on_failure(now, b, c);
        }
        assert_eq!(pick_pair(&all, &[0, 0], &[false; 2], now, false, 0), None);
        assert_eq!(pick_pair(&all, &[0, 0], &[false; 2], now, true, 0), Some(1));
        assert_eq!(pick_pair(&all, &[0, 0], &[true; 2], now, true, 0), None);
        all[0].on_success();
        assert!(all[0].usable(now));
    }

    #[test]
    fn ties_between_pairs_rotate_with_the_transfer() {
        let now = Instant::now();
        let fresh = vec![PairHealth::default(); 3];
        let picks: Vec<_> = (0..4)
            .map(|f| pick_pair(&fresh, &[0, 0, 0], &[false; 3], now, false, f))
            .collect();
        assert_eq!(picks, vec![Some(0), Some(1), Some(2), Some(0)]);
        assert_eq!(
            pick_pair(&fresh, &[1, 0, 1], &[false; 3], now, false, 2),
            Some(1),
            "the fewest lanes first, whatever the rotation"
        );
    }

    #[test]
    fn schedule_retries_then_gives_up() {
        let mut s = Schedule::new(3, 2);
        let a = s.next_slice().unwrap();
        let b = s.next_slice().unwrap();
        s.complete(a);
        s.failed(b).unwrap();
        assert_eq!(s.next_slice(), Some(b), "a retried slice goes first");
        assert_eq!(
            s.failed(b),
            Err(RetriesExhausted {
                slice: b,
                attempts: 2
            })
        );
        let c = s.next_slice().unwrap();
        s.complete(c);
        assert_eq!(s.remaining(), 1);
        assert!(!s.is_done());
        assert_eq!(s.retries(), 1);
        let mut t = Schedule::new(1, 3);
        let x = t.next_slice().unwrap();
        t.complete(x);
        assert!(t.is_done() && !t.has_pending());
    }
}
