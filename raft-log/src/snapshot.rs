//! Snapshot files: their format, and the directory that holds them.
//!
//! # Directory
//!
//! Snapshots live in `<data_dir>/snapshots/`:
//!
//! * `snap-<last index, 20 digits>-<snapshot id>.snap` — a complete snapshot, fsynced, and
//!   renamed into place only once complete (the directory is fsynced after the rename). Normally
//!   there is exactly one, the current snapshot. There are two only if the node stopped between
//!   making a new one durable and removing the old one; on open the one with the greatest
//!   `last_log_id` wins and the others are removed. (Characters of the snapshot id other than
//!   ASCII letters, digits, `-` and `_` are written as `_`.)
//! * `*.tmp` — a snapshot being built (`build-…`) or received from the leader (`recv-…`). A temp
//!   file left by a crash is never used: it is removed, with a warning, on open.
//! * `*.corrupt` — a `.snap` file that failed validation on open (bad magic, wrong length,
//!   checksum mismatch, undecodable meta). It is set aside, with a warning, for an operator to
//!   look at, and never read again.
//!
//! # File format, version 1
//!
//! All integers little-endian.
//!
//! | offset   | size | field                                                          |
//! |----------|------|----------------------------------------------------------------|
//! | 0        | 8    | magic, ASCII `REGOSNAP`                                        |
//! | 8        | 4    | format version, `u32` (= 1)                                    |
//! | 12       | 4    | meta length `M`, `u32`                                         |
//! | 16       | 8    | payload length `P`, `u64`                                      |
//! | 24       | 8    | XXH3-64 (seed 0) of the `M + P` bytes that follow the header   |
//! | 32       | M    | `bincode(openraft::SnapshotMeta<u64, BasicNode>)`              |
//! | 32 + M   | P    | payload: the bytes `StateMachineCore::write_snapshot` wrote    |
//!
//! The file is exactly `32 + M + P` bytes long. The payload is the application's own format (it
//! carries its own version); this header only frames it. The whole file, header included, is what
//! openraft streams to a follower, so a follower checks the same checksum on what it received.
//!
//! A file with the right magic and an unknown version is refused with
//! [`Error::UnsupportedSnapshotVersion`] (on open too: silently ignoring a snapshot written by a
//! newer build would lose the state whose log has already been purged).

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use openraft::{BasicNode, SnapshotMeta};
use xxhash_rust::xxh3::Xxh3;

use crate::error::{Error, Result};

/// Name of the snapshot directory inside the data directory.
pub(crate) const SNAPSHOT_DIR: &str = "snapshots";

/// The snapshot file format version this build writes and reads.
pub const SNAPSHOT_FORMAT_VERSION: u32 = 1;

const MAGIC: [u8; 8] = *b"REGOSNAP";
const HEADER_LEN: u64 = 32;
const PAYLOAD_LEN_OFFSET: u64 = 16;
/// Membership configurations are small; a larger meta length means the header is garbage, and
/// must not turn into a huge allocation.
const MAX_META_LEN: u32 = 16 << 20;
const SNAP_EXT: &str = "snap";
const TEMP_EXT: &str = "tmp";
const CORRUPT_EXT: &str = "corrupt";

/// openraft's snapshot metadata, with Regolith's node types.
pub(crate) type Meta = SnapshotMeta<u64, BasicNode>;

/// What the header of a validated snapshot file says.
#[derive(Debug, Clone)]
pub(crate) struct SnapshotHeader {
    pub(crate) meta: Meta,
    pub(crate) payload_len: u64,
    checksum: u64,
    meta_len: u64,
}

impl SnapshotHeader {
    fn payload_offset(&self) -> u64 {
        HEADER_LEN + self.meta_len
    }

    /// Total size of the file.
    pub(crate) fn file_len(&self) -> u64 {
        self.payload_offset() + self.payload_len
    }
}

/// Writes a snapshot file: header and meta first, then the payload through `Write`, then
/// [`SnapshotWriter::finish`] fills in the payload length and checksum and fsyncs.
pub(crate) struct SnapshotWriter {
    out: BufWriter<File>,
    hasher: Xxh3,
    meta_len: u64,
    payload_len: u64,
    /// Payload bytes already handed to the disk (see [`WRITEBACK_EVERY`]).
    synced: u64,
    path: PathBuf,
}

/// A snapshot file is written back to disk every this many bytes as it is written, rather than
/// all at the final fsync: a gigabyte of dirty pages flushed at once made the Raft log's own
/// fsyncs wait behind it for seconds, long enough for followers to miss heartbeats (issue 17).
const WRITEBACK_EVERY: u64 = 16 << 20;

impl SnapshotWriter {
    /// Creates the file at `path` (which must not exist) and writes the header and `meta`.
    pub(crate) fn create(path: &Path, meta: &Meta) -> Result<Self> {
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| Error::io("create snapshot file", path, e))?;
        let meta_bytes = bincode::serialize(meta).map_err(|source| Error::Encode {
            what: "snapshot meta",
            source,
        })?;
        let meta_len = u32::try_from(meta_bytes.len())
            .ok()
            .filter(|len| *len <= MAX_META_LEN)
            .ok_or_else(|| Error::corrupt_snapshot(path, "snapshot meta is too large"))?;

        let mut writer = Self {
            out: BufWriter::new(file),
            hasher: Xxh3::new(),
            meta_len: u64::from(meta_len),
            payload_len: 0,
            synced: 0,
            path: path.to_path_buf(),
        };
        // Payload length and checksum are not known yet: zeros until `finish`.
        let mut header = [0u8; HEADER_LEN as usize];
        header[0..8].copy_from_slice(&MAGIC);
        header[8..12].copy_from_slice(&SNAPSHOT_FORMAT_VERSION.to_le_bytes());
        header[12..16].copy_from_slice(&meta_len.to_le_bytes());
        writer
            .out
            .write_all(&header)
            .and_then(|()| writer.out.write_all(&meta_bytes))
            .map_err(|e| Error::io("write snapshot header", path, e))?;
        writer.hasher.update(&meta_bytes);
        Ok(writer)
    }

    /// Completes the header, fsyncs the file and returns its total length.
    pub(crate) fn finish(self) -> Result<u64> {
        let path = self.path;
        let mut file = self
            .out
            .into_inner()
            .map_err(|e| Error::io("write snapshot file", &path, e.into_error()))?;
        let mut tail = [0u8; 16];
        tail[0..8].copy_from_slice(&self.payload_len.to_le_bytes());
        tail[8..16].copy_from_slice(&self.hasher.digest().to_le_bytes());
        file.seek(SeekFrom::Start(PAYLOAD_LEN_OFFSET))
            .and_then(|_| file.write_all(&tail))
            .map_err(|e| Error::io("complete snapshot header", &path, e))?;
        file.sync_all()
            .map_err(|e| Error::io("fsync snapshot file", &path, e))?;
        Ok(HEADER_LEN + self.meta_len + self.payload_len)
    }
}

impl SnapshotWriter {
    /// Hands what was written since the last time to the disk and waits for it, once
    /// [`WRITEBACK_EVERY`] bytes have piled up.
    fn write_back(&mut self) -> io::Result<()> {
        if self.payload_len - self.synced < WRITEBACK_EVERY {
            return Ok(());
        }
        self.out.flush()?;
        sync_range(self.out.get_ref())?;
        self.synced = self.payload_len;
        Ok(())
    }
}

/// Writes the file's dirty pages back and waits for them (Linux `sync_file_range` over the whole
/// file: only what is dirty is written). Not an fsync (no metadata, no device cache flush): the
/// final `sync_all` still makes the file durable; this only spreads the writing out.
#[cfg(target_os = "linux")]
fn sync_range(file: &File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
        | libc::SYNC_FILE_RANGE_WRITE
        | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    // SAFETY: a valid open descriptor and plain integers; the call touches no memory of ours.
    let rc = unsafe { libc::sync_file_range(file.as_raw_fd(), 0, 0, flags) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
fn sync_range(file: &File) -> io::Result<()> {
    file.sync_data()
}

impl Write for SnapshotWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.out.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.payload_len += n as u64;
        self.write_back()?;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// Opens `path`, checks magic, version, length and checksum, and returns the header.
pub(crate) fn validate(path: &Path) -> Result<SnapshotHeader> {
    let mut file = File::open(path).map_err(|e| Error::io("open snapshot file", path, e))?;
    let header = read_header(&mut file, path)?;
    verify_checksum(&mut file, &header, path)?;
    Ok(header)
}

/// A reader over the payload of the validated snapshot at `path`.
pub(crate) fn payload_reader(path: &Path, header: &SnapshotHeader) -> Result<impl Read> {
    let mut file = File::open(path).map_err(|e| Error::io("open snapshot file", path, e))?;
    file.seek(SeekFrom::Start(header.payload_offset()))
        .map_err(|e| Error::io("seek in snapshot file", path, e))?;
    Ok(BufReader::new(file).take(header.payload_len))
}

fn read_header(file: &mut File, path: &Path) -> Result<SnapshotHeader> {
    let file_len = file
        .metadata()
        .map_err(|e| Error::io("stat snapshot file", path, e))?
        .len();
    if file_len < HEADER_LEN {
        let reason = format!("{file_len} bytes, shorter than the {HEADER_LEN}-byte header");
        return Err(Error::corrupt_snapshot(path, reason));
    }
    let mut header = [0u8; HEADER_LEN as usize];
    file.read_exact(&mut header)
        .map_err(|e| Error::io("read snapshot header", path, e))?;
    if header[0..8] != MAGIC {
        return Err(Error::corrupt_snapshot(
            path,
            "bad magic, not a snapshot file",
        ));
    }
    let version = le_u32(&header[8..12]);
    if version != SNAPSHOT_FORMAT_VERSION {
        return Err(Error::UnsupportedSnapshotVersion {
            path: path.to_path_buf(),
            found: version,
            supported: SNAPSHOT_FORMAT_VERSION,
        });
    }
    let meta_len = le_u32(&header[12..16]);
    let payload_len = le_u64(&header[16..24]);
    let checksum = le_u64(&header[24..32]);
    if meta_len > MAX_META_LEN {
        let reason = format!("meta length {meta_len} is implausible");
        return Err(Error::corrupt_snapshot(path, reason));
    }
    let expected_len = HEADER_LEN
        .checked_add(u64::from(meta_len))
        .and_then(|n| n.checked_add(payload_len));
    if expected_len != Some(file_len) {
        let reason = format!(
            "header says {} bytes, file has {file_len} (truncated or overwritten?)",
            expected_len.map_or("more than 2^64".to_string(), |n| n.to_string()),
        );
        return Err(Error::corrupt_snapshot(path, reason));
    }
    let mut meta_bytes = vec![0u8; meta_len as usize];
    file.read_exact(&mut meta_bytes)
        .map_err(|e| Error::io("read snapshot meta", path, e))?;
    let meta: Meta = bincode::deserialize(&meta_bytes)
        .map_err(|e| Error::corrupt_snapshot(path, format!("undecodable meta: {e}")))?;
    Ok(SnapshotHeader {
        meta,
        payload_len,
        checksum,
        meta_len: u64::from(meta_len),
    })
}

fn verify_checksum(file: &mut File, header: &SnapshotHeader, path: &Path) -> Result<()> {
    file.seek(SeekFrom::Start(HEADER_LEN))
        .map_err(|e| Error::io("seek in snapshot file", path, e))?;
    let mut sink = HashSink(Xxh3::new());
    io::copy(&mut BufReader::with_capacity(1 << 20, file), &mut sink)
        .map_err(|e| Error::io("read snapshot file", path, e))?;
    let actual = sink.0.digest();
    if actual != header.checksum {
        let reason = format!(
            "checksum mismatch: header {:016x}, content {actual:016x}",
            header.checksum
        );
        return Err(Error::corrupt_snapshot(path, reason));
    }
    Ok(())
}

/// A `Write` that only hashes what it is given.
struct HashSink(Xxh3);

impl Write for HashSink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn le_u32(bytes: &[u8]) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(bytes);
    u32::from_le_bytes(b)
}

fn le_u64(bytes: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(bytes);
    u64::from_le_bytes(b)
}

/// A snapshot id unique to this node: the log id it covers plus time and a counter.
pub(crate) fn new_snapshot_id(meta_last: Option<&openraft::LogId<u64>>) -> String {
    let covers = meta_last.map_or("none".to_string(), |l| {
        format!("{}-{}", l.leader_id.term, l.index)
    });
    format!("{covers}-{}", unique_suffix())
}

fn unique_suffix() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{nanos:x}-{}", COUNTER.fetch_add(1, Ordering::Relaxed))
}

/// Keeps a snapshot id usable in a file name, whatever the leader put in it.
fn file_safe(id: &str) -> String {
    id.chars()
        .take(96)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The snapshot directory of one state machine.
#[derive(Debug)]
pub(crate) struct SnapshotDir {
    path: PathBuf,
}

/// A valid snapshot found in the directory.
pub(crate) struct FoundSnapshot {
    pub(crate) path: PathBuf,
    pub(crate) header: SnapshotHeader,
}

impl SnapshotDir {
    /// Opens (creating if needed) `<data_dir>/snapshots`.
    pub(crate) fn open(data_dir: &Path) -> Result<Self> {
        let path = data_dir.join(SNAPSHOT_DIR);
        fs::create_dir_all(&path).map_err(|e| Error::io("create snapshot directory", &path, e))?;
        Ok(Self { path })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// A fresh path for a snapshot being built or received.
    pub(crate) fn temp_path(&self, kind: &str) -> PathBuf {
        self.path
            .join(format!("{kind}-{}.{TEMP_EXT}", unique_suffix()))
    }

    fn final_path(&self, meta: &Meta) -> PathBuf {
        let index = meta.last_log_id.map_or(0, |l| l.index);
        let id = file_safe(&meta.snapshot_id);
        self.path.join(format!("snap-{index:020}-{id}.{SNAP_EXT}"))
    }

    /// Moves the complete, fsynced temp file into place; durable on return.
    pub(crate) fn publish(&self, temp: &Path, meta: &Meta) -> Result<PathBuf> {
        let dest = self.final_path(meta);
        fs::rename(temp, &dest)
            .map_err(|e| Error::io("rename snapshot into place at", &dest, e))?;
        self.sync()?;
        Ok(dest)
    }

    /// Removes every `.snap` file except `keep`. Failures are only logged: the new snapshot is
    /// already durable, and a leftover is cleaned up on the next open.
    pub(crate) fn remove_others(&self, keep: &Path) {
        for path in self.files_with_ext(SNAP_EXT).unwrap_or_default() {
            if path != keep {
                remove_logged(&path, "old snapshot");
            }
        }
    }

    /// Finds the newest valid snapshot, and tidies the directory: removes temp files and older
    /// snapshots, sets corrupt ones aside.
    pub(crate) fn recover(&self) -> Result<Option<FoundSnapshot>> {
        for temp in self.files_with_ext(TEMP_EXT)? {
            tracing::warn!(path = %temp.display(), "removing unfinished snapshot temp file");
            remove_logged(&temp, "unfinished snapshot temp file");
        }

        let mut valid = Vec::new();
        for path in self.files_with_ext(SNAP_EXT)? {
            match validate(&path) {
                Ok(header) => valid.push(FoundSnapshot { path, header }),
                Err(e @ Error::CorruptSnapshot { .. }) => self.quarantine(&path, &e),
                Err(e) => return Err(e),
            }
        }

        valid.sort_by_key(|found| found.header.meta.last_log_id);
        let newest = valid.pop();
        for older in valid {
            tracing::info!(path = %older.path.display(), "removing superseded snapshot");
            remove_logged(&older.path, "superseded snapshot");
        }
        Ok(newest)
    }

    fn quarantine(&self, path: &Path, why: &Error) {
        let aside = path.with_extension(CORRUPT_EXT);
        tracing::warn!(
            path = %path.display(),
            moved_to = %aside.display(),
            error = %why,
            "ignoring corrupt snapshot file"
        );
        if let Err(e) = fs::rename(path, &aside) {
            tracing::warn!(path = %path.display(), error = %e, "cannot set corrupt snapshot aside");
        }
    }

    /// The meta of the newest valid snapshot, without tidying anything (corrupt files are
    /// skipped here and set aside by the next `recover`).
    pub(crate) fn newest_meta(&self) -> Result<Option<Meta>> {
        let mut newest: Option<Meta> = None;
        for path in self.files_with_ext(SNAP_EXT)? {
            match validate(&path) {
                Ok(h) => {
                    if newest
                        .as_ref()
                        .is_none_or(|n| h.meta.last_log_id > n.last_log_id)
                    {
                        newest = Some(h.meta);
                    }
                }
                Err(Error::CorruptSnapshot { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(newest)
    }

    /// Whether the directory holds a complete snapshot file.
    pub(crate) fn has_snapshot(data_dir: &Path) -> Result<bool> {
        let dir = Self {
            path: data_dir.join(SNAPSHOT_DIR),
        };
        if !dir.path.exists() {
            return Ok(false);
        }
        Ok(!dir.files_with_ext(SNAP_EXT)?.is_empty())
    }

    fn files_with_ext(&self, ext: &str) -> Result<Vec<PathBuf>> {
        let entries = fs::read_dir(&self.path)
            .map_err(|e| Error::io("list snapshot directory", &self.path, e))?;
        let mut files = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| Error::io("list snapshot directory", &self.path, e))?;
            let path = entry.path();
            if path.extension().is_some_and(|x| x == ext) && path.is_file() {
                files.push(path);
            }
        }
        Ok(files)
    }

    /// fsyncs the directory, making renames and creations in it durable.
    fn sync(&self) -> Result<()> {
        File::open(&self.path)
            .and_then(|d| d.sync_all())
            .map_err(|e| Error::io("fsync snapshot directory", &self.path, e))
    }
}

fn remove_logged(path: &Path, what: &str) {
    if let Err(e) = fs::remove_file(path) {
        if e.kind() != io::ErrorKind::NotFound {
            tracing::warn!(path = %path.display(), error = %e, "cannot remove {what}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{CommittedLeaderId, LogId};

    fn meta(index: u64) -> Meta {
        Meta {
            last_log_id: Some(LogId::new(CommittedLeaderId::new(2, 0), index)),
            last_membership: Default::default(),
            snapshot_id: new_snapshot_id(None),
        }
    }

    fn write(path: &Path, meta: &Meta, payload: &[u8]) -> u64 {
        let mut w = SnapshotWriter::create(path, meta).unwrap();
        w.write_all(payload).unwrap();
        w.finish().unwrap()
    }

    #[test]
    fn round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.snap");
        let m = meta(7);
        let len = write(&path, &m, b"hello payload");
        assert_eq!(len, fs::metadata(&path).unwrap().len());

        let header = validate(&path).unwrap();
        assert_eq!(header.meta, m);
        assert_eq!(header.payload_len, 13);
        let mut payload = Vec::new();
        payload_reader(&path, &header)
            .unwrap()
            .read_to_end(&mut payload)
            .unwrap();
        assert_eq!(payload, b"hello payload");
    }

    #[test]
    fn detects_damage() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.snap");
        write(&path, &meta(7), &[7u8; 1000]);
        let good = fs::read(&path).unwrap();

        let mut flipped = good.clone();
        flipped[900] ^= 1;
        fs::write(&path, &flipped).unwrap();
        assert!(matches!(
            validate(&path),
            Err(Error::CorruptSnapshot { .. })
        ));

        fs::write(&path, &good[..good.len() - 1]).unwrap();
        assert!(matches!(
            validate(&path),
            Err(Error::CorruptSnapshot { .. })
        ));

        fs::write(&path, b"garbage").unwrap();
        assert!(matches!(
            validate(&path),
            Err(Error::CorruptSnapshot { .. })
        ));

        let mut future = good.clone();
        future[8..12].copy_from_slice(&2u32.to_le_bytes());
        fs::write(&path, &future).unwrap();
        let err = validate(&path).unwrap_err();
        assert!(matches!(
            err,
            Error::UnsupportedSnapshotVersion {
                found: 2,
                supported: 1,
                ..
            }
        ));
        assert!(err.to_string().contains("format version 2"), "{err}");
    }

    #[test]
    fn file_names_are_safe() {
        assert_eq!(file_safe("3-10-ab/../c d"), "3-10-ab____c_d");
    }
}
