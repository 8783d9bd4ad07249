//! The node's index of the cluster's objects (metadata at the node, design §5): key →
//! placement, size, checksum and version, fed by metad's `Watch` stream ([`crate::watch`]),
//! so `exists` and most gets are answered without a metad round trip.
//!
//! Sans-I/O: plain methods, a caller-supplied clock (`now_ms`).
//!
//! Compact by design (10M objects must fit well under 1 GiB): a key is not stored, only a
//! 96-bit hash of it under a per-process random seed (64 bits find the entry, 32 more confirm
//! it; two keys of a 10M-key index collide with probability about 10^-15). A hash table of
//! 4-byte positions points into a dense array of 64-byte entries grown in fixed chunks (no
//! doubling copy); segments are interned, so an entry names its one extent by a 4-byte slot.
//! Objects with more than one extent keep their pieces in a side table.
//!
//! Read-your-writes: a put or remove this node's clients made is visible at once, before the
//! stream brings it, as an *override* that holds until the stream reaches that change or until
//! it is [`OVERRIDE_MS`] old. Versions increase with every put, so the stream's changes are
//! told apart by version: a put override of version `v` ends with the stream's put of `v` or
//! later, or its removal of `v` or later; a remove override of version `v` ends with the
//! stream's removal of the key or its put of a later version. The stream may also get there
//! first (its message can overtake the RPC's reply): what it removed recently is remembered
//! for [`OVERRIDE_MS`], and an override the stream already passed is not made.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;

use hashbrown::HashTable;
use regolith_proto::common::{Extent, Version};
use regolith_proto::grant::{Mac, MAC_LEN};
use xxhash_rust::xxh3::xxh3_128_with_seed;

use crate::ops::{Placement, Replica};

/// Entries per chunk of the dense array.
const CHUNK: usize = 1 << 16;
/// `Entry::slot` of an object whose pieces live in the side table.
const MULTI: u32 = u32::MAX;
/// An override the stream never confirmed expires after this (the stream state then rules).
pub const OVERRIDE_MS: u64 = 5_000;
/// Most stream removals remembered for the race above.
const RECENT_REMOVALS: usize = 65_536;

/// One object. 80 bytes: 64 of placement, 16 of the leader's read grant of its extent.
#[derive(Clone, Copy, Debug)]
struct Entry {
    hash: u64,
    check: u32,
    /// The segment of the one extent, or [`MULTI`].
    slot: u32,
    size: u64,
    checksum: u64,
    term: u64,
    id: u64,
    offset: u64,
    len: u64,
    mac: Mac,
}

/// One extent of one replica, with its read grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Piece {
    slot: u32,
    offset: u64,
    len: u64,
    mac: Mac,
}

/// A mounted segment, as placements name it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentInfo {
    pub node_id: u64,
    pub generation: u64,
    pub node_name: String,
    pub data_addrs: Vec<SocketAddr>,
}

#[derive(Clone, Debug)]
enum Override {
    Put(Placement),
    /// The version removed, when this node knew it.
    Removed(Option<Version>),
}

/// The index.
pub struct Index {
    seed: u64,
    table: HashTable<u32>,
    chunks: Vec<Vec<Entry>>,
    len: usize,
    multi: HashMap<u64, Box<[Piece]>>,
    segments: Vec<Option<SegmentInfo>>,
    slots: HashMap<(u64, u64), u32>,
    free_slots: Vec<u32>,
    overrides: HashMap<String, (Override, u64)>,
    /// (when, key) of each override made, oldest first: expiry looks only at the front.
    override_times: VecDeque<(u64, String)>,
    /// Keys the stream removed lately: the version removed and when.
    removed_lately: HashMap<String, (Version, u64)>,
    /// (when, key) of each entry of `removed_lately`, oldest first.
    removed_times: VecDeque<(u64, String)>,
    /// This node removed everything (at this time) and the stream has not shown it yet: the
    /// stream's objects are hidden until it does.
    hidden_since: Option<u64>,
    /// Every change up to this log index is in the index.
    applied: u64,
}

impl Index {
    /// An empty index; `seed` keys the hash (pick it at random per process).
    pub fn new(seed: u64) -> Self {
        Index {
            seed,
            table: HashTable::new(),
            chunks: Vec::new(),
            len: 0,
            multi: HashMap::new(),
            segments: Vec::new(),
            slots: HashMap::new(),
            free_slots: Vec::new(),
            overrides: HashMap::new(),
            override_times: VecDeque::new(),
            removed_lately: HashMap::new(),
            removed_times: VecDeque::new(),
            hidden_since: None,
            applied: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every change up to this log index is in the index.
    pub fn applied(&self) -> u64 {
        self.applied
    }

    pub fn set_applied(&mut self, index: u64) {
        self.applied = index;
    }

    fn hash(&self, key: &str) -> (u64, u32) {
        let h = xxh3_128_with_seed(key.as_bytes(), self.seed);
        (h as u64, (h >> 96) as u32)
    }

    fn entry(&self, i: u32) -> &Entry {
        &self.chunks[i as usize / CHUNK][i as usize % CHUNK]
    }

    fn entry_mut(&mut self, i: u32) -> &mut Entry {
        &mut self.chunks[i as usize / CHUNK][i as usize % CHUNK]
    }

    fn find(&self, hash: u64, check: u32) -> Option<u32> {
        self.table
            .find(hash, |&i| {
                let e = self.entry(i);
                e.hash == hash && e.check == check
            })
            .copied()
    }

    // ------------------------------------------------------------------ reads

    /// Whether the key is indexed (overrides first).
    pub fn contains(&self, key: &str) -> bool {
        match self.overrides.get(key) {
            Some((Override::Put(_), _)) => true,
            Some((Override::Removed(_), _)) => false,
            None if self.hidden_since.is_some() => false,
            None => {
                let (h, c) = self.hash(key);
                self.find(h, c).is_some()
            }
        }
    }

    /// The indexed placement of `key`.
    pub fn get(&self, key: &str) -> Option<Placement> {
        match self.overrides.get(key) {
            Some((Override::Put(p), _)) => return Some(p.clone()),
            Some((Override::Removed(_), _)) => return None,
            None if self.hidden_since.is_some() => return None,
            None => {}
        }
        let (h, c) = self.hash(key);
        let e = *self.entry(self.find(h, c)?);
        let pieces: Vec<Piece> = if e.slot == MULTI {
            self.multi.get(&e.hash)?.to_vec()
        } else {
            vec![Piece {
                slot: e.slot,
                offset: e.offset,
                len: e.len,
                mac: e.mac,
            }]
        };
        let mut replicas: Vec<Replica> = Vec::new();
        for p in pieces {
            let ext = Extent {
                offset: p.offset,
                len: p.len,
            };
            match replicas.last_mut() {
                Some(r) if self.slots.get(&(r.node_id, r.generation)) == Some(&p.slot) => {
                    r.extents.push(ext);
                    r.grants.push(p.mac);
                }
                _ => {
                    let s = self.segments.get(p.slot as usize)?.as_ref()?;
                    // Disk replicas are read with the leader's placement (a disk read costs
                    // far more than the round trip, the index keeps no node addresses for
                    // them, and the leader's get may promote the object): an object with a
                    // memory replica besides (promoted, or written through) is read from
                    // memory, one only on disk asks the leader.
                    if regolith_proto::disk_tier::is_disk_generation(s.generation) {
                        continue;
                    }
                    replicas.push(Replica {
                        node_id: s.node_id,
                        generation: s.generation,
                        node_name: s.node_name.clone(),
                        data_addrs: s.data_addrs.clone(),
                        extents: vec![ext],
                        grants: vec![p.mac],
                    });
                }
            }
        }
        if replicas.is_empty() {
            return None;
        }
        Some(Placement {
            version: Version {
                term: e.term,
                id: e.id,
            },
            size: e.size,
            checksum: e.checksum,
            replicas,
        })
    }

    /// The interned segment, if mounted.
    pub fn segment(&self, node_id: u64, generation: u64) -> Option<&SegmentInfo> {
        let slot = *self.slots.get(&(node_id, generation))?;
        self.segments.get(slot as usize)?.as_ref()
    }

    // ------------------------------------------------------------------ the stream's changes

    /// Drops every object and segment (a resync starts); overrides stay.
    pub fn clear(&mut self) {
        self.clear_objects();
        self.segments.clear();
        self.slots.clear();
        self.free_slots.clear();
        self.applied = 0;
    }

    fn clear_objects(&mut self) {
        self.table = HashTable::new();
        self.chunks = Vec::new();
        self.len = 0;
        self.multi = HashMap::new();
    }

    /// The stream's `RemoveAll`: every object is gone, segments stay.
    pub fn stream_remove_all(&mut self) {
        self.clear_objects();
        self.hidden_since = None;
    }

    pub fn segment_up(&mut self, info: SegmentInfo) {
        let id = (info.node_id, info.generation);
        if let Some(&slot) = self.slots.get(&id) {
            self.segments[slot as usize] = Some(info);
            return;
        }
        let slot = match self.free_slots.pop() {
            Some(s) => {
                self.segments[s as usize] = Some(info);
                s
            }
            None => {
                self.segments.push(Some(info));
                (self.segments.len() - 1) as u32
            }
        };
        self.slots.insert(id, slot);
    }

    /// A segment went away: its objects were changed or removed by earlier changes.
    pub fn segment_down(&mut self, node_id: u64, generation: u64) {
        if let Some(slot) = self.slots.remove(&(node_id, generation)) {
            self.segments[slot as usize] = None;
            self.free_slots.push(slot);
        }
    }

    /// The stream's put (an object committed, or its replicas changed).
    pub fn stream_put(&mut self, key: &str, p: &Placement) {
        let ends = match self.overrides.get(key) {
            Some((Override::Put(o), _)) => p.version >= o.version,
            Some((Override::Removed(Some(v)), _)) => p.version > *v,
            Some((Override::Removed(None), _)) | None => false,
        };
        if ends {
            self.overrides.remove(key);
        }
        self.upsert(key, p);
    }

    /// The stream's removal of a key.
    pub fn stream_remove(&mut self, key: &str, now_ms: u64) {
        let gone = self.indexed_version(key);
        let ends = match self.overrides.get(key) {
            Some((Override::Removed(_), _)) => true,
            Some((Override::Put(o), _)) => gone.is_some_and(|g| g >= o.version),
            None => false,
        };
        if ends {
            self.overrides.remove(key);
        }
        if let Some(v) = gone {
            if self.removed_lately.len() >= RECENT_REMOVALS {
                self.expire_removals(now_ms);
            }
            if self.removed_lately.len() < RECENT_REMOVALS {
                self.removed_lately.insert(key.to_string(), (v, now_ms));
                self.removed_times.push_back((now_ms, key.to_string()));
            }
        }
        self.delete(key);
    }

    /// The version of `key` this node sees now (overrides first).
    fn visible_version(&self, key: &str) -> Option<Version> {
        match self.overrides.get(key) {
            Some((Override::Put(p), _)) => Some(p.version),
            Some((Override::Removed(_), _)) => None,
            None => self.indexed_version(key),
        }
    }

    // ------------------------------------------------------------------ this node's writes

    /// A put this node's client made was acknowledged.
    pub fn local_put(&mut self, key: &str, p: Placement, now_ms: u64) {
        let passed = self.indexed_version(key).is_some_and(|v| v >= p.version)
            || self
                .removed_lately
                .get(key)
                .is_some_and(|(v, _)| *v >= p.version);
        if passed {
            // The stream showed this put (and maybe its removal) already.
            self.overrides.remove(key);
            return;
        }
        self.set_override(key, Override::Put(p), now_ms);
    }

    /// A remove this node's client made found and removed the key.
    pub fn local_remove(&mut self, key: &str, now_ms: u64) {
        match self.visible_version(key) {
            Some(v) => self.set_override(key, Override::Removed(Some(v)), now_ms),
            // Nothing visible: the stream removed it already, or never showed it.
            None if self.removed_lately.contains_key(key) => {
                self.overrides.remove(key);
            }
            None => self.set_override(key, Override::Removed(None), now_ms),
        }
    }

    /// A remove-all this node's client made succeeded: nothing the stream showed before it
    /// counts until the stream shows it too.
    pub fn local_remove_all(&mut self, now_ms: u64) {
        self.overrides.clear();
        self.override_times.clear();
        self.hidden_since = Some(now_ms);
    }

    fn set_override(&mut self, key: &str, o: Override, now_ms: u64) {
        self.overrides.insert(key.to_string(), (o, now_ms));
        self.override_times.push_back((now_ms, key.to_string()));
    }

    /// Drops overrides and remembered removals older than [`OVERRIDE_MS`]. Runs with every
    /// stream message, so it looks only at the oldest (an override the stream confirmed ended
    /// when its change was applied: `stream_put`, `stream_remove`).
    pub fn expire_overrides(&mut self, now_ms: u64) {
        if self
            .hidden_since
            .is_some_and(|t| now_ms.saturating_sub(t) > OVERRIDE_MS)
        {
            self.hidden_since = None;
        }
        while let Some((at, _)) = self.override_times.front() {
            if now_ms.saturating_sub(*at) <= OVERRIDE_MS {
                break;
            }
            if let Some((at, key)) = self.override_times.pop_front() {
                // Only the override made then: the key may have a newer one.
                if self.overrides.get(&key).is_some_and(|(_, t)| *t == at) {
                    self.overrides.remove(&key);
                }
            }
        }
        self.expire_removals(now_ms);
    }

    fn expire_removals(&mut self, now_ms: u64) {
        while let Some((at, _)) = self.removed_times.front() {
            if now_ms.saturating_sub(*at) <= OVERRIDE_MS {
                break;
            }
            if let Some((at, key)) = self.removed_times.pop_front() {
                if self.removed_lately.get(&key).is_some_and(|(_, t)| *t == at) {
                    self.removed_lately.remove(&key);
                }
            }
        }
    }

    pub fn overrides(&self) -> usize {
        self.overrides.len()
    }

    /// The version the table holds for `key` (overrides aside).
    pub fn indexed_version(&self, key: &str) -> Option<Version> {
        let (h, c) = self.hash(key);
        let e = self.entry(self.find(h, c)?);
        Some(Version {
            term: e.term,
            id: e.id,
        })
    }

    // ------------------------------------------------------------------ the table

    fn slot_of(&mut self, r: &Replica) -> u32 {
        if let Some(&s) = self.slots.get(&(r.node_id, r.generation)) {
            return s;
        }
        // A segment the stream has not announced (cannot happen in order): intern it bare,
        // so a get through it fails over to the leader.
        self.segment_up(SegmentInfo {
            node_id: r.node_id,
            generation: r.generation,
            node_name: r.node_name.clone(),
            data_addrs: r.data_addrs.clone(),
        });
        self.slots
            .get(&(r.node_id, r.generation))
            .copied()
            .unwrap_or(MULTI)
    }

    fn upsert(&mut self, key: &str, p: &Placement) {
        let (hash, check) = self.hash(key);
        let mut pieces = Vec::new();
        for r in &p.replicas {
            let slot = self.slot_of(r);
            pieces.extend(r.extents.iter().enumerate().map(|(i, e)| Piece {
                slot,
                offset: e.offset,
                len: e.len,
                mac: r.grants.get(i).copied().unwrap_or_default(),
            }));
        }
        let (slot, offset, len, mac) = match pieces.as_slice() {
            [one] => (one.slot, one.offset, one.len, one.mac),
            _ => (MULTI, 0, 0, [0; MAC_LEN]),
        };
        let entry = Entry {
            hash,
            check,
            slot,
            size: p.size,
            checksum: p.checksum,
            term: p.version.term,
            id: p.version.id,
            offset,
            len,
            mac,
        };
        if slot == MULTI {
            self.multi.insert(hash, pieces.into_boxed_slice());
        } else {
            self.multi.remove(&hash);
        }
        if let Some(i) = self.find(hash, check) {
            *self.entry_mut(i) = entry;
            return;
        }
        let i = self.len as u32;
        if self.chunks.last().is_none_or(|c| c.len() == CHUNK) {
            self.chunks.push(Vec::with_capacity(CHUNK));
        }
        if let Some(c) = self.chunks.last_mut() {
            c.push(entry);
        }
        self.len += 1;
        let chunks = &self.chunks;
        self.table.insert_unique(hash, i, |&j| {
            chunks[j as usize / CHUNK][j as usize % CHUNK].hash
        });
    }

    fn delete(&mut self, key: &str) {
        let (hash, check) = self.hash(key);
        let chunks = &self.chunks;
        let Ok(found) = self.table.find_entry(hash, |&i| {
            let e = &chunks[i as usize / CHUNK][i as usize % CHUNK];
            e.hash == hash && e.check == check
        }) else {
            return;
        };
        let (i, _) = found.remove();
        if self.entry(i).slot == MULTI {
            self.multi.remove(&hash);
        }
        // Swap-remove: the last entry moves into the hole; repoint its table slot.
        let last = (self.len - 1) as u32;
        if i != last {
            let moved = *self.entry(last);
            *self.entry_mut(i) = moved;
            if let Some(pos) = self.table.find_mut(moved.hash, |&j| j == last) {
                *pos = i;
            }
        }
        if let Some(c) = self.chunks.last_mut() {
            c.pop();
            if c.is_empty() {
                self.chunks.pop();
            }
        }
        self.len -= 1;
    }

    /// Heap bytes held (capacity, not length): what the index costs this process.
    pub fn heap_bytes(&self) -> usize {
        let entries: usize = self
            .chunks
            .iter()
            .map(|c| c.capacity() * std::mem::size_of::<Entry>())
            .sum();
        // hashbrown: one 4-byte value and one control byte per bucket.
        let table = self.table.capacity() * (std::mem::size_of::<u32>() + 1);
        let multi: usize = self
            .multi
            .values()
            .map(|p| p.len() * std::mem::size_of::<Piece>() + 32)
            .sum();
        entries + table + multi
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(node: u64) -> SegmentInfo {
        SegmentInfo {
            node_id: node,
            generation: 1,
            node_name: format!("n{node}"),
            data_addrs: vec![format!("127.0.0.{node}:7000").parse().unwrap()],
        }
    }

    fn placement(id: u64, nodes: &[u64], extents: &[(u64, u64)]) -> Placement {
        let size = extents.iter().map(|e| e.1).sum();
        Placement {
            version: Version { term: 3, id },
            size,
            checksum: id * 7,
            replicas: nodes
                .iter()
                .map(|&n| {
                    let s = seg(n);
                    Replica {
                        node_id: n,
                        generation: 1,
                        node_name: s.node_name,
                        data_addrs: s.data_addrs,
                        extents: extents
                            .iter()
                            .map(|&(offset, len)| Extent { offset, len })
                            .collect(),
                        grants: extents
                            .iter()
                            .map(|&(offset, _)| [(offset as u8) ^ (n as u8); MAC_LEN])
                            .collect(),
                    }
                })
                .collect(),
        }
    }

    fn index() -> Index {
        let mut ix = Index::new(42);
        ix.segment_up(seg(1));
        ix.segment_up(seg(2));
        ix
    }

    #[test]
    fn entries_are_80_bytes() {
        assert_eq!(std::mem::size_of::<Entry>(), 80);
    }

    #[test]
    fn puts_and_removes_round_trip_single_and_multi_piece_placements() {
        let mut ix = index();
        let one = placement(1, &[1], &[(0, 4096)]);
        let many = placement(2, &[1, 2], &[(8192, 100), (20000, 50)]);
        ix.stream_put("one", &one);
        ix.stream_put("many", &many);
        assert_eq!(ix.get("one"), Some(one.clone()));
        assert_eq!(ix.get("many"), Some(many));
        assert!(ix.contains("one") && !ix.contains("other"));
        ix.stream_remove("many", 0);
        assert_eq!(ix.get("many"), None);
        assert_eq!(ix.get("one"), Some(one));
        assert!(ix.multi.is_empty());
        assert_eq!(ix.len(), 1);
    }

    #[test]
    fn disk_replicas_are_left_to_the_leader_and_a_memory_copy_beside_them_is_read() {
        let mut ix = index();
        let disk_gen = regolith_proto::disk_tier::disk_generation(0);
        let mut on_disk = placement(1, &[1], &[(0, 4096)]);
        on_disk.replicas[0].generation = disk_gen;
        ix.stream_put("disk-only", &on_disk);
        assert!(ix.contains("disk-only"), "exists counts disk-only objects");
        assert_eq!(
            ix.get("disk-only"),
            None,
            "read with the leader's placement"
        );
        // Promoted (or written through): memory on node 2, the disk copy on node 1.
        let memory = placement(1, &[2], &[(8192, 4096)]);
        let mut both = memory.clone();
        both.replicas.push(on_disk.replicas[0].clone());
        ix.stream_put("both", &both);
        assert_eq!(ix.get("both"), Some(memory));
    }

    #[test]
    fn a_replaced_placement_replaces_the_entry() {
        let mut ix = index();
        ix.stream_put("k", &placement(1, &[1, 2], &[(0, 10)]));
        let shrunk = placement(1, &[2], &[(0, 10)]);
        ix.stream_put("k", &shrunk);
        assert_eq!(ix.get("k"), Some(shrunk));
        assert_eq!(ix.len(), 1);
        assert!(ix.multi.is_empty());
    }

    #[test]
    fn swap_removal_keeps_every_other_key_findable() {
        let mut ix = index();
        let n = CHUNK as u64 + 500;
        for i in 0..n {
            ix.stream_put(&format!("key-{i}"), &placement(i, &[1], &[(i * 10, 10)]));
        }
        for i in (0..n).step_by(3) {
            ix.stream_remove(&format!("key-{i}"), 0);
        }
        for i in 0..n {
            let got = ix.get(&format!("key-{i}"));
            if i % 3 == 0 {
                assert_eq!(got, None, "key-{i}");
            } else {
                assert_eq!(got.map(|p| p.version.id), Some(i), "key-{i}");
            }
        }
        assert_eq!(ix.len() as u64, n - n.div_ceil(3));
    }

    #[test]
    fn a_local_put_is_visible_at_once_and_an_older_stream_removal_does_not_hide_it() {
        let mut ix = index();
        // An earlier incarnation of the key, then this node's remove and new put, both
        // acknowledged before the stream shows any of it.
        ix.stream_put("k", &placement(1, &[1], &[(0, 10)]));
        ix.local_remove("k", 0);
        assert!(!ix.contains("k"), "read-your-remove");
        let newer = placement(2, &[1], &[(100, 10)]);
        ix.local_put("k", newer.clone(), 1);
        assert_eq!(ix.get("k"), Some(newer.clone()), "read-your-write");
        // The stream catches up in log order: the old removal must not hide the new put...
        ix.stream_remove("k", 0);
        assert_eq!(ix.get("k"), Some(newer.clone()));
        // ...and once it shows the new put the override is done.
        ix.stream_put("k", &newer);
        assert_eq!(ix.overrides(), 0);
        assert_eq!(ix.get("k"), Some(newer));
    }

    #[test]
    fn a_local_remove_hides_older_stream_puts_until_the_stream_removes_the_key() {
        let mut ix = index();
        ix.local_remove("k", 0);
        ix.stream_put("k", &placement(1, &[1], &[(0, 10)]));
        assert!(!ix.contains("k"));
        ix.stream_remove("k", 0);
        assert_eq!(ix.overrides(), 0);
        // A later put by anyone shows again.
        ix.stream_put("k", &placement(2, &[1], &[(0, 10)]));
        assert!(ix.contains("k"));
    }

    #[test]
    fn overrides_expire_and_a_resync_confirms_puts_it_shows() {
        let mut ix = index();
        let p = placement(1, &[1], &[(0, 10)]);
        ix.local_put("a", p.clone(), 0);
        ix.local_remove("b", 0);
        ix.clear();
        ix.segment_up(seg(1));
        ix.stream_put("a", &p);
        ix.expire_overrides(10);
        assert_eq!(ix.overrides(), 1, "the put is confirmed, the remove is not");
        ix.expire_overrides(OVERRIDE_MS + 1);
        assert_eq!(ix.overrides(), 0);
    }

    #[test]
    fn an_override_made_again_outlives_the_expiry_of_the_first() {
        let mut ix = index();
        ix.local_put("k", placement(1, &[1], &[(0, 10)]), 0);
        ix.local_remove("k", OVERRIDE_MS / 2);
        ix.expire_overrides(OVERRIDE_MS + 1);
        assert_eq!(ix.overrides(), 1, "the remove made later still holds");
        assert!(!ix.contains("k"));
        ix.expire_overrides(OVERRIDE_MS / 2 + OVERRIDE_MS + 1);
        assert_eq!(ix.overrides(), 0);
        // Stream removals are remembered for as long, with the same rule.
        ix.segment_up(seg(1));
        ix.stream_put("r", &placement(2, &[1], &[(0, 10)]));
        ix.stream_remove("r", 20_000);
        ix.expire_overrides(20_000 + OVERRIDE_MS);
        ix.local_put("r", placement(2, &[1], &[(0, 10)]), 20_000 + OVERRIDE_MS);
        assert_eq!(ix.overrides(), 0, "the stream removed that put already");
        ix.expire_overrides(20_001 + OVERRIDE_MS);
        ix.local_put("r", placement(2, &[1], &[(0, 10)]), 20_001 + OVERRIDE_MS);
        assert_eq!(ix.overrides(), 1, "the removal is forgotten once it is old");
    }

    #[test]
    fn a_local_remove_all_hides_the_stream_until_it_shows_the_removal() {
        let mut ix = index();
        ix.stream_put("old", &placement(1, &[1], &[(0, 10)]));
        ix.local_put("mine", placement(2, &[1], &[(10, 10)]), 0);
        ix.local_remove_all(1);
        assert!(!ix.contains("old") && !ix.contains("mine"));
        let after = placement(3, &[1], &[(20, 10)]);
        ix.local_put("after", after.clone(), 2);
        assert_eq!(ix.get("after"), Some(after.clone()));
        // The stream, in log order: the put of "mine" (older), then the removal, then "after".
        ix.stream_put("mine", &placement(2, &[1], &[(10, 10)]));
        assert!(!ix.contains("mine"));
        ix.stream_remove_all();
        assert!(!ix.contains("old"));
        ix.stream_put("after", &after);
        assert_eq!(ix.overrides(), 0);
        assert_eq!(ix.get("after"), Some(after));
        assert_eq!(ix.len(), 1);
    }

    #[test]
    fn a_stream_that_overtakes_the_reply_leaves_no_override_behind() {
        let mut ix = index();
        let v1 = placement(1, &[1], &[(0, 10)]);
        // The stream shows the put and its removal by another node before this node's put is
        // acknowledged: no override may resurrect it.
        ix.stream_put("k", &v1);
        ix.stream_remove("k", 0);
        ix.local_put("k", v1.clone(), 1);
        assert!(!ix.contains("k"));
        assert_eq!(ix.overrides(), 0);
        // This node's remove, whose removal the stream showed first: a later put by another
        // node must show.
        ix.stream_put("j", &v1);
        ix.stream_remove("j", 2);
        ix.local_remove("j", 3);
        ix.stream_put("j", &placement(2, &[1], &[(0, 10)]));
        assert!(ix.contains("j"));
    }

    #[test]
    fn overrides_end_with_newer_versions_from_the_stream() {
        let mut ix = index();
        // A remove override of version 1 ends with a put of version 2 by anyone.
        ix.stream_put("k", &placement(1, &[1], &[(0, 10)]));
        ix.local_remove("k", 0);
        ix.stream_put("k", &placement(1, &[1], &[(0, 10)]));
        assert!(!ix.contains("k"), "the older put is hidden");
        let v2 = placement(2, &[1], &[(0, 10)]);
        ix.stream_put("k", &v2);
        assert_eq!(ix.get("k"), Some(v2));
        assert_eq!(ix.overrides(), 0);
        // A put override of version 3 ends when the stream removes version 3.
        let v3 = placement(3, &[1], &[(20, 10)]);
        ix.local_put("p", v3.clone(), 0);
        ix.stream_put("p", &v3);
        ix.local_put("p", v3.clone(), 0);
        ix.stream_remove("p", 0);
        assert!(!ix.contains("p"));
        assert_eq!(ix.overrides(), 0);
    }

    #[test]
    fn segments_are_interned_and_their_slots_reused() {
        let mut ix = index();
        ix.segment_down(1, 1);
        assert!(ix.segment(1, 1).is_none());
        ix.segment_up(SegmentInfo {
            generation: 2,
            ..seg(1)
        });
        assert_eq!(ix.segments.len(), 2, "the freed slot was reused");
        assert_eq!(ix.segment(1, 2).map(|s| s.generation), Some(2));
    }

    #[test]
    fn a_million_objects_cost_under_96_bytes_each() {
        let mut ix = index();
        let n = 1_000_000u64;
        for i in 0..n {
            ix.stream_put(
                &format!("model@1@0@{i:016x}"),
                &placement(i, &[1], &[(i * 4096, 4096)]),
            );
        }
        let per = ix.heap_bytes() as f64 / n as f64;
        assert!(per < 96.0, "{per:.1} bytes per object");
    }
}
