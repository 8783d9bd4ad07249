//! Sidecar upgrades that keep the cache (issue 16 item 6): the running sidecar hands its
//! segment memfd, its listening sockets and its state to a successor process over a Unix socket
//! (SCM_RIGHTS), as zero-downtime proxies hand over listeners; the successor continues the
//! **same** generation without remounting, so the node's objects stay readable.
//!
//! The running sidecar listens on `--handover-socket` (mode 0600; a peer of another uid is
//! refused, `SO_PEERCRED`). A successor started with `--takeover` connects, and:
//!
//! 1. successor → `HELLO` (its node name). Checked before anything changes: a wrong magic,
//!    version, length, node name or a silent peer (2 s) is refused, and the running sidecar
//!    serves on untouched.
//! 2. The running sidecar stops accepting (the listeners stay open: connections queue in their
//!    backlog, none is refused), closes its client sessions once their requests in progress
//!    are answered (clients see the socket close and say hello again: same memfd), closes its
//!    data-plane connections (peers retry on a new connection), and stops heartbeating.
//! 3. running → `STATE` with the descriptors `[segment memfd, UDS listener, HTTP listener,
//!    data-plane listener per NIC]` and a JSON [`State`]: identity, generation, grant key,
//!    terms, and the reservations the tracker knows ([`TrackerState`]).
//! 4. successor: maps the memfd, checks everything against its own flags, builds its state,
//!    → `READY` (or `REFUSE` with the reason, and exits with an error).
//! 5. running → `COMMIT`; the successor tells its supervisor it is the main process now
//!    (systemd's `MAINPID=`, [`regolith_proto::sdnotify`]) and closes the connection; the
//!    running sidecar exits 0 on that close (or 3 s after `COMMIT`) **without unmounting**.
//!    The successor heartbeats at once (well inside metad's `node_ttl`), then serves the
//!    listeners it was handed.
//!
//! `SIGUSR2` (systemd: `systemctl reload regolith-sidecar`) makes the running sidecar start its
//! successor itself ([`spawn_successor`]): the binary at the path it was started from (the new
//! one, after a package upgrade) with its own arguments plus `--takeover`, in its own cgroup,
//! so that the service manager can adopt it.
//!
//! If anything fails before `COMMIT` is written (a refusal, a successor that dies or stalls,
//! garbage), the running sidecar serves again as before: same segment, same generation,
//! listeners back in its accept loops, heartbeats resumed. Every message is
//! `magic "RGHO" | u16 version | u16 kind | u32 length | body`, little-endian; lengths are
//! capped per kind before anything is allocated.
//!
//! Reservations in flight (design §3 invariant 4, §4): the client sessions and data-plane
//! connections are closed before the state is taken, so no slice is in progress in the old
//! process when it is. A local client that had reserved and was still copying when its
//! session closed cannot be seen; its reservation is aborted with metad as for any client
//! that leaves mid-put, and it is handed over as *held*: the successor reports it in flight
//! and refuses to report it released for [`crate::tracker::HOLD`] (40 s), so its extents
//! cannot be reused under a copy still running. Slices arriving in the successor for a
//! reservation of the old process are admitted under the same rules as before (generation,
//! grant, term, fence), since the generation, grant key, highest term and fences are handed
//! over; a put whose slices or commit failed in the switch fails to its writer, which retries
//! with a fresh reservation.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use regolith_proto::fdpass;
use regolith_proto::grant::NodeKey;
use regolith_proto::shutdown::{self, Shutdown, ShutdownTrigger};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;
use tokio::net::{UnixListener, UnixStream};
use tokio::task::JoinHandle;

use crate::args::Settings;
use crate::error::{Error, Result};
use crate::node::Sidecar;
use crate::segment::{MapOptions, Segment};
use crate::tracker::{TrackerAdmission, TrackerState};
use crate::transport::tcp::{ServerConfig, TcpServer};

pub const MAGIC: [u8; 4] = *b"RGHO";
/// Version of the hand-over protocol; a successor of another version is refused.
pub const VERSION: u16 = 1;
pub const HEADER_LEN: usize = 12;
/// Largest body of a `HELLO`, `READY`, `COMMIT` or `REFUSE`.
pub const MAX_SMALL: u32 = 4096;
/// Largest `STATE` body (the reservations in flight dominate it).
pub const MAX_STATE: u32 = 16 << 20;
/// How long a connecting peer has to send its `HELLO`.
const HELLO_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the successor has, once it has the state, to answer `READY` (mapping the memfd
/// and checking its flags take milliseconds; heartbeats are stopped meanwhile and metad's
/// node TTL is 10 s).
const READY_TIMEOUT: Duration = Duration::from_secs(4);
/// How long the old process waits, once it has committed, for the successor to let it go
/// (the successor's supervisor notification, [`SUPERVISOR_TIMEOUT`], fits inside it).
const RELEASE_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a successor waits for systemd to confirm `MAINPID=`.
pub const SUPERVISOR_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the old process waits for its data-plane connections to close.
const DATA_DRAIN: Duration = Duration::from_secs(3);
/// How long the successor waits for the state (the old process finishes the requests in
/// progress first, up to the UDS session drain of 10 s) and then for `COMMIT`.
const STATE_TIMEOUT: Duration = Duration::from_secs(20);
const COMMIT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Hello = 1,
    State = 2,
    Ready = 3,
    Commit = 4,
    Refuse = 5,
}

impl Kind {
    fn from_u16(v: u16) -> Option<Self> {
        Some(match v {
            1 => Kind::Hello,
            2 => Kind::State,
            3 => Kind::Ready,
            4 => Kind::Commit,
            5 => Kind::Refuse,
            _ => return None,
        })
    }

    fn max_len(self) -> u32 {
        match self {
            Kind::State => MAX_STATE,
            _ => MAX_SMALL,
        }
    }
}

fn err(msg: impl Into<String>) -> Error {
    Error::Handover(msg.into())
}

/// One message's bytes.
pub fn encode(kind: Kind, body: &[u8]) -> Result<Vec<u8>> {
    let len = u32::try_from(body.len())
        .ok()
        .filter(|l| *l <= kind.max_len())
        .ok_or_else(|| err(format!("{kind:?} of {} bytes is too large", body.len())))?;
    let mut v = Vec::with_capacity(HEADER_LEN + body.len());
    v.extend_from_slice(&MAGIC);
    v.extend_from_slice(&VERSION.to_le_bytes());
    v.extend_from_slice(&(kind as u16).to_le_bytes());
    v.extend_from_slice(&len.to_le_bytes());
    v.extend_from_slice(body);
    Ok(v)
}

/// Checks a header: magic, version, a known kind, a length within that kind's cap.
pub fn parse_header(h: &[u8; HEADER_LEN]) -> Result<(Kind, u32)> {
    if h[..4] != MAGIC {
        return Err(err(
            "the peer does not speak the hand-over protocol (bad magic)",
        ));
    }
    let version = u16::from_le_bytes([h[4], h[5]]);
    if version != VERSION {
        return Err(err(format!(
            "hand-over protocol version {version} (this sidecar speaks {VERSION})"
        )));
    }
    let kind = u16::from_le_bytes([h[6], h[7]]);
    let kind = Kind::from_u16(kind).ok_or_else(|| err(format!("unknown message kind {kind}")))?;
    let len = u32::from_le_bytes([h[8], h[9], h[10], h[11]]);
    if len > kind.max_len() {
        return Err(err(format!(
            "{kind:?} of {len} bytes announced (at most {})",
            kind.max_len()
        )));
    }
    Ok((kind, len))
}

/// What the successor says first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hello {
    pub node_name: String,
    pub pid: u32,
}

/// Why a peer gave up.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refuse {
    pub reason: String,
}

/// Everything the successor needs to continue the same generation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    pub node_name: String,
    pub node_id: u64,
    pub generation: u64,
    pub segment_size: u64,
    /// Data-plane addresses, in the order of the data-plane descriptors.
    pub data_addrs: Vec<String>,
    /// The key this generation checks data-plane grants with, hex (none: metad signs none).
    pub grant_key: Option<String>,
    /// (term, leader id) of the last heartbeat reply.
    pub metad_term: u64,
    pub leader_id: u64,
    pub segment_used: u64,
    pub tracker: TrackerState,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| s.get(i..i + 2).and_then(|p| u8::from_str_radix(p, 16).ok()))
        .collect()
}

impl State {
    pub fn grant_key(&self) -> Result<Option<NodeKey>> {
        match &self.grant_key {
            None => Ok(None),
            Some(h) => unhex(h)
                .and_then(|b| NodeKey::from_bytes(&b))
                .map(Some)
                .ok_or_else(|| err("the state's grant key is malformed")),
        }
    }
}

async fn read_exact(sock: &mut UnixStream, buf: &mut [u8], what: &str) -> Result<()> {
    sock.read_exact(buf)
        .await
        .map(|_| ())
        .map_err(|e| err(format!("reading {what}: {e}")))
}

async fn write(sock: &UnixStream, bytes: &[u8], what: &str) -> Result<()> {
    fdpass::write_all_async(sock, bytes)
        .await
        .map_err(|e| err(format!("sending {what}: {e}")))
}

/// Reads one message without descriptors: its kind and body.
async fn read_msg(sock: &mut UnixStream) -> Result<(Kind, Vec<u8>)> {
    let mut h = [0u8; HEADER_LEN];
    read_exact(sock, &mut h, "a message header").await?;
    let (kind, len) = parse_header(&h)?;
    let mut body = vec![0u8; len as usize];
    read_exact(sock, &mut body, "a message body").await?;
    Ok((kind, body))
}

fn decode<T: serde::de::DeserializeOwned>(kind: Kind, body: &[u8]) -> Result<T> {
    serde_json::from_slice(body).map_err(|e| err(format!("undecodable {kind:?}: {e}")))
}

fn refusal(kind: Kind, body: &[u8], from: &str) -> Error {
    if kind == Kind::Refuse {
        let reason = serde_json::from_slice::<Refuse>(body)
            .map(|r| r.reason)
            .unwrap_or_else(|_| "(no reason given)".into());
        err(format!("{from} refused: {reason}"))
    } else {
        err(format!("{from} sent {kind:?} out of turn"))
    }
}

async fn send_refuse(sock: &UnixStream, reason: &str) {
    let body = serde_json::to_vec(&Refuse {
        reason: reason.chars().take(2000).collect(),
    })
    .unwrap_or_default();
    if let Ok(m) = encode(Kind::Refuse, &body) {
        let _ = tokio::time::timeout(Duration::from_secs(1), write(sock, &m, "a refusal")).await;
    }
}

/// The peer must run as this process's user.
fn check_peer(sock: &UnixStream) -> Result<()> {
    let cred = sock
        .peer_cred()
        .map_err(|e| err(format!("SO_PEERCRED: {e}")))?;
    let me = nix::unistd::geteuid().as_raw();
    if cred.uid() != me {
        return Err(err(format!(
            "peer runs as uid {} (pid {:?}), this sidecar as uid {me}: refused",
            cred.uid(),
            cred.pid()
        )));
    }
    Ok(())
}

/// Duplicates of the listening sockets, kept by the serving process so that its accept loops
/// can stop (and start again) without ever closing a listener, and handed to a successor.
#[derive(Default)]
pub struct Listeners {
    pub uds: Option<OwnedFd>,
    pub http: Option<OwnedFd>,
    /// One per NIC, in the order of the sidecar's data addresses (none on a consumer node).
    pub data: Vec<OwnedFd>,
}

fn dup(fd: &OwnedFd) -> Result<OwnedFd> {
    fd.try_clone().map_err(|source| Error::Os {
        what: "dup of a listener".into(),
        source,
    })
}

/// A [`Shutdown`] that fires when `outer` does or when its trigger is pulled.
fn child_of(outer: &Shutdown) -> (Arc<ShutdownTrigger>, Shutdown) {
    let (tx, rx) = shutdown::channel();
    let tx = Arc::new(tx);
    let (t, o, mine) = (tx.clone(), outer.clone(), rx.clone());
    tokio::spawn(async move {
        tokio::select! {
            _ = o.wait() => t.trigger(),
            _ = mine.wait() => {}
        }
    });
    (tx, rx)
}

/// The serving half of a running sidecar that a hand-over stops and, when it fails, starts
/// again: the UDS accept loop and its sessions, and the data-plane server.
pub struct Serving {
    side: Arc<Sidecar>,
    listeners: Listeners,
    stop: Shutdown,
    uds: Option<(Arc<ShutdownTrigger>, JoinHandle<()>)>,
}

impl Serving {
    pub fn new(side: Arc<Sidecar>, stop: Shutdown) -> Self {
        Self {
            side,
            listeners: Listeners::default(),
            stop,
            uds: None,
        }
    }

    /// The listeners served (and handed over); kept open by this process until it exits.
    pub fn listeners(&mut self) -> &mut Listeners {
        &mut self.listeners
    }

    /// Serves the data plane on (duplicates of) the data listeners.
    pub fn start_data(&self) -> Result<()> {
        if self.listeners.data.is_empty() {
            return Ok(());
        }
        let mut ls = Vec::new();
        for fd in &self.listeners.data {
            ls.push(std::net::TcpListener::from(dup(fd)?));
        }
        let side = &self.side;
        let cfg = ServerConfig {
            node_id: side.node_id(),
            token: side.settings.token.as_ref().map(|t| t.as_bytes().to_vec()),
            tls: side.settings.tls.clone(),
            rdma: side.rdma.server(),
            ..ServerConfig::default()
        };
        let server = TcpServer::start_on(
            cfg,
            ls,
            side.store.segment.clone(),
            Arc::new(TrackerAdmission(side.store.tracker.clone())),
            side.transport_stats.clone(),
        )?;
        *side.server.lock() = Some(server);
        Ok(())
    }

    /// Serves local clients on (a duplicate of) the UDS listener.
    pub fn start_uds(&mut self) -> Result<()> {
        let fd = self
            .listeners
            .uds
            .as_ref()
            .ok_or_else(|| err("no UDS listener"))?;
        let l = std::os::unix::net::UnixListener::from(dup(fd)?);
        let io = |source| Error::Os {
            what: "UDS listener".into(),
            source,
        };
        l.set_nonblocking(true).map_err(io)?;
        let l = UnixListener::from_std(l).map_err(io)?;
        let (trigger, epoch) = child_of(&self.stop);
        let task = tokio::spawn(crate::uds::serve(self.side.clone(), l, epoch));
        self.uds = Some((trigger, task));
        Ok(())
    }

    /// Stops the UDS accept loop and waits for its sessions (bounded by the session drain).
    pub async fn stop_uds(&mut self) {
        if let Some((trigger, task)) = self.uds.take() {
            trigger.trigger();
            let _ = task.await;
        }
    }

    /// Stops the data-plane server; returns whether every connection closed in time.
    pub async fn stop_data(&self) -> bool {
        let server = self.side.server.lock().take();
        match server {
            Some(s) => s.shutdown_and_drain(DATA_DRAIN).await,
            None => true,
        }
    }

    async fn resume(&mut self) {
        let side = &self.side;
        side.store.tracker.set_hold_closing(false);
        if side.server.lock().is_none() {
            if let Err(e) = self.start_data() {
                tracing::error!(error = %e, "hand-over failed and the data plane could not serve again");
            }
        }
        if self.uds.is_none() {
            if let Err(e) = self.start_uds() {
                tracing::error!(error = %e, "hand-over failed and the socket could not serve again");
            }
        }
    }

    /// Serves one connection of the hand-over socket. `Ok(Some(gate))`: the successor has
    /// everything and was told to go: stop (without unmounting), holding `gate` (the heartbeat
    /// gate) until the heartbeat loop is gone. `Ok(None)`/`Err`: nothing was handed over and
    /// this process serves on as before.
    pub async fn hand_over(
        &mut self,
        mut sock: UnixStream,
    ) -> Result<Option<tokio::sync::OwnedMutexGuard<()>>> {
        check_peer(&sock)?;
        let hello = match tokio::time::timeout(HELLO_TIMEOUT, read_msg(&mut sock)).await {
            Err(_) => return Err(err("no HELLO within 2 s")),
            Ok(Err(e)) => return Err(e),
            Ok(Ok((Kind::Hello, body))) => decode::<Hello>(Kind::Hello, &body)?,
            Ok(Ok((k, b))) => return Err(refusal(k, &b, "the successor")),
        };
        if let Err(reason) = self.preconditions(&hello) {
            send_refuse(&sock, &reason).await;
            return Err(err(reason));
        }
        tracing::warn!(
            pid = hello.pid,
            "handing this sidecar over to a successor process"
        );
        // From here on a failure serves again.
        match self.hand_over_paused(&mut sock).await {
            Ok(gate) => Ok(Some(gate)),
            Err(e) => {
                tracing::error!(error = %e, "hand-over failed: serving again as before");
                send_refuse(&sock, &e.to_string()).await;
                self.resume().await;
                Err(e)
            }
        }
    }

    fn preconditions(&self, hello: &Hello) -> std::result::Result<(), String> {
        let side = &self.side;
        if hello.node_name != side.settings.node_name {
            return Err(format!(
                "the successor is node {:?}, this sidecar is {:?}",
                hello.node_name, side.settings.node_name
            ));
        }
        if side.store.segment.is_empty() {
            return Err("a consumer-only sidecar holds no cache to hand over: restart it".into());
        }
        if side.retired.load(Ordering::Acquire) {
            return Err(
                "this segment was drained and unmounted: restart the sidecar instead".into(),
            );
        }
        if side.shutting_down.load(Ordering::Acquire) {
            return Err("this sidecar is shutting down".into());
        }
        if 3 + self.listeners.data.len() > fdpass::MAX_FDS {
            return Err(format!(
                "{} NICs: a hand-over carries at most {} data-plane listeners",
                self.listeners.data.len(),
                fdpass::MAX_FDS - 3
            ));
        }
        if self.uds.is_none() || side.server.lock().is_none() {
            return Err("this sidecar is not serving (a hand-over is under way?)".into());
        }
        Ok(())
    }

    async fn hand_over_paused(
        &mut self,
        sock: &mut UnixStream,
    ) -> Result<tokio::sync::OwnedMutexGuard<()>> {
        let side = self.side.clone();
        side.store.tracker.set_hold_closing(true);
        self.stop_uds().await;
        if !self.stop_data().await {
            tracing::warn!(
                "data-plane connections still closing: their reservations are handed over as held"
            );
        }
        let gate = side.hb_gate.clone().lock_owned().await;
        let (term, leader) = *side.leader.lock();
        let state = State {
            node_name: side.settings.node_name.clone(),
            node_id: side.node_id(),
            generation: side.store.tracker.generation(),
            segment_size: side.store.segment.len(),
            data_addrs: side.data_addrs.clone(),
            grant_key: side
                .store
                .tracker
                .grant_key()
                .map(|(_, k)| hex(k.as_bytes())),
            metad_term: term,
            leader_id: leader,
            segment_used: side.segment_used.load(Ordering::Relaxed),
            tracker: side.store.tracker.snapshot(),
        };
        let body = serde_json::to_vec(&state).map_err(|e| err(format!("encoding: {e}")))?;
        let msg = encode(Kind::State, &body)?;
        let (Some(uds), Some(http)) = (&self.listeners.uds, &self.listeners.http) else {
            return Err(err("listeners missing"));
        };
        let mut fds: Vec<BorrowedFd<'_>> = vec![side.store.segment.fd(), uds.as_fd(), http.as_fd()];
        fds.extend(self.listeners.data.iter().map(|f| f.as_fd()));
        // The descriptors ride on the header; the body follows as plain bytes.
        let (head, rest) = msg.split_at(HEADER_LEN);
        let send = async {
            fdpass::send_fds_async(sock, head, &fds)
                .await
                .map_err(|e| err(format!("sending the descriptors: {e}")))?;
            write(sock, rest, "the state").await
        };
        tokio::time::timeout(READY_TIMEOUT, send)
            .await
            .map_err(|_| err("the successor does not read the state"))??;
        match tokio::time::timeout(READY_TIMEOUT, read_msg(sock)).await {
            Err(_) => return Err(err("the successor did not answer READY within 4 s")),
            Ok(Err(e)) => return Err(e),
            Ok(Ok((Kind::Ready, _))) => {}
            Ok(Ok((k, b))) => return Err(refusal(k, &b, "the successor")),
        }
        write(sock, &encode(Kind::Commit, b"{}")?, "COMMIT").await?;
        // The successor closes its end once its supervisor knows it (systemd: `MAINPID=`,
        // confirmed by a barrier); exiting before that would end a `Type=notify` unit.
        let mut byte = [0u8; 1];
        let _ = tokio::time::timeout(RELEASE_TIMEOUT, sock.read(&mut byte)).await;
        tracing::warn!(
            generation = state.generation,
            "handed over to the successor: exiting without unmounting"
        );
        Ok(gate)
    }
}

/// What a successor was handed, checked against its own flags.
pub struct Taken {
    pub state: State,
    pub segment: Segment,
    pub uds: std::os::unix::net::UnixListener,
    pub http: std::net::TcpListener,
    pub data: Vec<std::net::TcpListener>,
    /// The connection to the running sidecar, to commit or refuse on.
    pub link: Link,
}

/// The successor's end of the hand-over connection.
pub struct Link {
    sock: UnixStream,
}

/// Connects to the running sidecar on `--handover-socket` and takes its segment, listeners
/// and state. Nothing is served yet: [`Taken::commit`] says when.
/// With `if_running`, `Ok(None)` when no sidecar listens there (no socket file, or one nobody
/// accepts on: a predecessor that died).
pub async fn take_over(settings: &Settings, if_running: bool) -> Result<Option<Taken>> {
    let path = &settings.handover_socket;
    let connected = tokio::time::timeout(Duration::from_secs(5), UnixStream::connect(path))
        .await
        .map_err(|_| err(format!("connecting to {}: timed out", path.display())))?;
    let mut sock = match connected {
        Ok(s) => s,
        Err(e)
            if if_running
                && matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
                ) =>
        {
            tracing::info!(socket = %path.display(), "no running sidecar to take over: mounting");
            return Ok(None);
        }
        Err(e) => {
            return Err(err(format!(
                "no running sidecar to take over at {} ({e}); start without --takeover",
                path.display()
            )))
        }
    };
    check_peer(&sock)?;
    let hello = serde_json::to_vec(&Hello {
        node_name: settings.node_name.clone(),
        pid: std::process::id(),
    })
    .map_err(|e| err(format!("encoding: {e}")))?;
    write(&sock, &encode(Kind::Hello, &hello)?, "HELLO").await?;
    let received = tokio::time::timeout(STATE_TIMEOUT, receive_state(&mut sock))
        .await
        .map_err(|_| err("no state from the running sidecar within 20 s"))?;
    let (state, fds) = received?;
    match check(settings, state, fds) {
        Ok((state, segment, uds, http, data)) => Ok(Some(Taken {
            state,
            segment,
            uds,
            http,
            data,
            link: Link { sock },
        })),
        Err(e) => {
            send_refuse(&sock, &e.to_string()).await;
            Err(e)
        }
    }
}

async fn receive_state(sock: &mut UnixStream) -> Result<(State, Vec<OwnedFd>)> {
    let mut h = [0u8; HEADER_LEN];
    let (n, fds) = fdpass::recv_fds_async(sock, &mut h, fdpass::MAX_FDS)
        .await
        .map_err(|e| err(format!("receiving the state: {e}")))?;
    if n < HEADER_LEN {
        read_exact(sock, &mut h[n..], "the state header").await?;
    }
    let (kind, len) = parse_header(&h)?;
    let mut body = vec![0u8; len as usize];
    read_exact(sock, &mut body, "the state").await?;
    if kind != Kind::State {
        return Err(refusal(kind, &body, "the running sidecar"));
    }
    Ok((decode::<State>(kind, &body)?, fds))
}

type Checked = (
    State,
    Segment,
    std::os::unix::net::UnixListener,
    std::net::TcpListener,
    Vec<std::net::TcpListener>,
);

fn check(settings: &Settings, state: State, fds: Vec<OwnedFd>) -> Result<Checked> {
    if state.node_name != settings.node_name {
        return Err(err(format!(
            "the running sidecar is node {:?}, this one {:?}",
            state.node_name, settings.node_name
        )));
    }
    if state.segment_size != settings.segment_size {
        return Err(err(format!(
            "--segment-size {} differs from the running sidecar's {} (a hand-over keeps the segment: give the same size)",
            settings.segment_size, state.segment_size
        )));
    }
    let want: Vec<String> = settings
        .nics
        .iter()
        .map(|ip| std::net::SocketAddr::new(*ip, settings.data_port).to_string())
        .collect();
    if state.data_addrs != want {
        return Err(err(format!(
            "data-plane addresses {want:?} differ from the running sidecar's {:?} (same --nic and --data-port needed)",
            state.data_addrs
        )));
    }
    state.grant_key()?;
    if fds.len() != 3 + state.data_addrs.len() {
        return Err(err(format!(
            "{} descriptors received, {} expected",
            fds.len(),
            3 + state.data_addrs.len()
        )));
    }
    let mut fds = fds.into_iter();
    let mut next = || fds.next().ok_or_else(|| err("descriptor missing"));
    let segment = Segment::from_fd(
        &format!("segment-{}", settings.node_name),
        next()?,
        &MapOptions {
            prefault: false,
            // Our own predecessor's memfd (same uid, checked): the seal is not what protects it.
            require_shrink_seal: false,
        },
    )?;
    if segment.len() != state.segment_size {
        return Err(err(format!(
            "the memfd holds {} bytes, the state says {}",
            segment.len(),
            state.segment_size
        )));
    }
    let io = |what: &str, e: std::io::Error| err(format!("{what}: {e}"));
    let uds = std::os::unix::net::UnixListener::from(next()?);
    let path = uds
        .local_addr()
        .map_err(|e| io("the UDS listener", e))?
        .as_pathname()
        .map(|p| p.to_path_buf());
    if path.as_deref() != Some(settings.socket.as_path()) {
        return Err(err(format!(
            "the running sidecar serves the socket {path:?}, this one is given {} (same --socket needed)",
            settings.socket.display()
        )));
    }
    let http = std::net::TcpListener::from(next()?);
    let addr = http.local_addr().map_err(|e| io("the HTTP listener", e))?;
    if addr != settings.metrics_addr {
        return Err(err(format!(
            "the running sidecar serves HTTP on {addr}, this one is given {} (same --metrics-addr needed)",
            settings.metrics_addr
        )));
    }
    let mut data = Vec::new();
    for want in &state.data_addrs {
        let l = std::net::TcpListener::from(next()?);
        let got = l.local_addr().map_err(|e| io("a data-plane listener", e))?;
        if got.to_string() != *want {
            return Err(err(format!(
                "data-plane listener on {got}, expected {want}"
            )));
        }
        data.push(l);
    }
    Ok((state, segment, uds, http, data))
}

impl Link {
    /// Tells the running sidecar this process is ready, and waits for its go: once this
    /// returns Ok this process owns the node and must serve at once; the old process exits
    /// when the link is dropped (or a few seconds after the go).
    pub async fn commit(&mut self) -> Result<()> {
        write(&self.sock, &encode(Kind::Ready, b"{}")?, "READY").await?;
        match tokio::time::timeout(COMMIT_TIMEOUT, read_msg(&mut self.sock)).await {
            Err(_) => Err(err("no COMMIT from the running sidecar within 10 s")),
            Ok(Err(e)) => Err(e),
            Ok(Ok((Kind::Commit, _))) => Ok(()),
            Ok(Ok((k, b))) => Err(refusal(k, &b, "the running sidecar")),
        }
    }

    /// Tells the running sidecar why this process gives up (it serves on).
    pub async fn refuse(self, reason: &str) {
        send_refuse(&self.sock, reason).await;
    }
}

/// The successor `SIGUSR2` starts: the program this process was started as (`argv[0]` when it
/// names a path, which after a package upgrade is the new binary; else this executable), its
/// arguments plus `--takeover`, its environment (`NOTIFY_SOCKET` included) and its stdout and
/// stderr. The caller reaps it.
pub fn spawn_successor() -> Result<tokio::process::Child> {
    let mut argv = std::env::args_os();
    let arg0 = argv.next().unwrap_or_default();
    let program = if arg0.as_encoded_bytes().contains(&b'/') {
        std::path::PathBuf::from(arg0)
    } else {
        let exe = std::env::current_exe().map_err(|e| err(format!("this executable: {e}")))?;
        // A replaced binary reads as "PATH (deleted)": the new one is at PATH.
        let s = exe.to_string_lossy();
        std::path::PathBuf::from(s.strip_suffix(" (deleted)").unwrap_or(&s).to_string())
    };
    let mut args: Vec<std::ffi::OsString> = argv.collect();
    if !args.iter().any(|a| a == "--takeover") {
        args.push("--takeover".into());
    }
    tokio::process::Command::new(&program)
        .args(&args)
        .stdin(std::process::Stdio::null())
        .spawn()
        .map_err(|e| err(format!("starting the successor {}: {e}", program.display())))
}

/// Binds the hand-over socket (mode 0600; a stale file is replaced, a live one is an error
/// unless `replace` says this process took over from the one listening there).
pub fn bind(path: &std::path::Path, replace: bool) -> Result<UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    let serr = |reason: String| Error::Socket {
        path: path.display().to_string(),
        reason,
    };
    if !replace && std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(serr("another sidecar offers a hand-over here".into()));
    }
    if path.exists() {
        std::fs::remove_file(path)
            .map_err(|e| serr(format!("cannot remove the stale file: {e}")))?;
    }
    // The daemon's umask (0077) makes it owner-only at bind already.
    let l = UnixListener::bind(path).map_err(|e| serr(format!("bind: {e}")))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| serr(format!("chmod 0600: {e}")))?;
    Ok(l)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_garbage_is_an_error_never_a_panic() {
        let body = b"{\"node_name\":\"a\",\"pid\":1}";
        let m = encode(Kind::Hello, body).unwrap();
        let h: [u8; HEADER_LEN] = m[..HEADER_LEN].try_into().unwrap();
        assert_eq!(parse_header(&h).unwrap(), (Kind::Hello, body.len() as u32));
        let hello: Hello = decode(Kind::Hello, &m[HEADER_LEN..]).unwrap();
        assert_eq!(hello.node_name, "a");

        let mut bad = h;
        bad[0] = b'X';
        assert!(parse_header(&bad)
            .unwrap_err()
            .to_string()
            .contains("magic"));
        let mut bad = h;
        bad[4] = 9;
        assert!(parse_header(&bad)
            .unwrap_err()
            .to_string()
            .contains("version"));
        let mut bad = h;
        bad[6] = 77;
        assert!(parse_header(&bad).unwrap_err().to_string().contains("kind"));
        let mut bad = h;
        bad[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(parse_header(&bad)
            .unwrap_err()
            .to_string()
            .contains("at most"));
        assert!(encode(Kind::Ready, &vec![0u8; MAX_SMALL as usize + 1]).is_err());
        assert!(decode::<Hello>(Kind::Hello, b"\xff\x00garbage").is_err());
        assert!(decode::<State>(Kind::State, b"{\"node_name\":1}").is_err());
        for _ in 0..2000 {
            let h: [u8; HEADER_LEN] = rand::random();
            let _ = parse_header(&h);
        }
    }

    #[test]
    fn grant_keys_travel_as_hex() {
        let key = regolith_proto::grant::MasterKey::from_secret(b"s").node_key(3, 4);
        let s = State {
            node_name: "n".into(),
            node_id: 3,
            generation: 4,
            segment_size: 1 << 20,
            data_addrs: vec!["127.0.0.1:1".into()],
            grant_key: Some(hex(key.as_bytes())),
            metad_term: 2,
            leader_id: 1,
            segment_used: 0,
            tracker: TrackerState::default(),
        };
        let body = serde_json::to_vec(&s).unwrap();
        let back: State = decode(Kind::State, &body).unwrap();
        assert_eq!(back, s);
        assert_eq!(
            back.grant_key().unwrap().unwrap().as_bytes(),
            key.as_bytes()
        );
        let mut bad = s.clone();
        bad.grant_key = Some("zz".into());
        assert!(bad.grant_key().is_err());
        bad.grant_key = Some("abc".into());
        assert!(bad.grant_key().is_err());
    }
}
