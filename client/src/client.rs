//! [`AsyncClient`]: puts and gets through the local sidecar.
//!
//! A put reserves space (`PUT_BEGIN`); when a replica is on this node the client copies the
//! value into the mapped segment itself (one memcpy, the checksum computed chunk by chunk while
//! the bytes are cache-hot); remote replicas are written by the sidecar, from the local replica,
//! from a registered buffer, or from this connection's staging area; then `PUT_COMMIT`.
//! A get answers with local extents (the client copies out and verifies) or delivers the bytes,
//! verified by the sidecar, into staging or a registered buffer. Callers always get a private
//! copy, never a view into the segment.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use regolith_proto::uds::{self, pb, Op};

use crate::conn::Conn;
use crate::error::{Error, Result};
use crate::reconnect::Reconnect;
use crate::shm::{Mapping, ShmBuffer};
use crate::staging::{Staging, Window};

mod get;
mod put;

/// Default socket of the node's sidecar.
pub const DEFAULT_SOCKET: &str = "/run/regolith/sidecar.sock";

/// Values up to this size go inline in the frame when they need to cross to the sidecar.
const INLINE_PUT: usize = 64 * 1024;

/// Attempts of a put or get when the cluster is changing leader.
const ATTEMPTS: usize = 6;

/// The pause after failed attempt `n` (0-based): 50 ms doubling to 800 ms, 1.55 s in all, which
/// covers a new leader's wait for the sidecars' heartbeats (one a second) before it places.
fn retry_pause(n: usize) -> std::time::Duration {
    std::time::Duration::from_millis(50u64 << n.min(4))
}

#[derive(Clone, Debug)]
pub struct ClientConfig {
    pub socket: PathBuf,
    /// Staging area to ask for (0: the sidecar's default).
    pub staging_size: u64,
    pub name: String,
}

impl ClientConfig {
    /// `REGOLITH_SOCKET`, else the default path.
    pub fn from_env() -> Self {
        let socket = std::env::var_os("REGOLITH_SOCKET")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET));
        Self::new(socket)
    }

    pub fn new(socket: impl Into<PathBuf>) -> Self {
        Self {
            socket: socket.into(),
            staging_size: 0,
            name: format!("pid-{}", std::process::id()),
        }
    }
}

/// How a put is replicated and protected (Mooncake's `ReplicateConfig`).
#[derive(Clone, Debug, Default)]
pub struct ReplicateConfig {
    /// Replicas on distinct nodes (0 means 1).
    pub replica_num: u32,
    /// Node names to place on, in order of preference.
    pub preferred_segments: Vec<String>,
    /// First replica on this node when it has room.
    pub prefer_local: bool,
    pub soft_pin: bool,
    pub hard_pin: bool,
    pub soft_pin_ttl: Option<Duration>,
    pub ttl: Option<Duration>,
    /// Replace the object if the key exists (Mooncake's upsert) instead of failing with
    /// `AlreadyExists`; readers see the old value or the new one, whole.
    pub upsert: bool,
}

impl ReplicateConfig {
    fn options(&self) -> pb::PutOptions {
        pb::PutOptions {
            replicas: self.replica_num.max(1),
            preferred_segments: self.preferred_segments.clone(),
            prefer_local: self.prefer_local,
            pin: if self.hard_pin {
                pb::PinKind::PinHard as i32
            } else if self.soft_pin {
                pb::PinKind::PinSoft as i32
            } else {
                pb::PinKind::PinNone as i32
            },
            soft_pin_ttl_ms: self.soft_pin_ttl.map(|d| d.as_millis() as u64).unwrap_or(0),
            ttl_ms: self.ttl.map(|d| d.as_millis() as u64).unwrap_or(0),
            upsert: self.upsert,
        }
    }
}

/// Where a put's replicas landed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaLocation {
    pub node_name: String,
    pub node_id: u64,
    pub local: bool,
    /// Byte offset of the replica's first extent in its node's segment.
    pub offset: u64,
}

/// An object's size and where its replicas are ([`AsyncClient::batch_locate`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Located {
    pub size: u64,
    pub replicas: Vec<ReplicaLocation>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PutInfo {
    pub replicas: Vec<ReplicaLocation>,
}

/// The bytes of a put.
#[derive(Clone, Copy, Debug)]
pub enum Source<'a> {
    /// Any memory: crosses to the sidecar through staging (or inline) when it has to.
    Bytes(&'a [u8]),
    /// A window of a registered buffer: the sidecar reads it directly.
    Shm {
        buf: &'a ShmBuffer,
        offset: usize,
        len: usize,
    },
    /// The concatenation of several pieces of any memory, in order (a gather list): hashed and
    /// copied piece by piece, never joined first.
    Parts(&'a [&'a [u8]]),
}

impl Source<'_> {
    fn len(&self) -> usize {
        match self {
            Source::Bytes(b) => b.len(),
            Source::Shm { len, .. } => *len,
            Source::Parts(p) => crate::gather::total(p),
        }
    }
}

/// Where a get delivers.
#[derive(Debug)]
pub enum Dest<'a> {
    Bytes(&'a mut [u8]),
    Shm {
        buf: &'a ShmBuffer,
        offset: usize,
        len: usize,
    },
    /// Several pieces of memory filled in order (a scatter list); their total length is the
    /// room the object may take.
    Parts(Vec<&'a mut [u8]>),
}

impl Dest<'_> {
    fn len(&self) -> usize {
        match self {
            Dest::Bytes(b) => b.len(),
            Dest::Shm { len, .. } => *len,
            Dest::Parts(p) => crate::gather::total_mut(p),
        }
    }
}

/// Memory lent to one request: a staging window, or a temporary registered buffer for objects
/// larger than the whole staging area.
enum Held {
    Window(Window),
    Temp(ShmBuffer, u64),
}

impl Held {
    fn region(&self, len: u64) -> pb::Region {
        match self {
            Held::Window(w) => window(w, len),
            Held::Temp(_, id) => pb::Region {
                r#where: Some(pb::region::Where::Shm(pb::ShmWindow {
                    shm_id: *id,
                    offset: 0,
                    len,
                })),
            },
        }
    }

    fn read(&self, s: &Session, dst: &mut [u8]) -> Result<()> {
        self.read_at(s, 0, dst)
    }

    /// Reads `dst.len()` bytes from `at` bytes into the lent memory.
    fn read_at(&self, s: &Session, at: usize, dst: &mut [u8]) -> Result<()> {
        match self {
            Held::Window(w) => s.staging.read(w.offset + at as u64, dst),
            Held::Temp(b, _) => b.read(at, dst),
        }
    }

    fn write_hashed(&self, s: &Session, src: &[u8], seed: u64, hashes: &mut [u64]) -> Result<()> {
        self.write_hashed_at(s, 0, src, seed, hashes)
    }

    /// Copies `src` to `at` bytes into the lent memory (`at` on a chunk boundary), hashing its
    /// chunks into `hashes`.
    fn write_hashed_at(
        &self,
        s: &Session,
        at: usize,
        src: &[u8],
        seed: u64,
        hashes: &mut [u64],
    ) -> Result<()> {
        match self {
            Held::Window(w) => s
                .staging
                .write_hashed(w.offset + at as u64, src, seed, hashes),
            Held::Temp(b, _) => b.inner.map.write_hashed(at as u64, src, seed, hashes),
        }
    }
}

pub(crate) struct Session {
    pub id: u64,
    pub conn: Arc<Conn>,
    pub hello: pb::HelloReply,
    pub segment: Option<Mapping>,
    pub staging: Mapping,
    pub stage: Arc<Staging>,
}

static SESSIONS: AtomicU64 = AtomicU64::new(1);

#[derive(Clone)]
pub struct AsyncClient {
    cfg: ClientConfig,
    session: Arc<tokio::sync::Mutex<SessionSlot>>,
}

/// The current session and when the next attempt to open one may start.
#[derive(Default)]
struct SessionSlot {
    current: Option<Arc<Session>>,
    reconnect: Reconnect,
}

impl std::fmt::Debug for AsyncClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncClient")
            .field("socket", &self.cfg.socket)
            .finish()
    }
}

fn st_err(key: &str, st: &Option<pb::Status>) -> Option<Error> {
    Error::of_status(key, st.as_ref())
}

fn locations(r: &[pb::ReplicaInfo]) -> Vec<ReplicaLocation> {
    r.iter()
        .map(|x| ReplicaLocation {
            node_name: x.node_name.clone(),
            node_id: x.node_id,
            local: x.local,
            offset: x.offset,
        })
        .collect()
}

fn window(w: &Window, len: u64) -> pb::Region {
    pb::Region {
        r#where: Some(pb::region::Where::Staging(pb::Window {
            offset: w.offset,
            len,
        })),
    }
}

impl AsyncClient {
    /// Connects to the sidecar (hello, mapping of the segment and staging area).
    pub async fn connect(cfg: ClientConfig) -> Result<Self> {
        let c = Self {
            cfg,
            session: Arc::new(tokio::sync::Mutex::new(SessionSlot::default())),
        };
        c.session().await?;
        Ok(c)
    }

    async fn open(&self) -> Result<Arc<Session>> {
        let (conn, hello) =
            Conn::connect(&self.cfg.socket, self.cfg.staging_size, &self.cfg.name).await?;
        let segment = match hello.segment_fd {
            Some(fd) => Some(Mapping::from_fd(fd, "segment")?),
            None => None,
        };
        let staging = Mapping::from_fd(hello.staging_fd, "staging area")?;
        staging.prefault();
        let stage = Staging::new(staging.len());
        if let Some(seg) = &segment {
            // Pre-fault the segment mapping off the request path: first-touch faults are slow.
            let base = seg.base() as usize;
            let len = seg.len() as usize;
            std::thread::spawn(move || {
                // SAFETY: MADV_POPULATE_WRITE on a range of a live shared mapping only faults
                // pages in; if the mapping is gone by then the call fails harmlessly (ENOMEM).
                unsafe { nix::libc::madvise(base as *mut _, len, 23) };
            });
        }
        tracing::debug!(node = %hello.reply.node_name, segment = hello.reply.segment_size, staging = staging.len(), "connected to sidecar");
        Ok(Arc::new(Session {
            id: SESSIONS.fetch_add(1, Ordering::Relaxed),
            conn,
            hello: hello.reply,
            segment,
            staging,
            stage,
        }))
    }

    /// The current session, reconnecting (new hello, new mappings) when the sidecar went away.
    ///
    /// Attempts are spaced by [`Reconnect`] (10 ms doubling to 1 s): a caller that retries
    /// failed calls in a tight loop waits here instead of hammering a restarting sidecar, and
    /// concurrent callers share one attempt (the lock is held across it).
    pub(crate) async fn session(&self) -> Result<Arc<Session>> {
        let mut slot = self.session.lock().await;
        if let Some(s) = slot.current.as_ref() {
            if s.conn.is_alive() {
                return Ok(s.clone());
            }
            tracing::info!("sidecar connection lost; reconnecting");
            slot.current = None;
        }
        let wait = slot.reconnect.wait(Instant::now());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        match self.open().await {
            Ok(s) => {
                if slot.reconnect.failures() > 0 {
                    tracing::info!(
                        attempts = slot.reconnect.failures() + 1,
                        "reconnected to the sidecar"
                    );
                }
                slot.reconnect.succeeded();
                slot.current = Some(s.clone());
                Ok(s)
            }
            Err(e) => {
                slot.reconnect.failed(Instant::now());
                Err(e)
            }
        }
    }

    /// The node name of the sidecar (Mooncake's `get_hostname`).
    pub async fn node_name(&self) -> Result<String> {
        Ok(self.session().await?.hello.node_name.clone())
    }

    pub async fn hello_info(&self) -> Result<pb::HelloReply> {
        Ok(self.session().await?.hello.clone())
    }

    // ------------------------------------------------------------------ puts

    /// A staging window of `len` bytes, or a temporary registered buffer when `len` exceeds the
    /// whole staging area.
    async fn lend(&self, s: &Session, len: u64) -> Result<Held> {
        if len <= s.stage.capacity() {
            return Ok(Held::Window(s.stage.alloc(len).await?));
        }
        let buf = ShmBuffer::new(Mapping::create(len.max(1), "large")?);
        let id = self.registered(s, &buf).await?;
        Ok(Held::Temp(buf, id))
    }

    /// Gives lent memory back (temporary buffers are unregistered).
    async fn give_back(&self, held: Vec<Held>) {
        for h in held {
            if let Held::Temp(buf, _) = h {
                let _ = self.free_buffer(&buf).await;
            }
        }
    }

    pub async fn exists(&self, key: &str) -> Result<bool> {
        Ok(self
            .batch_exists(&[key])
            .await?
            .first()
            .copied()
            .unwrap_or(false))
    }

    pub async fn batch_exists(&self, keys: &[&str]) -> Result<Vec<bool>> {
        let s = self.session().await?;
        let r: pb::ExistsReply = s.conn.call(Op::Exists, &keys_req(keys)).await?;
        if let Some(e) = st_err("", &r.status) {
            return Err(e);
        }
        Ok(r.exists)
    }

    pub async fn get_size(&self, key: &str) -> Result<u64> {
        self.batch_get_size(&[key])
            .await?
            .pop()
            .unwrap_or_else(|| Err(Error::Protocol("no reply item".into())))
    }

    pub async fn batch_get_size(&self, keys: &[&str]) -> Result<Vec<Result<u64>>> {
        let s = self.session().await?;
        let r: pb::SizesReply = s.conn.call(Op::GetSize, &keys_req(keys)).await?;
        if let Some(e) = st_err("", &r.status) {
            return Err(e);
        }
        Ok(keys
            .iter()
            .zip(r.statuses.iter().zip(&r.sizes))
            .map(|(k, (st, size))| match Error::of_status(k, Some(st)) {
                Some(e) => Err(e),
                None => Ok(*size),
            })
            .collect())
    }

    /// Per key, the object's size and where its replicas are (a lease read at the leader, as a
    /// get's: Mooncake's `get_replica_desc`).
    pub async fn batch_locate(&self, keys: &[&str]) -> Result<Vec<Result<Located>>> {
        let s = self.session().await?;
        let r: pb::SizesReply = s.conn.call(Op::GetSize, &keys_req(keys)).await?;
        if let Some(e) = st_err("", &r.status) {
            return Err(e);
        }
        let empty = pb::ReplicaList::default();
        Ok(keys
            .iter()
            .enumerate()
            .map(|(i, k)| {
                let st = r.statuses.get(i);
                if let Some(e) = Error::of_status(k, st) {
                    return Err(e);
                }
                if st.is_none() {
                    return Err(Error::Protocol("get_size answered too few items".into()));
                }
                Ok(Located {
                    size: r.sizes.get(i).copied().unwrap_or(0),
                    replicas: locations(&r.replicas.get(i).unwrap_or(&empty).replicas),
                })
            })
            .collect())
    }

    pub async fn remove(&self, key: &str) -> Result<()> {
        self.batch_remove(&[key])
            .await?
            .pop()
            .unwrap_or_else(|| Err(Error::Protocol("no reply item".into())))
    }

    pub async fn batch_remove(&self, keys: &[&str]) -> Result<Vec<Result<()>>> {
        let s = self.session().await?;
        let r: pb::RemoveReply = s.conn.call(Op::Remove, &keys_req(keys)).await?;
        if let Some(e) = st_err("", &r.status) {
            return Err(e);
        }
        Ok(keys
            .iter()
            .zip(&r.statuses)
            .map(|(k, st)| Error::of_status(k, Some(st)).map_or(Ok(()), Err))
            .collect())
    }

    pub async fn remove_all(&self) -> Result<u64> {
        let s = self.session().await?;
        let r: pb::RemoveAllReply = s.conn.call(Op::RemoveAll, &pb::Empty {}).await?;
        if let Some(e) = st_err("", &r.status) {
            return Err(e);
        }
        Ok(r.removed)
    }

    /// One page of the cluster's keys in key order, with their sizes, from after `start_after`
    /// (empty: the start of `prefix`); the key to resume after, empty when done.
    pub async fn list_keys(
        &self,
        prefix: &str,
        start_after: &str,
        limit: u32,
    ) -> Result<(Vec<(String, u64)>, String)> {
        let s = self.session().await?;
        let req = pb::ListKeysRequest {
            prefix: prefix.to_string(),
            start_after: start_after.to_string(),
            limit,
        };
        let r: pb::ListKeysReply = s.conn.call(Op::ListKeys, &req).await?;
        if let Some(e) = st_err("", &r.status) {
            return Err(e);
        }
        let sizes = r.sizes.into_iter().chain(std::iter::repeat(0));
        Ok((r.keys.into_iter().zip(sizes).collect(), r.next_start_after))
    }

    pub async fn list_segments(&self) -> Result<Vec<pb::SegmentInfo>> {
        let s = self.session().await?;
        let r: pb::SegmentsReply = s.conn.call(Op::ListSegments, &pb::Empty {}).await?;
        if let Some(e) = st_err("", &r.status) {
            return Err(e);
        }
        Ok(r.segments)
    }

    pub async fn stats(&self) -> Result<pb::StatsReply> {
        let s = self.session().await?;
        let r: pb::StatsReply = s.conn.call(Op::Stats, &pb::Empty {}).await?;
        if let Some(e) = st_err("", &r.status) {
            return Err(e);
        }
        Ok(r)
    }

    // ------------------------------------------------------------------ shared buffers

    /// A buffer in shared memory registered with the sidecar: puts from it and gets into it
    /// need no staging copy.
    pub async fn alloc_buffer(&self, size: usize) -> Result<ShmBuffer> {
        let buf = ShmBuffer::new(Mapping::create(size as u64, "buffer")?);
        let s = self.session().await?;
        self.registered(&s, &buf).await?;
        Ok(buf)
    }

    /// The buffer's id with this session's sidecar, registering it (again) when needed.
    async fn registered(&self, s: &Session, buf: &ShmBuffer) -> Result<u64> {
        if let Some((sid, id)) = *buf.inner.reg.lock() {
            if sid == s.id {
                return Ok(id);
            }
        }
        let r: pb::RegisterShmReply = s
            .conn
            .call_with_fd(
                Op::RegisterShm,
                &pb::RegisterShmRequest {
                    size: buf.len() as u64,
                },
                buf.inner.map.fd(),
            )
            .await?;
        if let Some(e) = st_err("", &r.status) {
            return Err(e);
        }
        *buf.inner.reg.lock() = Some((s.id, r.shm_id));
        Ok(r.shm_id)
    }

    /// Unregisters a buffer from the sidecar (it stays usable as plain memory).
    pub async fn free_buffer(&self, buf: &ShmBuffer) -> Result<()> {
        let reg = buf.inner.reg.lock().take();
        if let Some((sid, id)) = reg {
            let s = self.session().await?;
            if s.id == sid {
                let r: pb::StatusReply = s
                    .conn
                    .call(Op::UnregisterShm, &pb::UnregisterShmRequest { shm_id: id })
                    .await?;
                if let Some(e) = st_err("", &r.status) {
                    return Err(e);
                }
            }
        }
        Ok(())
    }
}

fn keys_req(keys: &[&str]) -> pb::KeysRequest {
    pb::KeysRequest {
        keys: keys.iter().map(|k| k.to_string()).collect(),
    }
}

/// Splits item indices into groups whose staging needs fit in `capacity`.
fn groups(todo: &[usize], need: impl Fn(usize) -> u64, capacity: u64) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut cur = Vec::new();
    let mut used = 0u64;
    for &i in todo {
        let n = need(i).div_ceil(64 * 1024) * 64 * 1024;
        if !cur.is_empty() && used + n > capacity {
            out.push(std::mem::take(&mut cur));
            used = 0;
        }
        used += n;
        cur.push(i);
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}
