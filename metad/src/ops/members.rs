//! Membership changes of the Raft group: a new member joins as a learner, then becomes a
//! voter; a removed voter leaves the voters, a removed learner the nodes.

use std::collections::BTreeSet;

use openraft::error::RaftError;
use openraft::{BasicNode, ChangeMembers};

use crate::error::{Error, Result};
use crate::ops::{Member, Ops};

/// A refused change is a failed precondition; a fatal Raft error makes the replica unavailable.
fn change_error<E: std::fmt::Display>(what: &str, e: RaftError<u64, E>) -> Error {
    match &e {
        RaftError::APIError(_) => Error::Precondition(format!("{what}: {e}")),
        RaftError::Fatal(_) => Error::Unavailable(format!("{what}: {e}")),
    }
}

impl Ops {
    /// Adds member `id` at `addr` (learner first, then voter); the members after.
    pub async fn add_member(&self, id: u64, addr: &str) -> Result<Vec<Member>> {
        if id == 0 {
            return Err(Error::InvalidArgument("member ids start at 1".into()));
        }
        regolith_proto::client::parse_addrs(addr)
            .map_err(|e| Error::InvalidArgument(e.to_string()))?;
        self.leader().await?;
        tracing::info!(id, %addr, "adding member: learner first");
        self.raft
            .add_learner(
                id,
                BasicNode {
                    addr: addr.to_string(),
                },
                true,
            )
            .await
            .map_err(|e| change_error("add learner", e))?;
        let voters: BTreeSet<u64> = [id].into();
        self.raft
            .change_membership(ChangeMembers::AddVoterIds(voters), false)
            .await
            .map_err(|e| change_error("promote to voter", e))?;
        tracing::info!(id, "member is a voter");
        Ok(self.members())
    }

    /// Removes member `id`; the members after.
    pub async fn remove_member(&self, id: u64) -> Result<Vec<Member>> {
        self.leader().await?;
        let members = self.members();
        if !members.iter().any(|m| m.id == id) {
            return Err(Error::NoSuch(format!("member {id} is not in the cluster")));
        }
        let ids: BTreeSet<u64> = [id].into();
        let change = if members.iter().any(|m| m.id == id && m.voter) {
            ChangeMembers::RemoveVoters(ids)
        } else {
            ChangeMembers::RemoveNodes(ids)
        };
        self.raft
            .change_membership(change, false)
            .await
            .map_err(|e| change_error("remove member", e))?;
        tracing::info!(id, "member removed");
        Ok(self.members())
    }
}
