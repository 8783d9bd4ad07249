//! The metadata KV (Mooncake's HTTP metadata server, replicated through Raft): get is a read of
//! the applied state; put and delete are proposals.

use crate::command::{Command, Outcome};
use crate::config::{CacheConfig, MAX_META_VALUE};
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
        {
            let core = self.core.lock();
            let sm = core.sm();
            let (keys, bytes) = sm.meta_usage();
            let old = sm.meta_get(&key).map(|v| (key.len() + v.len()) as u64);
            check_quota(&self.cache, &key, value.len(), keys, bytes, old)?;
        }
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

/// Whether a put of `value_len` bytes under `key` fits the KV's quotas, given its usage now
/// (`keys`, `bytes`) and the size of the entry it replaces (`old`). Checked by the leader
/// before proposing; concurrent puts may overshoot by what is in flight, which the HTTP front
/// bounds (a few writes at a time).
pub fn check_quota(
    cache: &CacheConfig,
    key: &str,
    value_len: usize,
    keys: usize,
    bytes: u64,
    old: Option<u64>,
) -> Result<()> {
    let new = (key.len() + value_len) as u64;
    let keys_after = keys + usize::from(old.is_none());
    let bytes_after = bytes.saturating_sub(old.unwrap_or(0)).saturating_add(new);
    if keys_after > cache.meta_max_keys {
        return Err(Error::MetaQuota(format!(
            "{keys} keys held, at most {} (--meta-max-keys); {key:?} not stored",
            cache.meta_max_keys
        )));
    }
    if bytes_after > cache.meta_max_bytes {
        return Err(Error::MetaQuota(format!(
            "{bytes} bytes held, {new} more for {key:?} would pass {} (--meta-max-bytes)",
            cache.meta_max_bytes
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotas_count_keys_and_bytes_and_credit_a_replaced_value() {
        let cache = CacheConfig {
            meta_max_bytes: 1000,
            meta_max_keys: 2,
            ..CacheConfig::default()
        };
        assert!(check_quota(&cache, "k", 899, 1, 100, None).is_ok());
        let e = check_quota(&cache, "k", 900, 1, 100, None).unwrap_err();
        assert!(e.to_string().contains("--meta-max-bytes"), "{e}");
        // Replacing a value of 500 bytes frees them first.
        assert!(check_quota(&cache, "k", 599, 2, 900, Some(500)).is_ok());
        let e = check_quota(&cache, "new", 1, 2, 10, None).unwrap_err();
        assert!(e.to_string().contains("--meta-max-keys"), "{e}");
        assert!(check_quota(&cache, "old", 1, 2, 10, Some(5)).is_ok());
    }

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
