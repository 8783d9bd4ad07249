//! The process entry point of the `regolith-metad` binary: the daemons' shared `main` shell
//! ([`regolith_proto::daemon::main`]: argument parsing, logging, signals, the runtime) around
//! [`Replica`]: the listeners, bound before storage and Raft start, and the gRPC and HTTP
//! servers on them.

use std::process::ExitCode;
use std::sync::Arc;

use regolith_proto::auth::{PeerCheck, TokenCheck};
use regolith_proto::metad::metad_server::MetadServer;
use regolith_proto::raft::raft_server::RaftServer;
use regolith_proto::shutdown::Shutdown;
use regolith_proto::tls::{accept_server_io, ServerIo, Tls};
use tokio::net::TcpListener;
use tonic::service::interceptor::InterceptedService;

use crate::args::{Args, Settings};
use crate::error::{Error, Result};
use crate::grpc::grants::Grants;
use crate::grpc::metad::MetadService;
use crate::grpc::raft::RaftService;
use crate::node;
use regolith_proto::daemon;

/// Logs on stderr; `-v` debug and `-vv` trace for Regolith's crates; `RUST_LOG` overrides.
pub const SHELL: daemon::Shell = daemon::Shell {
    name: "regolith-metad",
    log_levels: [
        "info",
        "info,regolith_metad=debug,regolith_raft_log=debug,regolith_proto=debug",
        "debug,regolith_metad=trace,regolith_raft_log=trace,openraft=debug",
    ],
};

/// Runs `regolith-metad` with these arguments (argv[0] included) until SIGTERM/SIGINT.
pub fn main_with_args(argv: Vec<String>) -> ExitCode {
    daemon::main(
        &SHELL,
        argv,
        Args::resolve,
        Settings::process,
        Replica::start,
        |replica: Replica, shutdown: Shutdown| replica.serve(shutdown),
    )
}

/// The sockets a replica serves on. They are bound first thing in [`Replica::start`], before
/// storage opens or Raft runs: a port already taken fails the start before this replica votes
/// or bootstraps a cluster, and none of its own outgoing connections (Raft's, to its peers) can
/// be handed one of its ports by the kernel in between.
pub struct Listeners {
    grpc: TcpListener,
    metrics: TcpListener,
    kv: Option<TcpListener>,
}

impl Listeners {
    pub async fn bind(settings: &Settings) -> Result<Self> {
        let grpc = TcpListener::bind(settings.listen)
            .await
            .map_err(|e| Error::Io {
                what: format!("gRPC listen {}", settings.listen),
                source: e,
            })?;
        warn_if_unreachable(settings);
        let metrics = crate::http::bind(settings.metrics_addr, "metrics").await?;
        let kv = match settings.http_metadata_addr {
            Some(addr) => Some(crate::http::bind(addr, "http metadata").await?),
            None => None,
        };
        Ok(Self { grpc, metrics, kv })
    }
}

/// Listeners default to loopback; a replica that advertises another host but listens on
/// loopback cannot be reached by its peers, which deserves a line in the log, not silence.
fn warn_if_unreachable(settings: &Settings) {
    let host = settings
        .advertise
        .rsplit_once(':')
        .map_or(settings.advertise.as_str(), |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let advertised_loopback = host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if settings.listen.ip().is_loopback() && !advertised_loopback {
        tracing::warn!(
            listen = %settings.listen,
            advertise = %settings.advertise,
            "gRPC listens on loopback only but advertises another host: peers and clients \
             elsewhere cannot reach it (give --listen)"
        );
    }
    if settings.token.is_none() && !settings.listen.ip().is_loopback() {
        tracing::warn!(listen = %settings.listen, "no --cluster-token-file: anyone who reaches this address may act as a client or a Raft peer");
    }
}

/// How long an accepted gRPC connection has for its TLS handshake.
const TLS_HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// TLS handshakes in progress at once; past it the oldest is closed to make room (counted in
/// `connections_refused_total{listener="grpc_tls_handshake"}`), so a flood of silent
/// connections holds at most this many tasks, none of them longer than the timeout, and
/// cannot keep real clients out.
const MAX_TLS_HANDSHAKES: usize = 256;

/// What a TLS listener counts: failed handshakes, and handshakes closed to make room.
#[derive(Clone)]
struct HandshakeCounters {
    failures: prometheus::IntCounter,
    evicted: prometheus::IntCounter,
}

/// The gRPC listener's connections as tonic takes them. tonic retries a failed accept at once
/// (it spins at the fd limit), so failures are absorbed here with a back-off and never reach
/// it. tonic sets TCP_NODELAY only on sockets it accepts itself; these are ours, and without it
/// Nagle's algorithm and delayed ACKs add ~40 ms to any reply larger than one segment. With
/// TLS, each handshake runs in a task of its own (bounded in time), so a slow or silent client
/// never holds up the accept loop; a failed handshake is logged at debug and counted.
fn grpc_incoming(
    listener: TcpListener,
    tls: Option<Tls>,
    counters: HandshakeCounters,
    shutdown: Shutdown,
) -> tokio_stream::wrappers::ReceiverStream<std::io::Result<ServerIo>> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let handshakes = regolith_proto::net::Handshakes::new(MAX_TLS_HANDSHAKES);
    tokio::spawn(async move {
        let mut backoff = regolith_proto::net::AcceptBackoff::new("gRPC");
        loop {
            let accepted = tokio::select! {
                r = listener.accept() => r,
                _ = shutdown.wait() => return,
                () = tx.closed() => return,
            };
            match accepted {
                Ok((s, peer)) => {
                    backoff.succeeded();
                    if let Err(e) = s.set_nodelay(true) {
                        tracing::debug!(error = %e, "TCP_NODELAY");
                    }
                    let Some(tls) = &tls else {
                        if tx.send(Ok(ServerIo::Plain(s))).await.is_err() {
                            return;
                        }
                        continue;
                    };
                    let (pending, evicted) = handshakes.admit();
                    counters.evicted.inc_by(evicted as u64);
                    let (tls, tx, failures) = (tls.clone(), tx.clone(), counters.failures.clone());
                    tokio::spawn(async move {
                        let accepted = tokio::select! {
                            r = accept_server_io(Some(&tls), s, TLS_HANDSHAKE_TIMEOUT) => r,
                            () = pending.evicted.cancelled() => Err(std::io::Error::other(
                                "closed in its TLS handshake to make room for newer connections",
                            )),
                        };
                        drop(pending);
                        match accepted {
                            Ok(io) => {
                                let _ = tx.send(Ok(io)).await;
                            }
                            Err(e) => {
                                failures.inc();
                                tracing::debug!(%peer, error = %e, "gRPC TLS handshake failed");
                            }
                        }
                    });
                }
                Err(e) => tokio::select! {
                    () = backoff.pause_after(&e) => {}
                    _ = shutdown.wait() => return,
                },
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// How long gRPC connections may stay open once the replica is stopping: tonic's graceful stop
/// waits for every connection to close, and a client that stalls (SIGSTOP'd, or whose runtime
/// no longer runs) never closes its own; past this the rest are dropped.
const GRPC_DRAIN: std::time::Duration = std::time::Duration::from_secs(5);

/// Runs the gRPC server until it stops by itself, or until [`GRPC_DRAIN`] after `shutdown`.
async fn serve_grpc_until_drained<E: std::fmt::Display>(
    grpc: impl std::future::Future<Output = std::result::Result<(), E>>,
    shutdown: &Shutdown,
) {
    let drained = async {
        let _ = shutdown.wait().await;
        tokio::time::sleep(GRPC_DRAIN).await;
    };
    tokio::select! {
        r = grpc => if let Err(e) = r {
            tracing::error!(error = %e, "gRPC server failed");
        },
        () = drained => tracing::warn!(
            "gRPC connections still open {GRPC_DRAIN:?} after the stop began: closing them"
        ),
    }
}

/// A leader asked to stop hands its office to the most caught-up voter first
/// (`--leader-handover-timeout`), so a rolling upgrade keeps a leader throughout. A failed
/// hand-over only costs the cluster the election it would have held anyway.
async fn hand_over_before_stopping(node: &node::Node) {
    let timeout = node.settings.leader_handover_timeout;
    let obs = node.ops.gate.observed();
    if timeout.is_zero() || obs.state != openraft::ServerState::Leader {
        return;
    }
    let voters = node
        .ops
        .raft
        .metrics()
        .borrow()
        .membership_config
        .membership()
        .voter_ids()
        .count();
    if voters < 2 {
        return;
    }
    tracing::info!(
        term = obs.term,
        ?timeout,
        "stopping as leader: handing over first"
    );
    match crate::transfer::transfer(&node.ops, None, timeout).await {
        Ok(t) => tracing::info!(to = t.to, term = t.term, took = ?t.took, "handed over; stopping"),
        Err(e) => {
            tracing::warn!(error = %e, "no hand-over; stopping anyway (the others elect a leader)")
        }
    }
}

/// A replica ([`node::Node`]) with the listeners it serves on.
pub struct Replica {
    node: Arc<node::Node>,
    listeners: Listeners,
}

impl Replica {
    /// Binds the listeners, then opens storage and starts Raft.
    pub async fn start(settings: Settings) -> Result<Self> {
        let listeners = Listeners::bind(&settings).await?;
        if settings.single_replica {
            tracing::info!(
                grpc = %settings.listen,
                metrics = %settings.metrics_addr,
                http_metadata = ?settings.http_metadata_addr,
                data_dir = %settings.data_dir.display(),
                "no --id or --peers: a single-replica cluster (replica 1); `regolith members add` grows it"
            );
        }
        let node = node::Node::start(settings).await?;
        Ok(Self { node, listeners })
    }

    /// Serves until `shutdown` fires, then (a leader) hands its office over, stops Raft and
    /// flushes storage.
    pub async fn serve(self, shutdown: Shutdown) -> Result<()> {
        let Self { node, listeners } = self;
        // Everything below stops on `stopping`, which fires once a leader has handed over: the
        // hand-over needs the gRPC server (the new leader's vote request comes to it) and Raft.
        let (stop, stopping) = regolith_proto::shutdown::channel();
        let sigterm = shutdown.clone();
        tokio::spawn({
            let node = node.clone();
            async move {
                shutdown.wait().await;
                hand_over_before_stopping(&node).await;
                // After the hand-over (a follower now), with Raft and gRPC still serving.
                node.snapshot_before_stopping().await;
                stop.trigger();
            }
        });
        let shutdown = stopping;
        let settings = &node.settings;
        let check = TokenCheck::new(settings.token.clone());
        let max = settings.raft_max_message_bytes + 64 * 1024;
        let grants = Grants::new(settings.peer_token.as_deref(), settings.token.as_deref());
        if !grants.signs() {
            tracing::warn!("no cluster token and no peer credential: data-plane grants are not signed, so any peer may read or write any segment range");
        } else if settings.peer_token.is_none() {
            tracing::warn!("data-plane grants derive from the cluster token (no --peer-token-file): a token holder can forge them; see docs/security.md");
        }
        let metad = MetadServer::new(MetadService {
            ops: node.ops.clone(),
            grants,
            shutdown: shutdown.clone(),
            node_identity: settings.tls_node_identity,
        })
        .max_decoding_message_size(regolith_proto::client::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(regolith_proto::client::MAX_MESSAGE_BYTES);
        let raft = RaftServer::new(
            RaftService::new(node.ops.raft.clone(), node.ops.metrics.clone())
                .with_stopping(sigterm),
        )
        .max_decoding_message_size(max)
        .max_encoding_message_size(max);
        // The token is checked before a request body is read.
        let metad = crate::deadline::WithDeadline(InterceptedService::new(metad, check.clone()));
        if settings.peer_token.is_none() {
            tracing::warn!(
                "no --peer-token-file: Raft messages are accepted from any cluster-token holder (every sidecar and CLI user); see docs/security.md"
            );
        }
        let raft = InterceptedService::new(
            raft,
            PeerCheck::new(settings.token.clone(), settings.peer_token.clone()),
        );
        tracing::info!(addr = %settings.listen, id = node.ops.id, tls = settings.tls.is_some(), "gRPC listening");
        let incoming = grpc_incoming(
            listeners.grpc,
            settings.tls.clone(),
            HandshakeCounters {
                failures: node.ops.metrics.tls_handshake_failures.clone(),
                evicted: node
                    .ops
                    .metrics
                    .connections_refused
                    .with_label_values(&["grpc_tls_handshake"]),
            },
            shutdown.clone(),
        );
        let reloader = settings
            .tls
            .as_ref()
            .and_then(|t| t.spawn_reloader(shutdown.clone()));
        let sd = shutdown.clone();
        let grpc = tonic::transport::Server::builder()
            .tcp_nodelay(true)
            .add_service(metad)
            .add_service(raft)
            .serve_with_incoming_shutdown(incoming, async move {
                let _ = sd.wait().await;
            });
        let http = crate::http::serve_metrics(node.clone(), listeners.metrics, shutdown.clone());
        let kv = listeners
            .kv
            .map(|l| crate::http::serve_metadata_kv(node.clone(), l, shutdown.clone()));
        node.spawn_background(&shutdown);
        serve_grpc_until_drained(grpc, &shutdown).await;
        let _ = shutdown.wait().await;
        tracing::info!("shutting down: stopping raft");
        let _ = http.await;
        if let Some(kv) = kv {
            let _ = kv.await;
        }
        if let Some(r) = reloader {
            let _ = r.await;
        }
        node.stop().await;
        tracing::info!("stopped");
        Ok(())
    }
}
