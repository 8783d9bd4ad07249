//! The node's disk tier (docs/ssd.md): one or more disks (`--disk PATH[:SIZE]`), each a
//! directory of bucket files with its own space accounting, eviction order and failure domain.
//!
//! * [`append`] — the write side: records laid into aligned pieces (values copied from their
//!   extents and hashed in cache) while a helper thread writes the piece before.
//! * [`direct`] — aligned buffers, vectored `O_DIRECT` reads, and the two-stage
//!   pipeline that reads one piece of a value while the caller hashes the one before.
//! * [`format`] — the on-disk format: label, bucket headers, records (pure encoding).
//! * [`layout`] — where records lie, sans-I/O: buckets, epochs, the key map, space, the
//!   disk's LRU and compaction candidates.
//! * [`store`] — one disk's I/O (`O_DIRECT` where possible): batched appends with one
//!   `fdatasync`, verified reads, the scan of a disk written before, compaction, failure.
//! * [`tier`] — the node's disks together: opened at start, probed and compacted in the
//!   background, each failing alone.

pub mod append;
pub mod direct;
pub mod format;
pub mod layout;
pub mod store;
pub mod tier;

use std::path::PathBuf;

use regolith_proto::units::parse_size;

pub use store::{Disk, DiskStatus, Dropped, ReadOutcome, ScanReport, WriteItem, Written};
pub use tier::Tier;

/// Runs blocking disk I/O from async code: on a multi-threaded runtime the worker hands its
/// other tasks off first (`block_in_place`); elsewhere (tests) it runs in place.
pub fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// One `--disk PATH[:SIZE]`: a directory on one device, and the most Regolith may use there
/// (default: the file system's free space less a margin, re-checked as it runs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskSpec {
    pub path: PathBuf,
    pub size: Option<u64>,
}

impl std::str::FromStr for DiskSpec {
    type Err = String;

    /// `PATH` or `PATH:SIZE`; a path that itself holds a `:` is taken whole unless what follows
    /// the last `:` is a size.
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s.is_empty() {
            return Err(
                "--disk: empty; expected PATH[:SIZE], e.g. /mnt/nvme0/regolith:2TiB".into(),
            );
        }
        let (path, size) = match s.rsplit_once(':') {
            Some((p, sz)) if !p.is_empty() && sz.starts_with(|c: char| c.is_ascii_digit()) => {
                let size = parse_size(sz).map_err(|e| format!("--disk {s}: {e}"))?;
                if size == 0 {
                    return Err(format!(
                        "--disk {s}: a size of 0 holds nothing; leave the disk out instead"
                    ));
                }
                (p, Some(size))
            }
            _ => (s, None),
        };
        let path = PathBuf::from(path);
        if !path.is_absolute() {
            return Err(format!("--disk {s}: the path must be absolute"));
        }
        Ok(Self { path, size })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_disk_spec_is_a_path_and_an_optional_size() {
        let d: DiskSpec = "/mnt/nvme0/regolith:2TiB".parse().unwrap();
        assert_eq!(d.path, PathBuf::from("/mnt/nvme0/regolith"));
        assert_eq!(d.size, Some(2 << 40));
        let d: DiskSpec = "/mnt/nvme1".parse().unwrap();
        assert_eq!((d.path, d.size), (PathBuf::from("/mnt/nvme1"), None));
        let d: DiskSpec = "/mnt/a:b".parse().unwrap();
        assert_eq!(d.path, PathBuf::from("/mnt/a:b"));
    }

    #[test]
    fn bad_disk_specs_say_why() {
        for (s, why) in [
            ("", "empty"),
            ("relative/dir", "absolute"),
            ("/mnt/x:0", "size of 0"),
            ("/mnt/x:12parsecs", "unit"),
        ] {
            let e = s.parse::<DiskSpec>().unwrap_err();
            assert!(e.contains(why), "{s}: {e}");
        }
    }
}
