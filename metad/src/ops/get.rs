//! Reads of the applied state (design §5): placements with a read lease, existence without
//! one, and the paged key listing. Each passes the read gate first.

use crate::config::{LIST_KEYS_DEFAULT, LIST_KEYS_MAX};
use crate::error::{Error, Result};
use crate::leader::Placement;
use crate::ops::Ops;
use crate::types::Pin;

/// One key of a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyInfo {
    pub key: String,
    pub size: u64,
    pub replicas: u32,
    pub pin: Pin,
}

/// A page of keys; `next_start_after` is empty on the last page.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyPage {
    pub keys: Vec<KeyInfo>,
    pub next_start_after: String,
}

/// The page size a `ListKeys` asking for `limit` gets.
pub fn page_size(limit: u32) -> usize {
    match limit {
        0 => LIST_KEYS_DEFAULT,
        n => (n as usize).min(LIST_KEYS_MAX),
    }
}

impl Ops {
    /// Placements of `keys` (None: not found), each with a read lease for `requester`.
    pub async fn get(&self, keys: &[String], requester: u64) -> Result<Vec<Option<Placement>>> {
        self.check_keys(keys)?;
        self.read().await?;
        let now = self.clock.now();
        let mut core = self.core.lock();
        let (l, sm) = core.leader_parts().ok_or(Error::NoLeaderState)?;
        Ok(l.get(sm, keys, requester, now))
    }

    /// Whether each key exists; grants no lease (design §5).
    pub async fn exists(&self, keys: &[String]) -> Result<Vec<bool>> {
        self.check_keys(keys)?;
        self.read().await?;
        let core = self.core.lock();
        Ok(keys.iter().map(|k| core.sm().contains(k)).collect())
    }

    /// Keys under `prefix` after `start_after`, in order; a page of [`page_size`]`(limit)`.
    pub async fn list_keys(&self, prefix: &str, start_after: &str, limit: u32) -> Result<KeyPage> {
        let max = self.cache.max_key_len;
        if prefix.len() > max || start_after.len() > max {
            return Err(Error::InvalidArgument(format!(
                "prefix or start_after longer than {max} bytes"
            )));
        }
        let limit = page_size(limit);
        self.read().await?;
        let core = self.core.lock();
        let page = core.sm().list_keys(prefix, start_after, limit + 1);
        let more = page.len() > limit;
        let keys: Vec<KeyInfo> = page
            .into_iter()
            .take(limit)
            .map(|(k, o)| KeyInfo {
                key: k.to_string(),
                size: o.size,
                replicas: o.replicas.count() as u32,
                pin: o.pin(),
            })
            .collect();
        let next_start_after = if more {
            keys.last().map(|k| k.key.clone()).unwrap_or_default()
        } else {
            String::new()
        };
        Ok(KeyPage {
            keys,
            next_start_after,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_default_and_are_capped() {
        assert_eq!(page_size(0), LIST_KEYS_DEFAULT);
        assert_eq!(page_size(7), 7);
        assert_eq!(page_size(u32::MAX), LIST_KEYS_MAX);
    }
}
