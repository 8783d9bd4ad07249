//! The operations of a metad replica, free of any transport: what the gRPC service
//! (`grpc/`) and the HTTP endpoints (`http.rs`) both call. They take and return
//! domain types and answer errors as the crate's [`Error`]; each edge maps those to its own
//! codes (gRPC `Status`, HTTP status).
//!
//! One file per family, as mini-redis keeps one file per command:
//! * [`put`] — reserve (with one eviction round on no space), commit (batched into one
//!   proposal round, with the rule for a failed replication), abort.
//! * [`get`] — placements with read leases, existence, the key listing.
//! * [`remove`] — remove keys, remove all.
//! * [`meta`] — the metadata KV: get, put, delete.
//! * [`segments`] — mount, unmount, heartbeat, drain, list segments.
//! * [`members`] — Raft membership changes.
//! * [`backup`] — `SaveSnapshot`: the state spooled under the lock, then streamed.
//! * [`watch`] — the stream of the object index to sidecars: a snapshot, then the changes
//!   of every applied entry.
//! * [`stats`] — the snapshot of the store and of Raft that `Stats`, `/status`, `/metrics` and
//!   the summary log all show.
//!
//! This module holds [`Ops`], the handles an operation needs, and the checks they share: the
//! leader and read gates and the key limits.

pub mod backup;
pub mod disk;
pub mod get;
pub mod members;
pub mod meta;
pub mod put;
pub mod remove;
pub mod segments;
pub mod stats;
pub mod watch;

use std::collections::BTreeSet;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::clock::Clock;
use crate::command::{Command, Outcome};
use crate::config::{CacheConfig, MAX_BATCH_KEYS};
use crate::core::Core;
use crate::error::{Error, Result};
use crate::gate::{Gate, NotServing, Observed, ReadPath};
use crate::metrics::Metrics;
use crate::proposer::Proposer;
use crate::raft_types::Raft;

/// The parts of a running replica that operations work on. Built once by
/// `Node::start`; cheap handles, shared by every call.
pub struct Ops {
    /// This replica's Raft id (also the `leader_id` a reservation names).
    pub id: u64,
    /// The cache knobs (key limits among them).
    pub cache: CacheConfig,
    pub raft: Raft,
    pub core: Arc<Mutex<Core>>,
    pub proposer: Proposer,
    pub gate: Gate,
    pub metrics: Arc<Metrics>,
    pub clock: Clock,
    /// The last applied index (the state machine sends it after every entry).
    pub applied: tokio::sync::watch::Receiver<u64>,
    /// `--max-entry-bytes`: large batches are split below it.
    pub max_entry_bytes: usize,
    /// Where `SaveSnapshot` spools the state (the data directory; the file is unlinked at once).
    pub spool_dir: std::path::PathBuf,
    /// Held while a `SaveSnapshot` runs: one at a time.
    pub saving: tokio::sync::Mutex<()>,
    /// Reaches the other replicas' `Raft` service (a leadership hand-over's `TimeoutNow`).
    pub peers: crate::transfer::Dialer,
    /// How long after its election a leader's vote stays leased (openraft's
    /// `election_timeout_max`): a hand-over waits it out.
    pub vote_lease: std::time::Duration,
    /// Held by the leadership hand-over under way ([`crate::transfer`]).
    pub transferring: tokio::sync::Mutex<()>,
}

/// One member of the Raft group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub id: u64,
    pub addr: String,
    pub voter: bool,
}

impl From<NotServing> for Error {
    fn from(n: NotServing) -> Self {
        match n {
            NotServing::NotLeader(hint) => Error::NotLeader {
                leader: hint.map(|h| (h.id, h.addr)),
            },
            NotServing::NotReady(why) => Error::NotReady(why),
        }
    }
}

impl Ops {
    /// Leader-only calls that do not read state: this replica must be a ready leader (waits a
    /// bounded time for it to become one).
    pub async fn leader(&self) -> Result<Observed> {
        Ok(self.gate.require_leader().await?)
    }

    /// Reads of the applied state (design §5): leader, ready, and within the quorum lease, or
    /// confirmed by a quorum round (counted in `read_fallbacks_total{kind="quorum"}`).
    pub async fn read(&self) -> Result<()> {
        match self.gate.read().await? {
            ReadPath::Lease => {}
            ReadPath::Quorum => self
                .metrics
                .read_fallbacks
                .with_label_values(&["quorum"])
                .inc(),
        }
        Ok(())
    }

    /// Replicates one command; its outcome once applied here.
    pub async fn propose(&self, cmd: Command) -> Result<Outcome> {
        self.proposer.propose(cmd).await
    }

    /// Batch size and key lengths of a call naming `keys`.
    pub fn check_keys<K: AsRef<str>>(&self, keys: &[K]) -> Result<()> {
        check_keys(keys, self.cache.max_key_len)
    }

    /// Current members, in id order.
    pub fn members(&self) -> Vec<Member> {
        let m = self.raft.metrics().borrow().membership_config.clone();
        let voters: BTreeSet<u64> = m.membership().voter_ids().collect();
        m.membership()
            .nodes()
            .map(|(id, n)| Member {
                id: *id,
                addr: n.addr.clone(),
                voter: voters.contains(id),
            })
            .collect()
    }
}

/// At most [`MAX_BATCH_KEYS`] keys, each 1..=`max_key_len` bytes.
pub fn check_keys<K: AsRef<str>>(keys: &[K], max_key_len: usize) -> Result<()> {
    check_batch(keys.len(), "keys")?;
    for k in keys.iter().map(AsRef::as_ref) {
        if k.is_empty() {
            return Err(Error::InvalidArgument("empty key".into()));
        }
        if k.len() > max_key_len {
            return Err(Error::InvalidArgument(format!(
                "key of {} bytes exceeds the {max_key_len}-byte limit",
                k.len()
            )));
        }
    }
    Ok(())
}

/// At most [`MAX_BATCH_KEYS`] entries of `what` in one call.
pub fn check_batch(n: usize, what: &str) -> Result<()> {
    if n > MAX_BATCH_KEYS {
        return Err(Error::InvalidArgument(format!(
            "{n} {what} in one call; at most {MAX_BATCH_KEYS}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_limits_name_what_was_wrong() {
        assert!(check_keys(&["k"], 4).is_ok());
        let e = check_keys(&[""], 4).unwrap_err();
        assert_eq!(e.to_string(), "invalid argument: empty key");
        let e = check_keys(&["abcde"], 4).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid argument: key of 5 bytes exceeds the 4-byte limit"
        );
        let many = vec!["k".to_string(); MAX_BATCH_KEYS + 1];
        let e = check_keys(&many, 4).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "invalid argument: {} keys in one call; at most {MAX_BATCH_KEYS}",
                MAX_BATCH_KEYS + 1
            )
        );
        assert!(check_batch(MAX_BATCH_KEYS, "items").is_ok());
    }
}
