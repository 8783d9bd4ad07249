//! The node's disks together: opened at start (a disk that cannot be opened is reported
//! failed, and the node serves without it), probed and compacted in the background, each
//! taken out alone when it fails.

use std::sync::Arc;
use std::time::Duration;

use super::store::{Disk, DiskOptions, DiskStatus};
use super::{DiskSpec, Dropped};

/// How often each disk is probed (presence, read-only, free space) and compacted.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(5);

/// One configured disk: open, or failed at open.
pub enum Slot {
    Open(Arc<Disk>),
    FailedAtOpen { spec: DiskSpec, reason: String },
}

#[derive(Default)]
pub struct Tier {
    pub slots: Vec<Slot>,
    /// Signalled when a get read a disk-only object here (locally or for a peer): metad
    /// may have ordered its promotion (`crate::offload`).
    pub hits: tokio::sync::Notify,
    /// Signalled when a disk fails: its objects' drop is reported at once.
    pub failures: Arc<tokio::sync::Notify>,
    /// Drops a report to metad did not deliver: sent again with the next one.
    unreported: parking_lot::Mutex<Vec<Dropped>>,
}

impl std::fmt::Debug for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tier")
            .field("disks", &self.slots.len())
            .finish()
    }
}

impl Tier {
    /// Opens (and scans) every disk; blocking.
    pub fn open(specs: &[DiskSpec]) -> Self {
        let slots = specs
            .iter()
            .map(|spec| match Disk::open(spec.clone(), &DiskOptions::default()) {
                Ok((disk, report)) => {
                    tracing::info!(
                        disk = %spec.path.display(),
                        disk_id = disk.disk_id(),
                        records = report.records,
                        buckets = report.buckets,
                        scan_ms = report.micros / 1000,
                        capacity = disk.usage().capacity,
                        "disk opened"
                    );
                    Slot::Open(Arc::new(disk))
                }
                Err(e) => {
                    tracing::error!(disk = %spec.path.display(), error = %e, "disk not usable; serving without it");
                    Slot::FailedAtOpen {
                        spec: spec.clone(),
                        reason: e.to_string(),
                    }
                }
            })
            .collect::<Vec<_>>();
        let failures = Arc::new(tokio::sync::Notify::new());
        for s in &slots {
            if let Slot::Open(d) = s {
                d.notify_failure(failures.clone());
            }
        }
        Self {
            slots,
            hits: tokio::sync::Notify::new(),
            failures,
            unreported: parking_lot::Mutex::new(Vec::new()),
        }
    }

    /// A get read an object from a disk here.
    pub fn note_hit(&self) {
        self.hits.notify_one();
    }

    /// [`Tier::open`] for a successor of a hand-over: each disk's lock is waited for (up to
    /// `wait`), since the predecessor holds its disks until it exits, just after the hand-over
    /// commits. Blocking.
    pub fn open_after_predecessor(specs: &[DiskSpec], wait: Duration) -> Self {
        let deadline = std::time::Instant::now() + wait;
        for spec in specs {
            if !wait_for_lock(spec, deadline) {
                tracing::warn!(disk = %spec.path.display(), ?wait, "the predecessor still holds the disk");
            }
        }
        Self::open(specs)
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The disks in service with their numbers (their places in `--disk`).
    pub fn numbered(&self) -> impl Iterator<Item = (u32, &Arc<Disk>)> {
        self.slots.iter().enumerate().filter_map(|(i, s)| match s {
            Slot::Open(d) if !d.is_failed() => Some((i as u32, d)),
            _ => None,
        })
    }

    /// The disk holding the record of `version`, and its key, looking at disk `hint` first.
    pub fn holder(
        &self,
        version: &regolith_proto::common::Version,
        hint: Option<u32>,
    ) -> Option<(&Arc<Disk>, String)> {
        let hinted = hint.and_then(|h| match self.slots.get(h as usize) {
            Some(Slot::Open(d)) if !d.is_failed() => Some(d),
            _ => None,
        });
        hinted
            .into_iter()
            .chain(self.disks())
            .find_map(|d| d.key_of(version).map(|k| (d, k)))
    }

    /// Drops a failed report did not deliver, for the next [`Tier::take_lost`].
    pub fn unreported(&self, dropped: Vec<Dropped>) {
        self.unreported.lock().extend(dropped);
    }

    /// Objects lost with failed disks, and drops a failed report did not deliver, not
    /// reported yet.
    pub fn take_lost(&self) -> Vec<Dropped> {
        let again = std::mem::take(&mut *self.unreported.lock());
        again
            .into_iter()
            .chain(
                self.slots
                    .iter()
                    .filter_map(|s| match s {
                        Slot::Open(d) => Some(d.take_lost()),
                        Slot::FailedAtOpen { .. } => None,
                    })
                    .flatten(),
            )
            .collect()
    }

    /// The disks in service.
    pub fn disks(&self) -> impl Iterator<Item = &Arc<Disk>> {
        self.slots.iter().filter_map(|s| match s {
            Slot::Open(d) if !d.is_failed() => Some(d),
            _ => None,
        })
    }

    pub fn status(&self) -> Vec<DiskStatus> {
        self.slots
            .iter()
            .map(|s| match s {
                Slot::Open(d) => d.status(),
                Slot::FailedAtOpen { spec, reason } => DiskStatus {
                    path: spec.path.display().to_string(),
                    disk_id: String::new(),
                    healthy: false,
                    failure: Some(reason.clone()),
                    direct_io: false,
                    bucket_size: 0,
                    capacity_bytes: 0,
                    used_bytes: 0,
                    allocated_bytes: 0,
                    objects: 0,
                },
            })
            .collect()
    }

    /// One round of upkeep: probe every disk (a failed one is taken out, its objects counted
    /// as lost), compact one bucket on each. Returns damaged records compaction dropped.
    pub fn upkeep(&self) -> Vec<Dropped> {
        let mut dropped = Vec::new();
        for s in &self.slots {
            let Slot::Open(d) = s else { continue };
            if d.is_failed() {
                continue;
            }
            if d.probe().is_err() {
                continue;
            }
            if let Err(e) = d.compact_one(&mut dropped) {
                tracing::warn!(disk = %d.path().display(), error = %e, "compaction");
            }
        }
        dropped.extend(self.take_lost());
        dropped
    }
}

/// Totals over every disk, for the summary log.
pub fn totals(tier: &Tier) -> (u64, u64, u64) {
    tier.disks().fold((0, 0, 0), |(c, u, o), d| {
        let x = d.usage();
        (c + x.capacity, u + x.live, o + x.objects)
    })
}

/// The largest object any disk in service can hold: its largest record less the most a
/// record's head (header, the longest key, padding) may take.
pub fn max_object(tier: &Tier) -> u64 {
    const MAX_HEAD: u64 = 8 << 10;
    tier.disks()
        .map(|d| d.max_record().saturating_sub(MAX_HEAD))
        .max()
        .unwrap_or(0)
}

/// Waits until no process holds `spec`'s lock (its label's `flock`), or `deadline`; answers
/// whether it is free (a disk without a label yet has nothing to wait for).
fn wait_for_lock(spec: &DiskSpec, deadline: std::time::Instant) -> bool {
    let label = spec.path.join(super::format::LABEL_FILE);
    loop {
        let Ok(f) = std::fs::File::open(&label) else {
            return true;
        };
        match nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            // Dropped at once: `Disk::open` takes it for good.
            Ok(_held) => return true,
            Err(_) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(_) => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use regolith_proto::common::Version;

    /// Drops a failed report did not deliver go with the next one, once.
    #[test]
    fn undelivered_drops_are_reported_again() {
        let tier = Tier::default();
        let d = Dropped {
            key: "k".into(),
            version: Version { term: 2, id: 7 },
        };
        tier.unreported(vec![d.clone()]);
        assert_eq!(tier.take_lost(), vec![d]);
        assert!(tier.take_lost().is_empty());
    }
}
