//! Node liveness from heartbeats (design §6). A new leader starts every timer at its election;
//! a leader whose own quorum lease lapsed (it was stalled or cut off) restarts every timer when it
//! regains it, so it declares no node dead before it has heard a full `node_ttl`.

use std::collections::{BTreeMap, BTreeSet};

use crate::types::SegmentId;

#[derive(Debug, Default)]
pub struct Liveness {
    last_heard: BTreeMap<SegmentId, u64>,
    /// No timer is older than this (the election, or the end of a stall).
    epoch_ms: u64,
    stalled: bool,
    /// Dead declarations proposed and not yet applied: segment → when proposed.
    proposed: BTreeMap<SegmentId, u64>,
}

impl Liveness {
    pub fn start(now_ms: u64) -> Self {
        Self {
            epoch_ms: now_ms,
            ..Default::default()
        }
    }

    pub fn heard(&mut self, seg: SegmentId, now_ms: u64) {
        self.last_heard.insert(seg, now_ms);
    }

    pub fn forget(&mut self, seg: &SegmentId) {
        self.last_heard.remove(seg);
        self.proposed.remove(seg);
    }

    /// Milliseconds since the segment was last heard (or since the epoch).
    pub fn silence_ms(&self, seg: &SegmentId, now_ms: u64) -> u64 {
        let heard = self
            .last_heard
            .get(seg)
            .copied()
            .unwrap_or(0)
            .max(self.epoch_ms);
        now_ms.saturating_sub(heard)
    }

    /// Called on every tick with whether this leader currently holds its quorum lease.
    pub fn observe_lease(&mut self, lease_ok: bool, now_ms: u64) {
        if !lease_ok {
            self.stalled = true;
        } else if self.stalled {
            self.stalled = false;
            self.epoch_ms = now_ms;
        }
    }

    /// Segments (among `mounted`) silent for longer than `ttl_ms`, not already proposed in the
    /// last `retry_ms`; marks them proposed.
    pub fn due(
        &mut self,
        mounted: &BTreeSet<SegmentId>,
        now_ms: u64,
        ttl_ms: u64,
        retry_ms: u64,
    ) -> Vec<SegmentId> {
        if self.stalled {
            return Vec::new();
        }
        let mut out = Vec::new();
        for seg in mounted {
            if self.silence_ms(seg, now_ms) <= ttl_ms {
                continue;
            }
            if self
                .proposed
                .get(seg)
                .is_some_and(|t| now_ms < t.saturating_add(retry_ms))
            {
                continue;
            }
            self.proposed.insert(*seg, now_ms);
            out.push(*seg);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timers_start_at_election_and_restart_after_a_stall() {
        let seg = SegmentId {
            node: 1,
            generation: 1,
        };
        let mounted: BTreeSet<_> = [seg].into();
        let mut l = Liveness::start(1_000);
        assert!(
            l.due(&mounted, 10_999, 10_000, 2_000).is_empty(),
            "not a full ttl since election"
        );
        l.observe_lease(false, 11_000);
        assert!(
            l.due(&mounted, 11_500, 10_000, 2_000).is_empty(),
            "stalled leaders declare nobody dead"
        );
        l.observe_lease(true, 12_000);
        assert!(
            l.due(&mounted, 21_000, 10_000, 2_000).is_empty(),
            "timers restarted at 12 000"
        );
        assert_eq!(l.due(&mounted, 22_001, 10_000, 2_000), vec![seg]);
        assert!(
            l.due(&mounted, 22_500, 10_000, 2_000).is_empty(),
            "not re-proposed at once"
        );
        l.heard(seg, 23_000);
        assert!(l.due(&mounted, 30_000, 10_000, 2_000).is_empty());
    }
}
