//! Data-plane grants (hardening finding 7): what lets a peer read or write a byte range of a
//! node's segment.
//!
//! The cluster token only says that a peer belongs to the cluster; every sidecar and every CLI
//! user holds it. A grant says that the leader placed an object version, or reserved a range
//! for one, on exactly this extent of exactly this segment generation:
//!
//! ```text
//! mac = blake3::keyed_hash(node_key, "regolith grant v1" | kind | node | generation
//!                                     | term | id | extent offset | extent len)[..16]
//! node_key = blake3::keyed_hash(master, "regolith node key v1" | node | generation)
//! master = blake3::derive_key("regolith data-plane grants v1", secret)
//! ```
//!
//! metad (every replica derives the same `master` from the secret the replicas share: the peer
//! credential, else the cluster token) signs each extent of each replica it hands out: write
//! grants with a reservation, read grants with a placement or a watch change. The holder learns
//! its `node_key` when it mounts (only for the generation it mounts: a key is never handed out
//! twice), and admits a slice only when the MAC matches and the slice lies inside the granted
//! extent, before it looks at the term. A forged term, an invented version or an offset outside
//! what the leader placed fails the MAC.

use crate::dataplane::Kind;

/// Bytes of a grant's MAC on the wire.
pub const MAC_LEN: usize = 16;
/// Bytes of a node key.
pub const KEY_LEN: usize = 32;

pub type Mac = [u8; MAC_LEN];

/// An extent the leader granted, with its MAC: a slice must lie inside `[offset, offset+len)`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Grant {
    pub offset: u64,
    pub len: u64,
    pub mac: Mac,
}

impl Grant {
    /// Whether the slice `[offset, offset+len)` lies inside the granted extent (no wrap).
    pub fn covers(&self, offset: u64, len: u64) -> bool {
        match (offset.checked_add(len), self.offset.checked_add(self.len)) {
            (Some(end), Some(grant_end)) => offset >= self.offset && end <= grant_end,
            _ => false,
        }
    }
}

/// The secret every metad replica derives grants from.
#[derive(Clone)]
pub struct MasterKey([u8; KEY_LEN]);

impl std::fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MasterKey(<redacted>)")
    }
}

impl MasterKey {
    pub fn from_secret(secret: &[u8]) -> Self {
        Self(blake3::derive_key("regolith data-plane grants v1", secret))
    }

    /// The key of one segment generation: what its holder verifies grants with.
    pub fn node_key(&self, node: u64, generation: u64) -> NodeKey {
        let mut input = [0u8; 20 + 16];
        input[..20].copy_from_slice(b"regolith node key v1");
        input[20..28].copy_from_slice(&node.to_le_bytes());
        input[28..].copy_from_slice(&generation.to_le_bytes());
        NodeKey(*blake3::keyed_hash(&self.0, &input).as_bytes())
    }
}

/// The grant key of one segment generation.
#[derive(Clone, PartialEq, Eq)]
pub struct NodeKey([u8; KEY_LEN]);

impl std::fmt::Debug for NodeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NodeKey(<redacted>)")
    }
}

/// What a grant names besides its extent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scope {
    pub kind: Kind,
    pub node: u64,
    pub generation: u64,
    pub term: u64,
    pub id: u64,
}

impl NodeKey {
    /// A key as metad sends it at mount; `None` unless exactly [`KEY_LEN`] bytes.
    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        b.try_into().ok().map(Self)
    }

    pub fn as_bytes(&self) -> &[u8; KEY_LEN] {
        &self.0
    }

    fn mac(&self, scope: &Scope, offset: u64, len: u64) -> Mac {
        let mut input = [0u8; 17 + 1 + 6 * 8];
        input[..17].copy_from_slice(b"regolith grant v1");
        input[17] = scope.kind as u8;
        let fields = [
            scope.node,
            scope.generation,
            scope.term,
            scope.id,
            offset,
            len,
        ];
        for (i, v) in fields.iter().enumerate() {
            input[18 + 8 * i..26 + 8 * i].copy_from_slice(&v.to_le_bytes());
        }
        let full = blake3::keyed_hash(&self.0, &input);
        let mut mac = [0u8; MAC_LEN];
        mac.copy_from_slice(&full.as_bytes()[..MAC_LEN]);
        mac
    }

    /// The grant of extent `[offset, offset+len)` for `scope`.
    pub fn grant(&self, scope: &Scope, offset: u64, len: u64) -> Grant {
        Grant {
            offset,
            len,
            mac: self.mac(scope, offset, len),
        }
    }

    /// Whether `grant` was made for `scope` by the holder of this key (constant time).
    pub fn verify(&self, scope: &Scope, grant: &Grant) -> bool {
        let expected = self.mac(scope, grant.offset, grant.len);
        expected
            .iter()
            .zip(grant.mac.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(kind: Kind) -> Scope {
        Scope {
            kind,
            node: 3,
            generation: 7,
            term: 2,
            id: 41,
        }
    }

    #[test]
    fn a_grant_verifies_only_for_what_it_names() {
        let master = MasterKey::from_secret(b"peer-secret");
        let key = master.node_key(3, 7);
        let g = key.grant(&scope(Kind::Write), 4096, 65536);
        assert!(key.verify(&scope(Kind::Write), &g));
        // Another kind, term, id, node or generation: refused.
        assert!(!key.verify(&scope(Kind::Read), &g));
        for change in [
            |s: &mut Scope| s.term = u64::MAX,
            |s: &mut Scope| s.id += 1,
            |s: &mut Scope| s.node += 1,
            |s: &mut Scope| s.generation += 1,
        ] {
            let mut s = scope(Kind::Write);
            change(&mut s);
            assert!(!key.verify(&s, &g), "{s:?}");
        }
        // A widened extent, or a flipped MAC bit: refused.
        let mut wide = g;
        wide.len += 1;
        assert!(!key.verify(&scope(Kind::Write), &wide));
        let mut flipped = g;
        flipped.mac[0] ^= 1;
        assert!(!key.verify(&scope(Kind::Write), &flipped));
        // Another generation's key, another secret: refused.
        assert!(!master.node_key(3, 8).verify(&scope(Kind::Write), &g));
        let other = MasterKey::from_secret(b"other-secret").node_key(3, 7);
        assert!(!other.verify(&scope(Kind::Write), &g));
        // Every replica derives the same keys from the same secret.
        assert_eq!(MasterKey::from_secret(b"peer-secret").node_key(3, 7), key);
    }

    #[test]
    fn a_grant_covers_only_slices_inside_its_extent() {
        let g = Grant {
            offset: 1000,
            len: 100,
            mac: [0; MAC_LEN],
        };
        assert!(g.covers(1000, 100));
        assert!(g.covers(1050, 50));
        assert!(g.covers(1100, 0));
        assert!(!g.covers(999, 10));
        assert!(!g.covers(1050, 51));
        assert!(!g.covers(u64::MAX, 2));
        let huge = Grant {
            offset: u64::MAX - 1,
            len: 10,
            mac: [0; MAC_LEN],
        };
        assert!(!huge.covers(u64::MAX - 1, 1));
    }

    #[test]
    fn key_bytes_round_trip_and_keys_never_print() {
        let key = MasterKey::from_secret(b"s").node_key(1, 1);
        assert_eq!(NodeKey::from_bytes(key.as_bytes()), Some(key.clone()));
        assert_eq!(NodeKey::from_bytes(&[0; 31]), None);
        assert_eq!(format!("{key:?}"), "NodeKey(<redacted>)");
        assert!(!format!("{:?}", MasterKey::from_secret(b"s")).contains('['));
    }

    /// `covers` is the interval inclusion of exact (unbounded) arithmetic, with a slice or a
    /// grant whose end passes 2^64 covering nothing: a peer's offsets near `u64::MAX` must not
    /// wrap into a granted extent.
    fn exact_covers(g: &Grant, offset: u64, len: u64) -> bool {
        let (o, l, go, gl) = (offset as u128, len as u128, g.offset as u128, g.len as u128);
        let max = u64::MAX as u128;
        o + l <= max && go + gl <= max && o >= go && o + l <= go + gl
    }

    /// Offsets and lengths drawn near the edges where arithmetic goes wrong, and anywhere.
    fn edgy() -> impl proptest::strategy::Strategy<Value = u64> {
        use proptest::prelude::*;
        prop_oneof![
            0u64..1024,
            (u64::MAX - 1024)..=u64::MAX,
            ((1u64 << 63) - 512)..((1u64 << 63) + 512),
            any::<u64>(),
        ]
    }

    proptest::proptest! {
        #[test]
        fn covers_is_exact_interval_inclusion(go in edgy(), gl in edgy(), o in edgy(), l in edgy()) {
            let g = Grant { offset: go, len: gl, mac: [0; MAC_LEN] };
            proptest::prop_assert_eq!(g.covers(o, l), exact_covers(&g, o, l));
        }

        #[test]
        fn a_covered_slice_stays_covered_when_shrunk(go in edgy(), gl in edgy(), o in edgy(), l in edgy(), cut in 0u64..4096) {
            let g = Grant { offset: go, len: gl, mac: [0; MAC_LEN] };
            if g.covers(o, l) {
                let cut = cut.min(l);
                proptest::prop_assert!(g.covers(o + cut, l - cut));
                proptest::prop_assert!(g.covers(o, l - cut));
            }
        }
    }
}
