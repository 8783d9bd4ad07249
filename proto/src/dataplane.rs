//! The data-plane wire protocol between sidecars (design §7), version 2 (version 1 still spoken).
//!
//! A connection is TCP with `TCP_NODELAY`. All integers are little-endian. A connection carries
//! one handshake, then any number of requests, **one at a time**: the client sends a request
//! (and, for a write, its body) and waits for the reply before sending the next one. Parallelism
//! comes from many connections (several per NIC pair), not from pipelining on one; `req_id` is
//! echoed so that either side can detect a desynchronised stream.
//!
//! # Handshake
//!
//! Client → server, `Hello`, 16 bytes + token:
//!
//! ```text
//! offset size field
//!      0    4 magic       "RGDP" (0x52 0x47 0x44 0x50)
//!      4    2 version     u16, the highest protocol version the client speaks (2)
//!      6    2 token_len   u16, 0..=4096 (0 when the cluster runs without a token)
//!      8    8 node_id     u64, the sender's node id
//!     16    * token       token_len bytes of cluster token
//! ```
//!
//! Server → client, `HelloReply`, 16 bytes:
//!
//! ```text
//! offset size field
//!      0    4 magic       "RGDP"
//!      4    2 version     u16: accepted → the version both will speak, min(client, server);
//!                         refused → the highest version the server speaks
//!      6    2 code        u16: 0 ACCEPTED, 1 BAD_MAGIC, 2 UNSUPPORTED_VERSION, 3 BAD_TOKEN,
//!                         4 BUSY (connection limit), 5 SHUTTING_DOWN
//!      8    8 node_id     u64, the server's node id (lets the client detect a wrong peer)
//! ```
//!
//! The server reads nothing after the `Hello` until it has checked the token (in constant
//! time); on any refusal it sends the reply and closes the connection. A token longer than
//! 4096 bytes is refused (`BAD_TOKEN`) without being read.
//!
//! # Requests
//!
//! Client → server, 80 bytes (version 1: the first 48), followed for a write by exactly `len`
//! body bytes:
//!
//! ```text
//! offset size field
//!      0    1 kind        u8: 1 WRITE, 2 READ, 3 RDMA_CONNECT, 4 RDMA_COMMIT (see below)
//!      1    3 reserved    must be 0
//!      4    4 len         u32, slice length in bytes, <= 64 MiB (MAX_SLICE_LEN)
//!      8    8 req_id      u64, chosen by the client, echoed in the reply
//!     16    8 generation  u64, the target segment's generation (old generations are refused)
//!     24    8 offset      u64, byte offset of the slice in the target segment
//!     32    8 term        u64, the reservation's term (write) / the object version's term (read)
//!     40    8 res_id      u64, the reservation's id (write) / the object version's id (read)
//!     48    8 grant_off   u64, the granted extent's offset in the segment (version 2)
//!     56    8 grant_len   u64, the granted extent's length (version 2)
//!     64   16 grant_mac   the leader's MAC over kind, node, generation, term, res_id and the
//!                         granted extent ([`crate::grant`]; version 2)
//! ```
//!
//! A node that holds a grant key (metad sends it at mount) serves a slice only when its grant's
//! MAC verifies and the slice lies inside the granted extent, and answers FORBIDDEN otherwise:
//! a read must name an object version the leader placed there, a write a reservation the
//! leader made there. This is checked before the term: a forged term changes nothing. A
//! version-1 request carries no grant and is FORBIDDEN at such a node.
//!
//! Server → client, 24 bytes, followed for a successful read by exactly `len` data bytes:
//!
//! ```text
//! offset size field
//!      0    8 req_id      u64, the request's req_id
//!      8    2 status      u16: 0 OK, 1 BAD_GENERATION, 2 STALE_TERM, 3 OUT_OF_RANGE, 4 FENCED,
//!                         5 TOO_LARGE, 6 BAD_REQUEST, 7 INTERNAL, 8 FORBIDDEN (version 2),
//!                         9 UNSUPPORTED (RDMA kinds at a node or on a connection without RDMA)
//!     10    2 reserved    0
//!     12    4 len         u32: READ with OK → the request's len; otherwise 0
//!     16    8 term        u64, the highest term the server has seen (a client seeing STALE_TERM
//!                         learns the newer term from it)
//! ```
//!
//! Refusals: a write refused after its header was read (BAD_GENERATION, STALE_TERM,
//! OUT_OF_RANGE, FENCED, FORBIDDEN) has its body read and discarded by the server, which then replies and
//! keeps the connection. A header that cannot be trusted (unknown kind, non-zero reserved bytes:
//! BAD_REQUEST; `len` above the cap: TOO_LARGE) is answered and the connection closed, since the
//! body length cannot be relied on. A write is acknowledged only once its body is in segment
//! memory; a write whose term was superseded while its body was arriving answers STALE_TERM.
//!
//! # RDMA (the `rdma` feature of the sidecar; `docs/rdma.md`)
//!
//! A connection past its handshake may be upgraded to carry slices over an RDMA queue pair,
//! keeping the TCP connection as its control path:
//!
//! * `RDMA_CONNECT` (kind 3): `len` is the length of the body that follows, an
//!   [`crate::rdma::Offer`] (at most [`crate::rdma::MAX_MSG_LEN`]); every other field is 0.
//!   The server answers OK with `len` bytes of [`crate::rdma::Accept`] after the reply (its
//!   queue pair, its segment's registration for RDMA READ, and the connection's staging window
//!   for RDMA WRITE), or UNSUPPORTED with no body (no RDMA at the node, or no port the
//!   client's device can reach): the connection stays a TCP one. A node that predates the
//!   kind answers BAD_REQUEST and closes the connection.
//! * Reads are one-sided RDMA READs of the segment's registration; no request crosses TCP.
//! * `RDMA_COMMIT` (kind 4): the header of a write, no body. The client has placed the bytes
//!   at the start of the connection's staging window with RDMA WRITE (and seen the
//!   completion); the server admits the slice exactly as a WRITE (range, grant, term, fence)
//!   and copies the window into the segment, then replies. The segment itself is never
//!   registered for remote writes.

use crate::grant::{Grant, MAC_LEN};

/// First four bytes of both handshake messages.
pub const MAGIC: [u8; 4] = *b"RGDP";
/// The protocol version this code speaks.
pub const VERSION: u16 = 2;
/// The oldest version this code still speaks.
pub const MIN_VERSION: u16 = 1;
/// Fixed part of [`Hello`].
pub const HELLO_LEN: usize = 16;
/// Size of [`HelloReply`].
pub const HELLO_REPLY_LEN: usize = 16;
/// Size of a request header (version 2).
pub const REQUEST_LEN: usize = 80;
/// Size of a version-1 request header: the same fields without the grant.
pub const REQUEST_LEN_V1: usize = 48;

/// The request header length of protocol `version`.
pub fn request_len(version: u16) -> usize {
    if version >= 2 {
        REQUEST_LEN
    } else {
        REQUEST_LEN_V1
    }
}
/// Size of a reply header.
pub const REPLY_LEN: usize = 24;
/// Largest slice a request may carry.
pub const MAX_SLICE_LEN: u32 = 64 * 1024 * 1024;
/// Longest cluster token a handshake carries (a token file is a short secret, not a document;
/// `auth` holds token files to the same bound).
pub const MAX_TOKEN_LEN: usize = 4096;

/// Decoding errors: the peer does not speak this protocol (or this version of it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("bad magic {0:02x?} (not a Regolith data-plane peer)")]
    BadMagic([u8; 4]),
    #[error("cluster token of {len} bytes exceeds {MAX_TOKEN_LEN}")]
    TokenTooLong { len: usize },
    #[error("unknown handshake code {0}")]
    UnknownHelloCode(u16),
    #[error("unknown request kind {0}")]
    UnknownKind(u8),
    #[error("unknown status code {0}")]
    UnknownStatus(u16),
    #[error("reserved header bytes are not zero")]
    NonZeroReserved,
    #[error("slice of {len} bytes exceeds the cap of {max}")]
    TooLarge { len: u32, max: u32 },
    #[error("a request header of {0} bytes (48 or 80)")]
    HeaderLength(usize),
}

impl WireError {
    /// The status a server answers a request header with that failed to decode.
    pub fn status(&self) -> Status {
        match self {
            WireError::TooLarge { .. } => Status::TooLarge,
            _ => Status::BadRequest,
        }
    }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn check_magic(b: &[u8]) -> Result<(), WireError> {
    let m = [b[0], b[1], b[2], b[3]];
    if m == MAGIC {
        Ok(())
    } else {
        Err(WireError::BadMagic(m))
    }
}

/// The client's handshake message.
#[derive(Clone, PartialEq, Eq)]
pub struct Hello {
    pub version: u16,
    pub node_id: u64,
    pub token: Vec<u8>,
}

impl std::fmt::Debug for Hello {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token is a secret: never log it.
        f.debug_struct("Hello")
            .field("version", &self.version)
            .field("node_id", &self.node_id)
            .field("token_len", &self.token.len())
            .finish()
    }
}

/// The fixed 16 bytes of a [`Hello`]; the server reads these, then `token_len` more bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HelloFixed {
    pub version: u16,
    pub token_len: u16,
    pub node_id: u64,
}

impl Hello {
    pub fn new(node_id: u64, token: &[u8]) -> Self {
        Self {
            version: VERSION,
            node_id,
            token: token.to_vec(),
        }
    }

    pub fn encode(&self) -> Result<Vec<u8>, WireError> {
        if self.token.len() > MAX_TOKEN_LEN {
            return Err(WireError::TokenTooLong {
                len: self.token.len(),
            });
        }
        let mut v = Vec::with_capacity(HELLO_LEN + self.token.len());
        v.extend_from_slice(&MAGIC);
        v.extend_from_slice(&self.version.to_le_bytes());
        v.extend_from_slice(&(self.token.len() as u16).to_le_bytes());
        v.extend_from_slice(&self.node_id.to_le_bytes());
        v.extend_from_slice(&self.token);
        Ok(v)
    }

    /// Decodes the fixed part; `token_len` is validated against the token cap.
    pub fn decode_fixed(b: &[u8; HELLO_LEN]) -> Result<HelloFixed, WireError> {
        check_magic(b)?;
        let token_len = u16_at(b, 6);
        if usize::from(token_len) > MAX_TOKEN_LEN {
            return Err(WireError::TokenTooLong {
                len: token_len.into(),
            });
        }
        Ok(HelloFixed {
            version: u16_at(b, 4),
            token_len,
            node_id: u64_at(b, 8),
        })
    }
}

/// Why a server refused a handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum RefuseReason {
    BadMagic = 1,
    UnsupportedVersion = 2,
    BadToken = 3,
    Busy = 4,
    ShuttingDown = 5,
}

impl std::fmt::Display for RefuseReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RefuseReason::BadMagic => "bad magic",
            RefuseReason::UnsupportedVersion => "unsupported protocol version",
            RefuseReason::BadToken => "wrong cluster token",
            RefuseReason::Busy => "server at its connection limit",
            RefuseReason::ShuttingDown => "server shutting down",
        })
    }
}

/// The server's handshake answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HelloReply {
    pub version: u16,
    pub verdict: Result<(), RefuseReason>,
    pub node_id: u64,
}

impl HelloReply {
    pub fn encode(&self) -> [u8; HELLO_REPLY_LEN] {
        let code = match self.verdict {
            Ok(()) => 0u16,
            Err(r) => r as u16,
        };
        let mut b = [0u8; HELLO_REPLY_LEN];
        b[..4].copy_from_slice(&MAGIC);
        b[4..6].copy_from_slice(&self.version.to_le_bytes());
        b[6..8].copy_from_slice(&code.to_le_bytes());
        b[8..].copy_from_slice(&self.node_id.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; HELLO_REPLY_LEN]) -> Result<Self, WireError> {
        check_magic(b)?;
        let verdict = match u16_at(b, 6) {
            0 => Ok(()),
            1 => Err(RefuseReason::BadMagic),
            2 => Err(RefuseReason::UnsupportedVersion),
            3 => Err(RefuseReason::BadToken),
            4 => Err(RefuseReason::Busy),
            5 => Err(RefuseReason::ShuttingDown),
            c => return Err(WireError::UnknownHelloCode(c)),
        };
        Ok(Self {
            version: u16_at(b, 4),
            verdict,
            node_id: u64_at(b, 8),
        })
    }
}

/// The version a server speaks with a client offering `client_version`, or the refusal.
pub fn negotiate(client_version: u16) -> Result<u16, RefuseReason> {
    if client_version < MIN_VERSION {
        Err(RefuseReason::UnsupportedVersion)
    } else {
        Ok(client_version.min(VERSION))
    }
}

/// Request kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    Write = 1,
    Read = 2,
    /// Upgrade this connection to an RDMA queue pair ([`crate::rdma`]): the body (`len`
    /// bytes) is an [`crate::rdma::Offer`], a successful reply carries an
    /// [`crate::rdma::Accept`] of `len` bytes.
    RdmaConnect = 3,
    /// A write whose body the client already placed in the connection's RDMA staging window
    /// with RDMA WRITE: the header of a write, no body.
    RdmaCommit = 4,
}

/// A request header (both kinds share the layout).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub kind: Kind,
    pub req_id: u64,
    pub generation: u64,
    pub offset: u64,
    pub len: u32,
    pub term: u64,
    pub res_id: u64,
    /// The leader's grant of the extent the slice lies in (all zero from a version-1 peer).
    pub grant: Grant,
}

impl Request {
    /// The header as protocol `version` lays it out: [`REQUEST_LEN`] bytes from version 2,
    /// [`REQUEST_LEN_V1`] (no grant) before.
    pub fn encode_for(&self, version: u16) -> ([u8; REQUEST_LEN], usize) {
        (self.encode(), request_len(version))
    }

    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[0] = self.kind as u8;
        b[4..8].copy_from_slice(&self.len.to_le_bytes());
        b[8..16].copy_from_slice(&self.req_id.to_le_bytes());
        b[16..24].copy_from_slice(&self.generation.to_le_bytes());
        b[24..32].copy_from_slice(&self.offset.to_le_bytes());
        b[32..40].copy_from_slice(&self.term.to_le_bytes());
        b[40..48].copy_from_slice(&self.res_id.to_le_bytes());
        b[48..56].copy_from_slice(&self.grant.offset.to_le_bytes());
        b[56..64].copy_from_slice(&self.grant.len.to_le_bytes());
        b[64..80].copy_from_slice(&self.grant.mac);
        b
    }

    /// Decodes and validates a header of [`REQUEST_LEN`] bytes, or of [`REQUEST_LEN_V1`] from
    /// a version-1 peer (no grant); `max_len` caps `len` (at most [`MAX_SLICE_LEN`]).
    pub fn decode(b: &[u8], max_len: u32) -> Result<Self, WireError> {
        if b.len() != REQUEST_LEN && b.len() != REQUEST_LEN_V1 {
            return Err(WireError::HeaderLength(b.len()));
        }
        let kind = match b[0] {
            1 => Kind::Write,
            2 => Kind::Read,
            3 => Kind::RdmaConnect,
            4 => Kind::RdmaCommit,
            k => return Err(WireError::UnknownKind(k)),
        };
        if b[1..4] != [0, 0, 0] {
            return Err(WireError::NonZeroReserved);
        }
        let len = u32_at(b, 4);
        let max = max_len.min(MAX_SLICE_LEN);
        if len > max {
            return Err(WireError::TooLarge { len, max });
        }
        Ok(Self {
            kind,
            len,
            req_id: u64_at(b, 8),
            generation: u64_at(b, 16),
            offset: u64_at(b, 24),
            term: u64_at(b, 32),
            res_id: u64_at(b, 40),
            grant: if b.len() == REQUEST_LEN {
                let mut mac = [0u8; MAC_LEN];
                mac.copy_from_slice(&b[64..80]);
                Grant {
                    offset: u64_at(b, 48),
                    len: u64_at(b, 56),
                    mac,
                }
            } else {
                Grant::default()
            },
        })
    }
}

/// Reply status codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Status {
    Ok = 0,
    /// The request names a segment generation this node no longer (or never) serves.
    BadGeneration = 1,
    /// The request's term is below the highest term this node has seen.
    StaleTerm = 2,
    /// `offset + len` lies outside the segment.
    OutOfRange = 3,
    /// The reservation was fenced (expired and quarantined): no more slices accepted for it.
    Fenced = 4,
    /// `len` exceeds the slice cap.
    TooLarge = 5,
    /// The header is malformed.
    BadRequest = 6,
    /// The server failed for reasons of its own.
    Internal = 7,
    /// The request carries no grant of the leader for this slice, or one that does not verify
    /// (version 2).
    Forbidden = 8,
    /// The node does not serve this request kind on this connection (an RDMA upgrade asked of
    /// a node without RDMA, a commit on a connection that is not RDMA): the connection stays
    /// usable for TCP slices.
    Unsupported = 9,
}

impl Status {
    pub fn from_u16(c: u16) -> Result<Self, WireError> {
        Ok(match c {
            0 => Status::Ok,
            1 => Status::BadGeneration,
            2 => Status::StaleTerm,
            3 => Status::OutOfRange,
            4 => Status::Fenced,
            5 => Status::TooLarge,
            6 => Status::BadRequest,
            7 => Status::Internal,
            8 => Status::Forbidden,
            9 => Status::Unsupported,
            c => return Err(WireError::UnknownStatus(c)),
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "OK",
            Status::BadGeneration => "BAD_GENERATION",
            Status::StaleTerm => "STALE_TERM",
            Status::OutOfRange => "OUT_OF_RANGE",
            Status::Fenced => "FENCED",
            Status::TooLarge => "TOO_LARGE",
            Status::BadRequest => "BAD_REQUEST",
            Status::Internal => "INTERNAL",
            Status::Forbidden => "FORBIDDEN",
            Status::Unsupported => "UNSUPPORTED",
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A reply header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reply {
    pub req_id: u64,
    pub status: Status,
    pub len: u32,
    pub term: u64,
}

impl Reply {
    pub fn encode(&self) -> [u8; REPLY_LEN] {
        let mut b = [0u8; REPLY_LEN];
        b[..8].copy_from_slice(&self.req_id.to_le_bytes());
        b[8..10].copy_from_slice(&(self.status as u16).to_le_bytes());
        b[12..16].copy_from_slice(&self.len.to_le_bytes());
        b[16..24].copy_from_slice(&self.term.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; REPLY_LEN]) -> Result<Self, WireError> {
        if b[10..12] != [0, 0] {
            return Err(WireError::NonZeroReserved);
        }
        Ok(Self {
            req_id: u64_at(b, 0),
            status: Status::from_u16(u16_at(b, 8))?,
            len: u32_at(b, 12),
            term: u64_at(b, 16),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn hello_layout() {
        let h = Hello::new(0x0102, b"tok");
        let b = h.encode().unwrap();
        assert_eq!(&b[..4], b"RGDP");
        assert_eq!(&b[4..6], &[2, 0]);
        assert_eq!(&b[6..8], &[3, 0]);
        assert_eq!(&b[8..16], &[2, 1, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&b[16..], b"tok");
        let fixed: [u8; HELLO_LEN] = b[..16].try_into().unwrap();
        assert_eq!(
            Hello::decode_fixed(&fixed).unwrap(),
            HelloFixed {
                version: 2,
                token_len: 3,
                node_id: 0x0102
            }
        );
        assert!(!format!("{h:?}").contains("tok\""));
    }

    #[test]
    fn hello_refusals() {
        let mut fixed = [0u8; HELLO_LEN];
        fixed[..4].copy_from_slice(b"HTTP");
        assert!(matches!(
            Hello::decode_fixed(&fixed),
            Err(WireError::BadMagic(_))
        ));
        fixed[..4].copy_from_slice(&MAGIC);
        fixed[6..8].copy_from_slice(&5000u16.to_le_bytes());
        assert!(matches!(
            Hello::decode_fixed(&fixed),
            Err(WireError::TokenTooLong { len: 5000 })
        ));
        assert!(Hello::new(1, &[b'a'; 5000]).encode().is_err());
        assert_eq!(negotiate(0), Err(RefuseReason::UnsupportedVersion));
        assert_eq!(negotiate(1), Ok(1));
        assert_eq!(negotiate(2), Ok(2));
        assert_eq!(negotiate(7), Ok(VERSION));
        for verdict in [
            Ok(()),
            Err(RefuseReason::BadMagic),
            Err(RefuseReason::UnsupportedVersion),
            Err(RefuseReason::BadToken),
            Err(RefuseReason::Busy),
            Err(RefuseReason::ShuttingDown),
        ] {
            let r = HelloReply {
                version: 1,
                verdict,
                node_id: 9,
            };
            assert_eq!(HelloReply::decode(&r.encode()).unwrap(), r);
        }
    }

    #[test]
    fn request_layout_and_validation() {
        let r = Request {
            kind: Kind::Write,
            req_id: 1,
            generation: 2,
            offset: 3,
            len: 4,
            term: 5,
            res_id: 6,
            grant: Grant {
                offset: 7,
                len: 8,
                mac: [9; MAC_LEN],
            },
        };
        let b = r.encode();
        assert_eq!(b[0], 1);
        assert_eq!(&b[4..8], &[4, 0, 0, 0]);
        assert_eq!(b[8], 1);
        assert_eq!(b[16], 2);
        assert_eq!(b[24], 3);
        assert_eq!(b[32], 5);
        assert_eq!(b[40], 6);
        assert_eq!((b[48], b[56], &b[64..]), (7, 8, &[9u8; MAC_LEN][..]));
        assert_eq!(Request::decode(&b, MAX_SLICE_LEN).unwrap(), r);
        // A version-1 header: the same fields, no grant.
        let (full, n) = r.encode_for(1);
        assert_eq!(n, REQUEST_LEN_V1);
        let v1 = Request::decode(&full[..n], MAX_SLICE_LEN).unwrap();
        assert_eq!(v1.grant, Grant::default());
        assert_eq!((v1.term, v1.res_id, v1.offset), (5, 6, 3));
        assert_eq!(r.encode_for(2).1, REQUEST_LEN);
        assert_eq!(
            Request::decode(&b[..50], MAX_SLICE_LEN),
            Err(WireError::HeaderLength(50))
        );
        let mut bad = b;
        bad[0] = 9;
        assert_eq!(
            Request::decode(&bad, MAX_SLICE_LEN),
            Err(WireError::UnknownKind(9))
        );
        let mut bad = b;
        bad[2] = 1;
        assert_eq!(
            Request::decode(&bad, MAX_SLICE_LEN),
            Err(WireError::NonZeroReserved)
        );
        let mut big = b;
        big[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        let e = Request::decode(&big, u32::MAX).unwrap_err();
        assert_eq!(
            e,
            WireError::TooLarge {
                len: u32::MAX,
                max: MAX_SLICE_LEN
            }
        );
        assert_eq!(e.status(), Status::TooLarge);
        assert_eq!(
            Request::decode(&b, 3).unwrap_err().status(),
            Status::TooLarge
        );
    }

    #[test]
    fn reply_layout() {
        let r = Reply {
            req_id: 7,
            status: Status::StaleTerm,
            len: 0,
            term: 9,
        };
        let b = r.encode();
        assert_eq!(&b[8..10], &[2, 0]);
        assert_eq!(b[16], 9);
        assert_eq!(Reply::decode(&b).unwrap(), r);
        let mut bad = b;
        bad[8] = 99;
        assert_eq!(Reply::decode(&bad), Err(WireError::UnknownStatus(99)));
    }

    proptest! {
        #[test]
        fn random_headers_never_panic(b in proptest::array::uniform32(any::<u8>()),
                                      c in proptest::array::uniform16(any::<u8>()),
                                      g in proptest::array::uniform32(any::<u8>())) {
            let mut req = [0u8; REQUEST_LEN];
            req[..32].copy_from_slice(&b);
            req[32..48].copy_from_slice(&c);
            req[48..].copy_from_slice(&g);
            if let Ok(r) = Request::decode(&req, MAX_SLICE_LEN) {
                prop_assert!(r.len <= MAX_SLICE_LEN);
                prop_assert_eq!(r.encode(), req);
            }
            let _ = Reply::decode(&b[..REPLY_LEN].try_into().unwrap());
            let _ = Hello::decode_fixed(&c);
            let _ = HelloReply::decode(&c);
        }
    }
}
