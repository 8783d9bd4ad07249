//! [`SledStateMachine`]: openraft's `RaftStateMachine` around the application's
//! [`StateMachineCore`], persisted through file-backed snapshots.
//!
//! The state itself lives in memory, inside `S`. It survives a restart as the newest snapshot
//! (see [`crate::snapshot`] for the files) plus the committed log entries after it, which openraft
//! re-applies on start because the log store persists the commit index.
//!
//! `S`, `last_applied` and the last membership sit under one lock, so that a snapshot captures a
//! consistent triple. Applying entries takes that lock; a snapshot takes it only to get the
//! triple and `S::snapshot_view` (a view cheap to take), and writes the view, fsyncs and renames
//! after releasing it, so applies go on while a snapshot of millions of objects is written
//! (issue 17: a build that held the lock for seconds blocked the runtime thread that applies,
//! and with it the replica's heartbeats). Builds and installs run on a thread of their own at
//! [`SNAPSHOT_NICE`]. The application reads its state through its own handle inside `S`, and
//! reads `last_applied` through [`AppliedHandle`], neither of which waits for this lock.

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::storage::RaftStateMachine;
use openraft::{
    BasicNode, EntryPayload, ErrorSubject, ErrorVerb, LogId, OptionalSend, RaftSnapshotBuilder,
    Snapshot, SnapshotMeta, StorageError, StoredMembership,
};
use parking_lot::Mutex;
use tokio::io::AsyncWriteExt;
use tokio::sync::watch;

use crate::core::StateMachineCore;
use crate::error::{Error, Result};
use crate::snapshot::{self, FoundSnapshot, Meta, SnapshotDir, SnapshotHeader, SnapshotWriter};
use crate::stats::StorageStats;

type Response<S> = <<S as StateMachineCore>::C as openraft::RaftTypeConfig>::R;

/// openraft state machine storage for an application state machine `S`.
pub struct SledStateMachine<S: StateMachineCore> {
    shared: Arc<Shared<S>>,
}

/// Builds a snapshot of a [`SledStateMachine`]; returned by `get_snapshot_builder`.
pub struct SledSnapshotBuilder<S: StateMachineCore> {
    shared: Arc<Shared<S>>,
}

/// A cheap, cloneable view of the state machine's `last_applied`, for the application.
#[derive(Debug, Clone)]
pub struct AppliedHandle {
    rx: watch::Receiver<Option<LogId<u64>>>,
}

impl AppliedHandle {
    /// The id of the last entry applied (or covered by the installed snapshot).
    pub fn last_applied(&self) -> Option<LogId<u64>> {
        *self.rx.borrow()
    }

    /// Waits until an entry with index `index` or greater has been applied, and returns the
    /// last applied id then. `None` if the state machine was dropped first.
    pub async fn wait_applied(&self, index: u64) -> Option<LogId<u64>> {
        let mut rx = self.rx.clone();
        let reached = rx
            .wait_for(|applied| applied.is_some_and(|l| l.index >= index))
            .await
            .ok()?;
        *reached
    }
}

struct Shared<S: StateMachineCore> {
    state: Mutex<Applied<S>>,
    /// The current snapshot. Its own lock: handing out the file must not wait for applies.
    current: Mutex<Option<CurrentSnapshot>>,
    /// Temp files handed out by `begin_receiving_snapshot` and not yet installed.
    receiving: Mutex<Vec<Receiving>>,
    snapshots: SnapshotDir,
    applied_tx: watch::Sender<Option<LogId<u64>>>,
    stats: Arc<StorageStats>,
}

struct Applied<S> {
    core: S,
    last_applied: Option<LogId<u64>>,
    membership: StoredMembership<u64, BasicNode>,
}

struct CurrentSnapshot {
    path: PathBuf,
    meta: Meta,
}

struct Receiving {
    path: PathBuf,
    id: Option<FileId>,
}

/// Identity of an open file, to recognise our own temp file when openraft hands it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileId {
    dev: u64,
    ino: u64,
}

#[cfg(unix)]
fn file_id(file: &File) -> Option<FileId> {
    use std::os::unix::fs::MetadataExt;
    let md = file.metadata().ok()?;
    Some(FileId {
        dev: md.dev(),
        ino: md.ino(),
    })
}

#[cfg(not(unix))]
fn file_id(_file: &File) -> Option<FileId> {
    None
}

impl<S: StateMachineCore> SledStateMachine<S> {
    /// Opens the state machine whose snapshots live in `<dir>/snapshots`, restoring `s` from the
    /// newest valid snapshot if there is one. Temp files are removed and corrupt snapshots set
    /// aside (both with a warning); a snapshot in an unknown format version is an error.
    pub fn open(dir: &Path, s: S) -> Result<Self> {
        Self::open_with_stats(dir, s, Arc::default())
    }

    /// Like [`SledStateMachine::open`], counting into `stats` (shared with the log store by
    /// [`crate::open`]).
    pub fn open_with_stats(dir: &Path, s: S, stats: Arc<StorageStats>) -> Result<Self> {
        let snapshots = SnapshotDir::open(dir)?;
        let mut state = Applied {
            core: s,
            last_applied: None,
            membership: StoredMembership::default(),
        };
        let current = match snapshots.recover()? {
            Some(found) => Some(restore_at_open(&mut state, found, &stats)?),
            None => None,
        };
        let (applied_tx, _) = watch::channel(state.last_applied);
        Ok(Self {
            shared: Arc::new(Shared {
                state: Mutex::new(state),
                current: Mutex::new(current),
                receiving: Mutex::new(Vec::new()),
                snapshots,
                applied_tx,
                stats,
            }),
        })
    }

    /// The id of the last entry applied.
    pub fn last_applied(&self) -> Option<LogId<u64>> {
        *self.shared.applied_tx.borrow()
    }

    /// A handle the application keeps to read `last_applied` after handing this state machine
    /// to openraft.
    pub fn applied_handle(&self) -> AppliedHandle {
        AppliedHandle {
            rx: self.shared.applied_tx.subscribe(),
        }
    }

    /// Metadata of the current snapshot, if there is one.
    pub fn current_snapshot_meta(&self) -> Option<SnapshotMeta<u64, BasicNode>> {
        self.shared.current.lock().as_ref().map(|c| c.meta.clone())
    }

    /// The directory holding the snapshot files.
    pub fn snapshot_dir(&self) -> &Path {
        self.shared.snapshots.path()
    }

    /// The counters.
    pub fn stats(&self) -> Arc<StorageStats> {
        self.shared.stats.clone()
    }
}

fn restore_at_open<S: StateMachineCore>(
    state: &mut Applied<S>,
    found: FoundSnapshot,
    stats: &StorageStats,
) -> Result<CurrentSnapshot> {
    restore(state, &found.path, &found.header)?;
    stats.set_last_snapshot_bytes(found.header.file_len());
    tracing::info!(
        path = %found.path.display(),
        snapshot = %found.header.meta,
        "state machine restored from snapshot"
    );
    Ok(CurrentSnapshot {
        path: found.path,
        meta: found.header.meta,
    })
}

/// Replaces the state with the validated snapshot at `path`.
fn restore<S: StateMachineCore>(
    state: &mut Applied<S>,
    path: &Path,
    header: &SnapshotHeader,
) -> Result<()> {
    let mut payload = snapshot::payload_reader(path, header)?;
    state
        .core
        .install_snapshot(&mut payload)
        .map_err(|source| Error::StateMachine {
            op: "restore from",
            path: path.to_path_buf(),
            source,
        })?;
    state.last_applied = header.meta.last_log_id;
    state.membership = header.meta.last_membership.clone();
    Ok(())
}

impl<S: StateMachineCore> Shared<S> {
    fn apply_entries(
        &self,
        entries: impl IntoIterator<Item = openraft::Entry<S::C>>,
    ) -> Vec<Response<S>> {
        let mut state = self.state.lock();
        let mut responses = Vec::new();
        for entry in entries {
            state.last_applied = Some(entry.log_id);
            let response = match entry.payload {
                EntryPayload::Normal(data) => state.core.apply(&entry.log_id, &data),
                EntryPayload::Blank => state.core.empty_response(),
                EntryPayload::Membership(membership) => {
                    state.membership = StoredMembership::new(Some(entry.log_id), membership);
                    state.core.empty_response()
                }
            };
            responses.push(response);
        }
        let last_applied = state.last_applied;
        drop(state);
        self.applied_tx.send_replace(last_applied);
        responses
    }

    /// Writes, fsyncs and publishes a snapshot of the current state; returns its meta and path.
    fn build_snapshot(&self) -> Result<(Meta, PathBuf)> {
        let temp = self.snapshots.temp_path("build");
        let built = self.write_snapshot_file(&temp);
        let (meta, len) = match built {
            Ok(done) => done,
            Err(e) => {
                discard(&temp);
                return Err(e);
            }
        };
        let path = self
            .snapshots
            .publish(&temp, &meta)
            .inspect_err(|_| discard(&temp))?;
        self.stats.record_snapshot_build(len);
        tracing::info!(path = %path.display(), snapshot = %meta, bytes = len, "snapshot built");
        Ok((meta, path))
    }

    /// Takes a view of the state under the state lock (short: the application's view is
    /// cheap to take), then writes it into `temp` and fsyncs outside the lock, while entries go
    /// on being applied.
    fn write_snapshot_file(&self, temp: &Path) -> Result<(Meta, u64)> {
        let (meta, view) = {
            let state = self.state.lock();
            let meta = Meta {
                last_log_id: state.last_applied,
                last_membership: state.membership.clone(),
                snapshot_id: snapshot::new_snapshot_id(state.last_applied.as_ref()),
            };
            (meta, state.core.snapshot_view())
        };
        let mut writer = SnapshotWriter::create(temp, &meta)?;
        view.write(&mut writer)
            .map_err(|source| Error::StateMachine {
                op: "write",
                path: temp.to_path_buf(),
                source,
            })?;
        let len = writer.finish()?;
        Ok((meta, len))
    }

    /// Makes a freshly built snapshot current, unless a newer one was installed meanwhile.
    fn make_built_current(&self, meta: &Meta, path: &Path) {
        let mut current = self.current.lock();
        let superseded = current
            .as_ref()
            .is_some_and(|c| c.meta.last_log_id > meta.last_log_id);
        if superseded {
            // A snapshot from the leader was installed while this one was being written.
            tracing::info!(path = %path.display(), "discarding snapshot superseded by an install");
            discard(path);
            return;
        }
        *current = Some(CurrentSnapshot {
            path: path.to_path_buf(),
            meta: meta.clone(),
        });
        self.snapshots.remove_others(path);
    }

    /// Creates a temp file for a snapshot streamed from the leader.
    fn begin_receiving(&self) -> Result<File> {
        let path = self.snapshots.temp_path("recv");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| Error::io("create snapshot receive file", &path, e))?;
        let id = file_id(&file);
        // openraft receives one snapshot at a time: starting a new one abandons any earlier,
        // unfinished one. (Should it be installed after all, it is copied from its open handle.)
        let abandoned =
            std::mem::replace(&mut *self.receiving.lock(), vec![Receiving { path, id }]);
        for old in abandoned {
            discard(&old.path);
        }
        Ok(file)
    }

    /// Installs the snapshot in `file` (normally the one from `begin_receiving`): validates it,
    /// restores the state from it, and makes it the current snapshot.
    fn install(&self, meta: &Meta, file: File) -> Result<()> {
        let temp = self.take_received(file)?;
        let installed = self.install_from(meta, &temp);
        if installed.is_err() {
            discard(&temp);
        }
        // Whatever else was being received is abandoned now (openraft receives one snapshot at a
        // time; a handle swapped for another file, as openraft's test suite does, leaves one).
        for other in std::mem::take(&mut *self.receiving.lock()) {
            discard(&other.path);
        }
        installed
    }

    /// Returns the path of an fsynced temp file holding the received snapshot: the file itself
    /// when it is one we handed out, else a copy of its content.
    fn take_received(&self, mut file: File) -> Result<PathBuf> {
        let id = file_id(&file);
        let ours = {
            let mut receiving = self.receiving.lock();
            let pos = receiving.iter().position(|r| id.is_some() && r.id == id);
            pos.map(|i| receiving.swap_remove(i).path)
        };
        if let Some(path) = ours {
            file.sync_all()
                .map_err(|e| Error::io("fsync received snapshot", &path, e))?;
            return Ok(path);
        }
        let temp = self.snapshots.temp_path("recv");
        copy_to_new_file(&mut file, &temp).inspect_err(|_| discard(&temp))?;
        Ok(temp)
    }

    fn install_from(&self, meta: &Meta, temp: &Path) -> Result<()> {
        let header = snapshot::validate(temp)?;
        if header.meta != *meta {
            return Err(Error::SnapshotMetaMismatch {
                path: temp.to_path_buf(),
                expected: meta.to_string(),
                found: header.meta.to_string(),
            });
        }
        // Restore before publishing, so that a snapshot the application cannot read never
        // becomes the current one on disk.
        {
            let mut state = self.state.lock();
            restore(&mut state, temp, &header)?;
            self.applied_tx.send_replace(state.last_applied);
        }
        let path = self.snapshots.publish(temp, meta)?;
        *self.current.lock() = Some(CurrentSnapshot {
            path: path.clone(),
            meta: meta.clone(),
        });
        self.snapshots.remove_others(&path);
        self.stats.record_snapshot_install(header.file_len());
        tracing::info!(path = %path.display(), snapshot = %meta, "snapshot installed");
        Ok(())
    }

    fn open_current(&self) -> Result<Option<(Meta, File)>> {
        // Opened under the lock, so that the file cannot be replaced between reading its path
        // and opening it. Once open, a later replacement does not disturb a reader.
        let current = self.current.lock();
        let Some(c) = current.as_ref() else {
            return Ok(None);
        };
        let file = File::open(&c.path).map_err(|e| Error::io("open snapshot file", &c.path, e))?;
        Ok(Some((c.meta.clone(), file)))
    }
}

fn copy_to_new_file(from: &mut File, to: &Path) -> Result<()> {
    from.seek(SeekFrom::Start(0))
        .map_err(|e| Error::io("rewind received snapshot for copy to", to, e))?;
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(to)
        .map_err(|e| Error::io("create snapshot file", to, e))?;
    let mut out = BufWriter::new(file);
    io::copy(from, &mut out).map_err(|e| Error::io("copy received snapshot to", to, e))?;
    let file = out
        .into_inner()
        .map_err(|e| Error::io("write snapshot file", to, e.into_error()))?;
    file.sync_all()
        .map_err(|e| Error::io("fsync snapshot file", to, e))
}

/// Removes a temp or superseded file; a failure is only logged (it is cleaned up on next open).
fn discard(path: &Path) {
    if let Err(e) = std::fs::remove_file(path) {
        if e.kind() != io::ErrorKind::NotFound {
            tracing::warn!(path = %path.display(), error = %e, "cannot remove snapshot file");
        }
    }
}

/// Runs blocking file work off the async runtime's workers.
async fn blocking<T, F>(shared: &Arc<Shared<impl StateMachineCore>>, f: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T> + Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::TaskFailed {
            path: shared.snapshots.path().to_path_buf(),
            reason: e.to_string(),
        })?
}

/// The nice value of the threads that build and install snapshots: serialising or reading
/// millions of objects takes seconds of CPU, and on a busy machine it must yield to the Raft
/// core, the network and the applies (at 10 a thread gets about a tenth of a contended core), or
/// heartbeats go late and followers call elections (issue 17).
pub const SNAPSHOT_NICE: i32 = 10;

/// Runs snapshot work on a thread of its own at [`SNAPSHOT_NICE`].
async fn background<T, F>(shared: &Arc<Shared<impl StateMachineCore>>, f: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T> + Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("raft-snapshot".into())
        .spawn(move || {
            lower_priority(SNAPSHOT_NICE);
            let _ = tx.send(f());
        });
    let path = shared.snapshots.path().to_path_buf();
    if let Err(e) = spawned {
        return Err(Error::io("start a snapshot thread for", &path, e));
    }
    rx.await.map_err(|e| Error::TaskFailed {
        path,
        reason: e.to_string(),
    })?
}

/// Lowers the calling thread's CPU priority (Linux: a thread's nice value is its own). A
/// failure only costs priority, so it is logged, not returned.
pub(crate) fn lower_priority(nice: i32) {
    // SAFETY: gettid and setpriority take plain integers and touch no memory of ours.
    let rc = unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, nice)
    };
    if rc != 0 {
        tracing::debug!(error = %io::Error::last_os_error(), "could not lower the snapshot thread's priority");
    }
}

fn snapshot_error(meta: Option<&Meta>, verb: ErrorVerb) -> impl FnOnce(Error) -> StorageError<u64> {
    let signature = meta.map(|m| m.signature());
    move |e| e.into_storage(ErrorSubject::Snapshot(signature), verb)
}

impl<S: StateMachineCore> RaftSnapshotBuilder<S::C> for SledSnapshotBuilder<S> {
    async fn build_snapshot(&mut self) -> Result<Snapshot<S::C>, StorageError<u64>> {
        let shared = self.shared.clone();
        let task = shared.clone();
        let (meta, file) = background(&shared, move || {
            let (meta, path) = task.build_snapshot()?;
            // Open before it can be superseded and removed: the caller gets what it asked for.
            let file = File::open(&path).map_err(|e| Error::io("open snapshot file", &path, e))?;
            task.make_built_current(&meta, &path);
            Ok((meta, file))
        })
        .await
        .map_err(snapshot_error(None, ErrorVerb::Write))?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(tokio::fs::File::from_std(file)),
        })
    }
}

impl<S: StateMachineCore> RaftStateMachine<S::C> for SledStateMachine<S> {
    type SnapshotBuilder = SledSnapshotBuilder<S>;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<u64>>, StoredMembership<u64, BasicNode>), StorageError<u64>> {
        let state = self.shared.state.lock();
        Ok((state.last_applied, state.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Response<S>>, StorageError<u64>>
    where
        I: IntoIterator<Item = openraft::Entry<S::C>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        Ok(self.shared.apply_entries(entries))
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SledSnapshotBuilder {
            shared: self.shared.clone(),
        }
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<tokio::fs::File>, StorageError<u64>> {
        let shared = self.shared.clone();
        let file = blocking(&self.shared, move || shared.begin_receiving())
            .await
            .map_err(snapshot_error(None, ErrorVerb::Write))?;
        Ok(Box::new(tokio::fs::File::from_std(file)))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, BasicNode>,
        snapshot: Box<tokio::fs::File>,
    ) -> Result<(), StorageError<u64>> {
        let mut file = *snapshot;
        // Complete the writes openraft (or the application) made through the async handle.
        file.flush().await.map_err(|e| {
            let e = Error::io("flush received snapshot", self.snapshot_dir(), e);
            snapshot_error(Some(meta), ErrorVerb::Write)(e)
        })?;
        let file = file.into_std().await;
        let shared = self.shared.clone();
        let task_meta = meta.clone();
        background(&self.shared, move || shared.install(&task_meta, file))
            .await
            .map_err(snapshot_error(Some(meta), ErrorVerb::Write))
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<S::C>>, StorageError<u64>> {
        let current = self
            .shared
            .open_current()
            .map_err(snapshot_error(None, ErrorVerb::Read))?;
        Ok(current.map(|(meta, file)| Snapshot {
            meta,
            snapshot: Box::new(tokio::fs::File::from_std(file)),
        }))
    }
}
