//! Group commit: concurrent proposals are coalesced into one Raft entry (one fsync, one
//! AppendEntries), bounded by count and bytes. openraft keeps one AppendEntries in flight per
//! follower, so batching here is what turns many writers into throughput.

use std::sync::Arc;
use std::time::Instant;

use regolith_proto::auth::unix_ms;
use tokio::sync::{mpsc, oneshot, watch, Semaphore};

use crate::command::{Batch, Command, Outcome};
use crate::config::MAX_BATCH_COMMANDS;
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::raft_types::Raft;

struct Pending {
    cmd: Command,
    bytes: usize,
    /// The deadline of the request that proposed it ([`crate::deadline`]).
    deadline: Option<u64>,
    reply: oneshot::Sender<Result<Outcome>>,
}

impl Pending {
    /// A command of a request whose client gave up on it is answered, not proposed.
    fn refuse_if_late(self, now_ms: u64, metrics: &Metrics) -> Option<Self> {
        match crate::deadline::check_at(self.deadline, now_ms) {
            Ok(()) => Some(self),
            Err(e) => {
                metrics.requests_past_deadline.inc();
                let _ = self.reply.send(Err(e));
                None
            }
        }
    }
}

#[derive(Clone)]
pub struct Proposer {
    tx: mpsc::Sender<Pending>,
    held: Arc<watch::Sender<bool>>,
}

/// Writes wait (queued, not refused) while one of these lives: a leader handing its office over
/// lets the target catch up with a log that no longer grows. Dropping it lets them go on (to
/// Raft, which answers "forward to the leader" once this replica no longer leads).
pub struct Hold {
    held: Arc<watch::Sender<bool>>,
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.held.send_replace(false);
    }
}

impl Proposer {
    /// Starts the batching task. `max_entry_bytes` caps one entry (AppendEntries carry whole
    /// entries, so this bounds Raft messages); `in_flight` entries may be replicating at once.
    pub fn start(
        raft: Raft,
        metrics: Arc<Metrics>,
        max_entry_bytes: usize,
        in_flight: usize,
    ) -> Self {
        let (tx, rx) = mpsc::channel(65_536);
        let held = Arc::new(watch::channel(false).0);
        tokio::spawn(run(
            raft,
            rx,
            metrics,
            max_entry_bytes,
            in_flight,
            held.subscribe(),
        ));
        Self { tx, held }
    }

    /// Holds every write not yet handed to Raft until the [`Hold`] is dropped.
    pub fn hold(&self) -> Hold {
        self.held.send_replace(true);
        Hold {
            held: self.held.clone(),
        }
    }

    /// Replicates one command and returns its outcome once applied on this node.
    pub async fn propose(&self, cmd: Command) -> Result<Outcome> {
        let bytes = bincode::serialized_size(&cmd).unwrap_or(0) as usize;
        let deadline = crate::deadline::current();
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Pending {
                cmd,
                bytes,
                deadline,
                reply,
            })
            .await
            .map_err(|_| Error::Raft("proposer stopped (shutting down)".into()))?;
        rx.await
            .map_err(|_| Error::Raft("proposal dropped (shutting down)".into()))?
    }

    /// Replicates several commands (usually landing in one entry); outcomes in order.
    pub async fn propose_all(&self, cmds: Vec<Command>) -> Vec<Result<Outcome>> {
        let deadline = crate::deadline::current();
        let mut rxs = Vec::with_capacity(cmds.len());
        for cmd in cmds {
            let bytes = bincode::serialized_size(&cmd).unwrap_or(0) as usize;
            let (reply, rx) = oneshot::channel();
            let p = Pending {
                cmd,
                bytes,
                deadline,
                reply,
            };
            if self.tx.send(p).await.is_err() {
                break;
            }
            rxs.push(rx);
        }
        let mut out = Vec::with_capacity(rxs.len());
        for rx in rxs {
            out.push(
                rx.await.unwrap_or_else(|_| {
                    Err(Error::Raft("proposal dropped (shutting down)".into()))
                }),
            );
        }
        out
    }
}

async fn run(
    raft: Raft,
    mut rx: mpsc::Receiver<Pending>,
    metrics: Arc<Metrics>,
    max_bytes: usize,
    in_flight: usize,
    held: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(in_flight.max(1)));
    while let Some(first) = rx.recv().await {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        // Gather everything queued while waiting for a slot.
        let mut batch = vec![first];
        let mut bytes = batch[0].bytes;
        while batch.len() < MAX_BATCH_COMMANDS && bytes < max_bytes {
            match rx.try_recv() {
                Ok(p) => {
                    bytes += p.bytes;
                    batch.push(p);
                }
                Err(_) => break,
            }
        }
        let raft = raft.clone();
        let metrics = metrics.clone();
        let mut held = held.clone();
        tokio::spawn(async move {
            // An error means the proposer is gone, and with it any hold.
            let _ = held.wait_for(|h| !*h).await;
            // Checked last thing before Raft: a batch may have waited for a slot or a hold.
            let now = unix_ms();
            let batch: Vec<Pending> = batch
                .into_iter()
                .filter_map(|p| p.refuse_if_late(now, &metrics))
                .collect();
            if batch.is_empty() {
                return;
            }
            let (cmds, replies): (Vec<Command>, Vec<_>) =
                batch.into_iter().map(|p| (p.cmd, p.reply)).unzip();
            let n = cmds.len();
            let start = Instant::now();
            let res = raft.client_write(Batch(cmds)).await;
            metrics
                .commit_latency
                .observe(start.elapsed().as_secs_f64());
            metrics.entry_commands.observe(n as f64);
            drop(permit);
            match res {
                Ok(resp) => {
                    let mut outs = resp.data.0.into_iter();
                    for r in replies {
                        let _ = r
                            .send(outs.next().ok_or_else(|| {
                                Error::Raft("entry answered fewer outcomes".into())
                            }));
                    }
                }
                Err(e) => {
                    let err = raft_write_error(&e);
                    for r in replies {
                        let _ = r.send(Err(clone_err(&err)));
                    }
                }
            }
        });
    }
}

fn raft_write_error(
    e: &openraft::error::RaftError<
        u64,
        openraft::error::ClientWriteError<u64, openraft::BasicNode>,
    >,
) -> Error {
    use openraft::error::{ClientWriteError, RaftError};
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => Error::NotLeader {
            leader: f
                .leader_id
                .zip(f.leader_node.as_ref().map(|n| n.addr.clone())),
        },
        other => Error::Raft(other.to_string()),
    }
}

fn clone_err(e: &Error) -> Error {
    match e {
        Error::NotLeader { leader } => Error::NotLeader {
            leader: leader.clone(),
        },
        other => Error::Raft(other.to_string()),
    }
}
