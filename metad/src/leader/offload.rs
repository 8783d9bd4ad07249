//! Offload to the disk tier (design §6 "Tiers", docs/ssd.md), leader memory only: which nodes
//! have a disk tier in service (from their heartbeats), the orders waiting for a node's next
//! heartbeat, and the keys ordered and not reported yet.
//!
//! Above `offload_watermark` of the pool in use, the least recently used objects with a
//! replica in the memory of a node with disks are ordered to that node; it copies them to a
//! disk and reports them (`DiskReport`), and the leader commits the move (`MoveToDisk`), which
//! frees their memory. Eviction (dropping) stays the fallback above its own, higher watermark.
//! An object that already has a copy on that node's disk (write-through, or promoted back to
//! memory) needs no copy: its memory is freed by a `MoveToDisk` the leader proposes itself.
//!
//! Promotion (the way back): a get of an object held only on disk, with room in the pool,
//! reserves memory on the disk's node and orders the node to copy the record there; the
//! node reports it and the leader commits `PromoteToMemory` through the reservation.
//! Write-through: each committed put is ordered copied to the disk tiers of the nodes that
//! hold it in memory (`copy` orders; committed as `CopyToDisk`).

use std::collections::{HashMap, HashSet};

use crate::command::DiskMove;
use crate::objects::Cursor;
use crate::state::StateMachine;
use crate::types::{Extent, NodeId, Object, SegmentId, Version};

/// How long an order may stay unreported before its key may be ordered again.
pub const ORDER_TTL_MS: u64 = 30_000;
/// How long an order the node could not carry out waits before its key is ordered again.
pub const FAILED_BACKOFF_MS: u64 = 30_000;
/// Orders handed to a node in one heartbeat reply, at most.
pub const ORDERS_PER_REPLY: usize = 4096;

/// A node's disk tier, as its last heartbeat reported it.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct DiskTier {
    pub disks: u32,
    pub capacity: u64,
    pub used: u64,
    /// The largest object its disks can hold (0: not said).
    pub max_object: u64,
}

impl DiskTier {
    fn holds(&self, size: u64) -> bool {
        self.max_object == 0 || size <= self.max_object
    }
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
    /// Write-through: copy to disk and keep the memory replica.
    pub copy: bool,
}

/// One disk-only object for its node to copy back into memory, at a reservation's extents.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Promotion {
    pub key: String,
    pub version: Version,
    pub size: u64,
    pub checksum: u64,
    pub disk: u32,
    pub reservation: Version,
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
    /// Objects with a disk copy on the node whose memory is to be freed: the leader proposes
    /// these moves itself (nothing to copy).
    frees: HashMap<NodeId, Vec<DiskMove>>,
    /// Promotions waiting for the node's next heartbeat or report.
    promotions: HashMap<NodeId, Vec<Promotion>>,
    /// Key → the reservation of its promotion in progress.
    promoting: HashMap<String, Version>,
    /// Keys whose last order failed → when they may be ordered again (an order that cannot
    /// succeed, say an object larger than any disk, is not given again every tick).
    backoff: HashMap<String, u64>,
}

impl Offloads {
    /// Notes a node's disk tier from its heartbeat (no disks in service: none).
    pub fn heard(&mut self, node: NodeId, tier: DiskTier) {
        if tier.disks == 0 {
            self.tiers.remove(&node);
            self.queued.remove(&node);
            self.frees.remove(&node);
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

    /// Bytes ordered whose move has not been applied yet (nor failed).
    pub fn in_flight_bytes(&self) -> u64 {
        self.in_flight_bytes
    }

    /// The order for `key` was not carried out: it is not given again for a while.
    pub fn failed(&mut self, key: &str, now_ms: u64) {
        self.reported(key);
        self.backoff
            .insert(key.to_string(), now_ms.saturating_add(FAILED_BACKOFF_MS));
    }

    /// A node's report, noted before its moves are proposed: the failed orders back off; the
    /// moves done stay in flight until their `MoveToDisk` applies ([`Offloads::reported`]).
    pub fn on_report(&mut self, failed: &[String], now_ms: u64) {
        for k in failed {
            self.failed(k, now_ms);
        }
    }

    /// Whether `key` may not be ordered yet (its last order failed recently).
    pub fn backing_off(&self, key: &str, now_ms: u64) -> bool {
        self.backoff.get(key).is_some_and(|t| *t > now_ms)
    }

    /// Orders past their time may be given again.
    pub fn expire(&mut self, now_ms: u64) {
        self.backoff.retain(|_, t| *t > now_ms);
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

    /// The order for `key` ended: its move was applied (which frees its memory in the same
    /// step) or it failed. A move the node reported done stays in flight until then: between
    /// the report and the commit the memory is still in use, and counting it free would order
    /// the same bytes a second time (the pool then falls far below the offload target, and
    /// the disks evict what they took first).
    pub fn reported(&mut self, key: &str) {
        if let Some((_, _, b)) = self.in_flight.remove(key) {
            self.in_flight_bytes -= b.min(self.in_flight_bytes);
        }
    }

    /// The memory segment of `o` that an offload would empty: a piece on the current segment
    /// of a node with a disk tier (copied to its disk first unless a copy is there already).
    pub fn target(&self, sm: &StateMachine, o: &Object) -> Option<SegmentId> {
        o.replicas.pieces().iter().find_map(|p| {
            let seg = p.segment();
            let node = seg.node;
            let current = sm.node_segment(node).map(|s| s.id) == Some(seg);
            let fits = self.tiers.get(&node).is_some_and(|t| t.holds(o.size))
                || o.replicas.disk_on(node).is_some();
            (!p.is_disk() && current && fits).then_some(seg)
        })
    }

    /// Offloads `key` (an object of `sm`) from the memory of its `target`'s node: an order to
    /// copy it, or, when the node's disk holds it already, a move for the leader to propose.
    pub fn order(&mut self, sm: &StateMachine, key: &str, now_ms: u64) -> bool {
        let Some(o) = sm.object(key) else {
            return false;
        };
        let Some(seg) = self.target(sm, o) else {
            return false;
        };
        match o.replicas.disk_on(seg.node) {
            Some(disk) => self.frees.entry(seg.node).or_default().push(DiskMove {
                key: key.to_string(),
                version: o.version,
                disk,
            }),
            None => self
                .queued
                .entry(seg.node)
                .or_default()
                .push(copy_order(key, o, seg, false)),
        }
        self.in_flight
            .insert(key.to_string(), (seg.node, now_ms + ORDER_TTL_MS, o.size));
        self.in_flight_bytes += o.size;
        true
    }

    /// Write-through: orders `key` copied to the disk tier of every node that holds it in
    /// memory and has disks (no disk copy there yet). Not counted as bytes in flight: a copy
    /// frees no memory.
    pub fn order_copies(&mut self, sm: &StateMachine, key: &str) -> usize {
        let Some(o) = sm.object(key) else {
            return 0;
        };
        let segs: Vec<SegmentId> = o
            .replicas
            .segments()
            .filter(|s| {
                !s.is_disk()
                    && self.tiers.get(&s.node).is_some_and(|t| t.holds(o.size))
                    && o.replicas.disk_on(s.node).is_none()
            })
            .collect();
        for seg in &segs {
            self.queued
                .entry(seg.node)
                .or_default()
                .push(copy_order(key, o, *seg, true));
        }
        segs.len()
    }

    /// The moves of objects already on disk, per node, for the leader to propose.
    pub fn take_frees(&mut self) -> Vec<(NodeId, Vec<DiskMove>)> {
        self.frees.drain().collect()
    }

    /// Whether a promotion of `key` is waiting or in progress under a reservation that
    /// `live` says is still live.
    pub fn is_promoting(&self, key: &str, live: impl Fn(&Version) -> bool) -> bool {
        self.promoting.get(key).is_some_and(live)
    }

    /// Queues a promotion for its node.
    pub fn promote(&mut self, node: NodeId, p: Promotion) {
        self.promoting.insert(p.key.clone(), p.reservation);
        self.promotions.entry(node).or_default().push(p);
    }

    /// The promotion under `reservation` ended (committed or refused).
    pub fn promotion_ended(&mut self, key: &str, reservation: &Version) {
        if self.promoting.get(key) == Some(reservation) {
            self.promoting.remove(key);
        }
    }

    /// Forgets promotions whose reservations `live` no longer finds.
    pub fn forget_dead_promotions(&mut self, live: impl Fn(&Version) -> bool) {
        self.promoting.retain(|_, v| live(v));
        for q in self.promotions.values_mut() {
            q.retain(|p| live(&p.reservation));
        }
        self.promotions.retain(|_, q| !q.is_empty());
    }

    /// The promotions for `node`'s heartbeat reply or report answer.
    pub fn take_promotions(&mut self, node: NodeId) -> Vec<Promotion> {
        self.promotions.remove(&node).unwrap_or_default()
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
        self.frees.remove(&node);
        self.promotions.remove(&node);
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

/// An order for `key` (object `o`) to copy its replica on `seg` to the node's disk.
fn copy_order(key: &str, o: &Object, seg: SegmentId, copy: bool) -> Order {
    Order {
        key: key.to_string(),
        version: o.version,
        size: o.size,
        checksum: o.checksum,
        extents: o
            .replicas
            .pieces()
            .iter()
            .filter(|p| p.segment() == seg)
            .map(|p| p.extent())
            .collect(),
        copy,
    }
}
