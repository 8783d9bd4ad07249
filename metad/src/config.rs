//! The cache knobs of the leader's policy (design §4–6), which flags and the TOML file map onto,
//! and the fixed limits on what one request may carry.

use serde::{Deserialize, Serialize};

/// Most keys (or items) in one batch call: `BatchReserve`, `BatchCommit`, `BatchGet`, `Exists`,
/// `Remove`.
pub const MAX_BATCH_KEYS: usize = 65_536;
/// Largest value in the metadata KV (gRPC `MetaPut` and the HTTP body alike).
pub const MAX_META_VALUE: usize = 512 * 1024;
/// Most commands the proposer coalesces into one Raft entry (`--max-entry-bytes` caps its bytes).
pub const MAX_BATCH_COMMANDS: usize = 4096;
/// Most in-flight or released reservations one heartbeat may list.
pub const MAX_HEARTBEAT_LIST: usize = 1_000_000;
/// `ListKeys` page size when the request names none, and the largest page it may ask for.
pub const LIST_KEYS_DEFAULT: usize = 1000;
pub const LIST_KEYS_MAX: usize = 10_000;
/// A node name is 1..=this many printable characters.
pub const MAX_NODE_NAME: usize = 255;
/// A segment larger than this (1 PiB) is refused as implausible.
pub const MAX_SEGMENT_BYTES: u64 = 1 << 50;
/// Most data-plane addresses a segment may announce, and the longest one.
pub const MAX_DATA_ADDRS: usize = 64;
pub const MAX_ADDR_LEN: usize = 255;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CacheConfig {
    /// Read lease granted by a get: freed extents are not reused before it ends.
    pub lease_ttl_ms: u64,
    /// A segment not heard from for this long is declared dead.
    pub node_ttl_ms: u64,
    /// A reservation not committed within this is quarantined.
    pub put_timeout_ms: u64,
    /// Eviction starts above this share of the pool in use...
    pub eviction_high_watermark: f64,
    /// ...and evicts down to `eviction_high_watermark - eviction_ratio`.
    pub eviction_ratio: f64,
    /// Above this share of the pool in use, nodes with a disk tier are asked to offload their
    /// least recently used objects to disk (down to `offload_watermark - eviction_ratio`)
    /// before eviction has to drop any (docs/ssd.md "Offload").
    pub offload_watermark: f64,
    /// A get of an object held only on a disk copies it back into its node's memory when the
    /// pool has room below `offload_watermark - eviction_ratio` (docs/ssd.md "Promotion").
    pub promote_on_hit: bool,
    /// Every put is also copied to the disk tier of each node holding it in memory (the
    /// memory copy stays), so a later offload frees memory without writing.
    pub write_through: bool,
    /// Hard-pinned bytes may take at most this share of the pool.
    pub hard_pin_max_ratio: f64,
    /// Default lifetime of a soft pin.
    pub soft_pin_ttl_ms: u64,
    /// A drained segment is unmounted after this even when objects remain.
    pub drain_timeout_ms: u64,
    pub max_key_len: usize,
    pub max_replicas: u32,
    /// A replica may be split over this many extents when no single free range is large enough.
    pub max_extents_per_replica: usize,
    /// Changes the watch feed keeps for watchers that reconnect (`Watch` resumes from them;
    /// a watcher further behind gets a full snapshot).
    pub watch_backlog_changes: usize,
    /// The metadata KV (Mooncake's HTTP metadata server) may hold at most this many bytes of
    /// keys and values together...
    pub meta_max_bytes: u64,
    /// ...and at most this many keys. A put past either is refused (HTTP 507, gRPC
    /// RESOURCE_EXHAUSTED); the KV is for transfer-engine descriptors, not bulk data.
    pub meta_max_keys: usize,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            lease_ttl_ms: 5_000,
            node_ttl_ms: 10_000,
            put_timeout_ms: 30_000,
            eviction_high_watermark: 0.9,
            eviction_ratio: 0.05,
            offload_watermark: 0.8,
            promote_on_hit: true,
            write_through: false,
            hard_pin_max_ratio: 0.5,
            soft_pin_ttl_ms: 30 * 60_000,
            drain_timeout_ms: 10 * 60_000,
            max_key_len: 4096,
            max_replicas: 8,
            max_extents_per_replica: 16,
            watch_backlog_changes: 131_072,
            meta_max_bytes: 64 << 20,
            meta_max_keys: 65_536,
        }
    }
}

impl CacheConfig {
    /// Checks the values are usable; the message names the knob.
    pub fn validate(&self) -> Result<(), String> {
        let frac = |name: &str, v: f64| {
            if (0.0..=1.0).contains(&v) {
                Ok(())
            } else {
                Err(format!("{name} must be within 0..=1, got {v}"))
            }
        };
        frac("eviction_high_watermark", self.eviction_high_watermark)?;
        frac("eviction_ratio", self.eviction_ratio)?;
        frac("offload_watermark", self.offload_watermark)?;
        if self.offload_watermark > self.eviction_high_watermark {
            return Err("offload_watermark must not exceed eviction_high_watermark".into());
        }
        frac("hard_pin_max_ratio", self.hard_pin_max_ratio)?;
        if self.eviction_ratio > self.eviction_high_watermark {
            return Err("eviction_ratio must not exceed eviction_high_watermark".into());
        }
        for (name, v) in [
            ("lease_ttl_ms", self.lease_ttl_ms),
            ("node_ttl_ms", self.node_ttl_ms),
            ("put_timeout_ms", self.put_timeout_ms),
        ] {
            if v == 0 {
                return Err(format!("{name} must be positive"));
            }
        }
        if self.max_key_len == 0 || self.max_replicas == 0 || self.max_extents_per_replica == 0 {
            return Err(
                "max_key_len, max_replicas and max_extents_per_replica must be positive".into(),
            );
        }
        Ok(())
    }
}

/// The two clocks the leader's logic uses: monotonic milliseconds for its own timers (leases,
/// reservations, liveness) and wall-clock milliseconds for values stamped into the log (TTLs,
/// soft pins), which must mean the same on every replica.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub struct Now {
    pub mono_ms: u64,
    pub wall_ms: u64,
}
