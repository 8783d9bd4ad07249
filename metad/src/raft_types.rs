//! The openraft type configuration of the metadata group.

use crate::command::{Batch, BatchOutcome};

openraft::declare_raft_types!(
    /// Raft types of regolith-metad: entries carry a [`Batch`] of commands.
    pub TypeConfig:
        D = Batch,
        R = BatchOutcome,
        NodeId = u64,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = tokio::fs::File,
        AsyncRuntime = openraft::TokioRuntime,
);

pub type Raft = openraft::Raft<TypeConfig>;
pub type NodeId = u64;
pub type LogId = openraft::LogId<NodeId>;
