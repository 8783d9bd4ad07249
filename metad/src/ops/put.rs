//! The write path on the leader (design §4): reserve, commit, abort.
//!
//! * Reserve answers from the shadow allocator without a Raft round. Items that found no space
//!   get one eviction round (one `Evict` proposal sized to what they asked for) and one retry.
//! * Commit turns each live reservation into a `CommitPut`; the commits of one call are
//!   proposed together (usually one entry, one fsync). A commit whose proposal failed stays
//!   quarantined with the leader (it may still be applied), and when the call carried a single
//!   commit the call as a whole fails, so the writer starts over with a fresh reservation
//!   rather than trusting a partial answer.

use crate::command::{Command, Outcome};
use crate::config::Now;
use crate::error::{Error, Result};
use crate::leader::{CommitStep, Leader, PutRequest, Reserved};
use crate::ops::{check_batch, Ops};
use crate::state::StateMachine;
use crate::types::Version;

/// One commit of a batch: the reservation it ends (absent on a malformed request) and the
/// checksum its writer computed.
#[derive(Clone, Debug)]
pub struct CommitItem {
    pub version: Option<Version>,
    pub checksum: u64,
}

/// What became of one commit.
#[derive(Debug)]
pub enum Committed {
    /// Applied now, or already applied (a re-sent commit).
    Ok,
    /// Another put committed the key first (`ALREADY_EXISTS`).
    AlreadyExists(Version),
    /// Apply refused it; the reason names the key and what was wrong.
    Conflict(String),
    /// Refused before a proposal (stale, expired, malformed), or its proposal failed.
    Refused(Error),
}

/// Eviction rounds a reservation that finds no space may take (each its own eviction, or one
/// already in flight waited for), then a retry.
const EVICTION_ROUNDS: usize = 2;
/// How long a reservation waits for an eviction already in flight.
const EVICTION_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The first reservation attempt of a batch.
#[derive(Debug)]
pub(crate) struct FirstRound {
    pub out: Vec<Result<Reserved>>,
    /// Items that found no space, to retry after eviction...
    pub retry: Vec<usize>,
    /// ...and the bytes they need together (size × replicas).
    pub need: u64,
}

/// Reserves every item once; notes those that found no space.
pub(crate) fn first_round(
    l: &mut Leader,
    sm: &StateMachine,
    items: &[PutRequest],
    now: Now,
) -> FirstRound {
    let mut retry = Vec::new();
    let mut need = 0u64;
    let out = items
        .iter()
        .enumerate()
        .map(|(i, it)| {
            let r = l.reserve(sm, it, now);
            if matches!(r, Err(Error::NoSpace { .. })) {
                need += it.size.saturating_mul(it.replicas.max(1) as u64);
                retry.push(i);
            }
            r
        })
        .collect();
    FirstRound { out, retry, need }
}

/// The commits of a batch after the leader looked at them: final answers, and the commands
/// to propose for the rest.
#[derive(Debug)]
pub(crate) struct CommitPlan {
    pub out: Vec<Option<Committed>>,
    /// (item index, reservation) of each command in `cmds`.
    pub proposed: Vec<(usize, Version)>,
    /// The `CommitPut`s to propose together.
    pub cmds: Vec<Command>,
}

pub(crate) fn plan_commits(l: &mut Leader, items: &[CommitItem], now: Now) -> CommitPlan {
    let mut plan = CommitPlan {
        out: Vec::with_capacity(items.len()),
        proposed: Vec::new(),
        cmds: Vec::new(),
    };
    for (i, it) in items.iter().enumerate() {
        let step = it
            .version
            .ok_or_else(|| Error::InvalidArgument("missing reservation version".into()))
            .and_then(|v| l.commit(v, it.checksum, now).map(|s| (v, s)));
        plan.out.push(match step {
            Ok((_, CommitStep::AlreadyCommitted)) => Some(Committed::Ok),
            Ok((v, CommitStep::Propose(cmd))) => {
                plan.proposed.push((i, v));
                plan.cmds.push(cmd);
                None
            }
            Err(e) => Some(Committed::Refused(e)),
        });
    }
    plan
}

/// Fills in the proposals' results (`results` in the order of `plan.proposed`). Each commit
/// whose proposal failed is handed to `failed` (the leader quarantines it). A call of one
/// commit whose proposal failed fails as a whole, with that error.
pub(crate) fn settle_commits(
    plan: CommitPlan,
    results: Vec<Result<Outcome>>,
    mut failed: impl FnMut(Version),
) -> Result<Vec<Committed>> {
    let CommitPlan {
        mut out, proposed, ..
    } = plan;
    let mut replication_failed = false;
    let mut results = results.into_iter();
    for (i, v) in proposed {
        let r = results
            .next()
            .unwrap_or_else(|| Err(Error::Raft("fewer outcomes than proposals".into())));
        out[i] = Some(match r {
            Ok(Outcome::Committed) => Committed::Ok,
            Ok(Outcome::AlreadyExists) => Committed::AlreadyExists(v),
            Ok(Outcome::Conflict(why)) => Committed::Conflict(why),
            Ok(other) => {
                Committed::Refused(Error::Internal(format!("unexpected outcome {other:?}")))
            }
            Err(e) => {
                failed(v);
                replication_failed = true;
                Committed::Refused(e)
            }
        });
    }
    let mut out: Vec<Committed> = out
        .into_iter()
        .map(|c| {
            c.unwrap_or(Committed::Refused(Error::Internal(
                "commit left unanswered".into(),
            )))
        })
        .collect();
    if replication_failed && out.len() == 1 {
        if let Some(Committed::Refused(e)) = out.pop() {
            return Err(e);
        }
    }
    Ok(out)
}

impl Ops {
    /// Reserves a batch; items that found no space get up to [`EVICTION_ROUNDS`] eviction
    /// rounds (their own, or one already in flight waited for) and a retry after each.
    /// Per-item refusals are in the answer; the call fails only when this replica cannot serve.
    pub async fn reserve(&self, items: &[PutRequest]) -> Result<Vec<Result<Reserved>>> {
        check_batch(items.len(), "items")?;
        self.leader().await?;
        if self.gate.handing_over() {
            // A reservation made now would likely die with this leader's term: wait for the
            // hand-over, then reserve here or send the writer to the new leader.
            self.gate.hand_over_ended().await;
            self.leader().await?;
        }
        // A reservation for a writer that gave up would hold its key (ALREADY_EXISTS to the
        // next put of it) and its space until it expired.
        if let Err(e) = crate::deadline::check() {
            self.metrics.requests_past_deadline.inc();
            return Err(e);
        }
        let mut round = {
            let now = self.clock.now();
            let mut core = self.core.lock();
            let (l, sm) = core.leader_parts().ok_or(Error::NoLeaderState)?;
            first_round(l, sm, items, now)
        };
        for _ in 0..EVICTION_ROUNDS {
            if round.retry.is_empty() {
                break;
            }
            let step = {
                let now = self.clock.now();
                let mut core = self.core.lock();
                let Some((l, sm)) = core.leader_parts() else {
                    break;
                };
                match l.eviction_due(sm, now, round.need) {
                    Some(cmd) => Some(cmd),
                    // Nothing left to evict but what an eviction in flight (another put's,
                    // or the watermark's) already takes: the space it frees may be this
                    // put's.
                    None if l.eviction_in_flight() => None,
                    None => break,
                }
            };
            match step {
                Some(cmd) => {
                    if let Err(e) = self.propose(cmd).await {
                        tracing::warn!(error = %e, "eviction for a reservation failed");
                    }
                }
                None => self.eviction_applied(EVICTION_WAIT).await,
            }
            // No reservation for a writer that gave up meanwhile (see the first check).
            if crate::deadline::check().is_err() {
                self.metrics.requests_past_deadline.inc();
                break;
            }
            self.retry_reservations(items, &mut round);
        }
        Ok(round.out)
    }

    /// Waits until no eviction of this leader is in flight (applied, or the leader gone), for
    /// `most` at the longest.
    async fn eviction_applied(&self, most: std::time::Duration) {
        let mut applied = self.applied.clone();
        let wait = async {
            loop {
                let in_flight = self
                    .core
                    .lock()
                    .leader_parts()
                    .is_some_and(|(l, _)| l.eviction_in_flight());
                if !in_flight || applied.changed().await.is_err() {
                    return;
                }
            }
        };
        let left = crate::deadline::current().map(|d| {
            std::time::Duration::from_millis(d.saturating_sub(regolith_proto::auth::unix_ms()))
        });
        let _ = tokio::time::timeout(left.map_or(most, |l| l.min(most)), wait).await;
    }

    /// Reserves again the items of `round` that found no space; those that still find none
    /// stay to retry, with the bytes they need.
    fn retry_reservations(&self, items: &[PutRequest], round: &mut FirstRound) {
        let now = self.clock.now();
        let mut core = self.core.lock();
        let Some((l, sm)) = core.leader_parts() else {
            return;
        };
        let mut still = Vec::new();
        let mut need = 0u64;
        for &i in &round.retry {
            round.out[i] = l.reserve(sm, &items[i], now);
            if matches!(round.out[i], Err(Error::NoSpace { .. })) {
                need += items[i]
                    .size
                    .saturating_mul(items[i].replicas.max(1) as u64);
                still.push(i);
            }
        }
        round.retry = still;
        round.need = need;
    }

    /// Commits a batch: one proposal round for all of it (see the module's rule on failures).
    pub async fn commit(&self, items: &[CommitItem]) -> Result<Vec<Committed>> {
        check_batch(items.len(), "items")?;
        self.leader().await?;
        let now = self.clock.now();
        let mut plan = {
            let mut core = self.core.lock();
            let (l, _) = core.leader_parts().ok_or(Error::NoLeaderState)?;
            plan_commits(l, items, now)
        };
        let results = self
            .proposer
            .propose_all(std::mem::take(&mut plan.cmds))
            .await;
        settle_commits(plan, results, |v| {
            if let Some((l, _)) = self.core.lock().leader_parts() {
                l.commit_failed(v);
            }
        })
    }

    /// The writer gave up on these reservations: they are quarantined until their segments'
    /// owners release them.
    pub async fn abort(&self, versions: &[Version]) -> Result<()> {
        self.leader().await?;
        if let Some((l, _)) = self.core.lock().leader_parts() {
            l.abort(versions);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::CacheConfig;
    use crate::core::Core;
    use crate::leader::Heartbeat;

    const NOW: Now = Now {
        mono_ms: 10_000,
        wall_ms: 10_000,
    };

    /// A leader of term 1 over one heartbeated segment of `capacity` bytes.
    fn leader_core(capacity: u64) -> Core {
        let mut core = Core::new(CacheConfig::default());
        core.apply(
            &Command::MountSegment {
                node_name: "a".into(),
                node_id_hint: 0,
                capacity,
                data_addrs: vec!["127.0.0.1:1".into()],
                now_ms: 0,
            },
            NOW,
        );
        core.become_leader(1, NOW);
        let segment = core.sm().segments().next().unwrap().id;
        let (l, sm) = core.leader_parts().unwrap();
        l.heartbeat(
            sm,
            &Heartbeat {
                segment,
                ..Default::default()
            },
            NOW,
        );
        core
    }

    fn put(key: &str, size: u64, replicas: u32) -> PutRequest {
        PutRequest {
            key: key.into(),
            size,
            replicas,
            ..Default::default()
        }
    }

    #[test]
    fn items_without_space_are_queued_for_one_retry_with_what_they_need() {
        let mut core = leader_core(1 << 20);
        let (l, sm) = core.leader_parts().unwrap();
        // Most of the segment is reserved already.
        l.reserve(sm, &put("filler", 900 << 10, 1), NOW).unwrap();
        let items = [
            put("fits", 4096, 1),
            put("too-big", 512 << 10, 0),
            put("", 10, 1),
            put("also-too-big", 300 << 10, 1),
        ];
        let r = first_round(l, sm, &items, NOW);
        assert!(r.out[0].is_ok(), "{:?}", r.out[0]);
        assert!(
            matches!(r.out[1], Err(Error::NoSpace { .. })),
            "{:?}",
            r.out[1]
        );
        assert!(
            matches!(r.out[2], Err(Error::InvalidArgument(_))),
            "{:?}",
            r.out[2]
        );
        assert!(
            matches!(r.out[3], Err(Error::NoSpace { .. })),
            "{:?}",
            r.out[3]
        );
        // Only no-space items are retried; 0 replicas counts as 1.
        assert_eq!(r.retry, vec![1, 3]);
        assert_eq!(r.need, (512 << 10) + (300 << 10));
    }

    #[test]
    fn commits_are_planned_then_settled_per_item() {
        let mut core = leader_core(1 << 20);
        let (a, b, c) = {
            let (l, sm) = core.leader_parts().unwrap();
            let mut v = |k: &str| l.reserve(sm, &put(k, 4096, 1), NOW).unwrap().version;
            (v("a"), v("b"), v("c"))
        };
        let stale = Version { term: 7, id: 1 };
        let items: Vec<CommitItem> = [Some(a), None, Some(stale), Some(b), Some(c)]
            .into_iter()
            .map(|version| CommitItem {
                version,
                checksum: 42,
            })
            .collect();
        let plan = {
            let (l, _) = core.leader_parts().unwrap();
            plan_commits(l, &items, NOW)
        };
        assert_eq!(plan.proposed, vec![(0, a), (3, b), (4, c)]);
        assert_eq!(plan.cmds.len(), 3);
        assert!(matches!(
            plan.out[1],
            Some(Committed::Refused(Error::InvalidArgument(_)))
        ));
        assert!(matches!(
            plan.out[2],
            Some(Committed::Refused(Error::StaleReservation { .. }))
        ));
        let mut failed = Vec::new();
        let out = settle_commits(
            plan,
            vec![
                Ok(Outcome::Committed),
                Ok(Outcome::AlreadyExists),
                Err(Error::Raft("leadership lost".into())),
            ],
            |v| failed.push(v),
        )
        .unwrap();
        // In a batch, a failed replication is one item's answer, not the call's.
        assert_eq!(failed, vec![c]);
        assert!(matches!(out[0], Committed::Ok));
        assert!(matches!(out[3], Committed::AlreadyExists(v) if v == b));
        assert!(matches!(&out[4], Committed::Refused(Error::Raft(m)) if m == "leadership lost"));
    }

    #[test]
    fn a_single_commit_whose_replication_failed_fails_the_call() {
        let mut core = leader_core(1 << 20);
        let (l, sm) = core.leader_parts().unwrap();
        let v = l.reserve(sm, &put("k", 4096, 1), NOW).unwrap().version;
        let items = [CommitItem {
            version: Some(v),
            checksum: 1,
        }];
        let plan = plan_commits(l, &items, NOW);
        let mut failed = Vec::new();
        let r = settle_commits(plan, vec![Err(Error::NotLeader { leader: None })], |v| {
            failed.push(v)
        });
        assert!(matches!(r, Err(Error::NotLeader { leader: None })), "{r:?}");
        assert_eq!(failed, vec![v]);
        // Refused before any proposal: an item answer even for a single commit.
        let plan = plan_commits(l, &items, NOW);
        assert!(plan.proposed.is_empty(), "already being committed");
        let out = settle_commits(plan, vec![], |_| unreachable!()).unwrap();
        assert!(matches!(
            out[0],
            Committed::Refused(Error::InvalidArgument(_))
        ));
        // An apply refusal is an answer too, not a failed replication.
        let v2 = l.reserve(sm, &put("k2", 4096, 1), NOW).unwrap().version;
        let plan = plan_commits(
            l,
            &[CommitItem {
                version: Some(v2),
                checksum: 1,
            }],
            NOW,
        );
        let out = settle_commits(
            plan,
            vec![Ok(Outcome::Conflict("overlap".into()))],
            |_| unreachable!(),
        )
        .unwrap();
        assert!(matches!(&out[0], Committed::Conflict(m) if m == "overlap"));
    }

    #[test]
    fn a_re_sent_commit_of_an_applied_reservation_answers_ok_without_a_proposal() {
        let mut core = leader_core(1 << 20);
        let v = {
            let (l, sm) = core.leader_parts().unwrap();
            l.reserve(sm, &put("k", 4096, 1), NOW).unwrap().version
        };
        let items = [CommitItem {
            version: Some(v),
            checksum: 9,
        }];
        let plan = {
            let (l, _) = core.leader_parts().unwrap();
            plan_commits(l, &items, NOW)
        };
        let cmd = plan.cmds[0].clone();
        assert_eq!(core.apply(&cmd, NOW), Outcome::Committed);
        let (l, _) = core.leader_parts().unwrap();
        let again = plan_commits(l, &items, NOW);
        assert!(again.proposed.is_empty() && again.cmds.is_empty());
        assert!(matches!(again.out[0], Some(Committed::Ok)));
    }
}
