//! The write side of [`super::store`]: the caller lays records into page-aligned pieces —
//! values copied from wherever they lie (a segment's extents, no staging copy) and hashed
//! chunk by chunk while the bytes are in cache — and a helper thread writes each full piece
//! meanwhile, so the device writes one piece while the CPU fills the next.
//!
//! Why: an offload used to copy each object out of the segment into a `Vec`, hash it, copy
//! it again into the one write buffer and write that, one step after the other (the device
//! idle while the CPU copied, the CPU idle while the device wrote); docs/benchmarks.md, "The
//! disk tier".

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::{mpsc, Arc};

use regolith_proto::checksum;
use xxhash_rust::xxh3::Xxh3;

use super::direct::AlignedBuf;
use super::format::align_block;

/// Bytes per written piece (and per pooled buffer).
pub const PIECE: usize = 8 << 20;
/// Pieces handed to the helper and not yet written back; one more buffer is being filled.
const DEPTH: usize = 2;
/// Batches of fewer bytes are written on the caller: a thread start costs more than the
/// overlap of so short a write saves.
pub const THREADED_FROM: u64 = 2 * PIECE as u64;

struct Piece {
    file: Arc<File>,
    pos: u64,
    buf: AlignedBuf,
    len: usize,
}

struct Helper {
    to_io: mpsc::Sender<Piece>,
    back: mpsc::Receiver<io::Result<AlignedBuf>>,
    out: usize,
}

/// Sequential writer of block-aligned runs through pooled pieces (see the module doc).
pub struct Appender<'p> {
    pool: &'p mut Vec<AlignedBuf>,
    /// The piece being filled, `fill` bytes of it so far.
    cur: Option<AlignedBuf>,
    fill: usize,
    file: Option<Arc<File>>,
    /// File position of `cur[0]`.
    pos: u64,
    helper: Option<Helper>,
    written: u64,
}

/// Runs `body` with an [`Appender`] drawing buffers from `pool` (returned to it after), its
/// pieces written by a helper thread when `threaded`. Answers what `body` did and the bytes
/// written; every piece is written (not synced) when it returns Ok.
pub fn with_appender<T>(
    pool: &mut Vec<AlignedBuf>,
    threaded: bool,
    body: impl FnOnce(&mut Appender<'_>) -> io::Result<T>,
) -> io::Result<(T, u64)> {
    let run = |pool: &mut Vec<AlignedBuf>, helper: Option<Helper>| {
        let mut a = Appender::new(pool, helper);
        let r = body(&mut a).and_then(|t| a.finish().map(|n| (t, n)));
        // Dropping the sender ends the helper (the scope joins it).
        a.release();
        r
    };
    if !threaded {
        return run(pool, None);
    }
    std::thread::scope(|s| {
        let (to_io, jobs) = mpsc::channel::<Piece>();
        let (done, back) = mpsc::channel::<io::Result<AlignedBuf>>();
        s.spawn(move || {
            for p in jobs {
                let r = p
                    .file
                    .write_all_at(&p.buf.0[..p.len], p.pos)
                    .map(|()| p.buf);
                let failed = r.is_err();
                if done.send(r).is_err() || failed {
                    return;
                }
            }
        });
        let helper = Helper {
            to_io,
            back,
            out: 0,
        };
        run(pool, Some(helper))
    })
}

impl<'p> Appender<'p> {
    fn new(pool: &'p mut Vec<AlignedBuf>, helper: Option<Helper>) -> Self {
        Self {
            pool,
            cur: None,
            fill: 0,
            file: None,
            pos: 0,
            helper,
            written: 0,
        }
    }

    /// Starts a run at `pos` (block-aligned) of `file`; the run before is written out.
    pub fn start_run(&mut self, file: Arc<File>, pos: u64) -> io::Result<()> {
        self.submit()?;
        self.file = Some(file);
        self.pos = pos;
        Ok(())
    }

    /// The room left in the current piece (never empty): a full piece is handed on first.
    pub fn space(&mut self) -> io::Result<&mut [u8]> {
        if self.cur.as_ref().is_some_and(|b| self.fill == b.len()) {
            self.submit()?;
        }
        let buf = match self.cur.take() {
            Some(b) => b,
            None => {
                self.fill = 0;
                self.take_buf()?
            }
        };
        let fill = self.fill;
        Ok(&mut self.cur.insert(buf).0[fill..])
    }

    /// Marks `n` bytes of [`Appender::space`] as filled.
    pub fn advance(&mut self, n: usize) {
        self.fill += n;
    }

    /// Appends `b` as is.
    pub fn put(&mut self, mut b: &[u8]) -> io::Result<()> {
        while !b.is_empty() {
            let room = self.space()?;
            let n = room.len().min(b.len());
            room[..n].copy_from_slice(&b[..n]);
            self.advance(n);
            b = &b[n..];
        }
        Ok(())
    }

    /// Appends `n` zero bytes.
    pub fn zero(&mut self, mut n: usize) -> io::Result<()> {
        while n > 0 {
            let room = self.space()?;
            let k = room.len().min(n);
            room[..k].fill(0);
            self.advance(k);
            n -= k;
        }
        Ok(())
    }

    /// Appends a value given in `parts` (in order) and fills `hashes` with its chunk hashes
    /// ([`checksum::CHUNK`] each, seeded with `seed`), computed over the bytes as copied into
    /// the piece: what is written is what is verified, even if a part changes meanwhile.
    pub fn put_hashed(
        &mut self,
        seed: u64,
        parts: &[&[u8]],
        hashes: &mut Vec<u64>,
    ) -> io::Result<()> {
        hashes.clear();
        let mut h = Xxh3::with_seed(seed);
        let mut chunk_left = checksum::CHUNK;
        for part in parts {
            let mut b: &[u8] = part;
            while !b.is_empty() {
                let room = self.space()?;
                let n = room.len().min(b.len()).min(chunk_left);
                let dst = &mut room[..n];
                dst.copy_from_slice(&b[..n]);
                if n == checksum::CHUNK {
                    hashes.push(checksum::chunk_hash(seed, dst));
                } else {
                    h.update(dst);
                }
                self.advance(n);
                b = &b[n..];
                chunk_left -= n;
                if chunk_left == 0 {
                    if n != checksum::CHUNK {
                        hashes.push(h.digest());
                        h.reset();
                    }
                    chunk_left = checksum::CHUNK;
                }
            }
        }
        if chunk_left != checksum::CHUNK {
            hashes.push(h.digest());
        }
        Ok(())
    }

    /// Hands the current piece (padded with zeros to a block) to be written.
    fn submit(&mut self) -> io::Result<()> {
        let Some(mut buf) = self.cur.take() else {
            return Ok(());
        };
        if self.fill == 0 {
            self.pool.push(buf);
            return Ok(());
        }
        let len = align_block(self.fill as u64) as usize;
        buf.0[self.fill..len].fill(0);
        let file = self
            .file
            .clone()
            .ok_or_else(|| io::Error::other("disk write without a run"))?;
        let pos = self.pos;
        self.pos += len as u64;
        self.written += len as u64;
        self.fill = 0;
        match &mut self.helper {
            None => {
                let r = file.write_all_at(&buf.0[..len], pos);
                self.pool.push(buf);
                r
            }
            Some(h) => {
                if h.to_io
                    .send(Piece {
                        file,
                        pos,
                        buf,
                        len,
                    })
                    .is_err()
                {
                    return Err(helper_error(h));
                }
                h.out += 1;
                Ok(())
            }
        }
    }

    /// A buffer to fill: a pooled one, a new one while fewer than `DEPTH + 1` are out, else
    /// the next one the helper writes back.
    fn take_buf(&mut self) -> io::Result<AlignedBuf> {
        if let Some(h) = &mut self.helper {
            if h.out >= DEPTH {
                h.out -= 1;
                return match h.back.recv() {
                    Ok(r) => r,
                    Err(_) => Err(helper_error(h)),
                };
            }
        }
        match self.pool.pop() {
            Some(b) => Ok(b),
            None => AlignedBuf::new(PIECE).map_err(|e| io::Error::other(e.to_string())),
        }
    }

    /// Writes the last piece and waits for the helper's; answers the bytes written.
    fn finish(&mut self) -> io::Result<u64> {
        self.submit()?;
        if let Some(h) = &mut self.helper {
            while h.out > 0 {
                h.out -= 1;
                match h.back.recv() {
                    Ok(r) => self.pool.push(r?),
                    Err(_) => return Err(helper_error(h)),
                }
            }
        }
        Ok(self.written)
    }

    /// Returns the buffer being filled to the pool and stops the helper.
    fn release(&mut self) {
        if let Some(b) = self.cur.take() {
            self.pool.push(b);
        }
        self.helper = None;
    }
}

/// The helper stops after sending back its error: a send or receive that finds it gone
/// answers that error, not the helper's absence.
fn helper_error(h: &mut Helper) -> io::Error {
    h.out = 0;
    h.back
        .try_iter()
        .find_map(Result::err)
        .unwrap_or_else(|| io::Error::other("disk write helper thread stopped"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::format::BLOCK;
    use std::io::Read;

    fn pattern(len: usize, salt: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt))
            .collect()
    }

    #[test]
    fn hashes_of_values_in_parts_match_the_object_checksum() {
        let seed = checksum::seed(3, 11);
        for (threaded, len, cut) in [
            (false, 10, 3),
            (false, checksum::CHUNK + 1, checksum::CHUNK / 2),
            (true, 3 * PIECE + 12_345, PIECE - 7),
            (true, 2 * PIECE, checksum::CHUNK),
        ] {
            let v = pattern(len, 5);
            let f = Arc::new(tempfile::tempfile().unwrap());
            let mut pool = Vec::new();
            let mut hashes = Vec::new();
            let ((), written) = with_appender(&mut pool, threaded, |a| {
                a.start_run(f.clone(), 0)?;
                a.put(b"head")?;
                a.zero(BLOCK as usize - 4)?;
                a.put_hashed(seed, &[&v[..cut], &v[cut..cut], &v[cut..]], &mut hashes)
            })
            .unwrap();
            let combined = checksum::combine(seed, &hashes);
            assert_eq!(
                combined,
                checksum::checksum(seed, &v),
                "len {len} cut {cut}"
            );
            assert_eq!(written, align_block((BLOCK as usize + len) as u64));
            let mut back = Vec::new();
            (&*f).read_to_end(&mut back).unwrap();
            assert_eq!(&back[..4], b"head");
            assert_eq!(
                &back[BLOCK as usize..BLOCK as usize + len],
                &v[..],
                "len {len}"
            );
            assert!(
                back[BLOCK as usize + len..].iter().all(|&b| b == 0),
                "padding is zeros"
            );
            assert!(
                pool.len() <= DEPTH + 1 && !pool.is_empty(),
                "buffers come back"
            );
        }
    }

    #[test]
    fn runs_land_at_their_positions() {
        let f = Arc::new(tempfile::tempfile().unwrap());
        let g = Arc::new(tempfile::tempfile().unwrap());
        let mut pool = Vec::new();
        let a1 = pattern(PIECE + 100, 1);
        let b1 = pattern(5000, 2);
        with_appender(&mut pool, true, |a| {
            a.start_run(f.clone(), 4 * BLOCK as usize as u64)?;
            a.put(&a1)?;
            a.start_run(g.clone(), 0)?;
            a.put(&b1)?;
            a.start_run(f.clone(), 0)?;
            a.put(b"first")
        })
        .unwrap();
        let mut fb = Vec::new();
        (&*f).read_to_end(&mut fb).unwrap();
        assert_eq!(&fb[..5], b"first");
        assert_eq!(
            &fb[4 * BLOCK as usize..4 * BLOCK as usize + a1.len()],
            &a1[..]
        );
        let mut gb = Vec::new();
        (&*g).read_to_end(&mut gb).unwrap();
        assert_eq!(&gb[..b1.len()], &b1[..]);
    }

    #[test]
    fn a_write_error_is_answered_by_either_mode() {
        for threaded in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let p = dir.path().join("ro");
            std::fs::write(&p, b"").unwrap();
            let ro = Arc::new(File::open(&p).unwrap());
            let mut pool = Vec::new();
            let r = with_appender(&mut pool, threaded, |a| {
                a.start_run(ro.clone(), 0)?;
                a.put(&pattern(3 * PIECE, 0))
            });
            assert!(r.is_err(), "threaded {threaded}");
        }
    }
}
