//! The on-disk format of a disk tier (docs/ssd.md, "Disk format"), pure encoding and
//! decoding: no I/O here.
//!
//! A disk is a directory holding a label file ([`LABEL_FILE`], JSON) and bucket files
//! (`bucket-NNNNNN.rgl`), each `bucket_size` bytes. A bucket starts with one header block
//! ([`BucketHeader`]) naming its epoch; records follow, appended, each aligned to [`BLOCK`]:
//!
//! ```text
//! record = header (64 B) | key | padding | value | padding to BLOCK
//! ```
//!
//! The value starts 8-aligned after the key, or [`BLOCK`]-aligned for values of
//! [`ALIGN_VALUE_FROM`] bytes and more (so that large values can be read with `O_DIRECT`
//! straight into page-aligned memory). A record carries the bucket's epoch: records left
//! behind by an earlier use of the bucket are never mistaken for current ones, and a scan stops
//! at the first block that is not a valid record of the current epoch (the end of the log).

use xxhash_rust::xxh3::xxh3_64;

use regolith_proto::common::Version;

/// Alignment of every record, bucket header and I/O (covers 512-byte and 4 KiB devices).
pub const BLOCK: u64 = 4096;
/// Values of at least this size start on a [`BLOCK`] boundary of their record.
pub const ALIGN_VALUE_FROM: u64 = 64 * 1024;
/// Bytes of a record header.
pub const RECORD_HEADER: usize = 64;
/// Longest key a record holds (keys of the Mooncake API are far shorter).
pub const MAX_KEY: usize = 64 * 1024;
/// The label file in a disk's directory.
pub const LABEL_FILE: &str = "regolith-disk.json";
/// Version of this format, written in the label.
pub const FORMAT: u32 = 1;

const RECORD_MAGIC: u32 = 0x5247_4C52; // "RGLR"
const RECORD_LAYOUT: u16 = 1;
const FLAG_VALUE_ALIGNED: u16 = 1;
const BUCKET_MAGIC: &[u8; 8] = b"RGLBUCK1";

/// Rounds `n` up to a multiple of [`BLOCK`].
pub fn align_block(n: u64) -> u64 {
    n.div_ceil(BLOCK).saturating_mul(BLOCK)
}

/// The name of bucket `i`'s file.
pub fn bucket_file_name(i: u32) -> String {
    format!("bucket-{i:06}.rgl")
}

/// The bucket number a file name stands for, if it is one.
pub fn parse_bucket_file_name(name: &str) -> Option<u32> {
    let digits = name.strip_prefix("bucket-")?.strip_suffix(".rgl")?;
    if digits.len() != 6 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The label file's contents: the disk's identity and the bucket size it was formatted with.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Label {
    pub format: u32,
    /// Random at formatting; tells this disk from another mounted at the same path.
    pub disk_id: String,
    pub bucket_size: u64,
}

/// Where a record's parts lie, relative to its start.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct RecordShape {
    pub key_len: u32,
    pub value_off: u64,
    pub value_len: u64,
    /// The record's length on disk, a multiple of [`BLOCK`].
    pub len: u64,
}

impl RecordShape {
    /// The shape of a record of this key and value length; None when the key is too long.
    pub fn new(key_len: usize, value_len: u64) -> Option<Self> {
        if key_len > MAX_KEY {
            return None;
        }
        let after_key = (RECORD_HEADER + key_len) as u64;
        let value_off = if value_len >= ALIGN_VALUE_FROM {
            align_block(after_key)
        } else {
            after_key.div_ceil(8) * 8
        };
        let len = align_block(value_off.checked_add(value_len)?);
        Some(Self {
            key_len: key_len as u32,
            value_off,
            value_len,
            len,
        })
    }

    fn aligned(&self) -> bool {
        self.value_len >= ALIGN_VALUE_FROM
    }
}

/// What a record says of itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordHeader {
    pub key: String,
    pub version: Version,
    /// The object's checksum (design §3, invariant 4) over the value.
    pub checksum: u64,
    pub epoch: u64,
    pub shape: RecordShape,
}

/// Writes the header and key of a record into `out` (at least `value_off` bytes; the padding
/// up to the value is zeroed).
pub fn encode_record_head(
    out: &mut [u8],
    key: &str,
    version: Version,
    checksum: u64,
    epoch: u64,
    shape: &RecordShape,
) {
    let k = key.len();
    let head = &mut out[..shape.value_off as usize];
    head.fill(0);
    head[0..4].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
    head[4..6].copy_from_slice(&RECORD_LAYOUT.to_le_bytes());
    let flags = if shape.aligned() {
        FLAG_VALUE_ALIGNED
    } else {
        0
    };
    head[6..8].copy_from_slice(&flags.to_le_bytes());
    head[8..12].copy_from_slice(&(k as u32).to_le_bytes());
    head[16..24].copy_from_slice(&shape.value_len.to_le_bytes());
    head[24..32].copy_from_slice(&version.term.to_le_bytes());
    head[32..40].copy_from_slice(&version.id.to_le_bytes());
    head[40..48].copy_from_slice(&checksum.to_le_bytes());
    head[48..56].copy_from_slice(&epoch.to_le_bytes());
    head[RECORD_HEADER..RECORD_HEADER + k].copy_from_slice(key.as_bytes());
    let h = header_hash(&head[..56], key.as_bytes());
    head[56..64].copy_from_slice(&h.to_le_bytes());
}

fn header_hash(fixed: &[u8], key: &[u8]) -> u64 {
    let mut b = Vec::with_capacity(fixed.len() + key.len());
    b.extend_from_slice(fixed);
    b.extend_from_slice(key);
    xxh3_64(&b)
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Why bytes are not a record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotARecord {
    /// No record starts here (the end of the bucket's log, or bytes of another kind).
    NoMagic,
    /// The key does not fit in the bytes given: read `need` bytes from the record's start.
    Short { need: usize },
    /// A record header whose fields or hash are wrong (a torn or corrupted write).
    Corrupt(&'static str),
}

/// Decodes the record starting at `b[0]`. `b` must hold the header and the key.
pub fn decode_record_head(b: &[u8]) -> Result<RecordHeader, NotARecord> {
    if b.len() < RECORD_HEADER {
        return Err(NotARecord::Short {
            need: RECORD_HEADER,
        });
    }
    let magic = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    if magic != RECORD_MAGIC {
        return Err(NotARecord::NoMagic);
    }
    if u16::from_le_bytes([b[4], b[5]]) != RECORD_LAYOUT {
        return Err(NotARecord::Corrupt("unknown record layout"));
    }
    let flags = u16::from_le_bytes([b[6], b[7]]);
    let key_len = u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize;
    if key_len > MAX_KEY {
        return Err(NotARecord::Corrupt("key length out of range"));
    }
    if b.len() < RECORD_HEADER + key_len {
        return Err(NotARecord::Short {
            need: RECORD_HEADER + key_len,
        });
    }
    let key_bytes = &b[RECORD_HEADER..RECORD_HEADER + key_len];
    if header_hash(&b[..56], key_bytes) != le_u64(b, 56) {
        return Err(NotARecord::Corrupt("header hash mismatch"));
    }
    let value_len = le_u64(b, 16);
    let shape = RecordShape::new(key_len, value_len)
        .ok_or(NotARecord::Corrupt("record length out of range"))?;
    if (flags & FLAG_VALUE_ALIGNED != 0) != shape.aligned() {
        return Err(NotARecord::Corrupt("alignment flag disagrees with length"));
    }
    let key = std::str::from_utf8(key_bytes)
        .map_err(|_| NotARecord::Corrupt("key is not UTF-8"))?
        .to_owned();
    Ok(RecordHeader {
        key,
        version: Version {
            term: le_u64(b, 24),
            id: le_u64(b, 32),
        },
        checksum: le_u64(b, 40),
        epoch: le_u64(b, 48),
        shape,
    })
}

/// The first block of a bucket file.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct BucketHeader {
    pub bucket: u32,
    /// Raised each time the bucket is reused; its records carry it.
    pub epoch: u64,
}

impl BucketHeader {
    /// Encodes into one [`BLOCK`].
    pub fn encode(&self, out: &mut [u8]) {
        let out = &mut out[..BLOCK as usize];
        out.fill(0);
        out[0..8].copy_from_slice(BUCKET_MAGIC);
        out[8..12].copy_from_slice(&self.bucket.to_le_bytes());
        out[16..24].copy_from_slice(&self.epoch.to_le_bytes());
        let h = xxh3_64(&out[..24]);
        out[24..32].copy_from_slice(&h.to_le_bytes());
    }

    /// None for a block that is not a valid header (never written, torn or corrupted).
    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.len() < 32 || &b[0..8] != BUCKET_MAGIC || xxh3_64(&b[..24]) != le_u64(b, 24) {
            return None;
        }
        Some(Self {
            bucket: u32::from_le_bytes([b[8], b[9], b[10], b[11]]),
            epoch: le_u64(b, 16),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn encode(key: &str, value_len: u64, epoch: u64) -> (Vec<u8>, RecordShape) {
        let shape = RecordShape::new(key.len(), value_len).unwrap();
        let mut buf = vec![0xAAu8; shape.len as usize];
        encode_record_head(
            &mut buf,
            key,
            Version { term: 7, id: 9 },
            0xfeed,
            epoch,
            &shape,
        );
        (buf, shape)
    }

    #[test]
    fn small_values_follow_the_key_and_large_ones_start_on_a_block() {
        let s = RecordShape::new(10, 4096).unwrap();
        assert_eq!(s.value_off, 80);
        assert_eq!(s.len, 8192);
        let s = RecordShape::new(10, 100).unwrap();
        assert_eq!(s.len, 4096);
        let s = RecordShape::new(10, 1 << 20).unwrap();
        assert_eq!(s.value_off, BLOCK);
        assert_eq!(s.len, BLOCK + (1 << 20));
        assert!(RecordShape::new(MAX_KEY + 1, 1).is_none());
    }

    #[test]
    fn a_record_head_decodes_to_what_was_encoded() {
        let (buf, shape) = encode("chunk/0001", 300_000, 5);
        let h = decode_record_head(&buf).unwrap();
        assert_eq!(h.key, "chunk/0001");
        assert_eq!(h.version, Version { term: 7, id: 9 });
        assert_eq!(h.checksum, 0xfeed);
        assert_eq!(h.epoch, 5);
        assert_eq!(h.shape, shape);
    }

    #[test]
    fn a_short_buffer_asks_for_the_bytes_the_key_needs() {
        let key = "k".repeat(5000);
        let (buf, _) = encode(&key, 10, 1);
        assert_eq!(
            decode_record_head(&buf[..4096]),
            Err(NotARecord::Short { need: 5064 })
        );
        assert!(decode_record_head(&buf[..5064]).is_ok());
    }

    #[test]
    fn zeroed_blocks_are_the_end_of_the_log() {
        assert_eq!(decode_record_head(&[0u8; 4096]), Err(NotARecord::NoMagic));
    }

    #[test]
    fn bucket_headers_round_trip_and_reject_damage() {
        let mut b = vec![0u8; BLOCK as usize];
        let h = BucketHeader {
            bucket: 3,
            epoch: 12,
        };
        h.encode(&mut b);
        assert_eq!(BucketHeader::decode(&b), Some(h));
        b[17] ^= 1;
        assert_eq!(BucketHeader::decode(&b), None);
        assert_eq!(BucketHeader::decode(&[0u8; 4096]), None);
    }

    #[test]
    fn bucket_file_names_round_trip() {
        assert_eq!(bucket_file_name(42), "bucket-000042.rgl");
        assert_eq!(parse_bucket_file_name("bucket-000042.rgl"), Some(42));
        assert_eq!(parse_bucket_file_name("bucket-42.rgl"), None);
        assert_eq!(parse_bucket_file_name("bucket-00004x.rgl"), None);
        assert_eq!(parse_bucket_file_name("regolith-disk.json"), None);
    }

    proptest! {
        /// Any one flipped bit of a record's header or key is caught.
        #[test]
        fn a_flipped_bit_in_a_head_is_never_read_as_a_record(
            key in "[a-z0-9/_]{1,200}", value_len in 0u64..200_000, bit in 0usize..(8 * 264),
        ) {
            let (mut buf, shape) = encode(&key, value_len, 3);
            let head = RECORD_HEADER + key.len();
            let bit = bit % (8 * head);
            buf[bit / 8] ^= 1 << (bit % 8);
            if let Ok(h) = decode_record_head(&buf[..shape.value_off as usize]) {
                prop_assert!(false, "damaged head decoded as {h:?}");
            }
        }
    }
}
