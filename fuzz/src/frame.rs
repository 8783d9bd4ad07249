//! The UDS frame codec (`regolith_proto::frame`): `decode_exact` and the incremental
//! `FrameCodec` fed in pieces.

use regolith_proto::frame::{self, FrameCodec, FrameError, LENGTH_FIELD, MIN_LENGTH};

/// Byte 0 picks the cap and the piece size; the rest is the stream.
pub fn uds_frame(data: &[u8]) {
    let Some((&knob, wire)) = data.split_first() else {
        return;
    };
    // Small caps reach TooLong with small inputs; the default cap is what the sidecar uses.
    let max = if knob & 0x80 == 0 {
        frame::DEFAULT_MAX_LENGTH
    } else {
        MIN_LENGTH + u32::from(knob & 0x3f) * 16
    };
    let piece = usize::from(knob & 0x0f) + 1;
    exact(wire, max);
    incremental(wire, max, piece);
}

/// `decode_exact`: a frame that decodes is the whole input, and re-encodes to it.
fn exact(wire: &[u8], max: u32) {
    if let Ok(f) = frame::decode_exact(wire, max) {
        assert!(
            f.body.len() + MIN_LENGTH as usize <= max as usize,
            "body over the cap"
        );
        let mut again = Vec::new();
        let enc = frame::encode(f.opcode, f.request_id, &f.body, max, &mut again);
        assert!(enc.is_ok(), "a decoded frame does not re-encode: {enc:?}");
        assert_eq!(again, wire, "decode_exact → encode is not the input");
    }
}

/// The incremental decoder, fed `piece` bytes at a time: every frame it returns is within the
/// cap and is exactly the bytes it consumed; what it buffers stays bounded.
fn incremental(wire: &[u8], max: u32, piece: usize) {
    let mut codec = FrameCodec::new(max);
    let (mut fed, mut consumed) = (0usize, 0usize);
    for chunk in wire.chunks(piece) {
        codec.feed(chunk);
        fed += chunk.len();
        loop {
            match codec.next_frame() {
                Ok(Some(f)) => {
                    assert!(f.body.len() + MIN_LENGTH as usize <= max as usize);
                    let len = LENGTH_FIELD + MIN_LENGTH as usize + f.body.len();
                    let mut again = Vec::new();
                    let enc = frame::encode(f.opcode, f.request_id, &f.body, max, &mut again);
                    assert!(enc.is_ok(), "a decoded frame does not re-encode: {enc:?}");
                    assert_eq!(
                        &again[..],
                        &wire[consumed..consumed + len],
                        "frame ≠ its bytes"
                    );
                    consumed += len;
                }
                Ok(None) => break,
                Err(FrameError::TooLong { .. } | FrameError::TooShort { .. }) => return,
                Err(e) => panic!("next_frame: unexpected {e}"),
            }
        }
        assert_eq!(codec.buffered(), fed - consumed, "bytes lost or invented");
    }
    // At the end: either nothing is left, or finish reports the partial frame as truncated.
    let left = codec.buffered();
    match codec.finish() {
        Ok(()) => assert_eq!(left, 0),
        Err(FrameError::Truncated { .. }) => assert!(left > 0),
        Err(e) => panic!("finish: unexpected {e}"),
    }
}
