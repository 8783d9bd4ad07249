//! The leader's data-plane grants (hardening finding 7, [`regolith_proto::grant`]): every
//! extent of every replica metad hands out is signed for what it may be used for (a write into
//! a reservation, a read of a committed version), and each mount gets its generation's key.

use regolith_proto::dataplane::Kind;
use regolith_proto::grant::{MasterKey, Scope};

use crate::types::{Extent, SegmentId, Version};

/// Signs grants with the secret the replicas share; signs nothing without one.
#[derive(Clone, Debug, Default)]
pub struct Grants(Option<MasterKey>);

impl Grants {
    /// From the peer credential, else the cluster token (which every token holder has, so
    /// grants then only keep honest peers to what the leader placed), else nothing.
    pub fn new(peer_token: Option<&str>, token: Option<&str>) -> Self {
        let secret = peer_token.or(token);
        Self(secret.map(|s| MasterKey::from_secret(s.as_bytes())))
    }

    pub fn signs(&self) -> bool {
        self.0.is_some()
    }

    /// The key a mount of `segment` verifies grants with (empty when nothing is signed).
    pub fn node_key(&self, segment: SegmentId) -> Vec<u8> {
        self.0
            .as_ref()
            .map(|m| {
                m.node_key(segment.node, segment.generation)
                    .as_bytes()
                    .to_vec()
            })
            .unwrap_or_default()
    }

    /// One MAC per extent of `segment` for `kind` access to `version` (none when nothing is
    /// signed).
    pub fn sign(
        &self,
        kind: Kind,
        segment: SegmentId,
        version: Version,
        extents: &[Extent],
    ) -> Vec<Vec<u8>> {
        self.sign_with(kind, segment, segment.generation, version, extents)
    }

    /// [`Self::sign`] with the key of mount `key_generation` of the node (a disk replica's
    /// grants are verified with its node's current segment's key).
    pub fn sign_with(
        &self,
        kind: Kind,
        segment: SegmentId,
        key_generation: u64,
        version: Version,
        extents: &[Extent],
    ) -> Vec<Vec<u8>> {
        let Some(master) = &self.0 else {
            return Vec::new();
        };
        let key = master.node_key(segment.node, key_generation);
        let scope = Scope {
            kind,
            node: segment.node,
            generation: segment.generation,
            term: version.term,
            id: version.id,
        };
        extents
            .iter()
            .map(|e| key.grant(&scope, e.offset, e.len).mac.to_vec())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use regolith_proto::grant::{Grant, NodeKey};

    #[test]
    fn the_holder_verifies_what_the_leader_signed_with_the_key_of_its_mount() {
        let seg = SegmentId {
            node: 4,
            generation: 9,
        };
        let v = Version { term: 3, id: 17 };
        let extents = [Extent::new(0, 65536), Extent::new(1 << 20, 4096)];
        let grants = Grants::new(Some("peer-secret"), Some("cluster-token"));
        let key = NodeKey::from_bytes(&grants.node_key(seg)).unwrap();
        let macs = grants.sign(Kind::Read, seg, v, &extents);
        assert_eq!(macs.len(), 2);
        let scope = Scope {
            kind: Kind::Read,
            node: 4,
            generation: 9,
            term: 3,
            id: 17,
        };
        for (e, mac) in extents.iter().zip(&macs) {
            let g = Grant {
                offset: e.offset,
                len: e.len,
                mac: mac.as_slice().try_into().unwrap(),
            };
            assert!(key.verify(&scope, &g));
            assert!(!key.verify(
                &Scope {
                    kind: Kind::Write,
                    ..scope
                },
                &g
            ));
        }
        // Another replica with the same peer credential signs the same; the cluster token alone
        // is another secret.
        assert_eq!(
            Grants::new(Some("peer-secret"), None).sign(Kind::Read, seg, v, &extents),
            macs
        );
        assert_ne!(
            Grants::new(None, Some("cluster-token")).sign(Kind::Read, seg, v, &extents),
            macs
        );
        // No secret: nothing signed, no key.
        let none = Grants::new(None, None);
        assert!(!none.signs());
        assert!(none.node_key(seg).is_empty());
        assert!(none.sign(Kind::Read, seg, v, &extents).is_empty());
    }
}
