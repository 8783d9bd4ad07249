//! Offload to the disk tier (design §6 "Tiers", docs/ssd.md), leader memory only: which nodes
//! have a disk tier in service (from their heartbeats), the orders waiting for a node's next
//! heartbeat, and the keys ordered and not reported yet.
//!
//! Above `offload_watermark` of the pool in use, the least recently used objects with a
//! replica in the memory of a node with disks are ordered to that node; it copies them to a
//! disk and reports them (`DiskReport`), and the leader commits the move (`MoveToDisk`), which
//! frees their memory. Eviction (dropping) stays the fallback above its own, higher watermark.

use std::collections::{HashMap, HashSet};

use crate::objects::Cursor;
use crate::state::StateMachine;
use crate::types::{Extent, NodeId, Object, SegmentId, Version};

/// How long an order may stay unreported before its key may be ordered again.
pub const ORDER_TTL_MS: u64 = 30_000;
/// Orders handed to a node in one heartbeat reply, at most.
pub const ORDERS_PER_REPLY: usize = 4096;

/// A node's disk tier, as its last heartbeat reported it.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct DiskTier {
    pub disks: u32,
    pub capacity: u64,
    pub used: u64,
}

/// One object for a node to copy from its memory to its disk tier.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Order {
    pub key: String,
    pub version: Version,
    pub size: u64,
    pub checksum: u64,
    /// Its extents in the node's current segment.
    pub extents: Vec<Extent>,
}

#[derive(Default, Debug)]
pub struct Offloads {
    pub tiers: HashMap<NodeId, DiskTier>,
    queued: HashMap<NodeId, Vec<Order>>,
    /// Key → (node, when the order lapses, bytes).
    in_flight: HashMap<String, (NodeId, u64, u64)>,
    in_flight_bytes: u64,
    pub cursor: Cursor,
    /// Usage crossed the offload watermark and has not come down to the target yet.
    pub active: bool,
    /// Inventories being reported by restarted nodes (`DiskReport` with `inventory`).
    pub inventories: HashMap<NodeId, HashSet<(String, Version)>>,
}

impl Offloads {
    /// Notes a node's disk tier from its heartbeat (no disks in service: none).
    pub fn heard(&mut self, node: NodeId, tier: DiskTier) {
        if tier.disks == 0 {
            self.tiers.remove(&node);
            self.queued.remove(&node);
        } else {
            self.tiers.insert(node, tier);
        }
    }

    pub fn is_idle(&self) -> bool {
        self.tiers.is_empty()
    }

    pub fn is_ordered(&self, key: &str) -> bool {
        self.in_flight.contains_key(key)
    }

    /// Bytes ordered and not reported yet.
    pub fn in_flight_bytes(&self) -> u64 {
        self.in_flight_bytes
    }

    /// Orders past their time may be given again.
    pub fn expire(&mut self, now_ms: u64) {
        let mut freed = 0;
        self.in_flight.retain(|_, (_, until, b)| {
            let keep = *until > now_ms;
            if !keep {
                freed += *b;
            }
            keep
        });
        self.in_flight_bytes -= freed.min(self.in_flight_bytes);
    }

    /// The order for `key` was reported (done or not).
    pub fn reported(&mut self, key: &str) {
        if let Some((_, _, b)) = self.in_flight.remove(key) {
            self.in_flight_bytes -= b.min(self.in_flight_bytes);
        }
    }

    /// The memory segment of `o` that an order would empty: a piece on the current segment
    /// of a node with a disk tier, where the object has no disk replica yet.
    pub fn target(&self, sm: &StateMachine, o: &Object) -> Option<SegmentId> {
        o.replicas.pieces().iter().find_map(|p| {
            let seg = p.segment();
            let node = seg.node;
            let current = sm.node_segment(node).map(|s| s.id) == Some(seg);
            let has_disk = o.replicas.disk_on(node).is_some();
            (!p.is_disk() && current && !has_disk && self.tiers.contains_key(&node)).then_some(seg)
        })
    }

    /// Queues an order for `key` (an object of `sm`) to the node of its `target`.
    pub fn order(&mut self, sm: &StateMachine, key: &str, now_ms: u64) -> bool {
        let Some(o) = sm.object(key) else {
            return false;
        };
        let Some(seg) = self.target(sm, o) else {
            return false;
        };
        let extents: Vec<Extent> = o
            .replicas
            .pieces()
            .iter()
            .filter(|p| p.segment() == seg)
            .map(|p| p.extent())
            .collect();
        self.queued.entry(seg.node).or_default().push(Order {
            key: key.to_string(),
            version: o.version,
            size: o.size,
            checksum: o.checksum,
            extents,
        });
        self.in_flight
            .insert(key.to_string(), (seg.node, now_ms + ORDER_TTL_MS, o.size));
        self.in_flight_bytes += o.size;
        true
    }

    /// The orders for `node`'s heartbeat reply.
    pub fn take_orders(&mut self, node: NodeId) -> Vec<Order> {
        let Some(q) = self.queued.get_mut(&node) else {
            return Vec::new();
        };
        if q.len() <= ORDERS_PER_REPLY {
            return self.queued.remove(&node).unwrap_or_default();
        }
        q.drain(..ORDERS_PER_REPLY).collect()
    }

    /// Forgets everything of a node (its segment went away).
    pub fn forget_node(&mut self, node: NodeId) {
        self.tiers.remove(&node);
        self.queued.remove(&node);
        let mut freed = 0;
        self.in_flight.retain(|_, (n, _, b)| {
            let keep = *n != node;
            if !keep {
                freed += *b;
            }
            keep
        });
        self.in_flight_bytes -= freed.min(self.in_flight_bytes);
    }
}
