//! The I/O primitives of [`super::store`] for reads from a record on disk into memory the
//! tier does not own (a client's buffer, a peer's slice): aligned buffers, vectored reads that
//! land in that memory straight where `O_DIRECT` allows it, and a two-stage pipeline that
//! runs the read of one piece on a helper thread while the caller hashes another.
//!
//! Why: a disk read of a large value used to read it into a bounce buffer, copy it out, then
//! hash it, one step after the other (the device idle while the CPU worked, and the CPU idle
//! while the device read); docs/ssd.md "Measured".

use std::fs::File;
use std::io::{self, IoSliceMut};
use std::sync::mpsc;

use memmap2::MmapMut;
use parking_lot::Mutex;

use super::format::BLOCK;
use crate::error::{Error, Result};

/// Bytes per piece of a pipelined transfer (a multiple of the checksum chunk).
pub const PIECE: usize = 4 << 20;
/// Transfers shorter than this (two pieces) run on the caller alone: starting a thread costs
/// more than the overlap saves.
pub const PIPELINE_FROM: usize = 2 * PIECE;
/// Most `iovec`s given to one `preadv` / `pwritev` (Linux's `IOV_MAX`).
const IOV_MAX: usize = 1024;

/// A page-aligned buffer (anonymous mapping) for `O_DIRECT` I/O.
pub struct AlignedBuf(pub MmapMut);

impl AlignedBuf {
    pub fn new(len: usize) -> Result<Self> {
        MmapMut::map_anon(len.max(BLOCK as usize))
            .map(Self)
            .map_err(|source| Error::Os {
                what: format!("disk I/O buffer of {len} bytes"),
                source,
            })
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Buffers that disk reads for peers land in (straight from the device), kept between
/// slices: fresh memory costs a page fault and a zeroing per page, more than the copy the
/// aligned buffer saves.
static PEER_BUFS: Mutex<Vec<AlignedBuf>> = Mutex::new(Vec::new());
/// Buffers kept, and the largest kept (a larger slice's buffer is unmapped after use).
const PEER_BUFS_KEPT: usize = 16;
const PEER_BUF_MAX: usize = 8 << 20;

/// An aligned buffer of at least `len` bytes for a peer's disk read (see [`give_back`]).
pub fn take_peer_buf(len: usize) -> Result<AlignedBuf> {
    let mut pool = PEER_BUFS.lock();
    if let Some(i) = pool.iter().position(|b| b.len() >= len) {
        return Ok(pool.swap_remove(i));
    }
    drop(pool);
    AlignedBuf::new(len.max(1 << 20))
}

/// Returns a buffer of [`take_peer_buf`] for the next read.
pub fn give_back(buf: AlignedBuf) {
    let mut pool = PEER_BUFS.lock();
    if buf.len() <= PEER_BUF_MAX && pool.len() < PEER_BUFS_KEPT {
        pool.push(buf);
    }
}

/// Whether memory at `p` may take part in an `O_DIRECT` transfer (4 KiB alignment covers
/// 512-byte and 4 KiB devices).
pub fn aligned(p: *const u8) -> bool {
    (p as usize) % BLOCK as usize == 0
}

/// Fills every buffer of `bufs` from `file` at `pos` on (short reads are continued).
pub fn preadv_exact(file: &File, mut bufs: &mut [IoSliceMut<'_>], mut pos: u64) -> io::Result<()> {
    IoSliceMut::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        let take = bufs.len().min(IOV_MAX);
        let n = match nix::sys::uio::preadv(file, &mut bufs[..take], pos as i64) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        };
        pos += n as u64;
        IoSliceMut::advance_slices(&mut bufs, n);
    }
    Ok(())
}

/// Runs jobs through two stages: `io` on a helper thread (in order), then `done` on the
/// caller (in order), with at most `depth` jobs handed to the helper and not yet done. Jobs
/// are drawn from `next` only when fewer than `depth` are out, so a job may take a buffer
/// that `done` gives back. The first error stops it (jobs already out are dropped).
/// `threaded` false runs both stages on the caller, one job after the other.
pub fn pipeline<J: Send>(
    threaded: bool,
    depth: usize,
    mut next: impl FnMut() -> io::Result<Option<J>>,
    io: impl Fn(&mut J) -> io::Result<()> + Sync,
    mut done: impl FnMut(J) -> io::Result<()>,
) -> io::Result<()> {
    if !threaded {
        while let Some(mut j) = next()? {
            io(&mut j)?;
            done(j)?;
        }
        return Ok(());
    }
    let io = &io;
    std::thread::scope(|s| {
        let (to_io, jobs) = mpsc::channel::<J>();
        let (back, finished) = mpsc::channel::<io::Result<J>>();
        s.spawn(move || {
            for mut j in jobs {
                let r = io(&mut j).map(|()| j);
                let stop = r.is_err();
                if back.send(r).is_err() || stop {
                    return;
                }
            }
        });
        // The helper stops after sending back its error: a send or a receive that finds it
        // gone answers that error, not the helper's absence (the jobs before it are dropped).
        let gone = |finished: &mpsc::Receiver<io::Result<J>>| {
            finished
                .iter()
                .find_map(Result::err)
                .unwrap_or_else(|| io::Error::other("disk I/O helper thread stopped"))
        };
        let mut out = 0usize;
        loop {
            while out >= depth.max(1) {
                out -= 1;
                done(finished.recv().map_err(|_| gone(&finished))??)?;
            }
            let Some(j) = next()? else { break };
            to_io.send(j).map_err(|_| gone(&finished))?;
            out += 1;
        }
        drop(to_io);
        while out > 0 {
            out -= 1;
            done(finished.recv().map_err(|_| gone(&finished))??)?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn vectored_reads_fill_every_buffer() {
        let mut f = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 13) as u8).collect();
        f.write_all(&data).unwrap();
        let (mut a, mut b, mut c) = (vec![0u8; 10], vec![0u8; 0], vec![0u8; 50_000]);
        let mut bufs = [
            IoSliceMut::new(&mut a),
            IoSliceMut::new(&mut b),
            IoSliceMut::new(&mut c),
        ];
        preadv_exact(&f, &mut bufs, 7).unwrap();
        assert_eq!(a, data[7..17]);
        assert_eq!(c, data[17..50_017]);
        let mut past = [0u8; 10];
        let e = preadv_exact(&f, &mut [IoSliceMut::new(&mut past)], 99_995).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn a_pipeline_runs_every_job_through_both_stages_in_order() {
        for threaded in [false, true] {
            let mut n = 0u32;
            let mut seen = Vec::new();
            pipeline(
                threaded,
                3,
                || {
                    n += 1;
                    Ok((n <= 10).then_some((n, 0u32)))
                },
                |j| {
                    j.1 = j.0 * 2;
                    Ok(())
                },
                |j| {
                    seen.push(j);
                    Ok(())
                },
            )
            .unwrap();
            let want: Vec<(u32, u32)> = (1..=10).map(|i| (i, i * 2)).collect();
            assert_eq!(seen, want, "threaded {threaded}");
        }
    }

    #[test]
    fn a_pipeline_stops_at_the_first_error_of_either_stage() {
        for threaded in [false, true] {
            let mut n = 0u32;
            let r = pipeline(
                threaded,
                2,
                || {
                    n += 1;
                    Ok(Some(n))
                },
                |j| {
                    if *j == 5 {
                        Err(io::Error::other("io 5"))
                    } else {
                        Ok(())
                    }
                },
                |_| Ok(()),
            );
            assert_eq!(r.unwrap_err().to_string(), "io 5", "threaded {threaded}");
            let mut done = 0;
            let r = pipeline(
                threaded,
                2,
                || Ok(Some(())),
                |_| Ok(()),
                |()| {
                    done += 1;
                    if done == 3 {
                        Err(io::Error::other("done 3"))
                    } else {
                        Ok(())
                    }
                },
            );
            assert_eq!(r.unwrap_err().to_string(), "done 3");
        }
    }
}
