//! Where a new object's replicas go: distinct nodes; the requester's own node first when asked
//! (`prefer_local`), then the preferred segments in order, then the segments with the most free
//! space.

use std::collections::BTreeSet;

use crate::leader::shadow::Shadow;
use crate::state::StateMachine;
use crate::types::{NodeId, Replica, SegmentId};

/// The segments a put may go to, best first.
pub fn candidates(
    sm: &StateMachine,
    shadow: &Shadow,
    requester: NodeId,
    prefer_local: bool,
    preferred: &[String],
    alive: impl Fn(&SegmentId) -> bool,
) -> Vec<SegmentId> {
    let eligible: Vec<(SegmentId, u64)> = shadow
        .segments()
        .filter(|(id, s)| s.ready && !s.draining && s.alloc.capacity() > 0 && alive(id))
        .map(|(id, s)| (*id, s.alloc.free_bytes()))
        .collect();
    let mut order: Vec<SegmentId> = Vec::with_capacity(eligible.len());
    let push = |id: SegmentId, order: &mut Vec<SegmentId>| {
        if !order.contains(&id) {
            order.push(id);
        }
    };
    if prefer_local {
        if let Some((id, _)) = eligible.iter().find(|(id, _)| id.node == requester) {
            push(*id, &mut order);
        }
    }
    for name in preferred {
        if let Some(node) = sm.node_by_name(name) {
            if let Some((id, _)) = eligible.iter().find(|(id, _)| id.node == node) {
                push(*id, &mut order);
            }
        }
    }
    let mut rest = eligible.clone();
    rest.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    for (id, _) in rest {
        push(id, &mut order);
    }
    order
}

/// Allocates `count` replicas of `size` bytes on distinct nodes, trying `order` in turn. All or
/// nothing: on failure every extent taken is returned and None comes back.
pub fn allocate(
    shadow: &mut Shadow,
    order: &[SegmentId],
    size: u64,
    count: usize,
    max_extents: usize,
) -> Option<Vec<Replica>> {
    let mut got: Vec<Replica> = Vec::with_capacity(count);
    let mut nodes = BTreeSet::new();
    for id in order {
        if got.len() == count {
            break;
        }
        if nodes.contains(&id.node) {
            continue;
        }
        let Some(seg) = shadow.get_mut(id) else {
            continue;
        };
        if let Some(extents) = seg.alloc.alloc_fragmented(size, max_extents) {
            nodes.insert(id.node);
            got.push(Replica {
                segment: *id,
                extents,
            });
        }
    }
    if got.len() == count {
        return Some(got);
    }
    for r in &got {
        shadow.free(&r.segment, &r.extents);
    }
    None
}
