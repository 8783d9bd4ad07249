//! Plugs the [`Core`](crate::core::Core) into `raft-log` as its state machine.

use std::sync::Arc;

use parking_lot::Mutex;

use crate::clock::Clock;
use crate::command::{Batch, BatchOutcome};
use crate::core::Core;
use crate::raft_types::TypeConfig;
use crate::state::StateMachine;

/// A handle on the shared core; `raft-log` owns one and calls `apply` for every committed entry.
pub struct MetadSm {
    pub core: Arc<Mutex<Core>>,
    pub clock: Clock,
    /// The last index applied, for the `Watch` streams waiting on the feed.
    pub applied: tokio::sync::watch::Sender<u64>,
}

impl regolith_raft_log::StateMachineCore for MetadSm {
    type C = TypeConfig;

    fn apply(&mut self, log_id: &openraft::LogId<u64>, data: &Batch) -> BatchOutcome {
        let now = self.clock.now();
        let out = self.core.lock().apply_entry(log_id.index, data, now);
        // Wakes the `Watch` streams; none listening is fine.
        self.applied.send_replace(log_id.index);
        out
    }

    fn empty_response(&self) -> BatchOutcome {
        BatchOutcome::default()
    }

    fn snapshot_view(&self) -> Box<dyn regolith_raft_log::SnapshotView> {
        // Written while entries and requests go on: the core's lock is taken for one object
        // shard at a time.
        Box::new(crate::core::snapshot_view(&self.core))
    }

    fn install_snapshot(&mut self, r: &mut dyn std::io::Read) -> std::io::Result<()> {
        let sm = StateMachine::read_snapshot(r)?;
        self.core.lock().install(sm);
        // Streams see the ring reset and resync.
        self.applied.send_modify(|_| {});
        Ok(())
    }
}
