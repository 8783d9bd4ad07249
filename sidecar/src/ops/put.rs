//! Puts (design §4): `begin` reserves with the leader and tells the client where a local
//! replica is; `commit` writes the remote replicas (all of them, all slices in parallel), then
//! commits every item whose bytes are in place with the leader that issued its reservation,
//! one batch per leader; `abort` gives reservations back. [`PendingPuts`] holds each put
//! between `begin` and `commit`, per client connection.
//!
//! Over 600 lines with its tests (the workflow itself is about 400): the tests of the put
//! workflow against the metad double stay next to it.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use futures::future::join_all;
use parking_lot::Mutex;
use regolith_proto::checksum;
use regolith_proto::common::{Extent, PutOptions, Version};
use regolith_proto::uds::pb::Code;

use super::replica::{span, PutSource};
use super::{
    code_of, metad_failure, Answer, Failure, MetadError, Outcome, Region, Replica, ReplicaInfo,
    ReserveItem, Store, MAX_ITEMS,
};

/// One put to begin.
#[derive(Clone, Debug)]
pub struct BeginItem {
    pub key: String,
    pub size: u64,
    pub options: PutOptions,
}

/// A begun put, as the client is told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ticket {
    pub version: Version,
    /// Where the client copies the value itself (a replica on this node), in object order.
    pub local_extents: Vec<Extent>,
    /// Some replica is on another node (the sidecar writes it at commit).
    pub remote: bool,
    pub replicas: Vec<ReplicaInfo>,
}

/// One put to commit.
pub struct CommitItem {
    pub version: Version,
    /// The object checksum, when the client computed it while copying.
    pub checksum: Option<u64>,
    /// Where the bytes are when no local replica holds them.
    pub source: Region,
}

/// How one put ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PutResult {
    pub status: Outcome<()>,
    /// Where the replicas landed (empty when the put failed before its commit).
    pub replicas: Vec<ReplicaInfo>,
}

/// A put between `begin` and `commit`.
#[derive(Clone, Debug)]
struct Pending {
    key: String,
    size: u64,
    replicas: Vec<Replica>,
    /// The leader that issued the reservation: its commit or abort goes there.
    leader: String,
    /// The local replica's extents (empty when none).
    local: Vec<Extent>,
}

/// The puts one connection has begun and not yet committed or aborted.
#[derive(Default)]
pub struct PendingPuts(Mutex<HashMap<Version, Pending>>);

impl PendingPuts {
    fn insert(&self, v: Version, p: Pending) {
        self.0.lock().insert(v, p);
    }

    fn take(&self, v: &Version) -> Option<Pending> {
        self.0.lock().remove(v)
    }

    fn drain(&self) -> Vec<(Version, Pending)> {
        self.0.lock().drain().collect()
    }

    pub fn len(&self) -> usize {
        self.0.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Reserves every item with the leader; one answer per item.
pub async fn begin(
    store: &Store,
    conn: u64,
    pending: &PendingPuts,
    items: Vec<BeginItem>,
) -> Vec<Outcome<Ticket>> {
    let n = items.len();
    if n == 0 || n > MAX_ITEMS {
        let f = Failure::invalid(format!("{n} items; 1..={MAX_ITEMS} per request"));
        return vec![Err(f); n];
    }
    let req = items
        .iter()
        .map(|it| ReserveItem {
            key: it.key.clone(),
            size: it.size,
            options: it.options.clone(),
        })
        .collect();
    let reserved = match store.metad.reserve(req, store.node_id()).await {
        Ok(r) => r,
        Err(e) => return vec![Err(metad_failure(&e)); n],
    };
    let mut answers = reserved.items.into_iter();
    items
        .into_iter()
        .map(|it| {
            let answer = answers.next().unwrap_or_else(|| {
                Err(super::Refusal::new(
                    regolith_proto::metad::Code::Internal,
                    "metad answered fewer reservations than asked",
                ))
            });
            ticket(store, conn, pending, &reserved.leader, it, answer)
        })
        .collect()
}

/// Records one reservation as pending and tells the client where to copy.
fn ticket(
    store: &Store,
    conn: u64,
    pending: &PendingPuts,
    leader: &str,
    it: BeginItem,
    answer: Answer<super::Reservation>,
) -> Outcome<Ticket> {
    let res = answer.map_err(|r| Failure::from(&r))?;
    let v = res.version;
    let local = res
        .replicas
        .iter()
        .find(|r| store.is_local(r))
        .map(|r| r.extents.clone())
        .unwrap_or_default();
    let remote = res.replicas.iter().any(|r| !store.is_local(r));
    if !local.is_empty() {
        store.tracker.track_local(v, conn, local.clone());
    }
    let t = Ticket {
        version: v,
        local_extents: local.clone(),
        remote,
        replicas: store.replica_infos(&res.replicas),
    };
    pending.insert(
        v,
        Pending {
            key: it.key,
            size: it.size,
            replicas: res.replicas,
            leader: leader.to_string(),
            local,
        },
    );
    Ok(t)
}

/// Writes each item's remote replicas, then commits those in place, one batch per leader.
pub async fn commit(
    store: &Store,
    pending: &PendingPuts,
    items: Vec<CommitItem>,
) -> Vec<PutResult> {
    if items.len() > MAX_ITEMS {
        let f = Failure::invalid(format!("{} items; at most {MAX_ITEMS}", items.len()));
        return vec![
            PutResult {
                status: Err(f),
                replicas: vec![]
            };
            items.len()
        ];
    }
    let staged: Vec<Outcome<(Version, u64, Pending)>> = join_all(
        items
            .into_iter()
            .map(|it| async move { stage(store, pending, it).await }),
    )
    .await;
    let mut results: Vec<Option<PutResult>> = vec![None; staged.len()];
    let mut by_leader: HashMap<String, Vec<(usize, Version, u64, Pending)>> = HashMap::new();
    for (i, s) in staged.into_iter().enumerate() {
        match s {
            Ok((v, ck, p)) => by_leader
                .entry(p.leader.clone())
                .or_default()
                .push((i, v, ck, p)),
            Err(f) => {
                results[i] = Some(PutResult {
                    status: Err(f),
                    replicas: vec![],
                })
            }
        }
    }
    for (leader, batch) in by_leader {
        let req = batch.iter().map(|(_, v, ck, _)| (*v, *ck)).collect();
        let answer = store.metad.commit(&leader, req).await;
        for (k, (i, v, ck, p)) in batch.into_iter().enumerate() {
            store.tracker.untrack_local(v);
            let status = commit_status(&answer, k);
            match &status {
                Ok(()) => {
                    store.metrics.put_bytes.inc_by(p.size);
                    store.puts.fetch_add(1, Ordering::Relaxed);
                    store.index.local_put(
                        &p.key,
                        super::Placement {
                            version: v,
                            size: p.size,
                            checksum: ck,
                            replicas: p.replicas.clone(),
                        },
                    );
                }
                Err(f) => store.count_error("put_commit", f.code),
            }
            results[i] = Some(PutResult {
                status,
                replicas: store.replica_infos(&p.replicas),
            });
        }
    }
    results
        .into_iter()
        .map(|r| {
            r.unwrap_or(PutResult {
                status: Err(Failure::new(Code::Internal, "no outcome")),
                replicas: vec![],
            })
        })
        .collect()
}

/// Item `k`'s outcome in its leader's commit answer.
fn commit_status(answer: &Result<Vec<Answer<()>>, MetadError>, k: usize) -> Outcome<()> {
    match answer {
        Ok(items) => match items.get(k) {
            Some(Ok(())) => Ok(()),
            Some(Err(r)) => Err(Failure::new(code_of(r.code), r.message.clone())),
            None => Err(Failure::new(Code::Internal, "commit answered fewer items")),
        },
        Err(e) => Err(commit_failure(e)),
    }
}

/// Whether a failed call to metad may still have taken effect: it was sent and got no
/// definite answer (a lost reply, a timeout, a leader deposed after appending it). Only calls
/// never sent or refused before any effect are definite.
pub fn may_have_applied(e: &MetadError) -> bool {
    use regolith_proto::Error as E;
    !matches!(
        e,
        E::BadAddress { .. }
            | E::Config(_)
            | E::Rpc {
                code: tonic::Code::InvalidArgument
                    | tonic::Code::Unauthenticated
                    | tonic::Code::PermissionDenied,
                ..
            }
    )
}

/// The failure of a commit that got no definite answer. It may have been applied, so it must
/// not look like a refused commit (UNAVAILABLE, which the client retries with a fresh
/// reservation: the retry would answer ALREADY_EXISTS for the caller's own value): TIMEOUT
/// means "outcome unknown".
pub fn commit_failure(e: &MetadError) -> Failure {
    if may_have_applied(e) {
        Failure::new(
            Code::Timeout,
            format!("metad: commit outcome unknown (the object may be stored): {e}"),
        )
    } else {
        metad_failure(e)
    }
}

/// Writes one put's remote replicas; answers what to commit (its version and checksum).
async fn stage(
    store: &Store,
    pending: &PendingPuts,
    it: CommitItem,
) -> Outcome<(Version, u64, Pending)> {
    let v = it.version;
    let Some(p) = pending.take(&v) else {
        return Err(Failure::invalid(format!(
            "reservation {}.{} is not pending on this connection",
            v.term, v.id
        )));
    };
    match write_remote(store, &p, &it).await {
        Ok(ck) => Ok((v, ck, p)),
        Err(f) => {
            abort_one(store, &p, v).await;
            Err(f)
        }
    }
}

/// Writes the remote replicas from the local replica or the client's source; answers the
/// object checksum.
async fn write_remote(store: &Store, p: &Pending, it: &CommitItem) -> Outcome<u64> {
    let v = it.version;
    let mapped;
    let src = if !p.local.is_empty() {
        PutSource::Mapped {
            seg: &store.segment,
            extents: p.local.clone(),
        }
    } else {
        match &it.source {
            Region::Inline { data, .. } => {
                if (data.len() as u64) < p.size {
                    return Err(Failure::invalid("inline data shorter than the object"));
                }
                PutSource::Inline(data)
            }
            Region::Absent => {
                return Err(Failure::invalid("no local replica and no source region"))
            }
            region => {
                let (seg, off) = region.window(p.size)?;
                mapped = seg;
                PutSource::Mapped {
                    seg: &mapped,
                    extents: vec![span(off, p.size)],
                }
            }
        }
    };
    let remote: Vec<&Replica> = p.replicas.iter().filter(|r| !store.is_local(r)).collect();
    if remote.is_empty() {
        // Only a local replica, which the client copied: the checksum is the one it computed
        // in the same pass (design §7); the sidecar never re-reads the bytes to hash them.
        return it.checksum.ok_or_else(|| {
            Failure::invalid(
                "a put whose only replica is local needs the checksum its writer computed \
                 while copying (checksum_known)",
            )
        });
    }
    let chunks = checksum::chunk_count(p.size);
    let writes = remote.iter().map(|rep| {
        let src = &src;
        async move {
            let mut hashes = vec![0u64; chunks];
            store
                .write_replica(rep, v, p.size, src, &mut hashes)
                .await
                .map(|_| hashes)
                .map_err(|e| (rep.node_name.clone(), e))
        }
    });
    let mut ck = it.checksum;
    for r in join_all(writes).await {
        let h = r.map_err(|(node, e)| {
            Failure::new(
                Code::Unavailable,
                format!("writing the replica on {node}: {e}"),
            )
        })?;
        ck.get_or_insert_with(|| checksum::combine(v.seed(), &h));
    }
    ck.ok_or_else(|| Failure::new(Code::Internal, "no replica was written"))
}

/// Gives one reservation back (best effort: an unanswered abort expires).
async fn abort_one(store: &Store, p: &Pending, v: Version) {
    store.tracker.untrack_local(v);
    if let Err(e) = store.metad.abort(&p.leader, vec![v]).await {
        tracing::debug!(error = %e, key = %p.key, "abort failed (the reservation will expire)");
    }
}

/// The client gave these puts up.
pub async fn abort(store: &Store, pending: &PendingPuts, versions: Vec<Version>) {
    for v in versions {
        if let Some(p) = pending.take(&v) {
            abort_one(store, &p, v).await;
        }
    }
}

/// A client went away: abort its unfinished puts, one batch per leader; its local copies are
/// over.
pub async fn abandon(store: &Store, conn: u64, pending: &PendingPuts) {
    store.tracker.untrack_conn(conn);
    let mut by_leader: HashMap<String, Vec<Version>> = HashMap::new();
    for (v, p) in pending.drain() {
        tracing::info!(key = %p.key, "client left mid-put: aborting its reservation");
        by_leader.entry(p.leader).or_default().push(v);
    }
    for (leader, versions) in by_leader {
        if let Err(e) = store.metad.abort(&leader, versions).await {
            tracing::debug!(error = %e, "abort failed (the reservation will expire)");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::get::{self, Delivery, GetItem};
    use crate::ops::testing::{self, LEADER};

    fn item(key: &str, size: u64, replicas: u32) -> BeginItem {
        BeginItem {
            key: key.into(),
            size,
            options: PutOptions {
                replicas,
                ..Default::default()
            },
        }
    }

    fn inline_get(key: &str) -> GetItem {
        GetItem {
            key: key.into(),
            dest: Region::Absent,
            local_ok: false,
            report_mismatch: false,
            mismatched_version: None,
        }
    }

    async fn commit_one(
        store: &Store,
        pending: &PendingPuts,
        version: Version,
        checksum: Option<u64>,
        source: Region,
    ) -> PutResult {
        let item = CommitItem {
            version,
            checksum,
            source,
        };
        commit(store, pending, vec![item]).await.remove(0)
    }

    fn code(r: &PutResult) -> Option<Code> {
        r.status.as_ref().err().map(|f| f.code)
    }

    async fn begin_one(store: &Store, pending: &PendingPuts, it: BeginItem) -> Ticket {
        let mut t = begin(store, 7, pending, vec![it]).await;
        t.remove(0).expect("a ticket")
    }

    #[tokio::test]
    async fn a_local_put_is_copied_by_the_client_and_committed_with_its_checksum() {
        let (metad, store) = testing::local_store();
        let pending = PendingPuts::default();
        let data = testing::pattern(300_000, 1);

        let t = begin_one(&store, &pending, item("k", data.len() as u64, 1)).await;
        assert!(!t.remote);
        assert_eq!(
            t.local_extents.len(),
            2,
            "the double splits larger replicas in two"
        );
        assert_eq!(
            store.tracker.in_flight().len(),
            1,
            "the local copy counts as in flight"
        );
        let ck = testing::client_copy(&store.segment, &t.local_extents, t.version, &data);

        let r = commit_one(&store, &pending, t.version, Some(ck), Region::Absent).await;
        assert_eq!(r.status, Ok(()));
        assert!(r.replicas[0].local);
        assert_eq!(metad.commits(), vec![(LEADER.to_string(), t.version, ck)]);
        assert!(store.tracker.in_flight().is_empty());
        assert!(pending.is_empty());
        assert_eq!(store.puts.load(Ordering::Relaxed), 1);

        let got = get::get(&store, vec![inline_get("k")]).await;
        assert!(
            got[0].status == Ok(Delivery::Inline(data)),
            "{:?}",
            got[0].status.as_ref().err()
        );
    }

    #[tokio::test]
    async fn a_local_only_put_without_its_writers_checksum_is_refused_and_aborted() {
        let (metad, store) = testing::local_store();
        let pending = PendingPuts::default();
        let t = begin_one(&store, &pending, item("k", 4096, 1)).await;
        let r = commit_one(&store, &pending, t.version, None, Region::Absent).await;
        assert_eq!(code(&r), Some(Code::InvalidArgument));
        assert_eq!(metad.aborts(), vec![(LEADER.to_string(), t.version)]);
        assert!(metad.commits().is_empty());
        assert!(store.tracker.in_flight().is_empty());
    }

    #[tokio::test]
    async fn a_remote_put_is_written_over_the_data_plane_and_checksummed_while_sent() {
        // A consumer-only node: no segment of its own.
        let (metad, store, peer) = testing::remote_store().await;
        let pending = PendingPuts::default();
        let data = testing::pattern(300_000, 2);

        let t = begin_one(&store, &pending, item("r", data.len() as u64, 1)).await;
        assert!(t.remote && t.local_extents.is_empty());
        let r = commit_one(
            &store,
            &pending,
            t.version,
            None,
            Region::Inline {
                data: bytes::Bytes::from(data.clone()),
                max_len: 0,
            },
        )
        .await;
        assert_eq!(r.status, Ok(()));
        let expected = checksum::checksum(t.version.seed(), &data);
        assert_eq!(
            metad.commits(),
            vec![(LEADER.to_string(), t.version, expected)]
        );

        let placed = metad.placements_of("r");
        let rep = &placed.replicas[0];
        assert!(
            testing::read_extents(&peer.segment, &rep.extents, data.len()) == data,
            "the bytes are in the holder's segment, at the reserved extents"
        );
        let got = get::get(&store, vec![inline_get("r")]).await;
        assert!(
            got[0].status == Ok(Delivery::Inline(data)),
            "{:?}",
            got[0].status.as_ref().err()
        );
    }

    #[tokio::test]
    async fn a_source_window_smaller_than_the_object_needs_space_and_aborts() {
        let (metad, store, _peer) = testing::remote_store().await;
        let pending = PendingPuts::default();
        let t = begin_one(&store, &pending, item("r", 8192, 1)).await;
        let staging = testing::segment("staging", 1 << 16);
        let r = commit_one(
            &store,
            &pending,
            t.version,
            None,
            Region::Mapped {
                seg: staging,
                offset: 0,
                len: 4096,
            },
        )
        .await;
        assert_eq!(code(&r), Some(Code::NeedSpace));
        assert_eq!(metad.aborts(), vec![(LEADER.to_string(), t.version)]);
    }

    #[tokio::test]
    async fn an_existing_key_answers_already_exists_and_a_stranger_version_is_refused() {
        let (_metad, store) = testing::local_store();
        let pending = PendingPuts::default();
        let first = begin(
            &store,
            7,
            &pending,
            vec![item("k", 10, 1), item("k", 10, 1)],
        )
        .await;
        assert!(first[0].is_ok());
        assert_eq!(
            first[1].as_ref().map_err(|f| f.code).err(),
            Some(Code::AlreadyExists)
        );
        let stranger = Version { term: 9, id: 9 };
        let r = commit_one(&store, &pending, stranger, Some(0), Region::Absent).await;
        assert_eq!(code(&r), Some(Code::InvalidArgument));
        assert!(r
            .status
            .as_ref()
            .unwrap_err()
            .message
            .contains("not pending"));
    }

    #[tokio::test]
    async fn a_commit_without_a_definite_answer_is_outcome_unknown() {
        let (metad, store) = testing::local_store();
        let pending = PendingPuts::default();
        let t = begin_one(&store, &pending, item("k", 10, 1)).await;
        let ck = testing::client_copy(&store.segment, &t.local_extents, t.version, &[7u8; 10]);
        *metad.fail_commit.lock() = Some(regolith_proto::Error::Rpc {
            addr: LEADER.into(),
            code: tonic::Code::DeadlineExceeded,
            message: String::new(),
        });
        let r = commit_one(&store, &pending, t.version, Some(ck), Region::Absent).await;
        assert_eq!(code(&r), Some(Code::Timeout));
        assert!(
            metad.aborts().is_empty(),
            "a commit that may have applied is not aborted"
        );
    }

    #[test]
    fn commit_failures_without_a_definite_answer_are_timeouts() {
        let rpc = |code| regolith_proto::Error::Rpc {
            addr: "m1:50051".into(),
            code,
            message: String::new(),
        };
        for e in [
            rpc(tonic::Code::DeadlineExceeded),
            rpc(tonic::Code::Unavailable),
            rpc(tonic::Code::Cancelled),
            regolith_proto::Error::NotLeader {
                addr: "m1:50051".into(),
                leader: None,
            },
        ] {
            assert_eq!(commit_failure(&e).code, Code::Timeout, "{e}");
        }
        assert_eq!(
            commit_failure(&rpc(tonic::Code::InvalidArgument)).code,
            Code::InvalidArgument
        );
        let never_sent = regolith_proto::Error::BadAddress {
            addr: "x".into(),
            reason: "bad".into(),
        };
        assert_eq!(commit_failure(&never_sent).code, Code::Unavailable);
    }

    #[tokio::test]
    async fn a_client_that_leaves_mid_put_has_its_reservations_aborted() {
        let (metad, store) = testing::local_store();
        let pending = PendingPuts::default();
        let t = begin(
            &store,
            7,
            &pending,
            vec![item("a", 10, 1), item("b", 10, 1)],
        )
        .await;
        assert_eq!(store.tracker.in_flight().len(), 2);
        abandon(&store, 7, &pending).await;
        let mut aborted: Vec<Version> = metad.aborts().into_iter().map(|(_, v)| v).collect();
        aborted.sort_by_key(|v| v.id);
        let mut begun: Vec<Version> = t.into_iter().map(|t| t.unwrap().version).collect();
        begun.sort_by_key(|v| v.id);
        assert_eq!(aborted, begun);
        assert!(store.tracker.in_flight().is_empty());
        assert!(pending.is_empty());
    }
}
