//! Storage settings.

/// How sled trades disk space against write speed (see `sled::Mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SledMode {
    /// Write faster, take more space before segments are compacted. The Raft log is written
    /// sequentially and purged from the front, so space is reclaimed quickly anyway.
    #[default]
    HighThroughput,
    /// Compact more eagerly.
    LowSpace,
}

impl From<SledMode> for sled::Mode {
    fn from(mode: SledMode) -> Self {
        match mode {
            SledMode::HighThroughput => sled::Mode::HighThroughput,
            SledMode::LowSpace => sled::Mode::LowSpace,
        }
    }
}

/// Settings of the log store. Build one with struct-update syntax:
/// `StorageConfig { sled_cache_bytes: 32 << 20, ..Default::default() }`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageConfig {
    /// Size of sled's page cache. The default is 64 MiB: sled's own default (1 GiB) is far too
    /// much for a log that is read back mostly while it is still in the cache.
    pub sled_cache_bytes: u64,
    /// Upper bound, in encoded bytes, of the entries one `limited_get_log_entries` call returns,
    /// i.e. of one AppendEntries request openraft builds. A single entry larger than this is still
    /// returned on its own. The Raft RPC service must accept messages somewhat larger than this.
    pub max_read_bytes: u64,
    /// sled's space/speed trade-off.
    pub sled_mode: SledMode,
    /// Encoded bytes of the newest log entries kept in memory, so that replication and apply
    /// read what was just appended without going to sled (0: none). 64 MiB is seconds of log
    /// at the highest write rates metad sees.
    pub log_cache_bytes: u64,
}

impl Default for StorageConfig {
    fn default() -> Self {
        Self {
            sled_cache_bytes: 64 << 20,
            max_read_bytes: 2 << 20,
            sled_mode: SledMode::default(),
            log_cache_bytes: 64 << 20,
        }
    }
}
