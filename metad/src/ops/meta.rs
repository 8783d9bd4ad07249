//! The metadata KV (Mooncake's HTTP metadata server, replicated through Raft): get is a read of
//! the applied state; put and delete are proposals.

use crate::command::{Command, Outcome};
use crate::config::MAX_META_VALUE;
use crate::error::{Error, Result};
use crate::ops::Ops;

/// A value larger than [`MAX_META_VALUE`] is refused.
pub fn check_value(key: &str, len: usize) -> Result<()> {
    if len > MAX_META_VALUE {
        return Err(Error::InvalidArgument(format!(
            "metadata value of {len} bytes for {key:?} exceeds {MAX_META_VALUE}"
        )));
    }
    Ok(())
}

impl Ops {
    /// The value under `key`, if any.
    pub async fn meta_get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.check_keys(&[key])?;
        self.read().await?;
        Ok(self.core.lock().sm().meta_get(key).map(|v| v.to_vec()))
    }

    /// Stores `value` under `key`; whether a value was there before.
    pub async fn meta_put(&self, key: String, value: Vec<u8>) -> Result<bool> {
        self.check_keys(std::slice::from_ref(&key))?;
        check_value(&key, value.len())?;
        self.leader().await?;
        match self.propose(Command::MetaPut { key, value }).await? {
            Outcome::Meta { existed } => Ok(existed),
            other => Err(Error::Internal(format!("meta_put answered {other:?}"))),
        }
    }

    /// Deletes `key`; whether it was there.
    pub async fn meta_delete(&self, key: String) -> Result<bool> {
        self.check_keys(std::slice::from_ref(&key))?;
        self.leader().await?;
        match self.propose(Command::MetaDelete { key }).await? {
            Outcome::Meta { existed } => Ok(existed),
            other => Err(Error::Internal(format!("meta_delete answered {other:?}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_up_to_the_limit_are_accepted() {
        assert!(check_value("k", MAX_META_VALUE).is_ok());
        let e = check_value("k", MAX_META_VALUE + 1).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "invalid argument: metadata value of {} bytes for \"k\" exceeds {MAX_META_VALUE}",
                MAX_META_VALUE + 1
            )
        );
    }
}
