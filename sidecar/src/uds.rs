//! The UDS server (design §8): local clients connect to `--socket`, say hello (and receive the
//! segment and a staging area as memfds), then send pipelined requests answered by id.
//!
//! A request that cannot be parsed or has an unknown opcode gets an `ERROR` reply; a frame whose
//! framing is broken (length out of bounds) closes that connection. Neither affects other
//! clients. Each connection may have `--max-in-flight` requests in progress; beyond that the
//! sidecar stops reading from it (back-pressure). When a client goes away, its unfinished puts
//! are aborted and its local copies stop counting as in flight.

use regolith_proto::fdpass::write_all_async as write_all;
use regolith_proto::net::AcceptBackoff;
use regolith_proto::shutdown::Shutdown;
use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use prost::Message;
use regolith_proto::checksum;
use regolith_proto::fdpass;
use regolith_proto::frame::{self, FrameCodec};
use regolith_proto::metad as mpb;
use regolith_proto::uds::{self, pb, Op};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Semaphore;

use crate::error::{Error, Result};
use crate::node::Sidecar;
use crate::ops::put::{self, PendingPuts};
use crate::ops::{get, keys};
use crate::segment::{HugePages, MapOptions, Segment, SegmentOptions};

/// Most buffers one connection may register.
const MAX_SHMS: usize = 1024;

mod wire;
use wire::{
    begin_item, commit_item, get_item, get_result, list_segments, put_result, put_ticket, split,
    stats, status_of,
};

/// One client connection.
struct Conn {
    id: u64,
    staging: Arc<Segment>,
    shms: Mutex<HashMap<u64, Arc<Segment>>>,
    next_shm: AtomicU64,
    pending: PendingPuts,
}

/// Binds the socket (replacing a stale file), mode 0660 and the group when asked.
pub fn bind(path: &Path, group: Option<&str>) -> Result<UnixListener> {
    let serr = |reason: String| Error::Socket {
        path: path.display().to_string(),
        reason,
    };
    if let Some(dir) = path.parent() {
        if !dir.as_os_str().is_empty() && !dir.exists() {
            // The daemon's umask would make it 0700; clients of the socket's group must be able
            // to reach the socket (which is what guards access: 0660).
            std::fs::create_dir_all(dir)
                .and_then(|()| {
                    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
                })
                .map_err(|e| serr(format!("cannot create its directory: {e}")))?;
        }
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => return Err(serr("another sidecar is serving this socket".into())),
        Err(_) => {
            if path.exists() {
                tracing::info!(path = %path.display(), "replacing a stale socket file");
                std::fs::remove_file(path)
                    .map_err(|e| serr(format!("cannot remove the stale socket: {e}")))?;
            }
        }
    }
    // The daemon's umask (0077) makes the socket owner-only at bind; the group is set before
    // the mode is widened, so there is no moment where the wrong group may connect.
    let gid = match group {
        Some(g) => Some(
            nix::unistd::Group::from_name(g)
                .map_err(|e| serr(format!("looking up group {g:?}: {e}")))?
                .ok_or_else(|| serr(format!("no group named {g:?}")))?
                .gid,
        ),
        None => None,
    };
    let listener = UnixListener::bind(path).map_err(|e| serr(format!("bind: {e}")))?;
    if let Some(gid) = gid {
        nix::unistd::chown(path, None, Some(gid))
            .map_err(|e| serr(format!("chown to group {gid}: {e}")))?;
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
        .map_err(|e| serr(format!("chmod 0660: {e}")))?;
    Ok(listener)
}

/// The largest frame a client may send before its hello is answered (a hello is a few
/// hundred bytes), and how long it has to send it.
const HELLO_MAX_FRAME: u32 = 64 * 1024;
const HELLO_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long a shutdown waits for sessions to finish their requests in progress.
const SESSION_DRAIN: std::time::Duration = std::time::Duration::from_secs(10);

/// Accepts clients until shutdown, then waits (a bounded time) for every session to finish the
/// requests it has in progress and abort its unfinished puts.
pub async fn serve(side: Arc<Sidecar>, listener: UnixListener, shutdown: Shutdown) {
    let mut sessions = tokio::task::JoinSet::new();
    let mut backoff = AcceptBackoff::new("UDS");
    let max_clients = side.settings.max_clients;
    loop {
        while sessions.try_join_next().is_some() {}
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = shutdown.wait() => break,
        };
        let stream = match accepted {
            Ok((s, _)) => {
                backoff.succeeded();
                s
            }
            Err(e) => {
                tokio::select! {
                    () = backoff.pause_after(&e) => continue,
                    _ = shutdown.wait() => break,
                }
            }
        };
        if sessions.len() >= max_clients {
            refuse_client(&side, &stream, max_clients);
            continue;
        }
        sessions.spawn(client(side.clone(), stream, shutdown.clone()));
    }
    let drained = tokio::time::timeout(SESSION_DRAIN, async {
        while sessions.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            sessions = sessions.len(),
            "client sessions still busy after {SESSION_DRAIN:?}; closing them"
        );
    }
}

/// A client beyond `--max-clients` gets one ERROR frame (if its socket buffer takes it) and is
/// closed.
fn refuse_client(side: &Sidecar, stream: &UnixStream, max: usize) {
    side.metrics
        .connections_refused
        .with_label_values(&["uds"])
        .inc();
    tracing::debug!(
        max,
        "UDS: --max-clients sessions open, refusing a new client"
    );
    let body = error_body(
        pb::Code::Busy,
        &format!("the sidecar serves at most {max} clients (--max-clients); try again later"),
    );
    let _ = stream.try_write(&encode(Op::Error as u16, 0, &body));
}

/// One client, from accept to close.
async fn client(side: Arc<Sidecar>, stream: UnixStream, shutdown: Shutdown) {
    let id = side.next_conn.fetch_add(1, Ordering::Relaxed);
    let cred = stream.peer_cred().ok();
    tracing::debug!(conn = id, pid = ?cred.as_ref().and_then(|c| c.pid()), uid = ?cred.as_ref().map(|c| c.uid()), "client connected");
    side.clients.fetch_add(1, Ordering::Relaxed);
    side.metrics
        .clients
        .set(side.clients.load(Ordering::Relaxed) as i64);
    if let Err(e) = session(&side, id, stream, shutdown).await {
        tracing::debug!(conn = id, error = %e, "client connection ended");
    }
    side.clients.fetch_sub(1, Ordering::Relaxed);
    side.metrics
        .clients
        .set(side.clients.load(Ordering::Relaxed) as i64);
}

fn encode(op: u16, id: u64, body: &[u8]) -> Vec<u8> {
    // Bodies we build are far below the frame cap; a failure here is a bug, reported as such.
    frame::encode_to_vec(op, id, body).unwrap_or_else(|e| {
        tracing::error!(error = %e, "reply too large");
        frame::encode_to_vec(
            Op::Error as u16,
            id,
            &error_body(pb::Code::Internal, "reply too large"),
        )
        .unwrap_or_default()
    })
}

fn error_body(code: pb::Code, msg: &str) -> Vec<u8> {
    pb::ErrorReply {
        status: Some(uds::status(code, msg)),
    }
    .encode_to_vec()
}

/// Reads frames (and any descriptors riding with them) from the socket.
struct Reader {
    codec: FrameCodec,
    fds: std::collections::VecDeque<OwnedFd>,
    buf: Vec<u8>,
}

impl Reader {
    /// The next frame. While `idle()` (no request of the connection in progress), for up to
    /// `spin` it polls the socket (yielding to other tasks between tries) before it waits for
    /// readiness: a client's next request, sent right after the last reply, then finds this
    /// thread awake rather than costing a wake-up. It never spins while a request is being
    /// served (that would take a core from it).
    async fn next(
        &mut self,
        sock: &UnixStream,
        spin: Duration,
        idle: impl Fn() -> bool,
    ) -> Result<Option<frame::Frame>> {
        let started = Instant::now();
        loop {
            match self.codec.next_frame() {
                Ok(Some(f)) => return Ok(Some(f)),
                Ok(None) => {}
                Err(e) => return Err(Error::InvalidArgument(format!("broken framing: {e}"))),
            }
            let read = if started.elapsed() < spin && idle() {
                // Directly, not through the runtime's readiness (which only changes when its
                // I/O driver is polled); a read that finds nothing yields and tries again.
                match fdpass::recv_fds(sock.as_fd(), &mut self.buf, 4) {
                    Err(e) if e.is_would_block() => {
                        tokio::task::yield_now().await;
                        continue;
                    }
                    r => r.map_err(std::io::Error::from),
                }
            } else {
                fdpass::recv_fds_async(sock, &mut self.buf, 4).await
            };
            let (n, fds) = read.map_err(|e| Error::Os {
                what: "reading from a client".into(),
                source: e,
            })?;
            if n == 0 {
                return Ok(None);
            }
            for fd in fds {
                if self.fds.len() < 16 {
                    self.fds.push_back(fd);
                }
            }
            self.codec.feed(&self.buf[..n]);
        }
    }
}

async fn session(
    side: &Arc<Sidecar>,
    id: u64,
    stream: UnixStream,
    shutdown: Shutdown,
) -> Result<()> {
    let sock = Arc::new(stream);
    // Until hello, a connection costs little: a small read buffer, a small frame cap and a
    // time limit (finding 6 of the hardening review: 40 stalled connections, each announcing
    // a 64 MiB frame, held 1.29 GiB).
    let mut reader = Reader {
        codec: FrameCodec::new(HELLO_MAX_FRAME),
        fds: Default::default(),
        buf: vec![0u8; 16 * 1024],
    };
    let first =
        match tokio::time::timeout(HELLO_TIMEOUT, reader.next(&sock, Duration::ZERO, || false))
            .await
        {
            Ok(Err(e @ Error::InvalidArgument(_))) => {
                side.metrics.uds_bad_frames.inc();
                return Err(e);
            }
            Ok(r) => r?,
            Err(_) => {
                side.metrics.uds_bad_frames.inc();
                let _ = write_all(
                    &sock,
                    &encode(
                        Op::Error as u16,
                        0,
                        &error_body(pb::Code::InvalidArgument, "no HELLO within 10 s"),
                    ),
                )
                .await;
                return Ok(());
            }
        };
    let Some(first) = first else {
        return Ok(());
    };
    if first.opcode != Op::Hello as u16 {
        side.metrics.uds_bad_frames.inc();
        let _ = write_all(
            &sock,
            &encode(
                Op::Error as u16,
                first.request_id,
                &error_body(pb::Code::InvalidArgument, "say HELLO first"),
            ),
        )
        .await;
        return Ok(());
    }
    let conn = match hello(side, id, &sock, &first).await? {
        Some(c) => Arc::new(c),
        None => return Ok(()),
    };
    reader.codec.set_max_length(uds::MAX_FRAME);
    reader.buf.resize(256 * 1024, 0);
    // Each request's task writes its own reply (under a lock), saving a hop through a writer
    // task on the latency path.
    let tx = Arc::new(Replier {
        sock: sock.clone(),
        lock: tokio::sync::Mutex::new(()),
    });
    let max = side.settings.max_in_flight as usize;
    let slots = Arc::new(Semaphore::new(max));
    let quiet = Arc::new(tokio::sync::Notify::new());
    let result = loop {
        // At shutdown the session reads no more requests; those in progress finish below.
        let next = tokio::select! {
            r = reader.next(&sock, side.settings.uds_spin, || slots.available_permits() == max) => r,
            // The last request in progress was answered: read again, spinning from now.
            _ = quiet.notified() => continue,
            _ = shutdown.wait() => break Ok(()),
        };
        let f = match next {
            Ok(Some(f)) => f,
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        };
        let Some(op) = Op::from_u16(f.opcode).filter(|op| *op != Op::Hello && *op != Op::Error)
        else {
            side.metrics.uds_bad_frames.inc();
            tx.send(encode(
                Op::Error as u16,
                f.request_id,
                &error_body(
                    pb::Code::InvalidArgument,
                    &format!("unknown opcode {}", f.opcode),
                ),
            ))
            .await;
            continue;
        };
        let fd = if op == Op::RegisterShm {
            reader.fds.pop_front()
        } else {
            None
        };
        let Ok(permit) = slots.clone().acquire_owned().await else {
            break Ok(());
        };
        let (side, conn, tx, quiet, slots) = (
            side.clone(),
            conn.clone(),
            tx.clone(),
            quiet.clone(),
            slots.clone(),
        );
        tokio::spawn(async move {
            let start = Instant::now();
            let reply = match dispatch(&side, &conn, op, f.body, fd).await {
                Ok(body) => encode(op as u16, f.request_id, &body),
                Err(e) => {
                    side.metrics.uds_bad_frames.inc();
                    encode(
                        Op::Error as u16,
                        f.request_id,
                        &error_body(pb::Code::InvalidArgument, &e.to_string()),
                    )
                }
            };
            side.metrics.observe_op(op.name(), start.elapsed());
            // The slot is held until the reply is written: a client that does not read its
            // replies stops being served once --max-in-flight of them wait (finding 6: with
            // the slot released first, 300,000 unread replies added 814 MiB).
            tx.send(reply).await;
            drop(permit);
            if slots.available_permits() == max {
                quiet.notify_one();
            }
        });
    };
    // Wait for every request in progress before cleaning up after the client.
    let _ = slots.acquire_many(max as u32).await;
    close(side, &conn).await;
    result
}

struct Replier {
    sock: Arc<UnixStream>,
    lock: tokio::sync::Mutex<()>,
}

impl Replier {
    async fn send(&self, bytes: Vec<u8>) {
        let _g = self.lock.lock().await;
        let _ = write_all(&self.sock, &bytes).await;
    }
}

/// Answers hello: negotiates the version and hands over the segment and a staging area.
async fn hello(
    side: &Arc<Sidecar>,
    id: u64,
    sock: &UnixStream,
    f: &frame::Frame,
) -> Result<Option<Conn>> {
    let req = match pb::HelloRequest::decode(f.body.as_ref()) {
        Ok(r) => r,
        Err(e) => {
            write_all(
                sock,
                &encode(
                    Op::Error as u16,
                    f.request_id,
                    &error_body(pb::Code::InvalidArgument, &format!("bad hello: {e}")),
                ),
            )
            .await
            .ok();
            return Ok(None);
        }
    };
    if req.protocol_version == 0 {
        let reply = pb::HelloReply {
            status: Some(uds::status(
                pb::Code::InvalidArgument,
                "protocol version 0 is not a version",
            )),
            ..Default::default()
        };
        write_all(
            sock,
            &encode(Op::Hello as u16, f.request_id, &reply.encode_to_vec()),
        )
        .await
        .ok();
        return Ok(None);
    }
    let version = req.protocol_version.min(uds::PROTOCOL_VERSION);
    let size = if req.staging_size == 0 {
        side.settings.staging_size
    } else {
        req.staging_size.clamp(uds::MIN_STAGING, 16 << 30)
    };
    let staging = Segment::create(
        &format!("staging-{id}"),
        size,
        &SegmentOptions {
            huge_pages: HugePages::Never,
            prefault: false,
            allocate: false,
        },
    )?;
    let reply = pb::HelloReply {
        status: Some(uds::ok()),
        protocol_version: version,
        node_name: side.settings.node_name.clone(),
        node_id: side.node_id(),
        segment_size: side.store.segment.len(),
        segment_generation: side.store.tracker.generation(),
        staging_size: staging.len(),
        max_inline: uds::MAX_INLINE,
        max_in_flight: side.settings.max_in_flight,
        checksum_chunk: checksum::CHUNK as u64,
        instance_id: side.instance_id,
    };
    let bytes = encode(Op::Hello as u16, f.request_id, &reply.encode_to_vec());
    let mut fds = Vec::new();
    if !side.store.segment.is_empty() {
        fds.push(side.store.segment.fd());
    }
    fds.push(staging.fd());
    fdpass::send_fds_async(sock, &bytes, &fds)
        .await
        .map_err(|e| Error::Os {
            what: "sending hello".into(),
            source: e,
        })?;
    tracing::debug!(conn = id, client = %req.client_name, staging = staging.len(), "hello");
    Ok(Some(Conn {
        id,
        staging: Arc::new(staging),
        shms: Mutex::new(HashMap::new()),
        next_shm: AtomicU64::new(1),
        pending: PendingPuts::default(),
    }))
}

/// A client went away: abort its unfinished puts; its local copies are over.
async fn close(side: &Arc<Sidecar>, conn: &Conn) {
    put::abandon(&side.store, conn.id, &conn.pending).await;
}

fn decode<M: Message + Default>(body: &Bytes) -> Result<M> {
    M::decode(body.as_ref())
        .map_err(|e| Error::InvalidArgument(format!("undecodable request: {e}")))
}

async fn dispatch(
    side: &Arc<Sidecar>,
    conn: &Arc<Conn>,
    op: Op,
    body: Bytes,
    fd: Option<OwnedFd>,
) -> Result<Vec<u8>> {
    let store = &side.store;
    Ok(match op {
        Op::PutBegin => {
            let req: pb::PutBeginRequest = decode(&body)?;
            let items = req.items.into_iter().map(begin_item).collect();
            let tickets = put::begin(store, conn.id, &conn.pending, items).await;
            pb::PutBeginReply {
                items: tickets.into_iter().map(put_ticket).collect(),
            }
            .encode_to_vec()
        }
        Op::PutCommit => {
            let req: pb::PutCommitRequest = decode(&body)?;
            let items = req
                .items
                .into_iter()
                .map(|it| commit_item(conn, it))
                .collect();
            let results = put::commit(store, &conn.pending, items).await;
            pb::PutCommitReply {
                items: results.into_iter().map(put_result).collect(),
            }
            .encode_to_vec()
        }
        Op::PutAbort => {
            let req: pb::PutAbortRequest = decode(&body)?;
            put::abort(store, &conn.pending, req.versions).await;
            pb::Empty {}.encode_to_vec()
        }
        Op::Get => {
            let req: pb::GetRequest = decode(&body)?;
            let items = req.items.into_iter().map(|it| get_item(conn, it)).collect();
            let results = get::get(store, items).await;
            pb::GetReply {
                items: results.into_iter().map(get_result).collect(),
            }
            .encode_to_vec()
        }
        Op::Exists => {
            let req: pb::KeysRequest = decode(&body)?;
            let (status, exists) = split(keys::exists(store, req.keys).await);
            pb::ExistsReply { status, exists }.encode_to_vec()
        }
        Op::GetSize => {
            let req: pb::KeysRequest = decode(&body)?;
            let (status, items) = split(keys::sizes(store, req.keys).await);
            let mut reply = pb::SizesReply {
                status,
                ..Default::default()
            };
            for (st, size, replicas) in items {
                reply.statuses.push(status_of(st));
                reply.sizes.push(size);
                reply.replicas.push(pb::ReplicaList {
                    replicas: store
                        .replica_infos(&replicas)
                        .into_iter()
                        .map(wire::replica_info)
                        .collect(),
                });
            }
            reply.encode_to_vec()
        }
        Op::ListKeys => {
            let req: pb::ListKeysRequest = decode(&body)?;
            let page = keys::list_keys(
                store,
                mpb::ListKeysRequest {
                    prefix: req.prefix,
                    start_after: req.start_after,
                    limit: req.limit,
                },
            )
            .await;
            let (status, page) = split(page);
            pb::ListKeysReply {
                status,
                sizes: page.keys.iter().map(|k| k.size).collect(),
                keys: page.keys.into_iter().map(|k| k.key).collect(),
                next_start_after: page.next_start_after,
            }
            .encode_to_vec()
        }
        Op::Remove => {
            let req: pb::KeysRequest = decode(&body)?;
            let (status, items) = split(keys::remove(store, req.keys).await);
            pb::RemoveReply {
                status,
                statuses: items.into_iter().map(status_of).collect(),
            }
            .encode_to_vec()
        }
        Op::RemoveAll => {
            // It wipes every key of the cluster: only the exact request (an empty `Empty`)
            // does, not a body that merely decodes (unknown fields are skipped by protobuf).
            let _: pb::Empty = decode(&body)?;
            if !body.is_empty() {
                return Err(Error::InvalidArgument(format!(
                    "REMOVE_ALL takes an empty body, got {} bytes: refused, nothing removed",
                    body.len()
                )));
            }
            let (status, removed) = split(keys::remove_all(store).await);
            pb::RemoveAllReply { status, removed }.encode_to_vec()
        }
        Op::RegisterShm => register_shm(conn, decode(&body)?, fd).encode_to_vec(),
        Op::UnregisterShm => {
            let r: pb::UnregisterShmRequest = decode(&body)?;
            let st = match conn.shms.lock().remove(&r.shm_id) {
                Some(_) => uds::ok(),
                None => uds::status(
                    pb::Code::NotFound,
                    format!("no registered buffer {}", r.shm_id),
                ),
            };
            pb::StatusReply { status: Some(st) }.encode_to_vec()
        }
        Op::ListSegments => {
            let _: pb::Empty = decode(&body)?;
            list_segments(side).await.encode_to_vec()
        }
        Op::Stats => {
            let _: pb::Empty = decode(&body)?;
            stats(side).await.encode_to_vec()
        }
        Op::Hello | Op::Error => {
            return Err(Error::InvalidArgument(format!(
                "{} is not a request here",
                op.name()
            )))
        }
    })
}

// ------------------------------------------------------- buffers and cluster

fn register_shm(
    conn: &Conn,
    req: pb::RegisterShmRequest,
    fd: Option<OwnedFd>,
) -> pb::RegisterShmReply {
    let refuse = |code, msg: String| pb::RegisterShmReply {
        status: Some(uds::status(code, msg)),
        shm_id: 0,
    };
    let Some(fd) = fd else {
        return refuse(
            pb::Code::InvalidArgument,
            "REGISTER_SHM needs one memfd (SCM_RIGHTS) with the frame".into(),
        );
    };
    if conn.shms.lock().len() >= MAX_SHMS {
        return refuse(
            pb::Code::InvalidArgument,
            format!("at most {MAX_SHMS} registered buffers per connection"),
        );
    }
    let id = conn.next_shm.fetch_add(1, Ordering::Relaxed);
    let seg = match Segment::from_fd(
        &format!("client-{}-shm-{id}", conn.id),
        fd,
        &MapOptions {
            prefault: false,
            require_shrink_seal: true,
        },
    ) {
        Ok(s) => s,
        Err(e) => return refuse(pb::Code::InvalidArgument, e.to_string()),
    };
    if seg.len() != req.size {
        return refuse(
            pb::Code::InvalidArgument,
            format!("buffer is {} bytes, request says {}", seg.len(), req.size),
        );
    }
    conn.shms.lock().insert(id, Arc::new(seg));
    pb::RegisterShmReply {
        status: Some(uds::ok()),
        shm_id: id,
    }
}
