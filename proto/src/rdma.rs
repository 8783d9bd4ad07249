//! The RDMA upgrade of a data-plane connection (`RDMA_CONNECT`, [`crate::dataplane`]): what
//! each end tells the other to connect two reliable-connection (RC) queue pairs and to address
//! the server's memory.
//!
//! Both messages are little-endian and self-delimiting; a decoder refuses anything it cannot
//! use (a wrong magic or version, an out-of-range field, trailing bytes) with a [`RdmaWireError`]
//! naming the field, so a hostile peer gets a clear refusal and never a panic.
//!
//! `Offer`, client → server:
//!
//! ```text
//! offset size field
//!      0    4 magic        "RGRD"
//!      4    2 version      u16, 1
//!      6    2 reserved     0
//!      8    * port         the client's port (below)
//!      +    4 qpn          u32, the client's queue pair number (24 bits, not 0)
//!      +    4 psn          u32, the client's first packet sequence number (24 bits)
//!      +    4 stripe       u32, the connection's index among the client's connections to
//!                          this peer: the server picks its port by the same diagonal rule as
//!                          the NIC pairs (`transport/plan.rs`)
//!      +    4 max_slice    u32, the largest slice the client will move (its bounce buffer)
//! ```
//!
//! `Accept`, server → client:
//!
//! ```text
//!      0    4 magic        "RGRD"
//!      4    2 version      u16, 1
//!      6    2 reserved     0
//!      8    * port         the server's port
//!      +    4 qpn, 4 psn   the server's queue pair
//!      +    8 generation   the segment generation the registration below maps
//!      +    8 seg_addr     virtual address of the segment's first byte in the registration
//!      +    8 seg_len      the registration's length (the segment's)
//!      +    4 seg_rkey     rkey for RDMA READ of the segment (never writable remotely)
//!      +    8 win_addr     the connection's staging window, for RDMA WRITE
//!      +    4 win_len      its length (at most 64 MiB, at least one checksum chunk)
//!      +    4 win_rkey
//! ```
//!
//! A port:
//!
//! ```text
//!      0    1 name_len     1..=64
//!      1    *  name        the device's name (ASCII letters, digits, '_', '-', '.')
//!      +    1 port         port number, 1..=254
//!      +    1 link_layer   1 InfiniBand, 2 Ethernet (RoCE)
//!      +    1 mtu          the active path MTU as verbs numbers it: 1 (256) ..= 5 (4096)
//!      +    1 gid_index    the GID table entry the port sends from
//!      +    2 lid          u16 (InfiniBand; 0 on Ethernet)
//!      +   16 gid          the port's GID
//! ```

use crate::dataplane::MAX_SLICE_LEN;

/// First four bytes of both messages.
pub const MAGIC: [u8; 4] = *b"RGRD";
/// The upgrade's version.
pub const VERSION: u16 = 1;
/// Longest message either side sends or reads (a port name is at most 64 bytes).
pub const MAX_MSG_LEN: u32 = 256;
/// Longest device name.
pub const MAX_NAME_LEN: usize = 64;
/// Queue pair numbers and packet sequence numbers are 24-bit.
pub const MAX_QPN: u32 = 0x00FF_FFFF;
/// Smallest staging window: one checksum chunk.
pub const MIN_WINDOW: u32 = 64 * 1024;

/// Why an upgrade message was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RdmaWireError {
    #[error("bad magic {0:02x?} (not a Regolith RDMA upgrade message)")]
    BadMagic([u8; 4]),
    #[error("RDMA upgrade version {0} (this node speaks {VERSION})")]
    Version(u16),
    #[error("RDMA upgrade message truncated at {field}")]
    Truncated { field: &'static str },
    #[error("RDMA upgrade message has {0} trailing bytes")]
    Trailing(usize),
    #[error("RDMA upgrade message of {0} bytes exceeds {MAX_MSG_LEN}")]
    TooLong(usize),
    #[error("RDMA upgrade field {field} is invalid: {why}")]
    Invalid {
        field: &'static str,
        why: &'static str,
    },
}

type Result<T> = std::result::Result<T, RdmaWireError>;

/// The link layer of a port: two ports talk only over the same one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum LinkLayer {
    InfiniBand = 1,
    Ethernet = 2,
}

/// One RDMA port as the other end needs to know it to address its queue pair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortAddr {
    pub device: String,
    pub port: u8,
    pub link_layer: LinkLayer,
    /// Path MTU, verbs numbering (1 = 256 bytes … 5 = 4096 bytes).
    pub mtu: u8,
    pub gid_index: u8,
    pub lid: u16,
    pub gid: [u8; 16],
}

/// The client's half of an upgrade.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Offer {
    pub port: PortAddr,
    pub qpn: u32,
    pub psn: u32,
    pub stripe: u32,
    pub max_slice: u32,
}

/// The server's half: its queue pair, its segment for READ, the staging window for WRITE.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Accept {
    pub port: PortAddr,
    pub qpn: u32,
    pub psn: u32,
    pub generation: u64,
    pub seg_addr: u64,
    pub seg_len: u64,
    pub seg_rkey: u32,
    pub win_addr: u64,
    pub win_len: u32,
    pub win_rkey: u32,
}

/// Whether a device name is one verbs could have given (and safe to log).
pub fn valid_device_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

impl PortAddr {
    fn validate(&self) -> Result<()> {
        let bad = |field, why| Err(RdmaWireError::Invalid { field, why });
        if !valid_device_name(&self.device) {
            return bad("device", "not 1 to 64 of [A-Za-z0-9_.-]");
        }
        if self.port == 0 || self.port == 255 {
            return bad("port", "not in 1..=254");
        }
        if !(1..=5).contains(&self.mtu) {
            return bad("mtu", "not a verbs MTU (1..=5)");
        }
        if self.link_layer == LinkLayer::InfiniBand && self.lid == 0 {
            return bad("lid", "0 on an InfiniBand port");
        }
        if self.link_layer == LinkLayer::Ethernet && self.gid == [0; 16] {
            return bad("gid", "all zero on an Ethernet (RoCE) port");
        }
        Ok(())
    }

    fn encode(&self, out: &mut Vec<u8>) {
        out.push(self.device.len() as u8);
        out.extend_from_slice(self.device.as_bytes());
        out.extend_from_slice(&[self.port, self.link_layer as u8, self.mtu, self.gid_index]);
        out.extend_from_slice(&self.lid.to_le_bytes());
        out.extend_from_slice(&self.gid);
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self> {
        let name_len = r.u8("port.name_len")? as usize;
        let name = r.take(name_len, "port.name")?;
        let device = std::str::from_utf8(name)
            .map_err(|_| RdmaWireError::Invalid {
                field: "device",
                why: "not UTF-8",
            })?
            .to_owned();
        let port = r.u8("port.port")?;
        let link_layer = match r.u8("port.link_layer")? {
            1 => LinkLayer::InfiniBand,
            2 => LinkLayer::Ethernet,
            _ => {
                return Err(RdmaWireError::Invalid {
                    field: "link_layer",
                    why: "not 1 (InfiniBand) or 2 (Ethernet)",
                })
            }
        };
        let mtu = r.u8("port.mtu")?;
        let gid_index = r.u8("port.gid_index")?;
        let lid = r.u16("port.lid")?;
        let mut gid = [0u8; 16];
        gid.copy_from_slice(r.take(16, "port.gid")?);
        let p = PortAddr {
            device,
            port,
            link_layer,
            mtu,
            gid_index,
            lid,
            gid,
        };
        p.validate()?;
        Ok(p)
    }
}

fn check_qp(qpn: u32, psn: u32) -> Result<()> {
    if qpn == 0 || qpn > MAX_QPN {
        return Err(RdmaWireError::Invalid {
            field: "qpn",
            why: "not a 24-bit queue pair number above 0",
        });
    }
    if psn > MAX_QPN {
        return Err(RdmaWireError::Invalid {
            field: "psn",
            why: "wider than 24 bits",
        });
    }
    Ok(())
}

fn header(out: &mut Vec<u8>) {
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&[0, 0]);
}

impl Offer {
    pub fn validate(&self) -> Result<()> {
        self.port.validate()?;
        check_qp(self.qpn, self.psn)?;
        if self.max_slice < MIN_WINDOW || self.max_slice > MAX_SLICE_LEN {
            return Err(RdmaWireError::Invalid {
                field: "max_slice",
                why: "not between 64 KiB and 64 MiB",
            });
        }
        Ok(())
    }

    /// The wire form; `Err` when the offer itself is invalid (it would be refused).
    pub fn encode(&self) -> Result<Vec<u8>> {
        self.validate()?;
        Ok(self.encode_unchecked())
    }

    /// The wire form of whatever the fields hold (the tests' hostile peer sends this).
    fn encode_unchecked(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        header(&mut out);
        self.port.encode(&mut out);
        for v in [self.qpn, self.psn, self.stripe, self.max_slice] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out
    }

    pub fn decode(b: &[u8]) -> Result<Self> {
        let mut r = Reader::new(b)?;
        let port = PortAddr::decode(&mut r)?;
        let o = Offer {
            port,
            qpn: r.u32("qpn")?,
            psn: r.u32("psn")?,
            stripe: r.u32("stripe")?,
            max_slice: r.u32("max_slice")?,
        };
        r.finish()?;
        o.validate()?;
        Ok(o)
    }
}

impl Accept {
    pub fn validate(&self) -> Result<()> {
        let bad = |field, why| Err(RdmaWireError::Invalid { field, why });
        self.port.validate()?;
        check_qp(self.qpn, self.psn)?;
        if self.seg_len == 0 || self.seg_addr.checked_add(self.seg_len).is_none() {
            return bad("seg_len", "empty, or the segment wraps the address space");
        }
        if self.win_len < MIN_WINDOW || self.win_len > MAX_SLICE_LEN {
            return bad("win_len", "not between 64 KiB and 64 MiB");
        }
        if self.win_addr.checked_add(u64::from(self.win_len)).is_none() {
            return bad("win_addr", "the window wraps the address space");
        }
        Ok(())
    }

    pub fn encode(&self) -> Result<Vec<u8>> {
        self.validate()?;
        Ok(self.encode_unchecked())
    }

    /// The wire form of whatever the fields hold (the tests' hostile peer sends this).
    fn encode_unchecked(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(96);
        header(&mut out);
        self.port.encode(&mut out);
        out.extend_from_slice(&self.qpn.to_le_bytes());
        out.extend_from_slice(&self.psn.to_le_bytes());
        for v in [self.generation, self.seg_addr, self.seg_len] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.seg_rkey.to_le_bytes());
        out.extend_from_slice(&self.win_addr.to_le_bytes());
        out.extend_from_slice(&self.win_len.to_le_bytes());
        out.extend_from_slice(&self.win_rkey.to_le_bytes());
        out
    }

    pub fn decode(b: &[u8]) -> Result<Self> {
        let mut r = Reader::new(b)?;
        let port = PortAddr::decode(&mut r)?;
        let a = Accept {
            port,
            qpn: r.u32("qpn")?,
            psn: r.u32("psn")?,
            generation: r.u64("generation")?,
            seg_addr: r.u64("seg_addr")?,
            seg_len: r.u64("seg_len")?,
            seg_rkey: r.u32("seg_rkey")?,
            win_addr: r.u64("win_addr")?,
            win_len: r.u32("win_len")?,
            win_rkey: r.u32("win_rkey")?,
        };
        r.finish()?;
        a.validate()?;
        Ok(a)
    }

    /// Whether `[offset, offset + len)` of the segment lies inside the registration.
    pub fn covers(&self, offset: u64, len: u64) -> bool {
        offset
            .checked_add(len)
            .is_some_and(|end| end <= self.seg_len)
    }
}

/// A bounds-checked cursor: every read names its field, so a truncated message says where.
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    /// Checks the length cap and the fixed header.
    fn new(b: &'a [u8]) -> Result<Self> {
        if b.len() > MAX_MSG_LEN as usize {
            return Err(RdmaWireError::TooLong(b.len()));
        }
        let mut r = Reader { b, at: 0 };
        let m = r.take(4, "magic")?;
        if m != MAGIC {
            return Err(RdmaWireError::BadMagic([m[0], m[1], m[2], m[3]]));
        }
        let v = r.u16("version")?;
        if v != VERSION {
            return Err(RdmaWireError::Version(v));
        }
        if r.u16("reserved")? != 0 {
            return Err(RdmaWireError::Invalid {
                field: "reserved",
                why: "not zero",
            });
        }
        Ok(r)
    }

    fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8]> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or(RdmaWireError::Truncated { field })?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn u8(&mut self, field: &'static str) -> Result<u8> {
        Ok(self.take(1, field)?[0])
    }

    fn u16(&mut self, field: &'static str) -> Result<u16> {
        let s = self.take(2, field)?;
        Ok(u16::from_le_bytes([s[0], s[1]]))
    }

    fn u32(&mut self, field: &'static str) -> Result<u32> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.take(4, field)?);
        Ok(u32::from_le_bytes(a))
    }

    fn u64(&mut self, field: &'static str) -> Result<u64> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8, field)?);
        Ok(u64::from_le_bytes(a))
    }

    fn finish(self) -> Result<()> {
        match self.b.len() - self.at {
            0 => Ok(()),
            n => Err(RdmaWireError::Trailing(n)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn roce_port() -> PortAddr {
        PortAddr {
            device: "mlx5_0".into(),
            port: 1,
            link_layer: LinkLayer::Ethernet,
            mtu: 5,
            gid_index: 3,
            lid: 0,
            gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 7],
        }
    }

    fn offer() -> Offer {
        Offer {
            port: roce_port(),
            qpn: 0x1234,
            psn: 0xabcdef,
            stripe: 3,
            max_slice: 4 << 20,
        }
    }

    fn accept() -> Accept {
        Accept {
            port: PortAddr {
                device: "mlx5_1".into(),
                port: 1,
                link_layer: LinkLayer::InfiniBand,
                mtu: 4,
                gid_index: 0,
                lid: 17,
                gid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8],
            },
            qpn: 77,
            psn: 0,
            generation: 9,
            seg_addr: 0x7f00_0000_0000,
            seg_len: 1 << 30,
            seg_rkey: 0xdead,
            win_addr: 0x7e00_0000_0000,
            win_len: 4 << 20,
            win_rkey: 0xbeef,
        }
    }

    #[test]
    fn offer_and_accept_round_trip_with_the_documented_layout() {
        let o = offer();
        let b = o.encode().unwrap();
        assert_eq!(&b[..4], b"RGRD");
        assert_eq!(u16::from_le_bytes([b[4], b[5]]), VERSION);
        // header 8 + port (1 + 6 + 6 + 16) + 16
        assert_eq!(b.len(), 8 + 1 + 6 + 6 + 16 + 16);
        assert_eq!(Offer::decode(&b).unwrap(), o);

        let a = accept();
        let b = a.encode().unwrap();
        assert_eq!(b.len(), 8 + 1 + 6 + 6 + 16 + 8 + 24 + 4 + 8 + 4 + 4);
        assert_eq!(Accept::decode(&b).unwrap(), a);
        assert!(b.len() <= MAX_MSG_LEN as usize);
    }

    #[test]
    fn hostile_offers_are_refused_by_field() {
        let good = offer().encode().unwrap();
        let field = |b: &[u8]| match Offer::decode(b) {
            Err(RdmaWireError::Invalid { field, .. }) => field,
            other => panic!("expected a field refusal, got {other:?}"),
        };

        let mut b = good.clone();
        b[0] = b'X';
        assert!(matches!(Offer::decode(&b), Err(RdmaWireError::BadMagic(_))));
        let mut b = good.clone();
        b[4] = 2;
        assert_eq!(Offer::decode(&b), Err(RdmaWireError::Version(2)));
        let mut b = good.clone();
        b[6] = 1;
        assert_eq!(field(&b), "reserved");

        // Every truncation names a field; nothing panics.
        for n in 0..good.len() {
            let e = Offer::decode(&good[..n]).unwrap_err();
            assert!(
                matches!(
                    e,
                    RdmaWireError::Truncated { .. } | RdmaWireError::Invalid { .. }
                ),
                "cut at {n}: {e:?}"
            );
        }
        let mut b = good.clone();
        b.push(0);
        assert_eq!(Offer::decode(&b), Err(RdmaWireError::Trailing(1)));
        assert_eq!(
            Offer::decode(&vec![0u8; 300]),
            Err(RdmaWireError::TooLong(300))
        );

        // A name longer than the message, a name with a path or control bytes.
        let mut b = good.clone();
        b[8] = 200;
        assert!(matches!(
            Offer::decode(&b),
            Err(RdmaWireError::Truncated { field: "port.name" })
        ));
        let mut o = offer();
        o.port.device = "../mlx".into();
        assert_eq!(field(&o.encode_unchecked()), "device");
        o.port.device = "mlx\n0".into();
        assert_eq!(field(&o.encode_unchecked()), "device");

        let mut o = offer();
        o.port.mtu = 6;
        assert_eq!(field(&o.encode_unchecked()), "mtu");
        let mut o = offer();
        o.port.port = 0;
        assert_eq!(field(&o.encode_unchecked()), "port");
        let mut o = offer();
        o.port.gid = [0; 16];
        assert_eq!(field(&o.encode_unchecked()), "gid");
        let mut o = offer();
        o.port.link_layer = LinkLayer::InfiniBand;
        assert_eq!(field(&o.encode_unchecked()), "lid");
        let mut o = offer();
        o.qpn = 0;
        assert_eq!(field(&o.encode_unchecked()), "qpn");
        o.qpn = 1 << 24;
        assert_eq!(field(&o.encode_unchecked()), "qpn");
        let mut o = offer();
        o.psn = 1 << 24;
        assert_eq!(field(&o.encode_unchecked()), "psn");
        let mut o = offer();
        o.max_slice = 1;
        assert_eq!(field(&o.encode_unchecked()), "max_slice");
        o.max_slice = MAX_SLICE_LEN + 1;
        assert_eq!(field(&o.encode_unchecked()), "max_slice");

        let mut b = good;
        let ll = 8 + 1 + 6 + 1;
        b[ll] = 9;
        assert_eq!(field(&b), "link_layer");
    }

    #[test]
    fn hostile_accepts_are_refused() {
        let field = |a: &Accept| match Accept::decode(&a.encode_unchecked()) {
            Err(RdmaWireError::Invalid { field, .. }) => field,
            other => panic!("expected a field refusal, got {other:?}"),
        };
        let mut a = accept();
        a.seg_len = 0;
        assert_eq!(field(&a), "seg_len");
        a.seg_len = u64::MAX;
        assert_eq!(field(&a), "seg_len");
        let mut a = accept();
        a.win_len = 100;
        assert_eq!(field(&a), "win_len");
        let mut a = accept();
        a.win_addr = u64::MAX - 10;
        assert_eq!(field(&a), "win_addr");
        assert!(accept().covers(0, 1 << 30));
        assert!(!accept().covers(1, 1 << 30));
        assert!(!accept().covers(u64::MAX, 2));
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic_and_what_decodes_re_encodes(b in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Ok(o) = Offer::decode(&b) {
                prop_assert_eq!(o.encode().unwrap(), b.clone());
            }
            if let Ok(a) = Accept::decode(&b) {
                prop_assert_eq!(a.encode().unwrap(), b);
            }
        }

        #[test]
        fn mutated_offers_never_panic(i in 0usize..64, v in any::<u8>()) {
            let mut b = offer().encode().unwrap();
            if i < b.len() { b[i] = v; }
            if let Ok(o) = Offer::decode(&b) {
                prop_assert_eq!(o.encode().unwrap(), b);
            }
        }
    }
}
