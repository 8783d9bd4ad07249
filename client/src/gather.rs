//! Scatter/gather lists: an object put from several pieces of memory (Mooncake's
//! `put_parts`, `batch_put_from_multi_buffers`) or read into several (its
//! `batch_get_into_multi_buffers`), without joining the pieces into one buffer first.
//!
//! Checksums are computed per 64 KiB chunk of the object ([`checksum::CHUNK`]), and pieces need
//! not start on chunk boundaries: [`for_each_chunk`] hands out each chunk as one slice, borrowed
//! from its piece when it lies inside one and assembled in a chunk-sized scratch buffer (which
//! stays in cache) when it spans two.

use regolith_proto::checksum;

use crate::error::Result;

/// Total length of the pieces.
pub(crate) fn total(parts: &[&[u8]]) -> usize {
    parts.iter().map(|p| p.len()).sum()
}

/// Total length of the destination pieces.
pub(crate) fn total_mut(parts: &[&mut [u8]]) -> usize {
    parts.iter().map(|p| p.len()).sum()
}

/// Calls `f(chunk_index, chunk)` for each chunk of the concatenation of `parts`, in order.
pub(crate) fn for_each_chunk(
    parts: &[&[u8]],
    mut f: impl FnMut(usize, &[u8]) -> Result<()>,
) -> Result<()> {
    let mut scratch: Vec<u8> = Vec::new();
    let mut chunk = 0usize;
    let mut pieces = parts.iter().filter(|p| !p.is_empty()).copied();
    let mut rest: &[u8] = pieces.next().unwrap_or(&[]);
    while !rest.is_empty() {
        if scratch.is_empty() && rest.len() >= checksum::CHUNK {
            let (c, tail) = rest.split_at(checksum::CHUNK);
            f(chunk, c)?;
            chunk += 1;
            rest = tail;
        } else {
            let take = (checksum::CHUNK - scratch.len()).min(rest.len());
            scratch.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            if scratch.len() == checksum::CHUNK {
                f(chunk, &scratch)?;
                chunk += 1;
                scratch.clear();
            }
        }
        if rest.is_empty() {
            rest = pieces.next().unwrap_or(&[]);
        }
    }
    if !scratch.is_empty() {
        f(chunk, &scratch)?;
    }
    Ok(())
}

/// The pieces joined (for values small enough to travel inline in a frame).
pub(crate) fn join(parts: &[&[u8]]) -> Vec<u8> {
    let mut v = Vec::with_capacity(total(parts));
    for p in parts {
        v.extend_from_slice(p);
    }
    v
}

/// Copies `src` into the concatenation of `parts`, starting `at` bytes into it; bytes past the
/// pieces' end are not copied.
pub(crate) fn scatter(parts: &mut [&mut [u8]], at: usize, mut src: &[u8]) {
    let mut skip = at;
    for p in parts.iter_mut() {
        if src.is_empty() {
            return;
        }
        if skip >= p.len() {
            skip -= p.len();
            continue;
        }
        let n = (p.len() - skip).min(src.len());
        p[skip..skip + n].copy_from_slice(&src[..n]);
        src = &src[n..];
        skip = 0;
    }
}

/// Fills the concatenation of `parts`, piece by piece, from `read(offset, piece)`, where
/// `offset` is the piece's position in the object; stops after `len` bytes.
pub(crate) fn fill(
    parts: &mut [&mut [u8]],
    len: usize,
    mut read: impl FnMut(usize, &mut [u8]) -> Result<()>,
) -> Result<()> {
    let mut off = 0usize;
    for p in parts.iter_mut() {
        if off >= len {
            break;
        }
        let n = p.len().min(len - off);
        read(off, &mut p[..n])?;
        off += n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces<'a>(data: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
        let mut out = Vec::new();
        let mut last = 0;
        for &c in cuts.iter().chain(std::iter::once(&data.len())) {
            out.push(&data[last..c]);
            last = c;
        }
        out
    }

    #[test]
    fn chunks_of_pieces_hash_like_the_joined_object() {
        let data: Vec<u8> = (0..(3 * checksum::CHUNK + 1000))
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        let seed = checksum::seed(3, 9);
        let want = checksum::checksum(seed, &data);
        let c = checksum::CHUNK;
        for cuts in [
            vec![],
            vec![1],
            vec![c],
            vec![c - 1, c + 1],
            vec![10, 20, 30, 2 * c + 5],
            vec![0, 0, c, c],
        ] {
            let parts = pieces(&data, &cuts);
            let mut hashes = vec![0u64; checksum::chunk_count(data.len() as u64)];
            let mut seen = Vec::new();
            for_each_chunk(&parts, |i, chunk| {
                hashes[i] = checksum::chunk_hash(seed, chunk);
                seen.extend_from_slice(chunk);
                Ok(())
            })
            .unwrap();
            assert_eq!(seen, data, "cuts {cuts:?}");
            assert_eq!(checksum::combine(seed, &hashes), want, "cuts {cuts:?}");
            assert_eq!(join(&parts), data);
        }
    }

    #[test]
    fn scatter_and_fill_split_an_object_over_pieces() {
        let data: Vec<u8> = (0..100u8).collect();
        let (mut a, mut b, mut c) = (vec![0u8; 7], vec![0u8; 50], vec![0u8; 60]);
        {
            let mut parts: Vec<&mut [u8]> = vec![&mut a, &mut b, &mut c];
            scatter(&mut parts, 0, &data[..30]);
            scatter(&mut parts, 30, &data[30..]);
        }
        assert_eq!(a, data[..7]);
        assert_eq!(b, data[7..57]);
        assert_eq!(c[..43], data[57..]);
        assert!(c[43..].iter().all(|&x| x == 0), "nothing past the object");

        let (mut x, mut y) = (vec![0u8; 40], vec![0u8; 80]);
        let mut parts: Vec<&mut [u8]> = vec![&mut x, &mut y];
        fill(&mut parts, 100, |off, p| {
            p.copy_from_slice(&data[off..off + p.len()]);
            Ok(())
        })
        .unwrap();
        assert_eq!(x, data[..40]);
        assert_eq!(y[..60], data[40..]);
    }
}
