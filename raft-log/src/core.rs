//! The contract between the persistence layer and the application's state machine.

use openraft::{BasicNode, Entry, LogId, RaftTypeConfig};

/// The application state machine that `raft-log` persists and snapshots.
///
/// `apply` must be deterministic: the same sequence of payloads gives the same state, whether the
/// state was built by replay or restored from a snapshot and replayed. It must not read clocks or
/// random sources.
pub trait StateMachineCore: Send + Sync + 'static {
    /// The openraft type configuration this state machine is used with.
    type C: RaftTypeConfig<
        NodeId = u64,
        Node = BasicNode,
        Entry = Entry<Self::C>,
        SnapshotData = tokio::fs::File,
    >;

    /// Applies the payload of one normal log entry.
    fn apply(
        &mut self,
        log_id: &LogId<u64>,
        data: &<Self::C as RaftTypeConfig>::D,
    ) -> <Self::C as RaftTypeConfig>::R;

    /// The response openraft is given for blank and membership entries.
    fn empty_response(&self) -> <Self::C as RaftTypeConfig>::R;

    /// Writes the whole state, in the application's own versioned format.
    fn write_snapshot(&self, w: &mut dyn std::io::Write) -> std::io::Result<()>;

    /// Replaces the whole state with the one read from `r` (written by `write_snapshot`).
    fn install_snapshot(&mut self, r: &mut dyn std::io::Read) -> std::io::Result<()>;
}
