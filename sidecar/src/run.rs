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
use crate::handover;
use crate::metrics::{Metrics, Observer};
use crate::node::{self, Sidecar};
use crate::ops::Store;
use crate::segment::{Segment, SegmentOptions};
use crate::tracker::Tracker;
use crate::transport::rdma::{NodeTransport, RdmaConfig, RdmaNode};
use crate::transport::tcp::{TcpConfig, TcpTransport};
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

/// How this process got its segment: mounted a new generation, or took over the running
/// sidecar's (`--takeover`).
struct Start {
    segment: Arc<Segment>,
    node_id: u64,
    generation: u64,
    /// (term, leader id) known at start.
    leader: (u64, u64),
    segment_used: u64,
    data_addrs: Vec<String>,
    tracker: Arc<Tracker>,
    data: Vec<std::net::TcpListener>,
    /// Handed over (a fresh start binds them once the data plane serves).
    uds: Option<std::os::unix::net::UnixListener>,
    http: Option<std::net::TcpListener>,
    link: Option<handover::Link>,
}

async fn fresh(settings: &Settings, metad: &regolith_proto::client::MetadClient) -> Result<Start> {
    let hint = node::identity_hint(settings)?;
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
    let mounted = node::mount(metad, settings, hint, segment.len(), &data_addrs).await?;
    let (node_id, generation, term) = (mounted.node_id, mounted.generation, mounted.term);
    if node_id != hint {
        tracing::info!(node_id, "node id assigned by metad");
    }
    node::save_identity(settings, node_id)?;
    tracing::info!(node = %settings.node_name, node_id, generation, "segment mounted");
    let tracker = Tracker::new(generation);
    mounted.apply_to(&tracker);
    let mut data = Vec::new();
    if !segment.is_empty() {
        for ip in &settings.nics {
            let addr = std::net::SocketAddr::new(*ip, settings.data_port);
            match std::net::TcpListener::bind(addr) {
                Ok(l) => data.push(l),
                Err(source) => {
                    unmount_after_failure(metad, node_id, generation).await;
                    return Err(Error::Bind { addr, source });
                }
            }
        }
    }
    Ok(Start {
        segment,
        node_id,
        generation,
        leader: (term, 0),
        segment_used: 0,
        data_addrs,
        tracker,
        data,
        uds: None,
        http: None,
        link: None,
    })
}

/// The running sidecar's node, taken over (None: with `if_running`, no sidecar runs).
async fn taken(settings: &Settings, if_running: bool) -> Result<Option<Start>> {
    let Some(t) = handover::take_over(settings, if_running).await? else {
        return Ok(None);
    };
    let st = t.state;
    let refuse = |link: handover::Link, e: Error| async move {
        link.refuse(&e.to_string()).await;
        e
    };
    let key = match st.grant_key() {
        Ok(k) => k,
        Err(e) => return Err(refuse(t.link, e).await),
    };
    let tracker = Tracker::new(st.generation);
    tracker.set_grant_key(st.node_id, key);
    tracker.restore(&st.tracker);
    tracker.observe_term(st.metad_term);
    if let Err(e) = node::save_identity(settings, st.node_id) {
        return Err(refuse(t.link, e).await);
    }
    tracing::info!(
        node = %settings.node_name,
        node_id = st.node_id,
        generation = st.generation,
        reservations_held = st.tracker.held.len(),
        "segment taken over from the running sidecar (no remount)"
    );
    Ok(Some(Start {
        segment: Arc::new(t.segment),
        node_id: st.node_id,
        generation: st.generation,
        leader: (st.metad_term, st.leader_id),
        segment_used: st.segment_used,
        data_addrs: st.data_addrs,
        tracker,
        data: t.data,
        uds: Some(t.uds),
        http: Some(t.http),
        link: Some(t.link),
    }))
}

fn os(what: &'static str) -> impl Fn(std::io::Error) -> Error {
    move |source| Error::Os {
        what: what.into(),
        source,
    }
}

async fn accept(l: Option<&tokio::net::UnixListener>) -> std::io::Result<tokio::net::UnixStream> {
    match l {
        Some(l) => l.accept().await.map(|(s, _)| s),
        None => std::future::pending().await,
    }
}

/// How long a successor waits for its predecessor to let go of the disks (it exits at once
/// after the hand-over commits, or 3 s after at most).
const HANDOVER_DISK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Starts everything and serves until `shutdown` fires (or a successor took over).
pub async fn run(settings: Settings, shutdown: Shutdown) -> Result<()> {
    // Every task stops on `stop`: the process's shutdown, or a completed hand-over.
    let (stop_tx, stop) = regolith_proto::shutdown::channel();
    let stop_tx = Arc::new(stop_tx);
    {
        let (t, s) = (stop_tx.clone(), shutdown.clone());
        tokio::spawn(async move {
            s.wait().await;
            t.trigger();
        });
    }
    // Caught from the start, before systemd hears READY=1 (from this process or, for a
    // successor, its MAINPID=): a reload may follow at once, and SIGUSR2's default action
    // ends the process.
    let usr2 = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined2());
    // The transport first: `--transport rdma` without a usable port fails here, before the
    // node mounts (or takes over) anything.
    let rdma = RdmaNode::start(RdmaConfig {
        mode: settings.transport,
        devices: settings.rdma_devices.clone(),
        staging_bytes: settings.rdma_staging_bytes,
        max_slice: settings.slice_size,
        tls: settings.tls.is_some(),
    })?;
    let (metad, hb_client) = node::metad_clients(&settings)?;
    let taken_over = if settings.takeover || settings.takeover_if_running {
        taken(&settings, !settings.takeover).await?
    } else {
        None
    };
    let mut start = match taken_over {
        Some(start) => start,
        None => fresh(&settings, &metad).await?,
    };
    let (node_id, generation) = (start.node_id, start.generation);
    let segment = start.segment.clone();
    let metrics = Metrics::new();
    metrics.segment_bytes.set(segment.len() as i64);
    metrics.generation.set(generation as i64);
    let transport_stats = TransportStats::with_observer(Arc::new(Observer(metrics.clone())));
    let tracker = start.tracker.clone();
    let token = settings.token.as_ref().map(|t| t.as_bytes().to_vec());
    if !segment.is_empty() {
        if let Err(e) = rdma.attach_segment(&segment) {
            if rdma.cfg.mode == crate::transport::rdma::TransportMode::Rdma {
                if start.uds.is_none() {
                    unmount_after_failure(&metad, node_id, generation).await;
                }
                return Err(e);
            }
            tracing::warn!(error = %e, "the segment could not be registered for RDMA: peers read and write it over TCP");
        }
    }
    let transport = NodeTransport::new(
        TcpTransport::new(
            TcpConfig {
                node_id,
                token,
                tls: settings.tls.clone(),
                ..TcpConfig::default()
            },
            transport_stats.clone(),
        ),
        rdma.clone(),
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
    let took_over = start.link.is_some();
    if let Some(mut link) = start.link.take() {
        // From here on this process owns the node; the old one exits once the link closes,
        // after the supervisor has made this process the service's main one. It holds its
        // disks until it exits: they are opened after (docs/ssd.md "Hand-over").
        link.commit().await?;
        tracing::info!("hand-over committed: serving");
        tell_supervisor_main_pid().await;
        drop(link);
    }
    let disks = {
        let specs = settings.disks.clone();
        Arc::new(
            tokio::task::spawn_blocking(move || {
                if took_over {
                    crate::disk::Tier::open_after_predecessor(&specs, HANDOVER_DISK_WAIT)
                } else {
                    crate::disk::Tier::open(&specs)
                }
            })
            .await
            .map_err(|e| Error::Config(format!("opening the disks: {e}")))?,
        )
    };
    let (offload_tx, offload_rx) = tokio::sync::mpsc::unbounded_channel();
    let store = Store::new(
        Arc::new(metad.clone()),
        node_id,
        segment,
        tracker,
        data,
        metrics.clone(),
    )
    .with_index(index.clone())
    .with_disks(disks.clone());
    index.set_disks(disks.clone());
    let side = Arc::new(Sidecar {
        settings: settings.clone(),
        store: Arc::new(store),
        metad,
        hb_client,
        transport_stats,
        rdma,
        metrics,
        instance_id: rand::random(),
        data_addrs: start.data_addrs.clone(),
        segment_used: AtomicU64::new(start.segment_used),
        leader: Mutex::new(start.leader),
        clients: AtomicU64::new(0),
        next_conn: AtomicU64::new(1),
        shutting_down: AtomicBool::new(false),
        retired: AtomicBool::new(false),
        generation_lost: AtomicBool::new(false),
        server: Mutex::new(None),
        hb_gate: Arc::new(tokio::sync::Mutex::new(())),
        disks: disks.clone(),
        offload_tx,
    });
    let mut serving = handover::Serving::new(side.clone(), stop.clone());
    serving.listeners().data = std::mem::take(&mut start.data)
        .into_iter()
        .map(std::os::fd::OwnedFd::from)
        .collect();
    // Data plane first (placements may name this node as soon as it is mounted).
    if let Err(e) = serving.start_data() {
        if start.uds.is_none() {
            unmount_after_failure(&side.metad, node_id, generation).await;
        }
        return Err(e);
    }
    side.heartbeat_once().await;
    let tls_reloader = settings
        .tls
        .as_ref()
        .and_then(|t| t.spawn_reloader(stop.clone()));
    let hb = tokio::spawn(side.clone().heartbeat_loop(stop.clone()));
    let disk_upkeep = tokio::spawn(crate::offload::run(side.clone(), offload_rx, stop.clone()));
    let watch = tokio::spawn(crate::watch::run(
        index,
        side.metad.clone(),
        node_id,
        stop.clone(),
    ));
    let http_listener = match start.http.take() {
        Some(l) => l,
        None => crate::http::bind(settings.metrics_addr)?,
    };
    serving.listeners().http = Some(
        http_listener
            .try_clone()
            .map(std::os::fd::OwnedFd::from)
            .map_err(os("metrics listener"))?,
    );
    let http = crate::http::serve_on(side.clone(), http_listener, stop.clone())?;
    let uds_listener = match start.uds.take() {
        Some(l) => l,
        None => crate::uds::bind(&settings.socket, settings.socket_group.as_deref())?
            .into_std()
            .map_err(os("UDS listener"))?,
    };
    serving.listeners().uds = Some(std::os::fd::OwnedFd::from(uds_listener));
    serving.start_uds()?;
    tracing::info!(socket = %settings.socket.display(), "serving local clients");
    if !took_over {
        // A successor said READY=1 with its MAINPID= already.
        notify_supervisor("READY=1");
    }
    let upgrades = tokio::spawn(start_successor_on_sigusr2(usr2, stop.clone()));
    let ho = match handover::bind(&settings.handover_socket, took_over) {
        Ok(l) => Some(l),
        Err(e) => {
            tracing::error!(error = %e, "no hand-over socket: an upgrade of this sidecar will have to restart it (losing its cache)");
            None
        }
    };
    let handed = loop {
        let accepted = tokio::select! {
            _ = stop.wait() => break None,
            r = accept(ho.as_ref()) => r,
        };
        match accepted {
            Ok(conn) => match serving.hand_over(conn).await {
                Ok(Some(gate)) => break Some(gate),
                Ok(None) => {}
                Err(e) => tracing::warn!(error = %e, "hand-over refused"),
            },
            Err(e) => {
                tracing::warn!(error = %e, "hand-over socket: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    side.shutting_down
        .store(true, std::sync::atomic::Ordering::Relaxed);
    upgrades.abort();
    match handed {
        Some(gate) => {
            // The successor serves the same socket, listeners and generation: remove
            // nothing, unmount nothing.
            stop_tx.trigger();
            let _ = hb.await;
            drop(gate);
            if settings.after_handover == crate::args::AfterHandover::Wait {
                tracing::info!("handed over: idle until SIGTERM (--after-handover wait)");
                shutdown.wait().await;
            }
        }
        None => {
            tracing::info!("shutting down");
            notify_supervisor("STOPPING=1");
            let _ = std::fs::remove_file(&settings.socket);
            serving.stop_uds().await;
            side.leave().await;
            let _ = hb.await;
            serving.stop_data().await;
            if ho.is_some() {
                let _ = std::fs::remove_file(&settings.handover_socket);
            }
        }
    }
    let _ = watch.await;
    let _ = disk_upkeep.await;
    let _ = http.await;
    if let Some(r) = tls_reloader {
        let _ = r.await;
    }
    tracing::info!("stopped");
    Ok(())
}

/// Tells systemd (a `Type=notify` unit; nothing without `$NOTIFY_SOCKET`) about this process.
fn notify_supervisor(state: &str) {
    if let Err(e) = regolith_proto::sdnotify::notify(state) {
        tracing::warn!(error = %e, state, "sd_notify failed");
    }
}

/// A successor that took the node over becomes the service's main process before its
/// predecessor exits (`MAINPID=`, then a barrier: systemd has read it once this returns).
async fn tell_supervisor_main_pid() {
    let msg = format!("MAINPID={}\nREADY=1", std::process::id());
    let res = tokio::task::spawn_blocking(move || {
        regolith_proto::sdnotify::notify(&msg)?;
        regolith_proto::sdnotify::barrier(handover::SUPERVISOR_TIMEOUT)
    })
    .await;
    match res {
        Ok(Ok(true)) => tracing::info!("systemd knows this process as the service's main one"),
        Ok(Ok(false)) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "MAINPID notification not confirmed"),
        Err(e) => tracing::warn!(error = %e, "MAINPID notification"),
    }
}

/// `SIGUSR2` (systemd's `ExecReload`) starts a successor that takes this sidecar over
/// ([`handover::spawn_successor`]); one at a time. The successor's exit status is logged.
async fn start_successor_on_sigusr2(
    usr2: std::io::Result<tokio::signal::unix::Signal>,
    stop: Shutdown,
) {
    let mut usr2 = match usr2 {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "no SIGUSR2 handler: upgrades need a --takeover started by hand");
            return;
        }
    };
    loop {
        tokio::select! {
            _ = stop.wait() => return,
            r = usr2.recv() => if r.is_none() { return },
        }
        let mut child = match handover::spawn_successor() {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "SIGUSR2: no successor started");
                continue;
            }
        };
        tracing::info!(pid = ?child.id(), "SIGUSR2: successor started; it takes this sidecar over");
        // Reaped here while this process lives; a successor that took over outlives it.
        tokio::select! {
            _ = stop.wait() => return,
            st = child.wait() => match st {
                Ok(st) => tracing::warn!(status = %st, "the successor exited: this sidecar serves on"),
                Err(e) => tracing::warn!(error = %e, "waiting for the successor"),
            },
        }
    }
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
