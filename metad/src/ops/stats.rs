//! The one snapshot of a replica's figures: the gRPC `Stats` call, the `/status` document, the
//! gauges refreshed on a `/metrics` scrape and the periodic summary log all read it.

use crate::core::Core;
use crate::gate::Observed;
use crate::ops::{Member, Ops};

/// The store's figures, taken under one lock of the core.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Store {
    pub keys: u64,
    pub bytes_used: u64,
    pub bytes_total: u64,
    pub hard_pinned_bytes: u64,
    pub segments: u64,
    /// Replicated counters (the same on every replica).
    pub evicted_objects: u64,
    pub dead_node_dropped_objects: u64,
    pub expired_objects: u64,
    /// Leader memory (0 on a follower): reservations live and quarantined, quarantined ones,
    /// read leases.
    pub reservations: u64,
    pub quarantined: u64,
    pub leases: u64,
}

impl Store {
    pub fn of(core: &Core) -> Self {
        let sm = core.sm();
        let c = sm.counters();
        let (reservations, quarantined, leases) = core
            .leader()
            .map(|l| {
                (
                    l.reservations().len(),
                    l.reservations().quarantined(),
                    l.leases().len(),
                )
            })
            .unwrap_or((0, 0, 0));
        Self {
            keys: sm.key_count() as u64,
            bytes_used: sm.bytes_used(),
            bytes_total: sm.bytes_total(),
            hard_pinned_bytes: sm.hard_pinned_bytes(),
            segments: sm.segments().count() as u64,
            evicted_objects: c.evicted_objects,
            dead_node_dropped_objects: c.dead_node_dropped_objects,
            expired_objects: c.expired_objects,
            reservations: reservations as u64,
            quarantined: quarantined as u64,
            leases: leases as u64,
        }
    }
}

/// Raft's view, the members and the store, as one replica sees them now.
#[derive(Clone, Debug)]
pub struct Stats {
    pub id: u64,
    pub raft: Observed,
    pub members: Vec<Member>,
    pub store: Store,
}

impl Ops {
    /// The snapshot (no gate: every replica answers for itself; the gRPC `Stats` call checks
    /// leadership first).
    pub fn stats(&self) -> Stats {
        let raft = self.gate.observed();
        let members = self.members();
        let store = Store::of(&self.core.lock());
        Stats {
            id: self.id,
            raft,
            members,
            store,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::Command;
    use crate::config::{CacheConfig, Now};
    use crate::leader::{Heartbeat, PinKind, PutRequest};

    #[test]
    fn store_figures_follow_the_state_and_the_leader() {
        let now = Now {
            mono_ms: 1_000,
            wall_ms: 1_000,
        };
        let mut core = Core::new(CacheConfig::default());
        assert_eq!(Store::of(&core), Store::default());
        for n in ["a", "b"] {
            core.apply(
                &Command::MountSegment {
                    node_name: n.into(),
                    node_id_hint: 0,
                    capacity: 1 << 20,
                    data_addrs: vec![],
                    now_ms: 0,
                },
                now,
            );
        }
        core.become_leader(1, now);
        let segs: Vec<_> = core.sm().segments().map(|s| s.id).collect();
        let (l, sm) = core.leader_parts().unwrap();
        for segment in segs {
            l.heartbeat(
                sm,
                &Heartbeat {
                    segment,
                    ..Default::default()
                },
                now,
            );
        }
        let put = |key: &str, pin| PutRequest {
            key: key.into(),
            size: 4096,
            replicas: 2,
            pin,
            ..Default::default()
        };
        let committed = l.reserve(sm, &put("pinned", PinKind::Hard), now).unwrap();
        let _open = l.reserve(sm, &put("open", PinKind::None), now).unwrap();
        let aborted = l.reserve(sm, &put("aborted", PinKind::None), now).unwrap();
        l.abort(&[aborted.version]);
        let crate::leader::CommitStep::Propose(cmd) = l.commit(committed.version, 7, now).unwrap()
        else {
            panic!("a live reservation commits")
        };
        core.apply(&cmd, now);
        let s = Store::of(&core);
        assert_eq!(s.keys, 1);
        assert_eq!(s.segments, 2);
        assert_eq!(s.bytes_total, 2 << 20);
        assert_eq!(s.bytes_used, core.sm().bytes_used());
        assert!(s.bytes_used >= 2 * 4096);
        assert_eq!(s.hard_pinned_bytes, core.sm().hard_pinned_bytes());
        assert!(s.hard_pinned_bytes >= 2 * 4096);
        assert_eq!((s.reservations, s.quarantined, s.leases), (2, 1, 0));
        // A follower has no leader memory.
        core.step_down();
        let f = Store::of(&core);
        assert_eq!((f.reservations, f.quarantined, f.leases), (0, 0, 0));
        assert_eq!(f.keys, 1);
    }
}
