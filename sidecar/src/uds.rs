//! The UDS server (design §8): local clients connect to `--socket`, say hello (and receive the
//! segment and a staging area as memfds), then send pipelined requests answered by id.
//!
//! A request that cannot be parsed or has an unknown opcode gets an `ERROR` reply; a frame whose
//! framing is broken (length out of bounds) closes that connection. Neither affects other
//! clients. Each connection may have `--max-in-flight` requests in progress; beyond that the
//! sidecar stops reading from it (back-pressure). When a client goes away, its unfinished puts
//! are aborted and its local copies stop counting as in flight.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futures::future::join_all;
use parking_lot::Mutex;
use prost::Message;
use regolith_proto::checksum;
use regolith_proto::fdpass;
use regolith_proto::frame::{self, FrameCodec};
use regolith_proto::metad as mpb;
use regolith_proto::uds::{self, pb, Op};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{watch, Semaphore};

use crate::error::{Error, Result};
use crate::node::{PutSource, Sidecar};
use crate::segment::{HugePages, MapOptions, Segment, SegmentOptions};
use crate::transport::Version;

/// Most items in one batch request.
const MAX_ITEMS: usize = 4096;
/// Most buffers one connection may register.
const MAX_SHMS: usize = 1024;

struct PendingPut {
    key: String,
    size: u64,
    replicas: Vec<mpb::Replica>,
    leader: String,
    local: Vec<(u64, u64)>,
}

/// One client connection.
struct Conn {
    id: u64,
    staging: Arc<Segment>,
    shms: Mutex<HashMap<u64, Arc<Segment>>>,
    next_shm: AtomicU64,
    pending: Mutex<HashMap<(u64, u64), PendingPut>>,
}

/// Binds the socket (replacing a stale file), mode 0660 and the group when asked.
pub fn bind(path: &Path, group: Option<&str>) -> Result<UnixListener> {
    let serr = |reason: String| Error::Socket {
        path: path.display().to_string(),
        reason,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| serr(format!("cannot create its directory: {e}")))?;
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
    let listener = UnixListener::bind(path).map_err(|e| serr(format!("bind: {e}")))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
        .map_err(|e| serr(format!("chmod 0660: {e}")))?;
    if let Some(g) = group {
        let grp = nix::unistd::Group::from_name(g)
            .map_err(|e| serr(format!("looking up group {g:?}: {e}")))?
            .ok_or_else(|| serr(format!("no group named {g:?}")))?;
        nix::unistd::chown(path, None, Some(grp.gid))
            .map_err(|e| serr(format!("chown to group {g:?}: {e}")))?;
    }
    Ok(listener)
}

/// Accepts clients until shutdown.
pub async fn serve(
    side: Arc<Sidecar>,
    listener: UnixListener,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => { tracing::warn!(error = %e, "UDS accept"); continue; }
            },
            _ = shutdown.wait_for(|s| *s) => return,
        };
        let side = side.clone();
        let sd = shutdown.clone();
        tokio::spawn(async move {
            let id = side.next_conn.fetch_add(1, Ordering::Relaxed);
            let cred = stream.peer_cred().ok();
            tracing::debug!(conn = id, pid = ?cred.as_ref().and_then(|c| c.pid()), uid = ?cred.as_ref().map(|c| c.uid()), "client connected");
            side.clients.fetch_add(1, Ordering::Relaxed);
            side.metrics
                .clients
                .set(side.clients.load(Ordering::Relaxed) as i64);
            if let Err(e) = session(&side, id, stream, sd).await {
                tracing::debug!(conn = id, error = %e, "client connection ended");
            }
            side.clients.fetch_sub(1, Ordering::Relaxed);
            side.metrics
                .clients
                .set(side.clients.load(Ordering::Relaxed) as i64);
        });
    }
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

async fn write_all(sock: &UnixStream, mut buf: &[u8]) -> std::io::Result<()> {
    while !buf.is_empty() {
        sock.writable().await?;
        match sock.try_write(buf) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads frames (and any descriptors riding with them) from the socket.
struct Reader {
    codec: FrameCodec,
    fds: std::collections::VecDeque<OwnedFd>,
    buf: Vec<u8>,
}

impl Reader {
    async fn next(&mut self, sock: &UnixStream) -> Result<Option<frame::Frame>> {
        loop {
            match self.codec.next_frame() {
                Ok(Some(f)) => return Ok(Some(f)),
                Ok(None) => {}
                Err(e) => return Err(Error::InvalidArgument(format!("broken framing: {e}"))),
            }
            let (n, fds) = fdpass::recv_fds_async(sock, &mut self.buf, 4)
                .await
                .map_err(|e| Error::Os {
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
    _shutdown: watch::Receiver<bool>,
) -> Result<()> {
    let sock = Arc::new(stream);
    let mut reader = Reader {
        codec: FrameCodec::new(uds::MAX_FRAME),
        fds: Default::default(),
        buf: vec![0u8; 256 * 1024],
    };
    // Hello first.
    let Some(first) = reader.next(&sock).await? else {
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
    // Each request's task writes its own reply (under a lock), saving a hop through a writer
    // task on the latency path.
    let tx = Arc::new(Replier {
        sock: sock.clone(),
        lock: tokio::sync::Mutex::new(()),
    });
    let max = side.settings.max_in_flight as usize;
    let slots = Arc::new(Semaphore::new(max));
    let result = loop {
        let f = match reader.next(&sock).await {
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
        let (side, conn, tx) = (side.clone(), conn.clone(), tx.clone());
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
            drop(permit);
            tx.send(reply).await;
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
        segment_size: side.segment.len(),
        segment_generation: side.tracker.generation(),
        staging_size: staging.len(),
        max_inline: uds::MAX_INLINE,
        max_in_flight: side.settings.max_in_flight,
        checksum_chunk: checksum::CHUNK as u64,
        instance_id: side.instance_id,
    };
    let bytes = encode(Op::Hello as u16, f.request_id, &reply.encode_to_vec());
    let mut fds = Vec::new();
    if !side.segment.is_empty() {
        fds.push(side.segment.fd());
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
        pending: Mutex::new(HashMap::new()),
    }))
}

/// A client went away: abort its unfinished puts; its local copies are over.
async fn close(side: &Arc<Sidecar>, conn: &Conn) {
    side.tracker.untrack_conn(conn.id);
    let pending: Vec<((u64, u64), PendingPut)> = conn.pending.lock().drain().collect();
    let mut by_leader: HashMap<String, Vec<mpb::Version>> = HashMap::new();
    for ((term, id), p) in pending {
        tracing::info!(key = %p.key, "client left mid-put: aborting its reservation");
        by_leader
            .entry(p.leader)
            .or_default()
            .push(mpb::Version { term, id });
    }
    for (leader, versions) in by_leader {
        if let Err(e) = side
            .metad
            .abort_at(&leader, mpb::AbortRequest { versions })
            .await
        {
            tracing::debug!(error = %e, "abort failed (the reservation will expire)");
        }
    }
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
    Ok(match op {
        Op::PutBegin => put_begin(side, conn, decode(&body)?).await.encode_to_vec(),
        Op::PutCommit => put_commit(side, conn, decode(&body)?).await.encode_to_vec(),
        Op::PutAbort => put_abort(side, conn, decode(&body)?).await.encode_to_vec(),
        Op::Get => get(side, conn, decode(&body)?).await.encode_to_vec(),
        Op::Exists => exists(side, decode(&body)?).await.encode_to_vec(),
        Op::GetSize => get_size(side, decode(&body)?).await.encode_to_vec(),
        Op::Remove => remove(side, decode(&body)?).await.encode_to_vec(),
        Op::RemoveAll => remove_all(side).await.encode_to_vec(),
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
        Op::ListSegments => list_segments(side).await.encode_to_vec(),
        Op::Stats => stats(side).await.encode_to_vec(),
        Op::Hello | Op::Error => {
            return Err(Error::InvalidArgument(format!(
                "{} is not a request here",
                op.name()
            )))
        }
    })
}

/// metad's per-item codes, as the UDS protocol's. Codes a fresh attempt may cure become
/// UNAVAILABLE (the client retries the put with a new reservation).
fn code_of(c: i32) -> pb::Code {
    match mpb::Code::try_from(c).unwrap_or(mpb::Code::Internal) {
        mpb::Code::Ok => pb::Code::Ok,
        mpb::Code::NotFound => pb::Code::NotFound,
        mpb::Code::AlreadyExists => pb::Code::AlreadyExists,
        mpb::Code::NoSpace | mpb::Code::NotEnoughNodes | mpb::Code::QuotaExceeded => {
            pb::Code::NoSpace
        }
        mpb::Code::InvalidArgument => pb::Code::InvalidArgument,
        mpb::Code::StaleReservation | mpb::Code::Expired | mpb::Code::Conflict => {
            pb::Code::Unavailable
        }
        mpb::Code::Internal => pb::Code::Internal,
    }
}

fn metad_err(e: &regolith_proto::Error) -> pb::Status {
    let code = match e.code() {
        Some(tonic::Code::InvalidArgument) => pb::Code::InvalidArgument,
        _ => pb::Code::Unavailable,
    };
    uds::status(code, format!("metad: {e}"))
}

/// Whether a failed call to metad may still have taken effect: it was sent and got no
/// definite answer (a lost reply, a timeout, a leader deposed after appending it). Only calls
/// never sent or refused before any effect are definite.
fn may_have_applied(e: &regolith_proto::Error) -> bool {
    use regolith_proto::Error as E;
    !matches!(
        e,
        E::BadAddress { .. }
            | E::Config(_)
            | E::Rpc {
                code: tonic::Code::InvalidArgument
                    | tonic::Code::Unauthenticated
                    | tonic::Code::PermissionDenied,
                ..
            }
    )
}

/// The status of a commit that got no definite answer. It may have been applied, so it must
/// not look like a refused commit (UNAVAILABLE, which the client retries with a fresh
/// reservation: the retry would answer ALREADY_EXISTS for the caller's own value): TIMEOUT
/// means "outcome unknown".
fn commit_err(e: &regolith_proto::Error) -> pb::Status {
    if may_have_applied(e) {
        uds::status(
            pb::Code::Timeout,
            format!("metad: commit outcome unknown (the object may be stored): {e}"),
        )
    } else {
        metad_err(e)
    }
}

/// The put's options as metad takes them (one message, `common.proto`, serves both protocols).
fn options(o: Option<pb::PutOptions>) -> mpb::PutOptions {
    o.unwrap_or_default()
}

fn replica_infos(side: &Sidecar, reps: &[mpb::Replica]) -> Vec<pb::ReplicaInfo> {
    reps.iter()
        .map(|r| pb::ReplicaInfo {
            node_name: r.node_name.clone(),
            node_id: r.node_id,
            local: side.is_local(r),
        })
        .collect()
}

fn extents_of(r: &mpb::Replica) -> Vec<(u64, u64)> {
    r.extents.iter().map(|e| (e.offset, e.len)).collect()
}

// ---------------------------------------------------------------------- puts

async fn put_begin(
    side: &Arc<Sidecar>,
    conn: &Conn,
    req: pb::PutBeginRequest,
) -> pb::PutBeginReply {
    let n = req.items.len();
    let refuse = |code: pb::Code, msg: String| pb::PutBeginReply {
        items: (0..n)
            .map(|_| pb::PutTicket {
                status: Some(uds::status(code, msg.clone())),
                ..Default::default()
            })
            .collect(),
    };
    if n == 0 || n > MAX_ITEMS {
        return refuse(
            pb::Code::InvalidArgument,
            format!("{n} items; 1..={MAX_ITEMS} per request"),
        );
    }
    let node = side.node_id();
    let items = req
        .items
        .iter()
        .map(|it| mpb::ReserveRequest {
            key: it.key.clone(),
            size: it.size,
            options: Some(options(it.options.clone())),
            requester_node_id: node,
        })
        .collect();
    let (reply, leader) = match side
        .metad
        .batch_reserve(mpb::BatchReserveRequest { items })
        .await
    {
        Ok(r) => r,
        Err(e) => {
            return pb::PutBeginReply {
                items: (0..n)
                    .map(|_| pb::PutTicket {
                        status: Some(metad_err(&e)),
                        ..Default::default()
                    })
                    .collect(),
            }
        }
    };
    let mut tickets = Vec::with_capacity(n);
    for (it, r) in req.items.iter().zip(reply.items) {
        let st = r.status.unwrap_or_default();
        let Some(res) = r.reservation.filter(|_| st.code == 0) else {
            tickets.push(pb::PutTicket {
                status: Some(uds::status(code_of(st.code), st.message)),
                ..Default::default()
            });
            continue;
        };
        let v = res.version.unwrap_or_default();
        let local = res
            .replicas
            .iter()
            .find(|r| side.is_local(r))
            .map(extents_of)
            .unwrap_or_default();
        let remote = res.replicas.iter().any(|r| !side.is_local(r));
        if !local.is_empty() {
            side.tracker
                .track_local((v.term, v.id), conn.id, local.clone());
        }
        tickets.push(pb::PutTicket {
            status: Some(uds::ok()),
            version: Some(pb::Version {
                term: v.term,
                id: v.id,
            }),
            local_extents: local
                .iter()
                .map(|(offset, len)| pb::Extent {
                    offset: *offset,
                    len: *len,
                })
                .collect(),
            remote,
            checksum_seed: checksum::seed(v.term, v.id),
            replicas: replica_infos(side, &res.replicas),
        });
        conn.pending.lock().insert(
            (v.term, v.id),
            PendingPut {
                key: it.key.clone(),
                size: it.size,
                replicas: res.replicas,
                leader: leader.clone(),
                local,
            },
        );
    }
    pb::PutBeginReply { items: tickets }
}

/// Resolves a region of this connection (staging or a registered buffer) to a mapping.
fn region_segment(
    conn: &Conn,
    region: &pb::Region,
    need: u64,
) -> std::result::Result<(Arc<Segment>, u64), pb::Status> {
    let (seg, off, len) = match &region.r#where {
        Some(pb::region::Where::Staging(w)) => (conn.staging.clone(), w.offset, w.len),
        Some(pb::region::Where::Shm(s)) => match conn.shms.lock().get(&s.shm_id) {
            Some(seg) => (seg.clone(), s.offset, s.len),
            None => {
                return Err(uds::status(
                    pb::Code::InvalidArgument,
                    format!("no registered buffer {}", s.shm_id),
                ))
            }
        },
        _ => {
            return Err(uds::status(
                pb::Code::InvalidArgument,
                "not a shared-memory region",
            ))
        }
    };
    if len < need {
        return Err(uds::status(
            pb::Code::NeedSpace,
            format!("region of {len} bytes for {need}"),
        ));
    }
    if off.checked_add(need).is_none_or(|end| end > seg.len()) {
        return Err(uds::status(
            pb::Code::InvalidArgument,
            format!(
                "region {off}+{need} lies outside its buffer ({} bytes)",
                seg.len()
            ),
        ));
    }
    Ok((seg, off))
}

async fn put_commit(
    side: &Arc<Sidecar>,
    conn: &Conn,
    req: pb::PutCommitRequest,
) -> pb::PutCommitReply {
    if req.items.len() > MAX_ITEMS {
        let st = uds::status(
            pb::Code::InvalidArgument,
            format!("{} items; at most {MAX_ITEMS}", req.items.len()),
        );
        return pb::PutCommitReply {
            items: req
                .items
                .iter()
                .map(|_| pb::PutResult {
                    status: Some(st.clone()),
                    replicas: vec![],
                })
                .collect(),
        };
    }
    let work = req
        .items
        .into_iter()
        .map(|it| async move { transfer_put(side, conn, it).await });
    let staged: Vec<std::result::Result<(Version, u64, PendingPut), pb::Status>> =
        join_all(work).await;
    // One batch commit per leader for every item whose bytes are in place.
    let mut results: Vec<Option<pb::PutResult>> = vec![None; staged.len()];
    let mut by_leader: HashMap<String, Vec<(usize, Version, u64)>> = HashMap::new();
    let mut pendings: HashMap<usize, PendingPut> = HashMap::new();
    for (i, s) in staged.into_iter().enumerate() {
        match s {
            Ok((v, ck, p)) => {
                by_leader
                    .entry(p.leader.clone())
                    .or_default()
                    .push((i, v, ck));
                pendings.insert(i, p);
            }
            Err(st) => {
                results[i] = Some(pb::PutResult {
                    status: Some(st),
                    replicas: vec![],
                })
            }
        }
    }
    for (leader, items) in by_leader {
        let req = mpb::BatchCommitRequest {
            items: items
                .iter()
                .map(|(_, v, ck)| mpb::CommitRequest {
                    version: Some(mpb::Version {
                        term: v.term,
                        id: v.id,
                    }),
                    checksum: *ck,
                })
                .collect(),
        };
        let answer = side.metad.batch_commit_at(&leader, req).await;
        for (k, (i, v, _)) in items.iter().enumerate() {
            side.tracker.untrack_local((v.term, v.id));
            let p = pendings.remove(i);
            let status = match &answer {
                Ok(r) => match r.items.get(k).and_then(|c| c.status.clone()) {
                    Some(s) if s.code == 0 => uds::ok(),
                    Some(s) => uds::status(code_of(s.code), s.message),
                    None => uds::status(pb::Code::Internal, "commit answered fewer items"),
                },
                Err(e) => commit_err(e),
            };
            if status.code == 0 {
                if let Some(p) = &p {
                    side.metrics.put_bytes.inc_by(p.size);
                    side.puts.fetch_add(1, Ordering::Relaxed);
                }
            } else {
                side.metrics
                    .op_errors
                    .with_label_values(&[
                        "put_commit",
                        &format!(
                            "{:?}",
                            pb::Code::try_from(status.code).unwrap_or(pb::Code::Internal)
                        ),
                    ])
                    .inc();
            }
            let replicas = p
                .map(|p| replica_infos(side, &p.replicas))
                .unwrap_or_default();
            results[*i] = Some(pb::PutResult {
                status: Some(status),
                replicas,
            });
        }
    }
    pb::PutCommitReply {
        items: results.into_iter().map(|r| r.unwrap_or_default()).collect(),
    }
}

/// Writes one put's remote replicas; returns what to commit.
async fn transfer_put(
    side: &Arc<Sidecar>,
    conn: &Conn,
    it: pb::PutCommitItem,
) -> std::result::Result<(Version, u64, PendingPut), pb::Status> {
    let v = it.version.unwrap_or_default();
    let key = (v.term, v.id);
    let Some(p) = conn.pending.lock().remove(&key) else {
        return Err(uds::status(
            pb::Code::InvalidArgument,
            format!(
                "reservation {}.{} is not pending on this connection",
                v.term, v.id
            ),
        ));
    };
    let version = Version {
        term: v.term,
        id: v.id,
    };
    let remote: Vec<&mpb::Replica> = p.replicas.iter().filter(|r| !side.is_local(r)).collect();
    let inline;
    let mapped;
    let src = if !p.local.is_empty() {
        PutSource::Mapped {
            seg: &side.segment,
            extents: p.local.clone(),
        }
    } else {
        match &it.source {
            Some(pb::Region {
                r#where: Some(pb::region::Where::Inline(i)),
            }) => {
                if (i.data.len() as u64) < p.size {
                    return Err(abort(
                        side,
                        &p,
                        key,
                        uds::status(
                            pb::Code::InvalidArgument,
                            "inline data shorter than the object",
                        ),
                    )
                    .await);
                }
                inline = i.data.clone();
                PutSource::Inline(&inline)
            }
            Some(region) => match region_segment(conn, region, p.size) {
                Ok((seg, off)) => {
                    mapped = seg;
                    PutSource::Mapped {
                        seg: &mapped,
                        extents: vec![(off, p.size)],
                    }
                }
                Err(st) => return Err(abort(side, &p, key, st).await),
            },
            None => {
                return Err(abort(
                    side,
                    &p,
                    key,
                    uds::status(
                        pb::Code::InvalidArgument,
                        "no local replica and no source region",
                    ),
                )
                .await)
            }
        }
    };
    let chunks = checksum::chunk_count(p.size);
    let writes = remote.iter().map(|rep| {
        let src = &src;
        async move {
            let mut hashes = vec![0u64; chunks];
            side.write_replica(rep, version, p.size, src, &mut hashes)
                .await
                .map(|_| hashes)
                .map_err(|e| (rep.node_name.clone(), e))
        }
    });
    let done = join_all(writes).await;
    let mut first_hashes = None;
    for r in done {
        match r {
            Ok(h) => {
                first_hashes.get_or_insert(h);
            }
            Err((node, e)) => {
                let st = uds::status(
                    pb::Code::Unavailable,
                    format!("writing the replica on {node}: {e}"),
                );
                return Err(abort(side, &p, key, st).await);
            }
        }
    }
    let ck = if it.checksum_known {
        it.checksum
    } else if let Some(h) = first_hashes {
        checksum::combine(version.seed(), &h)
    } else {
        // Only a local replica, copied by the client, which did not send its checksum: hash it.
        let mut h = vec![0u64; chunks];
        if let PutSource::Mapped { seg, extents } = &src {
            let mut obj = 0u64;
            for (off, len) in extents {
                let n = (*len).min(p.size - obj);
                // SAFETY: bounds-checked view of a live mapping, only hashed.
                if let Ok(bytes) = unsafe { seg.slice(*off, n) } {
                    checksum::hash_chunks(
                        version.seed(),
                        bytes,
                        &mut h[(obj / checksum::CHUNK as u64) as usize..],
                    );
                }
                obj += n;
            }
        }
        checksum::combine(version.seed(), &h)
    };
    Ok((version, ck, p))
}

async fn abort(side: &Arc<Sidecar>, p: &PendingPut, key: (u64, u64), st: pb::Status) -> pb::Status {
    side.tracker.untrack_local(key);
    let req = mpb::AbortRequest {
        versions: vec![mpb::Version {
            term: key.0,
            id: key.1,
        }],
    };
    if let Err(e) = side.metad.abort_at(&p.leader, req).await {
        tracing::debug!(error = %e, key = %p.key, "abort failed (the reservation will expire)");
    }
    st
}

async fn put_abort(side: &Arc<Sidecar>, conn: &Conn, req: pb::PutAbortRequest) -> pb::Empty {
    for v in req.versions {
        let key = (v.term, v.id);
        let p = conn.pending.lock().remove(&key);
        if let Some(p) = p {
            abort(side, &p, key, uds::ok()).await;
        }
    }
    pb::Empty {}
}

// ---------------------------------------------------------------------- gets

async fn get(side: &Arc<Sidecar>, conn: &Conn, req: pb::GetRequest) -> pb::GetReply {
    let n = req.items.len();
    if n == 0 || n > MAX_ITEMS {
        let st = uds::status(
            pb::Code::InvalidArgument,
            format!("{n} items; 1..={MAX_ITEMS} per request"),
        );
        return pb::GetReply {
            items: (0..n)
                .map(|_| pb::GetResult {
                    status: Some(st.clone()),
                    ..Default::default()
                })
                .collect(),
        };
    }
    let keys: Vec<String> = req.items.iter().map(|i| i.key.clone()).collect();
    let placements = match side.metad.batch_get(keys, side.node_id()).await {
        Ok(r) if r.items.len() == n => r.items,
        Ok(_) => {
            return fail_all(
                n,
                uds::status(
                    pb::Code::Internal,
                    "metad answered the wrong number of placements",
                ),
            )
        }
        Err(e) => return fail_all(n, metad_err(&e)),
    };
    let work = req
        .items
        .iter()
        .zip(placements)
        .map(|(it, p)| get_item(side, conn, it, p));
    pb::GetReply {
        items: join_all(work).await,
    }
}

fn fail_all(n: usize, st: pb::Status) -> pb::GetReply {
    pb::GetReply {
        items: (0..n)
            .map(|_| pb::GetResult {
                status: Some(st.clone()),
                ..Default::default()
            })
            .collect(),
    }
}

async fn get_item(
    side: &Arc<Sidecar>,
    conn: &Conn,
    it: &pb::GetItem,
    p: mpb::ObjectPlacement,
) -> pb::GetResult {
    let st = p.status.clone().unwrap_or_default();
    if st.code != 0 {
        return pb::GetResult {
            status: Some(uds::status(code_of(st.code), st.message)),
            ..Default::default()
        };
    }
    let v = p.version.unwrap_or_default();
    let version = Version {
        term: v.term,
        id: v.id,
    };
    let base = pb::GetResult {
        status: Some(uds::ok()),
        size: p.size,
        checksum: p.checksum,
        version: Some(pb::Version {
            term: v.term,
            id: v.id,
        }),
        checksum_seed: version.seed(),
        ..Default::default()
    };
    if it.report_mismatch {
        side.metrics.checksum_mismatches.inc();
        tracing::warn!(key = %it.key, "a client found the local copy corrupt");
    }
    let local = p.replicas.iter().find(|r| side.is_local(r));
    if let (Some(l), true, false) = (local, it.local_ok, it.report_mismatch) {
        side.gets.fetch_add(1, Ordering::Relaxed);
        side.metrics.get_bytes.inc_by(p.size);
        return pb::GetResult {
            local_extents: l
                .extents
                .iter()
                .map(|e| pb::Extent {
                    offset: e.offset,
                    len: e.len,
                })
                .collect(),
            ..base
        };
    }
    // Deliver into the client's region, or inline.
    let inline_max = match &it.dest {
        None => Some(uds::MAX_INLINE),
        Some(pb::Region {
            r#where: Some(pb::region::Where::Inline(i)),
        }) => Some(i.max_len.min(uds::MAX_INLINE)),
        _ => None,
    };
    let candidates: Vec<&mpb::Replica> = p
        .replicas
        .iter()
        .filter(|r| !(it.report_mismatch && side.is_local(r)))
        .collect();
    let chunks = checksum::chunk_count(p.size);
    let mut hashes = vec![0u64; chunks];
    let mut mismatched = false;
    let mut last_err = String::from("no replica to read");
    if let Some(max) = inline_max {
        if p.size > max {
            return pb::GetResult {
                status: Some(uds::status(
                    pb::Code::NeedSpace,
                    format!("{} bytes do not fit inline", p.size),
                )),
                ..base
            };
        }
        let mut buf = vec![0u8; p.size as usize];
        for rep in candidates {
            match side.read_replica(rep, version, &mut buf, &mut hashes).await {
                Ok(()) if checksum::combine(version.seed(), &hashes) == p.checksum => {
                    side.gets.fetch_add(1, Ordering::Relaxed);
                    side.metrics.get_bytes.inc_by(p.size);
                    return pb::GetResult { data: buf, ..base };
                }
                Ok(()) => mismatch(side, &it.key, rep, &mut mismatched),
                Err(e) => last_err = format!("{}: {e}", rep.node_name),
            }
        }
    } else {
        let region = it.dest.clone().unwrap_or_default();
        let (seg, off) = match region_segment(conn, &region, p.size) {
            Ok(x) => x,
            Err(st) => {
                return pb::GetResult {
                    status: Some(st),
                    ..base
                }
            }
        };
        // SAFETY: `slice_mut` bounds-checks against the client's mapping, which `seg` keeps
        // alive; the client does not touch this window until the reply arrives.
        let dst = match unsafe { seg.slice_mut(off, p.size) } {
            Ok(d) => d,
            Err(e) => {
                return pb::GetResult {
                    status: Some(uds::status(pb::Code::InvalidArgument, e.to_string())),
                    ..base
                }
            }
        };
        for rep in candidates {
            match side.read_replica(rep, version, dst, &mut hashes).await {
                Ok(()) if checksum::combine(version.seed(), &hashes) == p.checksum => {
                    side.gets.fetch_add(1, Ordering::Relaxed);
                    side.metrics.get_bytes.inc_by(p.size);
                    return pb::GetResult {
                        delivered: true,
                        ..base
                    };
                }
                Ok(()) => mismatch(side, &it.key, rep, &mut mismatched),
                Err(e) => last_err = format!("{}: {e}", rep.node_name),
            }
        }
    }
    let st = if mismatched || it.report_mismatch {
        uds::status(
            pb::Code::Corrupt,
            "the bytes failed their checksum on every replica",
        )
    } else {
        uds::status(
            pb::Code::Unavailable,
            format!("no replica could be read: {last_err}"),
        )
    };
    side.metrics
        .op_errors
        .with_label_values(&[
            "get",
            &format!(
                "{:?}",
                pb::Code::try_from(st.code).unwrap_or(pb::Code::Internal)
            ),
        ])
        .inc();
    pb::GetResult {
        status: Some(st),
        ..base
    }
}

fn mismatch(side: &Sidecar, key: &str, rep: &mpb::Replica, flag: &mut bool) {
    *flag = true;
    side.metrics.checksum_mismatches.inc();
    tracing::warn!(key, node = %rep.node_name, "checksum mismatch: trying the next replica");
}

// ---------------------------------------------------------------------- keys and cluster

async fn exists(side: &Arc<Sidecar>, req: pb::KeysRequest) -> pb::ExistsReply {
    if req.keys.len() > MAX_ITEMS * 16 {
        return pb::ExistsReply {
            status: Some(uds::status(pb::Code::InvalidArgument, "too many keys")),
            exists: vec![],
        };
    }
    match side.metad.batch_exists(req.keys).await {
        Ok(e) => pb::ExistsReply {
            status: Some(uds::ok()),
            exists: e,
        },
        Err(e) => pb::ExistsReply {
            status: Some(metad_err(&e)),
            exists: vec![],
        },
    }
}

async fn get_size(side: &Arc<Sidecar>, req: pb::KeysRequest) -> pb::SizesReply {
    let n = req.keys.len();
    if n > MAX_ITEMS * 16 {
        return pb::SizesReply {
            status: Some(uds::status(pb::Code::InvalidArgument, "too many keys")),
            ..Default::default()
        };
    }
    match side.metad.batch_get(req.keys, side.node_id()).await {
        Ok(r) => pb::SizesReply {
            status: Some(uds::ok()),
            statuses: r
                .items
                .iter()
                .map(|p| {
                    let st = p.status.clone().unwrap_or_default();
                    uds::status(code_of(st.code), st.message)
                })
                .collect(),
            sizes: r.items.iter().map(|p| p.size).collect(),
        },
        Err(e) => pb::SizesReply {
            status: Some(metad_err(&e)),
            ..Default::default()
        },
    }
}

async fn remove(side: &Arc<Sidecar>, req: pb::KeysRequest) -> pb::RemoveReply {
    let keys = req.keys.clone();
    match remove_counting_failures(&side.metad, req.keys).await {
        Ok((r, failed_attempts)) => pb::RemoveReply {
            status: Some(uds::ok()),
            statuses: keys
                .iter()
                .zip(
                    r.codes
                        .iter()
                        .chain(std::iter::repeat(&(mpb::Code::Internal as i32))),
                )
                .map(|(k, c)| remove_status(k, *c, failed_attempts))
                .collect(),
        },
        Err(e) => pb::RemoveReply {
            status: Some(metad_err(&e)),
            statuses: vec![],
        },
    }
}

/// A remove through the leader-following client (which retries across elections), and how
/// many of its attempts failed without an answer. Such an attempt may have been applied.
async fn remove_counting_failures(
    metad: &regolith_proto::client::MetadClient,
    keys: Vec<String>,
) -> regolith_proto::Result<(mpb::RemoveResponse, u32)> {
    let req = mpb::RemoveRequest { keys };
    let failed = std::sync::atomic::AtomicU32::new(0);
    let (req, counter) = (&req, &failed);
    let (resp, _) = metad
        .call("remove", |mut c| async move {
            let r = c.remove(req.clone()).await;
            if r.is_err() {
                counter.fetch_add(1, Ordering::Relaxed);
            }
            r
        })
        .await?;
    Ok((resp, failed.load(Ordering::Relaxed)))
}

/// One key's answer to a remove. NOT_FOUND after an attempt that got no answer is no proof the
/// key was absent — that attempt may have removed it — so it answers TIMEOUT (outcome unknown).
fn remove_status(key: &str, code: i32, failed_attempts: u32) -> pb::Status {
    let code = code_of(code);
    match code {
        pb::Code::Ok => uds::ok(),
        pb::Code::NotFound if failed_attempts > 0 => uds::status(
            pb::Code::Timeout,
            format!(
                "{key:?}: outcome unknown: not found now, but an earlier attempt got no answer \
                 and may have removed it"
            ),
        ),
        code => uds::status(code, format!("{key:?}: {code:?}")),
    }
}

async fn remove_all(side: &Arc<Sidecar>) -> pb::RemoveAllReply {
    match side.metad.remove_all().await {
        Ok(n) => pb::RemoveAllReply {
            status: Some(uds::ok()),
            removed: n,
        },
        Err(e) => pb::RemoveAllReply {
            status: Some(metad_err(&e)),
            removed: 0,
        },
    }
}

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

async fn list_segments(side: &Arc<Sidecar>) -> pb::SegmentsReply {
    match side.metad.list_segments().await {
        Ok(segs) => pb::SegmentsReply {
            status: Some(uds::ok()),
            segments: segs
                .into_iter()
                .map(|s| pb::SegmentInfo {
                    local: s.node_id == side.node_id(),
                    node_name: s.node_name,
                    node_id: s.node_id,
                    capacity: s.capacity,
                    used: s.used,
                    alive: s.alive,
                    draining: s.state == mpb::SegmentState::SegmentDraining as i32,
                    objects: s.objects,
                })
                .collect(),
        },
        Err(e) => pb::SegmentsReply {
            status: Some(metad_err(&e)),
            segments: vec![],
        },
    }
}

async fn stats(side: &Arc<Sidecar>) -> pb::StatsReply {
    let m = side.metad.stats().await;
    let (term, leader) = *side.leader.lock();
    let mut r = pb::StatsReply {
        status: Some(uds::ok()),
        node_name: side.settings.node_name.clone(),
        node_id: side.node_id(),
        segment_size: side.segment.len(),
        segment_used: side.segment_used.load(Ordering::Relaxed),
        clients: side.clients.load(Ordering::Relaxed),
        puts: side.puts.load(Ordering::Relaxed),
        gets: side.gets.load(Ordering::Relaxed),
        checksum_mismatches: side.metrics.checksum_mismatches.get(),
        metad_term: term,
        metad_leader: leader,
        ..Default::default()
    };
    match m {
        Ok(s) => {
            r.keys = s.keys;
            r.bytes_used = s.bytes_used;
            r.bytes_total = s.bytes_total;
        }
        Err(e) => r.status = Some(metad_err(&e)),
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commit_without_a_definite_answer_is_outcome_unknown() {
        let rpc = |code| regolith_proto::Error::Rpc {
            addr: "m1:50051".into(),
            code,
            message: String::new(),
        };
        for e in [
            rpc(tonic::Code::DeadlineExceeded),
            rpc(tonic::Code::Unavailable),
            rpc(tonic::Code::Cancelled),
            regolith_proto::Error::NotLeader {
                addr: "m1:50051".into(),
                leader: None,
            },
        ] {
            assert_eq!(commit_err(&e).code, pb::Code::Timeout as i32, "{e}");
        }
        assert_eq!(
            commit_err(&rpc(tonic::Code::InvalidArgument)).code,
            pb::Code::InvalidArgument as i32
        );
        let never_sent = regolith_proto::Error::BadAddress {
            addr: "x".into(),
            reason: "bad".into(),
        };
        assert_eq!(commit_err(&never_sent).code, pb::Code::Unavailable as i32);
    }

    #[test]
    fn not_found_after_an_unanswered_remove_attempt_is_outcome_unknown() {
        let not_found = mpb::Code::NotFound as i32;
        assert_eq!(
            remove_status("k", not_found, 0).code,
            pb::Code::NotFound as i32
        );
        assert_eq!(
            remove_status("k", not_found, 1).code,
            pb::Code::Timeout as i32
        );
        assert_eq!(remove_status("k", mpb::Code::Ok as i32, 2).code, 0);
    }
}
