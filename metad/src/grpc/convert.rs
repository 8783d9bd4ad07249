//! Conversions between the wire types (`regolith_proto::metad`) and the core's types.

use regolith_proto::metad as pb;

use crate::error::Error;
use crate::leader::{Heartbeat, PinKind, PlacedReplica, Placement, PutRequest, Reserved};
use crate::types::{Extent, SegmentId, Version};

pub fn version(v: Version) -> pb::Version {
    pb::Version {
        term: v.term,
        id: v.id,
    }
}

pub fn version_from(v: Option<&pb::Version>) -> Result<Version, Error> {
    let v = v.ok_or_else(|| Error::InvalidArgument("missing reservation version".into()))?;
    Ok(Version {
        term: v.term,
        id: v.id,
    })
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

pub fn replica(r: &PlacedReplica) -> pb::Replica {
    pb::Replica {
        node_id: r.segment.node,
        generation: r.segment.generation,
        node_name: r.node_name.clone(),
        data_addrs: r.data_addrs.clone(),
        extents: r.extents.iter().map(extent).collect(),
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
    }
}

pub fn reservation(r: &Reserved, leader_id: u64) -> pb::Reservation {
    pb::Reservation {
        version: Some(version(r.version)),
        key: r.key.clone(),
        size: r.size,
        replicas: r.replicas.iter().map(replica).collect(),
        expires_in_ms: r.expires_in_ms,
        leader_id,
    }
}

pub fn placement(p: &Placement) -> pb::ObjectPlacement {
    pb::ObjectPlacement {
        status: Some(ok()),
        key: p.key.clone(),
        size: p.size,
        checksum: p.checksum,
        version: Some(version(p.version)),
        replicas: p.replicas.iter().map(replica).collect(),
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
