//! Protobuf ↔ domain: the UDS requests as [`crate::ops`] takes them, its outcomes as the
//! replies; regions resolved against the connection's staging area and registered buffers;
//! the cluster views (`LIST_SEGMENTS`, `STATS`).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use regolith_proto::metad as mpb;
use regolith_proto::uds::{self, pb};

use super::Conn;
use crate::node::Sidecar;
use crate::ops::{get, metad_failure, put, Failure, Outcome, Region, ReplicaInfo};

pub(super) fn status_of(o: Outcome<()>) -> pb::Status {
    match o {
        Ok(()) => uds::ok(),
        Err(f) => failure_status(f),
    }
}

pub(super) fn failure_status(f: Failure) -> pb::Status {
    uds::status(f.code, f.message)
}

/// A whole-request outcome as the reply's status and its payload (the default on failure).
pub(super) fn split<T: Default>(o: Outcome<T>) -> (Option<pb::Status>, T) {
    match o {
        Ok(v) => (Some(uds::ok()), v),
        Err(f) => (Some(failure_status(f)), T::default()),
    }
}

/// Resolves a request's region against this connection's staging area and registered buffers.
fn region(conn: &Conn, r: Option<pb::Region>) -> Region {
    let Some(r) = r else {
        return Region::Absent;
    };
    match r.r#where {
        Some(pb::region::Where::Staging(w)) => Region::Mapped {
            seg: conn.staging.clone(),
            offset: w.offset,
            len: w.len,
        },
        Some(pb::region::Where::Shm(s)) => match conn.shms.lock().get(&s.shm_id) {
            Some(seg) => Region::Mapped {
                seg: seg.clone(),
                offset: s.offset,
                len: s.len,
            },
            None => Region::Invalid(Failure::invalid(format!(
                "no registered buffer {}",
                s.shm_id
            ))),
        },
        Some(pb::region::Where::Inline(i)) => Region::Inline {
            data: Bytes::from(i.data),
            max_len: i.max_len,
        },
        None => Region::Invalid(Failure::invalid("not a shared-memory region")),
    }
}

pub(super) fn begin_item(it: pb::PutBeginItem) -> put::BeginItem {
    put::BeginItem {
        key: it.key,
        size: it.size,
        options: it.options.unwrap_or_default(),
    }
}

pub(super) fn replica_info(r: ReplicaInfo) -> pb::ReplicaInfo {
    pb::ReplicaInfo {
        node_name: r.node_name,
        node_id: r.node_id,
        local: r.local,
        offset: r.offset,
    }
}

pub(super) fn put_ticket(t: Outcome<put::Ticket>) -> pb::PutTicket {
    match t {
        Ok(t) => pb::PutTicket {
            status: Some(uds::ok()),
            version: Some(t.version),
            local_extents: t.local_extents,
            remote: t.remote,
            checksum_seed: t.version.seed(),
            replicas: t.replicas.into_iter().map(replica_info).collect(),
        },
        Err(f) => pb::PutTicket {
            status: Some(failure_status(f)),
            ..Default::default()
        },
    }
}

pub(super) fn commit_item(conn: &Conn, it: pb::PutCommitItem) -> put::CommitItem {
    put::CommitItem {
        version: it.version.unwrap_or_default(),
        checksum: it.checksum_known.then_some(it.checksum),
        source: region(conn, it.source),
    }
}

pub(super) fn put_result(r: put::PutResult) -> pb::PutResult {
    pb::PutResult {
        status: Some(status_of(r.status)),
        replicas: r.replicas.into_iter().map(replica_info).collect(),
    }
}

pub(super) fn get_item(conn: &Conn, it: pb::GetItem) -> get::GetItem {
    get::GetItem {
        key: it.key,
        dest: region(conn, it.dest),
        local_ok: it.local_ok,
        report_mismatch: it.report_mismatch,
        mismatched_version: it.mismatched_version,
    }
}

pub(super) fn get_result(r: get::GetResult) -> pb::GetResult {
    let mut out = match r.found {
        Some(f) => pb::GetResult {
            size: f.size,
            checksum: f.checksum,
            version: Some(f.version),
            checksum_seed: f.version.seed(),
            ..Default::default()
        },
        None => pb::GetResult::default(),
    };
    match r.status {
        Ok(get::Delivery::Local(extents)) => out.local_extents = extents,
        Ok(get::Delivery::Inline(data)) => out.data = data,
        Ok(get::Delivery::Delivered) => out.delivered = true,
        Err(f) => {
            out.status = Some(failure_status(f));
            return out;
        }
    }
    out.status = Some(uds::ok());
    out
}

// ------------------------------------------------------- cluster views

pub(super) async fn list_segments(side: &Arc<Sidecar>) -> pb::SegmentsReply {
    match side.store.metad.segments().await {
        Ok(segs) => pb::SegmentsReply {
            status: Some(uds::ok()),
            segments: segs
                .into_iter()
                .map(|s| pb::SegmentInfo {
                    local: s.node_id == side.node_id(),
                    node_name: s.node_name,
                    node_id: s.node_id,
                    capacity: s.capacity,
                    used: s.used,
                    alive: s.alive,
                    draining: s.state == mpb::SegmentState::SegmentDraining as i32,
                    objects: s.objects,
                })
                .collect(),
        },
        Err(e) => pb::SegmentsReply {
            status: Some(failure_status(metad_failure(&e))),
            segments: vec![],
        },
    }
}

pub(super) async fn stats(side: &Arc<Sidecar>) -> pb::StatsReply {
    let m = side.store.metad.stats().await;
    let (term, leader) = *side.leader.lock();
    let mut r = pb::StatsReply {
        status: Some(uds::ok()),
        node_name: side.settings.node_name.clone(),
        node_id: side.node_id(),
        segment_size: side.store.segment.len(),
        segment_used: side.segment_used.load(Ordering::Relaxed),
        clients: side.clients.load(Ordering::Relaxed),
        puts: side.store.puts.load(Ordering::Relaxed),
        gets: side.store.gets.load(Ordering::Relaxed),
        checksum_mismatches: side.metrics.checksum_mismatches.get(),
        metad_term: term,
        metad_leader: leader,
        tls: side.settings.tls.is_some(),
        ..Default::default()
    };
    match m {
        Ok(s) => {
            r.keys = s.keys;
            r.bytes_used = s.bytes_used;
            r.bytes_total = s.bytes_total;
        }
        Err(e) => r.status = Some(failure_status(metad_failure(&e))),
    }
    r
}
