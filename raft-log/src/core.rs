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

    /// A consistent view of the whole state as it is now, taken under the state lock and
    /// written after the lock is released, while entries go on being applied. It must be cheap
    /// to take (not a deep copy: copy-on-write structures, or a log of the changes made since,
    /// as Regolith's metad does): applies wait while it is taken. Its writer may take the
    /// application's own locks briefly; it runs without this crate's state lock.
    fn snapshot_view(&self) -> Box<dyn SnapshotView>;

    /// Writes the whole state, in the application's own versioned format.
    fn write_snapshot(&self, w: &mut dyn std::io::Write) -> std::io::Result<()> {
        self.snapshot_view().write(w)
    }

    /// Replaces the whole state with the one read from `r` (written by `write_snapshot`).
    fn install_snapshot(&mut self, r: &mut dyn std::io::Read) -> std::io::Result<()>;
}

/// The state as it was when [`StateMachineCore::snapshot_view`] was called, to be written once.
pub trait SnapshotView: Send {
    /// Writes the state, in the format [`StateMachineCore::install_snapshot`] reads.
    fn write(self: Box<Self>, w: &mut dyn std::io::Write) -> std::io::Result<()>;
}
