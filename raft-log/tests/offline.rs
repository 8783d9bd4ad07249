//! Offline surgery on a data directory: `seed_snapshot` (restore a new member from a backup),
//! `force_single_member` (a survivor of a lost quorum alone) and `no_restored_leader` (a leader
//! that stopped starts as a follower).

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::{log_id, open, set, Kv, TypeConfig};
use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{
    BasicNode, EntryPayload, Membership, RaftLogReader, RaftSnapshotBuilder, SnapshotMeta,
    StoredMembership, Vote,
};
use regolith_raft_log::{
    force_single_member, has_state, no_restored_leader, seed_snapshot, Error, StateMachineCore,
    StorageConfig,
};

fn nodes(ids: &[u64]) -> Membership<u64, BasicNode> {
    let voters: BTreeSet<u64> = ids.iter().copied().collect();
    let nodes: BTreeMap<u64, BasicNode> = ids
        .iter()
        .map(|id| {
            (
                *id,
                BasicNode {
                    addr: format!("h:{id}"),
                },
            )
        })
        .collect();
    Membership::new(vec![voters], nodes)
}

fn payload(pairs: &[(&str, &str)]) -> Vec<u8> {
    let kv = Kv::default();
    for (k, v) in pairs {
        kv.map.lock().insert(k.to_string(), v.to_string());
    }
    let mut out = Vec::new();
    kv.write_snapshot(&mut out).unwrap();
    out
}

#[tokio::test]
async fn a_seeded_dir_opens_at_the_snapshot_with_its_membership_and_vote() {
    let dir = tempfile::tempdir().unwrap();
    let at = log_id(7, 40);
    let meta = SnapshotMeta {
        last_log_id: Some(at),
        last_membership: StoredMembership::new(Some(at), nodes(&[1, 2, 3])),
        snapshot_id: "restore-7-40".into(),
    };
    let bytes = payload(&[("a", "1"), ("b", "2")]);
    seed_snapshot(
        dir.path(),
        &StorageConfig::default(),
        &meta,
        &Vote::new(7, 2),
        &mut bytes.as_slice(),
    )
    .unwrap();
    assert!(has_state(dir.path()).unwrap());
    // A second seed of the same dir is refused.
    let e = seed_snapshot(
        dir.path(),
        &StorageConfig::default(),
        &meta,
        &Vote::new(7, 2),
        &mut bytes.as_slice(),
    )
    .unwrap_err();
    assert!(matches!(e, Error::Refused { .. }), "{e}");

    let (mut store, mut sm, kv) = open(dir.path());
    assert_eq!(kv.get("a").as_deref(), Some("1"));
    assert_eq!(kv.get("b").as_deref(), Some("2"));
    let (applied, membership) = sm.applied_state().await.unwrap();
    assert_eq!(applied, Some(at));
    assert_eq!(
        membership.membership().voter_ids().collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    assert_eq!(store.read_vote().await.unwrap(), Some(Vote::new(7, 2)));
    let current = sm.get_current_snapshot().await.unwrap().unwrap();
    assert_eq!(current.meta, meta);
}

#[tokio::test]
async fn forcing_appends_a_single_member_entry_after_the_log_or_the_snapshot() {
    let cfg = StorageConfig::default();
    // No state at all: refused.
    let empty = tempfile::tempdir().unwrap();
    let e = force_single_member::<TypeConfig>(empty.path(), &cfg, 1, BasicNode::default())
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Refused { .. }), "{e}");

    // A log of three entries: the new one is the fourth, in the last entry's term.
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut store, _sm, _kv) = open(dir.path());
        store
            .blocking_append([
                set(3, 1, "a", "1"),
                set(3, 2, "b", "2"),
                set(4, 3, "c", "3"),
            ])
            .await
            .unwrap();
    }
    let node = BasicNode { addr: "h:9".into() };
    let id = force_single_member::<TypeConfig>(dir.path(), &cfg, 9, node.clone())
        .await
        .unwrap();
    assert_eq!(id, log_id(4, 4));
    let (mut store, _sm, _kv) = open(dir.path());
    let entries = store.try_get_log_entries(4..5).await.unwrap();
    match &entries[0].payload {
        EntryPayload::Membership(m) => {
            assert_eq!(m.voter_ids().collect::<Vec<_>>(), vec![9]);
            assert_eq!(m.get_node(&9), Some(&node));
        }
        other => panic!("{other:?}"),
    }
    drop(store);

    // A snapshot ahead of the log (installed, the log not yet purged): the log is purged to it
    // and the new entry follows the snapshot, with no hole.
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut store, mut sm, _kv) = open(dir.path());
        store.blocking_append([set(2, 1, "a", "1")]).await.unwrap();
        sm.apply([
            set(2, 1, "a", "1"),
            set(2, 2, "b", "2"),
            set(2, 3, "c", "3"),
        ])
        .await
        .unwrap();
        sm.get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
    }
    let id = force_single_member::<TypeConfig>(dir.path(), &cfg, 1, BasicNode::default())
        .await
        .unwrap();
    assert_eq!(id, log_id(2, 4));
    let (mut store, _sm, _kv) = open(dir.path());
    let state = store.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(2, 3)));
    assert_eq!(state.last_log_id, Some(log_id(2, 4)));
}

/// A member whose stored vote is its own committed vote (it led) gets it back uncommitted, with
/// the same term and candidate, durably; any other vote is left as it is.
#[tokio::test]
async fn a_leaders_own_committed_vote_is_stored_uncommitted() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut store, _sm, _kv) = open(dir.path());
        store.save_vote(&Vote::new_committed(9, 2)).await.unwrap();
        assert_eq!(
            no_restored_leader(&store, 1).await.unwrap(),
            None,
            "another's vote"
        );
        assert_eq!(
            store.read_vote().await.unwrap(),
            Some(Vote::new_committed(9, 2))
        );
        assert_eq!(no_restored_leader(&store, 2).await.unwrap(), Some(9));
    }
    let (mut store, _sm, _kv) = open(dir.path());
    assert_eq!(
        store.read_vote().await.unwrap(),
        Some(Vote::new(9, 2)),
        "uncommitted after a reopen"
    );
    assert_eq!(
        no_restored_leader(&store, 2).await.unwrap(),
        None,
        "an uncommitted vote stays"
    );
    store.save_vote(&Vote::new(10, 2)).await.unwrap();
    assert_eq!(no_restored_leader(&store, 2).await.unwrap(), None);
    assert_eq!(store.read_vote().await.unwrap(), Some(Vote::new(10, 2)));
}
