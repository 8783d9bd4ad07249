//! Values derived from `(key, write id)`, so that any byte read can be traced to the put that
//! wrote it, and bytes of another key or of garbage are told apart from a real value.
//!
//! * [`tag`] — a 64-bit value for the metad-only workload, stored as the object's checksum:
//!   the write id in the high 32 bits and a hash of `(key, write id)` in the low 32.
//! * [`bytes`] — the full value for a data-carrying workload: a 16-byte header (magic, write id,
//!   hash) and a filler stream seeded by `(key, write id)`; [`decode_bytes`] checks every byte.

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

const MAGIC: &[u8; 4] = b"RGC1";
/// Smallest value [`bytes`] makes (the header).
pub const HEADER_LEN: usize = 16;

fn key_seed(key: &str, write_id: u64) -> u64 {
    xxh3_64_with_seed(key.as_bytes(), write_id ^ 0x5eed_c4a0_5eed_c4a0)
}

/// The tag of write `write_id` of `key`. Write ids must fit 32 bits.
pub fn tag(key: &str, write_id: u64) -> u64 {
    (write_id << 32) | (key_seed(key, write_id) & 0xffff_ffff)
}

/// The write id a tag read under `key` stands for, or why it stands for none.
pub fn decode_tag(key: &str, tag: u64) -> Result<u64, String> {
    let write_id = tag >> 32;
    if tag == self::tag(key, write_id) {
        Ok(write_id)
    } else {
        Err(format!(
            "checksum {tag:#018x} is no value of key {key} (it names write {write_id} but its \
             hash does not match: another key's value, or garbage)"
        ))
    }
}

/// Word `index` of the filler stream of `seed` (splitmix64: cheap enough that multi-MiB values
/// cost about a millisecond to make or check).
fn filler_word(seed: u64, index: u64) -> [u8; 8] {
    let mut z = seed.wrapping_add(index.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)).to_le_bytes()
}

fn header(key: &str, write_id: u64) -> ([u8; HEADER_LEN], u64) {
    let seed = key_seed(key, write_id);
    let mut h = [0u8; HEADER_LEN];
    h[..4].copy_from_slice(MAGIC);
    h[4..12].copy_from_slice(&write_id.to_le_bytes());
    h[12..].copy_from_slice(&(seed as u32).to_le_bytes());
    (h, seed)
}

/// The value of write `write_id` of `key`, `len` bytes long (at least [`HEADER_LEN`]).
pub fn bytes(key: &str, write_id: u64, len: usize) -> Vec<u8> {
    let len = len.max(HEADER_LEN);
    let (head, seed) = header(key, write_id);
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(&head);
    let mut i = 0u64;
    while out.len() < len {
        let w = filler_word(seed, i);
        let take = (len - out.len()).min(8);
        out.extend_from_slice(&w[..take]);
        i += 1;
    }
    out
}

/// The first byte of the filler (after the header) where `data` differs from the value of
/// write `seed`'s stream, if any.
fn first_filler_difference(seed: u64, filler: &[u8]) -> Option<usize> {
    filler.chunks(8).enumerate().find_map(|(i, got)| {
        let want = filler_word(seed, i as u64);
        got.iter()
            .zip(want.iter())
            .position(|(a, b)| a != b)
            .map(|p| i * 8 + p)
    })
}

/// The write id whose value `data` is, or a description of what is wrong with it.
pub fn decode_bytes(key: &str, data: &[u8]) -> Result<u64, String> {
    if data.len() < HEADER_LEN {
        return Err(format!("{} bytes: shorter than the header", data.len()));
    }
    if &data[..4] != MAGIC {
        return Err(format!(
            "bad magic {:02x?} (hash of all {} bytes {:#x})",
            &data[..4],
            data.len(),
            xxh3_64(data)
        ));
    }
    let mut id = [0u8; 8];
    id.copy_from_slice(&data[4..12]);
    let write_id = u64::from_le_bytes(id);
    let (head, seed) = header(key, write_id);
    if data[..HEADER_LEN] != head {
        return Err(format!(
            "header names write {write_id} but is not key {key}'s (another key's value?)"
        ));
    }
    match first_filler_difference(seed, &data[HEADER_LEN..]) {
        None => Ok(write_id),
        Some(at) => Err(format!(
            "value of write {write_id} differs from byte {} on (of {})",
            at + HEADER_LEN,
            data.len()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_round_trip_and_refuse_other_keys() {
        let t = tag("key-7", 12345);
        assert_eq!(decode_tag("key-7", t), Ok(12345));
        assert!(decode_tag("key-8", t).is_err());
        assert!(decode_tag("key-7", 42).is_err());
    }

    #[test]
    fn bytes_round_trip_and_locate_damage() {
        let b = bytes("k", 9, 1000);
        assert_eq!(b.len(), 1000);
        assert_eq!(decode_bytes("k", &b), Ok(9));
        assert!(decode_bytes("other", &b)
            .unwrap_err()
            .contains("another key"));
        let mut damaged = b.clone();
        damaged[700] ^= 1;
        assert!(decode_bytes("k", &damaged)
            .unwrap_err()
            .contains("byte 700"));
        assert!(decode_bytes("k", &b[..3]).is_err());
        assert_ne!(bytes("k", 9, 64), bytes("k", 10, 64));
    }
}
