//! The metad snapshot file (`regolith metad snapshot save FILE`, `regolith-metad
//! --restore-from FILE`): a consistent copy of the replicated state, framed so that a truncated,
//! damaged or foreign file is refused with a clear error before anything reads its state.
//!
//! # Format, version 1
//!
//! All integers little-endian.
//!
//! | offset   | size | field                                                          |
//! |----------|------|----------------------------------------------------------------|
//! | 0        | 8    | magic, ASCII `REGOBKUP`                                        |
//! | 8        | 4    | format version, `u32` (= 1)                                    |
//! | 12       | 4    | info length `I`, `u32` (at most 1 MiB)                         |
//! | 16       | 8    | payload length `P`, `u64`                                      |
//! | 24       | 8    | XXH3-64 (seed 0) of the `I + P` bytes that follow the header   |
//! | 32       | I    | [`BackupInfo`], protobuf                                       |
//! | 32 + I   | P    | payload: metad's state-machine snapshot (its own magic `RGSM` and version) |
//!
//! The file is exactly `32 + I + P` bytes long. The leader writes the header and the info
//! first (it knows the payload's length and checksum because it spools the payload before it
//! streams anything), so the bytes of the `SaveSnapshot` stream are the file, in order.
//!
//! The payload is the same bytes a Raft snapshot of metad carries (segments, objects, the
//! metadata KV, counters): restoring it gives the state the cluster had when it was taken.

use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom, Write};
use std::path::Path;

use prost::Message;
use xxhash_rust::xxh3::Xxh3;

use crate::error::{Error, Result};
pub use crate::metad::BackupInfo;

/// The first 8 bytes of every snapshot file.
pub const MAGIC: [u8; 8] = *b"REGOBKUP";
/// The format version this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// Bytes of the fixed header.
pub const HEADER_LEN: u64 = 32;
/// The info is a few hundred bytes; a larger length means the header is garbage, and must not
/// turn into a large allocation.
pub const MAX_INFO_LEN: u32 = 1 << 20;

/// Writes the payload into `inner` while checksumming it; [`PayloadWriter::finish`] then gives
/// the header and info bytes that go before it in the file.
pub struct PayloadWriter<W: Write> {
    inner: W,
    hasher: Xxh3,
    info: Vec<u8>,
    len: u64,
}

impl<W: Write> PayloadWriter<W> {
    pub fn new(info: &BackupInfo, inner: W) -> Self {
        let info = info.encode_to_vec();
        let mut hasher = Xxh3::new();
        hasher.update(&info);
        Self {
            inner,
            hasher,
            info,
            len: 0,
        }
    }

    /// The inner writer, and the header followed by the info: the file's first bytes.
    pub fn finish(self) -> Result<(W, Vec<u8>)> {
        let info_len = u32::try_from(self.info.len())
            .ok()
            .filter(|l| *l <= MAX_INFO_LEN)
            .ok_or_else(|| Error::Config("snapshot info is too large".into()))?;
        let mut head = Vec::with_capacity(HEADER_LEN as usize + self.info.len());
        head.extend_from_slice(&MAGIC);
        head.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        head.extend_from_slice(&info_len.to_le_bytes());
        head.extend_from_slice(&self.len.to_le_bytes());
        head.extend_from_slice(&self.hasher.digest().to_le_bytes());
        head.extend_from_slice(&self.info);
        Ok((self.inner, head))
    }
}

impl<W: Write> Write for PayloadWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// A snapshot file that passed [`validate`].
#[derive(Clone, Debug)]
pub struct Validated {
    pub info: BackupInfo,
    pub file_len: u64,
    pub payload_offset: u64,
    pub payload_len: u64,
}

fn bad(path: &Path, reason: impl Into<String>) -> Error {
    Error::BadSnapshotFile {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> Error + 'a {
    move |source| Error::File {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// Checks the file at `path` whole: magic, version, length, checksum, info.
pub fn validate(path: &Path) -> Result<Validated> {
    let mut file = File::open(path).map_err(io_err("open snapshot file", path))?;
    let file_len = file
        .metadata()
        .map_err(io_err("stat snapshot file", path))?
        .len();
    if file_len < HEADER_LEN {
        return Err(bad(
            path,
            format!("{file_len} bytes, shorter than the {HEADER_LEN}-byte header (truncated?)"),
        ));
    }
    let mut header = [0u8; HEADER_LEN as usize];
    file.read_exact(&mut header)
        .map_err(io_err("read snapshot header", path))?;
    if header[0..8] != MAGIC {
        return Err(bad(
            path,
            "bad magic: not a Regolith metad snapshot file (made by `regolith metad snapshot save`)",
        ));
    }
    let version = le_u32(&header[8..12]);
    if version != FORMAT_VERSION {
        return Err(Error::SnapshotFileVersion {
            path: path.to_path_buf(),
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    let info_len = le_u32(&header[12..16]);
    let payload_len = le_u64(&header[16..24]);
    let checksum = le_u64(&header[24..32]);
    if info_len > MAX_INFO_LEN {
        return Err(bad(path, format!("info length {info_len} is implausible")));
    }
    let expected = HEADER_LEN
        .checked_add(u64::from(info_len))
        .and_then(|l| l.checked_add(payload_len))
        .ok_or_else(|| bad(path, "payload length is implausible"))?;
    if expected != file_len {
        let how = if file_len < expected {
            "truncated"
        } else {
            "has trailing bytes"
        };
        return Err(bad(
            path,
            format!("{how}: the header says {expected} bytes, the file has {file_len}"),
        ));
    }
    let mut info = vec![0u8; info_len as usize];
    file.read_exact(&mut info)
        .map_err(io_err("read snapshot info", path))?;
    let mut hasher = Xxh3::new();
    hasher.update(&info);
    let mut reader = BufReader::with_capacity(1 << 20, &mut file).take(payload_len);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = reader
            .read(&mut buf)
            .map_err(io_err("read snapshot payload", path))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    if hasher.digest() != checksum {
        return Err(bad(
            path,
            "checksum mismatch: the file is damaged (copied incompletely or altered)",
        ));
    }
    let info = BackupInfo::decode(info.as_slice())
        .map_err(|e| bad(path, format!("undecodable info: {e}")))?;
    Ok(Validated {
        info,
        file_len,
        payload_offset: HEADER_LEN + u64::from(info_len),
        payload_len,
    })
}

/// A reader over the payload of a file that passed [`validate`].
pub fn payload_reader(path: &Path, v: &Validated) -> Result<impl Read> {
    let mut file = File::open(path).map_err(io_err("open snapshot file", path))?;
    file.seek(SeekFrom::Start(v.payload_offset))
        .map_err(io_err("seek in snapshot file", path))?;
    Ok(BufReader::with_capacity(1 << 20, file).take(v.payload_len))
}

fn le_u32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(b);
    u32::from_le_bytes(a)
}

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    u64::from_le_bytes(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, payload: &[u8]) {
        let info = BackupInfo {
            term: 3,
            applied_index: 42,
            keys: 7,
            ..Default::default()
        };
        let mut w = PayloadWriter::new(&info, Vec::new());
        w.write_all(payload).unwrap();
        let (body, head) = w.finish().unwrap();
        let mut file = head;
        file.extend_from_slice(&body);
        std::fs::write(path, file).unwrap();
    }

    #[test]
    fn round_trip_and_every_kind_of_damage_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.snap");
        write(&path, &[5u8; 3000]);
        let v = validate(&path).unwrap();
        assert_eq!(
            (v.info.term, v.info.applied_index, v.payload_len),
            (3, 42, 3000)
        );
        let mut payload = Vec::new();
        payload_reader(&path, &v)
            .unwrap()
            .read_to_end(&mut payload)
            .unwrap();
        assert_eq!(payload, vec![5u8; 3000]);

        let good = std::fs::read(&path).unwrap();
        let check = |bytes: &[u8], want: &str| {
            std::fs::write(&path, bytes).unwrap();
            let e = validate(&path).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        };
        check(&good[..good.len() - 1], "truncated");
        check(&good[..10], "shorter than the 32-byte header");
        let mut longer = good.clone();
        longer.push(0);
        check(&longer, "trailing bytes");
        let mut flipped = good.clone();
        flipped[2000] ^= 1;
        check(&flipped, "checksum mismatch");
        check(
            b"REGOSNAP and then some bytes, more than 32 of them",
            "bad magic",
        );
        let mut future = good.clone();
        future[8..12].copy_from_slice(&9u32.to_le_bytes());
        check(&future, "format version 9");
        let mut huge = good.clone();
        huge[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        check(&huge, "implausible");
    }
}
