//! Commands of the replicated state machine (design §3) and their outcomes.
//!
//! One Raft entry carries a [`Batch`] of commands (group commit); its response is one
//! [`Outcome`] per command, in order. Every time a command needs is stamped into it by the
//! leader (`*_ms` fields, wall clock): apply never reads a clock.

use serde::{Deserialize, Serialize};

use crate::types::{NodeId, Pin, Replica, SegmentId, UnmountReason, Version};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Mounts a node's segment; apply assigns the node id (by name) and the next generation, and
    /// drops every older generation of the node.
    MountSegment {
        node_name: String,
        /// The id in the sidecar's state file (0: none); used for a name never seen before.
        node_id_hint: u64,
        capacity: u64,
        data_addrs: Vec<String>,
        now_ms: u64,
    },
    UnmountSegment {
        segment: SegmentId,
        reason: UnmountReason,
    },
    /// Makes a reservation an object. Apply re-checks that the key is new, the segments are
    /// mounted and the extents free.
    CommitPut {
        key: String,
        size: u64,
        replicas: Vec<Replica>,
        checksum: u64,
        version: Version,
        pin: Pin,
        expires_ms: u64,
    },
    Remove {
        keys: Vec<String>,
    },
    RemoveAll,
    /// Victims chosen by the leader's eviction policy.
    Evict {
        keys: Vec<String>,
    },
    MetaPut {
        key: String,
        value: Vec<u8>,
    },
    MetaDelete {
        key: String,
    },
    /// Removes objects whose TTL passed and lapses soft pins, as of `now_ms`.
    ExpirePins {
        now_ms: u64,
    },
    /// Stops placements on a segment; the leader unmounts it when empty or at the deadline.
    DrainSegment {
        segment: SegmentId,
        deadline_ms: u64,
    },
    /// A `CommitPut` that replaces the object under the key, if any (Mooncake's upsert): apply
    /// checks the new placement first, then unlinks the old object (its extents freed as by a
    /// remove) and links the new one, in one step. Last in the enum: log entries written before
    /// it existed keep their encoding.
    UpsertPut {
        key: String,
        size: u64,
        replicas: Vec<Replica>,
        checksum: u64,
        version: Version,
        pin: Pin,
        expires_ms: u64,
    },
    /// Objects a node copied from its memory to its disk tier (offload orders done, docs/ssd.md):
    /// each object still of that version loses its pieces on the node's current segment
    /// (freed) and gains one disk piece. After `UpsertPut`: earlier entries keep their encoding.
    MoveToDisk {
        node: NodeId,
        items: Vec<DiskMove>,
    },
    /// Disk replicas a node no longer holds (its disk's own eviction, a damaged record, a
    /// failed disk, a reconciliation after its restart): an object left with no replica is
    /// removed.
    DropFromDisk {
        node: NodeId,
        items: Vec<(String, Version)>,
    },
    /// A disk-only object copied back into memory (promotion on a hit, docs/ssd.md): the object
    /// still of `version` gains `replica` (the extents of the promotion's `reservation`, which
    /// apply re-checks are free) and keeps its disk replica. After `DropFromDisk`.
    PromoteToMemory {
        key: String,
        version: Version,
        reservation: Version,
        replica: Replica,
    },
    /// Write-through copies: each object still of that version gains a disk replica on `node`
    /// and keeps its memory pieces. After `PromoteToMemory`.
    CopyToDisk {
        node: NodeId,
        items: Vec<DiskMove>,
    },
}

/// One object moved to disk `disk` of a node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskMove {
    pub key: String,
    pub version: Version,
    pub disk: u32,
}

impl Command {
    /// A short name for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Command::MountSegment { .. } => "mount_segment",
            Command::UnmountSegment { .. } => "unmount_segment",
            Command::CommitPut { .. } => "commit_put",
            Command::Remove { .. } => "remove",
            Command::RemoveAll => "remove_all",
            Command::Evict { .. } => "evict",
            Command::MetaPut { .. } => "meta_put",
            Command::MetaDelete { .. } => "meta_delete",
            Command::ExpirePins { .. } => "expire_pins",
            Command::DrainSegment { .. } => "drain_segment",
            Command::UpsertPut { .. } => "upsert_put",
            Command::MoveToDisk { .. } => "move_to_disk",
            Command::DropFromDisk { .. } => "drop_from_disk",
            Command::PromoteToMemory { .. } => "promote_to_memory",
            Command::CopyToDisk { .. } => "copy_to_disk",
        }
    }
}

/// The payload of one Raft entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Batch(pub Vec<Command>);

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    Mounted {
        node_id: u64,
        generation: u64,
        dropped: u64,
    },
    Unmounted {
        dropped: u64,
    },
    Committed,
    AlreadyExists,
    /// Nothing changed; the reason names the key and what was wrong.
    Conflict(String),
    Removed(Vec<bool>),
    RemovedAll(u64),
    Evicted(u64),
    Meta {
        existed: bool,
    },
    Expired {
        removed: u64,
        unpinned: u64,
    },
    DrainSet,
    /// The command named something that no longer exists (a segment already unmounted).
    Ignored(String),
    /// Per `MoveToDisk` item: whether the object now has that disk replica.
    MovedToDisk(Vec<bool>),
    /// `DropFromDisk`: replicas dropped, and objects removed with their last one.
    DroppedFromDisk {
        dropped: u64,
        removed: u64,
    },
    /// Per `CopyToDisk` item: whether the object now has that disk replica.
    CopiedToDisk(Vec<bool>),
}

/// The response to one Raft entry: outcomes in command order (empty for blank and membership
/// entries).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct BatchOutcome(pub Vec<Outcome>);
