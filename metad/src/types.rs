//! Plain data types of the replicated state.

use serde::{Deserialize, Serialize};

/// A sidecar node's persistent id (assigned by `MountSegment` apply, kept in its state file).
pub type NodeId = u64;

/// A segment: a node's contributed memory, one generation of it. Mounting generation g+1 drops
/// every older generation of that node.
#[derive(
    Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
pub struct SegmentId {
    pub node: NodeId,
    pub generation: u64,
}

impl std::fmt::Display for SegmentId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "node {} gen {}", self.node, self.generation)
    }
}

/// A byte range of a segment.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Extent {
    pub offset: u64,
    pub len: u64,
}

impl Extent {
    pub fn new(offset: u64, len: u64) -> Self {
        Self { offset, len }
    }
    pub fn end(&self) -> u64 {
        self.offset.saturating_add(self.len)
    }
    pub fn overlaps(&self, o: &Extent) -> bool {
        self.offset < o.end() && o.offset < self.end()
    }
}

/// A reservation and the version of the object it becomes: the issuing leader's term and a
/// counter. Unique across the cluster's life (`single-term-leader`: one leader per term).
#[derive(
    Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
pub struct Version {
    pub term: u64,
    pub id: u64,
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.term, self.id)
    }
}

/// One replica of an object: extents of one segment, in object order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replica {
    pub segment: SegmentId,
    pub extents: Vec<Extent>,
}

impl Replica {
    pub fn bytes(&self) -> u64 {
        self.extents
            .iter()
            .fold(0u64, |a, e| a.saturating_add(e.len))
    }
}

/// Eviction protection of an object.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum Pin {
    #[default]
    None,
    /// Evicted only after unpinned objects; lapses at `until_ms` (wall clock, stamped by the
    /// leader).
    Soft { until_ms: u64 },
    /// Never evicted.
    Hard,
}

/// A committed object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Object {
    pub size: u64,
    pub checksum: u64,
    pub version: Version,
    pub replicas: Vec<Replica>,
    pub pin: Pin,
    /// Removed by `ExpirePins` once the stamped time passes it; 0 = no TTL.
    pub expires_ms: u64,
    /// Leader-memory access time for approximate LRU (seconds of the leader's monotonic clock).
    /// Not replicated: skipped by snapshots, ignored by equality of replicated state.
    #[serde(skip)]
    pub access_s: u32,
}

impl Object {
    /// Bytes the object occupies over all replicas.
    pub fn footprint(&self) -> u64 {
        self.size * self.replicas.len() as u64
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SegmentState {
    Active,
    /// No new placements; unmounted when empty or at `deadline_ms` (wall clock).
    Draining {
        deadline_ms: u64,
    },
}

/// A mounted segment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    pub id: SegmentId,
    pub name: String,
    pub capacity: u64,
    pub data_addrs: Vec<String>,
    pub state: SegmentState,
    pub mounted_ms: u64,
    /// Bytes of committed replicas on this segment.
    pub used: u64,
    pub objects: u64,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum UnmountReason {
    Graceful,
    Dead,
}
