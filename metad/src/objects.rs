//! The object table of the state machine: key → [`Object`], sharded by a fixed hash of the key.
//!
//! Why shards: a single table of a million objects grows by reallocating (and copying) one
//! array of a hundred-odd MB, which costs a transient peak of half as much again; shards grow
//! a little at a time. Each shard is insertion-ordered (with swap-remove), and the shard of a key
//! is `xxh3(key) % SHARDS` — the same on every replica — so iteration order is a function of the
//! command sequence alone, and a snapshot restores it exactly.
//!
//! Snapshots are written while applies go on ([`Objects::begin_snapshot`]): from then on, each
//! change to a shard the snapshot's writer has not taken yet also records how to undo it (the
//! object before, and where it was). The writer takes one shard at a time under the state's
//! lock: a copy of the shard as it is (a few thousand objects of 4096 shards, at ten million),
//! with the changes since undone, newest first, which gives back the shard exactly as it was,
//! order included. Memory is one shard plus the changes made meanwhile, never a copy of the
//! state; the lock is held for one shard at a time. (Copy-on-write shards were tried first:
//! under a write load every shard is touched within the first entries applied, so the applies
//! copied, or serialised, the whole state at once, stalling for seconds at ten million objects.)

mod shard;

use std::sync::Arc;

use parking_lot::Mutex;
use xxhash_rust::xxh3::xxh3_64;

use crate::types::Object;

pub use shard::Shard;

pub const SHARDS: usize = 4096;

#[derive(Debug)]
pub struct Objects {
    shards: Vec<Shard>,
    len: usize,
    /// The snapshots being written (usually none or one).
    writing: Vec<Arc<Mutex<Writing>>>,
}

impl Default for Objects {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            len: 0,
            writing: Vec::new(),
        }
    }
}

impl Clone for Objects {
    /// A clone copies the objects, not the snapshots being written from them.
    fn clone(&self) -> Self {
        Self {
            shards: self.shards.clone(),
            len: self.len,
            writing: Vec::new(),
        }
    }
}

/// How to undo one change to a shard.
#[derive(Clone, Debug)]
enum Undo {
    /// A new key was pushed at the end.
    Inserted,
    /// `key` was swap-removed from `pos` (the last object moved there).
    Removed {
        pos: usize,
        key: Box<str>,
        obj: Object,
    },
    /// `key`'s object was `obj` before.
    Updated { key: Box<str>, obj: Object },
}

/// One snapshot being written: which shards its writer has taken, the changes to undo on the
/// others, and the shards kept for it when the state was replaced before it took them.
#[derive(Debug)]
struct Writing {
    taken: Vec<bool>,
    undo: Vec<Vec<Undo>>,
    kept: Vec<Option<Shard>>,
}

/// A snapshot writer's handle on the object table as it was when the snapshot began.
#[derive(Debug)]
pub struct SnapshotObjects {
    writing: Arc<Mutex<Writing>>,
}

impl SnapshotObjects {
    /// Shard `i` as it was when the snapshot began, once. `live` is the table the snapshot was
    /// begun on (or any other, once that one was replaced), read under the state's lock.
    pub fn take_shard(&self, live: &Objects, i: usize) -> std::io::Result<Shard> {
        let mut w = self.writing.lock();
        if let Some(kept) = w.kept.get_mut(i).and_then(Option::take) {
            return Ok(kept);
        }
        if w.taken.get(i).copied().unwrap_or(true) {
            return Err(std::io::Error::other(format!(
                "snapshot shard {i} was already taken"
            )));
        }
        w.taken[i] = true;
        let undo = std::mem::take(&mut w.undo[i]);
        drop(w);
        Ok(undone(live.shards[i].clone(), undo))
    }
}

/// `shard` with `undo` (oldest first) undone, newest first.
fn undone(mut shard: Shard, undo: Vec<Undo>) -> Shard {
    for u in undo.into_iter().rev() {
        match u {
            Undo::Inserted => {
                shard.pop();
            }
            Undo::Removed { pos, key, obj } => {
                shard.push(full_hash(&key), key, obj);
                let last = shard.len() - 1;
                shard.swap_indices(pos.min(last), last);
            }
            Undo::Updated { key, obj } => {
                if let Some(o) = shard.get_mut(full_hash(&key), &key) {
                    *o = obj;
                }
            }
        }
    }
    shard
}

/// One shard's objects as snapshot records, in order.
pub fn write_shard(shard: &Shard, w: &mut dyn std::io::Write) -> std::io::Result<()> {
    for (k, o) in shard.iter() {
        bincode::serialize_into(&mut *w, &(k, o))
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    }
    Ok(())
}

/// A position in the iteration order, for rotating scans.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Cursor {
    pub shard: usize,
    pub index: usize,
}

fn full_hash(key: &str) -> u64 {
    xxh3_64(key.as_bytes())
}

/// The shard of a key (by the low bits of its xxh3), and that hash, which the shard reuses.
fn locate(key: &str) -> (usize, u64) {
    let h = full_hash(key);
    ((h % SHARDS as u64) as usize, h)
}

#[cfg(test)]
fn shard_of(key: &str) -> usize {
    locate(key).0
}

impl Objects {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn get(&self, key: &str) -> Option<&Object> {
        let (i, h) = locate(key);
        self.shards[i].get(h, key)
    }

    pub fn get_key_value(&self, key: &str) -> Option<(&str, &Object)> {
        let (i, h) = locate(key);
        self.shards[i].get_full(h, key).map(|(_, k, v)| (k, v))
    }

    /// The object under `key`, to change its replicated state (the change is recorded for the
    /// snapshots being written; for the leader's access time use [`Objects::touch`]).
    pub fn get_mut(&mut self, key: &str) -> Option<&mut Object> {
        let (i, h) = locate(key);
        let (_, k, o) = self.shards[i].get_full(h, key)?;
        if self.recording(i) {
            let undo = Undo::Updated {
                key: k.into(),
                obj: o.clone(),
            };
            self.record(i, undo);
        }
        self.shards[i].get_mut(h, key)
    }

    /// Sets the leader-memory access time of `key` (not replicated, not in snapshots: nothing
    /// to record) and answers the object.
    pub fn touch(&mut self, key: &str, access_s: u32) -> Option<&Object> {
        let (i, h) = locate(key);
        let o = self.shards[i].get_mut(h, key)?;
        o.access_s = access_s;
        Some(o)
    }

    /// Whether a snapshot being written has yet to take shard `i`.
    fn recording(&self, i: usize) -> bool {
        self.writing.iter().any(|w| !w.lock().taken[i])
    }

    fn record(&mut self, i: usize, undo: Undo) {
        let pending: Vec<_> = self
            .writing
            .iter()
            .filter(|w| !w.lock().taken[i])
            .cloned()
            .collect();
        let Some((last, others)) = pending.split_last() else {
            return;
        };
        for w in others {
            w.lock().undo[i].push(undo.clone());
        }
        last.lock().undo[i].push(undo);
    }

    /// Begins a snapshot of the table as it is now; see the module doc.
    pub fn begin_snapshot(&mut self) -> SnapshotObjects {
        // Writers that finished (or were dropped) hold no handle any more.
        self.writing.retain(|w| Arc::strong_count(w) > 1);
        let writing = Arc::new(Mutex::new(Writing {
            taken: vec![false; SHARDS],
            undo: (0..SHARDS).map(|_| Vec::new()).collect(),
            kept: (0..SHARDS).map(|_| None).collect(),
        }));
        self.writing.push(writing.clone());
        SnapshotObjects { writing }
    }

    /// The table is being replaced (a snapshot from the leader was installed): the snapshots
    /// being written keep the shards they have not taken yet, as they were when they began.
    pub fn detach_snapshots(&mut self) {
        let writing: Vec<_> = std::mem::take(&mut self.writing)
            .into_iter()
            .filter(|w| Arc::strong_count(w) > 1)
            .collect();
        for (n, w) in writing.iter().enumerate() {
            let last = n + 1 == writing.len();
            let mut w = w.lock();
            for i in 0..SHARDS {
                if w.taken[i] {
                    continue;
                }
                w.taken[i] = true;
                let shard = if last {
                    std::mem::take(&mut self.shards[i])
                } else {
                    self.shards[i].clone()
                };
                let undo = std::mem::take(&mut w.undo[i]);
                w.kept[i] = Some(undone(shard, undo));
            }
        }
    }

    /// The shards in order, for a snapshot of a table nothing changes meanwhile.
    pub fn shards(&self) -> impl Iterator<Item = &Shard> {
        self.shards.iter()
    }

    pub fn contains_key(&self, key: &str) -> bool {
        let (i, h) = locate(key);
        self.shards[i].contains_key(h, key)
    }

    /// Inserts a new object; returns false (and changes nothing) when the key exists.
    pub fn insert_new(&mut self, key: &str, obj: Object) -> bool {
        let (i, h) = locate(key);
        if self.shards[i].contains_key(h, key) {
            return false;
        }
        if self.recording(i) {
            self.record(i, Undo::Inserted);
        }
        self.shards[i].push(h, key.into(), obj);
        self.len += 1;
        true
    }

    pub fn remove(&mut self, key: &str) -> Option<Object> {
        let (i, h) = locate(key);
        let (pos, k, o) = self.shards[i].swap_remove_full(h, key)?;
        if self.recording(i) {
            let undo = Undo::Removed {
                pos,
                key: k,
                obj: o.clone(),
            };
            self.record(i, undo);
        }
        self.len -= 1;
        Some(o)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &Object)> {
        self.shards.iter().flat_map(|s| s.iter())
    }

    /// The objects of one shard (`0..SHARDS`; a key never moves between shards).
    pub fn shard(&self, shard: usize) -> impl Iterator<Item = (&str, &Object)> {
        self.shards.get(shard).into_iter().flat_map(|s| s.iter())
    }

    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.shards.iter().flat_map(|s| s.keys())
    }

    /// Bytes of the table's arrays, of its hash tables, and of its keys (a walk of every key).
    pub fn footprint(&self) -> (usize, usize, usize) {
        let (mut entries, mut index) = (0, 0);
        for s in &self.shards {
            let (e, i) = s.table_bytes();
            entries += e;
            index += i;
        }
        (entries, index, self.keys().map(str::len).sum())
    }

    /// Up to `n` objects from `from` on, wrapping around; returns them and where to go on.
    pub fn scan(&self, from: Cursor, n: usize) -> (Vec<(&str, &Object)>, Cursor) {
        let mut out = Vec::with_capacity(n.min(self.len));
        let mut c = Cursor {
            shard: from.shard % SHARDS,
            index: from.index,
        };
        let mut empty_shards = 0;
        while out.len() < n.min(self.len) && empty_shards <= SHARDS {
            let shard = &self.shards[c.shard];
            match shard.get_index(c.index) {
                Some((k, v)) => {
                    out.push((k, v));
                    c.index += 1;
                    empty_shards = 0;
                }
                None => {
                    c = Cursor {
                        shard: (c.shard + 1) % SHARDS,
                        index: 0,
                    };
                    empty_shards += 1;
                }
            }
        }
        (out, c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Pin, Replicas, Version};

    fn obj(id: u64) -> Object {
        Object::new(
            id,
            id * 7,
            Version { term: 1, id },
            Replicas::default(),
            Pin::None,
            0,
        )
    }

    fn table(n: u64) -> Objects {
        let mut t = Objects::default();
        for i in 0..n {
            assert!(t.insert_new(&format!("k{i}"), obj(i)));
        }
        t
    }

    /// The table's objects in iteration order.
    fn contents(t: &Objects) -> Vec<(String, Object)> {
        t.iter().map(|(k, o)| (k.to_string(), o.clone())).collect()
    }

    /// Every shard taken from `snap` (those in `skip` were taken before), in shard order.
    fn taken(
        snap: &SnapshotObjects,
        live: &Objects,
        skip: &[(usize, Shard)],
    ) -> Vec<(String, Object)> {
        let mut out = Vec::new();
        for i in 0..SHARDS {
            let shard = match skip.iter().find(|(j, _)| *j == i) {
                Some((_, s)) => s.clone(),
                None => snap.take_shard(live, i).unwrap(),
            };
            // The leader's access times are not snapshot state (not written, not recorded).
            out.extend(shard.into_iter().map(|(k, mut o)| {
                o.access_s = 0;
                (k.to_string(), o)
            }));
        }
        out
    }

    /// A small deterministic generator (no dependency for a test).
    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self, n: u64) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (self.0 >> 33) % n
        }
    }

    /// Random inserts, removes and updates between the writer's takes: every shard comes back
    /// exactly as it was when the snapshot began, order included (a restore rebuilds the same
    /// iteration order from it).
    #[test]
    fn a_snapshot_is_the_table_when_it_began_whatever_changes_meanwhile() {
        let mut t = table(20_000);
        let before = contents(&t);
        let snap = t.begin_snapshot();
        let mut rng = Lcg(7);
        let mut early = Vec::new();
        let mut next_key = 20_000;
        for round in 0..4_000 {
            let k = format!("k{}", rng.next(next_key));
            match rng.next(4) {
                0 => {
                    t.remove(&k);
                }
                1 => {
                    if let Some(o) = t.get_mut(&k) {
                        o.checksum = round;
                    }
                }
                2 => {
                    assert!(t.insert_new(&format!("k{next_key}"), obj(next_key)));
                    next_key += 1;
                }
                _ => {
                    t.touch(&k, 99);
                }
            }
            if round % 10 == 0 {
                let i = rng.next(SHARDS as u64) as usize;
                if !early.iter().any(|(j, _)| *j == i) {
                    early.push((i, snap.take_shard(&t, i).unwrap()));
                }
            }
        }
        assert_ne!(contents(&t), before, "the changes changed nothing");
        assert_eq!(taken(&snap, &t, &early), before);
        assert!(snap.take_shard(&t, 0).is_err(), "a shard is taken once");
    }

    /// Changes to shards the writer has taken, and the leader's access times, record nothing.
    #[test]
    fn only_changes_the_writer_still_needs_are_recorded() {
        let mut t = table(2_000);
        let snap = t.begin_snapshot();
        let i = shard_of("k1");
        let _ = snap.take_shard(&t, i).unwrap();
        t.get_mut("k1").unwrap().checksum = 1;
        t.touch("k2", 5);
        let w = snap.writing.lock();
        assert!(w.undo[i].is_empty());
        assert!(w.undo[shard_of("k2")].is_empty());
        drop(w);
        drop(snap);
        // A finished writer is forgotten at the next snapshot.
        let _again = t.begin_snapshot();
        assert_eq!(t.writing.len(), 1);
    }

    /// Two snapshots at once (a Raft snapshot and a backup): each gets the table as it was when
    /// it began.
    #[test]
    fn two_snapshots_at_once_each_see_their_own_table() {
        let mut t = table(3_000);
        let first = contents(&t);
        let a = t.begin_snapshot();
        for i in 0..300 {
            t.remove(&format!("k{i}")).unwrap();
        }
        let second = contents(&t);
        let b = t.begin_snapshot();
        for i in 300..600 {
            t.remove(&format!("k{i}")).unwrap();
            t.get_mut(&format!("k{}", i + 1000)).unwrap().size = 0;
        }
        assert_eq!(taken(&b, &t, &[]), second);
        assert_eq!(taken(&a, &t, &[]), first);
    }

    /// The table replaced while a snapshot is written (a snapshot from the leader installed):
    /// the writer still gets the old table, from what it kept.
    #[test]
    fn a_replaced_table_leaves_the_writer_what_it_needs() {
        let mut t = table(5_000);
        let before = contents(&t);
        let snap = t.begin_snapshot();
        let early = vec![(3, snap.take_shard(&t, 3).unwrap())];
        for i in 0..500 {
            t.remove(&format!("k{i}"));
        }
        std::mem::replace(&mut t, table(10)).detach_snapshots();
        // (The temporary is the replaced table: detached, then dropped.)
        assert_eq!(taken(&snap, &t, &early), before);
    }
}
