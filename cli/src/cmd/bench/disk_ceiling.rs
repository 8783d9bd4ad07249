//! A disk's own ceilings: one sequential stream writing a file on the disk's file system (4 MiB
//! writes with `O_DIRECT`, then `fdatasync`, as the disk tier writes its batches) and reading
//! it back (4 MiB `O_DIRECT` reads), the median of 3 rounds each. Where the file system refuses
//! `O_DIRECT` (tmpfs) the file is written buffered and its pages dropped before each read.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use crate::error::{Error, Result};

/// Bytes per write or read call.
const CHUNK: usize = 4 << 20;
/// O_DIRECT wants buffers, offsets and lengths aligned to the device's block (4 KiB covers it).
const ALIGN: usize = 4096;
/// The ceiling's file at most takes this share of the file system's free space.
const FREE_SHARE: u64 = 4;
/// Below this, the measure would say little.
const MIN_BYTES: u64 = 64 << 20;

#[derive(Serialize, Clone, Debug)]
pub struct DiskCeiling {
    /// The node whose disk this is.
    pub node: String,
    /// The disk's directory (the file was written beside it, on the same file system).
    pub path: String,
    pub direct_io: bool,
    /// Bytes written and read per round.
    pub bytes: u64,
    pub write_gbps: f64,
    pub read_gbps: f64,
}

/// Where the ceiling's file goes: the disk directory's parent when on the same file system
/// (the disk's own directory holds only its label and buckets), else the directory itself.
pub fn scratch_dir(disk: &Path) -> PathBuf {
    let dev = |p: &Path| std::fs::metadata(p).map(|m| m.dev()).ok();
    match disk.parent() {
        Some(parent) if dev(parent).is_some() && dev(parent) == dev(disk) => parent.to_path_buf(),
        _ => disk.to_path_buf(),
    }
}

/// The device a path is on (to measure each device once).
pub fn device_of(path: &Path) -> Option<u64> {
    std::fs::metadata(path).map(|m| m.dev()).ok()
}

/// Measures the ceilings of the file system of `disk` with about `bytes` (fewer when the file
/// system has less than `FREE_SHARE` times that free).
pub fn measure(node: &str, disk: &Path, bytes: u64) -> Result<DiskCeiling> {
    let dir = scratch_dir(disk);
    let bytes = sized(&dir, bytes)?;
    let file = dir.join(format!(".regolith-bench-ceiling-{}", std::process::id()));
    let r = measure_file(&file, bytes);
    let _ = std::fs::remove_file(&file);
    let (direct_io, write_gbps, read_gbps) = r.map_err(|e| Error::File {
        what: "disk ceiling: cannot write and read",
        path: file.clone(),
        source: e,
    })?;
    Ok(DiskCeiling {
        node: node.to_string(),
        path: disk.display().to_string(),
        direct_io,
        bytes,
        write_gbps,
        read_gbps,
    })
}

/// `wanted` rounded to whole chunks, within a share of the free space.
fn sized(dir: &Path, wanted: u64) -> Result<u64> {
    let st = nix::sys::statvfs::statvfs(dir)
        .map_err(|e| Error::Failed(format!("disk ceiling: statvfs {}: {e}", dir.display())))?;
    let free = st.blocks_available() as u64 * st.fragment_size() as u64;
    let bytes = wanted.min(free / FREE_SHARE) / CHUNK as u64 * CHUNK as u64;
    if bytes < MIN_BYTES {
        return Err(Error::Failed(format!(
            "disk ceiling: {} has {} free, too little to measure",
            dir.display(),
            crate::format::bytes(free)
        )));
    }
    Ok(bytes)
}

/// A 4 KiB-aligned window of a vector (no allocator tricks, no unsafe).
struct Aligned {
    raw: Vec<u8>,
    at: usize,
}

impl Aligned {
    fn new(len: usize) -> Self {
        let mut raw = vec![0u8; len + ALIGN];
        let at = raw.as_ptr().align_offset(ALIGN);
        let v = super::value_of(0xD15C, len as u64);
        raw[at..at + len].copy_from_slice(&v);
        Self { raw, at }
    }

    fn buf(&mut self) -> &mut [u8] {
        &mut self.raw[self.at..self.at + CHUNK]
    }
}

fn open(path: &Path, write: bool, direct: bool) -> std::io::Result<File> {
    let mut o = OpenOptions::new();
    if write {
        o.write(true).create(true);
    } else {
        o.read(true);
    }
    if direct {
        o.custom_flags(nix::libc::O_DIRECT);
    }
    o.open(path)
}

/// (direct I/O used, write GB/s, read GB/s).
fn measure_file(path: &Path, bytes: u64) -> std::io::Result<(bool, f64, f64)> {
    let (mut f, direct) = match open(path, true, true) {
        Ok(f) => (f, true),
        Err(e) if e.raw_os_error() == Some(nix::libc::EINVAL) => (open(path, true, false)?, false),
        Err(e) => return Err(e),
    };
    // Allocated first, as the disk tier allocates its buckets.
    nix::fcntl::fallocate(
        f.as_raw_fd(),
        nix::fcntl::FallocateFlags::empty(),
        0,
        bytes as i64,
    )
    .map_err(std::io::Error::from)?;
    let mut buf = Aligned::new(CHUNK);
    let chunks = bytes / CHUNK as u64;
    let mut writes = Vec::new();
    for _ in 0..3 {
        f.seek(SeekFrom::Start(0))?;
        let t = Instant::now();
        for _ in 0..chunks {
            f.write_all(buf.buf())?;
        }
        f.sync_data()?;
        writes.push(bytes as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    drop(f);
    let mut f = open(path, false, direct)?;
    let mut reads = Vec::new();
    for _ in 0..3 {
        if !direct {
            nix::fcntl::posix_fadvise(
                f.as_raw_fd(),
                0,
                0,
                nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
            )
            .map_err(std::io::Error::from)?;
        }
        f.seek(SeekFrom::Start(0))?;
        let t = Instant::now();
        for _ in 0..chunks {
            f.read_exact(buf.buf())?;
        }
        reads.push(bytes as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    Ok((
        direct,
        super::median(&mut writes),
        super::median(&mut reads),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ceiling_is_measured_beside_the_disk_directory_and_leaves_nothing() {
        let d = tempfile::tempdir().unwrap();
        let disk = d.path().join("disk");
        std::fs::create_dir(&disk).unwrap();
        assert_eq!(scratch_dir(&disk), d.path());
        let c = measure("node-0", &disk, MIN_BYTES).unwrap();
        assert_eq!(c.bytes, MIN_BYTES);
        assert!(c.write_gbps > 0.0 && c.read_gbps > 0.0, "{c:?}");
        let left: Vec<_> = std::fs::read_dir(d.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "only the disk directory is left: {left:?}");
    }
}
