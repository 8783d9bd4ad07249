//! The disk tier's reports (docs/ssd.md): offload orders done (moves to commit), write-through
//! copies done, promotions done (committed through their reservations) or failed (released),
//! disk replicas a node dropped, and a node's inventory after a restart, reconciled against
//! the metadata.

use crate::command::{Command, DiskMove, Outcome};
use crate::error::{Error, Result};
use crate::ops::put::{CommitItem, Committed};
use crate::types::{NodeId, Version};

use super::Ops;

/// One `DiskReport` from a node.
#[derive(Clone, Debug, Default)]
pub struct DiskReport {
    pub node: NodeId,
    pub moved: Vec<DiskMove>,
    /// Keys of orders not done.
    pub failed: Vec<String>,
    pub dropped: Vec<(String, Version)>,
    pub inventory: bool,
    pub held: Vec<DiskMove>,
    pub inventory_done: bool,
    /// Write-through copies done.
    pub copied: Vec<DiskMove>,
    /// Reservations of promotions done, and of those not done.
    pub promoted: Vec<Version>,
    pub promote_failed: Vec<Version>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DiskReportReply {
    /// Per moved item: committed.
    pub moved: Vec<bool>,
    /// Held records the metadata does not list on the node.
    pub unknown: Vec<DiskMove>,
    /// More orders for the node.
    pub offload: Vec<crate::leader::offload::Order>,
    /// Per copied item: committed.
    pub copied: Vec<bool>,
    /// Per promoted reservation: committed.
    pub promoted: Vec<bool>,
    /// Promotions waiting for the node.
    pub promote: Vec<crate::leader::offload::Promotion>,
}

impl Ops {
    pub async fn disk_report(&self, r: &DiskReport) -> Result<DiskReportReply> {
        self.leader().await?;
        let (unknown, missing) = {
            let mut core = self.core.lock();
            let (l, sm) = core.leader_parts().ok_or(Error::NoLeaderState)?;
            l.offloads.on_report(&r.failed, self.clock.now().mono_ms);
            let mut unknown = Vec::new();
            let mut missing = Vec::new();
            if r.inventory {
                let listed = |k: &str, v: Version| {
                    sm.object(k)
                        .is_some_and(|o| o.version == v && o.replicas.disk_on(r.node).is_some())
                };
                let inv = l.offloads.inventories.entry(r.node).or_default();
                for h in &r.held {
                    if listed(&h.key, h.version) {
                        inv.insert((h.key.clone(), h.version));
                    } else {
                        unknown.push(h.clone());
                    }
                }
                if r.inventory_done {
                    let inv = l.offloads.inventories.remove(&r.node).unwrap_or_default();
                    missing = sm
                        .objects()
                        .filter(|(k, o)| {
                            o.replicas.disk_on(r.node).is_some()
                                && !inv.contains(&(k.to_string(), o.version))
                        })
                        .map(|(k, o)| (k.to_string(), o.version))
                        .collect();
                }
            }
            (unknown, missing)
        };
        let mut moved = vec![false; r.moved.len()];
        if !r.moved.is_empty() {
            match self
                .propose(Command::MoveToDisk {
                    node: r.node,
                    items: r.moved.clone(),
                })
                .await?
            {
                Outcome::MovedToDisk(v) if v.len() == moved.len() => moved = v,
                other => return Err(Error::Internal(format!("move to disk answered {other:?}"))),
            }
        }
        let copied = self.commit_copies(r).await?;
        let promoted = self.commit_promotions(r).await?;
        let mut drop: Vec<(String, Version)> = r.dropped.clone();
        if !missing.is_empty() {
            tracing::info!(
                node = r.node,
                objects = missing.len(),
                "disk replicas the node no longer holds after its restart: dropped"
            );
        }
        drop.extend(missing);
        if !drop.is_empty() {
            self.propose(Command::DropFromDisk {
                node: r.node,
                items: drop,
            })
            .await?;
        }
        let (offload, promote) = {
            let now = self.clock.now();
            let mut core = self.core.lock();
            match core.leader_parts() {
                Some((l, sm)) => {
                    l.plan_offloads(sm, now);
                    (
                        l.offloads.take_orders(r.node),
                        l.offloads.take_promotions(r.node),
                    )
                }
                None => (Vec::new(), Vec::new()),
            }
        };
        Ok(DiskReportReply {
            moved,
            unknown,
            offload,
            copied,
            promoted,
            promote,
        })
    }

    /// Commits the write-through copies a node made (`CopyToDisk`).
    async fn commit_copies(&self, r: &DiskReport) -> Result<Vec<bool>> {
        if r.copied.is_empty() {
            return Ok(Vec::new());
        }
        match self
            .propose(Command::CopyToDisk {
                node: r.node,
                items: r.copied.clone(),
            })
            .await?
        {
            Outcome::CopiedToDisk(v) if v.len() == r.copied.len() => Ok(v),
            other => Err(Error::Internal(format!("copy to disk answered {other:?}"))),
        }
    }

    /// Commits the promotions a node carried out through their reservations (one proposal
    /// round for all), and releases the memory of those it could not.
    async fn commit_promotions(&self, r: &DiskReport) -> Result<Vec<bool>> {
        if !r.promote_failed.is_empty() {
            if let Some((l, _)) = self.core.lock().leader_parts() {
                l.abort(&r.promote_failed);
            }
        }
        if r.promoted.is_empty() {
            return Ok(Vec::new());
        }
        let items: Vec<CommitItem> = r
            .promoted
            .iter()
            .map(|v| CommitItem {
                version: Some(*v),
                checksum: 0,
            })
            .collect();
        let done = self.commit(&items).await?;
        Ok(done.iter().map(|c| matches!(c, Committed::Ok)).collect())
    }
}
