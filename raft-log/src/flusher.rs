//! Group commit: one thread that turns many "tell me when this is durable" requests into one
//! fsync.
//!
//! Writers put their data into sled first (so it is readable at once), then hand a [`Waiter`] to
//! the flusher. The flusher blocks for the first waiter, takes every other waiter already queued,
//! calls `Db::flush` once (sled's flush writes and fsyncs everything written before it), and then
//! completes all of them. While one fsync (~4 ms on the target machines) is running, the next
//! appends queue up behind it, so under load the number of fsyncs tracks the disk's speed rather
//! than the number of appends.
//!
//! It is a plain `std` thread rather than a tokio task so that it does not depend on the runtime
//! the store happens to be used from (openraft's test suite makes a fresh runtime per test), and so
//! that a 4 ms fsync never occupies a runtime worker.
//!
//! Caveat, openraft 0.9.25: `RaftCore::append_to_log` awaits each append's callback before it
//! handles the next message, so openraft itself never has two appends in flight, and on a leader
//! every client write that becomes its own entry costs one fsync. Throughput then comes from
//! putting many commands into one entry (the application batches proposals); followers get many
//! entries per AppendEntries, hence per append, anyway. The grouping here pays off for concurrent
//! callers of the store (several clones appending, a vote save racing an append) and with
//! openraft versions that pipeline log I/O.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::stats::StorageStats;

/// Completion callback run on the flusher thread once the flush that covers it has finished.
pub(crate) type Waiter = Box<dyn FnOnce(io::Result<()>) + Send>;

/// While alive, the flusher thread waits (see [`Flusher::pause`]).
pub struct FlusherPause {
    _release: mpsc::Sender<()>,
}

/// Handle to the flusher thread. Dropping it stops the thread after it has completed every
/// queued waiter, and waits for it (so the thread's `Db` handle is released on return).
pub(crate) struct Flusher {
    tx: Option<mpsc::Sender<Waiter>>,
    thread: Option<JoinHandle<()>>,
    path: PathBuf,
}

impl Flusher {
    /// Starts the flusher thread for `db` (stored at `path`, used in messages).
    pub(crate) fn start(db: sled::Db, path: &Path, stats: Arc<StorageStats>) -> Result<Self> {
        let (tx, rx) = mpsc::channel::<Waiter>();
        let thread_path = path.to_path_buf();
        let thread = std::thread::Builder::new()
            .name("raft-log-flush".into())
            .spawn(move || flush_loop(&db, &thread_path, &rx, &stats))
            .map_err(|e| Error::io("start the log flusher thread for", path, e))?;
        Ok(Self {
            tx: Some(tx),
            thread: Some(thread),
            path: path.to_path_buf(),
        })
    }

    /// Queues `waiter` to be completed by the next flush. Never blocks.
    pub(crate) fn enqueue(&self, waiter: Waiter) -> Result<()> {
        let sent = match &self.tx {
            Some(tx) => tx.send(waiter).map_err(|e| e.0),
            None => Err(waiter),
        };
        sent.map_err(|waiter| {
            // Tell the waiter too, so that nobody waits forever on a callback that will never run.
            waiter(Err(io::Error::other("log flusher thread has stopped")));
            self.stopped()
        })
    }

    /// Waits until everything written to sled so far is durable, sharing the fsync with any
    /// concurrent appends.
    pub(crate) async fn flush(&self) -> Result<()> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.enqueue(Box::new(move |res| {
            // The receiver is gone only if the caller's future was dropped: nothing to report to.
            let _ = tx.send(res);
        }))?;
        match rx.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(Error::io("flush (fsync) the log store", &self.path, e)),
            Err(_) => Err(self.stopped()),
        }
    }

    /// Holds the flusher thread until the returned pause is dropped: returns once the thread
    /// is inside the pause, so every waiter queued meanwhile goes into the one flush that
    /// follows. A hook for tests that check group commit without depending on timing.
    pub(crate) async fn pause(&self) -> Result<FlusherPause> {
        let (entered_tx, entered_rx) = tokio::sync::oneshot::channel();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        self.enqueue(Box::new(move |_| {
            let _ = entered_tx.send(());
            // Returns when the pause, and the sender in it, is dropped.
            let _ = release_rx.recv();
        }))?;
        entered_rx.await.map_err(|_| self.stopped())?;
        Ok(FlusherPause {
            _release: release_tx,
        })
    }

    fn stopped(&self) -> Error {
        Error::FlusherStopped {
            path: self.path.clone(),
        }
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        // Closing the channel ends the loop once the queue is drained.
        drop(self.tx.take());
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!(path = %self.path.display(), "log flusher thread panicked");
            }
        }
    }
}

fn flush_loop(db: &sled::Db, path: &Path, rx: &mpsc::Receiver<Waiter>, stats: &StorageStats) {
    while let Ok(first) = rx.recv() {
        let mut waiters = vec![first];
        waiters.extend(rx.try_iter());

        let started = Instant::now();
        let res = db.flush();
        stats.record_flush(started.elapsed(), res.is_ok(), waiters.len() as u64);

        match res {
            Ok(_) => waiters.into_iter().for_each(|w| w(Ok(()))),
            Err(e) => {
                tracing::error!(path = %path.display(), error = %e, "sled flush failed");
                let msg = format!("sled flush of {} failed: {e}", path.display());
                for w in waiters {
                    w(Err(io::Error::other(msg.clone())));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn many_waiters_share_few_flushes() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::Config::new()
            .path(dir.path().join("db"))
            .open()
            .unwrap();
        let stats = Arc::new(StorageStats::default());
        let flusher = Flusher::start(db.clone(), dir.path(), stats.clone()).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let pause = rt.block_on(flusher.pause()).unwrap();
        let before = stats.fsyncs();

        let done = Arc::new(AtomicUsize::new(0));
        for i in 0u32..200 {
            db.insert(i.to_be_bytes(), vec![0u8; 64]).unwrap();
            let done = done.clone();
            flusher
                .enqueue(Box::new(move |r| {
                    r.unwrap();
                    done.fetch_add(1, Ordering::SeqCst);
                }))
                .unwrap();
        }
        assert_eq!(
            done.load(Ordering::SeqCst),
            0,
            "completed while the flusher was held"
        );
        drop(pause);
        drop(flusher); // drains the queue and joins the thread

        assert_eq!(done.load(Ordering::SeqCst), 200);
        assert_eq!(stats.durable_callbacks(), 201, "200 waiters and the pause");
        assert_eq!(
            stats.fsyncs() - before,
            1,
            "the 200 queued waiters share one flush"
        );
    }
}
