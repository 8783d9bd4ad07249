//! Offline surgery on a data directory, done before openraft opens it: seeding a brand-new
//! member from a snapshot (restore from a backup), rewriting a survivor's membership to itself
//! alone (recovery from a lost quorum), and keeping a leader that stopped from coming back as
//! the leader of its old term. All are for the application's start-up.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};

use openraft::{BasicNode, Entry, EntryPayload, LogId, Membership, RaftTypeConfig, Vote};

use crate::config::StorageConfig;
use crate::error::{Error, Result};
use crate::log_store::{self, SledLogStore};
use crate::snapshot::{Meta, SnapshotDir, SnapshotWriter};

/// Seeds the empty data directory `dir` with a snapshot: the state `payload` (the application's
/// `write_snapshot` format), covering the log up to `meta.last_log_id`, with
/// `meta.last_membership` as the cluster's membership, and `vote` as the stored vote. On its
/// first start openraft then finds an initialized member whose log begins after the snapshot,
/// exactly as if it had installed that snapshot from a leader; no `initialize` is needed.
///
/// Members seeded with the same meta and payload agree on the state; `vote` should be at least
/// the snapshot's term, so that the next election's term is higher than every log id's.
///
/// The vote is written (and flushed) before the snapshot: a crash in between leaves a vote and
/// no snapshot, which the caller must detect (it marks the directory while seeding).
pub fn seed_snapshot(
    dir: &Path,
    cfg: &StorageConfig,
    meta: &Meta,
    vote: &Vote<u64>,
    payload: &mut dyn Read,
) -> Result<PathBuf> {
    if crate::has_state(dir)? {
        return Err(Error::Refused {
            path: dir.to_path_buf(),
            reason: "the data directory already holds Raft state; seed only an empty one".into(),
        });
    }
    log_store::write_vote_offline(dir, cfg, vote)?;
    let snapshots = SnapshotDir::open(dir)?;
    let temp = snapshots.temp_path("seed");
    let written = (|| {
        let mut w = SnapshotWriter::create(&temp, meta)?;
        std::io::copy(payload, &mut w).map_err(|source| Error::StateMachine {
            op: "copy the seed",
            path: temp.clone(),
            source,
        })?;
        w.finish()
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&temp);
        return Err(e);
    }
    snapshots.publish(&temp, meta)
}

/// Rewrites the membership of the member in `dir` to `id` alone (a voter at `node`), by
/// appending one membership entry after its last log entry (or after its snapshot, when that is
/// further). openraft takes the last membership entry of the log as the effective one, even
/// before it is committed, so on start this member is the only voter: it elects itself and
/// commits every entry of its log, the new one included. Returns the new entry's id.
///
/// Entries of the log that the old cluster had not committed are committed too (as etcd's
/// `--force-new-cluster` does not, it truncates them): the stored commit index may lag what was
/// committed and acknowledged, and dropping an acknowledged entry is worse than keeping one that
/// was never acknowledged.
pub async fn force_single_member<C>(
    dir: &Path,
    cfg: &StorageConfig,
    id: u64,
    node: BasicNode,
) -> Result<LogId<u64>>
where
    C: RaftTypeConfig<NodeId = u64, Node = BasicNode, Entry = Entry<C>>,
{
    let snapshot_last = SnapshotDir::open(dir)?
        .newest_meta()?
        .and_then(|m| m.last_log_id);
    let store = SledLogStore::<C>::open(dir, cfg)?;
    let state = store.log_state_offline()?;
    if state.last_log_id < snapshot_last {
        // The snapshot is ahead of the log (a snapshot installed, the log not yet purged): purge
        // up to it, so that the new entry does not leave a hole behind it.
        if let Some(s) = snapshot_last {
            store.purge_offline(s)?;
        }
    }
    let Some(base) = std::cmp::max(state.last_log_id, snapshot_last) else {
        return Err(Error::Refused {
            path: dir.to_path_buf(),
            reason: "no Raft state (no log entry, no snapshot) to force a new cluster from".into(),
        });
    };
    let log_id = LogId::new(base.leader_id, base.index + 1);
    let voters: BTreeSet<u64> = [id].into();
    let nodes: BTreeMap<u64, BasicNode> = [(id, node)].into();
    let entry = Entry::<C> {
        log_id,
        payload: EntryPayload::Membership(Membership::new(vec![voters], nodes)),
    };
    store.append_offline(entry).await?;
    Ok(log_id)
}

/// Makes sure the member `id` does not start as the leader of the term it led before it stopped.
///
/// openraft 0.9 restores a member whose stored vote is its own committed vote as the leader of
/// that term at once, without an election. The leader's memory (whatever it handed out that is
/// not in the log, such as reservation versions numbered from 1 in each term) starts empty, so
/// one term had two leaders' worth of such names, and they collided (issue 17: two objects
/// committed under one version; a sidecar's release of an old reservation freed a new one's
/// extents). Storing the vote uncommitted (same term, same candidate: it grants no other vote
/// in that term) starts the member as a follower; the next leader is elected in a new term.
/// Returns the term the member led, when it did. Call it on the log store before openraft gets
/// it.
pub async fn no_restored_leader<C>(log: &SledLogStore<C>, id: u64) -> Result<Option<u64>>
where
    C: RaftTypeConfig<NodeId = u64, Node = BasicNode, Entry = Entry<C>>,
{
    log.uncommit_own_vote(id).await
}
