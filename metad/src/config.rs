//! The cache knobs of the leader's policy (design §4–6). Flags and the TOML file map onto this.

use serde::{Deserialize, Serialize};

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
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            lease_ttl_ms: 5_000,
            node_ttl_ms: 10_000,
            put_timeout_ms: 30_000,
            eviction_high_watermark: 0.9,
            eviction_ratio: 0.05,
            hard_pin_max_ratio: 0.5,
            soft_pin_ttl_ms: 30 * 60_000,
            drain_timeout_ms: 10 * 60_000,
            max_key_len: 4096,
            max_replicas: 8,
            max_extents_per_replica: 16,
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
