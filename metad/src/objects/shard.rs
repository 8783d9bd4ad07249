//! One shard of the object table: the objects in insertion order (removal swaps the last one
//! into the hole), found through a hash table of their positions.
//!
//! What it saves over an `IndexMap<Box<str>, Object>` at ten million objects (issue 17): no
//! hash stored beside each object (8 bytes; it is recomputed from the key when the table
//! grows), 4-byte positions instead of 8, and the array grows by a sixteenth at a time instead of
//! doubling with the hash table, so its unused tail is ~3 % rather than up to half of it.

use hashbrown::HashTable;
use xxhash_rust::xxh3::xxh3_64;

use crate::types::Object;

#[derive(Clone, Debug, Default)]
pub struct Shard {
    entries: Vec<(Box<str>, Object)>,
    index: HashTable<u32>,
}

/// The hash of `key` inside its shard. The shard itself was chosen by the low bits of the same
/// xxh3, identical for every key of the shard: those are shifted out, and the rest mixed so
/// that the hash table's high-bit tags vary too.
pub fn inner_hash(full: u64) -> u64 {
    (full >> 12).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

fn hash_of(key: &str) -> u64 {
    inner_hash(xxh3_64(key.as_bytes()))
}

impl Shard {
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The position of `key`, given its full xxh3.
    fn position(&self, full: u64, key: &str) -> Option<usize> {
        let entries = &self.entries;
        self.index
            .find(inner_hash(full), |&p| &*entries[p as usize].0 == key)
            .map(|&p| p as usize)
    }

    pub fn get(&self, full: u64, key: &str) -> Option<&Object> {
        self.position(full, key).map(|p| &self.entries[p].1)
    }

    pub fn get_full(&self, full: u64, key: &str) -> Option<(usize, &str, &Object)> {
        self.position(full, key).map(|p| {
            let (k, o) = &self.entries[p];
            (p, &**k, o)
        })
    }

    pub fn get_mut(&mut self, full: u64, key: &str) -> Option<&mut Object> {
        let p = self.position(full, key)?;
        Some(&mut self.entries[p].1)
    }

    pub fn contains_key(&self, full: u64, key: &str) -> bool {
        self.position(full, key).is_some()
    }

    /// The object at position `i` of the iteration order.
    pub fn get_index(&self, i: usize) -> Option<(&str, &Object)> {
        self.entries.get(i).map(|(k, o)| (&**k, o))
    }

    /// Appends `key` (which must not be in the shard) at the end.
    pub fn push(&mut self, full: u64, key: Box<str>, obj: Object) {
        // Positions are u32: 4 billion objects in one shard of 4096 would be ~400 GB of table.
        debug_assert!(self.entries.len() < u32::MAX as usize);
        if self.entries.len() == self.entries.capacity() {
            // A sixteenth at a time: a shard is a few thousand objects, so a copy is cheap
            // (~16 copies of the shard over its growth), and the unused tail stays small (see
            // the module doc).
            let more = (self.entries.len() / 16).max(4);
            self.entries.reserve_exact(more);
        }
        let p = self.entries.len() as u32;
        self.entries.push((key, obj));
        let entries = &self.entries;
        self.index
            .insert_unique(inner_hash(full), p, |&q| hash_of(&entries[q as usize].0));
    }

    /// Points the index slot that holds position `from` (the entry of `key`) at `to`.
    fn repoint(&mut self, key: &str, from: usize, to: usize) {
        if let Some(slot) = self.index.find_mut(hash_of(key), |&p| p as usize == from) {
            *slot = to as u32;
        }
    }

    /// Removes `key`; the last object takes its place. Answers where it was, and what.
    pub fn swap_remove_full(&mut self, full: u64, key: &str) -> Option<(usize, Box<str>, Object)> {
        let p = self.position(full, key)?;
        if let Ok(slot) = self
            .index
            .find_entry(inner_hash(full), |&q| q as usize == p)
        {
            slot.remove();
        }
        let last = self.entries.len() - 1;
        if p != last {
            let moved = self.entries[last].0.clone();
            self.repoint(&moved, last, p);
        }
        let (k, o) = self.entries.swap_remove(p);
        Some((p, k, o))
    }

    /// Removes the last object.
    pub fn pop(&mut self) -> Option<(Box<str>, Object)> {
        let (k, o) = self.entries.pop()?;
        let p = self.entries.len();
        if let Ok(slot) = self.index.find_entry(hash_of(&k), |&q| q as usize == p) {
            slot.remove();
        }
        Some((k, o))
    }

    /// Swaps the objects at positions `a` and `b` of the iteration order.
    pub fn swap_indices(&mut self, a: usize, b: usize) {
        if a == b || a >= self.entries.len() || b >= self.entries.len() {
            return;
        }
        let (ka, kb) = (self.entries[a].0.clone(), self.entries[b].0.clone());
        // Through a position no entry has, so that the two slots are told apart.
        self.repoint(&ka, a, u32::MAX as usize);
        self.repoint(&kb, b, a);
        self.repoint(&ka, u32::MAX as usize, b);
        self.entries.swap(a, b);
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &Object)> {
        self.entries.iter().map(|(k, o)| (&**k, o))
    }

    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(k, _)| &**k)
    }

    /// Bytes allocated for the array and the hash table (keys apart).
    pub fn table_bytes(&self) -> (usize, usize) {
        let entries = self.entries.capacity() * std::mem::size_of::<(Box<str>, Object)>();
        // A hash table of n slots holds n/8*7 positions: u32 each plus a control byte.
        let slots = (self.index.capacity() * 8).div_ceil(7).next_power_of_two();
        (entries, slots * 5)
    }
}

impl IntoIterator for Shard {
    type Item = (Box<str>, Object);
    type IntoIter = std::vec::IntoIter<(Box<str>, Object)>;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.into_iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Pin, Replicas, Version};

    fn obj(id: u64) -> Object {
        Object::new(
            id,
            id,
            Version { term: 1, id },
            Replicas::default(),
            Pin::None,
            0,
        )
    }

    fn full(key: &str) -> u64 {
        xxh3_64(key.as_bytes())
    }

    /// Every key is found at the position the iteration order gives it, after pushes,
    /// swap-removes, pops and swaps in any order (checked against a plain vector).
    #[test]
    fn positions_follow_every_change() {
        let mut s = Shard::default();
        let mut model: Vec<String> = Vec::new();
        let mut seed = 11u64;
        let mut next = |n: usize| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) as usize % n.max(1)
        };
        for round in 0..20_000u64 {
            match next(5) {
                0 | 1 => {
                    let k = format!("key-{round}");
                    s.push(full(&k), k.clone().into(), obj(round));
                    model.push(k);
                }
                2 if !model.is_empty() => {
                    let k = model[next(model.len())].clone();
                    let (p, got, _) = s.swap_remove_full(full(&k), &k).unwrap();
                    assert_eq!(&*got, k);
                    assert_eq!(model.swap_remove(p), k);
                }
                3 if !model.is_empty() => {
                    let (k, _) = s.pop().unwrap();
                    assert_eq!(model.pop().as_deref(), Some(&*k));
                }
                4 if !model.is_empty() => {
                    let (a, b) = (next(model.len()), next(model.len()));
                    s.swap_indices(a, b);
                    model.swap(a, b);
                }
                _ => {}
            }
        }
        assert_eq!(s.keys().collect::<Vec<_>>(), model);
        for (p, k) in model.iter().enumerate() {
            assert_eq!(s.get_full(full(k), k).map(|(q, _, _)| q), Some(p), "{k}");
        }
        assert!(!s.contains_key(full("key-missing"), "key-missing"));
    }

    /// The array grows by a sixteenth, not by doubling.
    #[test]
    fn the_array_grows_by_a_sixteenth() {
        let mut s = Shard::default();
        for i in 0..5_000u64 {
            let k = format!("k{i}");
            s.push(full(&k), k.into(), obj(i));
        }
        assert!(
            s.entries.capacity() <= 5_000 + 5_000 / 8 + 4,
            "{}",
            s.entries.capacity()
        );
    }
}
