//! [`Core`]: the replicated state machine together with the leader's in-memory state, behind
//! one lock at the edge. Applies go through here so the leader's bookkeeping follows every
//! change in the same critical section.

use crate::command::{Batch, BatchOutcome, Command, Outcome};
use crate::config::{CacheConfig, Now};
use crate::feed::{Change, Feed, FeedObject};
use crate::leader::Leader;
use crate::state::{Effect, StateMachine};

#[derive(Debug)]
pub struct Core {
    sm: StateMachine,
    leader: Option<Leader>,
    cfg: CacheConfig,
    feed: Feed,
}

impl Core {
    pub fn new(cfg: CacheConfig) -> Self {
        Self {
            sm: StateMachine::new(),
            leader: None,
            feed: Feed::new(cfg.watch_backlog_changes),
            cfg,
        }
    }

    pub fn config(&self) -> &CacheConfig {
        &self.cfg
    }

    pub fn sm(&self) -> &StateMachine {
        &self.sm
    }

    pub fn feed(&self) -> &Feed {
        &self.feed
    }

    /// Applies the entry at log `index`, recording its changes in the watch feed.
    pub fn apply_entry(&mut self, index: u64, batch: &Batch, now: Now) -> BatchOutcome {
        let mut changes = Vec::new();
        let outs: Vec<Outcome> = batch
            .0
            .iter()
            .map(|c| self.apply_into(c, now, Some(&mut changes)))
            .collect();
        self.feed.record(index, changes);
        if tracing::enabled!(target: APPLY_TARGET, tracing::Level::DEBUG) {
            trace_applied(index, batch, &outs);
        }
        BatchOutcome(outs)
    }

    /// Applies one command; `now` is the applying node's clock, used only by the leader's
    /// bookkeeping (lease holds), never by the state machine.
    pub fn apply(&mut self, cmd: &Command, now: Now) -> Outcome {
        self.apply_into(cmd, now, None)
    }

    fn apply_into(
        &mut self,
        cmd: &Command,
        now: Now,
        changes: Option<&mut Vec<Change>>,
    ) -> Outcome {
        let mut fx = Vec::new();
        let out = self.sm.apply(cmd, &mut fx);
        if let Some(l) = self.leader.as_mut() {
            for e in &fx {
                l.on_effect(&mut self.sm, e, now);
            }
            l.on_applied_command(cmd, &self.sm);
        }
        if let Some(mut table) = self.sm.take_removed_table() {
            // The snapshots being written from it take what they need now, under this lock;
            // freeing its objects (seconds at ten million) is no apply's business.
            table.detach_snapshots();
            drop_aside(table);
        }
        if let Some(changes) = changes {
            if matches!(cmd, Command::RemoveAll) {
                // One marker rather than a removal per key.
                changes.push(Change::RemovedAll);
            } else {
                changes.extend(fx.iter().filter_map(|e| change_of(&self.sm, e)));
            }
        }
        out
    }

    /// Replaces the state with an installed snapshot. Only followers install snapshots; a leader
    /// state, if any, no longer matches and is dropped.
    pub fn install(&mut self, sm: StateMachine) {
        let mut old = std::mem::replace(&mut self.sm, sm);
        old.detach_snapshots();
        drop_aside(old);
        self.leader = None;
        self.feed.reset();
    }

    /// Starts leading `term` (idempotent for the same term).
    pub fn become_leader(&mut self, term: u64, now: Now) {
        if self.leader.as_ref().is_some_and(|l| l.term == term) {
            return;
        }
        tracing::info!(
            term,
            keys = self.sm.key_count(),
            "leader state built from the applied state"
        );
        self.leader = Some(Leader::start(term, self.cfg.clone(), &mut self.sm, now));
    }

    pub fn step_down(&mut self) {
        if let Some(l) = self.leader.take() {
            tracing::info!(term = l.term, "leader state dropped");
        }
    }

    pub fn leader(&self) -> Option<&Leader> {
        self.leader.as_ref()
    }

    /// The leader state with mutable access to the state machine beside it.
    pub fn leader_parts(&mut self) -> Option<(&mut Leader, &mut StateMachine)> {
        let l = self.leader.as_mut()?;
        Some((l, &mut self.sm))
    }
}

/// The target of the apply trace: `RUST_LOG=regolith_metad::apply=debug` logs every command
/// applied, with its outcome (replicas compared command by command after an incident).
pub const APPLY_TARGET: &str = "regolith_metad::apply";

/// Keys of the chaos suite's preloaded state, left out of the apply trace (a million of them).
const UNTRACED_PREFIX: &str = "preload/";

fn trace_applied(index: u64, batch: &Batch, outs: &[Outcome]) {
    for (n, (cmd, out)) in batch.0.iter().zip(outs).enumerate() {
        let what = match cmd {
            Command::CommitPut { key, version, .. } | Command::UpsertPut { key, version, .. } => {
                if key.starts_with(UNTRACED_PREFIX) {
                    continue;
                }
                format!("{} {key:?} v{version}", cmd.kind())
            }
            Command::Remove { keys } | Command::Evict { keys } => {
                format!("{} {keys:?}", cmd.kind())
            }
            other => format!("{other:?}"),
        };
        tracing::debug!(target: APPLY_TARGET, index, n, outcome = ?out, "{what}");
    }
}

/// Drops `v` on a thread of its own: a replaced state or a removed object table frees millions
/// of allocations, which must not hold the core's lock (and so the applies and heartbeats).
fn drop_aside<T: Send + 'static>(v: T) {
    let spawned = std::thread::Builder::new()
        .name("metad-drop".into())
        .spawn(move || drop(v));
    // Without a thread the value was dropped here, by the failed spawn.
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "could not start a thread to free a replaced table; freed inline");
    }
}

/// Begins a snapshot of `core`'s replicated state, written while applies go on: the writer
/// takes the core's lock for one object shard at a time (see `objects`).
pub fn snapshot_view(core: &std::sync::Arc<parking_lot::Mutex<Core>>) -> crate::state::StateView {
    snapshot_view_with(core, |_| {})
}

/// [`snapshot_view`], calling `look` on the state it begins from (under the same lock).
pub fn snapshot_view_with(
    core: &std::sync::Arc<parking_lot::Mutex<Core>>,
    look: impl FnOnce(&StateMachine),
) -> crate::state::StateView {
    let (start, objects) = {
        let mut c = core.lock();
        look(&c.sm);
        c.sm.begin_snapshot()
    };
    let core = core.clone();
    crate::state::StateView {
        start,
        take: Box::new(move |i| objects.take_shard(core.lock().sm.objects_table(), i)),
    }
}

/// What a watcher learns of one effect (read right after the command that caused it).
fn change_of(sm: &StateMachine, e: &Effect) -> Option<Change> {
    match e {
        Effect::Committed { key, .. } | Effect::Shrunk { key } => Some(Change::Put {
            key: key.clone(),
            obj: FeedObject::of(sm.object(key)?),
        }),
        Effect::Removed { key } => Some(Change::Removed { key: key.clone() }),
        Effect::Mounted { segment } => {
            let s = sm.segment(segment)?;
            Some(Change::SegmentUp {
                segment: *segment,
                node_name: s.name.clone(),
                data_addrs: s.data_addrs.clone(),
            })
        }
        Effect::Unmounted { segment } => Some(Change::SegmentDown { segment: *segment }),
        // The command's own marker (`Change::RemovedAll`) stands for it.
        Effect::CommitRejected { .. } | Effect::Freed { .. } | Effect::RemovedAll => None,
    }
}
