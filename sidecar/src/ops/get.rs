//! Gets (design §5): placements from the leader (with read leases), then either the local
//! extents for the client to copy itself, or a private copy read from the best replica into
//! the client's region (or inline), verified against the version-seeded checksum; a replica
//! that fails it is skipped for the next.

use std::sync::atomic::{AtomicU64, Ordering};

use futures::future::join_all;
use regolith_proto::checksum;
use regolith_proto::common::{Extent, Version};
use regolith_proto::metad as mpb;
use regolith_proto::uds::{pb::Code, MAX_INLINE};

use super::{metad_failure, Failure, Outcome, Placement, Region, Replica, Store, MAX_ITEMS};

/// Whether reading `rep` failed because it is a disk replica whose record is gone.
fn record_gone(rep: &Replica, e: &crate::error::Error) -> bool {
    regolith_proto::disk_tier::disk_of(rep.generation).is_some()
        && (matches!(e, crate::error::Error::DiskRecordGone { .. })
            || e.status() == Some(regolith_proto::dataplane::Status::BadGeneration))
}

/// One key to get.
#[derive(Clone)]
pub struct GetItem {
    pub key: String,
    /// Where the bytes go; [`Region::Absent`] or [`Region::Inline`]: in the reply.
    pub dest: Region,
    /// The client maps the segment and takes the local extents when there is a local replica.
    pub local_ok: bool,
    /// The client found the local copy corrupt: count it and read another replica.
    pub report_mismatch: bool,
    /// The version of the copy the client found corrupt, when it says (an index placement
    /// of a reused extent is then told from corruption).
    pub mismatched_version: Option<Version>,
}

/// What the client needs to know of an object it asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Found {
    pub version: Version,
    pub size: u64,
    pub checksum: u64,
}

/// How the bytes reach the client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// The client copies them out of its mapped segment (and verifies the checksum).
    Local(Vec<Extent>),
    /// In the reply.
    Inline(Vec<u8>),
    /// Written into the client's region, verified.
    Delivered,
}

/// One key's outcome: what was found (none when the key is not readable at all) and how it
/// was delivered, or why not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GetResult {
    pub found: Option<Found>,
    pub status: Outcome<Delivery>,
}

impl GetResult {
    fn failed(f: Failure) -> Self {
        GetResult {
            found: None,
            status: Err(f),
        }
    }
}

/// Gets every item; one result each, in order. Placements come from the node's index where it
/// has them (no metad round trip, no lease), else from the leader with a read lease. An indexed
/// placement is only a hint: when its bytes do not verify (the object was evicted and its
/// space reused) or cannot be read, the item is retried with the leader's placement, so a get
/// never returns bytes other than those put under the key (design §3, invariant 4).
pub async fn get(store: &Store, items: Vec<GetItem>) -> Vec<GetResult> {
    let n = items.len();
    if n == 0 || n > MAX_ITEMS {
        let f = Failure::invalid(format!("{n} items; 1..={MAX_ITEMS} per request"));
        return vec![GetResult::failed(f); n];
    }
    let budget = InlineBudget::new(MAX_INLINE_REPLY);
    let budget = &budget;
    let indexed = indexed_placements(store, &items);
    let mut results: Vec<Option<GetResult>> = vec![None; n];
    let work = items
        .iter()
        .zip(indexed)
        .enumerate()
        .filter_map(|(i, (it, p))| {
            let p = p?;
            Some(async move { (i, try_indexed(store, it, p, budget).await) })
        });
    for (i, r) in join_all(work).await {
        results[i] = r;
    }
    let ask: Vec<usize> = (0..n).filter(|&i| results[i].is_none()).collect();
    if !ask.is_empty() {
        let asked: Vec<GetItem> = ask.iter().map(|&i| items[i].clone()).collect();
        for (i, r) in ask
            .into_iter()
            .zip(get_from_leader(store, &asked, budget).await)
        {
            results[i] = Some(r);
        }
    }
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| GetResult::failed(Failure::new(Code::Internal, "no outcome"))))
        .collect()
}

/// The indexed placement of each item the index may answer for; none for items that report
/// a mismatch (those ask the leader, which tells a stale index from corruption).
fn indexed_placements(store: &Store, items: &[GetItem]) -> Vec<Option<Placement>> {
    let keys: Vec<&str> = items.iter().map(|i| i.key.as_str()).collect();
    let Some(found) = store.index.placements(&keys) else {
        return vec![None; items.len()];
    };
    items
        .iter()
        .zip(found)
        .map(|(it, p)| p.filter(|_| !it.report_mismatch))
        .collect()
}

/// One item through its indexed placement: its result, or None when the leader must be asked
/// (the bytes did not verify or could not be read).
async fn try_indexed(
    store: &Store,
    it: &GetItem,
    p: Placement,
    budget: &InlineBudget,
) -> Option<GetResult> {
    let version = p.version;
    let r = get_one(store, it, p, Source::Index, budget).await;
    match &r.status {
        Err(f) if matches!(f.code, Code::Corrupt | Code::Unavailable) => {
            store
                .metrics
                .index_stale_reads
                .with_label_values(&["read"])
                .inc();
            store.index.forget(&it.key, version);
            None
        }
        _ => {
            store.count_answers("get", "index", 1);
            store.index.note_access(&it.key);
            Some(r)
        }
    }
}

/// Gets items with the leader's placements (read leases granted).
async fn get_from_leader(
    store: &Store,
    items: &[GetItem],
    budget: &InlineBudget,
) -> Vec<GetResult> {
    let n = items.len();
    store.count_answers("get", "metad", n);
    let keys = items.iter().map(|i| i.key.clone()).collect();
    let placements = match store.metad.placements(keys, store.node_id()).await {
        Ok(p) if p.len() == n => p,
        Ok(_) => {
            let f = Failure::new(
                Code::Internal,
                "metad answered the wrong number of placements",
            );
            return vec![GetResult::failed(f); n];
        }
        Err(e) => return vec![GetResult::failed(metad_failure(&e)); n],
    };
    let work = items.iter().zip(placements).map(|(it, p)| async move {
        match p {
            Ok(p) => get_one(store, it, p, Source::Leader, budget).await,
            Err(r) => {
                if it.report_mismatch && r.code == mpb::Code::NotFound {
                    // The client read a key that is gone: reused space, not damage.
                    stale_client_read(store, it);
                }
                GetResult::failed(Failure::from(&r))
            }
        }
    });
    join_all(work).await
}

/// What the inline values of one GET may add up to: the reply must fit one UDS frame
/// (64 MiB), and building more only to refuse it at the end spent memory for nothing
/// (finding 6 of the hardening review: one GET of 4,096 inline items built 1.2 GB first).
/// Items past the budget answer NEED_SPACE, as a too-small buffer does.
pub const MAX_INLINE_REPLY: u64 = 48 << 20;

/// Bytes of inline values a request still may carry.
struct InlineBudget(AtomicU64);

impl InlineBudget {
    fn new(bytes: u64) -> Self {
        Self(AtomicU64::new(bytes))
    }

    /// Takes `n` bytes if that many are left.
    fn take(&self, n: u64) -> bool {
        self.0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                left.checked_sub(n)
            })
            .is_ok()
    }

    /// Returns `n` bytes taken for a read that then failed (the item may be retried).
    fn give_back(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
}

/// Where a placement came from.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Source {
    Index,
    Leader,
}

async fn get_one(
    store: &Store,
    it: &GetItem,
    p: Placement,
    src: Source,
    budget: &InlineBudget,
) -> GetResult {
    let found = Found {
        version: p.version,
        size: p.size,
        checksum: p.checksum,
    };
    GetResult {
        found: Some(found),
        status: deliver(store, it, &p, src, budget).await,
    }
}

async fn deliver(
    store: &Store,
    it: &GetItem,
    p: &Placement,
    src: Source,
    budget: &InlineBudget,
) -> Outcome<Delivery> {
    // Whether the local copy is known bad: a client's report about a version this placement
    // no longer has is a stale index, not damage.
    let local_bad = it.report_mismatch && report_client_mismatch(store, it, p);
    let local = p.replicas.iter().find(|r| store.is_local(r));
    // A report that turned out stale lets the client copy the (current) local replica again.
    let local_ok = it.local_ok || (it.report_mismatch && !local_bad);
    if let (Some(l), true, false) = (local, local_ok, local_bad) {
        served(store, p.size);
        return Ok(Delivery::Local(l.extents.clone()));
    }
    let candidates: Vec<&Replica> = p
        .replicas
        .iter()
        .filter(|r| !(local_bad && store.is_local(r)))
        .collect();
    let inline_max = match &it.dest {
        Region::Absent => Some(MAX_INLINE),
        Region::Inline { max_len, .. } => Some((*max_len).min(MAX_INLINE)),
        _ => None,
    };
    let mut reader = Reader::new(store, &it.key, p, src);
    if let Some(max) = inline_max {
        if p.size > max {
            return Err(Failure::new(
                Code::NeedSpace,
                format!("{} bytes do not fit inline", p.size),
            ));
        }
        if !budget.take(p.size) {
            return Err(Failure::new(
                Code::NeedSpace,
                format!(
                    "the inline replies of one request may carry {MAX_INLINE_REPLY} bytes together; \
                     ask for fewer keys at once or give a buffer"
                ),
            ));
        }
        let mut buf = vec![0u8; p.size as usize];
        if !reader.read_verified(&candidates, &mut buf).await {
            budget.give_back(p.size);
            return Err(reader.failure(local_bad));
        }
        return Ok(Delivery::Inline(buf));
    }
    let (seg, off) = it.dest.window(p.size)?;
    // SAFETY: `slice_mut` bounds-checks against the client's mapping, which `seg` keeps
    // alive; the client does not touch this window until the reply arrives.
    let dst = unsafe { seg.slice_mut(off, p.size) }.map_err(|e| Failure::invalid(e.to_string()))?;
    if !reader.read_verified(&candidates, dst).await {
        return Err(reader.failure(local_bad));
    }
    Ok(Delivery::Delivered)
}

/// The client found the local copy it was given corrupt. With the version it read, a
/// placement the index gave (no lease: the space may have been reused since) is told from
/// corruption: only when the leader still has that very version were the bytes damaged.
/// Answers whether they were.
fn report_client_mismatch(store: &Store, it: &GetItem, p: &Placement) -> bool {
    match it.mismatched_version {
        Some(v) if v != p.version => {
            stale_client_read(store, it);
            false
        }
        _ => {
            store.metrics.checksum_mismatches.inc();
            tracing::warn!(key = %it.key, "a client found the local copy corrupt");
            true
        }
    }
}

/// A client's local copy did not verify because the index's placement was stale.
fn stale_client_read(store: &Store, it: &GetItem) {
    store
        .metrics
        .index_stale_reads
        .with_label_values(&["client"])
        .inc();
    if let Some(v) = it.mismatched_version {
        store.index.forget(&it.key, v);
    }
    tracing::debug!(key = %it.key, "a client read a reused extent through the index");
}

fn served(store: &Store, size: u64) {
    store.gets.fetch_add(1, Ordering::Relaxed);
    store.metrics.get_bytes.inc_by(size);
}

/// Reads one object from its replicas in turn until one passes its checksum, remembering why
/// the others failed.
struct Reader<'a> {
    store: &'a Store,
    key: &'a str,
    p: &'a Placement,
    src: Source,
    mismatched: bool,
    /// Replicas tried, and those that were disk replicas whose record is gone.
    tried: usize,
    gone: usize,
    last_err: String,
}

impl<'a> Reader<'a> {
    fn new(store: &'a Store, key: &'a str, p: &'a Placement, src: Source) -> Self {
        Reader {
            store,
            key,
            p,
            src,
            mismatched: false,
            tried: 0,
            gone: 0,
            last_err: String::from("no replica to read"),
        }
    }

    /// Fills `dst` (exactly the object's size) from the first replica whose bytes verify;
    /// answers whether one did.
    async fn read_verified(&mut self, candidates: &[&Replica], dst: &mut [u8]) -> bool {
        let seed = self.p.version.seed();
        let mut hashes = vec![0u64; checksum::chunk_count(self.p.size)];
        for rep in candidates {
            match self
                .store
                .read_replica(rep, self.p.version, dst, &mut hashes)
                .await
            {
                Ok(()) if checksum::combine(seed, &hashes) == self.p.checksum => {
                    served(self.store, self.p.size);
                    return true;
                }
                Ok(()) if self.src == Source::Index => {
                    // Without a lease the space may have been reused: not corruption, a
                    // stale placement (the caller asks the leader).
                    self.mismatched = true;
                    return false;
                }
                Ok(()) => {
                    self.mismatched = true;
                    self.store.metrics.checksum_mismatches.inc();
                    tracing::warn!(key = self.key, node = %rep.node_name, "checksum mismatch: trying the next replica");
                }
                Err(e) => {
                    if record_gone(rep, &e) {
                        self.gone += 1;
                    }
                    self.last_err = format!("{}: {e}", rep.node_name);
                }
            }
            self.tried += 1;
        }
        false
    }

    /// Why no replica could be delivered (counted as a failed get, unless the placement was
    /// the index's and the leader is asked next).
    fn failure(&self, reported_mismatch: bool) -> Failure {
        let f = self.explain(reported_mismatch);
        if self.src == Source::Leader {
            self.store.count_error("get", f.code);
        }
        f
    }

    fn explain(&self, reported_mismatch: bool) -> Failure {
        if self.mismatched || reported_mismatch {
            Failure::new(
                Code::Corrupt,
                "the bytes failed their checksum on every replica",
            )
        } else if self.tried > 0 && self.gone == self.tried {
            // The object is gone from the cache (its disk evicted it; metad drops it once
            // the node reports it): a miss, not an outage.
            Failure::new(
                Code::NotFound,
                format!("{:?} is no longer cached: {}", self.key, self.last_err),
            )
        } else {
            Failure::new(
                Code::Unavailable,
                format!("no replica could be read: {}", self.last_err),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::put::{self, BeginItem, CommitItem, PendingPuts};
    use crate::ops::testing;

    /// A store on the local node holding `key` (`len` bytes of pattern `salt`), put the way a
    /// client puts a local replica.
    async fn stored(key: &str, len: usize, salt: u8) -> (Store, Vec<u8>) {
        let (_metad, store) = testing::local_store();
        let pending = PendingPuts::default();
        let data = testing::pattern(len, salt);
        let item = BeginItem {
            key: key.into(),
            size: len as u64,
            options: Default::default(),
        };
        let t = put::begin(&store, 1, &pending, vec![item])
            .await
            .remove(0)
            .unwrap();
        let ck = testing::client_copy(&store.segment, &t.local_extents, t.version, &data);
        let commit = CommitItem {
            version: t.version,
            checksum: Some(ck),
            source: Region::Absent,
        };
        let r = put::commit(&store, &pending, vec![commit]).await;
        assert_eq!(r[0].status, Ok(()));
        (store, data)
    }

    fn item(key: &str, dest: Region, local_ok: bool) -> GetItem {
        GetItem {
            key: key.into(),
            dest,
            local_ok,
            report_mismatch: false,
            mismatched_version: None,
        }
    }

    fn code<T>(o: &Outcome<T>) -> Option<Code> {
        o.as_ref().err().map(|f| f.code)
    }

    #[tokio::test]
    async fn a_local_replica_is_handed_to_a_client_that_maps_the_segment() {
        let (store, data) = stored("k", 200_000, 3).await;
        let got = get(&store, vec![item("k", Region::Absent, true)]).await;
        let Ok(Delivery::Local(extents)) = &got[0].status else {
            panic!("not local: {:?}", got[0].status.as_ref().err());
        };
        assert!(testing::read_extents(&store.segment, extents, data.len()) == data);
        let found = got[0].found.unwrap();
        assert_eq!(found.size, data.len() as u64);
        assert_eq!(
            found.checksum,
            checksum::checksum(found.version.seed(), &data)
        );
        assert_eq!(store.gets.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn a_copy_is_delivered_into_the_clients_region_verified() {
        let (store, data) = stored("k", 200_000, 4).await;
        let staging = testing::segment("staging", 1 << 20);
        let dest = Region::Mapped {
            seg: staging.clone(),
            offset: 4096,
            len: 300_000,
        };
        let got = get(&store, vec![item("k", dest, false)]).await;
        assert_eq!(got[0].status, Ok(Delivery::Delivered));
        let window = [regolith_proto::common::Extent {
            offset: 4096,
            len: data.len() as u64,
        }];
        assert!(testing::read_extents(&staging, &window, data.len()) == data);
    }

    #[tokio::test]
    async fn corrupt_bytes_are_a_miss_never_data() {
        let (store, _) = stored("k", 100_000, 5).await;
        // SAFETY: the test's own segment; the object starts at offset 0 in the double.
        unsafe { store.segment.slice_mut(10, 1) }.unwrap()[0] ^= 0xff;
        let got = get(&store, vec![item("k", Region::Absent, false)]).await;
        assert_eq!(code(&got[0].status), Some(Code::Corrupt));
        assert_eq!(store.metrics.checksum_mismatches.get(), 1);
        assert_eq!(store.gets.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn missing_keys_small_windows_and_bad_regions_fail_per_item() {
        let (store, _) = stored("k", 100_000, 6).await;
        let small = Region::Inline {
            data: Default::default(),
            max_len: 1000,
        };
        let staging = testing::segment("staging", 1 << 16);
        let short = Region::Mapped {
            seg: staging,
            offset: 0,
            len: 10,
        };
        let got = get(
            &store,
            vec![
                item("absent", Region::Absent, false),
                item("k", small, false),
                item("k", short, false),
                item(
                    "k",
                    Region::Invalid(Failure::invalid("no registered buffer 9")),
                    false,
                ),
            ],
        )
        .await;
        assert_eq!(code(&got[0].status), Some(Code::NotFound));
        assert!(got[0].found.is_none());
        assert_eq!(code(&got[1].status), Some(Code::NeedSpace));
        assert_eq!(
            got[1].found.map(|f| f.size),
            Some(100_000),
            "the size tells how much room"
        );
        assert_eq!(code(&got[2].status), Some(Code::NeedSpace));
        assert_eq!(code(&got[3].status), Some(Code::InvalidArgument));
    }

    /// Finding 6 (issue 14): one GET of 4,096 inline items built 1.2 GB of replies before the
    /// 64 MiB frame cap refused the whole reply.
    #[tokio::test]
    async fn finding_6_inline_values_of_one_get_stay_within_the_reply_budget() {
        let (store, data) = stored("k", 1 << 20, 8).await;
        let n = (MAX_INLINE_REPLY >> 20) as usize + 10;
        let got = get(&store, vec![item("k", Region::Absent, false); n]).await;
        let inline: Vec<&Vec<u8>> = got
            .iter()
            .filter_map(|g| match &g.status {
                Ok(Delivery::Inline(b)) => Some(b),
                _ => None,
            })
            .collect();
        assert_eq!(inline.len() as u64, MAX_INLINE_REPLY >> 20);
        assert!(inline.iter().all(|b| **b == data));
        let refused: Vec<&GetResult> = got
            .iter()
            .filter(|g| code(&g.status) == Some(Code::NeedSpace))
            .collect();
        assert_eq!(refused.len(), 10);
        let f = refused[0].status.as_ref().unwrap_err();
        assert!(f.message.contains("fewer keys"), "{}", f.message);
    }

    /// A disk replica metad still lists whose record the disk already dropped (its own
    /// eviction races the drop's commit): a miss, whether the disk is this node's or a peer's.
    #[tokio::test]
    async fn a_disk_replica_whose_record_is_gone_is_a_miss_not_an_outage() {
        let disk_gen = regolith_proto::disk_tier::disk_generation(0);
        let gone = |node_id: u64, data_addrs| super::super::metad::Placement {
            version: Version { term: 2, id: 9 },
            size: 4096,
            checksum: 1,
            replicas: vec![super::super::metad::Replica {
                node_id,
                generation: disk_gen,
                node_name: format!("n{node_id}"),
                data_addrs,
                extents: vec![Extent {
                    offset: 0,
                    len: 4096,
                }],
                grants: vec![],
            }],
        };
        let (metad, store) = testing::local_store();
        metad.set_object("k", gone(testing::LOCAL, vec![]));
        let got = get(&store, vec![item("k", Region::Absent, false)]).await;
        assert_eq!(code(&got[0].status), Some(Code::NotFound), "{:?}", got[0]);

        let (metad, store, peer) = testing::remote_store().await;
        metad.set_object("k", gone(2, peer.addrs.clone()));
        let got = get(&store, vec![item("k", Region::Absent, false)]).await;
        assert_eq!(code(&got[0].status), Some(Code::NotFound), "{:?}", got[0]);
    }

    #[tokio::test]
    async fn batches_out_of_bounds_are_refused_whole() {
        let (store, _) = stored("k", 10, 7).await;
        assert!(get(&store, vec![]).await.is_empty());
        let many = vec![item("k", Region::Absent, false); MAX_ITEMS + 1];
        let got = get(&store, many).await;
        assert_eq!(got.len(), MAX_ITEMS + 1);
        assert!(got
            .iter()
            .all(|g| code(&g.status) == Some(Code::InvalidArgument)));
    }
}
