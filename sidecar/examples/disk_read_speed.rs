//! Local disk-tier read throughput of 16 MiB records through `Disk::read` (read, verify,
//! deliver), beside the same files read raw with `O_DIRECT` in the same run:
//!
//! `cargo run --release -p regolith-sidecar --example disk_read_speed [DIR]`
//!
//! DIR (default: the current directory) must be on the device to measure; a temporary
//! directory under it holds 384 MiB while it runs. docs/ssd.md "Measured".

use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::time::Instant;

use regolith_proto::checksum;
use regolith_proto::common::Version;
use regolith_sidecar::disk::store::{Disk, DiskOptions, ReadOutcome, WriteItem};
use regolith_sidecar::disk::DiskSpec;

const LEN: usize = 16 << 20;
const OBJECTS: u64 = 24;
const ROUNDS: usize = 3;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = std::env::args().nth(1).unwrap_or_else(|| ".".into());
    let dir = tempfile::tempdir_in(root)?;
    let spec = DiskSpec {
        path: dir.path().to_path_buf(),
        size: Some(1 << 30),
    };
    let (disk, _) = Disk::open(
        spec,
        &DiskOptions {
            bucket_size: Some(64 << 20),
        },
    )?;
    let keys: Vec<String> = (0..OBJECTS).map(|i| format!("k{i}")).collect();
    for (i, key) in keys.iter().enumerate() {
        let version = Version {
            term: 1,
            id: i as u64 + 1,
        };
        let value: Vec<u8> = (0..LEN).map(|j| (j * 31 + i) as u8).collect();
        let item = WriteItem {
            key,
            version,
            checksum: checksum::checksum(version.seed(), &value),
            value: &[&value],
            relocate: false,
        };
        disk.write_batch(&[item])?;
    }
    let mut buf = memmap2::MmapMut::map_anon(LEN + 4096)?;
    for round in 0..ROUNDS {
        let raw = raw_read_gbps(dir.path())?;
        // Aligned (a registered buffer) and one byte off (through the bounce slots).
        for shift in [0usize, 1] {
            let t = Instant::now();
            let mut bytes = 0u64;
            for key in &keys {
                match disk.read(key, None, &mut buf[shift..shift + LEN])? {
                    ReadOutcome::Hit { len } => bytes += len,
                    other => return Err(format!("{key}: {other:?}").into()),
                }
            }
            let gbps = bytes as f64 / t.elapsed().as_secs_f64() / 1e9;
            println!(
                "round {round} dst+{shift}: {gbps:.2} GB/s, raw O_DIRECT read {raw:.2} GB/s, ratio {:.2}",
                gbps / raw
            );
        }
    }
    Ok(())
}

/// Every bucket file of `dir` read once with 8 MiB `O_DIRECT` reads.
fn raw_read_gbps(dir: &std::path::Path) -> Result<f64, Box<dyn std::error::Error>> {
    let mut buf = memmap2::MmapMut::map_anon(8 << 20)?;
    let t = Instant::now();
    let mut bytes = 0u64;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "rgl") {
            continue;
        }
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::fcntl::OFlag::O_DIRECT.bits())
            .open(&path)?;
        let mut pos = 0u64;
        loop {
            let n = f.read_at(&mut buf[..], pos)?;
            if n == 0 {
                break;
            }
            pos += n as u64;
        }
        bytes += pos;
    }
    Ok(bytes as f64 / t.elapsed().as_secs_f64() / 1e9)
}
