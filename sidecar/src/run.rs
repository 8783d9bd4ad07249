//! The process entry point shared by `regolith-sidecar` and the test harnesses' thin binaries.
//!
//! Start-up order: identity, segment (allocated and pre-faulted), mount with the metad leader,
//! data plane on every NIC, heartbeats, HTTP, and only then the UDS socket (it appears once the
//! sidecar serves). SIGTERM: stop accepting clients, drain when asked, unmount, remove the
//! socket.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::args::{Args, Settings};
use crate::error::{Error, Result};
use crate::metrics::{Metrics, Observer};
use crate::node::{self, Sidecar};
use crate::ops::Store;
use crate::segment::{Segment, SegmentOptions};
use crate::tracker::{Tracker, TrackerAdmission};
use crate::transport::tcp::{ServerConfig, TcpConfig, TcpServer, TcpTransport};
use crate::transport::{DataClient, StripeConfig, TransportStats};
use crate::watch::NodeIndex;
use regolith_proto::daemon;
use regolith_proto::shutdown::Shutdown;

/// Logs on stderr; `-v` debug and `-vv` trace for the sidecar; `RUST_LOG` overrides.
pub const SHELL: daemon::Shell = daemon::Shell {
    name: "regolith-sidecar",
    log_levels: [
        "info",
        "info,regolith_sidecar=debug,regolith_proto=debug",
        "debug,regolith_sidecar=trace",
    ],
};

/// Starts everything and serves until `shutdown` fires.
pub async fn run(settings: Settings, shutdown: Shutdown) -> Result<()> {
    let hint = node::identity_hint(&settings)?;
    let segment = tokio::task::spawn_blocking({
        let (name, size, huge) = (
            settings.node_name.clone(),
            settings.segment_size,
            settings.huge_pages,
        );
        move || {
            Segment::create(
                &format!("segment-{name}"),
                size,
                &SegmentOptions {
                    huge_pages: huge,
                    prefault: true,
                    allocate: true,
                },
            )
        }
    })
    .await
    .map_err(|e| Error::Config(format!("segment task: {e}")))??;
    let segment = Arc::new(segment);
    tracing::info!(bytes = segment.len(), pages = ?segment.page_kind(), "segment ready");
    let data_addrs: Vec<String> = if segment.is_empty() {
        Vec::new()
    } else {
        settings
            .nics
            .iter()
            .map(|ip| std::net::SocketAddr::new(*ip, settings.data_port).to_string())
            .collect()
    };
    let (metad, hb_client) = node::metad_clients(&settings)?;
    let mounted = node::mount(&metad, &settings, hint, segment.len(), &data_addrs).await?;
    let (node_id, generation, term) = (mounted.node_id, mounted.generation, mounted.term);
    if node_id != hint {
        tracing::info!(node_id, "node id assigned by metad");
    }
    node::save_identity(&settings, node_id)?;
    tracing::info!(node = %settings.node_name, node_id, generation, "segment mounted");
    let metrics = Metrics::new();
    metrics.segment_bytes.set(segment.len() as i64);
    metrics.generation.set(generation as i64);
    let transport_stats = TransportStats::with_observer(Arc::new(Observer(metrics.clone())));
    let tracker = Tracker::new(generation);
    mounted.apply_to(&tracker);
    let token = settings.token.as_ref().map(|t| t.as_bytes().to_vec());
    let server = if !segment.is_empty() {
        let cfg = ServerConfig {
            listen: settings
                .nics
                .iter()
                .map(|ip| std::net::SocketAddr::new(*ip, settings.data_port))
                .collect(),
            node_id,
            token: token.clone(),
            tls: settings.tls.clone(),
            ..ServerConfig::default()
        };
        match TcpServer::start(
            cfg,
            segment.clone(),
            Arc::new(TrackerAdmission(tracker.clone())),
            transport_stats.clone(),
        )
        .await
        {
            Ok(s) => Some(s),
            Err(e) => {
                unmount_after_failure(&metad, node_id, generation).await;
                return Err(e);
            }
        }
    } else {
        None
    };
    let transport = TcpTransport::new(
        TcpConfig {
            node_id,
            token,
            tls: settings.tls.clone(),
            ..TcpConfig::default()
        },
        transport_stats.clone(),
    );
    let stripe = StripeConfig {
        local_nics: settings.nics.clone(),
        conns_per_nic_pair: settings.conns_per_nic_pair,
        slice_size: settings.slice_size,
        transfer_timeout: settings.transfer_timeout,
        ..StripeConfig::default()
    };
    let data = DataClient::new(transport, stripe, transport_stats.clone())?;
    let index = Arc::new(NodeIndex::new(settings.index, metrics.clone()));
    let store = Store::new(
        Arc::new(metad.clone()),
        node_id,
        segment,
        tracker,
        data,
        metrics.clone(),
    )
    .with_index(index.clone());
    let side = Arc::new(Sidecar {
        settings: settings.clone(),
        store: Arc::new(store),
        metad,
        hb_client,
        transport_stats,
        metrics,
        instance_id: rand::random(),
        data_addrs,
        segment_used: AtomicU64::new(0),
        leader: Mutex::new((term, 0)),
        clients: AtomicU64::new(0),
        next_conn: AtomicU64::new(1),
        shutting_down: AtomicBool::new(false),
        retired: AtomicBool::new(false),
        server: Mutex::new(server),
    });
    side.heartbeat_once().await;
    let tls_reloader = settings
        .tls
        .as_ref()
        .and_then(|t| t.spawn_reloader(shutdown.clone()));
    let hb = tokio::spawn(side.clone().heartbeat_loop(shutdown.clone()));
    let watch = tokio::spawn(crate::watch::run(
        index,
        side.metad.clone(),
        node_id,
        shutdown.clone(),
    ));
    let http = crate::http::serve(side.clone(), shutdown.clone()).await?;
    let listener = crate::uds::bind(&settings.socket, settings.socket_group.as_deref())?;
    tracing::info!(socket = %settings.socket.display(), "serving local clients");
    let uds = tokio::spawn(crate::uds::serve(side.clone(), listener, shutdown.clone()));
    let _ = shutdown.wait().await;
    side.shutting_down
        .store(true, std::sync::atomic::Ordering::Relaxed);
    tracing::info!("shutting down");
    let _ = std::fs::remove_file(&settings.socket);
    let _ = uds.await;
    side.leave().await;
    let _ = hb.await;
    let _ = watch.await;
    let server = side.server.lock().take();
    if let Some(s) = server {
        s.shutdown().await;
    }
    let _ = http.await;
    if let Some(r) = tls_reloader {
        let _ = r.await;
    }
    tracing::info!("stopped");
    Ok(())
}

async fn unmount_after_failure(
    metad: &regolith_proto::client::MetadClient,
    node_id: u64,
    generation: u64,
) {
    let req = regolith_proto::metad::UnmountSegmentRequest {
        node_id,
        generation,
    };
    let _ = tokio::time::timeout(Duration::from_secs(3), metad.unmount(req)).await;
}

/// Runs `regolith-sidecar` with these arguments (argv[0] included) until SIGTERM/SIGINT.
/// SIGTERM/SIGINT are caught from the start: [`run`] stops cleanly at any stage.
pub fn main_with_args(argv: Vec<String>) -> ExitCode {
    daemon::main(
        &SHELL,
        argv,
        Args::resolve,
        Settings::process,
        |settings| std::future::ready(Ok(settings)),
        run,
    )
}
