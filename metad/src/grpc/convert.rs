//! Conversions between the wire types (`regolith_proto::metad`) and the core's types.

use regolith_proto::dataplane::Kind;
use regolith_proto::metad as pb;

use crate::error::Error;
use crate::feed::Change;
use crate::grpc::grants::Grants;
use crate::leader::{Heartbeat, PinKind, PlacedReplica, Placement, PutRequest, Reserved};
use crate::ops::get::KeyInfo;
use crate::ops::put::{CommitItem, Committed};
use crate::ops::segments::SegmentView;
use crate::ops::stats::Stats;
use crate::ops::watch::{Kind as WatchKind, WatchMessage};
use crate::ops::Member;
use crate::types::{Extent, Pin, SegmentId, SegmentState, Version};

pub fn version(v: Version) -> pb::Version {
    pb::Version {
        term: v.term,
        id: v.id,
    }
}

pub fn extent(e: &Extent) -> pb::Extent {
    pb::Extent {
        offset: e.offset,
        len: e.len,
    }
}

pub fn extent_from(e: &pb::Extent) -> Extent {
    Extent::new(e.offset, e.len)
}

/// A replica of `version`, its extents granted for `kind` access.
pub fn replica(r: &PlacedReplica, kind: Kind, version: Version, grants: &Grants) -> pb::Replica {
    pb::Replica {
        node_id: r.segment.node,
        generation: r.segment.generation,
        node_name: r.node_name.clone(),
        data_addrs: r.data_addrs.clone(),
        extents: r.extents.iter().map(extent).collect(),
        grants: grants.sign_with(kind, r.segment, r.key_generation, version, &r.extents),
    }
}

pub fn put_request(req: &pb::ReserveRequest) -> PutRequest {
    let o = req.options.clone().unwrap_or_default();
    PutRequest {
        key: req.key.clone(),
        size: req.size,
        replicas: o.replicas,
        preferred: o.preferred_segments,
        prefer_local: o.prefer_local,
        pin: match pb::PinKind::try_from(o.pin).unwrap_or(pb::PinKind::PinNone) {
            pb::PinKind::PinNone => PinKind::None,
            pb::PinKind::PinSoft => PinKind::Soft,
            pb::PinKind::PinHard => PinKind::Hard,
        },
        soft_pin_ttl_ms: o.soft_pin_ttl_ms,
        ttl_ms: o.ttl_ms,
        requester: req.requester_node_id,
        upsert: o.upsert,
    }
}

pub fn reservation(r: &Reserved, leader_id: u64, grants: &Grants) -> pb::Reservation {
    pb::Reservation {
        version: Some(version(r.version)),
        key: r.key.clone(),
        size: r.size,
        replicas: r
            .replicas
            .iter()
            .map(|p| replica(p, Kind::Write, r.version, grants))
            .collect(),
        expires_in_ms: r.expires_in_ms,
        leader_id,
    }
}

/// One item of a (batch) reserve answer.
pub fn reserve_response(
    r: &Result<Reserved, Error>,
    leader_id: u64,
    grants: &Grants,
) -> pb::ReserveResponse {
    match r {
        Ok(r) => pb::ReserveResponse {
            status: Some(ok()),
            reservation: Some(reservation(r, leader_id, grants)),
        },
        Err(e) => pb::ReserveResponse {
            status: Some(status_of(e)),
            reservation: None,
        },
    }
}

pub fn commit_item(req: &pb::CommitRequest) -> CommitItem {
    CommitItem {
        version: req.version.as_ref().map(|v| Version {
            term: v.term,
            id: v.id,
        }),
        checksum: req.checksum,
    }
}

/// The per-item status of one commit.
pub fn committed(c: &Committed) -> pb::Status {
    match c {
        Committed::Ok => ok(),
        Committed::AlreadyExists(v) => pb::Status {
            code: pb::Code::AlreadyExists as i32,
            message: format!("key of reservation {v} already exists"),
        },
        Committed::Conflict(why) => pb::Status {
            code: pb::Code::Conflict as i32,
            message: why.clone(),
        },
        Committed::Refused(e) => status_of(e),
    }
}

pub fn members(m: &[Member]) -> pb::MembersResponse {
    pb::MembersResponse {
        members: m
            .iter()
            .map(|m| pb::Member {
                id: m.id,
                addr: m.addr.clone(),
                voter: m.voter,
            })
            .collect(),
    }
}

pub fn stats(st: &Stats) -> pb::StatsResponse {
    let s = &st.store;
    pb::StatsResponse {
        id: st.id,
        leader_id: st.raft.leader.unwrap_or(0),
        term: st.raft.term,
        last_applied: st.raft.applied_index,
        keys: s.keys,
        bytes_used: s.bytes_used,
        bytes_total: s.bytes_total,
        segments: s.segments,
        evicted_objects: s.evicted_objects,
        dead_node_dropped_objects: s.dead_node_dropped_objects,
        members: members(&st.members).members,
        reservations: s.reservations,
        quarantined: s.quarantined,
        leases: s.leases,
        hard_pinned_bytes: s.hard_pinned_bytes,
    }
}

pub fn segment_info(v: &SegmentView) -> pb::SegmentInfo {
    let s = &v.segment;
    pb::SegmentInfo {
        node_id: s.id.node,
        node_name: s.name.clone(),
        generation: s.id.generation,
        capacity: s.capacity,
        used: s.used,
        data_addrs: s.data_addrs.clone(),
        state: match s.state {
            SegmentState::Active => pb::SegmentState::SegmentActive as i32,
            SegmentState::Draining { .. } => pb::SegmentState::SegmentDraining as i32,
        },
        last_heartbeat_ms_ago: v.silence_ms,
        alive: v.alive,
        objects: s.objects,
    }
}

pub fn key_info(k: &KeyInfo) -> pb::KeyInfo {
    pb::KeyInfo {
        key: k.key.clone(),
        size: k.size,
        replicas: k.replicas,
        pin: match k.pin {
            Pin::None => pb::PinKind::PinNone as i32,
            Pin::Soft { .. } => pb::PinKind::PinSoft as i32,
            Pin::Hard => pb::PinKind::PinHard as i32,
        },
    }
}

pub fn placement(p: &Placement, grants: &Grants) -> pb::ObjectPlacement {
    pb::ObjectPlacement {
        status: Some(ok()),
        key: p.key.clone(),
        size: p.size,
        checksum: p.checksum,
        version: Some(version(p.version)),
        replicas: p
            .replicas
            .iter()
            .map(|r| replica(r, Kind::Read, p.version, grants))
            .collect(),
        lease_ms: p.lease_ms,
    }
}

pub fn not_found(key: &str) -> pb::ObjectPlacement {
    pb::ObjectPlacement {
        status: Some(pb::Status {
            code: pb::Code::NotFound as i32,
            message: format!("key {key:?} not found"),
        }),
        key: key.to_string(),
        ..Default::default()
    }
}

pub fn heartbeat(req: &pb::HeartbeatRequest) -> Heartbeat {
    Heartbeat {
        segment: SegmentId {
            node: req.node_id,
            generation: req.generation,
        },
        highest_term_seen: req.highest_term_seen,
        in_flight: req
            .in_flight
            .iter()
            .filter_map(|f| {
                let v = f.version.as_ref()?;
                Some((
                    Version {
                        term: v.term,
                        id: v.id,
                    },
                    f.extents.iter().map(extent_from).collect(),
                ))
            })
            .collect(),
        released: req
            .released
            .iter()
            .map(|v| Version {
                term: v.term,
                id: v.id,
            })
            .collect(),
        disk: crate::leader::offload::DiskTier {
            disks: req.disks,
            capacity: req.disk_capacity,
            used: req.disk_used,
            max_object: req.disk_max_object,
        },
    }
}

pub fn offload_order(o: &crate::leader::offload::Order) -> pb::OffloadOrder {
    pb::OffloadOrder {
        key: o.key.clone(),
        version: Some(version(o.version)),
        size: o.size,
        checksum: o.checksum,
        extents: o.extents.iter().map(extent).collect(),
        copy: o.copy,
    }
}

pub fn promote_order(p: &crate::leader::offload::Promotion) -> pb::PromoteOrder {
    pb::PromoteOrder {
        key: p.key.clone(),
        version: Some(version(p.version)),
        size: p.size,
        checksum: p.checksum,
        disk: p.disk,
        reservation: Some(version(p.reservation)),
        extents: p.extents.iter().map(extent).collect(),
    }
}

fn version_from(v: &regolith_proto::common::Version) -> Version {
    Version {
        term: v.term,
        id: v.id,
    }
}

fn disk_item(i: &pb::DiskItem) -> Option<crate::command::DiskMove> {
    let v = i.version.as_ref()?;
    Some(crate::command::DiskMove {
        key: i.key.clone(),
        version: Version {
            term: v.term,
            id: v.id,
        },
        disk: i.disk,
    })
}

pub fn disk_report(r: &pb::DiskReportRequest) -> crate::ops::disk::DiskReport {
    crate::ops::disk::DiskReport {
        node: r.node_id,
        moved: r.moved.iter().filter_map(disk_item).collect(),
        failed: r.failed.iter().map(|i| i.key.clone()).collect(),
        dropped: r
            .dropped
            .iter()
            .filter_map(disk_item)
            .map(|m| (m.key, m.version))
            .collect(),
        inventory: r.inventory,
        held: r.held.iter().filter_map(disk_item).collect(),
        inventory_done: r.inventory_done,
        copied: r.copied.iter().filter_map(disk_item).collect(),
        promoted: r.promoted.iter().map(version_from).collect(),
        promote_failed: r.promote_failed.iter().map(version_from).collect(),
    }
}

pub fn disk_item_of(m: &crate::command::DiskMove) -> pb::DiskItem {
    pb::DiskItem {
        key: m.key.clone(),
        version: Some(version(m.version)),
        disk: m.disk,
    }
}

pub fn ok() -> pb::Status {
    pb::Status {
        code: pb::Code::Ok as i32,
        message: String::new(),
    }
}

/// The per-item code of a core error.
pub fn code_of(e: &Error) -> pb::Code {
    match e {
        Error::InvalidArgument(_) => pb::Code::InvalidArgument,
        Error::AlreadyExists { .. } => pb::Code::AlreadyExists,
        Error::NotFound { .. } => pb::Code::NotFound,
        Error::NoSpace { .. } => pb::Code::NoSpace,
        Error::NoSegments { .. } => pb::Code::NotEnoughNodes,
        Error::SegmentsNotReady { .. } | Error::KeyBusy { .. } => pb::Code::NotReady,
        Error::QuotaExceeded { .. } => pb::Code::QuotaExceeded,
        Error::StaleReservation { .. } => pb::Code::StaleReservation,
        Error::Expired { .. } => pb::Code::Expired,
        Error::Conflict { .. } => pb::Code::Conflict,
        _ => pb::Code::Internal,
    }
}

pub fn status_of(e: &Error) -> pb::Status {
    pb::Status {
        code: code_of(e) as i32,
        message: e.to_string(),
    }
}

fn watch_segment(segment: &SegmentId, node_name: &str, data_addrs: &[String]) -> pb::WatchSegment {
    pb::WatchSegment {
        node_id: segment.node,
        generation: segment.generation,
        node_name: node_name.to_string(),
        data_addrs: data_addrs.to_vec(),
    }
}

pub fn watch_change(c: &Change, grants: &Grants) -> pb::WatchChange {
    use pb::watch_change::Change as C;
    let change = match c {
        Change::Put { key, obj } => C::Put(pb::WatchObject {
            key: key.clone(),
            size: obj.size,
            checksum: obj.checksum,
            version: Some(version(obj.version)),
            replicas: obj
                .replicas
                .iter()
                .map(|r| pb::Replica {
                    node_id: r.segment.node,
                    generation: r.segment.generation,
                    extents: r.extents.iter().map(extent).collect(),
                    grants: grants.sign(Kind::Read, r.segment, obj.version, &r.extents),
                    ..Default::default()
                })
                .collect(),
        }),
        Change::Removed { key } => C::Removed(key.clone()),
        Change::RemovedAll => C::RemovedAll(true),
        Change::SegmentUp {
            segment,
            node_name,
            data_addrs,
        } => C::SegmentUp(watch_segment(segment, node_name, data_addrs)),
        Change::SegmentDown { segment } => C::SegmentDown(watch_segment(segment, "", &[])),
    };
    pb::WatchChange {
        change: Some(change),
    }
}

pub fn watch_message(m: &WatchMessage, grants: &Grants) -> pb::WatchMessage {
    use pb::watch_message::Kind as K;
    let kind = match m.kind {
        WatchKind::Changes => K::Changes,
        WatchKind::Reset => K::Reset,
        WatchKind::Snapshot => K::Snapshot,
        WatchKind::SnapshotEnd => K::SnapshotEnd,
    };
    pb::WatchMessage {
        kind: kind as i32,
        index: m.index,
        changes: m.changes.iter().map(|c| watch_change(c, grants)).collect(),
        applied_index: m.applied,
        term: m.term,
        as_of_unix_ms: m.as_of_unix_ms,
    }
}
