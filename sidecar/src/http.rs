//! `/metrics` (Prometheus), `/health` and `/status` (JSON) on `--metrics-addr` (hyper 1).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};
use regolith_proto::shutdown::Shutdown;
use tokio::net::TcpListener;

use crate::error::{Error, Result};
use crate::node::Sidecar;

fn reply(code: StatusCode, ctype: &str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    Response::builder()
        .status(code)
        .header("content-type", ctype)
        .body(Full::new(body.into()))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

/// The `/status` document.
pub fn status_json(side: &Sidecar) -> serde_json::Value {
    let (term, leader) = *side.leader.lock();
    serde_json::json!({
        "node_name": side.settings.node_name,
        "node_id": side.node_id(),
        "generation": side.store.tracker.generation(),
        "generation_lost": side.generation_lost.load(Ordering::Acquire),
        "segment_size": side.store.segment.len(),
        "segment_used": side.segment_used.load(Ordering::Relaxed),
        "clients": side.clients.load(Ordering::Relaxed),
        "data_addrs": side.data_addrs,
        "socket": side.settings.socket.display().to_string(),
        "metad_term": term,
        "metad_leader": leader,
        "highest_term_seen": side.store.tracker.highest_term(),
        "grants_enforced": side.store.tracker.grants_enforced(),
        "tls": side.settings.tls.is_some(),
        "transport": {
            "mode": side.rdma.cfg.mode.to_string(),
            "rdma_ports": side.rdma.port_names(),
            "tcp_only_because": side.rdma.tcp_reason,
        },
        "instance_id": side.instance_id,
        "puts": side.store.puts.load(Ordering::Relaxed),
        "gets": side.store.gets.load(Ordering::Relaxed),
        "checksum_mismatches": side.metrics.checksum_mismatches.get(),
        "disks": side.disks.status(),
    })
}

fn refresh(side: &Sidecar) {
    let st = &side.transport_stats;
    for (reason, n) in [
        ("busy", &st.refused_busy),
        ("evicted_pending", &st.evicted_pending),
        ("bad_grant", &st.bad_grants),
        ("tls_handshake", &st.refused_tls),
    ] {
        side.metrics
            .data_plane_refusals
            .with_label_values(&[reason])
            .set(n.load(Ordering::Relaxed) as i64);
    }
    refresh_rdma(side);
    refresh_disks(side);
    for n in side.transport_stats.snapshot() {
        let nic = n.addr.to_string();
        side.metrics
            .nic_bytes_in
            .with_label_values(&[&nic])
            .set(n.bytes_in as i64);
        side.metrics
            .nic_bytes_out
            .with_label_values(&[&nic])
            .set(n.bytes_out as i64);
        side.metrics
            .nic_retries
            .with_label_values(&[&nic])
            .set(n.retries as i64);
        side.metrics
            .nic_failed_conns
            .with_label_values(&[&nic])
            .set(n.failed_conns as i64);
    }
}

fn refresh_disks(side: &Sidecar) {
    use crate::disk::tier::Slot;
    let m = &side.metrics;
    for slot in &side.disks.slots {
        let (path, disk) = match slot {
            Slot::Open(d) => (d.path().display().to_string(), Some(d)),
            Slot::FailedAtOpen { spec, .. } => (spec.path.display().to_string(), None),
        };
        let l = [path.as_str()];
        let healthy = disk.is_some_and(|d| !d.is_failed());
        m.disk_healthy.with_label_values(&l).set(healthy as i64);
        let Some(d) = disk else { continue };
        let u = d.usage();
        m.disk_capacity_bytes
            .with_label_values(&l)
            .set(u.capacity as i64);
        m.disk_used_bytes.with_label_values(&l).set(u.live as i64);
        m.disk_allocated_bytes
            .with_label_values(&l)
            .set(u.allocated as i64);
        m.disk_objects.with_label_values(&l).set(u.objects as i64);
        let st = &d.stats;
        let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed) as i64;
        for (g, v) in [
            (&m.disk_read_bytes, get(&st.read_bytes)),
            (&m.disk_reads, get(&st.reads)),
            (&m.disk_read_micros, get(&st.read_micros)),
            (&m.disk_write_bytes, get(&st.write_bytes)),
            (&m.disk_writes, get(&st.writes)),
            (&m.disk_write_micros, get(&st.write_micros)),
            (&m.disk_errors, get(&st.errors)),
            (&m.disk_corrupt_records, get(&st.corrupt_records)),
            (&m.disk_evicted, get(&st.evicted)),
            (&m.disk_compacted, get(&st.compacted)),
            (&m.disk_lost, get(&st.lost)),
        ] {
            g.with_label_values(&l).set(v);
        }
    }
}

fn refresh_rdma(side: &Sidecar) {
    let m = &side.metrics;
    let st = &side.rdma.stats;
    let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed) as i64;
    m.rdma_enabled.set(get(&st.enabled));
    m.rdma_fallbacks.set(get(&st.fallbacks));
    m.rdma_refused.set(get(&st.refused));
    for (port, c) in st.snapshot() {
        for (op, bytes, ops) in [
            ("read", &c.read_bytes, &c.reads),
            ("write", &c.write_bytes, &c.writes),
            ("commit", &c.commit_bytes, &c.commits),
        ] {
            m.rdma_bytes.with_label_values(&[&port, op]).set(get(bytes));
            m.rdma_ops.with_label_values(&[&port, op]).set(get(ops));
        }
        m.rdma_errors
            .with_label_values(&[&port])
            .set(get(&c.errors));
        m.rdma_connections
            .with_label_values(&[&port])
            .set(get(&c.connections));
    }
}

/// Test hook: `POST /debug/close-nic?ip=IP` (only with `--test-hooks`).
fn close_nic(side: &Sidecar, req: &Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
    let ip = req
        .uri()
        .query()
        .and_then(|q| q.strip_prefix("ip="))
        .and_then(|ip| ip.parse::<std::net::IpAddr>().ok());
    let Some(ip) = ip else {
        return reply(StatusCode::BAD_REQUEST, "text/plain", "use ?ip=IP\n");
    };
    let addr = std::net::SocketAddr::new(ip, side.settings.data_port);
    let closed = side
        .server
        .lock()
        .as_ref()
        .is_some_and(|s| s.close_nic(addr));
    if closed {
        reply(StatusCode::OK, "text/plain", format!("closed {addr}\n"))
    } else {
        reply(
            StatusCode::NOT_FOUND,
            "text/plain",
            format!("no listener on {addr}\n"),
        )
    }
}

/// Test hook: `POST /debug/freeze-index?on=1` stops applying the watch stream while the
/// index keeps answering (a lagging index); `?on=0` resyncs it (only with `--test-hooks`).
fn freeze_index(side: &Sidecar, req: &Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
    let on = match req.uri().query() {
        Some("on=1") => true,
        Some("on=0") => false,
        _ => {
            return reply(
                StatusCode::BAD_REQUEST,
                "text/plain",
                "use ?on=1 or ?on=0\n",
            )
        }
    };
    side.store.index.freeze_for_test(on);
    reply(StatusCode::OK, "text/plain", format!("frozen={on}\n"))
}

fn route(side: &Sidecar, req: &Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
    if side.settings.test_hooks
        && req.method() == Method::POST
        && req.uri().path() == "/debug/freeze-index"
    {
        return freeze_index(side, req);
    }
    if side.settings.test_hooks
        && req.method() == Method::POST
        && req.uri().path() == "/debug/close-nic"
    {
        return close_nic(side, req);
    }
    if req.method() != Method::GET {
        return reply(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "GET only\n");
    }
    match req.uri().path() {
        "/metrics" => {
            refresh(side);
            reply(
                StatusCode::OK,
                "text/plain; version=0.0.4",
                side.metrics.render(),
            )
        }
        "/health" => reply(StatusCode::OK, "text/plain", "ok\n"),
        "/ready" => {
            if side.shutting_down.load(Ordering::Relaxed) {
                reply(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    "shutting down\n",
                )
            } else {
                reply(StatusCode::OK, "text/plain", "ready\n")
            }
        }
        "/status" => reply(
            StatusCode::OK,
            "application/json",
            status_json(side).to_string(),
        ),
        _ => reply(
            StatusCode::NOT_FOUND,
            "text/plain",
            "endpoints: /metrics /health /ready /status\n",
        ),
    }
}

pub async fn serve(side: Arc<Sidecar>, shutdown: Shutdown) -> Result<tokio::task::JoinHandle<()>> {
    let addr = side.settings.metrics_addr;
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| Error::Bind { addr, source: e })?;
    Ok(serve_listener(side, listener, shutdown))
}

/// Binds `--metrics-addr` (blocking; the listener is served by [`serve_on`]).
pub fn bind(addr: std::net::SocketAddr) -> Result<std::net::TcpListener> {
    std::net::TcpListener::bind(addr).map_err(|e| Error::Bind { addr, source: e })
}

/// Serves the HTTP endpoints on a listener bound already (by [`bind`], or handed over by the
/// sidecar this process replaces).
pub fn serve_on(
    side: Arc<Sidecar>,
    listener: std::net::TcpListener,
    shutdown: Shutdown,
) -> Result<tokio::task::JoinHandle<()>> {
    let io = |source| Error::Os {
        what: "metrics listener".into(),
        source,
    };
    listener.set_nonblocking(true).map_err(io)?;
    let listener = TcpListener::from_std(listener).map_err(io)?;
    Ok(serve_listener(side, listener, shutdown))
}

fn serve_listener(
    side: Arc<Sidecar>,
    listener: TcpListener,
    shutdown: Shutdown,
) -> tokio::task::JoinHandle<()> {
    let refused = side
        .metrics
        .connections_refused
        .with_label_values(&["metrics"]);
    regolith_proto::httpd::serve(
        listener,
        "metrics",
        move || refused.inc(),
        shutdown,
        move |req| {
            let side = side.clone();
            async move { route(&side, &req) }
        },
    )
}
