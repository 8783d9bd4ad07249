//! The replicated state machine (design §3): segments, objects and the HTTP-metadata KV.
//!
//! `apply` is a pure function of the state and the command: no clock, no randomness, no I/O.
//! Every change that the leader's in-memory bookkeeping must follow (an object's extents freed,
//! a reservation committed or rejected, a segment mounted or unmounted) is reported as an
//! [`Effect`].
//!
//! Snapshot format (version 1), all bincode 1.3 in its default configuration:
//! `magic "RGSM" | u32 version | Header | (key, Object) × header.objects | (key, value) ×
//! header.meta_entries`. Objects stream one by one, so neither writing nor reading holds the
//! snapshot in memory. Free space is not stored: restore recomputes it from the objects, which
//! also checks that no two objects overlap.
//!
//! Why one file over 600 lines: `apply` and the snapshot format must change together (the
//! determinism invariant is "same log prefix ⇒ same snapshot bytes"), so every command's apply
//! and the (de)serialisation of what it touches stay side by side.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};

use serde::{Deserialize, Serialize};

use crate::alloc::RangeAlloc;
use crate::command::{Command, Outcome};
use crate::objects::{Cursor, Objects, SnapshotObjects};
use crate::types::{
    Extent, NodeId, Object, Pin, Replica, Replicas, Segment, SegmentId, SegmentState,
    UnmountReason, Version,
};

const SNAPSHOT_MAGIC: &[u8; 4] = b"RGSM";
pub const SNAPSHOT_VERSION: u32 = 1;

/// What changed, for the leader's bookkeeping.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    Committed {
        version: Version,
        key: String,
    },
    /// A `CommitPut` was refused at apply; its reservation is over.
    CommitRejected {
        version: Version,
    },
    /// An object's replica left a segment (removed, evicted, expired, or the replica dropped).
    Freed {
        segment: SegmentId,
        version: Version,
        extents: Vec<Extent>,
    },
    Mounted {
        segment: SegmentId,
    },
    Unmounted {
        segment: SegmentId,
    },
    /// An object was unlinked (after its `Freed` effects).
    Removed {
        key: String,
    },
    /// An object's placement changed and it keeps a replica: one lost with its segment,
    /// moved to disk, or a disk copy added.
    Shrunk {
        key: String,
    },
    /// Every object was removed at once (`RemoveAll`): their extents are free in the state
    /// machine, their table is set aside ([`StateMachine::removed_object`]).
    RemovedAll,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub name: String,
    pub last_generation: u64,
    /// The generation last unmounted gracefully (drained or shut down), 0 for none: its sidecar
    /// is told to stay unmounted rather than to mount a new generation.
    pub retired_generation: u64,
}

/// Replicated counters.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    pub evicted_objects: u64,
    /// Objects that lost their last replica when a node was declared dead or came back with a
    /// new generation (design §3, invariant 3).
    pub dead_node_dropped_objects: u64,
    /// Objects that lost their last replica with a graceful unmount (drain timeout).
    pub unmount_dropped_objects: u64,
    pub expired_objects: u64,
    pub removed_objects: u64,
    pub committed_objects: u64,
}

#[derive(Serialize, Deserialize)]
struct Header {
    next_node_id: u64,
    nodes: BTreeMap<NodeId, NodeRecord>,
    segments: Vec<Segment>,
    counters: Counters,
    objects: u64,
    meta_entries: u64,
}

#[derive(Clone, Debug, Default)]
pub struct StateMachine {
    next_node_id: u64,
    nodes: BTreeMap<NodeId, NodeRecord>,
    names: BTreeMap<String, NodeId>,
    segments: BTreeMap<SegmentId, Segment>,
    /// The current (only) mounted segment of each node.
    node_segment: BTreeMap<NodeId, SegmentId>,
    free: BTreeMap<SegmentId, RangeAlloc>,
    objects: Objects,
    meta: BTreeMap<String, Vec<u8>>,
    counters: Counters,
    // Derived indexes (rebuilt on restore, not in snapshots).
    ttl_index: BTreeSet<(u64, Box<str>)>,
    soft_pin_index: BTreeSet<(u64, Box<str>)>,
    bytes_used: u64,
    hard_pinned_bytes: u64,
    /// The table a `RemoveAll` set aside, until the applier takes it (never in snapshots).
    removed_table: Option<Objects>,
}

impl StateMachine {
    pub fn new() -> Self {
        Self {
            next_node_id: 1,
            ..Default::default()
        }
    }

    // ------------------------------------------------------------------ reads

    pub fn object(&self, key: &str) -> Option<&Object> {
        self.objects.get(key)
    }

    pub fn object_mut(&mut self, key: &str) -> Option<&mut Object> {
        self.objects.get_mut(key)
    }

    /// Sets the leader-memory access time of `key`'s object and answers it.
    pub fn touch_object(&mut self, key: &str, access_s: u32) -> Option<&Object> {
        self.objects.touch(key, access_s)
    }

    /// The earliest TTL or soft-pin deadline, if any.
    pub fn next_expiry(&self) -> Option<u64> {
        let a = self.ttl_index.first().map(|(t, _)| *t);
        let b = self.soft_pin_index.first().map(|(t, _)| *t);
        match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    pub fn contains(&self, key: &str) -> bool {
        self.objects.contains_key(key)
    }

    pub fn objects(&self) -> impl Iterator<Item = (&str, &Object)> {
        self.objects.iter()
    }

    /// The objects of one shard of the object table (see [`crate::objects`]).
    pub fn objects_in_shard(&self, shard: usize) -> impl Iterator<Item = (&str, &Object)> {
        self.objects.shard(shard)
    }

    /// Up to `n` objects from `from` on, in the (deterministic) iteration order, wrapping.
    pub fn scan_objects(&self, from: Cursor, n: usize) -> (Vec<(&str, &Object)>, Cursor) {
        self.objects.scan(from, n)
    }

    /// Keys with `prefix`, strictly after `start_after`, at most `limit`, in key order. A scan
    /// of every key keeping the `limit` smallest: paged listing is an admin operation, and no
    /// ordered index is kept just for it.
    pub fn list_keys(&self, prefix: &str, start_after: &str, limit: usize) -> Vec<(&str, &Object)> {
        let mut best: std::collections::BinaryHeap<&str> =
            std::collections::BinaryHeap::with_capacity(limit + 1);
        for k in self.objects.keys() {
            if !k.starts_with(prefix) || k <= start_after {
                continue;
            }
            if best.len() < limit {
                best.push(k);
            } else if best.peek().is_some_and(|top| k < *top) {
                best.pop();
                best.push(k);
            }
        }
        let mut keys = best.into_vec();
        keys.sort_unstable();
        keys.into_iter()
            .filter_map(|k| self.objects.get_key_value(k))
            .collect()
    }

    pub fn key_count(&self) -> usize {
        self.objects.len()
    }

    pub fn segments(&self) -> impl Iterator<Item = &Segment> {
        self.segments.values()
    }

    pub fn segment(&self, id: &SegmentId) -> Option<&Segment> {
        self.segments.get(id)
    }

    pub fn node_segment(&self, node: NodeId) -> Option<&Segment> {
        self.node_segment
            .get(&node)
            .and_then(|s| self.segments.get(s))
    }

    /// The name node `node` mounted under, if it ever mounted.
    pub fn node_name(&self, node: NodeId) -> Option<&str> {
        self.nodes.get(&node).map(|r| r.name.as_str())
    }

    pub fn node_by_name(&self, name: &str) -> Option<NodeId> {
        self.names.get(name).copied()
    }

    /// Whether this exact segment generation was unmounted gracefully.
    pub fn retired(&self, seg: &SegmentId) -> bool {
        self.nodes
            .get(&seg.node)
            .is_some_and(|r| r.retired_generation == seg.generation && seg.generation != 0)
    }

    pub fn node(&self, id: NodeId) -> Option<&NodeRecord> {
        self.nodes.get(&id)
    }

    pub fn free_space(&self, id: &SegmentId) -> Option<&RangeAlloc> {
        self.free.get(id)
    }

    pub fn meta_get(&self, key: &str) -> Option<&[u8]> {
        self.meta.get(key).map(|v| v.as_slice())
    }

    /// Keys in the metadata KV and the bytes of their keys and values together (a walk: the
    /// KV is capped at `meta_max_keys`, so this stays cheap).
    pub fn meta_usage(&self) -> (usize, u64) {
        let bytes = self
            .meta
            .iter()
            .map(|(k, v)| (k.len() + v.len()) as u64)
            .sum();
        (self.meta.len(), bytes)
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Bytes of committed replicas (allocated extents) over all segments.
    pub fn bytes_used(&self) -> u64 {
        self.bytes_used
    }

    pub fn bytes_total(&self) -> u64 {
        self.segments.values().map(|s| s.capacity).sum()
    }

    pub fn hard_pinned_bytes(&self) -> u64 {
        self.hard_pinned_bytes
    }

    // ------------------------------------------------------------------ apply

    /// Applies one command. Never panics on any command content.
    pub fn apply(&mut self, cmd: &Command, fx: &mut Vec<Effect>) -> Outcome {
        match cmd {
            Command::MountSegment {
                node_name,
                node_id_hint,
                capacity,
                data_addrs,
                now_ms,
            } => self.mount(node_name, *node_id_hint, *capacity, data_addrs, *now_ms, fx),
            Command::UnmountSegment { segment, reason } => {
                match self.unmount(*segment, *reason, fx) {
                    Some(dropped) => {
                        // The node is gone (dead or drained): so are its disks' replicas. A
                        // sidecar that mounts again soon (a restart) keeps them instead.
                        let on_disk = if self.node_segment.contains_key(&segment.node) {
                            0
                        } else {
                            self.drop_node_disks(segment.node, *reason, fx)
                        };
                        Outcome::Unmounted {
                            dropped: dropped + on_disk,
                        }
                    }
                    None => Outcome::Ignored(format!("segment {segment} is not mounted")),
                }
            }
            Command::CommitPut {
                key,
                size,
                replicas,
                checksum,
                version,
                pin,
                expires_ms,
            } => {
                let out =
                    self.commit_put(key, *size, replicas, *checksum, *version, *pin, *expires_ms);
                fx.push(commit_effect(&out, key, *version));
                out
            }
            Command::UpsertPut {
                key,
                size,
                replicas,
                checksum,
                version,
                pin,
                expires_ms,
            } => {
                let out = self.upsert_put(
                    key,
                    *size,
                    replicas,
                    *checksum,
                    *version,
                    *pin,
                    *expires_ms,
                    fx,
                );
                fx.push(commit_effect(&out, key, *version));
                out
            }
            Command::Remove { keys } => {
                let r = keys
                    .iter()
                    .map(|k| self.remove_object(k, fx).is_some())
                    .collect::<Vec<_>>();
                self.counters.removed_objects += r.iter().filter(|x| **x).count() as u64;
                Outcome::Removed(r)
            }
            Command::RemoveAll => {
                let n = self.remove_all(fx);
                self.counters.removed_objects += n;
                Outcome::RemovedAll(n)
            }
            Command::Evict { keys } => {
                let n = keys
                    .iter()
                    .filter(|k| self.remove_object(k, fx).is_some())
                    .count() as u64;
                self.counters.evicted_objects += n;
                Outcome::Evicted(n)
            }
            Command::MetaPut { key, value } => Outcome::Meta {
                existed: self.meta.insert(key.clone(), value.clone()).is_some(),
            },
            Command::MetaDelete { key } => Outcome::Meta {
                existed: self.meta.remove(key).is_some(),
            },
            Command::ExpirePins { now_ms } => self.expire(*now_ms, fx),
            Command::MoveToDisk { node, items } => self.move_to_disk(*node, items, fx),
            Command::DropFromDisk { node, items } => self.drop_from_disk(*node, items, fx),
            Command::PromoteToMemory {
                key,
                version,
                reservation,
                replica,
            } => {
                let out = self.promote_to_memory(key, *version, replica);
                fx.push(commit_effect(&out, key, *reservation));
                out
            }
            Command::CopyToDisk { node, items } => self.copy_to_disk(*node, items, fx),
            Command::DrainSegment {
                segment,
                deadline_ms,
            } => match self.segments.get_mut(segment) {
                Some(s) => {
                    s.state = SegmentState::Draining {
                        deadline_ms: *deadline_ms,
                    };
                    Outcome::DrainSet
                }
                None => Outcome::Ignored(format!("segment {segment} is not mounted")),
            },
        }
    }

    fn mount(
        &mut self,
        name: &str,
        hint: u64,
        capacity: u64,
        data_addrs: &[String],
        now_ms: u64,
        fx: &mut Vec<Effect>,
    ) -> Outcome {
        let node = match self.names.get(name) {
            Some(id) => *id,
            None => {
                let id = if hint != 0 && hint <= u32::MAX as u64 && !self.nodes.contains_key(&hint)
                {
                    hint
                } else {
                    self.next_node_id
                };
                if id > u32::MAX as u64 {
                    return Outcome::Conflict(format!("node {name:?}: node id {id} out of range"));
                }
                self.next_node_id = self.next_node_id.max(id + 1);
                self.names.insert(name.to_string(), id);
                self.nodes.insert(
                    id,
                    NodeRecord {
                        name: name.to_string(),
                        last_generation: 0,
                        retired_generation: 0,
                    },
                );
                id
            }
        };
        // Generations from DISK_GENERATION_BASE on name disks, not mounts.
        if self.nodes.get(&node).is_some_and(|r| {
            r.last_generation + 1 >= regolith_proto::disk_tier::DISK_GENERATION_BASE
        }) {
            return Outcome::Conflict(format!("node {name:?}: generations exhausted"));
        }
        let mut dropped = 0;
        if let Some(old) = self.node_segment.get(&node).copied() {
            dropped = self.unmount(old, UnmountReason::Dead, fx).unwrap_or(0);
        }
        let Some(rec) = self.nodes.get_mut(&node) else {
            return Outcome::Conflict(format!("node {name:?}: no record"));
        };
        rec.last_generation += 1;
        let id = SegmentId {
            node,
            generation: rec.last_generation,
        };
        self.segments.insert(
            id,
            Segment {
                id,
                name: name.to_string(),
                capacity,
                data_addrs: data_addrs.to_vec(),
                state: SegmentState::Active,
                mounted_ms: now_ms,
                used: 0,
                objects: 0,
            },
        );
        self.free.insert(id, RangeAlloc::new(capacity));
        self.node_segment.insert(node, id);
        fx.push(Effect::Mounted { segment: id });
        Outcome::Mounted {
            node_id: node,
            generation: id.generation,
            dropped,
        }
    }

    /// Drops a segment and every replica on it; returns how many objects lost their last
    /// replica, or None when the segment is not mounted.
    fn unmount(
        &mut self,
        seg: SegmentId,
        reason: UnmountReason,
        fx: &mut Vec<Effect>,
    ) -> Option<u64> {
        self.segments.remove(&seg)?;
        self.free.remove(&seg);
        if reason == UnmountReason::Graceful {
            if let Some(rec) = self.nodes.get_mut(&seg.node) {
                rec.retired_generation = seg.generation;
            }
        }
        if self.node_segment.get(&seg.node) == Some(&seg) {
            self.node_segment.remove(&seg.node);
        }
        let mut orphans = Vec::new();
        // Found first, then changed one by one through `get_mut`, so that a snapshot being
        // written records only the objects that lose a replica.
        let on_seg: Vec<String> = self
            .objects
            .iter()
            .filter(|(_, o)| o.replicas.pieces().iter().any(|p| p.segment() == seg))
            .map(|(k, _)| k.to_string())
            .collect();
        for key in on_seg {
            let Some(obj) = self.objects.get_mut(&key) else {
                continue;
            };
            obj.replicas.retain_segments(|s| s != seg);
            if obj.replicas.is_empty() {
                orphans.push(key.to_string());
            } else {
                fx.push(Effect::Shrunk {
                    key: key.to_string(),
                });
            }
        }
        // Recompute accounting for the objects that kept other replicas (their footprint shrank).
        self.recompute_usage();
        let dropped = orphans.len() as u64;
        for k in orphans {
            self.remove_object(&k, fx);
        }
        match reason {
            UnmountReason::Dead => self.counters.dead_node_dropped_objects += dropped,
            UnmountReason::Graceful => self.counters.unmount_dropped_objects += dropped,
        }
        fx.push(Effect::Unmounted { segment: seg });
        Some(dropped)
    }

    /// Objects copied to a disk of `node` (design §6 "Tiers", docs/ssd.md): each object still
    /// of the version named loses its pieces on the node's current segment (freed, held by the
    /// leader while leased, like an eviction's) and gains one disk piece.
    fn move_to_disk(
        &mut self,
        node: NodeId,
        items: &[crate::command::DiskMove],
        fx: &mut Vec<Effect>,
    ) -> Outcome {
        let Some(seg) = self.node_segment.get(&node).copied() else {
            return Outcome::MovedToDisk(vec![false; items.len()]);
        };
        let mut out = Vec::with_capacity(items.len());
        for it in items {
            let (moved, mem_before, mem_after, pin_delta) = match self.objects.get_mut(&it.key) {
                Some(o) if o.version == it.version => {
                    let (mem_before, fp_before) = (o.replicas.memory_bytes(), o.footprint());
                    let size = o.size;
                    let moved = o.replicas.move_to_disk(seg, it.disk, size);
                    let hard = o.pin() == Pin::Hard;
                    let fp_after = o.footprint();
                    let pin_delta = if hard { fp_before - fp_after } else { 0 };
                    (moved, mem_before, o.replicas.memory_bytes(), pin_delta)
                }
                _ => (Vec::new(), 0, 0, 0),
            };
            if moved.is_empty() {
                // A report sent again (its first answer lost) finds the move made: it held.
                let done = self.objects.get(&it.key).is_some_and(|o| {
                    o.version == it.version && o.replicas.disk_on(node) == Some(it.disk)
                });
                out.push(done);
                continue;
            }
            self.bytes_used -= (mem_before - mem_after).min(self.bytes_used);
            self.hard_pinned_bytes -= pin_delta.min(self.hard_pinned_bytes);
            if let Some(alloc) = self.free.get_mut(&seg) {
                for e in &moved {
                    let ok = alloc.free(e);
                    debug_assert!(ok, "freeing a used extent");
                }
            }
            if let Some(s) = self.segments.get_mut(&seg) {
                let b: u64 = moved.iter().map(|e| e.len).sum();
                s.used -= b.min(s.used);
                s.objects = s.objects.saturating_sub(1);
            }
            fx.push(Effect::Freed {
                segment: seg,
                version: it.version,
                extents: moved,
            });
            fx.push(Effect::Shrunk {
                key: it.key.clone(),
            });
            out.push(true);
        }
        Outcome::MovedToDisk(out)
    }

    /// A disk-only object copied back into memory: the object still of `version` gains
    /// `replica` (a memory segment where it has none, the extents free and covering it) and
    /// keeps its disk replica. Refused (a conflict: the reservation's extents are freed by the
    /// leader) when anything changed since the promotion was ordered.
    fn promote_to_memory(&mut self, key: &str, version: Version, r: &Replica) -> Outcome {
        let conflict = |why: &str| Outcome::Conflict(format!("promotion of {key:?}: {why}"));
        let Some(o) = self.objects.get(key) else {
            return conflict("the object is gone");
        };
        if o.version != version {
            return conflict("the object was replaced");
        }
        if r.segment.is_disk() {
            return conflict("the replica names a disk, not memory");
        }
        if o.replicas
            .pieces()
            .iter()
            .any(|p| !p.is_disk() && p.segment().node == r.segment.node)
        {
            return conflict("the object already has a replica in that node's memory");
        }
        let size = o.size;
        if let Err(why) = self.check_placement(key, size, std::slice::from_ref(r)) {
            return Outcome::Conflict(why);
        }
        let Some(replicas) = o.replicas.with_replica(r) else {
            return conflict("node id or generation out of range");
        };
        let hard = o.pin() == Pin::Hard;
        let (Some(alloc), Some(seg)) = (
            self.free.get_mut(&r.segment),
            self.segments.get_mut(&r.segment),
        ) else {
            return conflict("the segment is not mounted");
        };
        for e in &r.extents {
            let ok = alloc.take(e);
            debug_assert!(ok, "checked free");
        }
        let bytes = r.bytes();
        seg.used += bytes;
        seg.objects += 1;
        self.bytes_used += bytes;
        if hard {
            self.hard_pinned_bytes += size;
        }
        if let Some(o) = self.objects.get_mut(key) {
            o.replicas = replicas;
        }
        Outcome::Committed
    }

    /// Write-through copies: each object still of the version named gains a disk replica on
    /// `node` and keeps its memory pieces (a copy already committed holds).
    fn copy_to_disk(
        &mut self,
        node: NodeId,
        items: &[crate::command::DiskMove],
        fx: &mut Vec<Effect>,
    ) -> Outcome {
        let mut out = Vec::with_capacity(items.len());
        for it in items {
            let Some(o) = self.objects.get_mut(&it.key) else {
                out.push(false);
                continue;
            };
            let on_node = o.replicas.segments().any(|s| s.node == node);
            if o.version != it.version || !on_node {
                out.push(false);
                continue;
            }
            if o.replicas.disk_on(node).is_some() {
                out.push(true);
                continue;
            }
            match o.replicas.with_disk(node, it.disk, o.size) {
                Some(r) => {
                    o.replicas = r;
                    fx.push(Effect::Shrunk {
                        key: it.key.clone(),
                    });
                    out.push(true);
                }
                None => out.push(false),
            }
        }
        Outcome::CopiedToDisk(out)
    }

    /// Disk replicas `node` no longer holds; an object left with none is removed (counted as
    /// evicted: the disk tier's own eviction, or a disk lost, drops cached objects).
    fn drop_from_disk(
        &mut self,
        node: NodeId,
        items: &[(String, Version)],
        fx: &mut Vec<Effect>,
    ) -> Outcome {
        let mut dropped = 0;
        let mut emptied = Vec::new();
        for (key, version) in items {
            let Some(o) = self.objects.get_mut(key) else {
                continue;
            };
            if o.version != *version {
                continue;
            }
            let before = o.replicas.pieces().len();
            o.replicas
                .retain_segments(|s| !(s.node == node && s.is_disk()));
            if o.replicas.pieces().len() == before {
                continue;
            }
            dropped += 1;
            if o.replicas.is_empty() {
                emptied.push(key.clone());
            } else {
                fx.push(Effect::Shrunk { key: key.clone() });
            }
        }
        let removed = emptied.len() as u64;
        for k in emptied {
            self.remove_object(&k, fx);
        }
        self.counters.evicted_objects += removed;
        Outcome::DroppedFromDisk { dropped, removed }
    }

    /// Drops every disk replica of `node` (it was declared dead or unmounted); answers how
    /// many objects lost their last replica.
    fn drop_node_disks(
        &mut self,
        node: NodeId,
        reason: UnmountReason,
        fx: &mut Vec<Effect>,
    ) -> u64 {
        let items: Vec<(String, Version)> = self
            .objects
            .iter()
            .filter(|(_, o)| o.replicas.disk_on(node).is_some())
            .map(|(k, o)| (k.to_string(), o.version))
            .collect();
        if items.is_empty() {
            return 0;
        }
        let Outcome::DroppedFromDisk { removed, .. } = self.drop_from_disk(node, &items, fx) else {
            return 0;
        };
        // Counted with the node's other losses, not as evictions.
        self.counters.evicted_objects -= removed.min(self.counters.evicted_objects);
        match reason {
            UnmountReason::Dead => self.counters.dead_node_dropped_objects += removed,
            UnmountReason::Graceful => self.counters.unmount_dropped_objects += removed,
        }
        removed
    }

    #[allow(clippy::too_many_arguments)]
    fn commit_put(
        &mut self,
        key: &str,
        size: u64,
        replicas: &[Replica],
        checksum: u64,
        version: Version,
        pin: Pin,
        expires_ms: u64,
    ) -> Outcome {
        if self.objects.contains_key(key) {
            return Outcome::AlreadyExists;
        }
        if let Err(why) = self.check_placement(key, size, replicas) {
            return Outcome::Conflict(why);
        }
        let Some(compact) = Replicas::from_replicas(replicas) else {
            return Outcome::Conflict(format!(
                "commit of {key:?}: node id or generation out of range"
            ));
        };
        for r in replicas {
            // `check_placement` found every segment and every extent free.
            let (Some(alloc), Some(seg)) = (
                self.free.get_mut(&r.segment),
                self.segments.get_mut(&r.segment),
            ) else {
                debug_assert!(false, "checked placement names a missing segment");
                continue;
            };
            for e in &r.extents {
                let ok = alloc.take(e);
                debug_assert!(ok, "checked free");
            }
            seg.used += r.bytes();
            seg.objects += 1;
        }
        let obj = Object::new(size, checksum, version, compact, pin, expires_ms);
        self.index_object(key, &obj);
        self.objects.insert_new(key, obj);
        self.counters.committed_objects += 1;
        Outcome::Committed
    }

    /// [`Self::commit_put`] that replaces the object under the key, if any. Everything that
    /// could refuse the commit is checked before the old object is unlinked, so a refused
    /// upsert leaves it as it was. The watch feed sees one change, the new object, never a
    /// moment without the key.
    #[allow(clippy::too_many_arguments)]
    fn upsert_put(
        &mut self,
        key: &str,
        size: u64,
        replicas: &[Replica],
        checksum: u64,
        version: Version,
        pin: Pin,
        expires_ms: u64,
        fx: &mut Vec<Effect>,
    ) -> Outcome {
        if let Err(why) = self.check_placement(key, size, replicas) {
            return Outcome::Conflict(why);
        }
        if Replicas::from_replicas(replicas).is_none() {
            return Outcome::Conflict(format!(
                "upsert of {key:?}: node id or generation out of range"
            ));
        }
        if self.unlink_object(key, fx).is_some() {
            self.counters.removed_objects += 1;
        }
        self.commit_put(key, size, replicas, checksum, version, pin, expires_ms)
    }

    /// Checks that a commit's replicas are on distinct mounted segments of distinct nodes, cover
    /// the size, and that every extent is free (and the extents of one replica do not overlap).
    fn check_placement(&self, key: &str, size: u64, replicas: &[Replica]) -> Result<(), String> {
        if key.is_empty() || size == 0 || replicas.is_empty() {
            return Err(format!(
                "commit of {key:?}: empty key, zero size or no replica"
            ));
        }
        let mut nodes = BTreeSet::new();
        for r in replicas {
            if !nodes.insert(r.segment.node) {
                return Err(format!(
                    "commit of {key:?}: two replicas on node {}",
                    r.segment.node
                ));
            }
            let Some(alloc) = self.free.get(&r.segment) else {
                return Err(format!(
                    "commit of {key:?}: segment {} is not mounted",
                    r.segment
                ));
            };
            if r.bytes() < size {
                return Err(format!(
                    "commit of {key:?}: replica on {} covers {} of {size} bytes",
                    r.segment,
                    r.bytes()
                ));
            }
            for (i, e) in r.extents.iter().enumerate() {
                if !alloc.is_free(e) {
                    return Err(format!(
                        "commit of {key:?}: extent {e:?} on {} is not free",
                        r.segment
                    ));
                }
                if r.extents[..i].iter().any(|o| o.overlaps(e)) {
                    return Err(format!(
                        "commit of {key:?}: overlapping extents on {}",
                        r.segment
                    ));
                }
            }
        }
        Ok(())
    }

    fn index_object(&mut self, key: &str, obj: &Object) {
        self.bytes_used += replicas_bytes(obj);
        if obj.expires_ms != 0 {
            self.ttl_index.insert((obj.expires_ms, key.into()));
        }
        match obj.pin() {
            Pin::Soft { until_ms } => {
                self.soft_pin_index.insert((until_ms, key.into()));
            }
            Pin::Hard => self.hard_pinned_bytes += obj.footprint(),
            Pin::None => {}
        }
    }

    fn unindex_object(&mut self, key: &str, obj: &Object) {
        self.bytes_used -= replicas_bytes(obj).min(self.bytes_used);
        if obj.expires_ms != 0 {
            self.ttl_index.remove(&(obj.expires_ms, key.into()));
        }
        match obj.pin() {
            Pin::Soft { until_ms } => {
                self.soft_pin_index.remove(&(until_ms, key.into()));
            }
            Pin::Hard => self.hard_pinned_bytes -= obj.footprint().min(self.hard_pinned_bytes),
            Pin::None => {}
        }
    }

    /// Removes every object in steps that do not depend on how many there are: the table is
    /// set aside whole (for the caller to hand to [`Self::take_removed_table`] and drop off the
    /// apply path), every segment's space is free again, and one [`Effect::RemovedAll`] stands
    /// for the per-object `Freed`/`Removed` effects (the leader holds the extents of leased
    /// objects from the set-aside table). The result equals removing the objects one by one.
    fn remove_all(&mut self, fx: &mut Vec<Effect>) -> u64 {
        let table = std::mem::take(&mut self.objects);
        let n = table.len() as u64;
        self.merge_removed_table(table);
        for seg in self.segments.values_mut() {
            seg.used = 0;
            seg.objects = 0;
            self.free.insert(seg.id, RangeAlloc::new(seg.capacity));
        }
        self.ttl_index.clear();
        self.soft_pin_index.clear();
        self.bytes_used = 0;
        self.hard_pinned_bytes = 0;
        fx.push(Effect::RemovedAll);
        n
    }

    /// Keeps `table` until the caller takes it; a table set aside earlier and not taken yet
    /// (only where the state machine is driven without a [`crate::core::Core`]) is dropped.
    fn merge_removed_table(&mut self, table: Objects) {
        if let Some(mut earlier) = self.removed_table.replace(table) {
            earlier.detach_snapshots();
        }
    }

    /// The object table the last `RemoveAll` set aside, if not taken yet: the snapshots being
    /// written from it still need it ([`Objects::detach_snapshots`]) before it is dropped.
    pub fn take_removed_table(&mut self) -> Option<Objects> {
        self.removed_table.take()
    }

    /// An object of the table the last `RemoveAll` set aside (while it is still held).
    pub fn removed_object(&self, key: &str) -> Option<&Object> {
        self.removed_table.as_ref()?.get(key)
    }

    /// Unlinks an object and frees its extents (the leader holds them while its read leases
    /// last; design §3 invariant 5).
    fn remove_object(&mut self, key: &str, fx: &mut Vec<Effect>) -> Option<Object> {
        let obj = self.unlink_object(key, fx)?;
        fx.push(Effect::Removed {
            key: key.to_string(),
        });
        Some(obj)
    }

    /// [`Self::remove_object`] without telling watchers that the key is gone (an upsert links
    /// a new object under it in the same step).
    fn unlink_object(&mut self, key: &str, fx: &mut Vec<Effect>) -> Option<Object> {
        let obj = self.objects.remove(key)?;
        self.unindex_object(key, &obj);
        for r in &obj.replicas.to_vec() {
            if r.segment.is_disk() {
                // Nothing of a segment to free: the node drops the record when it sees the
                // key go (its watch), or at its next reconciliation.
                continue;
            }
            if let Some(alloc) = self.free.get_mut(&r.segment) {
                for e in &r.extents {
                    let ok = alloc.free(e);
                    debug_assert!(ok, "freeing a used extent");
                }
            }
            if let Some(seg) = self.segments.get_mut(&r.segment) {
                seg.used -= r.bytes().min(seg.used);
                seg.objects = seg.objects.saturating_sub(1);
            }
            fx.push(Effect::Freed {
                segment: r.segment,
                version: obj.version,
                extents: r.extents.clone(),
            });
        }
        Some(obj)
    }

    fn expire(&mut self, now_ms: u64, fx: &mut Vec<Effect>) -> Outcome {
        let due: Vec<Box<str>> = self
            .ttl_index
            .iter()
            .take_while(|(t, _)| *t <= now_ms)
            .map(|(_, k)| k.clone())
            .collect();
        for k in &due {
            self.remove_object(k, fx);
        }
        self.counters.expired_objects += due.len() as u64;
        let lapsed: Vec<(u64, Box<str>)> = self
            .soft_pin_index
            .iter()
            .take_while(|(t, _)| *t <= now_ms)
            .cloned()
            .collect();
        for (t, k) in &lapsed {
            self.soft_pin_index.remove(&(*t, k.clone()));
            if let Some(o) = self.objects.get_mut(k) {
                o.set_pin(Pin::None);
            }
        }
        Outcome::Expired {
            removed: due.len() as u64,
            unpinned: lapsed.len() as u64,
        }
    }

    fn recompute_usage(&mut self) {
        for s in self.segments.values_mut() {
            s.used = 0;
            s.objects = 0;
        }
        self.bytes_used = 0;
        self.hard_pinned_bytes = 0;
        for (_, obj) in self.objects.iter() {
            self.bytes_used += replicas_bytes(obj);
            if obj.pin() == Pin::Hard {
                self.hard_pinned_bytes += obj.footprint();
            }
            for seg in obj.replicas.segments() {
                if let Some(s) = self.segments.get_mut(&seg) {
                    s.objects += 1;
                }
            }
            for p in obj.replicas.pieces() {
                if let Some(s) = self.segments.get_mut(&p.segment()) {
                    s.used += p.len;
                }
            }
        }
    }

    // ------------------------------------------------------------------ snapshots

    /// Writes the replicated state (format in the module doc), all at once: for a state nothing
    /// changes meanwhile (tests, tools). Snapshots of a live replica use [`StateView`].
    pub fn write_snapshot(&self, w: &mut dyn Write) -> std::io::Result<()> {
        w.write_all(SNAPSHOT_MAGIC)?;
        w.write_all(&SNAPSHOT_VERSION.to_le_bytes())?;
        bincode::serialize_into(&mut *w, &self.snapshot_header()).map_err(to_io)?;
        for shard in self.objects.shards() {
            crate::objects::write_shard(shard, w)?;
        }
        for kv in &self.meta {
            bincode::serialize_into(&mut *w, &kv).map_err(to_io)?;
        }
        Ok(())
    }

    fn snapshot_header(&self) -> Header {
        Header {
            next_node_id: self.next_node_id,
            nodes: self.nodes.clone(),
            segments: self.segments.values().cloned().collect(),
            counters: self.counters.clone(),
            objects: self.objects.len() as u64,
            meta_entries: self.meta.len() as u64,
        }
    }

    /// Begins a snapshot of the replicated state as it is now, to be written while applies go
    /// on: the object table records how to undo its changes until the writer has taken each
    /// shard (see `objects`); the rest (nodes, segments, the metadata KV, bounded by its
    /// quotas) is copied. The writer gets each shard with [`SnapshotObjects::take_shard`] on
    /// this state machine's [`objects_table`](Self::objects_table), under its lock.
    pub fn begin_snapshot(&mut self) -> (SnapshotStart, SnapshotObjects) {
        let start = SnapshotStart {
            header: self.snapshot_header(),
            meta: self.meta.clone(),
        };
        (start, self.objects.begin_snapshot())
    }

    /// Bytes of the object table's arrays, hash tables and keys (walks every key).
    pub fn objects_footprint(&self) -> (usize, usize, usize) {
        self.objects.footprint()
    }

    /// The objects, for a snapshot writer's [`SnapshotObjects::take_shard`].
    pub fn objects_table(&self) -> &crate::objects::Objects {
        &self.objects
    }

    /// Gives the snapshots being written what they still need of this state before it is
    /// replaced.
    pub fn detach_snapshots(&mut self) {
        self.objects.detach_snapshots();
    }

    /// Reads a snapshot written by [`write_snapshot`](Self::write_snapshot), validating that no
    /// two objects overlap and every replica is on a mounted segment.
    pub fn read_snapshot(r: &mut dyn Read) -> std::io::Result<Self> {
        let mut magic = [0u8; 4];
        r.read_exact(&mut magic)?;
        if &magic != SNAPSHOT_MAGIC {
            return Err(invalid(
                "not a Regolith state-machine snapshot (bad magic)".into(),
            ));
        }
        let mut v = [0u8; 4];
        r.read_exact(&mut v)?;
        let version = u32::from_le_bytes(v);
        if version != SNAPSHOT_VERSION {
            return Err(invalid(format!(
                "state-machine snapshot format {version} is not supported (this build reads {SNAPSHOT_VERSION})"
            )));
        }
        let h: Header = snapshot_record(r)?;
        let mut sm = StateMachine {
            next_node_id: h.next_node_id,
            counters: h.counters,
            ..Default::default()
        };
        for (id, rec) in h.nodes {
            sm.names.insert(rec.name.clone(), id);
            sm.nodes.insert(id, rec);
        }
        // Each segment's used extents, gathered and then turned into its allocator in one pass
        // (see `RangeAlloc::from_used`).
        let mut used: BTreeMap<SegmentId, Vec<(u64, u64)>> = BTreeMap::new();
        for s in h.segments {
            used.insert(s.id, Vec::new());
            sm.node_segment.insert(s.id.node, s.id);
            sm.segments.insert(s.id, s);
        }
        for _ in 0..h.objects {
            let (k, o): (String, Object) = snapshot_record(r)?;
            for p in o.replicas.pieces() {
                let seg = p.segment();
                if p.is_disk() {
                    // A disk replica takes no segment space; its node must be known.
                    if !sm.nodes.contains_key(&seg.node) {
                        return Err(invalid(format!(
                            "snapshot object {k:?} is on a disk of unknown node {}",
                            seg.node
                        )));
                    }
                    continue;
                }
                let extents = used.get_mut(&seg).ok_or_else(|| {
                    invalid(format!(
                        "snapshot object {k:?} is on unmounted segment {seg}"
                    ))
                })?;
                let e = p.extent();
                extents.push((e.offset, e.len));
            }
            sm.index_object(&k, &o);
            if !sm.objects.insert_new(&k, o) {
                return Err(invalid(format!("snapshot names key {k:?} twice")));
            }
        }
        for (seg, mut extents) in used {
            let capacity = sm.segments.get(&seg).map_or(0, |s| s.capacity);
            let alloc = RangeAlloc::from_used(capacity, &mut extents)
                .map_err(|e| invalid(sm.overlap_message(seg, &e)))?;
            sm.free.insert(seg, alloc);
        }
        for _ in 0..h.meta_entries {
            let (k, v): (String, Vec<u8>) = snapshot_record(r)?;
            sm.meta.insert(k, v);
        }
        sm.recompute_usage();
        Ok(sm)
    }

    /// Why a snapshot's extent `e` on `seg` was refused, naming the objects that hold it.
    fn overlap_message(&self, seg: SegmentId, e: &Extent) -> String {
        let holders: Vec<&str> = self
            .objects
            .iter()
            .filter(|(_, o)| {
                o.replicas
                    .pieces()
                    .iter()
                    .any(|p| p.segment() == seg && p.extent().overlaps(e))
            })
            .map(|(k, _)| k)
            .take(4)
            .collect();
        format!("snapshot objects {holders:?} overlap (or leave segment {seg}) at {e:?}")
    }

    /// The snapshot bytes: equal bytes means equal replicated state.
    #[allow(clippy::expect_used)] // writing to a Vec cannot fail
    pub fn snapshot_bytes(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.write_snapshot(&mut v)
            .expect("writing to a Vec cannot fail");
        v
    }
}

/// What a snapshot begun by [`StateMachine::begin_snapshot`] holds besides the objects.
pub struct SnapshotStart {
    header: Header,
    meta: BTreeMap<String, Vec<u8>>,
}

/// A snapshot being written while applies go on: `take(i)` answers object shard `i` as it was
/// when the snapshot began (taking the state's lock for that shard alone).
pub struct StateView {
    pub start: SnapshotStart,
    pub take: Box<dyn FnMut(usize) -> std::io::Result<crate::objects::Shard> + Send>,
}

impl StateView {
    /// Writes the snapshot (format in the module doc), one object shard at a time.
    pub fn write_to(mut self, w: &mut dyn Write) -> std::io::Result<()> {
        w.write_all(SNAPSHOT_MAGIC)?;
        w.write_all(&SNAPSHOT_VERSION.to_le_bytes())?;
        bincode::serialize_into(&mut *w, &self.start.header).map_err(to_io)?;
        for i in 0..crate::objects::SHARDS {
            let shard = (self.take)(i)?;
            crate::objects::write_shard(&shard, w)?;
        }
        for kv in &self.start.meta {
            bincode::serialize_into(&mut *w, &kv).map_err(to_io)?;
        }
        Ok(())
    }
}

impl regolith_raft_log::SnapshotView for StateView {
    fn write(self: Box<Self>, w: &mut dyn Write) -> std::io::Result<()> {
        (*self).write_to(w)
    }
}

/// Memory an object's replicas take (disk replicas take none).
fn replicas_bytes(obj: &Object) -> u64 {
    obj.replicas.memory_bytes()
}

/// Most bytes one record of a state-machine snapshot (the header, one object, one metadata
/// entry) may take. bincode reading from a stream sizes a string's or a byte vector's buffer by
/// its length prefix before reading it: without a limit, a snapshot from the leader with a
/// garbage prefix made this replica zero-fill gigabytes, abort on a failed allocation or panic
/// on `capacity overflow` (`regolith-fuzz`'s `snapshot_state` keeps such inputs as
/// regressions). No real record comes near this.
const MAX_SNAPSHOT_RECORD: u64 = 256 << 20;

/// One bincode record of a snapshot stream, as `bincode::deserialize_from` reads it (same
/// encoding), refused past [`MAX_SNAPSHOT_RECORD`] bytes.
fn snapshot_record<T: serde::de::DeserializeOwned>(r: &mut dyn Read) -> std::io::Result<T> {
    use bincode::Options;
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .allow_trailing_bytes()
        .with_limit(MAX_SNAPSHOT_RECORD)
        .deserialize_from(r)
        .map_err(to_io)
}

fn to_io(e: bincode::Error) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, e)
}

fn invalid(msg: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, msg)
}

/// What watchers and the leader learn of a commit (`CommitPut` or `UpsertPut`) that answered
/// `out`.
fn commit_effect(out: &Outcome, key: &str, version: Version) -> Effect {
    match out {
        Outcome::Committed => Effect::Committed {
            version,
            key: key.to_string(),
        },
        _ => Effect::CommitRejected { version },
    }
}
