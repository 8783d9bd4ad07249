//! The object table of the state machine: key → [`Object`], sharded by a fixed hash of the key.
//!
//! Why shards: a single table of a million objects grows by reallocating (and copying) one
//! array of a hundred-odd MB, which costs a transient peak of half as much again; 64 shards grow
//! a few MB at a time. Each shard is insertion-ordered (with swap-remove), and the shard of a key
//! is `xxh3(key) % SHARDS` — the same on every replica — so iteration order is a function of the
//! command sequence alone, and a snapshot restores it exactly.

use indexmap::IndexMap;
use xxhash_rust::xxh3::xxh3_64;

use crate::types::Object;

pub const SHARDS: usize = 64;

#[derive(Clone, Debug)]
pub struct Objects {
    shards: Vec<IndexMap<Box<str>, Object>>,
    len: usize,
}

impl Default for Objects {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| IndexMap::new()).collect(),
            len: 0,
        }
    }
}

/// A position in the iteration order, for rotating scans.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Cursor {
    pub shard: usize,
    pub index: usize,
}

fn shard_of(key: &str) -> usize {
    (xxh3_64(key.as_bytes()) % SHARDS as u64) as usize
}

impl Objects {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn get(&self, key: &str) -> Option<&Object> {
        self.shards[shard_of(key)].get(key)
    }

    pub fn get_key_value(&self, key: &str) -> Option<(&str, &Object)> {
        self.shards[shard_of(key)]
            .get_key_value(key)
            .map(|(k, v)| (&**k, v))
    }

    pub fn get_mut(&mut self, key: &str) -> Option<&mut Object> {
        self.shards[shard_of(key)].get_mut(key)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.shards[shard_of(key)].contains_key(key)
    }

    /// Inserts a new object; returns false (and changes nothing) when the key exists.
    pub fn insert_new(&mut self, key: &str, obj: Object) -> bool {
        let shard = &mut self.shards[shard_of(key)];
        if shard.contains_key(key) {
            return false;
        }
        shard.insert(key.into(), obj);
        self.len += 1;
        true
    }

    pub fn remove(&mut self, key: &str) -> Option<Object> {
        let o = self.shards[shard_of(key)].swap_remove(key)?;
        self.len -= 1;
        Some(o)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &Object)> {
        self.shards
            .iter()
            .flat_map(|s| s.iter().map(|(k, v)| (&**k, v)))
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&str, &mut Object)> {
        self.shards
            .iter_mut()
            .flat_map(|s| s.iter_mut().map(|(k, v)| (&**k, v)))
    }

    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut Object> {
        self.shards.iter_mut().flat_map(|s| s.values_mut())
    }

    /// The objects of one shard (`0..SHARDS`; a key never moves between shards).
    pub fn shard(&self, shard: usize) -> impl Iterator<Item = (&str, &Object)> {
        self.shards
            .get(shard)
            .into_iter()
            .flat_map(|s| s.iter().map(|(k, v)| (&**k, v)))
    }

    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.shards.iter().flat_map(|s| s.keys().map(|k| &**k))
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
                    out.push((&**k, v));
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
