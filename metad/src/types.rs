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
///
/// Ten million of these are the state machine's memory: the pin is kept as a one-byte kind
/// beside its time rather than as a [`Pin`] (16 bytes with its tag), which makes the record 88
/// bytes instead of 96. Serialised exactly as it was ([`ObjectRecord`]): snapshots and
/// commands are unchanged.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "ObjectRecord", into = "ObjectRecord")]
pub struct Object {
    pub size: u64,
    pub checksum: u64,
    pub version: Version,
    pub replicas: Replicas,
    /// Removed by `ExpirePins` once the stamped time passes it; 0 = no TTL.
    pub expires_ms: u64,
    /// `Pin::Soft`'s time (0 otherwise).
    pin_until_ms: u64,
    /// Leader-memory access time for approximate LRU (seconds of the leader's monotonic clock).
    /// Not replicated: skipped by snapshots, ignored by equality of replicated state.
    pub access_s: u32,
    /// 0 none, 1 soft, 2 hard.
    pin_kind: u8,
}

/// An object as snapshots and the change feed serialise it (the original field order).
#[derive(Clone, Serialize, Deserialize)]
struct ObjectRecord {
    size: u64,
    checksum: u64,
    version: Version,
    replicas: Replicas,
    pin: Pin,
    expires_ms: u64,
}

impl From<ObjectRecord> for Object {
    fn from(r: ObjectRecord) -> Self {
        Object::new(
            r.size,
            r.checksum,
            r.version,
            r.replicas,
            r.pin,
            r.expires_ms,
        )
    }
}

impl From<Object> for ObjectRecord {
    fn from(o: Object) -> Self {
        ObjectRecord {
            size: o.size,
            checksum: o.checksum,
            version: o.version,
            pin: o.pin(),
            replicas: o.replicas,
            expires_ms: o.expires_ms,
        }
    }
}

impl Object {
    pub fn new(
        size: u64,
        checksum: u64,
        version: Version,
        replicas: Replicas,
        pin: Pin,
        expires_ms: u64,
    ) -> Self {
        let mut o = Object {
            size,
            checksum,
            version,
            replicas,
            expires_ms,
            pin_until_ms: 0,
            access_s: 0,
            pin_kind: 0,
        };
        o.set_pin(pin);
        o
    }

    pub fn pin(&self) -> Pin {
        match self.pin_kind {
            1 => Pin::Soft {
                until_ms: self.pin_until_ms,
            },
            2 => Pin::Hard,
            _ => Pin::None,
        }
    }

    pub fn set_pin(&mut self, pin: Pin) {
        (self.pin_kind, self.pin_until_ms) = match pin {
            Pin::None => (0, 0),
            Pin::Soft { until_ms } => (1, until_ms),
            Pin::Hard => (2, 0),
        };
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    /// The object as it was declared before its pin was packed (`access_s` skipped): snapshots
    /// and logs written by earlier versions hold this.
    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    struct Before {
        size: u64,
        checksum: u64,
        version: Version,
        replicas: Replicas,
        pin: Pin,
        expires_ms: u64,
        #[serde(skip)]
        access_s: u32,
    }

    /// The packed record serialises byte for byte as before, and reads back what was written,
    /// for each kind of pin.
    #[test]
    fn an_object_serialises_as_before_its_pin_was_packed() {
        assert_eq!(std::mem::size_of::<Object>(), 88);
        let replicas = Replicas::from_replicas(&[Replica {
            segment: SegmentId {
                node: 3,
                generation: 2,
            },
            extents: vec![Extent::new(64, 128)],
        }])
        .unwrap();
        for pin in [Pin::None, Pin::Soft { until_ms: 1234 }, Pin::Hard] {
            let version = Version { term: 4, id: 9 };
            let mut o = Object::new(100, 7, version, replicas.clone(), pin, 55);
            o.access_s = 3;
            let before = Before {
                size: 100,
                checksum: 7,
                version,
                replicas: replicas.clone(),
                pin,
                expires_ms: 55,
                access_s: 0,
            };
            let bytes = bincode::serialize(&o).unwrap();
            assert_eq!(bytes, bincode::serialize(&before).unwrap(), "{pin:?}");
            let back: Object = bincode::deserialize(&bytes).unwrap();
            assert_eq!(back.pin(), pin);
            assert_eq!(back, Object { access_s: 0, ..o });
        }
    }
}
