//! One disk of the tier: its directory, bucket files and I/O (blocking; callers run it on
//! blocking threads). [`super::layout`] decides where records go; this writes and reads them,
//! scans a disk that was written before, and takes the disk out on the first I/O error.
//!
//! I/O is `O_DIRECT` where the file system allows it (measured on this project's machines:
//! sequential writes 1.5 GB/s direct against 0.31 GB/s buffered with `fdatasync`, cold reads
//! 1.7 against 1.6 GB/s, and no second copy of every object in the page cache; docs/ssd.md),
//! buffered with `fdatasync` elsewhere. Writes pass through pooled page-aligned pieces of
//! [`append::PIECE`] bytes, values copied into them from where they lie and hashed there
//! ([`super::append`]). A read of a value on a block boundary (64 KiB and more) lands
//! straight in the destination where that is aligned (a registered buffer), else through
//! the read buffer's slots, in pieces of [`direct::PIECE`]: a helper thread reads the next
//! piece while the caller hashes the one before (`examples/disk_read_speed.rs` measures it).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use regolith_proto::checksum;
use regolith_proto::common::Version;

use super::append;
use super::direct::{self, AlignedBuf};
use super::format::{
    align_block, bucket_file_name, decode_record_head, encode_record_head, parse_bucket_file_name,
    BucketHeader, Label, NotARecord, RecordShape, BLOCK, FORMAT, LABEL_FILE,
};
use super::layout::{Entry, Layout, NoRoom, Usage};
use super::DiskSpec;
use crate::error::{Error, Result};

/// Largest single read, and the size of the aligned buffers reads and scans pass through.
pub const IO_CHUNK: usize = 8 << 20;
/// A read buffer: room for a record's head, one block and two pieces of a pipelined read.
const READ_BUF: usize = HEAD_ROOM + BLOCK as usize + 2 * direct::PIECE;
/// Bucket size of a new disk when not given: an eighth of the capacity, within these bounds.
pub const MIN_BUCKET: u64 = 1 << 20;
pub const MAX_BUCKET: u64 = 256 << 20;
/// Free space kept on a file system whose disk has no `SIZE`: 5 % of it, at least this much.
pub const MIN_MARGIN: u64 = 1 << 30;

/// One record to write.
pub struct WriteItem<'a> {
    pub key: &'a str,
    pub version: Version,
    pub checksum: u64,
    /// The value, in parts laid end to end (an object's extents in the segment, say).
    pub value: &'a [&'a [u8]],
    /// A move of a record this disk holds (compaction): linked only if the key still has
    /// this version when the write is durable, so a remove meanwhile is not undone.
    pub relocate: bool,
}

impl WriteItem<'_> {
    /// The value's length.
    pub fn value_len(&self) -> u64 {
        self.value.iter().map(|p| p.len() as u64).sum()
    }
}

/// What became of one [`WriteItem`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Written {
    Ok,
    /// Every bucket is in use: make room ([`Disk::evict_lru`]) and write again.
    Full,
    /// Larger than a bucket (or its key too long): never fits this disk.
    TooLarge,
    /// The bytes do not match the checksum given: nothing was written.
    BadChecksum,
}

/// What a read found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadOutcome {
    /// `len` bytes of the value were copied and verified.
    Hit { len: u64 },
    /// No record of that key (and version).
    Miss,
    /// The record is damaged (checksum, header): it is dropped; report it like an eviction.
    Corrupt { version: Version },
    /// The bytes did not verify in the caller's buffer but the record does on a private
    /// read: the buffer changed under the read. Nothing was delivered; the record stays.
    Unverified,
}

/// A record dropped from the disk (evicted, compacted away on failure, or lost with the disk).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dropped {
    pub key: String,
    pub version: Version,
}

/// Counters of one disk (exported as metrics).
#[derive(Default)]
pub struct DiskStats {
    pub read_bytes: AtomicU64,
    pub reads: AtomicU64,
    pub read_micros: AtomicU64,
    pub write_bytes: AtomicU64,
    pub writes: AtomicU64,
    pub write_micros: AtomicU64,
    pub errors: AtomicU64,
    pub corrupt_records: AtomicU64,
    pub evicted: AtomicU64,
    pub compacted: AtomicU64,
    /// Objects dropped because the disk failed.
    pub lost: AtomicU64,
}

/// What a scan at open found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScanReport {
    pub buckets: u32,
    pub records: u64,
    /// Records superseded by a later version of their key.
    pub superseded: u64,
    pub micros: u64,
}

/// A point-in-time view for `/status` and metrics.
#[derive(Clone, Debug, serde::Serialize)]
pub struct DiskStatus {
    pub path: String,
    pub disk_id: String,
    pub healthy: bool,
    pub failure: Option<String>,
    pub direct_io: bool,
    pub bucket_size: u64,
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    pub allocated_bytes: u64,
    pub objects: u64,
}

struct Inner {
    layout: Layout,
    files: Vec<Option<Arc<File>>>,
    failure: Option<String>,
}

pub struct Disk {
    spec: DiskSpec,
    /// The label file, locked (`flock`) while this process uses the disk: a second process
    /// opening the same directory is refused instead of writing over this one's records.
    _lock: nix::fcntl::Flock<File>,
    label: Label,
    direct: bool,
    inner: Mutex<Inner>,
    /// One writer at a time (batches are appended in order), and its pooled piece buffers.
    writer: Mutex<Vec<AlignedBuf>>,
    /// Buffers of finished reads, kept for the next ones (faulting in fresh pages for every
    /// read would cost more than a small read itself).
    read_bufs: Mutex<Vec<AlignedBuf>>,
    failed: AtomicBool,
    /// What the failure dropped, until [`Disk::take_lost`] hands it on (to the metadata).
    lost: Mutex<Vec<Dropped>>,
    /// Told when the disk fails, so the loss reaches the metadata at once rather than with
    /// the next upkeep round ([`Disk::notify_failure`]).
    on_failure: std::sync::OnceLock<Arc<tokio::sync::Notify>>,
    pub stats: DiskStats,
}

fn io_err(path: &Path, op: &str, source: std::io::Error) -> Error {
    Error::Os {
        what: format!("disk {}: {op}", path.display()),
        source,
    }
}

impl DiskSpec {
    fn bucket_path(&self, b: u32) -> PathBuf {
        self.path.join(bucket_file_name(b))
    }
}

/// Options of [`Disk::open`] (tests choose small buckets).
#[derive(Clone, Debug, Default)]
pub struct DiskOptions {
    /// Bucket size of a new disk (default: derived from the capacity).
    pub bucket_size: Option<u64>,
}

impl Disk {
    /// Opens the disk at `spec.path` (created and formatted when empty) and scans what it
    /// holds.
    pub fn open(spec: DiskSpec, opts: &DiskOptions) -> Result<(Self, ScanReport)> {
        let t0 = Instant::now();
        std::fs::create_dir_all(&spec.path).map_err(|e| io_err(&spec.path, "create", e))?;
        let limit = capacity_limit(&spec, 0)?;
        let label = read_or_write_label(&spec, limit, opts)?;
        let lock = lock_label(&spec)?;
        let direct = supports_direct(&spec.path);
        let max_buckets = buckets_within(limit, label.bucket_size);
        let mut inner = Inner {
            layout: Layout::new(label.bucket_size, max_buckets),
            files: Vec::new(),
            failure: None,
        };
        let mut report = scan(&spec, &label, direct, &mut inner)?;
        inner.layout.finish_restore();
        report.micros = t0.elapsed().as_micros() as u64;
        let disk = Self {
            spec,
            _lock: lock,
            label,
            direct,
            inner: Mutex::new(inner),
            writer: Mutex::new(vec![AlignedBuf::new(append::PIECE)?]),
            read_bufs: Mutex::new(Vec::new()),
            failed: AtomicBool::new(false),
            lost: Mutex::new(Vec::new()),
            on_failure: std::sync::OnceLock::new(),
            stats: DiskStats::default(),
        };
        // The capacity counts what this disk already holds as usable.
        disk.refresh_capacity()?;
        Ok((disk, report))
    }

    pub fn path(&self) -> &Path {
        &self.spec.path
    }

    pub fn disk_id(&self) -> &str {
        &self.label.disk_id
    }

    pub fn is_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    pub fn usage(&self) -> Usage {
        self.inner.lock().layout.usage()
    }

    pub fn max_record(&self) -> u64 {
        self.inner.lock().layout.max_record()
    }

    pub fn status(&self) -> DiskStatus {
        let inner = self.inner.lock();
        let u = inner.layout.usage();
        DiskStatus {
            path: self.spec.path.display().to_string(),
            disk_id: self.label.disk_id.clone(),
            healthy: inner.failure.is_none(),
            failure: inner.failure.clone(),
            direct_io: self.direct,
            bucket_size: self.label.bucket_size,
            capacity_bytes: u.capacity,
            used_bytes: u.live,
            allocated_bytes: u.allocated,
            objects: u.objects,
        }
    }

    /// The records held, as `(key, version)`.
    pub fn inventory(&self) -> Vec<(String, Version)> {
        let inner = self.inner.lock();
        inner
            .layout
            .keys()
            .map(|(k, e)| (k.to_owned(), e.version))
            .collect()
    }

    /// The version and value length of `key`'s record, if held.
    pub fn lookup(&self, key: &str) -> Option<(Version, u64)> {
        let inner = self.inner.lock();
        inner
            .layout
            .peek(key)
            .map(|e| (e.version, e.shape.value_len))
    }

    /// Takes the disk out: every record is dropped and returned (to be removed from the
    /// metadata and counted); nothing is read or written on it again.
    pub fn fail(&self, reason: &str) -> Vec<Dropped> {
        let mut inner = self.inner.lock();
        if inner.failure.is_some() {
            return Vec::new();
        }
        tracing::error!(disk = %self.spec.path.display(), reason, "disk failed; its objects are dropped, the node keeps serving");
        inner.failure = Some(reason.to_owned());
        self.failed.store(true, Ordering::Release);
        inner.files.clear();
        let dropped = to_dropped(inner.layout.clear());
        self.stats
            .lost
            .fetch_add(dropped.len() as u64, Ordering::Relaxed);
        self.lost.lock().extend(dropped.iter().cloned());
        if let Some(n) = self.on_failure.get() {
            n.notify_one();
        }
        dropped
    }

    /// `n` is notified when this disk fails (the first call sets it).
    pub fn notify_failure(&self, n: Arc<tokio::sync::Notify>) {
        let _ = self.on_failure.set(n);
    }

    /// The objects a failure dropped and nobody reported yet.
    pub fn take_lost(&self) -> Vec<Dropped> {
        std::mem::take(&mut *self.lost.lock())
    }

    /// The key of the record of `version`, if held.
    pub fn key_of(&self, version: &Version) -> Option<String> {
        self.inner.lock().layout.key_of(version).map(str::to_owned)
    }

    /// Copies `dst.len()` bytes of the value of `version`'s record from `offset` on (a slice
    /// of a data-plane read), unverified: the reader checks the whole object's checksum.
    /// Answers false when no such record is held (or its header no longer says so).
    pub fn read_range(&self, version: &Version, offset: u64, dst: &mut [u8]) -> Result<bool> {
        if self.is_failed() {
            return Err(self.failed_error());
        }
        let t0 = Instant::now();
        // A record moved by compaction while it was read is read once more at its new place.
        for _ in 0..2 {
            let (key, e) = {
                let mut inner = self.inner.lock();
                let Some(key) = inner.layout.key_of(version).map(str::to_owned) else {
                    return Ok(false);
                };
                let Some(e) = inner.layout.get(&key) else {
                    return Ok(false);
                };
                if offset.saturating_add(dst.len() as u64) > e.shape.value_len {
                    return Ok(false);
                }
                (key, e)
            };
            let file = self.bucket_file(e.bucket, false)?;
            let read = self.with_read_buf(|buf| {
                read_range_with(buf, &file, self.direct, &e, offset, dst).map(|()| true)
            });
            // A bucket is reused only once nothing in it is linked: with the entry unchanged
            // after the read, the bytes read were this record's.
            if read.is_ok() && self.inner.lock().layout.peek(&key) != Some(&e) {
                continue;
            }
            return self.range_read_done(read, offset, dst.len(), t0);
        }
        Ok(false)
    }

    fn range_read_done(
        &self,
        read: std::io::Result<bool>,
        offset: u64,
        len: usize,
        t0: Instant,
    ) -> Result<bool> {
        match read {
            Ok(ok) => {
                if ok {
                    // A peer's read of an object is its slices; the first counts the read.
                    if offset == 0 {
                        self.stats.reads.fetch_add(1, Ordering::Relaxed);
                    }
                    self.stats
                        .read_bytes
                        .fetch_add(len as u64, Ordering::Relaxed);
                    self.stats
                        .read_micros
                        .fetch_add(t0.elapsed().as_micros() as u64, Ordering::Relaxed);
                }
                Ok(ok)
            }
            Err(err) => Err(self.io_failure("read", err)),
        }
    }

    fn failed_error(&self) -> Error {
        let reason = self
            .inner
            .lock()
            .failure
            .clone()
            .unwrap_or_else(|| "failed".into());
        Error::DiskFailed {
            path: self.spec.path.display().to_string(),
            reason,
        }
    }

    /// An I/O error takes the whole disk out (a disk that errs once is not trusted again).
    fn io_failure(&self, op: &str, e: std::io::Error) -> Error {
        self.stats.errors.fetch_add(1, Ordering::Relaxed);
        self.fail(&format!("{op}: {e}"));
        self.failed_error()
    }

    /// Checks that the directory is still there, readable and writable, and re-reads the
    /// file system's free space (for a disk without `SIZE`). An error takes the disk out.
    pub fn probe(&self) -> Result<()> {
        if self.is_failed() {
            return Err(self.failed_error());
        }
        let label = self.spec.path.join(LABEL_FILE);
        if let Err(e) = std::fs::read(&label) {
            return Err(self.io_failure("label unreadable", e));
        }
        match nix::sys::statvfs::statvfs(&self.spec.path) {
            Ok(s) if s.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY) => {
                self.fail("file system is read-only");
                return Err(self.failed_error());
            }
            Ok(_) => {}
            Err(e) => return Err(self.io_failure("statvfs", e.into())),
        }
        if let Err(e) = nix::unistd::access(&self.spec.path, nix::unistd::AccessFlags::W_OK) {
            self.fail(&format!("directory not writable: {e}"));
            return Err(self.failed_error());
        }
        self.refresh_capacity()
    }

    fn refresh_capacity(&self) -> Result<()> {
        let held = self.inner.lock().layout.usage().allocated;
        let limit = capacity_limit(&self.spec, held)?;
        let n = buckets_within(limit, self.label.bucket_size);
        self.inner.lock().layout.set_max_buckets(n);
        Ok(())
    }

    fn file(&self, inner: &mut Inner, b: u32, create: bool) -> std::io::Result<Arc<File>> {
        if let Some(Some(f)) = inner.files.get(b as usize) {
            return Ok(f.clone());
        }
        let path = self.spec.bucket_path(b);
        let f = Arc::new(open_file(&path, self.direct, create)?);
        if create {
            nix::fcntl::fallocate(
                std::os::fd::AsRawFd::as_raw_fd(&*f),
                nix::fcntl::FallocateFlags::empty(),
                0,
                self.label.bucket_size as i64,
            )
            .map_err(std::io::Error::from)?;
        }
        while inner.files.len() <= b as usize {
            inner.files.push(None);
        }
        inner.files[b as usize] = Some(f.clone());
        Ok(f)
    }

    /// Writes a batch of records (one run of writes per run of records in one bucket, one
    /// `fdatasync` per file touched) and links them once durable. Each value is hashed as it
    /// is copied into the write buffers and checked against its checksum: a record whose
    /// bytes do not match their version (the extent reused under an offload) is never linked,
    /// so no read and no restart finds it (a restart's reconcile reclaims it: metad does not
    /// list it). Batches of [`append::THREADED_FROM`] bytes and more are written by a helper
    /// thread while the caller fills the next piece.
    pub fn write_batch(&self, items: &[WriteItem<'_>]) -> Result<Vec<Written>> {
        if self.is_failed() {
            return Err(self.failed_error());
        }
        let mut pool = self.writer.lock();
        let t0 = Instant::now();
        let mut out: Vec<Written> = vec![Written::Ok; items.len()];
        // Plan every record's place first, under the lock, then write without it.
        let mut planned: Vec<(usize, super::layout::Append, RecordShape)> = Vec::new();
        let mut created: Vec<u32> = Vec::new();
        {
            let mut inner = self.inner.lock();
            for (i, it) in items.iter().enumerate() {
                let Some(shape) = RecordShape::new(it.key.len(), it.value_len()) else {
                    out[i] = Written::TooLarge;
                    continue;
                };
                match inner.layout.plan_append(shape.len) {
                    Ok(a) => {
                        if a.created {
                            created.push(a.bucket);
                        }
                        planned.push((i, a, shape));
                    }
                    Err(NoRoom::Full) => out[i] = Written::Full,
                    Err(NoRoom::TooLarge { .. }) => out[i] = Written::TooLarge,
                }
            }
        }
        let mut files: Vec<(u32, Arc<File>)> = Vec::new();
        for (_, a, _) in &planned {
            if !files.iter().any(|(b, _)| *b == a.bucket) {
                files.push((
                    a.bucket,
                    self.bucket_file(a.bucket, created.contains(&a.bucket))?,
                ));
            }
        }
        let file_of = |b: u32| {
            files
                .iter()
                .find(|(fb, _)| *fb == b)
                .map(|(_, f)| f.clone())
        };
        let total: u64 = planned.iter().map(|(_, _, s)| s.len).sum();
        let threaded = total >= append::THREADED_FROM;
        let written = append::with_appender(&mut pool, threaded, |w| {
            let mut verified = vec![false; planned.len()];
            let mut hashes = Vec::new();
            for (n, (i, a, shape)) in planned.iter().enumerate() {
                let contiguous = n > 0 && {
                    let (_, prev, prev_shape) = &planned[n - 1];
                    prev.bucket == a.bucket && !a.opened && a.offset == prev.offset + prev_shape.len
                };
                if !contiguous {
                    let file = file_of(a.bucket).ok_or_else(|| std::io::Error::other("no file"))?;
                    if a.opened {
                        // The bucket header goes first, in the same write as the records after it.
                        w.start_run(file, 0)?;
                        let mut hdr = [0u8; BLOCK as usize];
                        BucketHeader {
                            bucket: a.bucket,
                            epoch: a.epoch,
                        }
                        .encode(&mut hdr);
                        w.put(&hdr)?;
                    } else {
                        w.start_run(file, a.offset)?;
                    }
                }
                let it = &items[*i];
                let mut head = vec![0u8; shape.value_off as usize];
                encode_record_head(&mut head, it.key, it.version, it.checksum, a.epoch, shape);
                w.put(&head)?;
                let seed = it.version.seed();
                w.put_hashed(seed, it.value, &mut hashes)?;
                verified[n] = checksum::combine(seed, &hashes) == it.checksum;
                w.zero((shape.len - shape.value_off - shape.value_len) as usize)?;
            }
            Ok(verified)
        });
        let (verified, bytes) = match written {
            Ok(r) => r,
            Err(e) => return Err(self.io_failure("write", e)),
        };
        for (_, f) in &files {
            if let Err(e) = f.sync_data() {
                return Err(self.io_failure("fdatasync", e));
            }
        }
        {
            let mut inner = self.inner.lock();
            for ((i, a, shape), ok) in planned.iter().zip(&verified) {
                let it = &items[*i];
                let stale =
                    it.relocate && inner.layout.peek(it.key).map(|e| e.version) != Some(it.version);
                if !ok || stale {
                    if !ok {
                        out[*i] = Written::BadChecksum;
                    }
                    inner.layout.landed(a.bucket);
                    continue;
                }
                inner.layout.insert(
                    it.key,
                    Entry {
                        bucket: a.bucket,
                        offset: a.offset,
                        shape: *shape,
                        version: it.version,
                        checksum: it.checksum,
                        epoch: a.epoch,
                    },
                );
                inner.layout.landed(a.bucket);
            }
        }
        if !planned.is_empty() {
            self.stats
                .writes
                .fetch_add(planned.len() as u64, Ordering::Relaxed);
            self.stats.write_bytes.fetch_add(bytes, Ordering::Relaxed);
            self.stats
                .write_micros
                .fetch_add(t0.elapsed().as_micros() as u64, Ordering::Relaxed);
        }
        Ok(out)
    }

    /// Reads `key`'s value (of `version`, when given) into `dst`, which must be exactly the
    /// value's length ([`Disk::lookup`]), and verifies it. A damaged record is dropped.
    pub fn read(&self, key: &str, version: Option<Version>, dst: &mut [u8]) -> Result<ReadOutcome> {
        let mut hashes = vec![0u64; checksum::chunk_count(dst.len() as u64)];
        self.read_hashed(key, version, dst, &mut hashes)
    }

    /// [`Disk::read`] that also leaves the value's chunk hashes in `hashes` (one per
    /// [`checksum::CHUNK`]), for a caller that combines them as a data-plane read does.
    pub fn read_hashed(
        &self,
        key: &str,
        version: Option<Version>,
        dst: &mut [u8],
        hashes: &mut [u64],
    ) -> Result<ReadOutcome> {
        if self.is_failed() {
            return Err(self.failed_error());
        }
        let t0 = Instant::now();
        // A record moved by compaction (its bucket since reopened) is looked up once more.
        for _ in 0..2 {
            let e = {
                let mut inner = self.inner.lock();
                let Some(e) = inner.layout.get(key) else {
                    return Ok(ReadOutcome::Miss);
                };
                if version.is_some_and(|v| v != e.version) {
                    return Ok(ReadOutcome::Miss);
                }
                if dst.len() as u64 != e.shape.value_len {
                    return Err(Error::InvalidArgument(format!(
                        "disk read of {key:?}: buffer of {} bytes for a value of {}",
                        dst.len(),
                        e.shape.value_len
                    )));
                }
                e
            };
            let file = self.bucket_file(e.bucket, false)?;
            let read = self.with_read_buf(|buf| self.read_record(buf, &file, key, &e, dst, hashes));
            match read {
                Ok(RecordRead::Good) => {
                    self.stats.reads.fetch_add(1, Ordering::Relaxed);
                    self.stats
                        .read_bytes
                        .fetch_add(e.shape.value_len, Ordering::Relaxed);
                    self.stats
                        .read_micros
                        .fetch_add(t0.elapsed().as_micros() as u64, Ordering::Relaxed);
                    return Ok(ReadOutcome::Hit {
                        len: e.shape.value_len,
                    });
                }
                Ok(RecordRead::Moved) => continue,
                Ok(RecordRead::Damaged) if !self.damaged_in_private(&file, key, &e) => {
                    // The record is sound: the bytes changed in the destination while they
                    // were copied there (a client's memory, which it may reuse when it gave
                    // up on the read). Not a hit, and no reason to drop the record.
                    tracing::warn!(disk = %self.spec.path.display(), key, version = ?e.version, "a disk read into a buffer that changed under it: not delivered");
                    return Ok(ReadOutcome::Unverified);
                }
                Ok(RecordRead::Damaged) => {
                    let mut inner = self.inner.lock();
                    if inner.layout.peek(key) == Some(&e) {
                        inner.layout.remove(key, Some(e.version));
                    }
                    self.stats.corrupt_records.fetch_add(1, Ordering::Relaxed);
                    self.lost.lock().push(Dropped {
                        key: key.to_owned(),
                        version: e.version,
                    });
                    tracing::warn!(disk = %self.spec.path.display(), key, version = ?e.version, "damaged record read as a miss and dropped");
                    return Ok(ReadOutcome::Corrupt { version: e.version });
                }
                Err(err) => return Err(self.io_failure("read", err)),
            }
        }
        Ok(ReadOutcome::Miss)
    }

    /// The file of bucket `b` (opened, or created, on first use); an error takes the disk out.
    fn bucket_file(&self, b: u32, create: bool) -> Result<Arc<File>> {
        let opened = {
            let mut inner = self.inner.lock();
            self.file(&mut inner, b, create)
        };
        opened.map_err(|e| self.io_failure("open bucket", e))
    }

    /// Runs `f` on a pooled aligned buffer of [`IO_CHUNK`] bytes (faulting in fresh pages for
    /// every read would cost more than a small read itself).
    fn with_read_buf<T>(
        &self,
        f: impl FnOnce(&mut [u8]) -> std::io::Result<T>,
    ) -> std::io::Result<T> {
        let mut held = match self.read_bufs.lock().pop() {
            Some(b) => b,
            None => AlignedBuf::new(READ_BUF).map_err(|e| std::io::Error::other(e.to_string()))?,
        };
        let r = f(&mut held.0[..]);
        let mut pool = self.read_bufs.lock();
        if pool.len() < 4 {
            pool.push(held);
        }
        r
    }

    fn read_record(
        &self,
        buf: &mut [u8],
        file: &File,
        key: &str,
        e: &Entry,
        dst: &mut [u8],
        hashes: &mut [u64],
    ) -> std::io::Result<RecordRead> {
        let seed = e.version.seed();
        let head_len = e.shape.value_off as usize;
        // A value on a block boundary (64 KiB and more) is read straight into `dst` where it
        // is aligned; a small one shares its first block with the head: one read of it all.
        if self.direct && e.shape.value_off % BLOCK != 0 {
            self.read_small_record(buf, file, e, dst, hashes)?;
        } else if head_len > HEAD_ROOM {
            return Ok(self.damaged_unless_moved(key, e));
        } else {
            self.read_value(buf, file, e.offset, head_len, dst, seed, hashes)?;
        }
        if let Some(bad) = self.head_verdict(&buf[..head_len], key, e) {
            return Ok(bad);
        }
        Ok(if checksum::combine(seed, hashes) == e.checksum {
            RecordRead::Good
        } else {
            self.damaged_unless_moved(key, e)
        })
    }

    /// Whether the head of `e`'s record, as read, says it is still `key`'s record of that
    /// version: None if so, else what the read amounts to.
    fn head_verdict(&self, head: &[u8], key: &str, e: &Entry) -> Option<RecordRead> {
        match decode_record_head(head) {
            Ok(h) if h.key == key && h.version == e.version && h.epoch == e.epoch => {
                (h.checksum != e.checksum || h.shape != e.shape).then_some(RecordRead::Damaged)
            }
            // Another record (or none) now lies there: the bucket was reused after a
            // compaction moved this one, or the bytes are damaged.
            _ => Some(self.damaged_unless_moved(key, e)),
        }
    }

    /// A record whose value does not start on a block boundary (under 64 KiB): read whole
    /// into `buf` (its head stays at the start), the value copied out and hashed in one pass.
    fn read_small_record(
        &self,
        buf: &mut [u8],
        file: &File,
        e: &Entry,
        dst: &mut [u8],
        hashes: &mut [u64],
    ) -> std::io::Result<()> {
        let n = e.shape.len as usize;
        if n > buf.len() {
            return Err(std::io::Error::other(format!(
                "record of {n} bytes read through a buffer of {}",
                buf.len()
            )));
        }
        read_exact_at(file, &mut buf[..n], e.offset)?;
        let from = e.shape.value_off as usize;
        checksum::copy_and_hash(e.version.seed(), dst, &buf[from..from + dst.len()], hashes);
        Ok(())
    }

    /// Reads a record's head (`head_len` bytes from `pos`, into the start of `buf`) and its
    /// block-aligned value (into `dst`, hashed into `hashes`) in pieces of [`direct::PIECE`]:
    /// straight into `dst` where `O_DIRECT` allows it (`dst` aligned; the last partial block
    /// through `buf`), else through slots of `buf` with a fused copy and hash; a helper thread
    /// reads the next piece while this one hashes the last. The bytes hashed are the bytes
    /// delivered.
    #[allow(clippy::too_many_arguments)]
    fn read_value(
        &self,
        buf: &mut [u8],
        file: &File,
        pos: u64,
        head_len: usize,
        dst: &mut [u8],
        seed: u64,
        hashes: &mut [u64],
    ) -> std::io::Result<()> {
        let direct = self.direct;
        let in_place = !direct || direct::aligned(dst.as_ptr());
        let threaded = dst.len() >= direct::PIPELINE_FROM;
        let (head, rest) = buf.split_at_mut(HEAD_ROOM);
        let (tail_block, slots) = rest.split_at_mut(BLOCK as usize);
        let free: std::cell::RefCell<Vec<&mut [u8]>> = std::cell::RefCell::new(
            slots
                .chunks_mut(direct::PIECE)
                .filter(|s| s.len() == direct::PIECE)
                .collect(),
        );
        let depth = free.borrow().len().min(3);
        let value_len = dst.len();
        let mut pieces = dst.chunks_mut(direct::PIECE).enumerate();
        let mut head = Some(&mut head[..head_len]);
        let mut tail_block = Some(tail_block);
        direct::pipeline(
            threaded,
            depth,
            || {
                let Some((i, d)) = pieces.next() else {
                    return Ok(None);
                };
                let at = i * direct::PIECE;
                let via = if !in_place {
                    let slot = free.borrow_mut().pop().ok_or_else(|| {
                        std::io::Error::other("no free read slot (pipeline deeper than its slots)")
                    })?;
                    Via::Bounce(slot)
                } else if direct && at + d.len() == value_len && d.len() % BLOCK as usize != 0 {
                    Via::Tail(tail_block.take().unwrap_or_default())
                } else {
                    Via::InPlace
                };
                let head = head.take();
                let head_n = head.as_ref().map_or(0, |h| h.len()) as u64;
                Ok(Some(ReadPiece {
                    pos: pos + head_len as u64 + at as u64 - head_n,
                    at,
                    head,
                    dst: d,
                    via,
                }))
            },
            |p| p.read(file, direct),
            |p| {
                let first = p.at / checksum::CHUNK;
                let hs = &mut hashes[first..first + checksum::chunk_count(p.dst.len() as u64)];
                match p.via {
                    Via::Bounce(slot) => {
                        checksum::copy_and_hash(seed, p.dst, &slot[..p.dst.len()], hs);
                        free.borrow_mut().push(slot);
                    }
                    _ => checksum::hash_chunks(seed, p.dst, hs),
                }
                Ok(())
            },
        )
    }

    /// Whether the record of `e` fails its checksum read into memory of this process alone
    /// (a read into a caller's buffer can fail because the caller changed it meanwhile).
    fn damaged_in_private(&self, file: &File, key: &str, e: &Entry) -> bool {
        let mut own = vec![0u8; e.shape.value_len as usize];
        let mut hashes = vec![0u64; checksum::chunk_count(e.shape.value_len)];
        let again =
            self.with_read_buf(|buf| self.read_record(buf, file, key, e, &mut own, &mut hashes));
        matches!(again, Ok(RecordRead::Damaged))
    }

    /// Bytes read for `e` did not verify: damage only if `e` is still where `key` lies. A
    /// record moved by compaction or dropped by the disk's eviction while it was read had its
    /// bucket reused under the read (the layout changes before a bucket is reused, so an
    /// entry unchanged after the read was read intact or damaged on the device).
    fn damaged_unless_moved(&self, key: &str, e: &Entry) -> RecordRead {
        if self.inner.lock().layout.peek(key) != Some(e) {
            RecordRead::Moved
        } else {
            RecordRead::Damaged
        }
    }

    /// Unlinks `key`'s record if it is of `version` (its space is reclaimed with its bucket).
    pub fn remove(&self, key: &str, version: Option<Version>) -> bool {
        self.inner.lock().layout.remove(key, version).is_some()
    }

    /// The disk's own eviction: drops every record of the least recently used bucket and
    /// frees it. Returns what was dropped (to be removed from the metadata), empty when there
    /// is nothing to evict.
    pub fn evict_lru(&self) -> Result<Vec<Dropped>> {
        match self.eviction_candidate() {
            Some((b, _)) => self.evict(b),
            None => Ok(Vec::new()),
        }
    }

    /// The bucket the disk's own eviction would free next (least recently used, sealed) and
    /// the records it holds: what a caller reports dropped before [`Disk::evict`] erases them.
    pub fn eviction_candidate(&self) -> Option<(u32, Vec<Dropped>)> {
        let inner = self.inner.lock();
        let b = inner.layout.lru_bucket()?;
        Some((b, to_dropped(inner.layout.records_in(b))))
    }

    /// Evicts bucket `b` if it is still sealed (not freed and reopened meanwhile): drops its
    /// records, frees it and erases its header. Returns what was dropped.
    pub fn evict(&self, b: u32) -> Result<Vec<Dropped>> {
        let _writer = self.writer.lock();
        let dropped = {
            let mut inner = self.inner.lock();
            if inner.layout.bucket(b).map(|k| k.state) != Some(super::layout::BucketState::Sealed) {
                return Ok(Vec::new());
            }
            inner.layout.free_bucket(b)
        };
        self.forget_bucket(b)?;
        let dropped = to_dropped(dropped);
        self.stats
            .evicted
            .fetch_add(dropped.len() as u64, Ordering::Relaxed);
        Ok(dropped)
    }

    /// Erases the header of a bucket just freed (caller holds the writer lock, so it cannot
    /// have been reopened): a scan after a restart then finds no record in it, instead of
    /// bringing back what was evicted or moved.
    fn forget_bucket(&self, b: u32) -> Result<()> {
        let file = self.bucket_file(b, false)?;
        let zero = AlignedBuf::new(BLOCK as usize)?;
        if let Err(e) = file
            .write_all_at(&zero.0[..BLOCK as usize], 0)
            .and_then(|()| file.sync_data())
        {
            return Err(self.io_failure("erase bucket header", e));
        }
        Ok(())
    }

    /// Moves the live records of the emptiest sparse bucket to the log's head and frees it.
    /// Returns whether a bucket was freed. Reads go on meanwhile: a read of a record that
    /// moved finds it again at its new place. Records whose bytes turn out damaged are dropped
    /// and returned in `dropped`.
    pub fn compact_one(&self, dropped: &mut Vec<Dropped>) -> Result<bool> {
        if self.is_failed() {
            return Err(self.failed_error());
        }
        let (b, records) = {
            let mut inner = self.inner.lock();
            let Some(b) = inner.layout.compaction_candidate() else {
                return Ok(false);
            };
            // Copies must land in another bucket: close the open one if it is the candidate.
            inner.layout.seal_open();
            (b, inner.layout.records_in(b))
        };
        for (key, e) in records {
            let mut value = vec![0u8; e.shape.value_len as usize];
            match self.read(&key, Some(e.version), &mut value)? {
                ReadOutcome::Hit { .. } => {}
                ReadOutcome::Corrupt { version } => {
                    dropped.push(Dropped { key, version });
                    continue;
                }
                // A private buffer cannot change under the read; skipped if it ever did.
                ReadOutcome::Miss | ReadOutcome::Unverified => continue,
            }
            // Removed or replaced meanwhile: nothing to move.
            if self.lookup(&key).map(|(v, _)| v) != Some(e.version) {
                continue;
            }
            let item = WriteItem {
                key: &key,
                version: e.version,
                checksum: e.checksum,
                value: &[&value],
                relocate: true,
            };
            match self.write_batch(std::slice::from_ref(&item))?.first() {
                Some(Written::Ok) => {
                    self.stats.compacted.fetch_add(1, Ordering::Relaxed);
                }
                // No room to move it to: leave the rest where it is.
                _ => return Ok(false),
            }
        }
        let _writer = self.writer.lock();
        {
            let mut inner = self.inner.lock();
            if !inner.layout.records_in(b).is_empty() {
                return Ok(false);
            }
            if inner.layout.bucket(b).map(|k| k.state) != Some(super::layout::BucketState::Free) {
                inner.layout.free_bucket(b);
            }
            // Reopened by a write since: nothing of the old use is left to forget.
            if inner.layout.bucket(b).map(|k| k.state) != Some(super::layout::BucketState::Free) {
                return Ok(true);
            }
        }
        self.forget_bucket(b)?;
        Ok(true)
    }
}

/// Reads `dst.len()` bytes of `e`'s value from `offset` on: straight into `dst` where it can
/// take an `O_DIRECT` read, else through `buf`.
fn read_range_with(
    buf: &mut [u8],
    file: &File,
    direct: bool,
    e: &Entry,
    offset: u64,
    dst: &mut [u8],
) -> std::io::Result<()> {
    let start = e.offset + e.shape.value_off + offset;
    if !direct || (start % BLOCK == 0 && direct::aligned(dst.as_ptr())) {
        let via = if direct && dst.len() % BLOCK as usize != 0 {
            Via::Tail(&mut buf[..BLOCK as usize])
        } else {
            Via::InPlace
        };
        return ReadPiece {
            pos: start,
            at: 0,
            head: None,
            dst,
            via,
        }
        .read(file, direct);
    }
    let end = start + dst.len() as u64;
    let mut pos = start / BLOCK * BLOCK;
    let mut copied = 0usize;
    while copied < dst.len() {
        let n = (align_block(end) - pos).min(buf.len() as u64) as usize;
        read_exact_at(file, &mut buf[..n], pos)?;
        let from = start.saturating_sub(pos) as usize;
        let take = (n - from).min(dst.len() - copied);
        dst[copied..copied + take].copy_from_slice(&buf[from..from + take]);
        copied += take;
        pos += n as u64;
    }
    Ok(())
}

fn to_dropped(records: Vec<(String, Entry)>) -> Vec<Dropped> {
    records
        .into_iter()
        .map(|(key, e)| Dropped {
            key,
            version: e.version,
        })
        .collect()
}

enum RecordRead {
    Good,
    Moved,
    Damaged,
}

/// Room for a record's head at the start of a read buffer: the longest key's head.
const HEAD_ROOM: usize = 128 << 10;

/// Where one piece of a value is read to.
enum Via<'a> {
    /// Straight into its destination.
    InPlace,
    /// Its whole blocks straight into the destination, the last partial one through this
    /// block (`O_DIRECT` reads whole blocks).
    Tail(&'a mut [u8]),
    /// Into this slot (the destination is not aligned for `O_DIRECT`), copied out after.
    Bounce(&'a mut [u8]),
}

/// One piece of a value being read: `dst` is the value's bytes from `at` on.
struct ReadPiece<'a> {
    /// File position of the first byte read (the head's, when it comes along).
    pos: u64,
    at: usize,
    /// The record's head, read in the same request as the first piece.
    head: Option<&'a mut [u8]>,
    dst: &'a mut [u8],
    via: Via<'a>,
}

impl ReadPiece<'_> {
    /// One vectored read of the piece (and the head), completed to its last byte.
    fn read(&mut self, file: &File, direct: bool) -> std::io::Result<()> {
        let len = self.dst.len();
        let mut iov: Vec<std::io::IoSliceMut<'_>> = Vec::with_capacity(3);
        if let Some(h) = self.head.as_deref_mut() {
            iov.push(std::io::IoSliceMut::new(h));
        }
        match &mut self.via {
            Via::InPlace => {
                iov.push(std::io::IoSliceMut::new(self.dst));
                direct::preadv_exact(file, &mut iov, self.pos)
            }
            Via::Tail(block) => {
                let whole = len / BLOCK as usize * BLOCK as usize;
                let (body, tail) = self.dst.split_at_mut(whole);
                iov.push(std::io::IoSliceMut::new(body));
                iov.push(std::io::IoSliceMut::new(&mut block[..BLOCK as usize]));
                direct::preadv_exact(file, &mut iov, self.pos)?;
                drop(iov);
                tail.copy_from_slice(&block[..tail.len()]);
                Ok(())
            }
            Via::Bounce(slot) => {
                let n = if direct {
                    align_block(len as u64) as usize
                } else {
                    len
                };
                iov.push(std::io::IoSliceMut::new(&mut slot[..n]));
                direct::preadv_exact(file, &mut iov, self.pos)
            }
        }
    }
}

fn read_exact_at(f: &File, buf: &mut [u8], pos: u64) -> std::io::Result<()> {
    f.read_exact_at(buf, pos)
}

fn open_file(path: &Path, direct: bool, create: bool) -> std::io::Result<File> {
    let mut o = OpenOptions::new();
    o.read(true).write(true).create(create);
    if direct {
        o.custom_flags(nix::fcntl::OFlag::O_DIRECT.bits());
    }
    o.open(path)
}

/// Whether files in `dir` can be opened with `O_DIRECT` (not on tmpfs, for one).
fn supports_direct(dir: &Path) -> bool {
    let probe = dir.join(".regolith-direct-probe");
    let ok = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(nix::fcntl::OFlag::O_DIRECT.bits())
        .open(&probe)
        .is_ok();
    let _ = std::fs::remove_file(&probe);
    ok
}

/// How many bytes the disk may hold: `SIZE`, or what it holds (`held`) plus the file
/// system's free space less a margin.
fn capacity_limit(spec: &DiskSpec, held: u64) -> Result<u64> {
    let st = nix::sys::statvfs::statvfs(&spec.path).map_err(|e| Error::Os {
        what: format!("disk {}: statvfs", spec.path.display()),
        source: e.into(),
    })?;
    let frsize = st.fragment_size() as u64;
    let total = (st.blocks() as u64).saturating_mul(frsize);
    let avail = (st.blocks_available() as u64).saturating_mul(frsize);
    let margin = (total / 20).max(MIN_MARGIN).min(total / 2);
    let fs_limit = held.saturating_add(avail.saturating_sub(margin));
    Ok(match spec.size {
        Some(size) => size.min(held.saturating_add(avail)),
        None => fs_limit,
    })
}

fn buckets_within(limit: u64, bucket_size: u64) -> u32 {
    (limit / bucket_size.max(1)).min(u32::MAX as u64) as u32
}

fn read_or_write_label(spec: &DiskSpec, limit: u64, opts: &DiskOptions) -> Result<Label> {
    let path = spec.path.join(LABEL_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => {
            let label: Label = serde_json::from_slice(&bytes).map_err(|e| Error::DiskFailed {
                path: spec.path.display().to_string(),
                reason: format!("label {}: {e}", path.display()),
            })?;
            if label.format != FORMAT
                || label.bucket_size < MIN_BUCKET
                || label.bucket_size % BLOCK != 0
            {
                return Err(Error::DiskFailed {
                    path: spec.path.display().to_string(),
                    reason: format!(
                        "label {}: format {} with buckets of {} bytes is not one this sidecar reads (format {FORMAT})",
                        path.display(),
                        label.format,
                        label.bucket_size
                    ),
                });
            }
            Ok(label)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(name) = std::fs::read_dir(&spec.path)
                .map_err(|e| io_err(&spec.path, "list", e))?
                .filter_map(|d| d.ok())
                .map(|d| d.file_name().to_string_lossy().into_owned())
                .find(|n| parse_bucket_file_name(n).is_some())
            {
                return Err(Error::DiskFailed {
                    path: spec.path.display().to_string(),
                    reason: format!("bucket file {name} without a label: not formatting over it"),
                });
            }
            let bucket_size = opts.bucket_size.unwrap_or_else(|| {
                let eighth = (limit / 8) / MIN_BUCKET * MIN_BUCKET;
                eighth.clamp(MIN_BUCKET, MAX_BUCKET)
            });
            if bucket_size < MIN_BUCKET || bucket_size % BLOCK != 0 {
                return Err(Error::Config(format!(
                    "disk {}: bucket size {bucket_size} must be at least {MIN_BUCKET} and a multiple of {BLOCK}",
                    spec.path.display()
                )));
            }
            let label = Label {
                format: FORMAT,
                disk_id: format!("{:016x}", rand::random::<u64>()),
                bucket_size,
            };
            write_durably(
                &path,
                &serde_json::to_vec_pretty(&label).unwrap_or_default(),
            )
            .map_err(|e| io_err(&spec.path, "write label", e))?;
            Ok(label)
        }
        Err(e) => Err(io_err(&spec.path, "read label", e)),
    }
}

/// Takes the disk's lock (its label file, exclusively, without waiting).
fn lock_label(spec: &DiskSpec) -> Result<nix::fcntl::Flock<File>> {
    let path = spec.path.join(LABEL_FILE);
    let f = File::open(&path).map_err(|e| io_err(&spec.path, "open label", e))?;
    nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock).map_err(|(_, e)| {
        Error::DiskFailed {
            path: spec.path.display().to_string(),
            reason: format!("in use by another process ({e}): one sidecar per disk directory"),
        }
    })
}

fn write_durably(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    {
        let f = File::create(&tmp)?;
        f.write_all_at(bytes, 0)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// Rebuilds the layout from the bucket files: each bucket's header names its epoch, and its
/// records of that epoch are read up to the first block that is not one (the end of its log).
fn scan(spec: &DiskSpec, label: &Label, direct: bool, inner: &mut Inner) -> Result<ScanReport> {
    let mut report = ScanReport::default();
    let mut numbers: Vec<u32> = std::fs::read_dir(&spec.path)
        .map_err(|e| io_err(&spec.path, "list", e))?
        .filter_map(|d| d.ok())
        .filter_map(|d| parse_bucket_file_name(&d.file_name().to_string_lossy()))
        .collect();
    numbers.sort_unstable();
    let mut buf = AlignedBuf::new(IO_CHUNK)?;
    for b in numbers {
        let path = spec.bucket_path(b);
        let file = open_file(&path, direct, false).map_err(|e| io_err(&path, "open", e))?;
        let len = file.metadata().map_err(|e| io_err(&path, "stat", e))?.len();
        // A short file (truncated) is read as far as it goes.
        let end = len.min(label.bucket_size) / BLOCK * BLOCK;
        report.buckets += 1;
        let mut hdr = [0u8; BLOCK as usize];
        let header = if end >= BLOCK {
            read_block_aligned(&file, &mut buf.0, 0, BLOCK as usize)
                .map_err(|e| io_err(&path, "read", e))?;
            hdr.copy_from_slice(&buf.0[..BLOCK as usize]);
            BucketHeader::decode(&hdr).filter(|h| h.bucket == b)
        } else {
            None
        };
        let mut found: Vec<(String, Entry)> = Vec::new();
        let (tail, max_epoch) =
            walk_records(&file, &mut buf.0, end, header.map(|h| h.epoch), |key, e| {
                found.push((key.to_owned(), Entry { bucket: b, ..e }))
            })
            .map_err(|e| io_err(&path, "read", e))?;
        inner.layout.note_epoch(max_epoch);
        match header {
            Some(h) => inner.layout.restore_bucket(b, h.epoch, tail),
            None => inner.layout.restore_bucket(b, 0, BLOCK),
        }
        for (key, e) in found {
            report.records += 1;
            if inner.layout.restore_record(&key, e).is_some() {
                report.superseded += 1;
            }
        }
        while inner.files.len() <= b as usize {
            inner.files.push(None);
        }
        inner.files[b as usize] = Some(Arc::new(file));
    }
    Ok(report)
}

fn read_block_aligned(f: &File, buf: &mut [u8], pos: u64, n: usize) -> std::io::Result<()> {
    f.read_exact_at(&mut buf[..n], pos)
}

/// Walks the records of one bucket from its first record. With `epoch`, records of that epoch
/// are reported (`found`) and the walk ends at the first block that is not one; without (a
/// bucket whose header is not valid), nothing is reported and the walk only learns the highest
/// epoch written there. Returns the end of the log and the highest epoch seen.
fn walk_records(
    file: &File,
    buf: &mut [u8],
    end: u64,
    epoch: Option<u64>,
    mut found: impl FnMut(&str, Entry),
) -> std::io::Result<(u64, u64)> {
    let mut pos = BLOCK;
    let mut max_epoch = 0;
    // The window of the file in `buf`: [win, win + win_len).
    let mut win = 0u64;
    let mut win_len = 0usize;
    while pos + BLOCK <= end {
        let need = |at: u64, n: usize| at < win || at + n as u64 > win + win_len as u64;
        if need(pos, BLOCK as usize) {
            win = pos;
            win_len = ((end - pos) as usize).min(buf.len());
            file.read_exact_at(&mut buf[..win_len], win)?;
        }
        let at = (pos - win) as usize;
        let head = match decode_record_head(&buf[at..win_len]) {
            Ok(h) => h,
            Err(NotARecord::Short { need: n }) => {
                // A long key reaching past the window: read from the record's start.
                if (n as u64) > (buf.len() as u64) || pos + align_block(n as u64) > end {
                    break;
                }
                win = pos;
                win_len = ((end - pos) as usize).min(buf.len());
                file.read_exact_at(&mut buf[..win_len], win)?;
                match decode_record_head(&buf[..win_len]) {
                    Ok(h) => h,
                    Err(_) => break,
                }
            }
            Err(_) => break,
        };
        if epoch.is_some_and(|e| head.epoch != e) || pos + head.shape.len > end {
            break;
        }
        max_epoch = max_epoch.max(head.epoch);
        if epoch.is_some() {
            found(
                &head.key,
                Entry {
                    bucket: 0,
                    offset: pos,
                    shape: head.shape,
                    version: head.version,
                    checksum: head.checksum,
                    epoch: head.epoch,
                },
            );
        }
        pos += head.shape.len;
    }
    Ok((pos, max_epoch))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn v(id: u64) -> Version {
        Version { term: 3, id }
    }

    fn value(id: u64, len: usize) -> Vec<u8> {
        (0..len).map(|i| (i as u64 * 31 + id * 7) as u8).collect()
    }

    fn open(dir: &Path, size: u64) -> (Disk, ScanReport) {
        let spec = DiskSpec {
            path: dir.to_path_buf(),
            size: Some(size),
        };
        Disk::open(
            spec,
            &DiskOptions {
                bucket_size: Some(MIB),
            },
        )
        .unwrap()
    }

    fn put(d: &Disk, key: &str, id: u64, len: usize) -> Written {
        let val = value(id, len);
        let item = WriteItem {
            key,
            version: v(id),
            checksum: checksum::checksum(v(id).seed(), &val),
            value: &[&val],
            relocate: false,
        };
        d.write_batch(&[item]).unwrap().remove(0)
    }

    fn get(d: &Disk, key: &str) -> Option<Vec<u8>> {
        let (_, len) = d.lookup(key)?;
        let mut out = vec![0u8; len as usize];
        match d.read(key, None, &mut out).unwrap() {
            ReadOutcome::Hit { .. } => Some(out),
            _ => None,
        }
    }

    #[test]
    fn a_batch_is_written_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let (d, _) = open(dir.path(), 8 * MIB);
        let vals: Vec<Vec<u8>> = (0..20)
            .map(|i| value(i, 1000 + i as usize * 5000))
            .collect();
        let keys: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
        let parts: Vec<[&[u8]; 1]> = vals.iter().map(|v| [v.as_slice()]).collect();
        let items: Vec<WriteItem> = (0..20)
            .map(|i| WriteItem {
                key: &keys[i],
                version: v(i as u64),
                checksum: checksum::checksum(v(i as u64).seed(), &vals[i]),
                value: &parts[i],
                relocate: false,
            })
            .collect();
        assert!(d
            .write_batch(&items)
            .unwrap()
            .iter()
            .all(|w| *w == Written::Ok));
        for i in 0..20 {
            assert_eq!(
                get(&d, &keys[i]).as_deref(),
                Some(&vals[i][..]),
                "{}",
                keys[i]
            );
        }
        assert_eq!(d.usage().objects, 20);
        let mut out = vec![0u8; vals[3].len()];
        assert_eq!(
            d.read("k3", Some(v(99)), &mut out).unwrap(),
            ReadOutcome::Miss
        );
        assert_eq!(d.read("nope", None, &mut out).unwrap(), ReadOutcome::Miss);
    }

    /// Every way a value reaches its reader: small records (head and value in one block),
    /// block-aligned values straight into an aligned destination, through the bounce slots
    /// into an unaligned one, pipelined pieces (4 MiB and more) and a last partial block; on
    /// a disk with `O_DIRECT` and one without (buffered I/O, as on a file system that refuses
    /// it); whole values and ranges of them.
    #[test]
    fn values_of_every_size_read_back_into_aligned_and_unaligned_memory() {
        let sizes = [
            1_000usize,
            70_000,
            (256 << 10) + 7,
            4 << 20,
            (5 << 20) + 123,
            (17 << 20) + 1,
        ];
        for buffered in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let (mut d, _) = Disk::open(
                DiskSpec {
                    path: dir.path().to_path_buf(),
                    size: Some(128 * MIB),
                },
                &DiskOptions {
                    bucket_size: Some(32 * MIB),
                },
            )
            .unwrap();
            // Before any bucket file is opened: every one is then opened without O_DIRECT.
            d.direct &= !buffered;
            let mode = if d.direct { "O_DIRECT" } else { "buffered" };
            let mut aligned = AlignedBuf::new((18 << 20) + 2 * BLOCK as usize).unwrap();
            for (i, &len) in sizes.iter().enumerate() {
                let key = format!("k{len}");
                assert_eq!(put(&d, &key, i as u64, len), Written::Ok, "{mode} {len}");
                let want = value(i as u64, len);
                for shift in [0usize, 1, BLOCK as usize + 3] {
                    let dst = &mut aligned.0[shift..shift + len];
                    dst.fill(0);
                    assert_eq!(
                        d.read(&key, None, dst).unwrap(),
                        ReadOutcome::Hit { len: len as u64 },
                        "{mode} {len} at +{shift}"
                    );
                    assert!(dst[..] == want[..], "{mode} {len} at +{shift}: wrong bytes");
                }
                for (off, n) in [
                    (0usize, len),
                    (len / 2 / 4096 * 4096, len / 3),
                    (1, len - 1),
                ] {
                    let n = n.min(len - off).max(1);
                    for shift in [0usize, 5] {
                        let dst = &mut aligned.0[shift..shift + n];
                        dst.fill(0);
                        assert!(
                            d.read_range(&v(i as u64), off as u64, dst).unwrap(),
                            "{mode} {len}: range {off}+{n} at +{shift}"
                        );
                        assert!(
                            dst[..] == want[off..off + n],
                            "{mode} {len}: range {off}+{n} at +{shift}: wrong bytes"
                        );
                    }
                }
            }
        }
    }

    /// A read into memory its owner keeps changing (a client that gave up on the read and
    /// reused its buffer) is never delivered and never drops the sound record it read.
    #[test]
    fn a_buffer_changed_under_a_read_drops_no_record() {
        let dir = tempfile::tempdir().unwrap();
        let (d, _) = open(dir.path(), 8 * MIB);
        const LEN: usize = 512 << 10;
        assert_eq!(put(&d, "k", 1, LEN), Written::Ok);
        let mut dst = memmap2::MmapMut::map_anon(LEN).unwrap();
        let addr = dst.as_mut_ptr() as usize;
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let scribbler = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut i = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    // SAFETY: the mapping outlives this thread (joined below); the racing
                    // writes are the point of the test, as a client's would be.
                    unsafe { std::ptr::write_volatile((addr + i % LEN) as *mut u8, i as u8) };
                    i = i.wrapping_add(4093);
                }
            })
        };
        let mut unverified = 0;
        for _ in 0..20 {
            match d.read("k", Some(v(1)), &mut dst[..]).unwrap() {
                ReadOutcome::Hit { .. } => {}
                ReadOutcome::Unverified => unverified += 1,
                other => panic!("a sound record read as {other:?}"),
            }
        }
        stop.store(true, Ordering::Relaxed);
        scribbler.join().unwrap();
        eprintln!("{unverified} of 20 reads met a changing buffer");
        assert_eq!(d.stats.corrupt_records.load(Ordering::Relaxed), 0);
        assert_eq!(
            get(&d, "k").as_deref(),
            Some(&value(1, LEN)[..]),
            "the record stays"
        );
    }

    /// Writes, the disk's eviction, compaction, removals and reads all at once on a small disk
    /// (buckets reused all the time): no read ever finds a linked record damaged.
    #[test]
    fn concurrent_writes_evictions_compactions_and_reads_never_see_damage() {
        use std::time::Duration;
        let dir = tempfile::tempdir().unwrap();
        let (d, _) = open(dir.path(), 6 * MIB);
        let d = Arc::new(d);
        let stop = Arc::new(AtomicBool::new(false));
        let next = Arc::new(AtomicU64::new(1));
        let key = |i: u64| format!("key-{:02}", i % 48);
        let mut threads = Vec::new();
        for w in 0..2u64 {
            let (d, stop, next) = (d.clone(), stop.clone(), next.clone());
            threads.push(std::thread::spawn(move || {
                let mut n = w;
                while !stop.load(Ordering::Relaxed) {
                    let ids: Vec<u64> = (0..1 + n % 5)
                        .map(|_| next.fetch_add(1, Ordering::Relaxed))
                        .collect();
                    let keys: Vec<String> = ids.iter().map(|&i| key(i * 7 + n)).collect();
                    let vals: Vec<Vec<u8>> = ids
                        .iter()
                        .map(|&i| value(i, 1 + ((i * 7919) % (200 << 10)) as usize))
                        .collect();
                    let parts: Vec<[&[u8]; 1]> = vals.iter().map(|v| [v.as_slice()]).collect();
                    let items: Vec<WriteItem> = (0..ids.len())
                        .map(|j| WriteItem {
                            key: &keys[j],
                            version: v(ids[j]),
                            checksum: checksum::checksum(v(ids[j]).seed(), &vals[j]),
                            value: &parts[j],
                            relocate: false,
                        })
                        .collect();
                    let out = d.write_batch(&items).unwrap();
                    if out.contains(&Written::Full) {
                        d.evict_lru().unwrap();
                    }
                    n += 1;
                }
            }));
        }
        {
            let (d, stop) = (d.clone(), stop.clone());
            threads.push(std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let mut dropped = Vec::new();
                    d.compact_one(&mut dropped).unwrap();
                    assert!(dropped.is_empty(), "compaction found damage: {dropped:?}");
                    d.remove(&key(n * 13), None);
                    n += 1;
                    std::thread::sleep(Duration::from_micros(200));
                }
            }));
        }
        for r in 0..2u64 {
            let (d, stop) = (d.clone(), stop.clone());
            threads.push(std::thread::spawn(move || {
                let mut n = r;
                while !stop.load(Ordering::Relaxed) {
                    let k = key(n);
                    n += 1;
                    let Some((ver, len)) = d.lookup(&k) else {
                        continue;
                    };
                    let mut out = vec![0u8; len as usize];
                    match d.read(&k, Some(ver), &mut out) {
                        Ok(ReadOutcome::Hit { .. }) => {
                            assert_eq!(out, value(ver.id, len as usize), "{k} {ver:?}");
                        }
                        Ok(ReadOutcome::Miss) => {}
                        Err(Error::InvalidArgument(_)) => {} // replaced by another length
                        other => panic!("{k} {ver:?} read as {other:?}"),
                    }
                    let mut part = vec![0u8; (len as usize).min(5000)];
                    if d.read_range(&ver, 0, &mut part).unwrap() {
                        assert_eq!(
                            part,
                            value(ver.id, len as usize)[..part.len()],
                            "range of {k}"
                        );
                    }
                }
            }));
        }
        std::thread::sleep(Duration::from_secs(4));
        stop.store(true, Ordering::Relaxed);
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(d.stats.corrupt_records.load(Ordering::Relaxed), 0);
        assert!(
            d.stats.compacted.load(Ordering::Relaxed) > 0,
            "compaction ran"
        );
        assert!(d.stats.evicted.load(Ordering::Relaxed) > 0, "eviction ran");
    }

    #[test]
    fn a_range_of_a_value_is_read_by_version() {
        let dir = tempfile::tempdir().unwrap();
        let (d, _) = open(dir.path(), 8 * MIB);
        assert_eq!(put(&d, "big", 5, 300_000), Written::Ok);
        assert_eq!(put(&d, "small", 6, 5_000), Written::Ok);
        let val = value(5, 300_000);
        assert_eq!(d.key_of(&v(5)).as_deref(), Some("big"));
        for (off, len) in [
            (0usize, 300_000usize),
            (70_000, 100_000),
            (299_999, 1),
            (4095, 8193),
        ] {
            let mut out = vec![0u8; len];
            assert!(d.read_range(&v(5), off as u64, &mut out).unwrap());
            assert!(out == val[off..off + len], "{off}+{len}");
        }
        let mut out = vec![0u8; 100];
        assert!(d.read_range(&v(6), 4_900, &mut out).unwrap());
        assert!(out == value(6, 5_000)[4_900..]);
        assert!(
            !d.read_range(&v(6), 4_950, &mut out).unwrap(),
            "past the value"
        );
        assert!(
            !d.read_range(&v(99), 0, &mut out).unwrap(),
            "no such version"
        );
        assert!(d.remove("big", None));
        assert!(d.key_of(&v(5)).is_none());
        assert!(!d.read_range(&v(5), 0, &mut out).unwrap());
    }

    #[test]
    fn bytes_that_do_not_match_their_checksum_are_never_linked() {
        let dir = tempfile::tempdir().unwrap();
        let (d, _) = open(dir.path(), 8 * MIB);
        let val = value(1, 5000);
        let good = value(2, 70_000);
        let items = [
            WriteItem {
                key: "k",
                version: v(1),
                checksum: checksum::checksum(v(2).seed(), &val),
                value: &[&val[..100], &val[100..]],
                relocate: false,
            },
            WriteItem {
                key: "after",
                version: v(2),
                checksum: checksum::checksum(v(2).seed(), &good),
                value: &[&good[..3], &good[3..]],
                relocate: false,
            },
        ];
        assert_eq!(
            d.write_batch(&items).unwrap(),
            vec![Written::BadChecksum, Written::Ok]
        );
        assert!(d.lookup("k").is_none());
        let mut back = vec![0u8; good.len()];
        assert!(matches!(
            d.read("after", Some(v(2)), &mut back).unwrap(),
            ReadOutcome::Hit { .. }
        ));
        assert_eq!(
            back, good,
            "a record after a refused one is written and read whole"
        );
        assert_eq!(put(&d, "big", 1, MIB as usize), Written::TooLarge);
    }

    #[test]
    fn a_reopened_disk_holds_what_was_written_and_the_later_version_of_a_key() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (d, _) = open(dir.path(), 8 * MIB);
            for i in 0..50 {
                assert_eq!(put(&d, &format!("k{i}"), i, 30_000), Written::Ok);
            }
            // A newer version of k0, and a remove that a restart forgets (the leader's
            // reconciliation drops such records).
            assert_eq!(put(&d, "k0", 100, 10), Written::Ok);
            assert!(d.remove("k1", None));
        }
        let (d, report) = open(dir.path(), 8 * MIB);
        assert_eq!(report.records, 51);
        assert_eq!(report.superseded, 1);
        assert_eq!(d.lookup("k0"), Some((v(100), 10)));
        assert_eq!(get(&d, "k0"), Some(value(100, 10)));
        for i in 1..50 {
            assert_eq!(get(&d, &format!("k{i}")), Some(value(i, 30_000)), "k{i}");
        }
        // Writes go on after a reopen and survive the next one.
        assert_eq!(put(&d, "after", 200, 70_000), Written::Ok);
        drop(d);
        let (d, _) = open(dir.path(), 8 * MIB);
        assert_eq!(get(&d, "after"), Some(value(200, 70_000)));
        assert_eq!(get(&d, "k7"), Some(value(7, 30_000)));
    }

    fn bucket0(dir: &Path) -> PathBuf {
        dir.join(bucket_file_name(0))
    }

    fn flip_byte(path: &Path, at: u64) {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap();
        let mut b = [0u8; 1];
        f.read_exact_at(&mut b, at).unwrap();
        b[0] ^= 0x5a;
        f.write_all_at(&b, at).unwrap();
        f.sync_all().unwrap();
    }

    #[test]
    fn a_corrupted_value_is_read_as_a_miss_and_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let (d, _) = open(dir.path(), 8 * MIB);
        assert_eq!(put(&d, "a", 1, 20_000), Written::Ok);
        assert_eq!(put(&d, "b", 2, 20_000), Written::Ok);
        // "a" is the first record: its value starts a little after BLOCK.
        flip_byte(&bucket0(dir.path()), BLOCK + 200);
        let mut out = vec![0u8; 20_000];
        assert_eq!(
            d.read("a", None, &mut out).unwrap(),
            ReadOutcome::Corrupt { version: v(1) }
        );
        assert!(d.lookup("a").is_none());
        assert_eq!(d.stats.corrupt_records.load(Ordering::Relaxed), 1);
        assert_eq!(get(&d, "b"), Some(value(2, 20_000)));
    }

    #[test]
    fn a_damaged_header_ends_the_log_at_the_scan() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (d, _) = open(dir.path(), 8 * MIB);
            for i in 0..3 {
                assert_eq!(put(&d, &format!("k{i}"), i, 5000), Written::Ok); // 8 KiB each
            }
        }
        // Damage the second record's header: the scan keeps the first only.
        flip_byte(&bucket0(dir.path()), BLOCK + 8192 + 20);
        let (d, report) = open(dir.path(), 8 * MIB);
        assert_eq!(report.records, 1);
        assert_eq!(get(&d, "k0"), Some(value(0, 5000)));
        assert!(d.lookup("k1").is_none() && d.lookup("k2").is_none());
    }

    #[test]
    fn a_truncated_bucket_keeps_the_records_before_the_cut() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (d, _) = open(dir.path(), 8 * MIB);
            for i in 0..4 {
                assert_eq!(put(&d, &format!("k{i}"), i, 5000), Written::Ok);
            }
        }
        let f = OpenOptions::new()
            .write(true)
            .open(bucket0(dir.path()))
            .unwrap();
        f.set_len(BLOCK + 2 * 8192 + 100).unwrap();
        drop(f);
        let (d, report) = open(dir.path(), 8 * MIB);
        assert_eq!(report.records, 2);
        assert_eq!(get(&d, "k1"), Some(value(1, 5000)));
        assert!(d.lookup("k2").is_none());
    }

    #[test]
    fn a_full_disk_evicts_its_least_recently_used_bucket() {
        let dir = tempfile::tempdir().unwrap();
        let (d, _) = open(dir.path(), 2 * MIB);
        let rec = 300_000;
        // Three records per 1 MiB bucket, two buckets.
        for i in 0..6 {
            assert_eq!(put(&d, &format!("k{i}"), i, rec), Written::Ok, "k{i}");
        }
        assert_eq!(put(&d, "k6", 6, rec), Written::Full);
        // Reading k0 makes the second bucket (k3..k5) the least recently used.
        assert!(get(&d, "k0").is_some());
        let mut dropped: Vec<String> = d.evict_lru().unwrap().into_iter().map(|x| x.key).collect();
        dropped.sort();
        assert_eq!(dropped, ["k3", "k4", "k5"]);
        assert_eq!(put(&d, "k6", 6, rec), Written::Ok);
        assert_eq!(get(&d, "k6"), Some(value(6, rec)));
        assert_eq!(get(&d, "k1"), Some(value(1, rec)));
        assert!(d.usage().allocated <= 2 * MIB);
        drop(d);
        // Evicted records stay evicted across a restart.
        let (d, _) = open(dir.path(), 2 * MIB);
        assert!(d.lookup("k3").is_none());
        assert_eq!(get(&d, "k6"), Some(value(6, rec)));
    }

    #[test]
    fn an_eviction_named_first_erases_only_what_it_named_and_a_restart_keeps_it_until_then() {
        let dir = tempfile::tempdir().unwrap();
        let rec = 300_000;
        {
            let (d, _) = open(dir.path(), 2 * MIB);
            for i in 0..6 {
                assert_eq!(put(&d, &format!("k{i}"), i, rec), Written::Ok, "k{i}");
            }
            assert_eq!(put(&d, "k6", 6, rec), Written::Full);
            assert!(get(&d, "k0").is_some());
            let (b, mut named) = d.eviction_candidate().unwrap();
            named.sort_by(|x, y| x.key.cmp(&y.key));
            let keys: Vec<&str> = named.iter().map(|x| x.key.as_str()).collect();
            assert_eq!(keys, ["k3", "k4", "k5"]);
            assert_eq!(named[0].version, v(3));
            // Named, not yet evicted (the caller tells metad first): everything still reads,
            // and a kill here leaves the records for the restart.
            assert_eq!(get(&d, "k4"), Some(value(4, rec)));
            drop(d);
            let (d, _) = open(dir.path(), 2 * MIB);
            assert_eq!(
                get(&d, "k4"),
                Some(value(4, rec)),
                "not erased before evict"
            );
            let mut gone: Vec<String> = d.evict(b).unwrap().into_iter().map(|x| x.key).collect();
            gone.sort();
            assert_eq!(gone, ["k3", "k4", "k5"]);
            assert!(
                d.evict(b).unwrap().is_empty(),
                "a freed bucket is left alone"
            );
            assert_eq!(put(&d, "k6", 6, rec), Written::Ok);
            assert!(
                d.evict(b).unwrap().is_empty(),
                "a reopened bucket is left alone"
            );
            assert_eq!(get(&d, "k6"), Some(value(6, rec)));
        }
        let (d, _) = open(dir.path(), 2 * MIB);
        assert!(
            d.lookup("k3").is_none(),
            "evicted records stay evicted across a restart"
        );
        assert_eq!(get(&d, "k6"), Some(value(6, rec)));
    }

    #[test]
    fn compaction_frees_a_sparse_bucket_and_reads_find_the_moved_records() {
        let dir = tempfile::tempdir().unwrap();
        let (d, _) = open(dir.path(), 4 * MIB);
        let rec = 200_000;
        for i in 0..8 {
            assert_eq!(put(&d, &format!("k{i}"), i, rec), Written::Ok);
        }
        // Bucket 0 holds k0..k4; keep k2 only.
        for k in ["k0", "k1", "k3", "k4"] {
            assert!(d.remove(k, None));
        }
        let before = d.usage().live;
        let mut dropped = Vec::new();
        assert!(d.compact_one(&mut dropped).unwrap());
        assert!(dropped.is_empty());
        assert_eq!(d.usage().live, before);
        assert_eq!(get(&d, "k2"), Some(value(2, rec)));
        assert_eq!(d.stats.compacted.load(Ordering::Relaxed), 1);
        drop(d);
        // And after a restart, from its new place.
        let (d, _) = open(dir.path(), 4 * MIB);
        assert_eq!(get(&d, "k2"), Some(value(2, rec)));
        assert!(d.lookup("k0").is_none());
    }

    #[test]
    fn a_disk_whose_directory_disappears_is_taken_out_with_its_objects() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk");
        let (d, _) = open(&path, 8 * MIB);
        for i in 0..5 {
            assert_eq!(put(&d, &format!("k{i}"), i, 5000), Written::Ok);
        }
        d.probe().unwrap();
        std::fs::remove_dir_all(&path).unwrap();
        assert!(matches!(d.probe(), Err(Error::DiskFailed { .. })));
        assert!(d.is_failed());
        assert_eq!(d.stats.lost.load(Ordering::Relaxed), 5);
        assert!(d.lookup("k0").is_none());
        assert!(matches!(put_err(&d), Err(Error::DiskFailed { .. })));
        assert!(!d.status().healthy);
    }

    fn put_err(d: &Disk) -> Result<Vec<Written>> {
        let val = value(1, 10);
        d.write_batch(&[WriteItem {
            key: "x",
            version: v(1),
            checksum: checksum::checksum(v(1).seed(), &val),
            value: &[&val],
            relocate: false,
        }])
    }

    #[test]
    fn a_disk_in_use_is_not_opened_twice() {
        let dir = tempfile::tempdir().unwrap();
        let (d, _) = open(dir.path(), 8 * MIB);
        let spec = DiskSpec {
            path: dir.path().to_path_buf(),
            size: None,
        };
        let e = Disk::open(spec.clone(), &DiskOptions::default())
            .err()
            .unwrap();
        assert!(e.to_string().contains("in use"), "{e}");
        drop(d);
        assert!(Disk::open(spec, &DiskOptions::default()).is_ok());
    }

    #[test]
    fn bucket_files_without_a_label_are_not_formatted_over() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(bucket_file_name(0)), b"x").unwrap();
        let spec = DiskSpec {
            path: dir.path().to_path_buf(),
            size: Some(8 * MIB),
        };
        let e = Disk::open(spec, &DiskOptions::default()).err().unwrap();
        assert!(e.to_string().contains("without a label"), "{e}");
    }

    #[test]
    fn a_disk_keeps_its_identity_and_bucket_size() {
        let dir = tempfile::tempdir().unwrap();
        let id = open(dir.path(), 8 * MIB).0.disk_id().to_owned();
        let spec = DiskSpec {
            path: dir.path().to_path_buf(),
            size: Some(64 * MIB),
        };
        let (d, _) = Disk::open(
            spec,
            &DiskOptions {
                bucket_size: Some(4 * MIB),
            },
        )
        .unwrap();
        assert_eq!(d.disk_id(), id);
        assert_eq!(d.status().bucket_size, MIB);
        assert_eq!(d.usage().capacity, 64 * MIB);
    }
}
