//! The sidecar's operations for its local clients, one file per family (as mini-redis keeps
//! one file per command). They work on domain types; [`crate::uds`] translates the protocol's
//! messages to and from them, and metad sits behind [`MetadApi`], so every workflow runs in a
//! unit test against a double.
//!
//! * [`metad`] — [`MetadApi`]: reserve, commit, abort, placements, exists, remove, …, and the
//!   domain types it answers with ([`Replica`], [`Reservation`], [`Placement`], [`Refusal`]).
//! * [`put`] — reserve → write the remote replicas → commit with the issuing leader, or abort;
//!   [`put::PendingPuts`] holds a put between its two calls.
//! * [`get`] — placements, then the local extents or a verified private copy from the best
//!   replica.
//! * [`keys`] — exists, sizes, remove, remove-all.
//! * [`replica`] — one object to or from one replica: this node's segment or the data plane.
//!
//! [`Store`] is what they all work on: the node's identity and segment, the reservations in
//! flight, the data plane, metad.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use regolith_proto::metad as mpb;
use regolith_proto::uds::pb::Code;

use crate::metrics::Metrics;
use crate::segment::Segment;
use crate::tracker::Tracker;
use crate::transport::rdma::NodeTransport;
use crate::transport::DataClient;
use crate::watch::NodeIndex;

pub mod get;
pub mod keys;
pub mod metad;
pub mod put;
pub mod replica;

pub use metad::{
    Answer, MetadApi, MetadError, MetadResult, Placement, Refusal, Removed, Replica, Reservation,
    ReserveItem, Reserved,
};

/// Most items in one batch request.
pub const MAX_ITEMS: usize = 4096;
/// Most keys in one key request (exists, sizes).
pub const MAX_KEYS: usize = MAX_ITEMS * 16;

/// Why an operation, or one item of a batch, failed, in the UDS protocol's vocabulary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub code: Code,
    pub message: String,
}

impl Failure {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Failure::new(Code::InvalidArgument, message)
    }
}

impl From<&Refusal> for Failure {
    fn from(r: &Refusal) -> Self {
        Failure::new(code_of(r.code), r.message.clone())
    }
}

pub type Outcome<T> = std::result::Result<T, Failure>;

/// metad's per-item codes, as the UDS protocol's. Codes a fresh attempt may cure become
/// UNAVAILABLE (the client retries the put with a new reservation).
pub fn code_of(c: mpb::Code) -> Code {
    match c {
        mpb::Code::Ok => Code::Ok,
        mpb::Code::NotFound => Code::NotFound,
        mpb::Code::AlreadyExists => Code::AlreadyExists,
        mpb::Code::NoSpace | mpb::Code::NotEnoughNodes | mpb::Code::QuotaExceeded => Code::NoSpace,
        mpb::Code::InvalidArgument => Code::InvalidArgument,
        mpb::Code::StaleReservation
        | mpb::Code::Expired
        | mpb::Code::Conflict
        | mpb::Code::NotReady => Code::Unavailable,
        mpb::Code::Internal => Code::Internal,
    }
}

/// A call to metad that failed as a whole.
pub fn metad_failure(e: &MetadError) -> Failure {
    let code = match e.code() {
        Some(tonic::Code::InvalidArgument) => Code::InvalidArgument,
        _ => Code::Unavailable,
    };
    Failure::new(code, format!("metad: {e}"))
}

/// A window of a client's memory that a put reads from or a get writes into, as the UDS layer
/// resolved it from the request.
#[derive(Clone)]
pub enum Region {
    /// A window of one of the connection's mapped memfds (staging, a registered buffer).
    Mapped {
        seg: Arc<Segment>,
        offset: u64,
        len: u64,
    },
    /// The bytes travel in the frame: a put's `data`; for a get, the most bytes the client
    /// takes inline.
    Inline { data: Bytes, max_len: u64 },
    /// The request named no region.
    Absent,
    /// The request named a region that does not resolve (an unknown buffer, no window).
    Invalid(Failure),
}

impl Region {
    /// The mapping and offset of a window that must hold `need` bytes.
    pub fn window(&self, need: u64) -> Outcome<(Arc<Segment>, u64)> {
        let (seg, off, len) = match self {
            Region::Mapped { seg, offset, len } => (seg, *offset, *len),
            Region::Invalid(f) => return Err(f.clone()),
            Region::Inline { .. } | Region::Absent => {
                return Err(Failure::invalid("not a shared-memory region"))
            }
        };
        if len < need {
            return Err(Failure::new(
                Code::NeedSpace,
                format!("region of {len} bytes for {need}"),
            ));
        }
        if off.checked_add(need).is_none_or(|end| end > seg.len()) {
            return Err(Failure::invalid(format!(
                "region {off}+{need} lies outside its buffer ({} bytes)",
                seg.len()
            )));
        }
        Ok((seg.clone(), off))
    }
}

/// Where a replica landed, as a client is told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaInfo {
    pub node_name: String,
    pub node_id: u64,
    pub local: bool,
    /// Byte offset of the replica's first extent in its node's segment.
    pub offset: u64,
}

/// What the workflows work on.
pub struct Store {
    pub metad: Arc<dyn MetadApi>,
    /// This node's segment (empty on a consumer-only node).
    pub segment: Arc<Segment>,
    pub tracker: Arc<Tracker>,
    pub data: DataClient<NodeTransport>,
    pub metrics: Arc<Metrics>,
    /// The node's object index (answers exists and gets while synced).
    pub index: Arc<NodeIndex>,
    /// The node's disk tier (reads of its disk replicas).
    pub disks: Arc<crate::disk::Tier>,
    node_id: AtomicU64,
    /// Puts and gets served (for `STATS`).
    pub puts: AtomicU64,
    pub gets: AtomicU64,
}

impl Store {
    pub fn new(
        metad: Arc<dyn MetadApi>,
        node_id: u64,
        segment: Arc<Segment>,
        tracker: Arc<Tracker>,
        data: DataClient<NodeTransport>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Store {
            metad,
            segment,
            tracker,
            data,
            index: Arc::new(NodeIndex::disabled(metrics.clone())),
            disks: Arc::new(crate::disk::Tier::default()),
            metrics,
            node_id: AtomicU64::new(node_id),
            puts: AtomicU64::new(0),
            gets: AtomicU64::new(0),
        }
    }

    /// The store with this disk tier (the default has none).
    pub fn with_disks(mut self, disks: Arc<crate::disk::Tier>) -> Self {
        self.tracker.set_disks(disks.clone());
        self.disks = disks;
        self
    }

    /// The store with this index (the default one never answers).
    pub fn with_index(mut self, index: Arc<NodeIndex>) -> Self {
        self.index = index;
        self
    }

    pub fn node_id(&self) -> u64 {
        self.node_id.load(Ordering::Acquire)
    }

    /// A remount may assign the node another id.
    pub fn set_node_id(&self, id: u64) {
        self.node_id.store(id, Ordering::Release);
    }

    /// Whether a replica is this node's current segment.
    pub fn is_local(&self, rep: &Replica) -> bool {
        rep.node_id == self.node_id()
            && rep.generation == self.tracker.generation()
            && !self.segment.is_empty()
    }

    pub fn replica_infos(&self, reps: &[Replica]) -> Vec<ReplicaInfo> {
        reps.iter()
            .map(|r| ReplicaInfo {
                node_name: r.node_name.clone(),
                node_id: r.node_id,
                local: self.is_local(r),
                offset: r.extents.first().map_or(0, |e| e.offset),
            })
            .collect()
    }

    /// Counts keys answered by the index or by metad.
    fn count_answers(&self, op: &str, source: &str, n: usize) {
        self.metrics
            .index_answers
            .with_label_values(&[op, source])
            .inc_by(n as u64);
    }

    /// Counts a failed operation by its code.
    fn count_error(&self, op: &str, code: Code) {
        self.metrics
            .op_errors
            .with_label_values(&[op, &format!("{code:?}")])
            .inc();
    }
}

#[cfg(test)]
pub(crate) mod testing;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finding_11_metad_not_ready_is_a_retryable_unavailable() {
        // A fresh leader whose segments have not heartbeated yet answers NOT_READY: the client
        // retries UNAVAILABLE; NO_SPACE would be a definite failure.
        assert_eq!(code_of(mpb::Code::NotReady), Code::Unavailable);
        assert_eq!(code_of(mpb::Code::NoSpace), Code::NoSpace);
        assert_eq!(code_of(mpb::Code::NotEnoughNodes), Code::NoSpace);
    }
}
