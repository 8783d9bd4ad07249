//! Plain data types of the replicated state.

use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

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

/// One extent of a replica, in the compact form the state machine stores (node ids and
/// generations fit in 32 bits: the state machine assigns both and refuses to go past that).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Piece {
    pub node: u32,
    pub generation: u32,
    pub offset: u64,
    pub len: u64,
}

impl Piece {
    pub fn segment(&self) -> SegmentId {
        SegmentId {
            node: self.node as u64,
            generation: self.generation as u64,
        }
    }
    pub fn extent(&self) -> Extent {
        Extent::new(self.offset, self.len)
    }
}

/// The replicas of a committed object: pieces grouped by segment, in replica order. One
/// single-extent replica (the common case) is stored inline, without a heap allocation; this
/// is what keeps a million objects within metad's memory budget.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Replicas(SmallVec<[Piece; 1]>);

impl Replicas {
    /// None when a node id or generation does not fit the compact form.
    pub fn from_replicas(replicas: &[Replica]) -> Option<Self> {
        let mut v = SmallVec::new();
        for r in replicas {
            let node = u32::try_from(r.segment.node).ok()?;
            let generation = u32::try_from(r.segment.generation).ok()?;
            for e in &r.extents {
                v.push(Piece {
                    node,
                    generation,
                    offset: e.offset,
                    len: e.len,
                });
            }
        }
        Some(Self(v))
    }

    pub fn pieces(&self) -> &[Piece] {
        &self.0
    }

    /// The replicas in their full form.
    pub fn to_vec(&self) -> Vec<Replica> {
        let mut out: Vec<Replica> = Vec::new();
        for p in &self.0 {
            let seg = p.segment();
            match out.last_mut() {
                Some(r) if r.segment == seg => r.extents.push(p.extent()),
                _ => out.push(Replica {
                    segment: seg,
                    extents: vec![p.extent()],
                }),
            }
        }
        out
    }

    /// Distinct segments, in replica order.
    pub fn segments(&self) -> impl Iterator<Item = SegmentId> + '_ {
        let mut last = None;
        self.0.iter().filter_map(move |p| {
            let s = p.segment();
            (last.replace(s) != Some(s)).then_some(s)
        })
    }

    pub fn count(&self) -> usize {
        self.segments().count()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Allocated bytes over all replicas.
    pub fn bytes(&self) -> u64 {
        self.0.iter().fold(0u64, |a, p| a.saturating_add(p.len))
    }

    /// Keeps the pieces of the segments `keep` accepts.
    pub fn retain_segments(&mut self, mut keep: impl FnMut(SegmentId) -> bool) {
        self.0.retain(|p| keep(p.segment()));
    }
}

/// A committed object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Object {
    pub size: u64,
    pub checksum: u64,
    pub version: Version,
    pub replicas: Replicas,
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
        self.size * self.replicas.count() as u64
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
