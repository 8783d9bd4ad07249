//! Restore from a snapshot file (`--restore-from`) and recovery from a lost quorum
//! (`--force-new-cluster`): what [`crate::node::Node::start`] does to the data directory before
//! storage opens. docs/metad.md "Backup and recovery" is the operator's side of it.
//!
//! **Restore.** Every initial member of the new cluster is started with the same file, the
//! same `--peers` and `--bootstrap`. Each one, finding its data dir empty, validates the file
//! whole (header, length, checksum, then the state itself decoded as a replica would), and seeds
//! the dir with a Raft snapshot of that state (as `etcdutl snapshot restore` does for etcd):
//! * the snapshot covers the log up to `(term, applied index)` of the backup, and its stored
//!   membership is `--peers`, so openraft starts as an initialized member of that membership
//!   whose log begins after the snapshot, with no `initialize` call;
//! * the stored vote is the backup's term (plus `--restore-term-bump`), so the first election
//!   of the new cluster is at a higher term than every log id (and than every version of the
//!   restored objects, whose terms are the old cluster's: reservations of the new cluster never
//!   repeat one).
//!
//! All members hold byte-identical state at the same log id, so they agree whoever leads; a
//! member added later (`regolith members add`) finds the log begins after the snapshot and gets
//! the snapshot from the leader. A member started without the file has a lower last log id and
//! cannot win an election against the restored ones.
//!
//! **Force new cluster.** The survivor's own log gets one more entry, a membership of itself
//! alone (see `regolith_raft_log::force_single_member`): it elects itself and serves everything
//! it had. A marker file records that it was done; a later start with the flag is refused, so
//! that a flag left in a unit file cannot throw away members added back since.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use openraft::{
    BasicNode, CommittedLeaderId, LogId, Membership, SnapshotMeta, StoredMembership, Vote,
};
use regolith_raft_log::StorageConfig;

use crate::args::Settings;
use crate::error::{Error, Result};
use crate::raft_types::TypeConfig;
use crate::state::{StateMachine, SNAPSHOT_VERSION};

/// Present in the data dir while a restore seeds it: a start that finds it refuses to run.
pub const RESTORE_MARKER: &str = "restore-in-progress";
/// Written once `--force-new-cluster` rewrote the membership.
pub const FORCE_MARKER: &str = "force-new-cluster.done";

/// What was done to the data dir.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prepared {
    Nothing,
    /// Seeded from `--restore-from`: the member is initialized; no bootstrap.
    Restored,
    /// Membership rewritten to this replica alone.
    Forced,
}

fn fail(msg: String) -> Error {
    Error::Recovery(msg)
}

fn storage_err(dir: &Path) -> impl FnOnce(regolith_raft_log::Error) -> Error + '_ {
    move |e| Error::Storage {
        path: dir.display().to_string(),
        reason: e.to_string(),
    }
}

/// Refuses a data dir that an interrupted restore left half-seeded.
pub fn check_markers(dir: &Path) -> Result<()> {
    let marker = dir.join(RESTORE_MARKER);
    if marker.exists() {
        return Err(fail(format!(
            "an earlier --restore-from into {} did not finish ({} is there): empty the data \
             directory and start again with --restore-from",
            dir.display(),
            marker.display()
        )));
    }
    Ok(())
}

/// Applies `--restore-from` or `--force-new-cluster` to the data dir, as the settings ask.
pub async fn prepare(
    settings: &Settings,
    cfg: &StorageConfig,
    had_state: bool,
) -> Result<Prepared> {
    let dir = &settings.data_dir;
    if let Some(file) = &settings.restore_from {
        if had_state {
            tracing::info!(dir = %dir.display(), file = %file.display(), "data dir has state: --restore-from ignored");
            return Ok(Prepared::Nothing);
        }
        restore(settings, cfg, file)?;
        return Ok(Prepared::Restored);
    }
    if settings.force_new_cluster {
        force(settings, cfg, had_state).await?;
        return Ok(Prepared::Forced);
    }
    Ok(Prepared::Nothing)
}

fn restore(settings: &Settings, cfg: &StorageConfig, file: &Path) -> Result<()> {
    let dir = &settings.data_dir;
    let bad = |e: regolith_proto::Error| fail(format!("--restore-from: {e}"));
    let v = regolith_proto::backup::validate(file).map_err(bad)?;
    let info = &v.info;
    if info.state_format != SNAPSHOT_VERSION {
        return Err(fail(format!(
            "--restore-from {}: its state is in format {}, this build reads {SNAPSHOT_VERSION} \
             (written by a newer Regolith?)",
            file.display(),
            info.state_format
        )));
    }
    // Decode the whole state as a replica will, before touching the data dir.
    let sm = {
        let mut r = regolith_proto::backup::payload_reader(file, &v).map_err(bad)?;
        StateMachine::read_snapshot(&mut r).map_err(|e| {
            fail(format!(
                "--restore-from {}: the state in the file does not decode: {e}",
                file.display()
            ))
        })?
    };
    let log_id = LogId::new(CommittedLeaderId::new(info.term, 0), info.applied_index);
    let voters: BTreeSet<u64> = settings.peers.keys().copied().collect();
    let nodes: BTreeMap<u64, BasicNode> = settings
        .peers
        .iter()
        .map(|(id, addr)| (*id, BasicNode { addr: addr.clone() }))
        .collect();
    let meta = SnapshotMeta {
        last_log_id: Some(log_id),
        last_membership: StoredMembership::new(Some(log_id), Membership::new(vec![voters], nodes)),
        snapshot_id: format!("restore-{}-{}", info.term, info.applied_index),
    };
    // The first election is at a term above this one (see the module doc).
    let vote_term = info
        .term
        .checked_add(settings.restore_term_bump)
        .filter(|t| *t < 1 << 62)
        .ok_or_else(|| {
            fail(format!(
                "--restore-from {}: term {} + --restore-term-bump {} is out of range",
                file.display(),
                info.term,
                settings.restore_term_bump
            ))
        })?;
    let vote = Vote::new(vote_term, settings.id);

    let marker = dir.join(RESTORE_MARKER);
    std::fs::write(&marker, format!("restoring from {}\n", file.display())).map_err(|e| {
        Error::Io {
            what: format!("restore marker {}", marker.display()),
            source: e,
        }
    })?;
    let mut payload = regolith_proto::backup::payload_reader(file, &v).map_err(bad)?;
    regolith_raft_log::seed_snapshot(dir, cfg, &meta, &vote, &mut payload)
        .map_err(storage_err(dir))?;
    std::fs::remove_file(&marker).map_err(|e| Error::Io {
        what: format!("restore marker {}", marker.display()),
        source: e,
    })?;
    tracing::warn!(
        file = %file.display(),
        term = info.term,
        first_election_above = vote_term,
        applied_index = info.applied_index,
        keys = sm.key_count(),
        segments = sm.segments().count(),
        meta_keys = sm.meta_usage().0,
        peers = ?settings.peers,
        "data dir seeded from a snapshot file: this member starts with the snapshot's state"
    );
    Ok(())
}

async fn force(settings: &Settings, cfg: &StorageConfig, had_state: bool) -> Result<()> {
    let dir = &settings.data_dir;
    if !had_state {
        return Err(fail(format!(
            "--force-new-cluster: {} holds no Raft state; it restarts a surviving member from \
             its own data (a new empty cluster needs --bootstrap)",
            dir.display()
        )));
    }
    let marker = dir.join(FORCE_MARKER);
    if let Ok(text) = std::fs::read_to_string(&marker) {
        return Err(fail(format!(
            "--force-new-cluster was already applied to {} ({}); start without the flag (members \
             added since would be thrown out), or delete {} to force again",
            dir.display(),
            text.trim(),
            marker.display()
        )));
    }
    let node = BasicNode {
        addr: settings.advertise.clone(),
    };
    let log_id = regolith_raft_log::force_single_member::<TypeConfig>(dir, cfg, settings.id, node)
        .await
        .map_err(storage_err(dir))?;
    std::fs::write(
        &marker,
        format!(
            "membership forced to member {} alone at log index {} (term {})\n",
            settings.id, log_id.index, log_id.leader_id.term
        ),
    )
    .map_err(|e| Error::Io {
        what: format!("marker {}", marker.display()),
        source: e,
    })?;
    tracing::warn!(
        id = settings.id,
        advertise = %settings.advertise,
        index = log_id.index,
        "--force-new-cluster: membership rewritten to this replica alone; add members back with \
         `regolith members add`, and start it without the flag from now on"
    );
    Ok(())
}
