//! HTTP endpoints (hyper 1).
//!
//! On `--metrics-addr`: `/metrics` (Prometheus), `/health` (the process serves), `/ready` (a
//! leader is known), `/status` (JSON). With `--enable-http-metadata-server`, on
//! `--http-metadata-addr`: the Mooncake-compatible metadata KV at `/metadata?key=K` (`GET` 200
//! with the body or 404, `PUT` stores the body, `DELETE`), replicated through Raft: any replica
//! accepts the request and forwards it to the leader over gRPC.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use regolith_proto::client::{ClientConfig, MetadClient};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::error::{Error, Result};
use crate::grpc::metad::MAX_META_VALUE;
use crate::node::Node;

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

/// Accepts connections on `listener` until shutdown, serving each with `handle`.
fn serve<F, Fut>(
    listener: TcpListener,
    what: &'static str,
    mut shutdown: watch::Receiver<bool>,
    handle: F,
) -> JoinHandle<()>
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Response<Body>> + Send + 'static,
{
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "{what} listening");
    }
    tokio::spawn(async move {
        loop {
            let (stream, _) = tokio::select! {
                r = listener.accept() => match r {
                    Ok(x) => x,
                    Err(e) => { tracing::warn!(error = %e, "{what} accept"); continue; }
                },
                _ = shutdown.wait_for(|s| *s) => return,
            };
            let handle = handle.clone();
            let mut sd = shutdown.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req| {
                    let h = handle.clone();
                    async move { Ok::<_, Infallible>(h(req).await) }
                });
                let conn = http1::Builder::new().serve_connection(TokioIo::new(stream), svc);
                tokio::pin!(conn);
                tokio::select! {
                    r = conn.as_mut() => { if let Err(e) = r { tracing::debug!(error = %e, "http connection"); } }
                    _ = sd.wait_for(|s| *s) => conn.as_mut().graceful_shutdown(),
                }
            });
        }
    })
}

pub fn serve_metrics(
    node: Arc<Node>,
    listener: TcpListener,
    shutdown: watch::Receiver<bool>,
) -> JoinHandle<()> {
    serve(listener, "metrics", shutdown, move |req| {
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
                .body(Full::new(Bytes::from(node.metrics.render())))
                .unwrap_or_else(|_| text(StatusCode::INTERNAL_SERVER_ERROR, ""))
        }
        "/health" => text(StatusCode::OK, "ok\n"),
        "/ready" => match node.gate.observed().leader {
            Some(l) => text(StatusCode::OK, format!("ready: leader {l}\n")),
            None => text(StatusCode::SERVICE_UNAVAILABLE, "no leader known\n"),
        },
        "/status" => json(&status_json(node)),
        _ => text(
            StatusCode::NOT_FOUND,
            "endpoints: /metrics /health /ready /status\n",
        ),
    }
}

/// The `/status` document (fields are a contract: `id`, `role`, `leader_id`, `term`,
/// `last_applied`, `members`, `keys`, `bytes_used`, `bytes_total`).
pub fn status_json(node: &Node) -> serde_json::Value {
    let obs = node.gate.observed();
    let members: Vec<serde_json::Value> = node
        .members()
        .into_iter()
        .map(|(id, addr, voter)| serde_json::json!({"id": id, "addr": addr, "voter": voter}))
        .collect();
    let core = node.core.lock();
    let sm = core.sm();
    serde_json::json!({
        "id": node.id,
        "role": format!("{:?}", obs.state).to_lowercase(),
        "leader_id": obs.leader,
        "term": obs.term,
        "last_applied": obs.applied_index,
        "last_log_index": obs.last_log_index,
        "members": members,
        "keys": sm.key_count(),
        "bytes_used": sm.bytes_used(),
        "bytes_total": sm.bytes_total(),
        "segments": sm.segments().count(),
        "evicted_objects": sm.counters().evicted_objects,
        "dead_node_dropped_objects": sm.counters().dead_node_dropped_objects,
        "leader_ready": obs.ready_leader(),
    })
}

pub fn serve_metadata_kv(
    node: Arc<Node>,
    listener: TcpListener,
    shutdown: watch::Receiver<bool>,
) -> JoinHandle<()> {
    serve(listener, "http metadata", shutdown, move |req| {
        let node = node.clone();
        async move { metadata_route(&node, req).await }
    })
}

/// A client that follows the leader, seeded with this replica and every known member.
fn forwarder(node: &Node) -> std::result::Result<MetadClient, String> {
    let mut addrs = vec![node.settings.advertise.clone()];
    for (_, a, _) in node.members() {
        if !addrs.contains(&a) {
            addrs.push(a);
        }
    }
    let mut cfg = ClientConfig::new(addrs);
    cfg.token = node.settings.token.clone();
    cfg.retry_deadline = std::time::Duration::from_secs(5);
    MetadClient::new(cfg).map_err(|e| e.to_string())
}

fn query_key(req: &Request<Incoming>) -> Option<String> {
    let q = req.uri().query()?;
    form_urlencoded::parse(q.as_bytes())
        .find(|(k, _)| k == "key")
        .map(|(_, v)| v.into_owned())
}

async fn metadata_route(node: &Node, req: Request<Incoming>) -> Response<Body> {
    if req.uri().path() != "/metadata" {
        return text(StatusCode::NOT_FOUND, "use /metadata?key=KEY\n");
    }
    let Some(key) = query_key(&req) else {
        return text(StatusCode::BAD_REQUEST, "missing ?key=\n");
    };
    if key.is_empty() || key.len() > node.settings.cache.max_key_len {
        return text(
            StatusCode::BAD_REQUEST,
            format!(
                "key must be 1..={} bytes\n",
                node.settings.cache.max_key_len
            ),
        );
    }
    let client = match forwarder(node) {
        Ok(c) => c,
        Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
    };
    let unavailable =
        |e: regolith_proto::Error| text(StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n"));
    match *req.method() {
        Method::GET => match client.meta_get(&key).await {
            Ok(Some(v)) => Response::builder()
                .header("content-type", "application/octet-stream")
                .body(Full::new(Bytes::from(v)))
                .unwrap_or_else(|_| text(StatusCode::INTERNAL_SERVER_ERROR, "")),
            Ok(None) => text(StatusCode::NOT_FOUND, "metadata not found\n"),
            Err(e) => unavailable(e),
        },
        Method::PUT | Method::POST => {
            let body = match Limited::new(req.into_body(), MAX_META_VALUE)
                .collect()
                .await
            {
                Ok(b) => b.to_bytes(),
                Err(e) => {
                    return text(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        format!("body rejected (limit {MAX_META_VALUE} bytes): {e}\n"),
                    )
                }
            };
            match client.meta_put(&key, body.to_vec()).await {
                Ok(()) => text(StatusCode::OK, "metadata updated\n"),
                Err(e) => unavailable(e),
            }
        }
        Method::DELETE => match client.meta_delete(&key).await {
            Ok(true) => text(StatusCode::OK, "metadata deleted\n"),
            Ok(false) => text(StatusCode::NOT_FOUND, "metadata not found\n"),
            Err(e) => unavailable(e),
        },
        _ => text(StatusCode::METHOD_NOT_ALLOWED, "GET, PUT or DELETE\n"),
    }
}
