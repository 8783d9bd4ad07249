//! The UDS frame codec of design §8.
//!
//! ```text
//! offset  size  field
//!      0     4  length      u32 LE: bytes after this field = 2 + 8 + body length (so >= 10)
//!      4     2  opcode      u16 LE, defined by the protocol using the frames
//!      6     8  request id  u64 LE, echoed by the reply; requests are answered possibly out of order
//!     14     *  body        `length - 10` bytes (a protobuf message for the UDS protocol)
//! ```
//!
//! The decoder checks `length` against a cap ([`DEFAULT_MAX_LENGTH`] unless the caller chooses
//! another) *before* it reserves any memory for the frame, so a peer announcing a 4 GiB frame
//! gets [`FrameError::TooLong`] and costs nothing. Broken framing (too long, too short) cannot be
//! resynchronised: the caller should answer with an error if it can and close the connection.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio_util::codec::{Decoder, Encoder};

/// Size of the `length` field.
pub const LENGTH_FIELD: usize = 4;
/// Smallest legal `length`: opcode + request id, empty body.
pub const MIN_LENGTH: u32 = 10;
/// Bytes of a frame before its body.
/// The most the decoder reserves ahead of the bytes it holds for a frame still arriving.
pub const RESERVE_AHEAD: usize = 256 * 1024;
pub const HEADER_LEN: usize = LENGTH_FIELD + MIN_LENGTH as usize;
/// Default largest body (64 MiB): large enough for inline values and batch requests.
pub const DEFAULT_MAX_BODY: u32 = 64 * 1024 * 1024;
/// Default cap on the `length` field.
pub const DEFAULT_MAX_LENGTH: u32 = DEFAULT_MAX_BODY + MIN_LENGTH;

/// Framing errors; all but `Io` mean the stream can no longer be trusted.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("frame length {length} exceeds the cap of {max} bytes")]
    TooLong { length: u64, max: u32 },
    #[error("frame length {length} is below the minimum of {MIN_LENGTH} (opcode + request id)")]
    TooShort { length: u32 },
    #[error("truncated frame: {have} of {needed} bytes")]
    Truncated { needed: usize, have: usize },
    #[error("{extra} bytes after the end of the frame")]
    Trailing { extra: usize },
    #[error("frame i/o: {0}")]
    Io(#[from] std::io::Error),
}

/// One decoded frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub opcode: u16,
    pub request_id: u64,
    pub body: Bytes,
}

impl Frame {
    pub fn new(opcode: u16, request_id: u64, body: impl Into<Bytes>) -> Self {
        Self {
            opcode,
            request_id,
            body: body.into(),
        }
    }
}

/// The 14 header bytes of a frame with a body of `body_len` bytes, for callers that write the
/// body separately (vectored writes). Fails when the frame would exceed `max_length`.
pub fn header(
    opcode: u16,
    request_id: u64,
    body_len: usize,
    max_length: u32,
) -> Result<[u8; HEADER_LEN], FrameError> {
    let length = body_len as u64 + u64::from(MIN_LENGTH);
    if length > u64::from(max_length) {
        return Err(FrameError::TooLong {
            length,
            max: max_length,
        });
    }
    let mut h = [0u8; HEADER_LEN];
    h[..4].copy_from_slice(&(length as u32).to_le_bytes());
    h[4..6].copy_from_slice(&opcode.to_le_bytes());
    h[6..].copy_from_slice(&request_id.to_le_bytes());
    Ok(h)
}

/// Appends one frame to `dst`.
pub fn encode(
    opcode: u16,
    request_id: u64,
    body: &[u8],
    max_length: u32,
    dst: &mut impl BufMut,
) -> Result<(), FrameError> {
    let h = header(opcode, request_id, body.len(), max_length)?;
    dst.put_slice(&h);
    dst.put_slice(body);
    Ok(())
}

/// One frame as a fresh `Vec`, with the default cap.
pub fn encode_to_vec(opcode: u16, request_id: u64, body: &[u8]) -> Result<Vec<u8>, FrameError> {
    let mut v = Vec::with_capacity(HEADER_LEN + body.len());
    encode(opcode, request_id, body, DEFAULT_MAX_LENGTH, &mut v)?;
    Ok(v)
}

/// Validates a `length` field; returns the frame's total size on the wire.
fn checked_total(length: u32, max_length: u32) -> Result<usize, FrameError> {
    if length < MIN_LENGTH {
        return Err(FrameError::TooShort { length });
    }
    if length > max_length {
        return Err(FrameError::TooLong {
            length: length.into(),
            max: max_length,
        });
    }
    Ok(LENGTH_FIELD + length as usize)
}

/// Decodes exactly one frame that must fill `buf` (datagram-style use, tests).
pub fn decode_exact(buf: &[u8], max_length: u32) -> Result<Frame, FrameError> {
    if buf.len() < LENGTH_FIELD {
        return Err(FrameError::Truncated {
            needed: HEADER_LEN,
            have: buf.len(),
        });
    }
    let length = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
    let total = checked_total(length, max_length)?;
    if buf.len() < total {
        return Err(FrameError::Truncated {
            needed: total,
            have: buf.len(),
        });
    }
    if buf.len() > total {
        return Err(FrameError::Trailing {
            extra: buf.len() - total,
        });
    }
    let mut b = &buf[LENGTH_FIELD..];
    let opcode = b.get_u16_le();
    let request_id = b.get_u64_le();
    Ok(Frame {
        opcode,
        request_id,
        body: Bytes::copy_from_slice(b),
    })
}

/// Incremental decoder and encoder; usable directly ([`FrameCodec::feed`]) or as a
/// `tokio_util::codec` codec under `Framed`.
#[derive(Debug)]
pub struct FrameCodec {
    max_length: u32,
    buf: BytesMut,
}

impl Default for FrameCodec {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_LENGTH)
    }
}

impl FrameCodec {
    /// A codec refusing frames whose `length` field exceeds `max_length`.
    pub fn new(max_length: u32) -> Self {
        Self {
            max_length: max_length.max(MIN_LENGTH),
            buf: BytesMut::new(),
        }
    }

    pub fn max_length(&self) -> u32 {
        self.max_length
    }

    /// Changes the cap (a session allows larger frames once its peer said hello).
    pub fn set_max_length(&mut self, max_length: u32) {
        self.max_length = max_length.max(MIN_LENGTH);
    }

    /// Appends received bytes to the internal buffer (standalone use).
    pub fn feed(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete frame of the fed bytes, if any.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        let mut buf = std::mem::take(&mut self.buf);
        let r = self.decode(&mut buf);
        self.buf = buf;
        r
    }

    /// Call at end of stream: an incomplete frame left over is [`FrameError::Truncated`].
    pub fn finish(&mut self) -> Result<(), FrameError> {
        let mut buf = std::mem::take(&mut self.buf);
        let r = self.decode_eof(&mut buf);
        self.buf = buf;
        match r? {
            None => Ok(()),
            // A complete frame at EOF is the caller's bug (it should have drained
            // `next_frame`); report it rather than drop it silently.
            Some(_) => Err(FrameError::Truncated {
                needed: 0,
                have: self.buf.len(),
            }),
        }
    }

    /// Bytes fed but not yet returned as frames.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }
}

impl Decoder for FrameCodec {
    type Item = Frame;
    type Error = FrameError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        if src.len() < LENGTH_FIELD {
            return Ok(None);
        }
        let length = u32::from_le_bytes([src[0], src[1], src[2], src[3]]);
        let total = checked_total(length, self.max_length)?;
        if src.len() < total {
            // Room grows with the bytes that arrive, never on the word of a length field
            // alone: a peer announcing a 64 MiB frame and sending nothing more costs nothing.
            src.reserve((total - src.len()).min(RESERVE_AHEAD));
            return Ok(None);
        }
        let mut frame = src.split_to(total);
        frame.advance(LENGTH_FIELD);
        let opcode = frame.get_u16_le();
        let request_id = frame.get_u64_le();
        Ok(Some(Frame {
            opcode,
            request_id,
            body: frame.freeze(),
        }))
    }

    fn decode_eof(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        match self.decode(src)? {
            Some(f) => Ok(Some(f)),
            None if src.is_empty() => Ok(None),
            None => {
                let needed = if src.len() < LENGTH_FIELD {
                    HEADER_LEN
                } else {
                    LENGTH_FIELD + u32::from_le_bytes([src[0], src[1], src[2], src[3]]) as usize
                };
                Err(FrameError::Truncated {
                    needed,
                    have: src.len(),
                })
            }
        }
    }
}

impl Encoder<Frame> for FrameCodec {
    type Error = FrameError;

    fn encode(&mut self, item: Frame, dst: &mut BytesMut) -> Result<(), FrameError> {
        <Self as Encoder<&Frame>>::encode(self, &item, dst)
    }
}

impl Encoder<&Frame> for FrameCodec {
    type Error = FrameError;

    fn encode(&mut self, item: &Frame, dst: &mut BytesMut) -> Result<(), FrameError> {
        dst.reserve(HEADER_LEN + item.body.len());
        encode(
            item.opcode,
            item.request_id,
            &item.body,
            self.max_length,
            dst,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn layout_is_little_endian_length_opcode_id_body() {
        let v = encode_to_vec(0x0102, 0x0807_0605_0403_0201, b"xyz").unwrap();
        assert_eq!(
            v,
            [13, 0, 0, 0, 2, 1, 1, 2, 3, 4, 5, 6, 7, 8, b'x', b'y', b'z']
        );
        let f = decode_exact(&v, DEFAULT_MAX_LENGTH).unwrap();
        assert_eq!(f, Frame::new(0x0102, 0x0807_0605_0403_0201, &b"xyz"[..]));
    }

    #[test]
    fn typed_errors() {
        let mut c = FrameCodec::new(100);
        c.feed(&9u32.to_le_bytes());
        assert!(matches!(
            c.next_frame(),
            Err(FrameError::TooShort { length: 9 })
        ));

        let mut c = FrameCodec::new(100);
        c.feed(&u32::MAX.to_le_bytes());
        assert!(matches!(
            c.next_frame(),
            Err(FrameError::TooLong { max: 100, .. })
        ));
        assert!(c.buf.capacity() < 1024, "no allocation sized by the peer");

        let mut c = FrameCodec::new(100);
        c.feed(&[20, 0, 0, 0, 1, 0]);
        assert!(c.next_frame().unwrap().is_none());
        assert!(matches!(
            c.finish(),
            Err(FrameError::Truncated {
                needed: 24,
                have: 6
            })
        ));

        assert!(matches!(
            header(1, 1, 91, 100),
            Err(FrameError::TooLong { length: 101, .. })
        ));
        assert!(header(1, 1, 90, 100).is_ok());
        assert!(matches!(
            decode_exact(&[1, 2], 100),
            Err(FrameError::Truncated { .. })
        ));
    }

    #[test]
    fn frames_split_at_every_byte_boundary() {
        let mut wire = Vec::new();
        for i in 0..5u64 {
            let body = vec![i as u8; i as usize * 3];
            encode(i as u16, i, &body, DEFAULT_MAX_LENGTH, &mut wire).unwrap();
        }
        let mut c = FrameCodec::default();
        let mut got = Vec::new();
        for b in &wire {
            c.feed(std::slice::from_ref(b));
            while let Some(f) = c.next_frame().unwrap() {
                got.push(f);
            }
        }
        c.finish().unwrap();
        assert_eq!(got.len(), 5);
        for (i, f) in got.iter().enumerate() {
            assert_eq!(f.opcode as usize, i);
            assert_eq!(f.body.len(), i * 3);
        }
    }

    proptest! {
        #[test]
        fn round_trip(frames in proptest::collection::vec(
            (any::<u16>(), any::<u64>(), proptest::collection::vec(any::<u8>(), 0..300)), 0..20),
            cut in 1usize..64)
        {
            let mut enc = FrameCodec::new(1000);
            let mut wire = BytesMut::new();
            for (op, id, body) in &frames {
                Encoder::encode(&mut enc, Frame::new(*op, *id, body.clone()), &mut wire).unwrap();
            }
            let mut dec = FrameCodec::new(1000);
            let mut got = Vec::new();
            for piece in wire.chunks(cut) {
                dec.feed(piece);
                while let Some(f) = dec.next_frame().unwrap() {
                    got.push(f);
                }
            }
            dec.finish().unwrap();
            prop_assert_eq!(got.len(), frames.len());
            for (f, (op, id, body)) in got.iter().zip(&frames) {
                prop_assert_eq!(f.opcode, *op);
                prop_assert_eq!(f.request_id, *id);
                prop_assert_eq!(&f.body[..], &body[..]);
            }
        }

        #[test]
        fn random_bytes_never_panic_nor_overallocate(
            bytes in proptest::collection::vec(any::<u8>(), 0..2000),
            cut in 1usize..50,
            max in 10u32..512)
        {
            let mut c = FrameCodec::new(max);
            let mut fed = 0usize;
            'outer: for piece in bytes.chunks(cut) {
                c.feed(piece);
                fed += piece.len();
                loop {
                    match c.next_frame() {
                        Ok(Some(f)) => prop_assert!(f.body.len() + 10 <= max as usize),
                        Ok(None) => break,
                        Err(FrameError::TooLong { .. } | FrameError::TooShort { .. }) => break 'outer,
                        Err(e) => panic!("unexpected {e}"),
                    }
                }
                // What the decoder reserves is bounded by the cap, not by the length field.
                let bound = 2 * (fed.max(HEADER_LEN + max as usize) + 64);
                prop_assert!(c.buf.capacity() <= bound, "capacity {} > {}", c.buf.capacity(), bound);
            }
        }
    }
}
