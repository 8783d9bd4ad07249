//! The data-plane wire (`regolith_proto::dataplane`): the handshake a server reads from any
//! TCP peer, the request headers it reads next, and the reply headers a client reads.

use regolith_proto::dataplane::{
    Hello, HelloReply, Reply, Request, HELLO_LEN, HELLO_REPLY_LEN, MAX_SLICE_LEN, MAX_TOKEN_LEN,
    REPLY_LEN, REQUEST_LEN, REQUEST_LEN_V1,
};

/// A client's `Hello` (fixed part, then the token), and a server's `HelloReply`: both from the
/// first 16 bytes, the token from what follows.
pub fn dataplane_hello(data: &[u8]) {
    let Some(fixed) = data.first_chunk::<HELLO_LEN>() else {
        return;
    };
    if let Ok(h) = Hello::decode_fixed(fixed) {
        assert!(
            usize::from(h.token_len) <= MAX_TOKEN_LEN,
            "token over the cap"
        );
        let rest = &data[HELLO_LEN..];
        // The server reads exactly `token_len` more bytes; with them the Hello round-trips.
        if let Some(token) = rest.get(..usize::from(h.token_len)) {
            let hello = Hello {
                version: h.version,
                node_id: h.node_id,
                token: token.to_vec(),
            };
            match hello.encode() {
                Ok(enc) => assert_eq!(enc, &data[..HELLO_LEN + token.len()]),
                Err(e) => panic!("a decoded Hello does not re-encode: {e}"),
            }
        }
    }
    let reply: &[u8; HELLO_REPLY_LEN] = fixed;
    if let Ok(r) = HelloReply::decode(reply) {
        assert_eq!(
            &r.encode(),
            reply,
            "HelloReply decode → encode is not the input"
        );
    }
}

/// A request header: byte 0 picks the cap on `len` (the node's own cap may be lower than the
/// protocol's); the rest is decoded whole (80 or 48 bytes; other lengths are refused), then as
/// its first 80 and 48 bytes.
pub fn dataplane_request(data: &[u8]) {
    let Some((&knob, header)) = data.split_first() else {
        return;
    };
    let max_len = match knob % 3 {
        0 => MAX_SLICE_LEN,
        1 => u32::MAX,
        _ => u32::from(knob) << 12,
    };
    request(header, max_len);
    for n in [REQUEST_LEN, REQUEST_LEN_V1] {
        if let Some(h) = header.get(..n) {
            request(h, max_len);
        }
    }
}

fn request(header: &[u8], max_len: u32) {
    let Ok(r) = Request::decode(header, max_len) else {
        return;
    };
    assert!(header.len() == REQUEST_LEN || header.len() == REQUEST_LEN_V1);
    assert!(r.len <= max_len.min(MAX_SLICE_LEN), "len over the cap");
    let enc = r.encode();
    // A version-1 header has no grant: its 48 bytes re-encode, the grant is all zero.
    assert_eq!(
        &enc[..header.len()],
        header,
        "Request decode → encode is not the input"
    );
    if header.len() == REQUEST_LEN_V1 {
        assert!(enc[REQUEST_LEN_V1..].iter().all(|&b| b == 0));
    }
}

/// A reply header, from the first 24 bytes.
pub fn dataplane_reply(data: &[u8]) {
    let Some(b) = data.first_chunk::<REPLY_LEN>() else {
        return;
    };
    if let Ok(r) = Reply::decode(b) {
        assert_eq!(&r.encode(), b, "Reply decode → encode is not the input");
    }
}

/// The RDMA upgrade messages (`regolith_proto::rdma`): byte 0 picks the offer (even) or the
/// accept (odd) decoder; whatever decodes must re-encode to the input and validate.
pub fn rdma_upgrade(data: &[u8]) {
    let Some((&knob, msg)) = data.split_first() else {
        return;
    };
    if knob % 2 == 0 {
        if let Ok(o) = regolith_proto::rdma::Offer::decode(msg) {
            assert!(o.validate().is_ok(), "a decoded offer does not validate");
            assert_eq!(
                o.encode().ok().as_deref(),
                Some(msg),
                "Offer decode → encode is not the input"
            );
        }
    } else if let Ok(a) = regolith_proto::rdma::Accept::decode(msg) {
        assert!(a.validate().is_ok(), "a decoded accept does not validate");
        assert!(a.covers(0, a.seg_len) && !a.covers(0, a.seg_len + 1));
        assert_eq!(
            a.encode().ok().as_deref(),
            Some(msg),
            "Accept decode → encode is not the input"
        );
    }
}
