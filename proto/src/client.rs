//! [`MetadClient`]: the metad client shared by the sidecar, the CLI and the tools.
//!
//! It takes the list of metad addresses, finds the leader, follows `NOT_LEADER` redirects and
//! retries calls across elections until a deadline. A commit is different: it is sent only to the
//! leader that issued the reservation ([`MetadClient::commit_at`]) and never re-sent elsewhere,
//! because another leader does not know the reservation (design §4).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tonic::codegen::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Response, Status};

use crate::auth::TokenInterceptor;
use crate::error::{Error, Result};
use crate::leader;
use crate::metad::metad_client::MetadClient as Stub;
use crate::metad::*;

/// A generated stub with the token interceptor.
pub type MetadStub = Stub<InterceptedService<Channel, TokenInterceptor>>;

/// Longest pause between two attempts: a new leader is found within this of its election.
pub const MAX_BACKOFF: Duration = Duration::from_millis(100);

/// How long after an attempt's deadline metad may still act on it, as the client's clock sees
/// it: the header's whole milliseconds and the skew of two NTP-synchronised clocks.
const DEADLINE_MARGIN: Duration = Duration::from_millis(50);

/// Largest gRPC message the client accepts (batch replies of many placements).
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// metad gRPC addresses, `HOST:PORT`.
    pub addrs: Vec<String>,
    pub token: Option<String>,
    pub connect_timeout: Duration,
    /// Limit of one attempt.
    pub request_timeout: Duration,
    /// How long a call keeps retrying across elections before it gives up.
    pub retry_deadline: Duration,
    /// Mutual TLS to every replica (`--tls-ca`, `--tls-cert`, `--tls-key`); clear without.
    pub tls: Option<crate::tls::Tls>,
}

impl ClientConfig {
    pub fn new(addrs: Vec<String>) -> Self {
        Self {
            addrs,
            token: None,
            connect_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_secs(5),
            retry_deadline: Duration::from_secs(15),
            tls: None,
        }
    }
}

/// Parses `HOST:PORT,HOST:PORT` (also accepts `http://` prefixes and spaces).
pub fn parse_addrs(list: &str) -> Result<Vec<String>> {
    let addrs: Vec<String> = list
        .split(',')
        .map(|a| {
            a.trim()
                .trim_start_matches("http://")
                .trim_end_matches('/')
                .to_string()
        })
        .filter(|a| !a.is_empty())
        .collect();
    if addrs.is_empty() {
        return Err(Error::BadAddress {
            addr: list.to_string(),
            reason: "no address given".into(),
        });
    }
    for a in &addrs {
        validate_addr(a)?;
    }
    Ok(addrs)
}

fn validate_addr(a: &str) -> Result<()> {
    let bad = |reason: &str| Error::BadAddress {
        addr: a.to_string(),
        reason: reason.into(),
    };
    let (host, port) = a
        .rsplit_once(':')
        .ok_or_else(|| bad("expected HOST:PORT"))?;
    if host.is_empty() {
        return Err(bad("empty host"));
    }
    port.parse::<u16>()
        .map_err(|_| bad("port is not a number in 1..=65535"))?;
    Ok(())
}

#[derive(Clone)]
pub struct MetadClient {
    inner: Arc<Inner>,
}

struct Inner {
    cfg: ClientConfig,
    interceptor: TokenInterceptor,
    channels: Mutex<HashMap<String, Channel>>,
    /// The address believed to be the leader's.
    leader: Mutex<Option<String>>,
}

impl std::fmt::Debug for MetadClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetadClient")
            .field("addrs", &self.inner.cfg.addrs)
            .finish()
    }
}

impl MetadClient {
    pub fn new(cfg: ClientConfig) -> Result<Self> {
        if cfg.addrs.is_empty() {
            return Err(Error::BadAddress {
                addr: String::new(),
                reason: "no metad address".into(),
            });
        }
        for a in &cfg.addrs {
            validate_addr(a)?;
        }
        let interceptor =
            TokenInterceptor::new(cfg.token.as_deref())?.with_deadline(cfg.request_timeout);
        Ok(Self {
            inner: Arc::new(Inner {
                cfg,
                interceptor,
                channels: Mutex::new(HashMap::new()),
                leader: Mutex::new(None),
            }),
        })
    }

    pub fn addrs(&self) -> &[String] {
        &self.inner.cfg.addrs
    }

    /// How long one attempt is waited for; also the deadline each attempt carries
    /// ([`crate::auth::DEADLINE_HEADER`]), after which metad does not act on it.
    pub fn request_timeout(&self) -> Duration {
        self.inner.cfg.request_timeout
    }

    /// How long an attempt may wait for its connection before it is sent (and stamped).
    pub fn connect_timeout(&self) -> Duration {
        self.inner.cfg.connect_timeout
    }

    /// The address currently believed to be the leader's.
    pub fn leader_addr(&self) -> Option<String> {
        self.inner.leader.lock().ok()?.clone()
    }

    fn set_leader(&self, addr: Option<String>) {
        if let Ok(mut l) = self.inner.leader.lock() {
            *l = addr;
        }
    }

    /// A stub talking to `addr` (connections are cached and shared).
    pub fn stub(&self, addr: &str) -> Result<MetadStub> {
        let channel = {
            let mut chans = self
                .inner
                .channels
                .lock()
                .map_err(|_| Error::Config("poisoned".into()))?;
            match chans.get(addr) {
                Some(c) => c.clone(),
                None => {
                    let ep = Endpoint::from_shared(format!("http://{addr}"))
                        .map_err(|e| Error::BadAddress {
                            addr: addr.to_string(),
                            reason: e.to_string(),
                        })?
                        .connect_timeout(self.inner.cfg.connect_timeout)
                        .timeout(self.inner.cfg.request_timeout)
                        .tcp_nodelay(true)
                        .http2_keep_alive_interval(Duration::from_secs(1))
                        .keep_alive_timeout(Duration::from_secs(2))
                        .keep_alive_while_idle(true);
                    let c = crate::tls::channel(ep, self.inner.cfg.tls.as_ref());
                    chans.insert(addr.to_string(), c.clone());
                    c
                }
            }
        };
        Ok(
            Stub::with_interceptor(channel, self.inner.interceptor.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
        )
    }

    /// Calls the leader, following redirects and retrying across elections until the retry
    /// deadline. Returns the reply and the address that answered.
    pub async fn call<T, F, Fut>(&self, op: &'static str, f: F) -> Result<(T, String)>
    where
        F: FnMut(MetadStub) -> Fut,
        Fut: Future<Output = std::result::Result<Response<T>, Status>>,
    {
        self.call_with(op, false, f).await
    }

    /// [`Self::call`] for a call that must not take effect twice over (a remove, a mount): when
    /// an attempt ended with its fate unknown (a timeout, a lost connection), the answer waits
    /// until that attempt's deadline has passed, after which metad no longer acts on it. So
    /// nothing that attempt does happens after the caller has its answer (a remove delivered
    /// late would otherwise remove a newer put of the key).
    pub async fn call_settled<T, F, Fut>(&self, op: &'static str, f: F) -> Result<(T, String)>
    where
        F: FnMut(MetadStub) -> Fut,
        Fut: Future<Output = std::result::Result<Response<T>, Status>>,
    {
        self.call_with(op, true, f).await
    }

    async fn call_with<T, F, Fut>(
        &self,
        op: &'static str,
        settle: bool,
        mut f: F,
    ) -> Result<(T, String)>
    where
        F: FnMut(MetadStub) -> Fut,
        Fut: Future<Output = std::result::Result<Response<T>, Status>>,
    {
        let mut unsettled: Option<Instant> = None;
        let r = self.call_attempts(op, &mut f, &mut unsettled).await;
        if let (true, Some(at)) = (settle, unsettled) {
            tokio::time::sleep_until(at.into()).await;
        }
        r
    }

    /// The attempts of a call; `unsettled` is raised to when the last attempt of unknown fate
    /// stops counting (its deadline, stamped once connected, and a margin for the clocks).
    async fn call_attempts<T, F, Fut>(
        &self,
        op: &'static str,
        f: &mut F,
        unsettled: &mut Option<Instant>,
    ) -> Result<(T, String)>
    where
        F: FnMut(MetadStub) -> Fut,
        Fut: Future<Output = std::result::Result<Response<T>, Status>>,
    {
        let start = Instant::now();
        let deadline = start + self.inner.cfg.retry_deadline;
        let addrs = &self.inner.cfg.addrs;
        let mut target = self.leader_addr();
        // Rotation over the configured addresses starts after the cached leader, so a leader
        // that stopped answering is not tried twice in a row.
        let mut next = target
            .as_ref()
            .and_then(|t| addrs.iter().position(|a| a == t))
            .map_or(0, |i| i + 1);
        let mut last: String;
        let mut backoff = Duration::from_millis(20);
        loop {
            let addr = match target.take() {
                Some(a) => a,
                None => {
                    let a = addrs[next % addrs.len()].clone();
                    next += 1;
                    a
                }
            };
            let counts_until = Instant::now()
                + self.inner.cfg.connect_timeout
                + self.inner.cfg.request_timeout
                + DEADLINE_MARGIN;
            match f(self.stub(&addr)?).await {
                Ok(resp) => {
                    self.set_leader(Some(addr.clone()));
                    return Ok((resp.into_inner(), addr));
                }
                Err(s) if leader::is_not_leader(&s) => {
                    self.set_leader(None);
                    last = format!("{addr}: {}", s.message());
                    if let Some(h) = leader::hint_of(&s) {
                        if h.addr != addr {
                            target = Some(h.addr);
                            continue;
                        }
                    }
                }
                Err(s) if retryable(&s) => {
                    *unsettled = (*unsettled).max(Some(counts_until));
                    self.set_leader(None);
                    last = format!("{addr}: {:?}: {}", s.code(), s.message());
                    tracing::debug!(op, %addr, code = ?s.code(), msg = s.message(), "metad call failed; retrying");
                }
                Err(s) => {
                    return Err(Error::Rpc {
                        addr,
                        code: s.code(),
                        message: s.message().to_string(),
                    });
                }
            }
            if Instant::now() + backoff > deadline {
                return Err(Error::NoLeader {
                    tried: addrs.join(","),
                    waited_ms: start.elapsed().as_millis() as u64,
                    last,
                });
            }
            // A full round over the addresses without an answer: pause before the next round.
            if next.is_multiple_of(addrs.len()) || target.is_some() {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }

    /// Calls exactly `addr`, once: used for commits and aborts, which belong to the leader that
    /// issued the reservation.
    pub async fn call_at<T, F, Fut>(&self, addr: &str, f: F) -> Result<T>
    where
        F: FnOnce(MetadStub) -> Fut,
        Fut: Future<Output = std::result::Result<Response<T>, Status>>,
    {
        match f(self.stub(addr)?).await {
            Ok(r) => Ok(r.into_inner()),
            Err(s) if leader::is_not_leader(&s) => {
                self.set_leader(None);
                Err(Error::NotLeader {
                    addr: addr.to_string(),
                    leader: leader::hint_of(&s),
                })
            }
            Err(s) => Err(Error::Rpc {
                addr: addr.to_string(),
                code: s.code(),
                message: s.message().to_string(),
            }),
        }
    }

    // ------------------------------------------------------------------ typed helpers

    pub async fn mount(&self, req: MountSegmentRequest) -> Result<MountSegmentResponse> {
        Ok(self
            .call_settled("mount", |mut c| {
                let r = req.clone();
                async move { c.mount_segment(r).await }
            })
            .await?
            .0)
    }

    pub async fn unmount(&self, req: UnmountSegmentRequest) -> Result<UnmountSegmentResponse> {
        Ok(self
            .call("unmount", |mut c| {
                let r = req;
                async move { c.unmount_segment(r).await }
            })
            .await?
            .0)
    }

    pub async fn heartbeat(&self, req: HeartbeatRequest) -> Result<(HeartbeatResponse, String)> {
        self.call("heartbeat", |mut c| {
            let r = req.clone();
            async move { c.heartbeat(r).await }
        })
        .await
    }

    /// The disk tier's report (docs/ssd.md).
    pub async fn disk_report(&self, req: DiskReportRequest) -> Result<DiskReportResponse> {
        self.call("disk_report", |mut c| {
            let r = req.clone();
            async move { c.disk_report(r).await }
        })
        .await
        .map(|(r, _)| r)
    }

    /// Reserves space for one put; returns the reply and the issuing leader's address, where the
    /// commit must go.
    pub async fn reserve(&self, req: ReserveRequest) -> Result<(ReserveResponse, String)> {
        self.call("reserve", |mut c| {
            let r = req.clone();
            async move { c.reserve(r).await }
        })
        .await
    }

    pub async fn batch_reserve(
        &self,
        req: BatchReserveRequest,
    ) -> Result<(BatchReserveResponse, String)> {
        self.call("batch_reserve", |mut c| {
            let r = req.clone();
            async move { c.batch_reserve(r).await }
        })
        .await
    }

    pub async fn commit_at(&self, addr: &str, req: CommitRequest) -> Result<CommitResponse> {
        self.call_at(addr, |mut c| async move { c.commit(req).await })
            .await
    }

    pub async fn batch_commit_at(
        &self,
        addr: &str,
        req: BatchCommitRequest,
    ) -> Result<BatchCommitResponse> {
        self.call_at(addr, |mut c| async move { c.batch_commit(req).await })
            .await
    }

    pub async fn abort_at(&self, addr: &str, req: AbortRequest) -> Result<AbortResponse> {
        self.call_at(addr, |mut c| async move { c.abort(req).await })
            .await
    }

    pub async fn get(&self, key: &str, requester_node_id: u64) -> Result<ObjectPlacement> {
        let req = GetRequest {
            keys: vec![key.to_string()],
            requester_node_id,
        };
        Ok(self
            .call("get", |mut c| {
                let r = req.clone();
                async move { c.get(r).await }
            })
            .await?
            .0)
    }

    pub async fn batch_get(
        &self,
        keys: Vec<String>,
        requester_node_id: u64,
    ) -> Result<GetResponse> {
        let req = GetRequest {
            keys,
            requester_node_id,
        };
        Ok(self
            .call("batch_get", |mut c| {
                let r = req.clone();
                async move { c.batch_get(r).await }
            })
            .await?
            .0)
    }

    pub async fn exists(&self, key: &str) -> Result<bool> {
        let req = ExistsRequest {
            keys: vec![key.to_string()],
        };
        let r = self
            .call("exists", |mut c| {
                let r = req.clone();
                async move { c.exists(r).await }
            })
            .await?
            .0;
        Ok(r.exists.first().copied().unwrap_or(false))
    }

    pub async fn batch_exists(&self, keys: Vec<String>) -> Result<Vec<bool>> {
        let req = ExistsRequest { keys };
        Ok(self
            .call("batch_exists", |mut c| {
                let r = req.clone();
                async move { c.batch_exists(r).await }
            })
            .await?
            .0
            .exists)
    }

    pub async fn remove(&self, keys: Vec<String>) -> Result<RemoveResponse> {
        let req = RemoveRequest { keys };
        Ok(self
            .call_settled("remove", |mut c| {
                let r = req.clone();
                async move { c.remove(r).await }
            })
            .await?
            .0)
    }

    pub async fn remove_all(&self) -> Result<u64> {
        Ok(self
            .call_settled("remove_all", |mut c| async move {
                c.remove_all(RemoveAllRequest {}).await
            })
            .await?
            .0
            .removed)
    }

    pub async fn stats(&self) -> Result<StatsResponse> {
        Ok(self
            .call(
                "stats",
                |mut c| async move { c.stats(StatsRequest {}).await },
            )
            .await?
            .0)
    }

    pub async fn list_segments(&self) -> Result<Vec<SegmentInfo>> {
        Ok(self
            .call("list_segments", |mut c| async move {
                c.list_segments(ListSegmentsRequest {}).await
            })
            .await?
            .0
            .segments)
    }

    pub async fn list_keys(&self, req: ListKeysRequest) -> Result<ListKeysResponse> {
        Ok(self
            .call("list_keys", |mut c| {
                let r = req.clone();
                async move { c.list_keys(r).await }
            })
            .await?
            .0)
    }

    pub async fn add_member(&self, id: u64, addr: &str) -> Result<Vec<Member>> {
        let req = AddMemberRequest {
            id,
            addr: addr.to_string(),
        };
        Ok(self
            .call("add_member", |mut c| {
                let r = req.clone();
                async move { c.add_member(r).await }
            })
            .await?
            .0
            .members)
    }

    pub async fn remove_member(&self, id: u64) -> Result<Vec<Member>> {
        let req = RemoveMemberRequest { id };
        Ok(self
            .call("remove_member", |mut c| async move {
                c.remove_member(req).await
            })
            .await?
            .0
            .members)
    }

    /// Asks the leader to hand its office to voter `to` (0: the most caught-up one), holding
    /// writes at most `timeout_ms` (docs/metad.md "Leadership hand-over"). Returns the answer
    /// and the address of the replica that handed over.
    pub async fn transfer_leader(
        &self,
        to: u64,
        timeout_ms: u64,
    ) -> Result<(TransferLeaderResponse, String)> {
        let req = TransferLeaderRequest { to, timeout_ms };
        self.call("transfer_leader", |mut c| async move {
            c.transfer_leader(req).await
        })
        .await
    }

    pub async fn drain(&self, node_name: &str, timeout_ms: u64) -> Result<DrainResponse> {
        let req = DrainRequest {
            node_name: node_name.to_string(),
            timeout_ms,
        };
        Ok(self
            .call("drain", |mut c| {
                let r = req.clone();
                async move { c.drain(r).await }
            })
            .await?
            .0)
    }

    pub async fn meta_get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let req = MetaGetRequest {
            key: key.to_string(),
        };
        let r = self
            .call("meta_get", |mut c| {
                let r = req.clone();
                async move { c.meta_get(r).await }
            })
            .await?
            .0;
        Ok(r.found.then_some(r.value))
    }

    pub async fn meta_put(&self, key: &str, value: Vec<u8>) -> Result<()> {
        let req = MetaPutRequest {
            key: key.to_string(),
            value,
        };
        self.call_settled("meta_put", |mut c| {
            let r = req.clone();
            async move { c.meta_put(r).await }
        })
        .await?;
        Ok(())
    }

    pub async fn meta_delete(&self, key: &str) -> Result<bool> {
        let req = MetaDeleteRequest {
            key: key.to_string(),
        };
        Ok(self
            .call_settled("meta_delete", |mut c| {
                let r = req.clone();
                async move { c.meta_delete(r).await }
            })
            .await?
            .0
            .existed)
    }
}

impl MetadClient {
    /// `SaveSnapshot`: opens the stream at the leader (following redirects and retrying like
    /// [`MetadClient::call`]), then writes every chunk to `out` in order. Returns the bytes
    /// written and the address that served them. A stream that breaks off is an error: what
    /// `out` holds then is incomplete (the caller validates the file before keeping it).
    pub async fn save_snapshot<W: std::io::Write>(&self, out: &mut W) -> Result<(u64, String)> {
        let (mut stream, addr) = self
            .call("save_snapshot", |mut c| async move {
                c.save_snapshot(SaveSnapshotRequest {}).await
            })
            .await?;
        let mut written = 0u64;
        loop {
            let chunk = stream.message().await.map_err(|s| Error::Rpc {
                addr: addr.clone(),
                code: s.code(),
                message: s.message().to_string(),
            })?;
            let Some(chunk) = chunk else {
                return Ok((written, addr));
            };
            out.write_all(&chunk.data).map_err(|source| Error::File {
                op: "write snapshot to",
                path: "the output file".into(),
                source,
            })?;
            written += chunk.data.len() as u64;
        }
    }
}

/// Codes worth another attempt, possibly at another replica.
fn retryable(s: &Status) -> bool {
    matches!(
        s.code(),
        Code::Unavailable
            | Code::Unknown
            | Code::Cancelled
            | Code::DeadlineExceeded
            | Code::Aborted
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_address_lists() {
        assert_eq!(
            parse_addrs("a:1, http://b:2/").unwrap(),
            vec!["a:1".to_string(), "b:2".to_string()]
        );
        assert!(parse_addrs("").is_err());
        assert!(parse_addrs("nohost").is_err());
        assert!(parse_addrs("h:99999").is_err());
    }
}
