//! The shadow allocator: per segment, the state machine's free space minus everything the leader
//! holds (live and quarantined reservations, extents waiting for read leases to end).
//!
//! It is built from the state machine once the new leader has applied its term's first entry,
//! and then follows every apply through effects. A segment takes no placement until its sidecar
//! has heartbeated to this leader (`ready`), unless it was mounted in this term.

use std::collections::BTreeMap;

use crate::alloc::RangeAlloc;
use crate::state::StateMachine;
use crate::types::{Extent, SegmentId, SegmentState};

#[derive(Clone, Debug)]
pub struct ShadowSegment {
    pub alloc: RangeAlloc,
    pub ready: bool,
    pub draining: bool,
}

#[derive(Clone, Debug, Default)]
pub struct Shadow {
    segs: BTreeMap<SegmentId, ShadowSegment>,
}

impl Shadow {
    /// Copies the state machine's free space; no segment is ready yet.
    pub fn build(sm: &StateMachine) -> Self {
        let mut segs = BTreeMap::new();
        for s in sm.segments() {
            if let Some(free) = sm.free_space(&s.id) {
                segs.insert(
                    s.id,
                    ShadowSegment {
                        alloc: free.clone(),
                        ready: false,
                        draining: matches!(s.state, SegmentState::Draining { .. }),
                    },
                );
            }
        }
        Self { segs }
    }

    /// Sets every segment's free space to the state machine's less `held` (keeping whether it
    /// is ready or draining).
    pub fn reset_to(&mut self, sm: &StateMachine, held: &[(SegmentId, Extent)]) {
        for (id, s) in self.segs.iter_mut() {
            if let Some(free) = sm.free_space(id) {
                s.alloc = free.clone();
            }
        }
        for (id, e) in held {
            self.take_overlapping(id, e);
        }
    }

    pub fn add_segment(&mut self, id: SegmentId, capacity: u64, ready: bool) {
        self.segs.insert(
            id,
            ShadowSegment {
                alloc: RangeAlloc::new(capacity),
                ready,
                draining: false,
            },
        );
    }

    pub fn remove_segment(&mut self, id: &SegmentId) {
        self.segs.remove(id);
    }

    pub fn get(&self, id: &SegmentId) -> Option<&ShadowSegment> {
        self.segs.get(id)
    }

    pub fn get_mut(&mut self, id: &SegmentId) -> Option<&mut ShadowSegment> {
        self.segs.get_mut(id)
    }

    pub fn segments(&self) -> impl Iterator<Item = (&SegmentId, &ShadowSegment)> {
        self.segs.iter()
    }

    pub fn set_ready(&mut self, id: &SegmentId) {
        if let Some(s) = self.segs.get_mut(id) {
            s.ready = true;
        }
    }

    pub fn set_draining(&mut self, id: &SegmentId) {
        if let Some(s) = self.segs.get_mut(id) {
            s.draining = true;
        }
    }

    /// Returns extents to free space. A byte that is already free is a bookkeeping bug: it is
    /// logged and skipped rather than double-freed.
    pub fn free(&mut self, id: &SegmentId, extents: &[Extent]) {
        let Some(s) = self.segs.get_mut(id) else {
            return;
        };
        for e in extents {
            if !s.alloc.free(e) {
                tracing::error!(segment = %id, ?e, "shadow allocator: extent already free; skipped");
            }
        }
    }

    /// Marks as held whatever part of `e` is free.
    pub fn take_overlapping(&mut self, id: &SegmentId, e: &Extent) -> Vec<Extent> {
        match self.segs.get_mut(id) {
            Some(s) => s.alloc.take_overlapping(e),
            None => Vec::new(),
        }
    }

    /// Capacity and free bytes of the segments that take placements.
    pub fn usage(&self) -> (u64, u64) {
        self.segs
            .values()
            .filter(|s| !s.draining)
            .fold((0, 0), |(t, f), s| {
                (t + s.alloc.capacity(), f + s.alloc.free_bytes())
            })
    }
}
