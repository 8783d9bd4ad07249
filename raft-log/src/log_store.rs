//! The Raft log and vote, in sled: [`SledLogStore`] implements openraft's `RaftLogStorage`.
//!
//! # On-disk layout
//!
//! One sled database at `<data_dir>/raft.sled/` with two trees:
//!
//! | tree   | key                          | value                                              |
//! |--------|------------------------------|----------------------------------------------------|
//! | `log`  | log index, `u64` big-endian  | `bincode(openraft::Entry<C>)`, its first 8 KiB     |
//! | `log`  | index `u64` BE, chunk `u32` BE | the entry's next 8 KiB (chunks 1, 2, ... in order) |
//! | `meta` | `layout`                     | layout version, `u32` little-endian (currently 2)  |
//! | `meta` | `vote`                       | `bincode(openraft::Vote<u64>)`                     |
//! | `meta` | `committed`                  | `bincode(openraft::LogId<u64>)`; absent = none     |
//! | `meta` | `last_purged`                | `bincode(openraft::LogId<u64>)`; absent = none     |
//!
//! Keys are big-endian so that sled's byte order is log order: ranges and `last()` are plain tree
//! operations, and an entry's chunks sort right after its first record. bincode is bincode 1.3
//! with its default options (little-endian, fixed-width ints).
//!
//! An entry is stored in records of at most [`CHUNK_BYTES`] (layout 2): sled keeps a large value
//! in memory for as long as it is in the tree, whatever its cache capacity, and a metad entry of
//! a group commit is up to a few MB. With whole entries, a replica at ten million objects held
//! its whole unpurged log in memory (up to a snapshot's size, 1.2 GB: 660 MB measured); in 8 KiB
//! records sled's cache bounds it (`cargo run --release -p regolith-raft-log --example
//! sled_memory`: a 600 MiB log of 512 KiB entries keeps 1.2 GB resident, of 8 KiB records
//! 45 MB). Layout 1 (whole entries only) is layout 2 without chunks: it is read as it is and
//! restamped.
//!
//! # Durability
//!
//! sled's `flush` writes and fsyncs everything written before it, and after a crash sled recovers
//! a prefix of the writes, in order, across trees. The store relies on both:
//!
//! * `append` writes its entries as one sled batch, then hands openraft's callback to the
//!   [group-commit flusher](crate::flusher); the callback runs after the fsync that covers it.
//! * `save_vote` and `truncate` wait for a flush before returning.
//! * `save_committed` does not flush: a lost update only means that, after a restart, fewer
//!   entries are re-applied before the leader tells the node the commit index again. Because of
//!   prefix recovery, a `committed` that did survive never points past entries that did not.
//! * `purge` writes `last_purged` before it deletes the entries, so a crash in between leaves
//!   extra entries below `last_purged` (ignored), never a hole. The deletion itself runs on a
//!   thread of its own at low priority: openraft awaits `purge` in its core, and deleting a
//!   snapshot's worth of log (hundreds of MB at ten million objects, read back from disk by
//!   sled) there held up heartbeats for seconds (issue 17).

use std::fmt::Debug;
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{
    BasicNode, Entry, ErrorSubject, ErrorVerb, LogId, LogState, OptionalSend, RaftLogReader,
    RaftTypeConfig, StorageError, Vote,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::config::StorageConfig;
use crate::error::{Error, Result};
use crate::flusher::{Flusher, FlusherPause};
use crate::stats::StorageStats;
use crate::tail::{Encoded, TailCache};

/// Name of the sled database directory inside the data directory.
pub(crate) const SLED_DIR: &str = "raft.sled";

const LOG_TREE: &str = "log";
const META_TREE: &str = "meta";
const KEY_LAYOUT: &str = "layout";
const KEY_VOTE: &str = "vote";
const KEY_COMMITTED: &str = "committed";
const KEY_LAST_PURGED: &str = "last_purged";

/// Version of the layout described in the module documentation.
pub const LOG_LAYOUT_VERSION: u32 = 2;

/// Layouts this version reads (every layout-1 database is a valid layout-2 one).
const READABLE_LAYOUTS: [u32; 2] = [1, 2];

/// The largest record of the log tree: an entry larger than this is stored in chunks.
pub const CHUNK_BYTES: usize = 8 << 10;

/// Cache used when the database is opened only to look at it (`has_state`).
const PROBE_CACHE_BYTES: u64 = 1 << 20;

/// openraft log storage on sled. Cheap to clone: clones share the database, and a clone is also
/// the log reader openraft hands to replication tasks.
pub struct SledLogStore<C> {
    shared: Arc<Shared>,
    _config: PhantomData<fn() -> C>,
}

struct Shared {
    /// Declared first so that it is dropped first: its thread holds a `Db` handle, and joining it
    /// before the other handles go means the database is closed when the last store is dropped.
    flusher: Flusher,
    /// The first index not purged (0: nothing purged): reads start there.
    first_kept: std::sync::atomic::AtomicU64,
    /// The thread deleting purged entries, if one was started (joined on drop).
    purging: parking_lot::Mutex<Option<std::thread::JoinHandle<()>>>,
    log: sled::Tree,
    meta: sled::Tree,
    /// The newest entries, encoded (see [`crate::tail`]).
    tail: parking_lot::Mutex<TailCache>,
    path: PathBuf,
    max_read_bytes: u64,
    stats: Arc<StorageStats>,
}

impl Drop for Shared {
    /// The purge thread holds a handle on the log tree: it finishes before the database closes.
    fn drop(&mut self) {
        if let Some(h) = self.purging.get_mut().take() {
            let _ = h.join();
        }
    }
}

impl<C> Clone for SledLogStore<C> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
            _config: PhantomData,
        }
    }
}

impl<C> SledLogStore<C> {
    /// Opens (creating if needed) the log store in `<dir>/raft.sled`, with its own stats.
    pub fn open(dir: &Path, cfg: &StorageConfig) -> Result<Self> {
        Self::open_with_stats(dir, cfg, Arc::default())
    }

    /// Opens the log store, counting into `stats` (shared with the state machine by
    /// [`crate::open`]).
    pub fn open_with_stats(
        dir: &Path,
        cfg: &StorageConfig,
        stats: Arc<StorageStats>,
    ) -> Result<Self> {
        let path = dir.join(SLED_DIR);
        let db = open_db(&path, cfg.sled_cache_bytes, cfg.sled_mode.into())?;
        let log = open_tree(&db, LOG_TREE, &path)?;
        let meta = open_tree(&db, META_TREE, &path)?;
        check_layout(&meta, &path)?;
        let purged: Option<LogId<u64>> = match meta
            .get(KEY_LAST_PURGED)
            .map_err(|e| Error::sled("read the meta tree", &path, e))?
        {
            Some(bytes) => Some(decode_meta::<LogId<u64>>(KEY_LAST_PURGED, &bytes, &path)?),
            None => None,
        };
        let first_kept = purged.map_or(0, |p| p.index.saturating_add(1));
        let flusher = Flusher::start(db, &path, stats.clone())?;
        Ok(Self {
            shared: Arc::new(Shared {
                flusher,
                first_kept: std::sync::atomic::AtomicU64::new(first_kept),
                purging: parking_lot::Mutex::new(None),
                log,
                meta,
                tail: parking_lot::Mutex::new(TailCache::new(cfg.log_cache_bytes)),
                path,
                max_read_bytes: cfg.max_read_bytes,
                stats,
            }),
            _config: PhantomData,
        })
    }

    /// The store's counters.
    pub fn stats(&self) -> Arc<StorageStats> {
        self.shared.stats.clone()
    }

    /// Path of the sled database.
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// Waits until everything written so far is on disk.
    pub async fn flush(&self) -> Result<()> {
        self.shared.flusher.flush().await
    }

    /// Holds the group-commit flusher until the pause is dropped; appends made meanwhile are
    /// written but not acknowledged, and then share one fsync. For tests that check group
    /// commit without depending on how fast the disk is.
    pub async fn pause_flusher(&self) -> Result<FlusherPause> {
        self.shared.flusher.pause().await
    }
}

/// Whether `dir` holds a Raft log store with a vote or log entries (purged ones included).
/// Must not be called while the store in `dir` is open (sled locks its database).
pub(crate) fn has_log_state(dir: &Path) -> Result<bool> {
    let path = dir.join(SLED_DIR);
    if !path.exists() {
        return Ok(false);
    }
    let db = open_db(&path, PROBE_CACHE_BYTES, sled::Mode::LowSpace)?;
    let log = open_tree(&db, LOG_TREE, &path)?;
    let meta = open_tree(&db, META_TREE, &path)?;
    let has_meta = |key: &str| {
        meta.contains_key(key)
            .map_err(|e| Error::sled("read the meta tree", &path, e))
    };
    let has_log = !log.is_empty();
    Ok(has_log || has_meta(KEY_VOTE)? || has_meta(KEY_LAST_PURGED)?)
}

/// Writes `vote` into the log store in `dir` (creating it) and flushes, with no store open.
pub(crate) fn write_vote_offline(dir: &Path, cfg: &StorageConfig, vote: &Vote<u64>) -> Result<()> {
    let path = dir.join(SLED_DIR);
    let db = open_db(&path, cfg.sled_cache_bytes, cfg.sled_mode.into())?;
    let meta = open_tree(&db, META_TREE, &path)?;
    check_layout(&meta, &path)?;
    meta.insert(KEY_VOTE, encode(vote, KEY_VOTE)?)
        .map_err(|e| Error::sled("write the meta tree", &path, e))?;
    db.flush()
        .map_err(|e| Error::sled("flush the database", &path, e))?;
    Ok(())
}

fn open_db(path: &Path, cache_bytes: u64, mode: sled::Mode) -> Result<sled::Db> {
    let config = sled::Config::new()
        .path(path)
        .cache_capacity(cache_bytes)
        .mode(mode)
        // Durability points are chosen by the store (see the module docs), not by a timer.
        .flush_every_ms(None);
    // A store of this process dropped a moment ago may still hold sled's file lock while
    // sled's own I/O threads let go of it: wait a little for it rather than fail.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match config.open() {
            Err(sled::Error::Io(e))
                if e.kind() == std::io::ErrorKind::Other
                    && e.to_string().contains("could not acquire lock")
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other => return other.map_err(|e| Error::sled("open the database", path, e)),
        }
    }
}

fn open_tree(db: &sled::Db, name: &str, path: &Path) -> Result<sled::Tree> {
    db.open_tree(name)
        .map_err(|e| Error::sled("open a tree", path, e))
}

/// Stamps a fresh database with the layout version, or refuses one written in another layout.
fn check_layout(meta: &sled::Tree, path: &Path) -> Result<()> {
    let stored = meta
        .get(KEY_LAYOUT)
        .map_err(|e| Error::sled("read the layout version", path, e))?;
    match stored {
        None => {
            meta.insert(KEY_LAYOUT, &LOG_LAYOUT_VERSION.to_le_bytes())
                .map_err(|e| Error::sled("write the layout version", path, e))?;
            Ok(())
        }
        Some(bytes) => {
            let found = <[u8; 4]>::try_from(bytes.as_ref())
                .map(u32::from_le_bytes)
                .map_err(|_| Error::corrupt_log(path, "layout version is not 4 bytes"))?;
            if found == LOG_LAYOUT_VERSION {
                Ok(())
            } else if READABLE_LAYOUTS.contains(&found) {
                // Restamped so that an older binary, which cannot read chunks, refuses it.
                meta.insert(KEY_LAYOUT, &LOG_LAYOUT_VERSION.to_le_bytes())
                    .map_err(|e| Error::sled("write the layout version", path, e))?;
                Ok(())
            } else {
                Err(Error::UnsupportedLogLayout {
                    path: path.to_path_buf(),
                    found,
                    supported: LOG_LAYOUT_VERSION,
                })
            }
        }
    }
}

fn encode<T: Serialize>(value: &T, what: &'static str) -> Result<Vec<u8>> {
    bincode::serialize(value).map_err(|source| Error::Encode { what, source })
}

fn decode<T: DeserializeOwned>(bytes: &[u8], what: impl Into<String>, path: &Path) -> Result<T> {
    bincode::deserialize(bytes).map_err(|source| Error::Decode {
        what: what.into(),
        path: path.to_path_buf(),
        source,
    })
}

/// One record of the log tree: the entry stored under `key`, which must be its index.
pub(crate) fn decode_entry<C>(key: &[u8], value: &[u8], path: &Path) -> Result<Entry<C>>
where
    C: RaftTypeConfig<NodeId = u64, Node = BasicNode, Entry = Entry<C>>,
{
    let index = key_index(key, path)?;
    let entry: Entry<C> = decode(value, format!("log entry {index}"), path)?;
    if entry.log_id.index != index {
        let reason = format!("entry {} stored under index {index}", entry.log_id);
        return Err(Error::corrupt_log(path, reason));
    }
    Ok(entry)
}

/// One record of the meta tree (vote, committed, last purged), as `read_meta` decodes it.
pub(crate) fn decode_meta<T: DeserializeOwned>(key: &str, bytes: &[u8], path: &Path) -> Result<T> {
    decode(bytes, format!("meta key `{key}`"), path)
}

/// Deletes the log's entries up to index `upto`, one key at a time. Not in batches: a sled
/// batch holds sled's process-wide write lock for its whole length, and every append of the Raft
/// core (a batch) waits behind it on the replica's runtime thread. Deleting a snapshot's worth
/// of log at ten million objects (thousands of entries, their values in blob files) held it for
/// over a second: the replica stalled, heartbeats included, and the followers called an
/// election. A single remove takes that lock shared, so an append waits for one removal at most.
fn delete_upto(log: &sled::Tree, upto: u64) -> sled::Result<()> {
    // Records in key order, whatever they are: a first record, its chunks, or what an earlier
    // purge cut short by a crash left (records below the purge mark are never read).
    let end = upto.checked_add(1).map(index_key);
    while let Some((key, _)) = log.first()? {
        if end.is_some_and(|e| key.as_ref() >= &e[..]) {
            break;
        }
        log.remove(key)?;
    }
    Ok(())
}

fn index_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

/// The key of chunk `chunk` (from 1) of entry `index`.
fn chunk_key(index: u64, chunk: u32) -> [u8; 12] {
    let mut k = [0u8; 12];
    k[..8].copy_from_slice(&index.to_be_bytes());
    k[8..].copy_from_slice(&chunk.to_be_bytes());
    k
}

fn key_index(key: &[u8], path: &Path) -> Result<u64> {
    <[u8; 8]>::try_from(key)
        .map(u64::from_be_bytes)
        .map_err(|_| Error::corrupt_log(path, format!("log key of {} bytes", key.len())))
}

/// The records of one entry: its encoding cut into `CHUNK_BYTES` pieces, keyed.
fn entry_records(index: u64, value: &[u8]) -> impl Iterator<Item = (sled::IVec, &[u8])> {
    let mut chunks = value.chunks(CHUNK_BYTES);
    let first = chunks.next().unwrap_or(&[]);
    std::iter::once((sled::IVec::from(&index_key(index)), first)).chain(
        chunks
            .zip(1u32..)
            .map(move |(c, n)| (sled::IVec::from(&chunk_key(index, n)), c)),
    )
}

/// Reassembles entries from the records of a key range, in order: an 8-byte key starts an entry,
/// 12-byte keys continue it (chunk numbers in sequence, on the same index).
struct Assembler<'p> {
    path: &'p Path,
    current: Option<(u64, u32, Vec<u8>)>,
}

impl<'p> Assembler<'p> {
    fn new(path: &'p Path) -> Self {
        Self {
            path,
            current: None,
        }
    }

    /// Takes one record; answers the entry it completed, if any (the one before it).
    fn push(&mut self, key: &[u8], value: &[u8]) -> Result<Option<(u64, Vec<u8>)>> {
        match key.len() {
            8 => {
                let index = key_index(key, self.path)?;
                let done = self.current.replace((index, 0, value.to_vec()));
                Ok(done.map(|(i, _, v)| (i, v)))
            }
            12 => {
                let index = key_index(&key[..8], self.path)?;
                let mut n = [0u8; 4];
                n.copy_from_slice(&key[8..]);
                let chunk = u32::from_be_bytes(n);
                match &mut self.current {
                    Some((i, last, bytes)) if *i == index && chunk == last.saturating_add(1) => {
                        *last = chunk;
                        bytes.extend_from_slice(value);
                        Ok(None)
                    }
                    _ => Err(Error::corrupt_log(
                        self.path,
                        format!("chunk {chunk} of entry {index} without the records before it"),
                    )),
                }
            }
            n => Err(Error::corrupt_log(
                self.path,
                format!("log key of {n} bytes"),
            )),
        }
    }

    /// The last entry, once the records are over.
    fn finish(self) -> Option<(u64, Vec<u8>)> {
        self.current.map(|(i, _, v)| (i, v))
    }
}

/// sled key bounds of an index range: from the first record of its first entry to the first
/// record of the entry after it (so the last entry's chunks are in).
type KeyRange = (Bound<[u8; 8]>, Bound<[u8; 8]>);

/// Converts an index range to sled key bounds; `None` when the range is empty.
fn key_range(range: &impl RangeBounds<u64>) -> Option<KeyRange> {
    let start = match range.start_bound() {
        Bound::Included(s) => *s,
        Bound::Excluded(s) => s.checked_add(1)?,
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(e) if start > *e => return None,
        Bound::Excluded(e) if start >= *e => return None,
        Bound::Included(e) => match e.checked_add(1) {
            Some(next) => Bound::Excluded(index_key(next)),
            None => Bound::Unbounded,
        },
        Bound::Excluded(e) => Bound::Excluded(index_key(*e)),
        Bound::Unbounded => Bound::Unbounded,
    };
    Some((Bound::Included(index_key(start)), end))
}

/// The log-store operations, with crate errors; the trait impls below only map the errors.
impl<C> SledLogStore<C>
where
    C: RaftTypeConfig<NodeId = u64, Node = BasicNode, Entry = Entry<C>>,
{
    fn read_meta<T: DeserializeOwned>(&self, key: &'static str) -> Result<Option<T>> {
        let s = &self.shared;
        let bytes = s
            .meta
            .get(key)
            .map_err(|e| Error::sled("read the meta tree", &s.path, e))?;
        bytes.map(|b| decode_meta(key, &b, &s.path)).transpose()
    }

    fn write_meta<T: Serialize>(&self, key: &'static str, value: &T) -> Result<()> {
        let s = &self.shared;
        s.meta
            .insert(key, encode(value, key)?)
            .map_err(|e| Error::sled("write the meta tree", &s.path, e))?;
        Ok(())
    }

    fn decode_entry(&self, key: &[u8], value: &[u8]) -> Result<Entry<C>> {
        decode_entry(key, value, &self.shared.path)
    }

    /// Reads the entries in `range`, stopping before the entry that would take the encoded size
    /// past `max_bytes` (the first entry is always returned).
    fn read_entries(&self, range: &impl RangeBounds<u64>, max_bytes: u64) -> Result<Vec<Entry<C>>> {
        // Purged entries may still be on disk while the purge thread deletes them: never read.
        let floor = self
            .shared
            .first_kept
            .load(std::sync::atomic::Ordering::Acquire);
        let start = match range.start_bound() {
            Bound::Included(i) => (*i).max(floor),
            Bound::Excluded(i) => i.saturating_add(1).max(floor),
            Bound::Unbounded => floor,
        };
        let range = (Bound::Included(start), range.end_bound().cloned());
        let Some(bounds) = key_range(&range) else {
            return Ok(Vec::new());
        };
        let s = &self.shared;
        let mut entries = Vec::new();
        let mut bytes = 0u64;
        // The byte limit is checked on whole entries.
        let mut take = |index: u64, value: &[u8]| -> Result<bool> {
            bytes += value.len() as u64;
            if !entries.is_empty() && bytes > max_bytes {
                return Ok(false);
            }
            entries.push(self.decode_entry(&index_key(index), value)?);
            Ok(true)
        };
        let end = match range.1 {
            Bound::Included(e) => e.checked_add(1),
            Bound::Excluded(e) => Some(e),
            Bound::Unbounded => None,
        };
        let cached = s.tail.lock().from(start, end);
        if let Some(cached) = cached {
            for (index, value) in cached {
                if !take(index, &value)? {
                    break;
                }
            }
            return Ok(entries);
        }
        let mut assembler = Assembler::new(&s.path);
        // An entry is complete when the next one starts (or the range ends).
        for item in s.log.range(bounds) {
            let (key, value) = item.map_err(|e| Error::sled("read the log", &s.path, e))?;
            if let Some((index, value)) = assembler.push(&key, &value)? {
                if !take(index, &value)? {
                    return Ok(entries);
                }
            }
        }
        if let Some((index, value)) = assembler.finish() {
            take(index, &value)?;
        }
        Ok(entries)
    }

    fn log_state(&self) -> Result<LogState<C>> {
        let s = &self.shared;
        let last_purged_log_id: Option<LogId<u64>> = self.read_meta(KEY_LAST_PURGED)?;
        let last = s
            .log
            .last()
            .map_err(|e| Error::sled("read the last log entry", &s.path, e))?;
        // The cache is a suffix of the log: its last entry is the log's.
        let cached = s.tail.lock().last();
        let purged_index = last_purged_log_id.map(|p| p.index);
        let last_entry_id = match (last, cached) {
            (Some(_), Some((index, value))) => {
                Some(self.decode_entry(&index_key(index), &value)?.log_id)
            }
            // Only what a purge cut short left (ignored: the purged id stands for it).
            (Some((key, _)), None)
                if key
                    .get(..8)
                    .and_then(|k| key_index(k, &s.path).ok())
                    .is_some_and(|i| purged_index.is_some_and(|p| i <= p)) =>
            {
                None
            }
            (Some((key, _)), None) => {
                // The last record may be a chunk: the entry is read from its first record.
                let index = key_index(key.get(..8).unwrap_or(&key), &s.path)?;
                let mut records = s.log.range(index_key(index)..);
                let mut assembler = Assembler::new(&s.path);
                for item in &mut records {
                    let (k, v) =
                        item.map_err(|e| Error::sled("read the last log entry", &s.path, e))?;
                    assembler.push(&k, &v)?;
                }
                match assembler.finish() {
                    Some((i, v)) => Some(self.decode_entry(&index_key(i), &v)?.log_id),
                    None => None,
                }
            }
            (None, _) => None,
        };
        // Entries at or below `last_purged` may survive a crash in the middle of a purge; the
        // purged id is then the larger of the two.
        let last_log_id = std::cmp::max(last_entry_id, last_purged_log_id);
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    /// Writes `entries` atomically (one batch); returns how many there were and their encoded
    /// size.
    fn write_entries(&self, entries: impl IntoIterator<Item = Entry<C>>) -> Result<(u64, u64)> {
        let mut records: Vec<(sled::IVec, sled::IVec)> = Vec::new();
        let (mut count, mut bytes) = (0u64, 0u64);
        let mut encoded: Vec<(u64, Encoded)> = Vec::new();
        for entry in entries {
            let value = encode(&entry, "log entry")?;
            bytes += value.len() as u64;
            count += 1;
            for (key, record) in entry_records(entry.log_id.index, &value) {
                records.push((key, sled::IVec::from(record)));
            }
            encoded.push((entry.log_id.index, Arc::new(value)));
        }
        let s = &self.shared;
        // The cache follows sled under its lock, so that a reader never finds in it an entry
        // sled does not hold yet, nor misses one that a truncation left.
        let mut tail = s.tail.lock();
        let written = if records.len() == 1 {
            // One record is atomic by itself. A sled batch would seal an I/O buffer of its own
            // (one more write and sync in the flush that follows): measured here, a flush after
            // one insert takes ~30 % less than after a batch of one.
            let (key, record) = records.swap_remove(0);
            s.log.insert(key, record).map(drop)
        } else {
            let mut batch = sled::Batch::default();
            for (key, record) in records {
                batch.insert(key, record);
            }
            s.log.apply_batch(batch)
        };
        written.map_err(|e| Error::sled("append to the log", &s.path, e))?;
        for (index, value) in encoded {
            tail.push(index, value);
        }
        Ok((count, bytes))
    }

    /// Deletes the entries in `range` in one batch.
    fn delete_entries(&self, range: &impl RangeBounds<u64>) -> Result<()> {
        let Some(bounds) = key_range(range) else {
            return Ok(());
        };
        let s = &self.shared;
        let mut tail = s.tail.lock();
        match range.start_bound() {
            // A truncation: the suffix goes.
            Bound::Included(&i) if range.end_bound() == Bound::Unbounded => tail.truncate(i),
            Bound::Excluded(&i) if range.end_bound() == Bound::Unbounded => {
                tail.truncate(i.saturating_add(1))
            }
            // A purge (`purge_upto` without a purge thread): the prefix goes.
            Bound::Unbounded => match range.end_bound() {
                Bound::Included(&e) => tail.purge(e),
                Bound::Excluded(&e) => tail.purge(e.saturating_sub(1)),
                Bound::Unbounded => tail.clear(),
            },
            _ => tail.clear(),
        }
        let mut batch = sled::Batch::default();
        for key in s.log.range(bounds).keys() {
            let key = key.map_err(|e| Error::sled("read the log", &s.path, e))?;
            batch.remove(key);
        }
        s.log
            .apply_batch(batch)
            .map_err(|e| Error::sled("delete from the log", &s.path, e))
    }

    fn purge_upto(&self, log_id: LogId<u64>) -> Result<()> {
        if self.mark_purged(log_id)? {
            self.delete_entries(&(..=log_id.index))?;
        }
        Ok(())
    }

    /// Moves the purge mark to `log_id`; answers whether it moved (openraft only purges
    /// forward; the mark never goes back if it were asked to). Mark first, delete second: see
    /// "Durability" in the module docs.
    fn mark_purged(&self, log_id: LogId<u64>) -> Result<bool> {
        let previous: Option<LogId<u64>> = self.read_meta(KEY_LAST_PURGED)?;
        if previous.is_some_and(|p| p >= log_id) {
            return Ok(false);
        }
        self.write_meta(KEY_LAST_PURGED, &log_id)?;
        self.shared.tail.lock().purge(log_id.index);
        self.shared.first_kept.fetch_max(
            log_id.index.saturating_add(1),
            std::sync::atomic::Ordering::AcqRel,
        );
        Ok(true)
    }

    /// Deletes the entries up to `upto` on a low-priority thread, after any earlier one, taking
    /// records from the front of the tree one at a time. A failure leaves records below the
    /// mark, which are ignored (and deleted with the next purge).
    fn delete_in_background(&self, upto: u64) {
        let s = &self.shared;
        let mut purging = s.purging.lock();
        let earlier = purging.take();
        let (log, path) = (s.log.clone(), s.path.clone());
        let spawned = std::thread::Builder::new()
            .name("raft-log-purge".into())
            .spawn(move || {
                if let Some(h) = earlier {
                    let _ = h.join();
                }
                crate::state_machine::lower_priority(crate::state_machine::SNAPSHOT_NICE);
                // Flushed at the end so that sled's own I/O threads are done with the database
                // when this thread is (a store dropped and reopened finds it unlocked).
                if let Err(e) = delete_upto(&log, upto).and_then(|()| log.flush().map(drop)) {
                    tracing::warn!(path = %path.display(), upto, error = %e, "could not delete purged log entries (they are ignored)");
                }
            });
        match spawned {
            Ok(h) => *purging = Some(h),
            Err(e) => {
                tracing::warn!(error = %e, "no purge thread: deleting in place");
                drop(purging);
                if let Err(e) = self.delete_entries(&(..=upto)) {
                    tracing::warn!(upto, error = %e, "could not delete purged log entries (they are ignored)");
                }
            }
        }
    }

    fn save_committed_sync(&self, committed: Option<LogId<u64>>) -> Result<()> {
        match committed {
            Some(log_id) => self.write_meta(KEY_COMMITTED, &log_id),
            None => {
                let s = &self.shared;
                s.meta
                    .remove(KEY_COMMITTED)
                    .map_err(|e| Error::sled("write the meta tree", &s.path, e))?;
                Ok(())
            }
        }
    }
}

/// Offline operations ([`crate::offline`]), used before openraft owns the store.
impl<C> SledLogStore<C>
where
    C: RaftTypeConfig<NodeId = u64, Node = BasicNode, Entry = Entry<C>>,
{
    pub(crate) fn log_state_offline(&self) -> Result<LogState<C>> {
        self.log_state()
    }

    pub(crate) fn purge_offline(&self, log_id: LogId<u64>) -> Result<()> {
        self.purge_upto(log_id)
    }

    /// When the stored vote is `id`'s own committed vote (it led when it stopped), stores it
    /// uncommitted, flushed; answers the term, if it did. See [`crate::offline::no_restored_leader`].
    pub(crate) async fn uncommit_own_vote(&self, id: u64) -> Result<Option<u64>> {
        let Some(vote) = self.read_meta::<Vote<u64>>(KEY_VOTE)? else {
            return Ok(None);
        };
        if !vote.is_committed() || vote.leader_id().voted_for() != Some(id) {
            return Ok(None);
        }
        let term = vote.leader_id().get_term();
        self.write_meta(KEY_VOTE, &Vote::new(term, id))?;
        self.shared.flusher.flush().await?;
        Ok(Some(term))
    }

    /// Appends one entry and waits until it is durable.
    pub(crate) async fn append_offline(&self, entry: Entry<C>) -> Result<()> {
        let (count, bytes) = self.write_entries([entry])?;
        self.shared.stats.record_append(count, bytes);
        self.shared.flusher.flush().await
    }
}

fn logs_error(verb: ErrorVerb) -> impl FnOnce(Error) -> StorageError<u64> {
    move |e| e.into_storage(ErrorSubject::Logs, verb)
}

fn vote_error(verb: ErrorVerb) -> impl FnOnce(Error) -> StorageError<u64> {
    move |e| e.into_storage(ErrorSubject::Vote, verb)
}

fn log_error(log_id: LogId<u64>, verb: ErrorVerb) -> impl FnOnce(Error) -> StorageError<u64> {
    move |e| e.into_storage(ErrorSubject::Log(log_id), verb)
}

impl<C> RaftLogReader<C> for SledLogStore<C>
where
    C: RaftTypeConfig<NodeId = u64, Node = BasicNode, Entry = Entry<C>>,
{
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<C>>, StorageError<u64>> {
        self.read_entries(&range, u64::MAX)
            .map_err(logs_error(ErrorVerb::Read))
    }

    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> Result<Vec<Entry<C>>, StorageError<u64>> {
        self.read_entries(&(start..end), self.shared.max_read_bytes)
            .map_err(logs_error(ErrorVerb::Read))
    }
}

impl<C> RaftLogStorage<C> for SledLogStore<C>
where
    C: RaftTypeConfig<NodeId = u64, Node = BasicNode, Entry = Entry<C>>,
{
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<C>, StorageError<u64>> {
        self.log_state().map_err(logs_error(ErrorVerb::Read))
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> Result<(), StorageError<u64>> {
        self.write_meta(KEY_VOTE, vote)
            .map_err(vote_error(ErrorVerb::Write))?;
        self.shared
            .flusher
            .flush()
            .await
            .map_err(vote_error(ErrorVerb::Write))
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<u64>>, StorageError<u64>> {
        self.read_meta(KEY_VOTE)
            .map_err(vote_error(ErrorVerb::Read))
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<u64>>,
    ) -> Result<(), StorageError<u64>> {
        self.save_committed_sync(committed)
            .map_err(logs_error(ErrorVerb::Write))?;
        self.stats()
            .record_committed(committed.map(|c| c.index).unwrap_or(0));
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<u64>>, StorageError<u64>> {
        self.read_meta(KEY_COMMITTED)
            .map_err(logs_error(ErrorVerb::Read))
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<C>,
    ) -> Result<(), StorageError<u64>>
    where
        I: IntoIterator<Item = Entry<C>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let (count, bytes) = self
            .write_entries(entries)
            .map_err(logs_error(ErrorVerb::Write))?;
        self.shared.stats.record_append(count, bytes);
        self.shared
            .flusher
            .enqueue(Box::new(move |res| callback.log_io_completed(res)))
            .map_err(logs_error(ErrorVerb::Write))
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> Result<(), StorageError<u64>> {
        self.delete_entries(&(log_id.index..))
            .map_err(log_error(log_id, ErrorVerb::Delete))?;
        // Rare (a leader change with conflicting entries), so make it durable at once rather than
        // reason about a truncation that could be undone by a crash.
        self.shared
            .flusher
            .flush()
            .await
            .map_err(log_error(log_id, ErrorVerb::Delete))
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> Result<(), StorageError<u64>> {
        self.mark_purged(log_id)
            .map_err(log_error(log_id, ErrorVerb::Delete))?;
        self.delete_in_background(log_id.index);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_range_handles_edges() {
        assert!(key_range(&(3..3)).is_none());
        assert!(key_range(&(Bound::Included(4), Bound::Included(3))).is_none());
        assert!(key_range(&(5..)).is_some());
        let excl = (Bound::Excluded(u64::MAX), Bound::Unbounded);
        assert!(key_range(&excl).is_none());
        assert_eq!(
            key_range(&(1..=2)),
            Some((Bound::Included(index_key(1)), Bound::Excluded(index_key(3))))
        );
        assert_eq!(
            key_range(&(1..=u64::MAX)),
            Some((Bound::Included(index_key(1)), Bound::Unbounded))
        );
    }

    /// An entry cut into records and read back record by record is the same bytes; the chunk
    /// keys sort between the entry's first record and the next entry's.
    #[test]
    fn an_entry_in_chunks_is_reassembled() {
        let path = Path::new("<test>");
        let big: Vec<u8> = (0..CHUNK_BYTES * 2 + 17).map(|i| (i % 251) as u8).collect();
        let small = vec![9u8; 10];
        let mut records: Vec<(Vec<u8>, Vec<u8>)> = entry_records(5, &big)
            .chain(entry_records(6, &small))
            .map(|(k, v)| (k.to_vec(), v.to_vec()))
            .collect();
        assert_eq!(records.len(), 4);
        let unsorted = records.clone();
        records.sort();
        assert_eq!(records, unsorted, "records are in key order");
        let mut a = Assembler::new(path);
        let mut out = Vec::new();
        for (k, v) in &records {
            out.extend(a.push(k, v).unwrap());
        }
        out.extend(a.finish());
        assert_eq!(out, vec![(5, big), (6, small)]);
    }

    /// A chunk whose first record is missing (or out of sequence) is a corrupt log, not an
    /// entry made of the wrong bytes.
    #[test]
    fn a_chunk_without_its_entry_is_refused() {
        let path = Path::new("<test>");
        let mut a = Assembler::new(path);
        assert!(a.push(&chunk_key(5, 1), b"x").is_err());
        let mut a = Assembler::new(path);
        a.push(&index_key(5), b"x").unwrap();
        assert!(
            a.push(&chunk_key(5, 2), b"x").is_err(),
            "chunk 1 is missing"
        );
        let mut a = Assembler::new(path);
        a.push(&index_key(5), b"x").unwrap();
        assert!(
            a.push(&chunk_key(4, 1), b"x").is_err(),
            "another entry's chunk"
        );
        assert!(Assembler::new(path).push(&[0u8; 9], b"x").is_err());
    }
}
