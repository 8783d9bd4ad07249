//! The node's side of the disk tier with metad (design §6 "Tiers", docs/ssd.md): offload
//! orders from heartbeat replies are copied from the segment to a disk and reported (copy
//! orders of write-through too, the memory kept); promotions are read from a disk into the
//! memory metad reserved for them and reported; the disks' drops (their own eviction,
//! damaged records, a failed disk) are reported; after a start the disks' inventory is
//! reported, and records metad does not list are deleted.

use std::sync::Arc;
use std::time::{Duration, Instant};

use regolith_proto::common::Version;
use regolith_proto::metad as mpb;
use regolith_proto::shutdown::Shutdown;
use tokio::sync::mpsc;

use crate::disk::tier::PROBE_INTERVAL;
use crate::disk::{Disk, Dropped, WriteItem, Written};
use crate::node::Sidecar;

/// Bytes copied to disk per write batch, at most.
const BATCH_BYTES: u64 = 64 << 20;
/// How often orders are asked for while offload is active, and how long it stays so after
/// the last orders.
const POLL: Duration = Duration::from_millis(100);
const ACTIVE_FOR: Duration = Duration::from_secs(5);
/// Attempts of a report beyond the first.
const REPORT_RETRIES: usize = 5;
/// Items per inventory report.
const INVENTORY_CHUNK: usize = 16_384;

/// A connection id no client has: the tracker lists the sidecar's own promotions under it.
const PROMOTION_CONN: u64 = u64::MAX;
/// Disk hits ask metad for the promotions they caused at most this often.
const HIT_POLL: Duration = Duration::from_millis(20);

/// What metad asked of the disk tier (a heartbeat reply, a report's answer).
#[derive(Debug, Default)]
pub struct Orders {
    pub offload: Vec<mpb::OffloadOrder>,
    pub promote: Vec<mpb::PromoteOrder>,
}

impl Orders {
    pub fn is_empty(&self) -> bool {
        self.offload.is_empty() && self.promote.is_empty()
    }
}

/// What one round of the disk tier did.
#[derive(Default)]
struct Done {
    moved: Vec<mpb::DiskItem>,
    copied: Vec<mpb::DiskItem>,
    failed: Vec<mpb::DiskItem>,
    dropped: Vec<Dropped>,
    promoted: Vec<Version>,
    promote_failed: Vec<Version>,
}

impl Done {
    fn is_empty(&self) -> bool {
        self.moved.is_empty()
            && self.copied.is_empty()
            && self.failed.is_empty()
            && self.dropped.is_empty()
            && self.promoted.is_empty()
            && self.promote_failed.is_empty()
    }
}

fn item(key: &str, version: Version, disk: u32) -> mpb::DiskItem {
    mpb::DiskItem {
        key: key.to_string(),
        version: Some(version),
        disk,
    }
}

/// Runs the disk tier's upkeep and offloads until shutdown; nothing without disks.
pub async fn run(side: Arc<Sidecar>, mut orders: mpsc::UnboundedReceiver<Orders>, stop: Shutdown) {
    if side.disks.is_empty() {
        return;
    }
    reconcile(&side, &stop).await;
    let mut upkeep = tokio::time::interval(PROBE_INTERVAL);
    upkeep.tick().await;
    let mut poll = tokio::time::interval(POLL);
    // While the leader is ordering offloads, orders are asked for every POLL rather than
    // waited for with the next heartbeat (a second apart).
    let mut active_until = Instant::now();
    let mut last_hit_poll = Instant::now();
    loop {
        tokio::select! {
            _ = stop.wait() => return,
            o = orders.recv() => {
                let Some(mut o) = o else { return };
                // The leader answers a report with more orders while usage is high.
                while !o.is_empty() && !stop.is_shutdown() {
                    if !o.offload.is_empty() {
                        active_until = Instant::now() + ACTIVE_FOR;
                    }
                    o = carry_out(&side, o).await;
                }
            }
            _ = poll.tick(), if Instant::now() < active_until => {
                report_and_queue(&side, Done::default(), true).await;
            }
            // A disk-only object was read here: the leader ordered its promotion with the
            // get's placement; fetch it now rather than with the next heartbeat.
            _ = side.disks.hits.notified() => {
                let wait = HIT_POLL.saturating_sub(last_hit_poll.elapsed());
                tokio::time::sleep(wait).await;
                last_hit_poll = Instant::now();
                report_and_queue(&side, Done::default(), true).await;
            }
            // A disk failed: metad drops its objects now, not with the next upkeep round
            // (meanwhile it would still send gets to replicas that are gone).
            _ = side.disks.failures.notified() => {
                let dropped = side.disks.take_lost();
                report_and_queue(&side, Done { dropped, ..Done::default() }, false).await;
            }
            _ = upkeep.tick() => {
                let t = side.disks.clone();
                let dropped = tokio::task::spawn_blocking(move || t.upkeep())
                    .await
                    .unwrap_or_default();
                report_and_queue(&side, Done { dropped, ..Done::default() }, false).await;
            }
        }
    }
}

/// Reports to metad and queues the further orders it answers with.
async fn report_and_queue(side: &Sidecar, done: Done, poll: bool) {
    let more = report(side, done, poll).await;
    if !more.is_empty() {
        let _ = side.offload_tx.send(more);
    }
}

/// Carries out orders; answers the next ones the leader gave with its reply.
async fn carry_out(side: &Arc<Sidecar>, orders: Orders) -> Orders {
    let Orders { offload, promote } = orders;
    let promote = admit_promotions(side, promote).await;
    let tracked: Vec<Version> = promote.iter().filter_map(|p| p.reservation).collect();
    let s = side.clone();
    let done = tokio::task::spawn_blocking(move || {
        let mut done = copy_to_disk(&s, &offload);
        promote_all(&s, &promote, &mut done);
        done
    })
    .await
    .unwrap_or_default();
    let more = report(side, done, true).await;
    // The bytes are written (or never were): whatever metad answered, nothing more goes
    // into these extents, so they need not be listed as in flight any longer.
    for v in tracked {
        side.store.tracker.untrack_local(v);
    }
    more
}

/// The promotions this node may carry out, tracked as in flight (so that a new leader holds
/// their extents): each is tracked under the heartbeat gate, and kept only when no newer
/// term was seen and metad has not quarantined it. A newer leader may have heard a heartbeat
/// that did not list it, and may have placed other objects there.
async fn admit_promotions(
    side: &Arc<Sidecar>,
    promote: Vec<mpb::PromoteOrder>,
) -> Vec<mpb::PromoteOrder> {
    if promote.is_empty() {
        return promote;
    }
    let _gate = side.hb_gate.lock().await;
    let tracker = &side.store.tracker;
    promote
        .into_iter()
        .filter(|p| {
            let Some(v) = p.reservation else { return false };
            tracker.track_local(v, PROMOTION_CONN, p.extents.clone());
            let ok = v.term >= tracker.highest_term() && !tracker.is_fenced(v);
            if !ok {
                tracker.untrack_local(v);
            }
            ok
        })
        .collect()
}

/// Reads each promoted object from its disk into the memory reserved for it (blocking).
fn promote_all(side: &Sidecar, promote: &[mpb::PromoteOrder], done: &mut Done) {
    for p in promote {
        let Some(v) = p.reservation else { continue };
        match promote_one(side, p) {
            Ok(()) => done.promoted.push(v),
            Err(why) => {
                tracing::debug!(key = %p.key, why, "promotion not done");
                done.promote_failed.push(v);
            }
        }
    }
}

/// One promotion: the record of the object's version, verified, into the reserved extents.
fn promote_one(side: &Sidecar, p: &mpb::PromoteOrder) -> Result<(), String> {
    let version = p.version.ok_or("no version")?;
    let reserved: u64 = p.extents.iter().map(|e| e.len).sum();
    if reserved < p.size {
        return Err(format!("{reserved} bytes reserved for {}", p.size));
    }
    let (disk, key) = side
        .disks
        .holder(&version, Some(p.disk))
        .ok_or("no record of that version")?;
    if key != p.key {
        return Err(format!("the record of that version is {key:?}"));
    }
    let mut buf = vec![0u8; p.size as usize];
    match disk.read(&key, Some(version), &mut buf) {
        Ok(crate::disk::ReadOutcome::Hit { .. }) => {}
        Ok(other) => return Err(format!("{other:?}")),
        Err(e) => return Err(e.to_string()),
    }
    // `read` verified the bytes against the record's checksum; metad's must match too.
    let seed = version.seed();
    if regolith_proto::checksum::checksum(seed, &buf) != p.checksum {
        return Err("the record does not match the object's checksum".into());
    }
    let mut off = 0usize;
    for e in &p.extents {
        if off == buf.len() {
            break;
        }
        let n = (e.len as usize).min(buf.len() - off);
        // SAFETY: `slice_mut` bounds-checks against the segment; the extents are this
        // promotion's reservation, tracked as in flight, which nothing else writes.
        let dst = unsafe { side.store.segment.slice_mut(e.offset, n as u64) }
            .map_err(|e| e.to_string())?;
        dst.copy_from_slice(&buf[off..off + n]);
        off += n;
    }
    side.metrics.disk_promotions.inc();
    Ok(())
}

/// The disk in service with the most room.
fn pick_disk(side: &Sidecar) -> Option<(u32, Arc<Disk>)> {
    side.disks
        .numbered()
        .max_by_key(|(_, d)| {
            let u = d.usage();
            u.capacity.saturating_sub(u.live)
        })
        .map(|(i, d)| (i, d.clone()))
}

/// Copies the ordered objects from the segment to a disk, in batches (blocking).
fn copy_to_disk(side: &Sidecar, orders: &[mpb::OffloadOrder]) -> Done {
    let mut done = Done::default();
    let Some((n, disk)) = pick_disk(side) else {
        for o in orders {
            if let Some(v) = o.version {
                done.failed.push(item(&o.key, v, 0));
            }
        }
        return done;
    };
    let mut start = 0;
    while start < orders.len() {
        let mut end = start;
        let mut bytes = 0;
        while end < orders.len() && (end == start || bytes + orders[end].size <= BATCH_BYTES) {
            bytes += orders[end].size;
            end += 1;
        }
        copy_batch(side, &disk, n, &orders[start..end], &mut done);
        start = end;
    }
    done
}

/// The bytes of an ordered object: its extents in the node's segment, in order, cut to its
/// size (None when an extent is outside the segment or they hold too few bytes).
fn parts_of<'s>(side: &'s Sidecar, o: &mpb::OffloadOrder) -> Option<Vec<&'s [u8]>> {
    let mut parts = Vec::with_capacity(o.extents.len());
    let mut left = o.size;
    for e in &o.extents {
        let take = e.len.min(left);
        if take == 0 {
            break;
        }
        // SAFETY: `slice` bounds-checks against the segment, which the sidecar keeps mapped
        // for its whole life. The bytes are only read (copied into the disk's write pieces
        // and hashed there): a concurrent reuse of the extent (the object removed meanwhile)
        // changes them, and the write's checksum check refuses the record.
        parts.push(unsafe { side.store.segment.slice(e.offset, take) }.ok()?);
        left -= take;
    }
    (left == 0).then_some(parts)
}

fn copy_batch(side: &Sidecar, disk: &Disk, n: u32, orders: &[mpb::OffloadOrder], done: &mut Done) {
    let mut pending: Vec<(&mpb::OffloadOrder, Version, Vec<&[u8]>)> = Vec::new();
    for o in orders {
        let Some(v) = o.version else { continue };
        match parts_of(side, o) {
            Some(b) => pending.push((o, v, b)),
            None => done.failed.push(item(&o.key, v, n)),
        }
    }
    // A full disk makes room with its own eviction, then the rest is written again.
    for _ in 0..3 {
        if pending.is_empty() {
            return;
        }
        let items: Vec<WriteItem> = pending
            .iter()
            .map(|(o, v, b)| WriteItem {
                key: &o.key,
                version: *v,
                checksum: o.checksum,
                value: b,
                relocate: false,
            })
            .collect();
        let results = match disk.write_batch(&items) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(disk = %disk.path().display(), error = %e, "offload write failed");
                for (o, v, _) in &pending {
                    done.failed.push(item(&o.key, *v, n));
                }
                return;
            }
        };
        drop(items);
        let mut again = Vec::new();
        for ((o, v, b), r) in pending.into_iter().zip(results) {
            match r {
                Written::Ok if o.copy => done.copied.push(item(&o.key, v, n)),
                Written::Ok => done.moved.push(item(&o.key, v, n)),
                Written::Full => again.push((o, v, b)),
                Written::TooLarge | Written::BadChecksum => done.failed.push(item(&o.key, v, n)),
            }
        }
        if !again.is_empty() && !make_room(side, disk, done) {
            for (o, v, _) in &again {
                done.failed.push(item(&o.key, *v, n));
            }
            return;
        }
        pending = again;
    }
    for (o, v, _) in &pending {
        done.failed.push(item(&o.key, *v, n));
    }
}

/// Frees the disk's least recently used bucket for a batch that found the disk full
/// (blocking; on a runtime's blocking thread). Its records are reported dropped, with what
/// this round did before (moves first: metad applies them before the drops), and only then
/// erased: a kill in between leaves records that metad still lists and the restart finds,
/// never a listed disk replica that is gone, which the restart could not account for.
/// Answers whether room was made; on false nothing was evicted.
fn make_room(side: &Sidecar, disk: &Disk, done: &mut Done) -> bool {
    let Some((bucket, victims)) = disk.eviction_candidate() else {
        return false;
    };
    let told = match tokio::runtime::Handle::try_current() {
        Ok(rt) => rt.block_on(send_report(side, done, &victims)),
        Err(_) => Err("no runtime to report from".to_string()),
    };
    match told {
        Ok(more) => {
            *done = Done::default();
            if !more.is_empty() {
                let _ = side.offload_tx.send(more);
            }
        }
        Err(e) => {
            tracing::warn!(disk = %disk.path().display(), error = %e, "disk full and metad not told of an eviction: nothing evicted");
            return false;
        }
    }
    match disk.evict(bucket) {
        Ok(dropped) => {
            // A bucket is sealed before it is a candidate, so nothing joins it meanwhile;
            // anything not reported above goes with the next report.
            let told: std::collections::HashSet<(&str, u64, u64)> = victims
                .iter()
                .map(|d| (d.key.as_str(), d.version.term, d.version.id))
                .collect();
            let untold: Vec<Dropped> = dropped
                .into_iter()
                .filter(|d| !told.contains(&(d.key.as_str(), d.version.term, d.version.id)))
                .collect();
            done.dropped.extend(untold);
            true
        }
        Err(e) => {
            tracing::warn!(disk = %disk.path().display(), error = %e, "disk eviction failed");
            false
        }
    }
}

/// Tells metad what the disks did; records whose move was not committed are deleted.
/// Answers the further orders metad sent back.
async fn report(side: &Sidecar, done: Done, poll: bool) -> Orders {
    if !poll && done.is_empty() {
        return Orders::default();
    }
    match send_report(side, &done, &[]).await {
        Ok(orders) => orders,
        Err(e) => {
            // Whether the moves were committed is unknown: the records stay (metad is the
            // truth; a record it does not list is deleted at the next inventory, or leaves
            // with its bucket). Drops go with the next report: metad would otherwise list
            // the dropped replicas, and send gets to them, until the node restarts.
            tracing::warn!(error = %e, moved = done.moved.len(), dropped = done.dropped.len(), "disk report failed");
            side.disks.unreported(done.dropped);
            Orders::default()
        }
    }
}

/// [`report`] of `done` and of `also_dropped` after its drops, retried a few times; on success
/// the records whose move metad did not commit are deleted. Fails with the last attempt's
/// error.
async fn send_report(
    side: &Sidecar,
    done: &Done,
    also_dropped: &[Dropped],
) -> Result<Orders, String> {
    let req = mpb::DiskReportRequest {
        node_id: side.node_id(),
        generation: side.store.tracker.generation(),
        moved: done.moved.clone(),
        copied: done.copied.clone(),
        promoted: done.promoted.clone(),
        promote_failed: done.promote_failed.clone(),
        failed: done.failed.clone(),
        dropped: done
            .dropped
            .iter()
            .chain(also_dropped)
            .map(|d| item(&d.key, d.version, 0))
            .collect(),
        ..Default::default()
    };
    // Sent again on failure: a move committed by an attempt whose answer was lost holds.
    let mut answer = side.metad.disk_report(req.clone()).await;
    for _ in 0..REPORT_RETRIES {
        if answer.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        answer = side.metad.disk_report(req.clone()).await;
    }
    match answer {
        Ok(r) => {
            let mut kept = 0;
            for (m, ok) in done.moved.iter().zip(r.moved) {
                if ok {
                    kept += 1;
                } else {
                    remove(side, m);
                }
            }
            side.metrics.disk_offloads.inc_by(kept);
            for (m, ok) in done.copied.iter().zip(r.copied) {
                if !ok {
                    remove(side, m);
                }
            }
            let refused = r.promoted.iter().filter(|ok| !**ok).count();
            if refused > 0 {
                tracing::debug!(refused, "promotions not committed (the objects changed)");
            }
            Ok(Orders {
                offload: r.offload,
                promote: r.promote,
            })
        }
        Err(e) => Err(e.to_string()),
    }
}

fn remove(side: &Sidecar, m: &mpb::DiskItem) {
    let Some(v) = m.version else { return };
    for d in side.disks.disks() {
        d.remove(&m.key, Some(v));
    }
}

/// After a start: tells metad every record the disks hold; metad drops the disk replicas
/// this node no longer holds and names the records it does not list, which are deleted.
async fn reconcile(side: &Arc<Sidecar>, stop: &Shutdown) {
    let held: Vec<mpb::DiskItem> = side
        .disks
        .numbered()
        .flat_map(|(n, d)| d.inventory().into_iter().map(move |(k, v)| item(&k, v, n)))
        .collect();
    let t0 = std::time::Instant::now();
    let chunks: Vec<&[mpb::DiskItem]> = if held.is_empty() {
        vec![&[]]
    } else {
        held.chunks(INVENTORY_CHUNK).collect()
    };
    let mut unknown = 0;
    'all: for attempt in 0..30u32 {
        let mut ok = true;
        for (i, c) in chunks.iter().enumerate() {
            let req = mpb::DiskReportRequest {
                node_id: side.node_id(),
                generation: side.store.tracker.generation(),
                inventory: true,
                held: c.to_vec(),
                inventory_done: i + 1 == chunks.len(),
                ..Default::default()
            };
            match side.metad.disk_report(req).await {
                Ok(r) => {
                    unknown += r.unknown.len();
                    for m in &r.unknown {
                        remove(side, m);
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, attempt, "disk inventory report failed; retrying");
                    ok = false;
                    break;
                }
            }
        }
        if ok {
            break 'all;
        }
        tokio::select! {
            _ = stop.wait() => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
    tracing::info!(
        records = held.len(),
        deleted = unknown,
        ms = t0.elapsed().as_millis() as u64,
        "disk tier reconciled with metad"
    );
}
