//! A metad double for the workflows' unit tests: objects and reservations in a map, extents
//! handed out in order on the segments it was told about, and a record of every commit and
//! abort. Failures can be scripted per call.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use futures::future::BoxFuture;
use parking_lot::Mutex;
use regolith_proto::common::{Extent, Version};
use regolith_proto::metad as mpb;

use super::metad::{
    Answer, MetadApi, MetadResult, Placement, Refusal, Removed, Replica, Reservation, ReserveItem,
    Reserved,
};
use super::Store;
use crate::metrics::Metrics;
use crate::segment::{HugePages, Segment, SegmentOptions};
use crate::tracker::Tracker;
use crate::transport::rdma::NodeTransport;
use crate::transport::tcp::{TcpConfig, TcpTransport};
use crate::transport::{DataClient, StripeConfig, TransportStats};

pub const LEADER: &str = "127.0.0.1:50051";
/// The node the store under test runs on.
pub const LOCAL: u64 = 1;
pub const GENERATION: u64 = 1;

/// A segment metad places on: a node, its data-plane addresses and the next free offset.
struct Node {
    id: u64,
    addrs: Vec<SocketAddr>,
    next: u64,
}

#[derive(Default)]
struct State {
    nodes: Vec<Node>,
    next_id: u64,
    reserved: HashMap<Version, (String, u64, Vec<Replica>)>,
    objects: HashMap<String, Placement>,
    commits: Vec<(String, Version, u64)>,
    aborts: Vec<(String, Version)>,
}

#[derive(Default)]
pub struct FakeMetad {
    state: Mutex<State>,
    /// The next commit call fails as a whole with this error.
    pub fail_commit: Mutex<Option<regolith_proto::Error>>,
}

impl FakeMetad {
    /// Places replicas on `node` (in the order nodes are added), with these data-plane addresses.
    pub fn add_node(&self, id: u64, addrs: Vec<SocketAddr>) {
        self.state.lock().nodes.push(Node { id, addrs, next: 0 });
    }

    pub fn commits(&self) -> Vec<(String, Version, u64)> {
        self.state.lock().commits.clone()
    }

    pub fn aborts(&self) -> Vec<(String, Version)> {
        self.state.lock().aborts.clone()
    }

    /// Lists `key` with this placement, as if metad had committed it.
    pub fn set_object(&self, key: &str, p: Placement) {
        self.state.lock().objects.insert(key.to_string(), p);
    }

    /// The committed placement of `key`.
    pub fn placements_of(&self, key: &str) -> Placement {
        self.state.lock().objects[key].clone()
    }

    fn reserve_one(st: &mut State, it: &ReserveItem) -> Answer<Reservation> {
        if st.objects.contains_key(&it.key) || st.reserved.values().any(|r| r.0 == it.key) {
            return Err(Refusal::new(mpb::Code::AlreadyExists, it.key.clone()));
        }
        let n = it.options.replicas.max(1) as usize;
        if st.nodes.len() < n {
            return Err(Refusal::new(mpb::Code::NotEnoughNodes, "too few nodes"));
        }
        st.next_id += 1;
        let version = Version {
            term: 1,
            id: st.next_id,
        };
        let replicas: Vec<Replica> = st.nodes[..n]
            .iter_mut()
            .map(|node| {
                // Two extents per replica when the object spans more than one checksum chunk
                // (metad cuts extents on chunk boundaries): the workflows must follow extents.
                let chunk = regolith_proto::checksum::CHUNK as u64;
                let first = (it.size / 2) / chunk * chunk;
                let mut extents = vec![Extent {
                    offset: node.next,
                    len: if first == 0 { it.size } else { first },
                }];
                if first > 0 {
                    extents.push(Extent {
                        offset: node.next + first + chunk,
                        len: it.size - first,
                    });
                }
                node.next += it.size + 2 * chunk;
                Replica {
                    node_id: node.id,
                    generation: GENERATION,
                    node_name: format!("node-{}", node.id),
                    data_addrs: node.addrs.clone(),
                    extents,
                    grants: Vec::new(),
                }
            })
            .collect();
        st.reserved
            .insert(version, (it.key.clone(), it.size, replicas.clone()));
        Ok(Reservation { version, replicas })
    }
}

impl MetadApi for FakeMetad {
    fn reserve(
        &self,
        items: Vec<ReserveItem>,
        _requester: u64,
    ) -> BoxFuture<'_, MetadResult<Reserved>> {
        let mut st = self.state.lock();
        let items = items
            .iter()
            .map(|it| Self::reserve_one(&mut st, it))
            .collect();
        Box::pin(async move {
            Ok(Reserved {
                leader: LEADER.into(),
                items,
            })
        })
    }

    fn commit<'a>(
        &'a self,
        leader: &'a str,
        items: Vec<(Version, u64)>,
    ) -> BoxFuture<'a, MetadResult<Vec<Answer<()>>>> {
        Box::pin(async move {
            if let Some(e) = self.fail_commit.lock().take() {
                return Err(e);
            }
            let mut st = self.state.lock();
            Ok(items
                .into_iter()
                .map(|(v, checksum)| {
                    let Some((key, size, replicas)) = st.reserved.remove(&v) else {
                        return Err(Refusal::new(mpb::Code::StaleReservation, "unknown"));
                    };
                    st.commits.push((leader.to_string(), v, checksum));
                    st.objects.insert(
                        key,
                        Placement {
                            version: v,
                            size,
                            checksum,
                            replicas,
                        },
                    );
                    Ok(())
                })
                .collect())
        })
    }

    fn abort<'a>(
        &'a self,
        leader: &'a str,
        versions: Vec<Version>,
    ) -> BoxFuture<'a, MetadResult<()>> {
        let mut st = self.state.lock();
        for v in versions {
            st.reserved.remove(&v);
            st.aborts.push((leader.to_string(), v));
        }
        Box::pin(async { Ok(()) })
    }

    fn placements(
        &self,
        keys: Vec<String>,
        _requester: u64,
    ) -> BoxFuture<'_, MetadResult<Vec<Answer<Placement>>>> {
        let st = self.state.lock();
        let out = keys
            .iter()
            .map(|k| {
                st.objects
                    .get(k)
                    .cloned()
                    .ok_or_else(|| Refusal::new(mpb::Code::NotFound, k.clone()))
            })
            .collect();
        Box::pin(async move { Ok(out) })
    }

    fn exists(&self, keys: Vec<String>) -> BoxFuture<'_, MetadResult<Vec<bool>>> {
        let st = self.state.lock();
        let out = keys.iter().map(|k| st.objects.contains_key(k)).collect();
        Box::pin(async move { Ok(out) })
    }

    fn remove(&self, keys: Vec<String>) -> BoxFuture<'_, MetadResult<Removed>> {
        let mut st = self.state.lock();
        let codes = keys
            .iter()
            .map(|k| match st.objects.remove(k) {
                Some(_) => mpb::Code::Ok,
                None => mpb::Code::NotFound,
            })
            .collect();
        Box::pin(async move {
            Ok(Removed {
                codes,
                failed_attempts: 0,
            })
        })
    }

    fn remove_all(&self) -> BoxFuture<'_, MetadResult<u64>> {
        let n = {
            let mut st = self.state.lock();
            let n = st.objects.len() as u64;
            st.objects.clear();
            n
        };
        Box::pin(async move { Ok(n) })
    }

    fn segments(&self) -> BoxFuture<'_, MetadResult<Vec<mpb::SegmentInfo>>> {
        Box::pin(async { Ok(vec![]) })
    }

    fn stats(&self) -> BoxFuture<'_, MetadResult<mpb::StatsResponse>> {
        Box::pin(async { Ok(mpb::StatsResponse::default()) })
    }

    fn list_keys(
        &self,
        _req: mpb::ListKeysRequest,
    ) -> BoxFuture<'_, MetadResult<mpb::ListKeysResponse>> {
        Box::pin(async { Ok(mpb::ListKeysResponse::default()) })
    }
}

pub fn segment(name: &str, size: u64) -> Arc<Segment> {
    let opts = SegmentOptions {
        huge_pages: HugePages::Never,
        prefault: false,
        allocate: true,
    };
    Arc::new(Segment::create(name, size, &opts).expect("memfd segment"))
}

/// A store on node [`LOCAL`] with a segment of `segment_size` bytes (0: consumer-only) and a
/// real TCP data plane.
pub fn store(metad: Arc<FakeMetad>, segment_size: u64) -> Store {
    let stats = TransportStats::new();
    let transport = NodeTransport::tcp_only(TcpTransport::new(
        TcpConfig {
            node_id: LOCAL,
            ..TcpConfig::default()
        },
        stats.clone(),
    ));
    let data = DataClient::new(transport, StripeConfig::default(), stats).expect("data client");
    Store::new(
        metad,
        LOCAL,
        segment("store-under-test", segment_size),
        Tracker::new(GENERATION),
        data,
        Metrics::new(),
    )
}

/// metad knowing only the local node, and a store on it with a 4 MiB segment.
pub fn local_store() -> (Arc<FakeMetad>, Store) {
    let metad = Arc::new(FakeMetad::default());
    metad.add_node(LOCAL, vec![]);
    let store = store(metad.clone(), 4 << 20);
    (metad, store)
}

/// metad placing on one remote node only, with a store on a consumer-only node.
pub async fn remote_store() -> (Arc<FakeMetad>, Store, Peer) {
    let peer = peer(2, 1 << 20).await;
    let metad = Arc::new(FakeMetad::default());
    metad.add_node(2, peer.addrs.clone());
    let store = store(metad.clone(), 0);
    (metad, store, peer)
}

/// Bytes that differ from position to position (and from object to object with `salt`).
pub fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt))
        .collect()
}

/// What a client does with a local ticket: copies the value into the extents of its mapped
/// segment and returns the checksum it computed on the way.
pub fn client_copy(seg: &Segment, extents: &[Extent], version: Version, data: &[u8]) -> u64 {
    let mut at = 0usize;
    for e in extents {
        let n = (e.len as usize).min(data.len() - at);
        // SAFETY: a bounds-checked window of the test's own segment, written by this test only.
        let dst = unsafe { seg.slice_mut(e.offset, n as u64) }.expect("extent inside the segment");
        dst.copy_from_slice(&data[at..at + n]);
        at += n;
    }
    regolith_proto::checksum::checksum(version.seed(), data)
}

/// Reads an object's bytes back out of a segment's extents.
pub fn read_extents(seg: &Segment, extents: &[Extent], size: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(size);
    for e in extents {
        let n = (e.len as usize).min(size - out.len());
        // SAFETY: a bounds-checked window of the test's own segment, only read.
        out.extend_from_slice(unsafe { seg.slice(e.offset, n as u64) }.expect("extent"));
    }
    out
}

/// A peer sidecar's data plane: its segment served over real TCP on loopback.
pub struct Peer {
    pub segment: Arc<Segment>,
    pub addrs: Vec<SocketAddr>,
    _server: crate::transport::tcp::TcpServer,
}

pub async fn peer(node_id: u64, size: u64) -> Peer {
    use crate::tracker::TrackerAdmission;
    use crate::transport::tcp::{ServerConfig, TcpServer};
    let segment = segment(&format!("peer-{node_id}"), size);
    let server = TcpServer::start(
        ServerConfig {
            listen: vec!["127.0.0.1:0".parse().expect("address")],
            node_id,
            ..ServerConfig::default()
        },
        segment.clone(),
        Arc::new(TrackerAdmission(Tracker::new(GENERATION))),
        TransportStats::new(),
    )
    .await
    .expect("data-plane server");
    Peer {
        segment,
        addrs: server.local_addrs(),
        _server: server,
    }
}
