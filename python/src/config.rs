//! `ReplicateConfig`: how a put is replicated and protected, with Mooncake's attribute names.

use std::time::Duration;

use pyo3::prelude::*;
use regolith_client::ReplicateConfig as ClientConfig;

/// Replication and pinning of a put. Attributes as in Mooncake's `ReplicateConfig`:
/// `replica_num`, `preferred_segment`, `preferred_segments`, `with_soft_pin` (older
/// Mooncakes) and `soft_pin_action` (`SoftPinAction`: 0 PRESERVE, 1 ENABLE, 2 DISABLE),
/// `with_hard_pin`, `prefer_alloc_in_same_node`, `soft_pin_ttl_ms` (None: the cluster's
/// default), plus Regolith's `ttl_ms` (0: no expiry).
///
/// Accepted and kept, with no effect on Regolith (its tiers and groups do not exist here):
/// `nof_replica_num`, `dfs_replica_num`, `preferred_nof_segments`, `data_type`
/// (`ObjectDataType`), `group_ids`.
#[pyclass(
    module = "regolith._native",
    name = "ReplicateConfig",
    get_all,
    set_all
)]
#[derive(Clone, Debug)]
pub struct ReplicateConfig {
    pub replica_num: u32,
    pub preferred_segment: String,
    pub preferred_segments: Vec<String>,
    pub with_soft_pin: bool,
    pub with_hard_pin: bool,
    pub prefer_alloc_in_same_node: bool,
    pub soft_pin_ttl_ms: Option<u64>,
    pub ttl_ms: u64,
    pub soft_pin_action: u8,
    pub nof_replica_num: u32,
    pub dfs_replica_num: u32,
    pub preferred_nof_segments: Vec<String>,
    pub data_type: u8,
    pub group_ids: Option<Vec<String>>,
}

/// `SoftPinAction.ENABLE` and `SoftPinAction.DISABLE` (PRESERVE, 0, leaves `with_soft_pin`).
const SOFT_PIN_ENABLE: u8 = 1;
const SOFT_PIN_DISABLE: u8 = 2;

impl Default for ReplicateConfig {
    fn default() -> Self {
        Self {
            replica_num: 1,
            preferred_segment: String::new(),
            preferred_segments: Vec::new(),
            with_soft_pin: false,
            with_hard_pin: false,
            prefer_alloc_in_same_node: false,
            soft_pin_ttl_ms: None,
            ttl_ms: 0,
            soft_pin_action: 0,
            nof_replica_num: 0,
            dfs_replica_num: 0,
            preferred_nof_segments: Vec::new(),
            data_type: 0,
            group_ids: None,
        }
    }
}

impl ReplicateConfig {
    /// The client's config: `preferred_segment` first, then `preferred_segments`, no repeats.
    pub fn to_client(&self) -> ClientConfig {
        let mut preferred: Vec<String> = Vec::new();
        let names = std::iter::once(&self.preferred_segment).chain(&self.preferred_segments);
        for name in names {
            if !name.is_empty() && !preferred.contains(name) {
                preferred.push(name.clone());
            }
        }
        ClientConfig {
            replica_num: self.replica_num.max(1),
            preferred_segments: preferred,
            prefer_local: self.prefer_alloc_in_same_node,
            soft_pin: match self.soft_pin_action {
                SOFT_PIN_ENABLE => true,
                SOFT_PIN_DISABLE => false,
                _ => self.with_soft_pin,
            },
            hard_pin: self.with_hard_pin,
            soft_pin_ttl: millis(self.soft_pin_ttl_ms.unwrap_or(0)),
            ttl: millis(self.ttl_ms),
            upsert: false,
        }
    }
}

fn millis(ms: u64) -> Option<Duration> {
    (ms > 0).then(|| Duration::from_millis(ms))
}

/// The client's config for an optional Python `ReplicateConfig` (defaults when None).
pub fn client_config(cfg: Option<PyRef<'_, ReplicateConfig>>) -> ClientConfig {
    cfg.map(|c| c.to_client())
        .unwrap_or_else(|| ReplicateConfig::default().to_client())
}

#[pymethods]
impl ReplicateConfig {
    #[new]
    #[pyo3(signature = (
        *,
        replica_num = 1,
        preferred_segment = String::new(),
        preferred_segments = Vec::new(),
        with_soft_pin = false,
        with_hard_pin = false,
        prefer_alloc_in_same_node = false,
        soft_pin_ttl_ms = None,
        ttl_ms = 0,
        soft_pin_action = 0
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        replica_num: u32,
        preferred_segment: String,
        preferred_segments: Vec<String>,
        with_soft_pin: bool,
        with_hard_pin: bool,
        prefer_alloc_in_same_node: bool,
        soft_pin_ttl_ms: Option<u64>,
        ttl_ms: u64,
        soft_pin_action: u8,
    ) -> Self {
        Self {
            replica_num,
            preferred_segment,
            preferred_segments,
            with_soft_pin,
            with_hard_pin,
            prefer_alloc_in_same_node,
            soft_pin_ttl_ms,
            ttl_ms,
            soft_pin_action,
            ..Self::default()
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "ReplicateConfig(replica_num={}, preferred_segment={:?}, preferred_segments={:?}, \
             with_soft_pin={}, with_hard_pin={}, prefer_alloc_in_same_node={}, \
             soft_pin_ttl_ms={}, ttl_ms={}, soft_pin_action={})",
            self.replica_num,
            self.preferred_segment,
            self.preferred_segments,
            py_bool(self.with_soft_pin),
            py_bool(self.with_hard_pin),
            py_bool(self.prefer_alloc_in_same_node),
            self.soft_pin_ttl_ms
                .map_or_else(|| "None".to_string(), |v| v.to_string()),
            self.ttl_ms,
            self.soft_pin_action
        )
    }
}

fn py_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}
