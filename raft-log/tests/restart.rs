//! Durability across restarts, snapshot files on disk, and snapshot installation.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use common::{blank, log_id, open, set, Kv, Sm, TypeConfig};
use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{
    Entry, EntryPayload, LogState, Membership, RaftLogReader, RaftSnapshotBuilder, Vote,
};
use regolith_raft_log::{has_state, Error, SledStateMachine};
use tokio::io::AsyncWriteExt;

fn membership(term: u64, index: u64, voters: &[u64]) -> Entry<TypeConfig> {
    let voters: BTreeSet<u64> = voters.iter().copied().collect();
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Membership(Membership::new(vec![voters], None)),
    }
}

fn files_in(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == ext))
        .collect();
    files.sort();
    files
}

fn snapshot_dir(data: &Path) -> PathBuf {
    data.join("snapshots")
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Applies a membership change and two sets, and builds a snapshot of that; returns its path.
async fn build_snapshot_at_4(sm: &mut Sm) -> PathBuf {
    sm.apply([
        blank(1, 1),
        membership(1, 2, &[1, 2, 3]),
        set(1, 3, "a", "1"),
        set(1, 4, "b", "2"),
    ])
    .await
    .unwrap();
    let snap = sm
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    assert_eq!(snap.meta.last_log_id, Some(log_id(1, 4)));
    let files = files_in(&snapshot_dir(sm.snapshot_dir().parent().unwrap()), "snap");
    assert_eq!(files.len(), 1, "{files:?}");
    files.into_iter().next().unwrap()
}

#[tokio::test]
async fn log_vote_and_committed_survive_restart() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut store, _sm, _kv) = open(dir.path());
        let entries: Vec<_> = (1..=10).map(|i| set(1, i, &format!("k{i}"), "v")).collect();
        store.blocking_append(entries).await.unwrap();
        store.save_vote(&Vote::new(3, 1)).await.unwrap();
        store.save_committed(Some(log_id(1, 7))).await.unwrap();
        store.purge(log_id(1, 2)).await.unwrap();
        // save_committed and purge are made durable by the next flush.
        store.flush().await.unwrap();
    }

    let (mut store, _sm, _kv) = open(dir.path());
    assert_eq!(
        store.get_log_state().await.unwrap(),
        LogState {
            last_purged_log_id: Some(log_id(1, 2)),
            last_log_id: Some(log_id(1, 10)),
        }
    );
    assert_eq!(store.read_vote().await.unwrap(), Some(Vote::new(3, 1)));
    assert_eq!(store.read_committed().await.unwrap(), Some(log_id(1, 7)));
    let entries = store.try_get_log_entries(0..).await.unwrap();
    let indexes: Vec<u64> = entries.iter().map(|e| e.log_id.index).collect();
    assert_eq!(indexes, (3..=10).collect::<Vec<_>>());
    assert_eq!(entries[0], set(1, 3, "k3", "v"));

    store.truncate(log_id(1, 8)).await.unwrap();
    drop(store);

    let (mut store, _sm, _kv) = open(dir.path());
    let state = store.get_log_state().await.unwrap();
    assert_eq!(state.last_log_id, Some(log_id(1, 7)));
    assert_eq!(store.try_get_log_entries(8..).await.unwrap().len(), 0);
}

#[tokio::test]
async fn purging_everything_keeps_the_last_purged_id() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut store, _sm, _kv) = open(dir.path());
        store
            .blocking_append((1..=5).map(|i| blank(2, i)))
            .await
            .unwrap();
        store.purge(log_id(2, 5)).await.unwrap();
        store.flush().await.unwrap();
    }
    let (mut store, _sm, _kv) = open(dir.path());
    assert_eq!(
        store.get_log_state().await.unwrap(),
        LogState {
            last_purged_log_id: Some(log_id(2, 5)),
            last_log_id: Some(log_id(2, 5)),
        }
    );
}

/// A purge returns once the mark is written; the entries are deleted on a thread of their own.
/// Purged entries are never read again, deleted or not, and they are gone once the store is
/// closed (the purge thread finishes first) and stay unreadable after a restart.
#[tokio::test]
async fn purged_entries_are_never_read_and_are_deleted_in_the_background() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut store, _sm, _kv) = open(dir.path());
        store
            .blocking_append((1..=3000).map(|i| blank(2, i)))
            .await
            .unwrap();
        store.purge(log_id(2, 2500)).await.unwrap();
        let left = store.try_get_log_entries(0..).await.unwrap();
        assert_eq!(left.len(), 500);
        assert_eq!(left[0].log_id, log_id(2, 2501));
        assert!(store.limited_get_log_entries(1, 2502).await.unwrap().len() == 1);
        store
            .blocking_append((3001..=3010).map(|i| blank(2, i)))
            .await
            .unwrap();
        store.purge(log_id(2, 2990)).await.unwrap();
        store.flush().await.unwrap();
    }
    // The database closed only after the purge threads finished: the raw log holds no purged
    // entry (sled would refuse a second open while a thread still held it).
    let (mut store, _sm, _kv) = open(dir.path());
    let state = store.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(2, 2990)));
    assert_eq!(state.last_log_id, Some(log_id(2, 3010)));
    let left = store.try_get_log_entries(0..).await.unwrap();
    assert_eq!(left.first().map(|e| e.log_id), Some(log_id(2, 2991)));
    assert_eq!(left.len(), 20);
    drop(store);
    let db = raw_db(dir.path());
    let log = db.open_tree("log").unwrap();
    assert_eq!(log.len(), 20, "purged entries left on disk");
}

#[tokio::test]
async fn limited_reads_are_capped_by_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = regolith_raft_log::StorageConfig {
        max_read_bytes: 3000,
        ..Default::default()
    };
    let mut store = regolith_raft_log::SledLogStore::<TypeConfig>::open(dir.path(), &cfg).unwrap();
    let big = "x".repeat(1000);
    store
        .blocking_append((1..=10).map(|i| set(1, i, "k", &big)))
        .await
        .unwrap();
    let got = store.limited_get_log_entries(1, 11).await.unwrap();
    assert_eq!(
        got.len(),
        2,
        "two ~1 KiB entries fit in 3000 bytes, three do not"
    );

    let cfg = regolith_raft_log::StorageConfig {
        max_read_bytes: 10,
        ..Default::default()
    };
    drop(store);
    let mut store = regolith_raft_log::SledLogStore::<TypeConfig>::open(dir.path(), &cfg).unwrap();
    let got = store.limited_get_log_entries(4, 11).await.unwrap();
    assert_eq!(
        got.len(),
        1,
        "an entry over the cap is still returned alone"
    );
    assert_eq!(got[0].log_id.index, 4);
}

#[tokio::test]
async fn apply_returns_the_state_machine_responses() {
    let dir = tempfile::tempdir().unwrap();
    let (_store, mut sm, kv) = open(dir.path());
    let handle = sm.applied_handle();
    let out = sm
        .apply([
            set(1, 1, "a", "1"),
            blank(1, 2),
            set(1, 3, "a", "2"),
            membership(1, 4, &[1]),
        ])
        .await
        .unwrap();
    let previous: Vec<Option<String>> = out.into_iter().map(|r| r.previous).collect();
    assert_eq!(previous, vec![None, None, Some("1".into()), None]);
    assert_eq!(kv.get("a").as_deref(), Some("2"));
    assert_eq!(handle.last_applied(), Some(log_id(1, 4)));
    assert_eq!(handle.wait_applied(4).await, Some(log_id(1, 4)));
    let (applied, mem) = sm.applied_state().await.unwrap();
    assert_eq!(applied, Some(log_id(1, 4)));
    assert_eq!(mem.log_id(), &Some(log_id(1, 4)));
}

#[tokio::test]
async fn snapshot_restores_the_state_machine_after_restart() {
    let dir = tempfile::tempdir().unwrap();
    let expected_membership;
    {
        let (_store, mut sm, _kv) = open(dir.path());
        build_snapshot_at_4(&mut sm).await;
        expected_membership = sm.applied_state().await.unwrap().1;
        assert_eq!(sm.stats().snapshot_builds(), 1);
        assert!(sm.stats().last_snapshot_bytes() > 32);
    }

    let (_store, mut sm, kv) = open(dir.path());
    assert_eq!(kv.snapshot(), map(&[("a", "1"), ("b", "2")]));
    assert_eq!(sm.last_applied(), Some(log_id(1, 4)));
    assert_eq!(
        sm.applied_state().await.unwrap(),
        (Some(log_id(1, 4)), expected_membership)
    );
    let current = sm
        .get_current_snapshot()
        .await
        .unwrap()
        .expect("a current snapshot");
    assert_eq!(current.meta.last_log_id, Some(log_id(1, 4)));
    assert_eq!(sm.current_snapshot_meta(), Some(current.meta));
    assert!(files_in(&snapshot_dir(dir.path()), "tmp").is_empty());
}

#[tokio::test]
async fn a_new_snapshot_replaces_the_old_one() {
    let dir = tempfile::tempdir().unwrap();
    let (_store, mut sm, _kv) = open(dir.path());
    let first = build_snapshot_at_4(&mut sm).await;
    sm.apply([set(1, 5, "c", "3")]).await.unwrap();
    let snap = sm
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    assert_eq!(snap.meta.last_log_id, Some(log_id(1, 5)));
    let files = files_in(&snapshot_dir(dir.path()), "snap");
    assert_eq!(files.len(), 1);
    assert_ne!(files[0], first);
}

/// A snapshot is written from a view taken when it starts: entries applied while it is being
/// written are applied at once (the state lock is not held for the write) and are not in it.
#[tokio::test]
async fn entries_apply_while_a_snapshot_is_written() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (_store, mut sm, kv) = open(dir.path());
        sm.apply([blank(1, 1), set(1, 2, "a", "1")]).await.unwrap();
        let (entered_tx, entered) = std::sync::mpsc::channel();
        let (release, release_rx) = std::sync::mpsc::channel();
        *kv.hold.lock() = Some(common::HoldWrite {
            entered: entered_tx,
            release: release_rx,
        });
        let mut builder = sm.get_snapshot_builder().await;
        let build = tokio::spawn(async move { builder.build_snapshot().await });
        tokio::task::spawn_blocking(move || entered.recv())
            .await
            .unwrap()
            .expect("the snapshot write started");
        let applied = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            sm.apply([set(1, 3, "b", "2")]),
        )
        .await
        .expect("an apply waited for the snapshot write")
        .unwrap();
        assert_eq!(applied.len(), 1);
        assert_eq!(kv.get("b").as_deref(), Some("2"));
        release.send(()).unwrap();
        let snap = build.await.unwrap().unwrap();
        assert_eq!(snap.meta.last_log_id, Some(log_id(1, 2)));
    }
    let (_store, sm, kv) = open(dir.path());
    assert_eq!(kv.snapshot(), map(&[("a", "1")]));
    assert_eq!(sm.last_applied(), Some(log_id(1, 2)));
}

/// Streams `from`'s current snapshot into a file `to` handed out, as openraft does.
async fn stream_snapshot(
    from: &mut Sm,
    to: &mut Sm,
) -> openraft::SnapshotMeta<u64, openraft::BasicNode> {
    let mut current = from.get_current_snapshot().await.unwrap().unwrap();
    let mut receiving = to.begin_receiving_snapshot().await.unwrap();
    tokio::io::copy(&mut *current.snapshot, &mut *receiving)
        .await
        .unwrap();
    to.install_snapshot(&current.meta, receiving).await.unwrap();
    current.meta
}

#[tokio::test]
async fn installing_a_received_snapshot_replaces_the_state() {
    let leader_dir = tempfile::tempdir().unwrap();
    let follower_dir = tempfile::tempdir().unwrap();
    let (_ls, mut leader, leader_kv) = open(leader_dir.path());
    let (_fs, mut follower, follower_kv) = open(follower_dir.path());
    build_snapshot_at_4(&mut leader).await;
    follower.apply([set(1, 1, "stale", "x")]).await.unwrap();

    let meta = stream_snapshot(&mut leader, &mut follower).await;

    assert_eq!(follower_kv.snapshot(), leader_kv.snapshot());
    assert_eq!(
        follower.applied_state().await.unwrap(),
        leader.applied_state().await.unwrap()
    );
    assert_eq!(follower.last_applied(), Some(log_id(1, 4)));
    let current = follower.get_current_snapshot().await.unwrap().unwrap();
    assert_eq!(current.meta, meta);
    assert_eq!(follower.stats().snapshot_installs(), 1);
    let sdir = snapshot_dir(follower_dir.path());
    assert_eq!(files_in(&sdir, "snap").len(), 1);
    assert!(files_in(&sdir, "tmp").is_empty());

    drop((_fs, follower));
    let (_fs, follower, kv) = open(follower_dir.path());
    assert_eq!(kv.snapshot(), map(&[("a", "1"), ("b", "2")]));
    assert_eq!(follower.last_applied(), Some(log_id(1, 4)));
}

#[tokio::test]
async fn installing_from_a_foreign_file_handle_copies_it() {
    // openraft's own suite swaps the handed-out file for the leader's snapshot file.
    let leader_dir = tempfile::tempdir().unwrap();
    let follower_dir = tempfile::tempdir().unwrap();
    let (_ls, mut leader, _leader_kv) = open(leader_dir.path());
    let (_fs, mut follower, follower_kv) = open(follower_dir.path());
    build_snapshot_at_4(&mut leader).await;

    let current = leader.get_current_snapshot().await.unwrap().unwrap();
    let _unused = follower.begin_receiving_snapshot().await.unwrap();
    follower
        .install_snapshot(&current.meta, current.snapshot)
        .await
        .unwrap();
    assert_eq!(follower_kv.snapshot(), map(&[("a", "1"), ("b", "2")]));
    // The leader's file is untouched; the unused receive file is cleaned up.
    assert_eq!(files_in(&snapshot_dir(leader_dir.path()), "snap").len(), 1);
    let follower_snapshots = snapshot_dir(follower_dir.path());
    assert_eq!(files_in(&follower_snapshots, "snap").len(), 1);
    assert!(files_in(&follower_snapshots, "tmp").is_empty());
}

#[tokio::test]
async fn a_received_snapshot_must_match_its_meta() {
    let leader_dir = tempfile::tempdir().unwrap();
    let follower_dir = tempfile::tempdir().unwrap();
    let (_ls, mut leader, _) = open(leader_dir.path());
    let (_fs, mut follower, follower_kv) = open(follower_dir.path());
    build_snapshot_at_4(&mut leader).await;
    follower.apply([set(1, 1, "mine", "1")]).await.unwrap();

    let mut current = leader.get_current_snapshot().await.unwrap().unwrap();
    let mut receiving = follower.begin_receiving_snapshot().await.unwrap();
    tokio::io::copy(&mut *current.snapshot, &mut *receiving)
        .await
        .unwrap();
    let mut other = current.meta.clone();
    other.snapshot_id = "someone-else".into();
    let err = follower
        .install_snapshot(&other, receiving)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("someone-else"), "{err}");
    assert_eq!(follower_kv.snapshot(), map(&[("mine", "1")]));
    assert!(follower.get_current_snapshot().await.unwrap().is_none());
    assert!(files_in(&snapshot_dir(follower_dir.path()), "tmp").is_empty());
}

#[tokio::test]
async fn garbage_and_truncated_snapshot_files_are_ignored_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let sdir = snapshot_dir(dir.path());
    let valid = {
        let (_store, mut sm, _kv) = open(dir.path());
        build_snapshot_at_4(&mut sm).await
    };
    let bytes = fs::read(&valid).unwrap();
    // A crash while building leaves a partial temp file; a damaged disk a truncated snapshot
    // whose name claims it is newer.
    fs::write(sdir.join("build-1-0.tmp"), &bytes[..bytes.len() / 2]).unwrap();
    let truncated = sdir.join("snap-00000000000000000099-newer.snap");
    fs::write(&truncated, &bytes[..bytes.len() - 3]).unwrap();
    fs::write(
        sdir.join("snap-00000000000000000098-garbage.snap"),
        b"not a snapshot",
    )
    .unwrap();

    let (_store, sm, kv) = open(dir.path());
    assert_eq!(kv.snapshot(), map(&[("a", "1"), ("b", "2")]));
    assert_eq!(sm.last_applied(), Some(log_id(1, 4)));
    assert_eq!(files_in(&sdir, "snap"), vec![valid]);
    assert!(files_in(&sdir, "tmp").is_empty(), "temp files are removed");
    assert_eq!(
        files_in(&sdir, "corrupt").len(),
        2,
        "corrupt snapshots are set aside"
    );
}

#[tokio::test]
async fn a_lone_corrupt_snapshot_leaves_an_empty_state_machine() {
    let dir = tempfile::tempdir().unwrap();
    let valid = {
        let (_store, mut sm, _kv) = open(dir.path());
        build_snapshot_at_4(&mut sm).await
    };
    let bytes = fs::read(&valid).unwrap();
    let mut flipped = bytes.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 0xff;
    fs::write(&valid, &flipped).unwrap();

    let (_store, mut sm, kv) = open(dir.path());
    assert_eq!(kv.len(), 0);
    assert_eq!(sm.last_applied(), None);
    assert!(sm.get_current_snapshot().await.unwrap().is_none());
}

fn with_version(bytes: &[u8], version: u32) -> Vec<u8> {
    let mut out = bytes.to_vec();
    out[8..12].copy_from_slice(&version.to_le_bytes());
    out
}

#[tokio::test]
async fn an_unknown_snapshot_version_is_refused_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let valid = {
        let (_store, mut sm, _kv) = open(dir.path());
        build_snapshot_at_4(&mut sm).await
    };
    let bytes = fs::read(&valid).unwrap();
    fs::write(&valid, with_version(&bytes, 7)).unwrap();

    let err = SledStateMachine::open(dir.path(), Kv::default())
        .err()
        .expect("open must refuse a snapshot in an unknown format");
    assert!(
        matches!(
            err,
            Error::UnsupportedSnapshotVersion {
                found: 7,
                supported: 1,
                ..
            }
        ),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("format version 7") && msg.contains(valid.to_str().unwrap()),
        "{msg}"
    );
}

#[tokio::test]
async fn an_unknown_snapshot_version_is_refused_on_install() {
    let leader_dir = tempfile::tempdir().unwrap();
    let follower_dir = tempfile::tempdir().unwrap();
    let (_ls, mut leader, _) = open(leader_dir.path());
    let (_fs, mut follower, follower_kv) = open(follower_dir.path());
    let valid = build_snapshot_at_4(&mut leader).await;
    let meta = leader.current_snapshot_meta().unwrap();
    follower.apply([set(1, 1, "mine", "1")]).await.unwrap();

    let mut receiving = follower.begin_receiving_snapshot().await.unwrap();
    let bytes = with_version(&fs::read(&valid).unwrap(), 2);
    receiving.write_all(&bytes).await.unwrap();
    let err = follower
        .install_snapshot(&meta, receiving)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("format version 2"), "{err}");
    assert_eq!(follower_kv.snapshot(), map(&[("mine", "1")]));
    assert_eq!(follower.last_applied(), Some(log_id(1, 1)));
}

#[tokio::test]
async fn has_state_sees_votes_logs_and_snapshots() {
    let root = tempfile::tempdir().unwrap();
    assert!(!has_state(&root.path().join("missing")).unwrap());

    let empty = root.path().join("empty");
    drop(open(&empty));
    assert!(
        !has_state(&empty).unwrap(),
        "opening alone creates no state"
    );

    let voted = root.path().join("voted");
    {
        let (mut store, _sm, _kv) = open(&voted);
        store.save_vote(&Vote::new(1, 1)).await.unwrap();
    }
    assert!(has_state(&voted).unwrap());

    let logged = root.path().join("logged");
    {
        let (mut store, _sm, _kv) = open(&logged);
        store.blocking_append([blank(1, 1)]).await.unwrap();
    }
    assert!(has_state(&logged).unwrap());

    let snapshotted = root.path().join("snapshotted");
    {
        let (_store, mut sm, _kv) = open(&snapshotted);
        build_snapshot_at_4(&mut sm).await;
    }
    fs::remove_dir_all(snapshotted.join("raft.sled")).unwrap();
    assert!(has_state(&snapshotted).unwrap());

    // has_state must not leave the database locked.
    drop(open(&voted));
}

/// Entries larger than a log record are stored in chunks (layout 2): they read back whole,
/// one by one and in ranges, byte-limited reads count whole entries, truncation and purges take
/// their chunks with them, and all of it survives a restart. The last entry being chunked is the
/// case `last()` of the tree lands on a chunk.
#[tokio::test]
async fn entries_larger_than_a_record_survive_chunking() {
    let dir = tempfile::tempdir().unwrap();
    let chunk = regolith_raft_log::CHUNK_BYTES;
    // Sizes around the chunk boundaries, and one of many chunks.
    let sizes = [10, chunk - 40, chunk, chunk + 1, 3 * chunk + 5, 80 * chunk];
    let value = |i: u64| {
        let n = sizes[(i as usize) % sizes.len()];
        (0..n)
            .map(|j| (b'a' + ((j + i as usize) % 26) as u8) as char)
            .collect::<String>()
    };
    let entry = |i: u64| set(1, i, &format!("k{i}"), &value(i));
    {
        let (mut store, _sm, _kv) = open(dir.path());
        store.blocking_append((1..=30).map(entry)).await.unwrap();
        let all = store.try_get_log_entries(1..=30).await.unwrap();
        assert_eq!(all, (1..=30).map(entry).collect::<Vec<_>>());
        assert_eq!(
            store.try_get_log_entries(5..6).await.unwrap(),
            vec![entry(5)]
        );
        assert_eq!(
            store.get_log_state().await.unwrap().last_log_id,
            Some(log_id(1, 30)),
            "the last entry (80 chunks) is found from its last chunk"
        );
        // The default read limit (2 MiB) stops before the entry that would pass it.
        let limited = store.limited_get_log_entries(1, 31).await.unwrap();
        assert!(
            !limited.is_empty() && limited.len() < 30,
            "{}",
            limited.len()
        );
        assert_eq!(
            limited,
            (1..=limited.len() as u64).map(entry).collect::<Vec<_>>()
        );

        store.truncate(log_id(1, 25)).await.unwrap();
        store.purge(log_id(1, 12)).await.unwrap();
        store.flush().await.unwrap();
    }
    let (mut store, _sm, _kv) = open(dir.path());
    assert_eq!(
        store.get_log_state().await.unwrap(),
        LogState {
            last_purged_log_id: Some(log_id(1, 12)),
            last_log_id: Some(log_id(1, 24)),
        }
    );
    assert_eq!(
        store.try_get_log_entries(0..).await.unwrap(),
        (13..=24).map(entry).collect::<Vec<_>>()
    );
    // Appending after a truncation in the middle of chunked entries leaves no stale chunk.
    let replaced = |i: u64| set(2, i, "new", "v");
    store
        .blocking_append((25..=26).map(replaced))
        .await
        .unwrap();
    let tail = store.try_get_log_entries(24..).await.unwrap();
    assert_eq!(tail, vec![entry(24), replaced(25), replaced(26)]);
    drop(store);
    let db = raw_db(dir.path());
    // Purged entries and their chunks are gone from disk, and every record is at most a chunk.
    let log = db.open_tree("log").unwrap();
    let first = log.first().unwrap().unwrap().0;
    assert_eq!(
        &first[..],
        &13u64.to_be_bytes(),
        "purged records left on disk"
    );
    assert!(log.iter().all(|r| r.unwrap().1.len() <= chunk));
    assert!(
        log.iter().any(|r| r.unwrap().0.len() == 12),
        "no entry was chunked"
    );
}

/// Opens the raw sled database of a closed store (sled's I/O threads let go of the file lock a
/// moment after the store is dropped).
fn raw_db(dir: &Path) -> sled::Db {
    let mut tries = 0;
    loop {
        match sled::open(dir.join("raft.sled")) {
            Ok(db) => return db,
            Err(_) if tries < 500 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(e) => panic!("{e}"),
        }
    }
}

/// A log written in layout 1 (whole entries) is read as it is and restamped as layout 2, so
/// that an older binary refuses it once it may hold chunks; a layout from the future is refused.
#[tokio::test]
async fn a_layout_1_log_is_read_and_restamped_and_a_newer_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut store, _sm, _kv) = open(dir.path());
        store
            .blocking_append((1..=3).map(|i| set(1, i, "k", "v")))
            .await
            .unwrap();
    }
    let stamp = |db: &sled::Db, v: u32| {
        db.open_tree("meta")
            .unwrap()
            .insert("layout", &v.to_le_bytes())
            .unwrap();
        db.flush().unwrap();
    };
    let read_stamp = |db: &sled::Db| {
        let b = db
            .open_tree("meta")
            .unwrap()
            .get("layout")
            .unwrap()
            .unwrap();
        u32::from_le_bytes(<[u8; 4]>::try_from(b.as_ref()).unwrap())
    };
    {
        let db = raw_db(dir.path());
        stamp(&db, 1);
    }
    {
        let (mut store, _sm, _kv) = open(dir.path());
        assert_eq!(store.try_get_log_entries(1..).await.unwrap().len(), 3);
    }
    {
        let db = raw_db(dir.path());
        assert_eq!(read_stamp(&db), regolith_raft_log::LOG_LAYOUT_VERSION);
        stamp(&db, regolith_raft_log::LOG_LAYOUT_VERSION + 1);
    }
    let cfg = regolith_raft_log::StorageConfig::default();
    // (The store waits for sled's file lock itself.)
    let refused = regolith_raft_log::SledLogStore::<TypeConfig>::open(dir.path(), &cfg);
    assert!(
        matches!(refused, Err(Error::UnsupportedLogLayout { found, .. }) if found == regolith_raft_log::LOG_LAYOUT_VERSION + 1),
        "{:?}",
        refused.err()
    );
}

/// A purge cut short by a crash can leave records of purged entries, a chunk among them, at the
/// very end of the log (everything was purged, as after a snapshot install): the store still
/// opens, reports the purged id as the last one, and the next purge removes what was left.
#[tokio::test]
async fn records_a_cut_short_purge_left_are_ignored_and_removed_later() {
    let dir = tempfile::tempdir().unwrap();
    let big = "x".repeat(3 * regolith_raft_log::CHUNK_BYTES);
    {
        let (mut store, _sm, _kv) = open(dir.path());
        store
            .blocking_append((1..=3).map(|i| set(1, i, "k", &big)))
            .await
            .unwrap();
        store.purge(log_id(1, 3)).await.unwrap();
        store.flush().await.unwrap();
    }
    {
        // What a crash between the deletion of entry 3's chunks could leave: its chunk 2 alone.
        let db = raw_db(dir.path());
        let mut key = 3u64.to_be_bytes().to_vec();
        key.extend_from_slice(&2u32.to_be_bytes());
        db.open_tree("log")
            .unwrap()
            .insert(key, &b"left over"[..])
            .unwrap();
        db.flush().unwrap();
    }
    {
        let (mut store, _sm, _kv) = open(dir.path());
        assert_eq!(
            store.get_log_state().await.unwrap(),
            LogState {
                last_purged_log_id: Some(log_id(1, 3)),
                last_log_id: Some(log_id(1, 3)),
            }
        );
        store
            .blocking_append((4..=5).map(|i| set(1, i, "k", &big)))
            .await
            .unwrap();
        store.purge(log_id(1, 4)).await.unwrap();
        store.flush().await.unwrap();
        assert_eq!(
            store.try_get_log_entries(0..).await.unwrap(),
            vec![set(1, 5, "k", &big)]
        );
    }
    let db = raw_db(dir.path());
    let first = db.open_tree("log").unwrap().first().unwrap().unwrap().0;
    assert_eq!(
        &first[..],
        &5u64.to_be_bytes(),
        "the left-over chunk is gone"
    );
}
