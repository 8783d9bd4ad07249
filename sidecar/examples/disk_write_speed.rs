//! Disk-tier write throughput as an offload writes: batches of 16 MiB records (64 MiB each,
//! the offload's batch) through `Disk::write_batch` (copy from the values' parts, hash,
//! write, one `fdatasync` per batch), beside raw `O_DIRECT` writes of as many bytes with a
//! sync per 64 MiB, in the same run:
//!
//! `cargo run --release -p regolith-sidecar --example disk_write_speed [DIR]`
//!
//! DIR (default: the current directory) must be on the device to measure; a temporary
//! directory under it holds up to 768 MiB while it runs. The values lie in one anonymous
//! mapping cut into 1 MiB parts, as an object's extents lie in a segment. docs/ssd.md
//! "Measured".

use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::time::Instant;

use regolith_proto::checksum;
use regolith_proto::common::Version;
use regolith_sidecar::disk::store::{Disk, DiskOptions, WriteItem, Written};
use regolith_sidecar::disk::DiskSpec;

const LEN: usize = 16 << 20;
const PART: usize = 1 << 20;
const OBJECTS: usize = 24;
const BATCH: usize = 4;
const ROUNDS: usize = 3;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = std::env::args().nth(1).unwrap_or_else(|| ".".into());
    let mut segment = memmap2::MmapMut::map_anon(OBJECTS * LEN)?;
    for (j, b) in segment.iter_mut().enumerate() {
        *b = (j * 31 + j / LEN) as u8;
    }
    let versions: Vec<Version> = (0..OBJECTS)
        .map(|i| Version {
            term: 1,
            id: i as u64 + 1,
        })
        .collect();
    let sums: Vec<u64> = (0..OBJECTS)
        .map(|i| checksum::checksum(versions[i].seed(), &segment[i * LEN..(i + 1) * LEN]))
        .collect();
    let keys: Vec<String> = (0..OBJECTS).map(|i| format!("k{i}")).collect();
    for round in 0..ROUNDS {
        let raw = {
            let dir = tempfile::tempdir_in(&root)?;
            raw_write_gbps(dir.path(), &segment)?
        };
        let dir = tempfile::tempdir_in(&root)?;
        let spec = DiskSpec {
            path: dir.path().to_path_buf(),
            size: Some(1 << 30),
        };
        let (disk, _) = Disk::open(
            spec,
            &DiskOptions {
                bucket_size: Some(128 << 20),
            },
        )?;
        let parts: Vec<Vec<&[u8]>> = (0..OBJECTS)
            .map(|i| segment[i * LEN..(i + 1) * LEN].chunks(PART).collect())
            .collect();
        let t = Instant::now();
        for first in (0..OBJECTS).step_by(BATCH) {
            let items: Vec<WriteItem> = (first..first + BATCH)
                .map(|i| WriteItem {
                    key: &keys[i],
                    version: versions[i],
                    checksum: sums[i],
                    value: &parts[i],
                    relocate: false,
                })
                .collect();
            for (i, w) in disk.write_batch(&items)?.into_iter().enumerate() {
                if w != Written::Ok {
                    return Err(format!("{}: {w:?}", keys[first + i]).into());
                }
            }
        }
        let gbps = (OBJECTS * LEN) as f64 / t.elapsed().as_secs_f64() / 1e9;
        println!(
            "round {round}: write_batch {gbps:.2} GB/s, raw O_DIRECT write {raw:.2} GB/s, ratio {:.2}",
            gbps / raw
        );
    }
    Ok(())
}

/// `data` written to a fresh file in 8 MiB `O_DIRECT` writes straight from it, with an `fdatasync` after
/// every 64 MiB (after a `fallocate`, as a bucket is).
fn raw_write_gbps(dir: &std::path::Path, data: &[u8]) -> Result<f64, Box<dyn std::error::Error>> {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(nix::fcntl::OFlag::O_DIRECT.bits())
        .open(dir.join("raw"))?;
    nix::fcntl::fallocate(
        std::os::fd::AsRawFd::as_raw_fd(&f),
        nix::fcntl::FallocateFlags::empty(),
        0,
        data.len() as i64,
    )?;
    let t = Instant::now();
    // Straight from `data` (page-aligned: a mapping), no copy: the device's own speed.
    for (n, piece) in data.chunks(8 << 20).enumerate() {
        f.write_all_at(piece, (n * (8 << 20)) as u64)?;
        if (n + 1) % 8 == 0 {
            f.sync_data()?;
        }
    }
    f.sync_data()?;
    Ok(data.len() as f64 / t.elapsed().as_secs_f64() / 1e9)
}
