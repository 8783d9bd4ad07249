//! Removal (design §3 invariant 6): keys are unlinked at once; their extents are freed when
//! their read leases end.

use crate::command::{Command, Outcome};
use crate::error::{Error, Result};
use crate::ops::Ops;

/// Splits `keys` into runs whose key bytes stay under `max_bytes` (at least one key each), so
/// that no Raft entry of a large remove outgrows the message cap (issue 14, finding 3).
pub fn chunks_by_bytes(keys: Vec<String>, max_bytes: usize) -> Vec<Vec<String>> {
    let mut out: Vec<Vec<String>> = Vec::new();
    let mut bytes = 0;
    for k in keys {
        // Each key costs its bytes plus its length prefix in the entry.
        let cost = k.len() + 8;
        match out.last_mut() {
            Some(run) if bytes + cost <= max_bytes => {
                bytes += cost;
                run.push(k);
            }
            _ => {
                bytes = cost;
                out.push(vec![k]);
            }
        }
    }
    out
}

impl Ops {
    /// Removes `keys`; whether each was there. A batch larger than half an entry's bytes is
    /// proposed as several commands (coalesced into entries below `--max-entry-bytes`); one
    /// that fails fails the call (a retry finds the keys it removed gone).
    pub async fn remove(&self, keys: Vec<String>) -> Result<Vec<bool>> {
        self.check_keys(&keys)?;
        self.leader().await?;
        let runs = chunks_by_bytes(keys, (self.max_entry_bytes / 2).max(1));
        let cmds = runs
            .into_iter()
            .map(|keys| Command::Remove { keys })
            .collect();
        let mut found = Vec::new();
        for out in self.proposer.propose_all(cmds).await {
            match out? {
                Outcome::Removed(f) => found.extend(f),
                other => return Err(Error::Internal(format!("remove answered {other:?}"))),
            }
        }
        Ok(found)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_stay_under_the_byte_cap_and_keep_every_key_in_order() {
        let keys: Vec<String> = (0..1000).map(|i| format!("{i:0>1000}")).collect();
        let runs = chunks_by_bytes(keys.clone(), 64 * 1024);
        assert!(runs.len() > 1);
        for r in &runs {
            assert!(r.iter().map(|k| k.len() + 8).sum::<usize>() <= 64 * 1024);
        }
        assert_eq!(runs.concat(), keys);
        // A key above the cap still travels, alone.
        let big = vec!["x".repeat(100), "y".into()];
        assert_eq!(chunks_by_bytes(big, 10).len(), 2);
        assert!(chunks_by_bytes(vec![], 10).is_empty());
    }
}
