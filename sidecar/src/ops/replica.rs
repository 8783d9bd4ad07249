//! One object to or from one replica: this node's own segment (a fused copy and hash), or a
//! peer's over the data plane (slices striped over every NIC pair). The checksum chunks are
//! hashed while the bytes are hot, in the same pass as the copy or the send.

use regolith_proto::checksum;
use regolith_proto::common::{Extent, Version};

use super::{Replica, Store};
use crate::error::{Error, Result};
use crate::segment::Segment;
use crate::transport::{PeerAddrs, RemoteRange};

/// A piece of an object range that lies in one source and one destination extent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Offset in the object.
    pub obj: u64,
    /// Which source and destination extent the piece lies in.
    pub src_ext: usize,
    pub dst_ext: usize,
    /// Offset in the source memory.
    pub src: u64,
    /// Offset in the destination memory.
    pub dst: u64,
    pub len: u64,
}

impl Piece {
    /// The checksum chunks of the object this piece covers: pieces start on chunk boundaries
    /// (every extent but a replica's last is a whole number of chunks), and the transports take
    /// exactly one hash per chunk of what they move.
    fn chunks(&self) -> std::ops::Range<usize> {
        let first = (self.obj / checksum::CHUNK as u64) as usize;
        first..first + checksum::chunk_count(self.len)
    }

    /// This piece's slots of `hashes`; extents off chunk boundaries (which metad never hands
    /// out) are refused rather than hashed wrongly.
    fn hashes<'h>(&self, hashes: &'h mut [u64]) -> Result<&'h mut [u64]> {
        if self.obj % checksum::CHUNK as u64 != 0 {
            return Err(Error::InvalidArgument(format!(
                "an extent boundary at object offset {} is not on a checksum chunk",
                self.obj
            )));
        }
        let range = self.chunks();
        let n = hashes.len();
        hashes
            .get_mut(range.clone())
            .ok_or_else(|| Error::InvalidArgument(format!("chunks {range:?} of an object of {n}")))
    }
}

/// Pieces of an object range split at the boundaries of the source and destination extents.
/// Extents list byte ranges in object order; only the first `size` bytes count.
pub fn pieces(src: &[Extent], dst: &[Extent], size: u64) -> Vec<Piece> {
    let mut out = Vec::new();
    let (mut si, mut di) = (0usize, 0usize);
    let (mut s_used, mut d_used) = (0u64, 0u64);
    let mut obj = 0u64;
    while obj < size && si < src.len() && di < dst.len() {
        let s_left = src[si].len - s_used;
        let d_left = dst[di].len - d_used;
        let n = s_left.min(d_left).min(size - obj);
        if n == 0 {
            if s_left == 0 {
                si += 1;
                s_used = 0;
            }
            if d_left == 0 {
                di += 1;
                d_used = 0;
            }
            continue;
        }
        out.push(Piece {
            obj,
            src_ext: si,
            dst_ext: di,
            src: src[si].offset + s_used,
            dst: dst[di].offset + d_used,
            len: n,
        });
        obj += n;
        s_used += n;
        d_used += n;
    }
    out
}

/// One extent covering `[offset, offset + len)`.
pub fn span(offset: u64, len: u64) -> Extent {
    Extent { offset, len }
}

/// Where the bytes of a put come from.
pub enum PutSource<'a> {
    /// Extents of a mapped memfd (the segment, staging, a registered buffer).
    Mapped {
        seg: &'a Segment,
        extents: Vec<Extent>,
    },
    Inline(&'a [u8]),
}

fn peer_of(rep: &Replica) -> Result<PeerAddrs> {
    if rep.data_addrs.is_empty() {
        return Err(Error::InvalidArgument(format!(
            "node {} ({}) has no usable data-plane address",
            rep.node_name, rep.node_id
        )));
    }
    Ok(PeerAddrs {
        node_id: rep.node_id,
        addrs: rep.data_addrs.clone(),
    })
}

impl Store {
    /// Writes the object to one remote replica; fills `hashes` (one per checksum chunk).
    pub async fn write_replica(
        &self,
        rep: &Replica,
        version: Version,
        size: u64,
        src: &PutSource<'_>,
        hashes: &mut [u64],
    ) -> Result<()> {
        let peer = peer_of(rep)?;
        let src_ext = match src {
            PutSource::Mapped { extents, .. } => extents.clone(),
            PutSource::Inline(b) => vec![span(0, b.len() as u64)],
        };
        for p in pieces(&src_ext, &rep.extents, size) {
            let bytes: &[u8] = match src {
                // SAFETY: `slice` bounds-checks the range against the mapping, which the caller
                // keeps alive for this call; the bytes are only read (sent).
                PutSource::Mapped { seg, .. } => unsafe { seg.slice(p.src, p.len)? },
                PutSource::Inline(b) => &b[p.src as usize..(p.src + p.len) as usize],
            };
            let range = RemoteRange {
                generation: rep.generation,
                offset: p.dst,
                len: p.len,
                grant: rep.grant(p.dst_ext),
            };
            self.data
                .write(&peer, range, version, bytes, p.hashes(hashes)?)
                .await?;
        }
        Ok(())
    }

    /// Reads a replica on this node's own disk `disk` into `dst`, verified, filling `hashes`.
    fn read_own_disk(
        &self,
        disk: u32,
        version: Version,
        dst: &mut [u8],
        hashes: &mut [u64],
    ) -> Result<()> {
        let gone = || Error::DiskRecordGone {
            version: format!("{}.{}", version.term, version.id),
        };
        let (d, key) = self.disks.holder(&version, Some(disk)).ok_or_else(gone)?;
        match crate::disk::blocking(|| d.read_hashed(&key, Some(version), dst, hashes))? {
            crate::disk::ReadOutcome::Hit { .. } => {
                self.disks.note_hit();
                Ok(())
            }
            crate::disk::ReadOutcome::Unverified => Err(Error::InvalidArgument(format!(
                "the destination of the disk read of version {}.{} changed while it was written",
                version.term, version.id
            ))),
            _ => Err(gone()),
        }
    }

    /// Reads the object from one replica into `dst` (exactly `size` bytes), filling `hashes`.
    pub async fn read_replica(
        &self,
        rep: &Replica,
        version: Version,
        dst: &mut [u8],
        hashes: &mut [u64],
    ) -> Result<()> {
        let size = dst.len() as u64;
        let whole = [span(0, size)];
        if rep.node_id == self.node_id() {
            if let Some(disk) = regolith_proto::disk_tier::disk_of(rep.generation) {
                return self.read_own_disk(disk, version, dst, hashes);
            }
        }
        if self.is_local(rep) {
            for p in pieces(&rep.extents, &whole, size) {
                // SAFETY: bounds-checked view of our own segment, read once into private memory.
                let src = unsafe { self.segment.slice(p.src, p.len)? };
                checksum::copy_and_hash(
                    version.seed(),
                    &mut dst[p.obj as usize..(p.obj + p.len) as usize],
                    src,
                    p.hashes(hashes)?,
                );
            }
            return Ok(());
        }
        let peer = peer_of(rep)?;
        for p in pieces(&rep.extents, &whole, size) {
            let range = RemoteRange {
                generation: rep.generation,
                offset: p.src,
                len: p.len,
                grant: rep.grant(p.src_ext),
            };
            self.data
                .read(
                    &peer,
                    range,
                    version,
                    &mut dst[p.obj as usize..(p.obj + p.len) as usize],
                    p.hashes(hashes)?,
                )
                .await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ext(list: &[(u64, u64)]) -> Vec<Extent> {
        list.iter().map(|&(o, l)| span(o, l)).collect()
    }

    fn piece(
        obj: u64,
        (src_ext, src): (usize, u64),
        (dst_ext, dst): (usize, u64),
        len: u64,
    ) -> Piece {
        Piece {
            obj,
            src_ext,
            dst_ext,
            src,
            dst,
            len,
        }
    }

    #[test]
    fn pieces_split_at_both_boundaries() {
        let src = ext(&[(1000, 100), (5000, 50)]);
        let dst = ext(&[(0, 60), (200, 90)]);
        assert_eq!(
            pieces(&src, &dst, 150),
            vec![
                piece(0, (0, 1000), (0, 0), 60),
                piece(60, (0, 1060), (1, 200), 40),
                piece(100, (1, 5000), (1, 240), 50)
            ]
        );
        assert_eq!(
            pieces(&ext(&[(0, 1 << 20)]), &ext(&[(64, 1 << 20)]), 10),
            vec![piece(0, (0, 0), (0, 64), 10)]
        );
        assert_eq!(pieces(&ext(&[(0, 10)]), &ext(&[(0, 10)]), 0), vec![]);
    }
}
