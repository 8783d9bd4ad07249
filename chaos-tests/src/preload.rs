//! A large state under the faults (issue 17): before the workload starts, a node of the
//! observer's own mounts a segment just large enough for N small objects, loads them with
//! concurrent batch reserves and commits, and heartbeats its segment until the run ends. Faults
//! then meet a state of N objects (snapshots built and installed, failovers, restarts of every
//! replica, a new member catching up) while the workload's keys and checks stay as they are:
//!
//! * the node lives in the observer's namespace, which no fault touches, so its segment is never
//!   declared dead and its objects never count among the dropped ones check (a) allows for;
//!   [`Preload::finish`] fails the run if the segment or its objects went away all the same;
//! * the segment is full once loaded, so no workload put is placed on it;
//! * it is loaded after the workload's hosts mounted their segments, so it is a small share of
//!   the pool, far below the eviction watermark (the metad-only workload's segments are large;
//!   the real sidecars' are not, which is why the CLI offers it with `metad-only` alone).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use regolith_proto::client::MetadClient;
use regolith_proto::metad as pb;

use crate::error::{Error, Result};
use crate::netns::NsRuntime;

/// Bytes per preloaded object (metadata only: nothing is written anywhere).
pub const OBJECT_SIZE: u64 = 64;
/// Node name of the preloading node.
pub const NODE_NAME: &str = "preload";
/// Room beyond the objects, for reservations of a retried batch not yet expired: once loaded,
/// the segment has far less free space than any other, so placement never picks it.
const SLACK: u64 = 64 << 10;
const WRITERS: u64 = 16;
const BATCH: u64 = 200;
const HEARTBEAT_EVERY: Duration = Duration::from_millis(300);

/// A loaded, heartbeating preload node.
pub struct Preload {
    pub objects: u64,
    pub load_secs: f64,
    node_id: u64,
    generation: u64,
    admin: MetadClient,
    stop: Arc<AtomicBool>,
}

/// Key of preloaded object `i` (never one of the workload's keys, which have no `/`).
pub fn key(i: u64) -> String {
    format!("preload/{i:09}")
}

impl Preload {
    /// Mounts, loads `n` objects and starts heartbeating, on `observer`. `admin` loads;
    /// `beats` heartbeats, with attempts short enough that a dead leader never costs a node TTL.
    pub fn start(
        observer: &NsRuntime,
        admin: MetadClient,
        beats: MetadClient,
        n: u64,
    ) -> Result<Self> {
        let t = Instant::now();
        let (a, b) = (admin.clone(), beats.clone());
        let (node_id, generation) = observer.run(async move { mount_and_load(&a, &b, n).await })?;
        let load_secs = t.elapsed().as_secs_f64();
        tracing::info!(objects = n, secs = load_secs, "preloaded");
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        observer.spawn(async move { heartbeat_until(&beats, node_id, generation, &s).await });
        Ok(Self {
            objects: n,
            load_secs,
            node_id,
            generation,
            admin,
            stop,
        })
    }

    /// Stops heartbeating; an error when the segment is no longer mounted under its generation
    /// or a preloaded key is gone.
    pub fn finish(&self, observer: &NsRuntime) -> Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        let (admin, n) = (self.admin.clone(), self.objects);
        let (segs, missing) = observer.run(async move {
            let segs = admin.list_segments().await?;
            Ok::<_, Error>((segs, missing_keys(&admin, n).await?))
        })?;
        if !segs
            .iter()
            .any(|s| s.node_id == self.node_id && s.generation == self.generation)
        {
            return Err(Error::Cluster(format!(
                "the preload segment (node {}, generation {}) is no longer mounted",
                self.node_id, self.generation
            )));
        }
        match missing.first() {
            None => Ok(()),
            Some(first) => Err(Error::Cluster(format!(
                "{} of {n} preloaded objects are gone (first: {})",
                missing.len(),
                key(*first)
            ))),
        }
    }
}

async fn mount_and_load(admin: &MetadClient, beats: &MetadClient, n: u64) -> Result<(u64, u64)> {
    let m = admin
        .mount(pb::MountSegmentRequest {
            node_name: NODE_NAME.into(),
            node_id: 0,
            capacity: n.max(1) * OBJECT_SIZE + SLACK,
            data_addrs: vec![format!("{}:7600", crate::netns::observer_addr(0))],
        })
        .await?;
    admin
        .heartbeat(pb::HeartbeatRequest {
            node_id: m.node_id,
            generation: m.generation,
            ..Default::default()
        })
        .await?;
    // Heartbeats while loading: a long load must not outlive the node TTL.
    let stop = Arc::new(AtomicBool::new(false));
    let beat = {
        let (a, stop) = (beats.clone(), stop.clone());
        let (node, generation) = (m.node_id, m.generation);
        tokio::spawn(async move { heartbeat_until(&a, node, generation, &stop).await })
    };
    let loaded = load_all(admin, m.node_id, n).await;
    stop.store(true, Ordering::Relaxed);
    let _ = beat.await;
    loaded.map(|()| (m.node_id, m.generation))
}

/// Loads keys `0..n`; then, for as long as the segment holds fewer (a batch whose reply was
/// lost after its reservations, which answer "already exists" to the retry and expire
/// unused), waits out the reservations and loads the keys still missing.
async fn load_all(admin: &MetadClient, node: u64, n: u64) -> Result<()> {
    let keys: Vec<u64> = (0..n).collect();
    load_keys(admin, node, Arc::new(keys)).await?;
    for _ in 0..3 {
        let missing = missing_keys(admin, n).await?;
        if missing.is_empty() {
            return Ok(());
        }
        tracing::info!(
            missing = missing.len(),
            "preload: loading the keys still missing"
        );
        tokio::time::sleep(RESERVATION_WAIT).await;
        load_keys(admin, node, Arc::new(missing)).await?;
    }
    match missing_keys(admin, n).await?.len() {
        0 => Ok(()),
        m => Err(Error::Cluster(format!(
            "preload: {m} of {n} objects still missing after three passes"
        ))),
    }
}

/// Longer than the chaos runs' put timeout (5 s) plus a heartbeat that releases quarantine.
const RESERVATION_WAIT: Duration = Duration::from_secs(7);

async fn load_keys(admin: &MetadClient, node: u64, keys: Arc<Vec<u64>>) -> Result<()> {
    let next = Arc::new(AtomicU64::new(0));
    let writers: Vec<_> = (0..WRITERS)
        .map(|_| {
            let (a, next, keys) = (admin.clone(), next.clone(), keys.clone());
            tokio::spawn(async move { load_share(&a, node, &next, &keys).await })
        })
        .collect();
    let mut failed = None;
    for w in writers {
        match w.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failed = Some(e),
            Err(e) => failed = Some(Error::Cluster(format!("preload writer: {e}"))),
        }
    }
    failed.map_or(Ok(()), Err)
}

async fn missing_keys(admin: &MetadClient, n: u64) -> Result<Vec<u64>> {
    let mut missing = Vec::new();
    let mut from = 0;
    while from < n {
        let to = (from + 1000).min(n);
        let found = admin.batch_exists((from..to).map(key).collect()).await?;
        missing.extend((from..to).zip(found).filter(|(_, f)| !f).map(|(i, _)| i));
        from = to;
    }
    Ok(missing)
}

/// Heartbeats the segment until `stop`, releasing what the leader quarantined (reservations
/// of lost batches: nothing was written under them). Every beat goes to every replica: the
/// observer sees both sides of a partition, and a deposed leader cut off in a minority still
/// answers heartbeats, so a client that keeps to the leader it knows could feed that one alone
/// while the majority's leader declares the node dead.
async fn heartbeat_until(admin: &MetadClient, node_id: u64, generation: u64, stop: &AtomicBool) {
    let mut released = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let hb = pb::HeartbeatRequest {
            node_id,
            generation,
            released: std::mem::take(&mut released),
            ..Default::default()
        };
        let beats: Vec<_> = admin
            .addrs()
            .iter()
            .map(|addr| {
                let (a, addr, hb) = (admin.clone(), addr.clone(), hb.clone());
                tokio::spawn(async move {
                    let call = a.call_at(&addr, |mut c| async move { c.heartbeat(hb).await });
                    tokio::time::timeout(HEARTBEAT_EVERY * 3, call).await
                })
            })
            .collect();
        for b in beats {
            if let Ok(Ok(Ok(r))) = b.await {
                released.extend(r.quarantined);
            }
        }
        released.sort_by_key(|v| (v.term, v.id));
        released.dedup_by_key(|v| (v.term, v.id));
        tokio::time::sleep(HEARTBEAT_EVERY).await;
    }
}

/// Loads batches of `BATCH` of `keys` until every batch is taken; a failed batch is retried
/// (keys a lost reply committed answer "already exists" and are skipped), up to a deadline.
async fn load_share(admin: &MetadClient, node: u64, next: &AtomicU64, keys: &[u64]) -> Result<()> {
    loop {
        let from = next.fetch_add(BATCH, Ordering::Relaxed) as usize;
        if from >= keys.len() {
            return Ok(());
        }
        let batch = &keys[from..(from + BATCH as usize).min(keys.len())];
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match load_batch(admin, node, batch).await {
                Ok(()) => break,
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }
}

async fn load_batch(admin: &MetadClient, node: u64, batch: &[u64]) -> Result<()> {
    let items = batch
        .iter()
        .map(|&i| pb::ReserveRequest {
            key: key(i),
            size: OBJECT_SIZE,
            options: Some(regolith_proto::common::PutOptions {
                preferred_segments: vec![NODE_NAME.into()],
                prefer_local: true,
                ..Default::default()
            }),
            requester_node_id: node,
        })
        .collect();
    let (r, addr) = admin
        .batch_reserve(pb::BatchReserveRequest { items })
        .await?;
    let already = pb::Code::AlreadyExists as i32;
    if let Some(bad) = r.items.iter().find(|x| {
        x.status
            .as_ref()
            .is_some_and(|s| s.code != 0 && s.code != already)
    }) {
        return Err(Error::Cluster(format!("preload reserve refused: {bad:?}")));
    }
    let commits: Vec<_> = r
        .items
        .iter()
        .filter_map(|x| x.reservation.as_ref())
        .map(|res| pb::CommitRequest {
            version: res.version,
            checksum: 1,
        })
        .collect();
    if commits.is_empty() {
        return Ok(());
    }
    let c = admin
        .batch_commit_at(&addr, pb::BatchCommitRequest { items: commits })
        .await?;
    match c
        .items
        .iter()
        .find(|x| x.status.as_ref().is_some_and(|s| s.code != 0))
    {
        Some(bad) => Err(Error::Cluster(format!("preload commit refused: {bad:?}"))),
        None => Ok(()),
    }
}
