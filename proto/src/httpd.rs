//! The daemons' HTTP listeners (hyper 1): `/metrics` and friends on both, and metad's metadata
//! KV. What they share is how connections are taken: at most [`MAX_HTTP_CONNECTIONS`] open per
//! listener, headers within [`HEADER_READ_TIMEOUT`], no connection older than
//! [`MAX_CONNECTION_AGE`], and a back-off when accept fails ([`crate::net`]).
//!
//! Finding 5 of the hardening review: 20,000 partial HTTP requests (no header timeout, no cap)
//! held metad's descriptors until accept failed, and the loop then spun.

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::net::{AcceptBackoff, ConnLimit};
use crate::shutdown::Shutdown;

/// Most connections one HTTP listener keeps open; more are closed at once (and counted by the
/// caller's `on_refused`).
pub const MAX_HTTP_CONNECTIONS: usize = 256;
/// A request's headers must arrive within this.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection is asked to close (after the request in progress) once it is this old, and
/// dropped if it is still open [`CLOSE_GRACE`] later: kept-alive or stalled connections cannot
/// hold the listener's slots for good.
pub const MAX_CONNECTION_AGE: Duration = Duration::from_secs(60);
pub const CLOSE_GRACE: Duration = Duration::from_secs(10);

pub type Body = Full<Bytes>;

/// Accepts connections on `listener` until shutdown, serving each request with `handle`.
pub fn serve<F, Fut>(
    listener: TcpListener,
    what: &'static str,
    on_refused: impl Fn() + Send + 'static,
    shutdown: Shutdown,
    handle: F,
) -> JoinHandle<()>
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<Body>> + Send + 'static,
{
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "{what} listening");
    }
    let limit = ConnLimit::new(MAX_HTTP_CONNECTIONS);
    tokio::spawn(async move {
        let mut backoff = AcceptBackoff::new(what);
        loop {
            let accepted = tokio::select! {
                r = listener.accept() => r,
                _ = shutdown.wait() => return,
            };
            let stream = match accepted {
                Ok((s, _)) => {
                    backoff.succeeded();
                    s
                }
                Err(e) => {
                    tokio::select! {
                        () = backoff.pause_after(&e) => continue,
                        _ = shutdown.wait() => return,
                    }
                }
            };
            let Some(slot) = limit.try_take() else {
                on_refused();
                tracing::debug!(
                    "{what}: {MAX_HTTP_CONNECTIONS} connections open, closing a new one"
                );
                continue;
            };
            let handle = handle.clone();
            let sd = shutdown.clone();
            tokio::spawn(async move {
                let _slot = slot;
                serve_connection(stream, handle, sd).await;
            });
        }
    })
}

async fn serve_connection<F, Fut>(stream: TcpStream, handle: F, sd: Shutdown)
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<Body>> + Send + 'static,
{
    let svc = service_fn(move |req| {
        let h = handle.clone();
        async move { Ok::<_, Infallible>(h(req).await) }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(TokioIo::new(stream), svc);
    tokio::pin!(conn);
    let finished = tokio::select! {
        r = conn.as_mut() => Some(r),
        _ = sd.wait() => None,
        () = tokio::time::sleep(MAX_CONNECTION_AGE) => None,
    };
    let r = match finished {
        Some(r) => r,
        None => {
            conn.as_mut().graceful_shutdown();
            match tokio::time::timeout(CLOSE_GRACE, conn.as_mut()).await {
                Ok(r) => r,
                Err(_) => return,
            }
        }
    };
    if let Err(e) = r {
        tracing::debug!(error = %e, "http connection");
    }
}
