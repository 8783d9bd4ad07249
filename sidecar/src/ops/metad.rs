//! What the workflows ask of metad, as a trait: the daemon plugs in the leader-following
//! [`MetadClient`]; the unit tests plug in a double. Answers are domain types, decoded once
//! here (per-item codes, replicas with parsed addresses), so the workflows never see gRPC.

use std::net::SocketAddr;

use futures::future::BoxFuture;
use regolith_proto::client::MetadClient;
use regolith_proto::common::{Extent, PutOptions, Version};
use regolith_proto::grant::{Grant, Mac, MAC_LEN};
use regolith_proto::metad as mpb;

/// A call to metad that got no usable answer (unreachable, refused, timed out, ...).
pub type MetadError = regolith_proto::Error;
pub type MetadResult<T> = std::result::Result<T, MetadError>;

/// One replica of an object (or of a reservation): a segment generation and its extents.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replica {
    pub node_id: u64,
    pub generation: u64,
    pub node_name: String,
    /// The node's data-plane listeners; addresses that do not parse are left out.
    pub data_addrs: Vec<SocketAddr>,
    /// Byte ranges of the segment, in object order.
    pub extents: Vec<Extent>,
    /// The leader's grant MAC of each extent, in extent order (empty from a metad that signs
    /// nothing; a holder with a grant key refuses slices without one).
    pub grants: Vec<Mac>,
}

impl Replica {
    /// The grant of extent `i` as the data plane carries it (a zero MAC when metad sent none).
    pub fn grant(&self, i: usize) -> Grant {
        let e = self.extents.get(i).copied().unwrap_or_default();
        Grant {
            offset: e.offset,
            len: e.len,
            mac: self.grants.get(i).copied().unwrap_or_default(),
        }
    }
}

/// metad's grants of a replica's extents; one that is not [`MAC_LEN`] bytes becomes a zero
/// MAC (which no holder accepts) rather than shifting the others.
pub fn grants_of(raw: &[Vec<u8>]) -> Vec<Mac> {
    raw.iter()
        .map(|g| g.as_slice().try_into().unwrap_or([0; MAC_LEN]))
        .collect()
}

impl From<mpb::Replica> for Replica {
    fn from(r: mpb::Replica) -> Self {
        Replica {
            node_id: r.node_id,
            generation: r.generation,
            node_name: r.node_name,
            data_addrs: r.data_addrs.iter().filter_map(|a| a.parse().ok()).collect(),
            extents: r.extents,
            grants: grants_of(&r.grants),
        }
    }
}

/// metad's answer for one item it did not carry out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub code: mpb::Code,
    pub message: String,
}

impl Refusal {
    pub fn new(code: mpb::Code, message: impl Into<String>) -> Self {
        Refusal {
            code,
            message: message.into(),
        }
    }

    /// A per-item status as metad sent it: `Ok` for OK, else the refusal.
    fn check(st: Option<mpb::Status>, missing: &str) -> std::result::Result<(), Refusal> {
        let Some(st) = st else {
            return Err(Refusal::new(mpb::Code::Internal, missing));
        };
        match mpb::Code::try_from(st.code).unwrap_or(mpb::Code::Internal) {
            mpb::Code::Ok => Ok(()),
            code => Err(Refusal::new(code, st.message)),
        }
    }
}

/// One item's answer in a batch.
pub type Answer<T> = std::result::Result<T, Refusal>;

/// One put to reserve space for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReserveItem {
    pub key: String,
    pub size: u64,
    pub options: PutOptions,
}

/// Space the leader set aside for one put.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservation {
    pub version: Version,
    pub replicas: Vec<Replica>,
}

/// A batch of reservations and the leader that issued them: their commits and aborts go there
/// and nowhere else (design §4).
#[derive(Clone, Debug)]
pub struct Reserved {
    pub leader: String,
    pub items: Vec<Answer<Reservation>>,
}

/// Where an object lives, as a get needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub version: Version,
    pub size: u64,
    pub checksum: u64,
    pub replicas: Vec<Replica>,
}

/// A remove's per-key codes, and how many of the attempts behind it got no answer (any of
/// them may have been applied).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Removed {
    pub codes: Vec<mpb::Code>,
    pub failed_attempts: u32,
}

/// The metad calls the put, get and key workflows make.
pub trait MetadApi: Send + Sync + 'static {
    /// Reserves space for each item, on behalf of node `requester`.
    fn reserve(
        &self,
        items: Vec<ReserveItem>,
        requester: u64,
    ) -> BoxFuture<'_, MetadResult<Reserved>>;

    /// Commits `(version, checksum)` pairs with the leader that issued them; one answer each,
    /// in order (a short answer means metad answered fewer items).
    fn commit<'a>(
        &'a self,
        leader: &'a str,
        items: Vec<(Version, u64)>,
    ) -> BoxFuture<'a, MetadResult<Vec<Answer<()>>>>;

    /// Gives reservations back to the leader that issued them.
    fn abort<'a>(
        &'a self,
        leader: &'a str,
        versions: Vec<Version>,
    ) -> BoxFuture<'a, MetadResult<()>>;

    /// Placements of `keys` (read leases granted to `requester`), one answer per key.
    fn placements(
        &self,
        keys: Vec<String>,
        requester: u64,
    ) -> BoxFuture<'_, MetadResult<Vec<Answer<Placement>>>>;

    fn exists(&self, keys: Vec<String>) -> BoxFuture<'_, MetadResult<Vec<bool>>>;

    fn remove(&self, keys: Vec<String>) -> BoxFuture<'_, MetadResult<Removed>>;

    /// Removes every object; answers how many.
    fn remove_all(&self) -> BoxFuture<'_, MetadResult<u64>>;

    fn segments(&self) -> BoxFuture<'_, MetadResult<Vec<mpb::SegmentInfo>>>;

    fn stats(&self) -> BoxFuture<'_, MetadResult<mpb::StatsResponse>>;

    /// One page of the cluster's keys.
    fn list_keys(
        &self,
        req: mpb::ListKeysRequest,
    ) -> BoxFuture<'_, MetadResult<mpb::ListKeysResponse>>;
}

fn reservation(it: mpb::ReserveResponse) -> Answer<Reservation> {
    // A missing status is an OK one (proto3 default), as for placements.
    Refusal::check(Some(it.status.unwrap_or_default()), "")?;
    let res = it
        .reservation
        .ok_or_else(|| Refusal::new(mpb::Code::Internal, "metad answered no reservation"))?;
    Ok(Reservation {
        version: res.version.unwrap_or_default(),
        replicas: res.replicas.into_iter().map(Replica::from).collect(),
    })
}

fn placement(p: mpb::ObjectPlacement) -> Answer<Placement> {
    Refusal::check(Some(p.status.unwrap_or_default()), "")?;
    Ok(Placement {
        version: p.version.unwrap_or_default(),
        size: p.size,
        checksum: p.checksum,
        replicas: p.replicas.into_iter().map(Replica::from).collect(),
    })
}

impl MetadApi for MetadClient {
    fn reserve(
        &self,
        items: Vec<ReserveItem>,
        requester: u64,
    ) -> BoxFuture<'_, MetadResult<Reserved>> {
        Box::pin(async move {
            let items = items
                .into_iter()
                .map(|it| mpb::ReserveRequest {
                    key: it.key,
                    size: it.size,
                    options: Some(it.options),
                    requester_node_id: requester,
                })
                .collect();
            let (reply, leader) = self
                .batch_reserve(mpb::BatchReserveRequest { items })
                .await?;
            Ok(Reserved {
                leader,
                items: reply.items.into_iter().map(reservation).collect(),
            })
        })
    }

    fn commit<'a>(
        &'a self,
        leader: &'a str,
        items: Vec<(Version, u64)>,
    ) -> BoxFuture<'a, MetadResult<Vec<Answer<()>>>> {
        Box::pin(async move {
            let req = mpb::BatchCommitRequest {
                items: items
                    .into_iter()
                    .map(|(v, checksum)| mpb::CommitRequest {
                        version: Some(v),
                        checksum,
                    })
                    .collect(),
            };
            let r = self.batch_commit_at(leader, req).await?;
            Ok(r.items
                .into_iter()
                .map(|c| Refusal::check(c.status, "commit answered fewer items"))
                .collect())
        })
    }

    fn abort<'a>(
        &'a self,
        leader: &'a str,
        versions: Vec<Version>,
    ) -> BoxFuture<'a, MetadResult<()>> {
        Box::pin(async move {
            self.abort_at(leader, mpb::AbortRequest { versions })
                .await
                .map(|_| ())
        })
    }

    fn placements(
        &self,
        keys: Vec<String>,
        requester: u64,
    ) -> BoxFuture<'_, MetadResult<Vec<Answer<Placement>>>> {
        Box::pin(async move {
            let r = self.batch_get(keys, requester).await?;
            Ok(r.items.into_iter().map(placement).collect())
        })
    }

    fn exists(&self, keys: Vec<String>) -> BoxFuture<'_, MetadResult<Vec<bool>>> {
        Box::pin(self.batch_exists(keys))
    }

    fn remove(&self, keys: Vec<String>) -> BoxFuture<'_, MetadResult<Removed>> {
        Box::pin(remove_counting_failures(self, keys))
    }

    fn remove_all(&self) -> BoxFuture<'_, MetadResult<u64>> {
        Box::pin(MetadClient::remove_all(self))
    }

    fn segments(&self) -> BoxFuture<'_, MetadResult<Vec<mpb::SegmentInfo>>> {
        Box::pin(self.list_segments())
    }

    fn stats(&self) -> BoxFuture<'_, MetadResult<mpb::StatsResponse>> {
        Box::pin(MetadClient::stats(self))
    }

    fn list_keys(
        &self,
        req: mpb::ListKeysRequest,
    ) -> BoxFuture<'_, MetadResult<mpb::ListKeysResponse>> {
        Box::pin(MetadClient::list_keys(self, req))
    }
}

/// A remove through the leader-following client (which retries across elections), and how
/// many of its attempts failed without an answer. Such an attempt may have been applied.
async fn remove_counting_failures(metad: &MetadClient, keys: Vec<String>) -> MetadResult<Removed> {
    use std::sync::atomic::{AtomicU32, Ordering};
    let req = mpb::RemoveRequest { keys };
    let failed = AtomicU32::new(0);
    let (req, counter) = (&req, &failed);
    let (resp, _) = metad
        .call("remove", |mut c| async move {
            let r = c.remove(req.clone()).await;
            if r.is_err() {
                counter.fetch_add(1, Ordering::Relaxed);
            }
            r
        })
        .await?;
    Ok(Removed {
        codes: resp
            .codes
            .iter()
            .map(|c| mpb::Code::try_from(*c).unwrap_or(mpb::Code::Internal))
            .collect(),
        failed_attempts: failed.load(Ordering::Relaxed),
    })
}
