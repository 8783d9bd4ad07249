//! [`Core`]: the replicated state machine together with the leader's in-memory state, behind
//! one lock at the edge. Applies go through here so the leader's bookkeeping follows every
//! change in the same critical section.

use crate::command::{Command, Outcome};
use crate::config::{CacheConfig, Now};
use crate::leader::Leader;
use crate::state::StateMachine;

#[derive(Debug)]
pub struct Core {
    sm: StateMachine,
    leader: Option<Leader>,
    cfg: CacheConfig,
}

impl Core {
    pub fn new(cfg: CacheConfig) -> Self {
        Self {
            sm: StateMachine::new(),
            leader: None,
            cfg,
        }
    }

    pub fn config(&self) -> &CacheConfig {
        &self.cfg
    }

    pub fn sm(&self) -> &StateMachine {
        &self.sm
    }

    /// Applies one command; `now` is the applying node's clock, used only by the leader's
    /// bookkeeping (lease holds), never by the state machine.
    pub fn apply(&mut self, cmd: &Command, now: Now) -> Outcome {
        let mut fx = Vec::new();
        let out = self.sm.apply(cmd, &mut fx);
        if let Some(l) = self.leader.as_mut() {
            for e in &fx {
                l.on_effect(&mut self.sm, e, now);
            }
            l.on_applied_command(cmd, &self.sm);
        }
        out
    }

    /// Replaces the state with an installed snapshot. Only followers install snapshots; a leader
    /// state, if any, no longer matches and is dropped.
    pub fn install(&mut self, sm: StateMachine) {
        self.sm = sm;
        self.leader = None;
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
