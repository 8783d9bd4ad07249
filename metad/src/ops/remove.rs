//! Removal (design §3 invariant 6): keys are unlinked at once; their extents are freed when
//! their read leases end.

use crate::command::{Command, Outcome};
use crate::error::{Error, Result};
use crate::ops::Ops;

impl Ops {
    /// Removes `keys`; whether each was there.
    pub async fn remove(&self, keys: Vec<String>) -> Result<Vec<bool>> {
        self.check_keys(&keys)?;
        self.leader().await?;
        match self.propose(Command::Remove { keys }).await? {
            Outcome::Removed(found) => Ok(found),
            other => Err(Error::Internal(format!("remove answered {other:?}"))),
        }
    }

    /// Removes every object; how many there were.
    pub async fn remove_all(&self) -> Result<u64> {
        self.leader().await?;
        match self.propose(Command::RemoveAll).await? {
            Outcome::RemovedAll(n) => Ok(n),
            other => Err(Error::Internal(format!("remove_all answered {other:?}"))),
        }
    }
}
