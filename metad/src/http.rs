//! HTTP endpoints (hyper 1).
//!
//! On `--metrics-addr`: `/metrics` (Prometheus), `/health` (the process serves), `/ready` (a
//! leader is known), `/status` (JSON). With `--enable-http-metadata-server`, on
//! `--http-metadata-addr`: the Mooncake-compatible metadata KV at `/metadata?key=K` (`GET` 200
//! with the body or 404, `PUT` stores the body, `DELETE`), replicated through Raft: any replica
//! accepts the request. The leader answers it with [`crate::ops`] directly; another replica
//! forwards it to the leader over one kept gRPC client (which follows redirects and retries
//! across elections), as does a leader that lost its office during the call.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use prometheus::IntCounter;
use regolith_proto::client::{ClientConfig, MetadClient};
use regolith_proto::shutdown::Shutdown;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::config::MAX_META_VALUE;
use crate::error::{Error, Result};
use crate::node::Node;
use crate::ops::stats::Stats;

type Body = Full<Bytes>;

fn text(code: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "text/plain; charset=utf-8")
        .body(Full::new(body.into()))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

fn json(v: &serde_json::Value) -> Response<Body> {
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(v.to_string())))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

/// Binds one of the HTTP listeners (`what` names it in the error).
pub async fn bind(addr: SocketAddr, what: &'static str) -> Result<TcpListener> {
    TcpListener::bind(addr).await.map_err(|e| Error::Io {
        what: format!("{what} listen {addr}"),
        source: e,
    })
}

/// Accepts connections on `listener` until shutdown, serving each with `handle`
/// ([`regolith_proto::httpd::serve`]: a connection cap, header timeout, accept back-off);
/// connections refused at the cap are counted under `listener`'s label.
fn serve<F, Fut>(
    listener: TcpListener,
    what: &'static str,
    refused: IntCounter,
    shutdown: Shutdown,
    handle: F,
) -> JoinHandle<()>
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Response<Body>> + Send + 'static,
{
    regolith_proto::httpd::serve(listener, what, move || refused.inc(), shutdown, handle)
}

pub fn serve_metrics(node: Arc<Node>, listener: TcpListener, shutdown: Shutdown) -> JoinHandle<()> {
    let refused = node
        .ops
        .metrics
        .connections_refused
        .with_label_values(&["metrics"]);
    serve(listener, "metrics", refused, shutdown, move |req| {
        let node = node.clone();
        async move { metrics_route(&node, req) }
    })
}

fn metrics_route(node: &Node, req: Request<Incoming>) -> Response<Body> {
    if req.method() != Method::GET {
        return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n");
    }
    match req.uri().path() {
        "/metrics" => {
            node.refresh_metrics();
            Response::builder()
                .header("content-type", "text/plain; version=0.0.4")
                .body(Full::new(Bytes::from(node.ops.metrics.render())))
                .unwrap_or_else(|_| text(StatusCode::INTERNAL_SERVER_ERROR, ""))
        }
        "/health" => text(StatusCode::OK, "ok\n"),
        "/ready" => match node.ops.gate.observed().leader {
            Some(l) => text(StatusCode::OK, format!("ready: leader {l}\n")),
            None => text(StatusCode::SERVICE_UNAVAILABLE, "no leader known\n"),
        },
        "/status" => {
            let mut doc = status_json(&node.ops.stats());
            doc["tls"] = serde_json::Value::Bool(node.settings.tls.is_some());
            json(&doc)
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "endpoints: /metrics /health /ready /status\n",
        ),
    }
}

/// The `/status` document (fields are a contract: `id`, `role`, `leader_id`, `term`,
/// `last_applied`, `members`, `keys`, `bytes_used`, `bytes_total`).
pub fn status_json(st: &Stats) -> serde_json::Value {
    let obs = &st.raft;
    let members: Vec<serde_json::Value> = st
        .members
        .iter()
        .map(|m| serde_json::json!({"id": m.id, "addr": m.addr, "voter": m.voter}))
        .collect();
    let s = &st.store;
    serde_json::json!({
        "id": st.id,
        "role": format!("{:?}", obs.state).to_lowercase(),
        "leader_id": obs.leader,
        "term": obs.term,
        "last_applied": obs.applied_index,
        "last_log_index": obs.last_log_index,
        "members": members,
        "keys": s.keys,
        "bytes_used": s.bytes_used,
        "bytes_total": s.bytes_total,
        "segments": s.segments,
        "evicted_objects": s.evicted_objects,
        "dead_node_dropped_objects": s.dead_node_dropped_objects,
        "leader_ready": obs.ready_leader(),
    })
}

pub fn serve_metadata_kv(
    node: Arc<Node>,
    listener: TcpListener,
    shutdown: Shutdown,
) -> JoinHandle<()> {
    let refused = node
        .ops
        .metrics
        .connections_refused
        .with_label_values(&["http_metadata"]);
    let kv = Arc::new(MetaKv {
        token: node.settings.http_metadata_token.clone(),
        node,
        forward: OnceLock::new(),
        writes: tokio::sync::Semaphore::new(KV_WRITES_AT_ONCE),
    });
    serve(listener, "http metadata", refused, shutdown, move |req| {
        let kv = kv.clone();
        async move { kv.route(req).await }
    })
}

/// The metadata KV front: this replica's operations, and the client that forwards to the
/// leader when this replica is not it.
struct MetaKv {
    node: Arc<Node>,
    /// `--http-metadata-token-file`: required as `Authorization: Bearer TOKEN` when set.
    token: Option<String>,
    /// Writes (PUT, DELETE) in progress through this replica's front, at most
    /// [`KV_WRITES_AT_ONCE`]: each is a Raft entry of up to 512 KiB, and a flood of them
    /// starved heartbeats into elections (finding 4).
    writes: tokio::sync::Semaphore,
    /// Built on the first forwarded request, then kept (its connections with it).
    forward: OnceLock<std::result::Result<MetadClient, String>>,
}

/// Errors after which the leader may be elsewhere now: the call is forwarded (the old path's
/// client would have retried them too).
fn leader_moved(e: &Error) -> bool {
    matches!(
        e,
        Error::NotLeader { .. }
            | Error::NotReady(_)
            | Error::NoLeaderState
            | Error::Raft(_)
            | Error::Unavailable(_)
    )
}

/// Metadata-KV writes one replica's HTTP front runs at once; more wait up to
/// [`KV_WRITE_WAIT`], then get 503.
pub const KV_WRITES_AT_ONCE: usize = 4;
pub const KV_WRITE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

fn unavailable(e: impl std::fmt::Display) -> Response<Body> {
    text(StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n"))
}

/// The HTTP answer of an error of this replica's own operations.
fn answer_error(e: Error) -> Response<Body> {
    match e {
        Error::MetaQuota(_) => text(StatusCode::INSUFFICIENT_STORAGE, format!("{e}\n")),
        Error::InvalidArgument(_) => text(StatusCode::BAD_REQUEST, format!("{e}\n")),
        other => unavailable(other),
    }
}

/// The HTTP answer of an error of a call forwarded to the leader.
fn answer_forwarded(e: regolith_proto::Error) -> Response<Body> {
    match &e {
        regolith_proto::Error::Rpc { code, .. } if *code == tonic::Code::ResourceExhausted => {
            text(StatusCode::INSUFFICIENT_STORAGE, format!("{e}\n"))
        }
        regolith_proto::Error::Rpc { code, .. } if *code == tonic::Code::InvalidArgument => {
            text(StatusCode::BAD_REQUEST, format!("{e}\n"))
        }
        _ => unavailable(e),
    }
}

/// Whether the request carries the KV's token (constant-time compare), when one is set.
fn authorized(token: Option<&str>, req: &Request<Incoming>) -> bool {
    let Some(expected) = token else {
        return true;
    };
    req.headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|got| {
            regolith_proto::auth::constant_time_eq(got.trim().as_bytes(), expected.as_bytes())
        })
}

impl MetaKv {
    /// A client that follows the leader, seeded with this replica and every member known when
    /// it is built.
    fn forwarder(&self) -> std::result::Result<&MetadClient, String> {
        self.forward
            .get_or_init(|| {
                let settings = &self.node.settings;
                let mut addrs = vec![settings.advertise.clone()];
                for m in self.node.ops.members() {
                    if !addrs.contains(&m.addr) {
                        addrs.push(m.addr);
                    }
                }
                let mut cfg = ClientConfig::new(addrs);
                cfg.token = settings.token.clone();
                cfg.tls = settings.tls.clone();
                cfg.retry_deadline = std::time::Duration::from_secs(5);
                MetadClient::new(cfg).map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// `direct` on this replica while it leads; otherwise (or when leadership moved during
    /// it) `forward` over the kept client. The error is the HTTP answer.
    async fn call<T, D, DF, F, FF>(
        &self,
        direct: D,
        forward: F,
    ) -> std::result::Result<T, Response<Body>>
    where
        D: FnOnce() -> DF,
        DF: Future<Output = Result<T>>,
        F: FnOnce(MetadClient) -> FF,
        FF: Future<Output = regolith_proto::Result<T>>,
    {
        if self.node.ops.gate.observed().state == openraft::ServerState::Leader {
            match direct().await {
                Ok(v) => return Ok(v),
                Err(e) if !leader_moved(&e) => return Err(answer_error(e)),
                Err(e) => tracing::debug!(error = %e, "metadata KV: forwarding to the leader"),
            }
        }
        let client = self
            .forwarder()
            .map_err(|e| text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")))?;
        forward(client.clone()).await.map_err(answer_forwarded)
    }

    async fn route(&self, req: Request<Incoming>) -> Response<Body> {
        if req.uri().path() != "/metadata" {
            return text(StatusCode::NOT_FOUND, "use /metadata?key=KEY\n");
        }
        if !authorized(self.token.as_deref(), &req) {
            return Response::builder()
                .status(StatusCode::UNAUTHORIZED)
                .header("www-authenticate", "Bearer")
                .body(Full::new(Bytes::from_static(
                    b"this metadata server requires Authorization: Bearer TOKEN (--http-metadata-token-file)\n",
                )))
                .unwrap_or_else(|_| text(StatusCode::UNAUTHORIZED, ""));
        }
        let Some(key) = query_key(&req) else {
            return text(StatusCode::BAD_REQUEST, "missing ?key=\n");
        };
        let max_key_len = self.node.ops.cache.max_key_len;
        if key.is_empty() || key.len() > max_key_len {
            return text(
                StatusCode::BAD_REQUEST,
                format!("key must be 1..={max_key_len} bytes\n"),
            );
        }
        let ops = &self.node.ops;
        let key = key.as_str();
        let method = req.method().clone();
        // The body is read before waiting for a write slot: a 503 answered over an unread
        // 512 KiB upload is a reset at the client, never a readable answer.
        let body = if matches!(method, Method::PUT | Method::POST) {
            match Limited::new(req.into_body(), MAX_META_VALUE)
                .collect()
                .await
            {
                Ok(b) => Some(b.to_bytes()),
                Err(e) => {
                    return text(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        format!("body rejected (limit {MAX_META_VALUE} bytes): {e}\n"),
                    )
                }
            }
        } else {
            None
        };
        let _write = if matches!(method, Method::PUT | Method::POST | Method::DELETE) {
            match tokio::time::timeout(KV_WRITE_WAIT, self.writes.acquire()).await {
                Ok(Ok(permit)) => Some(permit),
                _ => {
                    return unavailable(format!(
                        "{KV_WRITES_AT_ONCE} metadata writes in progress here for {KV_WRITE_WAIT:?}; retry later"
                    ))
                }
            }
        } else {
            None
        };
        let answer = match method {
            Method::GET => self
                .call(
                    || ops.meta_get(key),
                    |c| async move { c.meta_get(key).await },
                )
                .await
                .map(|v| match v {
                    Some(v) => Response::builder()
                        .header("content-type", "application/octet-stream")
                        .body(Full::new(Bytes::from(v)))
                        .unwrap_or_else(|_| text(StatusCode::INTERNAL_SERVER_ERROR, "")),
                    None => text(StatusCode::NOT_FOUND, "metadata not found\n"),
                }),
            Method::PUT | Method::POST => {
                let body = body.unwrap_or_default();
                let direct = {
                    let body = body.clone();
                    move || async move { ops.meta_put(key.into(), body.to_vec()).await.map(|_| ()) }
                };
                self.call(
                    direct,
                    |c| async move { c.meta_put(key, body.to_vec()).await },
                )
                .await
                .map(|()| text(StatusCode::OK, "metadata updated\n"))
            }
            Method::DELETE => self
                .call(
                    || ops.meta_delete(key.into()),
                    |c| async move { c.meta_delete(key).await },
                )
                .await
                .map(|existed| {
                    if existed {
                        text(StatusCode::OK, "metadata deleted\n")
                    } else {
                        text(StatusCode::NOT_FOUND, "metadata not found\n")
                    }
                }),
            _ => return text(StatusCode::METHOD_NOT_ALLOWED, "GET, PUT or DELETE\n"),
        };
        answer.unwrap_or_else(|r| r)
    }
}

fn query_key(req: &Request<Incoming>) -> Option<String> {
    let q = req.uri().query()?;
    form_urlencoded::parse(q.as_bytes())
        .find(|(k, _)| k == "key")
        .map(|(_, v)| v.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gate::Observed;
    use crate::ops::stats::Store;
    use crate::ops::Member;

    #[test]
    fn status_document_carries_the_contract_fields() {
        let st = Stats {
            id: 2,
            raft: Observed {
                at: std::time::Instant::now(),
                state: openraft::ServerState::Leader,
                term: 3,
                leader: Some(2),
                leader_addr: Some("127.0.0.1:50051".into()),
                quorum_ack_ms: Some(1),
                applied_term: Some(3),
                applied_index: 10,
                last_log_index: 11,
                ready_floor: 9,
                leader_since: None,
            },
            members: vec![Member {
                id: 2,
                addr: "127.0.0.1:50051".into(),
                voter: true,
            }],
            store: Store {
                keys: 4,
                bytes_used: 5,
                bytes_total: 6,
                segments: 1,
                evicted_objects: 7,
                dead_node_dropped_objects: 8,
                ..Default::default()
            },
        };
        let v = status_json(&st);
        assert_eq!(
            v,
            serde_json::json!({
                "id": 2, "role": "leader", "leader_id": 2, "term": 3, "last_applied": 10,
                "last_log_index": 11,
                "members": [{"id": 2, "addr": "127.0.0.1:50051", "voter": true}],
                "keys": 4, "bytes_used": 5, "bytes_total": 6, "segments": 1,
                "evicted_objects": 7, "dead_node_dropped_objects": 8, "leader_ready": true,
            })
        );
        let follower = Stats {
            raft: Observed {
                state: openraft::ServerState::Follower,
                leader: None,
                ..st.raft.clone()
            },
            ..st
        };
        let v = status_json(&follower);
        assert_eq!(
            (&v["role"], &v["leader_id"], &v["leader_ready"]),
            (&"follower".into(), &serde_json::Value::Null, &false.into())
        );
    }
}
