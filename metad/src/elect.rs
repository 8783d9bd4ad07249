//! A fresh random election timeout for every campaign after a split vote.
//!
//! openraft 0.9 draws a replica's election timeout once, when the process starts, and checks it
//! only on its ticks (every 1.5 heartbeat intervals, 150 ms by default). Two replicas whose
//! timeouts round up to the same number of ticks (with 500..800 ms, about 2 pairs in 5) time out
//! together again after every split vote, for as long as they live: each asks the other for its
//! vote within the same few milliseconds, each refuses because it voted for itself, and only
//! scheduling noise ends the run. On a loaded machine that took many seconds (six and more
//! split terms in a row were seen after a leader was killed), during which nothing is served.
//!
//! So while this replica is a candidate, openraft's own election timer is switched off and the
//! next campaign is started here, after a delay drawn anew for each term from
//! `[election_timeout_min, election_timeout_max)` at millisecond resolution, as the Raft paper
//! has it. Followers keep openraft's timer (the first campaign after a leader is lost, with its
//! leader-lease rules); safety is openraft's either way: this only decides when to campaign.
//!
//! A candidate that a peer refused for holding a longer log ([`Outlogged`], told by the Raft
//! network) cannot win while that peer lives, yet each campaign of its own raises its term, and
//! the better-placed peer, which campaigns at its own term + 1, then lands on a term already
//! taken and is refused too (openraft does not raise a voter's term on a request it refuses by
//! log). So such a candidate sits out two more election timeouts before campaigning again: the
//! peer learns its term from its answer and campaigns above it (openraft's own timer holds off
//! likewise after a refusal by log, `smaller_log_timeout`; an election started here bypasses
//! it, so it is kept here).

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::ServerState;

use crate::raft_types::Raft;

/// The highest term in which a peer refused this replica's vote request because its own log is
/// longer (0: none).
#[derive(Clone, Debug, Default)]
pub struct Outlogged(Arc<AtomicU64>);

impl Outlogged {
    /// A vote request of this replica's campaign in `term` was refused by a longer log.
    pub fn saw(&self, term: u64) {
        self.0.fetch_max(term, Ordering::Relaxed);
    }

    /// Whether the campaign in `term` was refused by a longer log.
    pub fn in_term(&self, term: u64) -> bool {
        self.0.load(Ordering::Relaxed) >= term
    }
}

/// A delay drawn uniformly from `[min, max)` (`min` when the range is empty), fresh per call.
pub fn draw(min: Duration, max: Duration, salt: u64) -> Duration {
    let span = max.saturating_sub(min).as_micros() as u64;
    if span == 0 {
        return min;
    }
    let h = RandomState::new().hash_one((salt, Instant::now()));
    min + Duration::from_micros(h % span)
}

/// Watches this replica's state; while it is a candidate, runs its election timer (see the
/// module docs).
pub fn start(raft: Raft, outlogged: Outlogged, min: Duration, max: Duration) {
    tokio::spawn(async move {
        let mut metrics = raft.metrics();
        // The term of the campaign whose timer runs, and when the next campaign is due.
        let mut armed: Option<(u64, tokio::time::Instant)> = None;
        // The term whose campaign already sat out for a longer log.
        let mut held: Option<u64> = None;
        loop {
            let (state, term) = {
                let m = metrics.borrow_and_update();
                (m.state, m.current_term)
            };
            if state == ServerState::Candidate {
                if armed.is_none_or(|(t, _)| t != term) {
                    raft.runtime_config().elect(false);
                    let delay = draw(min, max, term);
                    tracing::debug!(term, ?delay, "campaigning; next campaign, if this one fails, after a fresh random timeout");
                    armed = Some((term, tokio::time::Instant::now() + delay));
                }
            } else if armed.take().is_some() {
                raft.runtime_config().elect(true);
            }
            let changed = match armed {
                Some((term, due)) => tokio::select! {
                    r = metrics.changed() => r,
                    _ = tokio::time::sleep_until(due) => {
                        // Still campaigning in that term, and nobody won it: campaign again,
                        // unless a peer with a longer log refused this campaign (module docs).
                        let m = metrics.borrow().clone();
                        let campaigning = m.state == ServerState::Candidate
                            && m.current_term == term
                            && m.current_leader.is_none();
                        let now = tokio::time::Instant::now();
                        if campaigning && outlogged.in_term(term) && held != Some(term) {
                            held = Some(term);
                            let wait = max * 2 + draw(min, max, term);
                            tracing::info!(term, ?wait, "a peer holds a longer log: letting it campaign first");
                            armed = Some((term, now + wait));
                        } else {
                            if campaigning {
                                tracing::info!(term, "split vote or no quorum: campaigning again");
                                if raft.trigger().elect().await.is_err() {
                                    return;
                                }
                            }
                            // Re-armed for the next term once it shows, or again if nothing moved.
                            armed = Some((term, now + draw(min, max, term ^ 1)));
                        }
                        Ok(())
                    }
                },
                None => metrics.changed().await,
            };
            if changed.is_err() {
                return;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_stay_in_range_and_differ() {
        let (min, max) = (Duration::from_millis(500), Duration::from_millis(800));
        let draws: Vec<Duration> = (0..200).map(|i| draw(min, max, i)).collect();
        assert!(draws.iter().all(|d| *d >= min && *d < max));
        let distinct: std::collections::BTreeSet<_> = draws.iter().collect();
        assert!(distinct.len() > 150, "{} distinct of 200", distinct.len());
        assert_eq!(draw(min, min, 7), min);
    }
}
