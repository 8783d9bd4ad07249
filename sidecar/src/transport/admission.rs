//! What a data-plane server asks before it touches segment memory (design §3 and §4): is the
//! generation current, does the leader's grant cover the slice (finding 7; [`GrantCheck`]), is
//! the term not stale, is the reservation not fenced. The sidecar
//! implements [`Admission`] with its own state; [`BasicAdmission`] is a self-contained version
//! for tests and tools.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use regolith_proto::dataplane::{Kind, Request, Status};
use regolith_proto::grant::{NodeKey, Scope};

/// The grant key of this node's current segment generation, from its mount: with one, a slice
/// is served only when it lies inside an extent the leader granted for its kind and version.
/// Without one (a metad that signs nothing), every slice passes.
#[derive(Debug, Default)]
pub struct GrantCheck(RwLock<Option<(u64, NodeKey)>>);

impl GrantCheck {
    /// The key of node `node`'s generation (set before the generation itself, so that no
    /// slice of the new generation is checked with the old key).
    pub fn set(&self, node: u64, key: Option<NodeKey>) {
        *self.0.write() = key.map(|k| (node, k));
    }

    pub fn enforced(&self) -> bool {
        self.0.read().is_some()
    }

    /// The node and key set last (what a sidecar upgrade hands over).
    pub fn get(&self) -> Option<(u64, NodeKey)> {
        self.0.read().clone()
    }

    /// FORBIDDEN unless `req`'s grant verifies for `kind` on this node and covers the slice.
    pub fn check(&self, kind: Kind, req: &Request) -> Result<(), Status> {
        let g = self.0.read();
        let Some((node, key)) = g.as_ref() else {
            return Ok(());
        };
        let scope = Scope {
            kind,
            node: *node,
            generation: req.generation,
            term: req.term,
            id: req.res_id,
        };
        if req.grant.covers(req.offset, req.len.into()) && key.verify(&scope, &req.grant) {
            Ok(())
        } else {
            Err(Status::Forbidden)
        }
    }
}

/// An admitted write slice. Dropping it marks the slice done (finished or abandoned), which is
/// how the sidecar knows when a quarantined reservation has no slice left in flight.
pub trait WriteSlice: Send {
    /// Called once the slice's bytes are in memory, before it is acknowledged: a slice whose
    /// term was superseded or whose reservation was fenced meanwhile must not be acknowledged.
    fn complete(&mut self) -> Result<(), Status>;
}

/// See [`WriteSlice`].
pub type WriteGuard = Box<dyn WriteSlice>;

/// Admission control for data-plane requests; called on the server's I/O tasks, so it must be
/// quick and must not block.
pub trait Admission: Send + Sync + 'static {
    /// Refuses old generations (BAD_GENERATION), slices no write grant covers (FORBIDDEN,
    /// checked before the term), terms below the highest seen (STALE_TERM; a higher term
    /// raises the highest seen), and fenced reservations (FENCED); else tracks the slice as in
    /// flight until the returned guard is dropped.
    fn admit_write(&self, req: &Request) -> Result<WriteGuard, Status>;

    /// Refuses old generations and slices no read grant covers. A read's `(term, res_id)` is
    /// the version of the object being read, which may be from any earlier term, so it is not
    /// compared with the highest term.
    fn admit_read(&self, req: &Request) -> Result<(), Status>;

    /// Serves a read of a disk replica (`req.generation` a disk generation,
    /// [`regolith_proto::disk_tier`]): checks its grant and fills `dst` from the disk tier.
    /// BAD_GENERATION where the node holds no such record (or has no disks). Blocking.
    fn read_disk(&self, req: &Request, dst: &mut [u8]) -> Result<(), Status> {
        let _ = (req, dst);
        Err(Status::BadGeneration)
    }

    /// The highest term seen, echoed in every reply.
    fn highest_term(&self) -> u64;

    /// The segment generation this node serves now (told to peers that upgrade to RDMA,
    /// whose reads the node does not see).
    fn generation(&self) -> u64;
}

#[derive(Debug, Default)]
struct Inner {
    grants: GrantCheck,
    generation: AtomicU64,
    highest_term: AtomicU64,
    fenced: Mutex<HashSet<(u64, u64)>>,
    in_flight: Mutex<HashMap<(u64, u64), usize>>,
}

impl Inner {
    fn verdict(&self, term: u64, res_id: u64) -> Result<(), Status> {
        if term < self.highest_term.load(Ordering::Acquire) {
            return Err(Status::StaleTerm);
        }
        if self.fenced.lock().contains(&(term, res_id)) {
            return Err(Status::Fenced);
        }
        Ok(())
    }
}

/// A simple in-memory [`Admission`]: one current generation, a highest term, a fenced set.
#[derive(Clone, Debug, Default)]
pub struct BasicAdmission {
    inner: Arc<Inner>,
}

impl BasicAdmission {
    pub fn new(generation: u64) -> Self {
        let a = Self::default();
        a.set_generation(generation);
        a
    }

    pub fn set_generation(&self, generation: u64) {
        self.inner.generation.store(generation, Ordering::Release);
    }

    /// Checks grants made with `key` for node `node` from now on.
    pub fn set_grant_key(&self, node: u64, key: NodeKey) {
        self.inner.grants.set(node, Some(key));
    }

    /// Raises the highest term seen (e.g. from a heartbeat reply).
    pub fn observe_term(&self, term: u64) {
        self.inner.highest_term.fetch_max(term, Ordering::AcqRel);
    }

    /// Accepts no more slices of reservation `(term, id)`.
    pub fn fence(&self, term: u64, id: u64) {
        self.inner.fenced.lock().insert((term, id));
    }

    /// Slices of reservation `(term, id)` admitted and not yet done.
    pub fn in_flight(&self, term: u64, id: u64) -> usize {
        self.inner
            .in_flight
            .lock()
            .get(&(term, id))
            .copied()
            .unwrap_or(0)
    }

    fn check_generation(&self, req: &Request) -> Result<(), Status> {
        if req.generation == self.inner.generation.load(Ordering::Acquire) {
            Ok(())
        } else {
            Err(Status::BadGeneration)
        }
    }
}

struct BasicGuard {
    inner: Arc<Inner>,
    key: (u64, u64),
}

impl WriteSlice for BasicGuard {
    fn complete(&mut self) -> Result<(), Status> {
        self.inner.verdict(self.key.0, self.key.1)
    }
}

impl Drop for BasicGuard {
    fn drop(&mut self) {
        let mut m = self.inner.in_flight.lock();
        if let Some(n) = m.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.key);
            }
        }
    }
}

impl Admission for BasicAdmission {
    fn generation(&self) -> u64 {
        self.inner.generation.load(Ordering::Acquire)
    }

    fn admit_write(&self, req: &Request) -> Result<WriteGuard, Status> {
        self.check_generation(req)?;
        self.inner.grants.check(Kind::Write, req)?;
        let before = self
            .inner
            .highest_term
            .fetch_max(req.term, Ordering::AcqRel);
        if req.term < before {
            return Err(Status::StaleTerm);
        }
        self.inner.verdict(req.term, req.res_id)?;
        let key = (req.term, req.res_id);
        *self.inner.in_flight.lock().entry(key).or_insert(0) += 1;
        Ok(Box::new(BasicGuard {
            inner: self.inner.clone(),
            key,
        }))
    }

    fn admit_read(&self, req: &Request) -> Result<(), Status> {
        self.check_generation(req)?;
        self.inner.grants.check(Kind::Read, req)
    }

    fn highest_term(&self) -> u64 {
        self.inner.highest_term.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use regolith_proto::grant::{Grant, MasterKey};

    fn req(generation: u64, term: u64, res_id: u64) -> Request {
        Request {
            kind: Kind::Write,
            req_id: 1,
            generation,
            offset: 0,
            len: 10,
            term,
            res_id,
            grant: Grant::default(),
        }
    }

    #[test]
    fn with_a_key_only_granted_slices_pass_and_a_forged_term_leaves_no_trace() {
        let key = MasterKey::from_secret(b"s").node_key(5, 3);
        let a = BasicAdmission::new(3);
        a.set_grant_key(5, key.clone());
        let scope = |kind, term, id| Scope {
            kind,
            node: 5,
            generation: 3,
            term,
            id,
        };
        let mut w = req(3, 2, 1);
        w.offset = 100;
        w.grant = key.grant(&scope(Kind::Write, 2, 1), 64, 1000);
        assert!(a.admit_write(&w).is_ok());
        // Outside the granted extent; another version; a read grant used to write.
        let mut out = w;
        out.offset = 1060;
        assert_eq!(a.admit_write(&out).err(), Some(Status::Forbidden));
        let mut other = w;
        other.res_id = 2;
        assert_eq!(a.admit_write(&other).err(), Some(Status::Forbidden));
        let mut read_grant = w;
        read_grant.grant = key.grant(&scope(Kind::Read, 2, 1), 64, 1000);
        assert_eq!(a.admit_write(&read_grant).err(), Some(Status::Forbidden));
        // A forged term: refused, and the highest term is what it was.
        let mut forged = w;
        forged.term = u64::MAX;
        assert_eq!(a.admit_write(&forged).err(), Some(Status::Forbidden));
        assert_eq!(a.highest_term(), 2);
        // Reads need a read grant.
        let mut r = w;
        r.kind = Kind::Read;
        assert_eq!(a.admit_read(&r), Err(Status::Forbidden));
        r.grant = key.grant(&scope(Kind::Read, 2, 1), 64, 1000);
        assert_eq!(a.admit_read(&r), Ok(()));
        r.grant = Grant::default();
        assert_eq!(a.admit_read(&r), Err(Status::Forbidden));
    }

    #[test]
    fn generation_term_fence_and_in_flight() {
        let a = BasicAdmission::new(3);
        assert_eq!(
            a.admit_write(&req(2, 1, 1)).err(),
            Some(Status::BadGeneration)
        );
        let mut g = a.admit_write(&req(3, 5, 1)).unwrap();
        assert_eq!(a.highest_term(), 5);
        assert_eq!(a.in_flight(5, 1), 1);
        assert_eq!(a.admit_write(&req(3, 4, 9)).err(), Some(Status::StaleTerm));
        assert_eq!(g.complete(), Ok(()));
        // A newer term arrives while the slice's body is in transit: it is not acknowledged.
        a.observe_term(6);
        assert_eq!(g.complete(), Err(Status::StaleTerm));
        drop(g);
        assert_eq!(a.in_flight(5, 1), 0);
        a.fence(6, 2);
        assert_eq!(a.admit_write(&req(3, 6, 2)).err(), Some(Status::Fenced));
        let mut g = a.admit_write(&req(3, 6, 3)).unwrap();
        a.fence(6, 3);
        assert_eq!(g.complete(), Err(Status::Fenced));
        // Reads of old versions are fine; reads of old generations are not.
        let mut r = req(3, 1, 1);
        r.kind = Kind::Read;
        assert_eq!(a.admit_read(&r), Ok(()));
        r.generation = 1;
        assert_eq!(a.admit_read(&r), Err(Status::BadGeneration));
    }
}
