//! Plain data types of the replicated state.

use serde::{Deserialize, Serialize};
use std::num::NonZeroU32;

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

impl SegmentId {
    /// Whether this names a disk of the node's disk tier, not a memory segment
    /// ([`regolith_proto::disk_tier`]).
    pub fn is_disk(&self) -> bool {
        regolith_proto::disk_tier::is_disk_generation(self.generation)
    }
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
/// Node ids start at 1, which gives [`Replicas`] a spare value to tell its forms apart in.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Piece {
    pub node: NonZeroU32,
    pub generation: u32,
    pub offset: u64,
    pub len: u64,
}

impl Piece {
    pub fn segment(&self) -> SegmentId {
        SegmentId {
            node: self.node.get() as u64,
            generation: self.generation as u64,
        }
    }
    pub fn extent(&self) -> Extent {
        Extent::new(self.offset, self.len)
    }
    /// A replica on a disk of the node's disk tier (its extent is `(0, size)`).
    pub fn is_disk(&self) -> bool {
        regolith_proto::disk_tier::is_disk_generation(self.generation as u64)
    }
    /// The one piece of a replica on disk `disk` of `node`.
    pub fn on_disk(node: NonZeroU32, disk: u32, size: u64) -> Self {
        Piece {
            node,
            generation: regolith_proto::disk_tier::disk_generation(disk) as u32,
            offset: 0,
            len: size,
        }
    }
}

/// The replicas of a committed object: pieces grouped by segment, in replica order. One piece
/// (one single-extent replica, the common case) is stored inline, without a heap allocation,
/// in 24 bytes (the piece's own; its node id of 0, which no node has, marks the other form):
/// this is what keeps ten million objects within metad's memory budget. Serialised as a
/// sequence of pieces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replicas(Repr);

/// Always `One` for exactly one piece, so that equal replicas are equal values.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Repr {
    One(Piece),
    Many(Box<[Piece]>),
}

impl Default for Replicas {
    fn default() -> Self {
        Self(Repr::Many(Box::new([])))
    }
}

impl Serialize for Replicas {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.pieces())
    }
}

impl<'de> Deserialize<'de> for Replicas {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Vec::<Piece>::deserialize(d).map(Self::from_pieces)
    }
}

impl Replicas {
    fn from_pieces(mut v: Vec<Piece>) -> Self {
        if v.len() == 1 {
            if let Some(p) = v.pop() {
                return Self(Repr::One(p));
            }
        }
        Self(Repr::Many(v.into_boxed_slice()))
    }

    /// None when a node id or generation does not fit the compact form.
    pub fn from_replicas(replicas: &[Replica]) -> Option<Self> {
        let mut v = Vec::new();
        for r in replicas {
            let node = NonZeroU32::new(u32::try_from(r.segment.node).ok()?)?;
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
        Some(Self::from_pieces(v))
    }

    pub fn pieces(&self) -> &[Piece] {
        match &self.0 {
            Repr::One(p) => std::slice::from_ref(p),
            Repr::Many(v) => v,
        }
    }

    /// The replicas in their full form.
    pub fn to_vec(&self) -> Vec<Replica> {
        let mut out: Vec<Replica> = Vec::new();
        for p in self.pieces() {
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
        self.pieces().iter().filter_map(move |p| {
            let s = p.segment();
            (last.replace(s) != Some(s)).then_some(s)
        })
    }

    pub fn count(&self) -> usize {
        self.segments().count()
    }

    pub fn is_empty(&self) -> bool {
        self.pieces().is_empty()
    }

    /// Allocated bytes over all replicas.
    pub fn bytes(&self) -> u64 {
        self.pieces()
            .iter()
            .fold(0u64, |a, p| a.saturating_add(p.len))
    }

    /// Bytes of memory (segments) over all replicas: disk replicas left out.
    pub fn memory_bytes(&self) -> u64 {
        self.pieces()
            .iter()
            .filter(|p| !p.is_disk())
            .fold(0u64, |a, p| a.saturating_add(p.len))
    }

    /// Replicas in memory (distinct memory segments).
    pub fn memory_count(&self) -> usize {
        self.segments().filter(|s| !s.is_disk()).count()
    }

    /// Whether any replica is on a disk tier.
    pub fn has_disk(&self) -> bool {
        self.pieces().iter().any(|p| p.is_disk())
    }

    /// The disk of `node` holding a replica, if one does.
    pub fn disk_on(&self, node: NodeId) -> Option<u32> {
        self.pieces().iter().find_map(|p| {
            (p.is_disk() && p.node.get() as u64 == node)
                .then(|| regolith_proto::disk_tier::disk_of(p.generation as u64))
                .flatten()
        })
    }

    /// Replaces the pieces on `seg` (a node's memory segment) with one disk piece; answers
    /// the extents that left `seg`, none (and no change) when it held none.
    pub fn move_to_disk(&mut self, seg: SegmentId, disk: u32, size: u64) -> Vec<Extent> {
        let Some(node) = u32::try_from(seg.node).ok().and_then(NonZeroU32::new) else {
            return Vec::new();
        };
        let moved: Vec<Extent> = self
            .pieces()
            .iter()
            .filter(|p| p.segment() == seg)
            .map(|p| p.extent())
            .collect();
        if moved.is_empty() {
            return moved;
        }
        let mut kept: Vec<Piece> = self
            .pieces()
            .iter()
            .filter(|p| p.segment() != seg && !(p.is_disk() && p.node == node))
            .copied()
            .collect();
        kept.push(Piece::on_disk(node, disk, size));
        *self = Self::from_pieces(kept);
        moved
    }

    /// These replicas and `r` besides (its pieces after the others); None when its node id or
    /// generation does not fit the compact form.
    pub fn with_replica(&self, r: &Replica) -> Option<Self> {
        let added = Self::from_replicas(std::slice::from_ref(r))?;
        let mut v = self.pieces().to_vec();
        v.extend_from_slice(added.pieces());
        Some(Self::from_pieces(v))
    }

    /// These replicas and one on disk `disk` of `node` besides, unless the node already has
    /// a disk replica (then unchanged); None when the node id does not fit.
    pub fn with_disk(&self, node: NodeId, disk: u32, size: u64) -> Option<Self> {
        let n = NonZeroU32::new(u32::try_from(node).ok()?)?;
        if self.disk_on(node).is_some() {
            return Some(self.clone());
        }
        let mut v = self.pieces().to_vec();
        v.push(Piece::on_disk(n, disk, size));
        Some(Self::from_pieces(v))
    }

    /// Keeps the pieces of the segments `keep` accepts.
    pub fn retain_segments(&mut self, mut keep: impl FnMut(SegmentId) -> bool) {
        let kept: Vec<Piece> = self
            .pieces()
            .iter()
            .filter(|p| keep(p.segment()))
            .copied()
            .collect();
        if kept.len() != self.pieces().len() {
            *self = Self::from_pieces(kept);
        }
    }
}

/// A committed object.
///
/// Ten million of these are the state machine's memory: the pin is kept as a one-byte kind
/// beside its time rather than as a [`Pin`] (16 bytes with its tag), and the replicas in 24
/// bytes, which makes the record 80 bytes instead of 96. Serialised exactly as it was ([`ObjectRecord`]): snapshots and
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

    /// Bytes the object occupies in memory over all replicas (disk replicas take none).
    pub fn footprint(&self) -> u64 {
        self.size * self.replicas.memory_count() as u64
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
        assert_eq!(std::mem::size_of::<Replicas>(), 24);
        assert_eq!(std::mem::size_of::<Object>(), 80);
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

    /// A piece as it was serialised inside a `SmallVec` (a sequence, like a `Vec`).
    #[derive(Serialize)]
    struct PieceBefore {
        node: u32,
        generation: u32,
        offset: u64,
        len: u64,
    }

    fn replica(node: u64, generation: u64, extents: &[(u64, u64)]) -> Replica {
        Replica {
            segment: SegmentId { node, generation },
            extents: extents.iter().map(|&(o, l)| Extent::new(o, l)).collect(),
        }
    }

    /// None, one and several pieces serialise as the sequence they were, read back equal, and
    /// the inline and boxed forms never make two equal sets of replicas unequal.
    #[test]
    fn replicas_serialise_as_a_sequence_of_pieces_in_either_form() {
        let cases = [
            vec![],
            vec![replica(1, 1, &[(0, 10)])],
            vec![
                replica(1, 1, &[(0, 10), (20, 5)]),
                replica(7, 3, &[(64, 15)]),
            ],
        ];
        for replicas in cases {
            let r = Replicas::from_replicas(&replicas).unwrap();
            assert_eq!(r.to_vec(), replicas);
            let before: Vec<PieceBefore> = replicas
                .iter()
                .flat_map(|x| {
                    x.extents.iter().map(|e| PieceBefore {
                        node: x.segment.node as u32,
                        generation: x.segment.generation as u32,
                        offset: e.offset,
                        len: e.len,
                    })
                })
                .collect();
            let bytes = bincode::serialize(&r).unwrap();
            assert_eq!(bytes, bincode::serialize(&before).unwrap());
            let back: Replicas = bincode::deserialize(&bytes).unwrap();
            assert_eq!(back, r);
        }
        // Two replicas, one of them dropped: the one left is the inline form, equal to a fresh one.
        let mut two =
            Replicas::from_replicas(&[replica(1, 1, &[(0, 10)]), replica(2, 1, &[(0, 10)])])
                .unwrap();
        two.retain_segments(|s| s.node == 2);
        assert_eq!(
            two,
            Replicas::from_replicas(&[replica(2, 1, &[(0, 10)])]).unwrap()
        );
        assert_eq!(two.count(), 1);
        two.retain_segments(|_| false);
        assert!(two.is_empty());
        assert_eq!(two, Replicas::default());
        // Node 0 (never assigned) and ids past 32 bits do not fit the compact form.
        assert!(Replicas::from_replicas(&[replica(0, 1, &[(0, 1)])]).is_none());
        assert!(Replicas::from_replicas(&[replica(1 << 32, 1, &[(0, 1)])]).is_none());
    }
}
