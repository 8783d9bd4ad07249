//! `SaveSnapshot`: a consistent copy of the replicated state, for a backup (docs/metad.md
//! "Backup and recovery").
//!
//! The leader confirms it may serve a read (lease or quorum round, as every read), then writes
//! the state machine's snapshot format (segments, objects, the metadata KV, counters) under the
//! core lock into an anonymous spool file in the data directory, checksumming as it goes, and
//! releases the lock. Only then does it stream: the file header and info first (it now knows the
//! payload's length and checksum), then the payload in chunks. The lock is held for as long as
//! writing the state to a buffered local file takes, as for a Raft snapshot; the network is
//! never waited on under it. One save runs at a time per replica.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use regolith_proto::backup::{BackupInfo, PayloadWriter};
use regolith_proto::metad as pb;
use tokio::sync::mpsc;

use crate::ops::Ops;
use crate::{Error, Result};

/// Most bytes in one message of the stream.
pub const CHUNK_BYTES: usize = 1 << 20;

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}

impl Ops {
    /// Streams a snapshot file of the current state to `tx` (the last item is an error if it
    /// failed; the receiver must then discard what it got).
    pub async fn save_snapshot(self: Arc<Self>, tx: mpsc::Sender<Result<Vec<u8>>>) {
        if let Err(e) = self.save_snapshot_to(&tx).await {
            tracing::warn!(error = %e, "snapshot save failed");
            let _ = tx.send(Err(e)).await;
        }
    }

    async fn save_snapshot_to(self: &Arc<Self>, tx: &mpsc::Sender<Result<Vec<u8>>>) -> Result<()> {
        let _one = self.saving.try_lock().map_err(|_| {
            Error::Precondition("a snapshot save is already running on this replica".into())
        })?;
        self.read().await?;
        let observed = self.gate.observed();
        let info = BackupInfo {
            regolith_version: env!("CARGO_PKG_VERSION").to_string(),
            created_unix_ms: self.clock.now().wall_ms,
            term: observed.term,
            applied_index: observed.applied_index,
            leader_id: self.id,
            members: self
                .members()
                .into_iter()
                .map(|m| pb::Member {
                    id: m.id,
                    addr: m.addr,
                    voter: m.voter,
                })
                .collect(),
            state_format: crate::state::SNAPSHOT_VERSION,
            ..Default::default()
        };
        let ops = self.clone();
        let (head, mut payload, info) = tokio::task::spawn_blocking(move || ops.spool(info))
            .await
            .map_err(|e| Error::Internal(format!("snapshot spool task: {e}")))??;
        tracing::info!(
            term = info.term,
            applied_index = info.applied_index,
            keys = info.keys,
            meta_keys = info.meta_keys,
            "snapshot save: state spooled, streaming"
        );
        send(tx, head).await?;
        loop {
            let (chunk, file) = tokio::task::spawn_blocking(move || {
                let mut buf = vec![0u8; CHUNK_BYTES];
                let mut n = 0;
                while n < buf.len() {
                    match payload.read(&mut buf[n..]) {
                        Ok(0) => break,
                        Ok(k) => n += k,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e),
                    }
                }
                buf.truncate(n);
                Ok((buf, payload))
            })
            .await
            .map_err(|e| Error::Internal(format!("snapshot read task: {e}")))?
            .map_err(io("snapshot spool file (read)"))?;
            payload = file;
            if chunk.is_empty() {
                return Ok(());
            }
            send(tx, chunk).await?;
        }
    }

    /// Writes the state into an anonymous spool file; returns the file's head (header and
    /// info), the payload rewound, and the info as written.
    fn spool(&self, mut info: BackupInfo) -> Result<(Vec<u8>, File, BackupInfo)> {
        let file = anonymous_file(&self.spool_dir)?;
        let view = crate::core::snapshot_view_with(&self.core, |sm| {
            info.keys = sm.key_count() as u64;
            info.segments = sm.segments().count() as u64;
            info.meta_keys = sm.meta_usage().0 as u64;
            // The state holds at least every entry up to these (applies take this lock).
            info.applied_index = info.applied_index.max(*self.applied.borrow());
        });
        // Written without the lock: requests and applies go on meanwhile.
        let mut w = PayloadWriter::new(&info, BufWriter::with_capacity(1 << 20, file));
        view.write_to(&mut w)
            .map_err(io("snapshot spool file (write)"))?;
        let (buf, head) = w.finish().map_err(|e| Error::Internal(e.to_string()))?;
        let mut file = buf.into_inner().map_err(|e| Error::Io {
            what: "snapshot spool file (flush)".into(),
            source: e.into_error(),
        })?;
        file.seek(SeekFrom::Start(0))
            .map_err(io("snapshot spool file (rewind)"))?;
        Ok((head, file, info))
    }
}

/// A file in `dir` that no name points to: it vanishes with its last handle, so a crash leaves
/// nothing behind.
fn anonymous_file(dir: &Path) -> Result<File> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let path: PathBuf = dir.join(format!(
        "save-snapshot-{}-{nanos:x}.tmp",
        std::process::id()
    ));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(io(format!("snapshot spool file {}", path.display())))?;
    std::fs::remove_file(&path).map_err(io(format!("unlink spool file {}", path.display())))?;
    Ok(file)
}

async fn send(tx: &mpsc::Sender<Result<Vec<u8>>>, chunk: Vec<u8>) -> Result<()> {
    tx.send(Ok(chunk))
        .await
        .map_err(|_| Error::Unavailable("the snapshot reader went away".into()))
}
