//! The node's side of the disk tier with metad (design §6 "Tiers", docs/ssd.md): offload
//! orders from heartbeat replies are copied from the segment to a disk and reported; the
//! disks' drops (their own eviction, damaged records, a failed disk) are reported; after a
//! start the disks' inventory is reported, and records metad does not list are deleted.

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

pub type Orders = Vec<mpb::OffloadOrder>;

/// What one round of offload did.
#[derive(Default)]
struct Done {
    moved: Vec<mpb::DiskItem>,
    failed: Vec<mpb::DiskItem>,
    dropped: Vec<Dropped>,
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
    loop {
        tokio::select! {
            _ = stop.wait() => return,
            o = orders.recv() => {
                let Some(mut o) = o else { return };
                // The leader answers a report with more orders while usage is high.
                while !o.is_empty() && !stop.is_shutdown() {
                    active_until = Instant::now() + ACTIVE_FOR;
                    o = offload(&side, o).await;
                }
            }
            _ = poll.tick(), if Instant::now() < active_until => {
                let more = report(&side, Done::default(), true).await;
                if !more.is_empty() {
                    let _ = side.offload_tx.send(more);
                }
            }
            _ = upkeep.tick() => {
                let t = side.disks.clone();
                let dropped = tokio::task::spawn_blocking(move || t.upkeep())
                    .await
                    .unwrap_or_default();
                let more = report(&side, Done { dropped, ..Done::default() }, false).await;
                if !more.is_empty() {
                    let _ = side.offload_tx.send(more);
                }
            }
        }
    }
}

/// Carries out orders; answers the next ones the leader gave with its reply.
async fn offload(side: &Arc<Sidecar>, orders: Orders) -> Orders {
    let s = side.clone();
    let done = tokio::task::spawn_blocking(move || copy_to_disk(&s, &orders))
        .await
        .unwrap_or_default();
    report(side, done, true).await
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

/// The bytes of an ordered object, from the node's segment.
fn bytes_of(side: &Sidecar, o: &mpb::OffloadOrder) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(o.size as usize);
    for e in &o.extents {
        // SAFETY: `slice` bounds-checks against the segment, which the sidecar keeps mapped;
        // the bytes are copied out at once. A concurrent reuse of the extent (the object
        // removed meanwhile) changes them: the checksum check of the write refuses them.
        let b = unsafe { side.store.segment.slice(e.offset, e.len) }.ok()?;
        out.extend_from_slice(b);
    }
    out.truncate(o.size as usize);
    (out.len() as u64 == o.size).then_some(out)
}

fn copy_batch(side: &Sidecar, disk: &Disk, n: u32, orders: &[mpb::OffloadOrder], done: &mut Done) {
    let mut pending: Vec<(&mpb::OffloadOrder, Version, Vec<u8>)> = Vec::new();
    for o in orders {
        let Some(v) = o.version else { continue };
        match bytes_of(side, o) {
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
                Written::Ok => done.moved.push(item(&o.key, v, n)),
                Written::Full => again.push((o, v, b)),
                Written::TooLarge | Written::BadChecksum => done.failed.push(item(&o.key, v, n)),
            }
        }
        if !again.is_empty() {
            match disk.evict_lru() {
                Ok(d) if !d.is_empty() => done.dropped.extend(d),
                _ => {
                    for (o, v, _) in &again {
                        done.failed.push(item(&o.key, *v, n));
                    }
                    return;
                }
            }
        }
        pending = again;
    }
    for (o, v, _) in &pending {
        done.failed.push(item(&o.key, *v, n));
    }
}

/// Tells metad what the disks did; records whose move was not committed are deleted.
/// Answers the further orders metad sent back.
async fn report(side: &Sidecar, done: Done, poll: bool) -> Orders {
    if !poll && done.moved.is_empty() && done.failed.is_empty() && done.dropped.is_empty() {
        return Vec::new();
    }
    let req = mpb::DiskReportRequest {
        node_id: side.node_id(),
        generation: side.store.tracker.generation(),
        moved: done.moved.clone(),
        failed: done.failed,
        dropped: done
            .dropped
            .iter()
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
            r.offload
        }
        Err(e) => {
            // Whether the moves were committed is unknown: the records stay (metad is the
            // truth; a record it does not list is deleted at the next inventory, or leaves
            // with its bucket). Drops are found again at the next inventory.
            tracing::warn!(error = %e, moved = done.moved.len(), "disk report failed");
            Vec::new()
        }
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
