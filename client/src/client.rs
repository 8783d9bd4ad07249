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
use std::time::Duration;

use regolith_proto::checksum;
use regolith_proto::uds::{self, pb, Op};

use crate::conn::Conn;
use crate::error::{Error, Result};
use crate::shm::{Mapping, ShmBuffer};
use crate::staging::{Staging, Window};

/// Default socket of the node's sidecar.
pub const DEFAULT_SOCKET: &str = "/run/regolith/sidecar.sock";

/// Values up to this size go inline in the frame when they need to cross to the sidecar.
const INLINE_PUT: usize = 64 * 1024;

/// Attempts of a put or get when the cluster is changing leader.
const ATTEMPTS: usize = 4;

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
        }
    }
}

/// Where a put's replicas landed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaLocation {
    pub node_name: String,
    pub node_id: u64,
    pub local: bool,
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
}

impl Source<'_> {
    fn len(&self) -> usize {
        match self {
            Source::Bytes(b) => b.len(),
            Source::Shm { len, .. } => *len,
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
}

impl Dest<'_> {
    fn len(&self) -> usize {
        match self {
            Dest::Bytes(b) => b.len(),
            Dest::Shm { len, .. } => *len,
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
        match self {
            Held::Window(w) => s.staging.read(w.offset, dst),
            Held::Temp(b, _) => b.read(0, dst),
        }
    }

    fn write_hashed(&self, s: &Session, src: &[u8], seed: u64, hashes: &mut [u64]) -> Result<()> {
        match self {
            Held::Window(w) => s.staging.write_hashed(w.offset, src, seed, hashes),
            Held::Temp(b, _) => b.inner.map.write_hashed(0, src, seed, hashes),
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
    session: Arc<tokio::sync::Mutex<Option<Arc<Session>>>>,
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
            session: Arc::new(tokio::sync::Mutex::new(None)),
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
    pub(crate) async fn session(&self) -> Result<Arc<Session>> {
        let mut guard = self.session.lock().await;
        if let Some(s) = guard.as_ref() {
            if s.conn.is_alive() {
                return Ok(s.clone());
            }
            tracing::info!("sidecar connection lost; reconnecting");
        }
        let s = self.open().await?;
        *guard = Some(s.clone());
        Ok(s)
    }

    /// The node name of the sidecar (Mooncake's `get_hostname`).
    pub async fn node_name(&self) -> Result<String> {
        Ok(self.session().await?.hello.node_name.clone())
    }

    pub async fn hello_info(&self) -> Result<pb::HelloReply> {
        Ok(self.session().await?.hello.clone())
    }

    // ------------------------------------------------------------------ puts

    pub async fn put(&self, key: &str, data: &[u8], cfg: &ReplicateConfig) -> Result<PutInfo> {
        self.put_from(key, Source::Bytes(data), cfg).await
    }

    pub async fn put_from(
        &self,
        key: &str,
        src: Source<'_>,
        cfg: &ReplicateConfig,
    ) -> Result<PutInfo> {
        self.batch_put_from(&[(key, src)], cfg)
            .await
            .pop()
            .unwrap_or_else(|| Err(Error::Protocol("no reply item".into())))
    }

    /// Puts many objects with one reserve and one commit round trip (per staging-sized group).
    pub async fn batch_put_from(
        &self,
        items: &[(&str, Source<'_>)],
        cfg: &ReplicateConfig,
    ) -> Vec<Result<PutInfo>> {
        let mut out: Vec<Option<Result<PutInfo>>> = (0..items.len()).map(|_| None).collect();
        let mut todo: Vec<usize> = (0..items.len()).collect();
        for _ in 0..ATTEMPTS {
            if todo.is_empty() {
                break;
            }
            let s = match self.session().await {
                Ok(s) => s,
                Err(e) => {
                    for i in &todo {
                        out[*i] = Some(Err(e.clone()));
                    }
                    break;
                }
            };
            let mut retry = Vec::new();
            for group in groups(&todo, |i| items[i].1.len() as u64, s.stage.capacity()) {
                let res = self.put_group(&s, &group, items, cfg).await;
                for (i, (r, commit_sent)) in group.into_iter().zip(res) {
                    match r {
                        Err(e) if may_retry_put(&e, commit_sent) => {
                            out[i] = Some(Err(e));
                            retry.push(i);
                        }
                        r => out[i] = Some(r),
                    }
                }
            }
            todo = retry;
            if !todo.is_empty() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        out.into_iter()
            .map(|o| o.unwrap_or_else(|| Err(Error::Protocol("put not attempted".into()))))
            .collect()
    }

    /// One reserve and one commit round trip for `group`; per item, the result and whether its
    /// commit was sent.
    async fn put_group(
        &self,
        s: &Session,
        group: &[usize],
        items: &[(&str, Source<'_>)],
        cfg: &ReplicateConfig,
    ) -> Vec<(Result<PutInfo>, bool)> {
        let options = cfg.options();
        let req = pb::PutBeginRequest {
            items: group
                .iter()
                .map(|&i| pb::PutBeginItem {
                    key: items[i].0.to_string(),
                    size: items[i].1.len() as u64,
                    options: Some(options.clone()),
                })
                .collect(),
        };
        let reply: pb::PutBeginReply = match s.conn.call(Op::PutBegin, &req).await {
            Ok(r) => r,
            Err(e) => return group.iter().map(|_| (Err(e.clone()), false)).collect(),
        };
        if reply.items.len() != group.len() {
            return group
                .iter()
                .map(|_| {
                    let e = Error::Protocol("put_begin answered the wrong number of items".into());
                    (Err(e), false)
                })
                .collect();
        }
        let mut results: Vec<Option<Result<PutInfo>>> = (0..group.len()).map(|_| None).collect();
        let mut commits = Vec::new();
        let mut committed_idx = Vec::new();
        let mut aborts = Vec::new();
        let mut windows = Vec::new();
        for (j, (&i, ticket)) in group.iter().zip(&reply.items).enumerate() {
            let (key, src) = (items[i].0, items[i].1);
            if let Some(e) = st_err(key, &ticket.status) {
                results[j] = Some(Err(e));
                continue;
            }
            match self.place_bytes(s, ticket, src).await {
                Ok((item, w)) => {
                    commits.push(item);
                    committed_idx.push(j);
                    windows.extend(w);
                }
                Err(e) => {
                    if let Some(v) = ticket.version {
                        aborts.push(v);
                    }
                    results[j] = Some(Err(e));
                }
            }
        }
        if !aborts.is_empty() {
            let _ = s
                .conn
                .call::<_, pb::Empty>(Op::PutAbort, &pb::PutAbortRequest { versions: aborts })
                .await;
        }
        if !commits.is_empty() {
            let reply: Result<pb::PutCommitReply> = s
                .conn
                .call(Op::PutCommit, &pb::PutCommitRequest { items: commits })
                .await;
            drop(windows);
            match reply {
                Ok(r) if r.items.len() == committed_idx.len() => {
                    for (j, res) in committed_idx.iter().zip(r.items) {
                        let key = items[group[*j]].0;
                        results[*j] = Some(match st_err(key, &res.status) {
                            Some(e) => Err(e),
                            None => Ok(PutInfo {
                                replicas: locations(&res.replicas),
                            }),
                        });
                    }
                }
                Ok(_) => {
                    for j in &committed_idx {
                        results[*j] = Some(Err(Error::Protocol(
                            "put_commit answered the wrong number of items".into(),
                        )));
                    }
                }
                Err(e) => {
                    for j in &committed_idx {
                        results[*j] = Some(Err(e.clone()));
                    }
                }
            }
        }
        results
            .into_iter()
            .enumerate()
            .map(|(j, r)| {
                let r = r.unwrap_or_else(|| Err(Error::Protocol("item not processed".into())));
                (r, committed_idx.contains(&j))
            })
            .collect()
    }

    /// Puts the bytes where the sidecar needs them: into the local extents (copy + checksum),
    /// or a source region for the sidecar to send to remote replicas.
    async fn place_bytes(
        &self,
        s: &Session,
        t: &pb::PutTicket,
        src: Source<'_>,
    ) -> Result<(pb::PutCommitItem, Option<Held>)> {
        let size = src.len();
        let seed = t.checksum_seed;
        let mut hashes = vec![0u64; checksum::chunk_count(size as u64)];
        let version = t.version;
        if !t.local_extents.is_empty() {
            let seg = s.segment.as_ref().ok_or_else(|| {
                Error::Protocol("local extents on a node without a segment".into())
            })?;
            with_source(&src, |bytes| {
                copy_to_extents(seg, &t.local_extents, bytes, seed, &mut hashes)
            })??;
            let item = pb::PutCommitItem {
                version,
                checksum: checksum::combine(seed, &hashes),
                checksum_known: true,
                source: None,
            };
            return Ok((item, None));
        }
        if !t.remote {
            return Err(Error::Protocol(
                "reservation with neither a local nor a remote replica".into(),
            ));
        }
        match src {
            Source::Shm { buf, offset, len } => {
                let shm_id = self.registered(s, buf).await?;
                let region = pb::Region {
                    r#where: Some(pb::region::Where::Shm(pb::ShmWindow {
                        shm_id,
                        offset: offset as u64,
                        len: len as u64,
                    })),
                };
                Ok((
                    pb::PutCommitItem {
                        version,
                        checksum: 0,
                        checksum_known: false,
                        source: Some(region),
                    },
                    None,
                ))
            }
            Source::Bytes(b) if b.len() <= INLINE_PUT => {
                let region = pb::Region {
                    r#where: Some(pb::region::Where::Inline(pb::Inline {
                        data: b.to_vec(),
                        max_len: 0,
                    })),
                };
                let ck = checksum::checksum(seed, b);
                Ok((
                    pb::PutCommitItem {
                        version,
                        checksum: ck,
                        checksum_known: true,
                        source: Some(region),
                    },
                    None,
                ))
            }
            Source::Bytes(b) => {
                let held = self.lend(s, b.len() as u64).await?;
                held.write_hashed(s, b, seed, &mut hashes)?;
                let item = pb::PutCommitItem {
                    version,
                    checksum: checksum::combine(seed, &hashes),
                    checksum_known: true,
                    source: Some(held.region(b.len() as u64)),
                };
                Ok((item, Some(held)))
            }
        }
    }

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

    // ------------------------------------------------------------------ gets

    /// A private copy of the object.
    pub async fn get(&self, key: &str) -> Result<Vec<u8>> {
        let mut last = None;
        for _ in 0..ATTEMPTS {
            match self.get_once(key).await {
                Err(e) if e.is_retryable() || matches!(e, Error::Disconnected(_)) => {
                    last = Some(e);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                r => return r,
            }
        }
        Err(last.unwrap_or_else(|| Error::Protocol("get not attempted".into())))
    }

    async fn get_once(&self, key: &str) -> Result<Vec<u8>> {
        let s = self.session().await?;
        let inline = pb::Region {
            r#where: Some(pb::region::Where::Inline(pb::Inline {
                data: vec![],
                max_len: uds::MAX_INLINE,
            })),
        };
        let mut item = pb::GetItem {
            key: key.to_string(),
            dest: Some(inline),
            local_ok: true,
            report_mismatch: false,
        };
        for _ in 0..2 {
            let r = get_one(&s, item.clone()).await?;
            let code = r.status.as_ref().map(|s| s.code).unwrap_or(0);
            if code == pb::Code::NeedSpace as i32 {
                let held = self.lend(&s, r.size).await?;
                let it = pb::GetItem {
                    key: key.to_string(),
                    dest: Some(held.region(r.size)),
                    local_ok: true,
                    report_mismatch: item.report_mismatch,
                };
                let out = match get_one(&s, it).await {
                    Ok(r) => match self.finish_get(&s, key, &r, Some(&held)) {
                        Ok(Finish::Local) => self.read_local_vec(&s, key, &r).and_then(|v| {
                            v.ok_or_else(|| Error::Corrupt {
                                key: key.to_string(),
                            })
                        }),
                        Ok(Finish::Done(v)) => Ok(v),
                        Err(e) => Err(e),
                    },
                    Err(e) => Err(e),
                };
                self.give_back(vec![held]).await;
                return out;
            }
            match self.finish_get(&s, key, &r, None)? {
                Finish::Done(v) => return Ok(v),
                Finish::Local => match self.read_local_vec(&s, key, &r)? {
                    Some(v) => return Ok(v),
                    None => {
                        item.local_ok = false;
                        item.report_mismatch = true;
                    }
                },
            }
        }
        Err(Error::Corrupt {
            key: key.to_string(),
        })
    }

    fn finish_get(
        &self,
        s: &Session,
        key: &str,
        r: &pb::GetResult,
        w: Option<&Held>,
    ) -> Result<Finish> {
        if let Some(e) = st_err(key, &r.status) {
            return Err(e);
        }
        if !r.local_extents.is_empty() {
            return Ok(Finish::Local);
        }
        if r.delivered {
            let w = w.ok_or_else(|| Error::Protocol("delivered without a window".into()))?;
            let mut v = vec![0u8; r.size as usize];
            w.read(s, &mut v)?;
            return Ok(Finish::Done(v));
        }
        Ok(Finish::Done(r.data.clone()))
    }

    /// Copies a local replica out and verifies it; None on a checksum mismatch.
    fn read_local_vec(&self, s: &Session, key: &str, r: &pb::GetResult) -> Result<Option<Vec<u8>>> {
        let mut v = vec![0u8; r.size as usize];
        Ok(self.copy_local(s, key, r, &mut v)?.then_some(v))
    }

    fn copy_local(
        &self,
        s: &Session,
        key: &str,
        r: &pb::GetResult,
        dst: &mut [u8],
    ) -> Result<bool> {
        let seg = s.segment.as_ref().ok_or_else(|| {
            Error::Protocol(format!(
                "{key:?}: local extents on a node without a segment"
            ))
        })?;
        let mut hashes = vec![0u64; checksum::chunk_count(r.size)];
        copy_from_extents(
            seg,
            &r.local_extents,
            &mut dst[..r.size as usize],
            r.checksum_seed,
            &mut hashes,
        )?;
        Ok(checksum::combine(r.checksum_seed, &hashes) == r.checksum)
    }

    /// Copies the object into `dst`; returns its size.
    pub async fn get_into(&self, key: &str, dst: Dest<'_>) -> Result<usize> {
        self.batch_get_into(vec![(key, dst)])
            .await
            .pop()
            .unwrap_or_else(|| Err(Error::Protocol("no reply item".into())))
    }

    /// Gets many objects in one round trip (per staging-sized group).
    pub async fn batch_get_into(&self, mut items: Vec<(&str, Dest<'_>)>) -> Vec<Result<usize>> {
        let mut out: Vec<Option<Result<usize>>> = (0..items.len()).map(|_| None).collect();
        let mut todo: Vec<usize> = (0..items.len()).collect();
        for _ in 0..ATTEMPTS {
            if todo.is_empty() {
                break;
            }
            let s = match self.session().await {
                Ok(s) => s,
                Err(e) => {
                    for i in &todo {
                        out[*i] = Some(Err(e.clone()));
                    }
                    break;
                }
            };
            let mut retry = Vec::new();
            let sizes: Vec<u64> = items
                .iter()
                .map(|(_, d)| match d {
                    Dest::Bytes(b) => b.len() as u64,
                    Dest::Shm { .. } => 0,
                })
                .collect();
            for group in groups(&todo, |i| sizes[i], s.stage.capacity()) {
                let res = self.get_group(&s, &group, &mut items).await;
                for (i, r) in group.into_iter().zip(res) {
                    match r {
                        Err(e) if e.is_retryable() || matches!(e, Error::Disconnected(_)) => {
                            out[i] = Some(Err(e));
                            retry.push(i);
                        }
                        r => out[i] = Some(r),
                    }
                }
            }
            todo = retry;
            if !todo.is_empty() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        out.into_iter()
            .map(|o| o.unwrap_or_else(|| Err(Error::Protocol("get not attempted".into()))))
            .collect()
    }

    async fn get_group(
        &self,
        s: &Session,
        group: &[usize],
        items: &mut [(&str, Dest<'_>)],
    ) -> Vec<Result<usize>> {
        let mut windows: Vec<Option<Held>> = Vec::with_capacity(group.len());
        let mut req = pb::GetRequest {
            items: Vec::with_capacity(group.len()),
        };
        for &i in group {
            let (key, dest) = (&items[i].0, &items[i].1);
            let (region, w) = match dest {
                Dest::Bytes(b) => match self.lend(s, b.len() as u64).await {
                    Ok(h) => (h.region(b.len() as u64), Some(h)),
                    Err(e) => {
                        self.give_back(windows.into_iter().flatten().collect())
                            .await;
                        return group.iter().map(|_| Err(e.clone())).collect();
                    }
                },
                Dest::Shm { buf, offset, len } => match self.registered(s, buf).await {
                    Ok(shm_id) => (
                        pb::Region {
                            r#where: Some(pb::region::Where::Shm(pb::ShmWindow {
                                shm_id,
                                offset: *offset as u64,
                                len: *len as u64,
                            })),
                        },
                        None,
                    ),
                    Err(e) => return group.iter().map(|_| Err(e.clone())).collect(),
                },
            };
            windows.push(w);
            req.items.push(pb::GetItem {
                key: key.to_string(),
                dest: Some(region),
                local_ok: true,
                report_mismatch: false,
            });
        }
        let mut results: Vec<Option<Result<usize>>> = (0..group.len()).map(|_| None).collect();
        // Group positions of this round's request items.
        let mut round: Vec<usize> = (0..group.len()).collect();
        for attempt in 0..2 {
            let reply = match s.conn.call::<_, pb::GetReply>(Op::Get, &req).await {
                Ok(r) if r.items.len() == req.items.len() => r,
                Ok(_) => {
                    return group
                        .iter()
                        .map(|_| {
                            Err(Error::Protocol(
                                "get answered the wrong number of items".into(),
                            ))
                        })
                        .collect()
                }
                Err(e) => return group.iter().map(|_| Err(e.clone())).collect(),
            };
            let mut next = pb::GetRequest { items: Vec::new() };
            let mut next_round = Vec::new();
            for (k, r) in reply.items.iter().enumerate() {
                let j = round[k];
                let i = group[j];
                let key = items[i].0.to_string();
                match self.deliver(s, &key, r, &mut items[i].1, windows[j].as_ref()) {
                    Ok(Some(n)) => results[j] = Some(Ok(n)),
                    // The local copy failed verification: ask for another replica, and have the
                    // sidecar count the mismatch.
                    Ok(None) if attempt == 0 => {
                        let mut it = req.items[k].clone();
                        it.local_ok = false;
                        it.report_mismatch = true;
                        next.items.push(it);
                        next_round.push(j);
                    }
                    Ok(None) => results[j] = Some(Err(Error::Corrupt { key })),
                    Err(e) => results[j] = Some(Err(e)),
                }
            }
            if next.items.is_empty() {
                break;
            }
            req = next;
            round = next_round;
        }
        drop(windows);
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(Error::Protocol("item not processed".into()))))
            .collect()
    }

    /// Delivers one get result into its destination; Ok(None) when a local copy failed
    /// verification (the caller asks for another replica).
    fn deliver(
        &self,
        s: &Session,
        key: &str,
        r: &pb::GetResult,
        dest: &mut Dest<'_>,
        w: Option<&Held>,
    ) -> Result<Option<usize>> {
        if let Some(e) = st_err(key, &r.status) {
            if let Error::Server {
                code: pb::Code::NeedSpace,
                ..
            } = e
            {
                return Err(Error::BufferTooSmall {
                    key: key.to_string(),
                    have: dest.len() as u64,
                    need: r.size,
                });
            }
            return Err(e);
        }
        let size = r.size as usize;
        if size > dest.len() {
            return Err(Error::BufferTooSmall {
                key: key.to_string(),
                have: dest.len() as u64,
                need: r.size,
            });
        }
        if !r.local_extents.is_empty() {
            let ok = match dest {
                Dest::Bytes(b) => self.copy_local(s, key, r, b)?,
                Dest::Shm { buf, offset, .. } => {
                    let mut tmp_hashes = vec![0u64; checksum::chunk_count(r.size)];
                    let seg = s
                        .segment
                        .as_ref()
                        .ok_or_else(|| Error::Protocol("local extents without a segment".into()))?;
                    // SAFETY: `slice_mut` bounds-checks against the buffer's mapping; the slice
                    // lives only for this copy.
                    let d = unsafe { buf.inner.map.slice_mut(*offset as u64, r.size)? };
                    copy_from_extents(seg, &r.local_extents, d, r.checksum_seed, &mut tmp_hashes)?;
                    checksum::combine(r.checksum_seed, &tmp_hashes) == r.checksum
                }
            };
            return Ok(ok.then_some(size));
        }
        if r.delivered {
            if let Dest::Bytes(b) = dest {
                let w = w.ok_or_else(|| {
                    Error::Protocol("delivered into staging without a window".into())
                })?;
                w.read(s, &mut b[..size])?;
            }
            return Ok(Some(size));
        }
        match dest {
            Dest::Bytes(b) => {
                let n = r.data.len().min(b.len());
                b[..n].copy_from_slice(&r.data[..n]);
            }
            Dest::Shm { buf, offset, .. } => buf.write(*offset, &r.data)?,
        }
        Ok(Some(r.data.len()))
    }

    // ------------------------------------------------------------------ keys

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

enum Finish {
    Local,
    Done(Vec<u8>),
}

async fn get_one(s: &Session, item: pb::GetItem) -> Result<pb::GetResult> {
    let r: pb::GetReply = s
        .conn
        .call(Op::Get, &pb::GetRequest { items: vec![item] })
        .await?;
    r.items
        .into_iter()
        .next()
        .ok_or_else(|| Error::Protocol("get answered no item".into()))
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

/// Runs `f` on the source bytes (a registered buffer is viewed in place).
fn with_source<R>(src: &Source<'_>, f: impl FnOnce(&[u8]) -> R) -> Result<R> {
    match src {
        Source::Bytes(b) => Ok(f(b)),
        Source::Shm { buf, offset, len } => {
            // SAFETY: bounds-checked against the buffer's mapping; the view lives for `f` only.
            let b = unsafe { buf.inner.map.slice(*offset as u64, *len as u64)? };
            Ok(f(b))
        }
    }
}

/// Copies the object `src` into its extents of the segment, in object order, hashing chunks.
fn copy_to_extents(
    seg: &Mapping,
    extents: &[pb::Extent],
    src: &[u8],
    seed: u64,
    hashes: &mut [u64],
) -> Result<()> {
    let mut off = 0usize;
    for e in extents {
        if off >= src.len() {
            break;
        }
        let n = (e.len as usize).min(src.len() - off);
        let first_chunk = off / checksum::CHUNK;
        seg.write_hashed(
            e.offset,
            &src[off..off + n],
            seed,
            &mut hashes[first_chunk..],
        )?;
        off += n;
    }
    if off < src.len() {
        return Err(Error::Protocol(format!(
            "local extents hold {off} of {} bytes",
            src.len()
        )));
    }
    Ok(())
}

/// Copies an object out of its extents of the segment into `dst`, hashing chunks.
fn copy_from_extents(
    seg: &Mapping,
    extents: &[pb::Extent],
    dst: &mut [u8],
    seed: u64,
    hashes: &mut [u64],
) -> Result<()> {
    let mut off = 0usize;
    let total = dst.len();
    for e in extents {
        if off >= total {
            break;
        }
        let n = (e.len as usize).min(total - off);
        let first_chunk = off / checksum::CHUNK;
        seg.read_hashed(
            e.offset,
            &mut dst[off..off + n],
            seed,
            &mut hashes[first_chunk..],
        )?;
        off += n;
    }
    if off < total {
        return Err(Error::Protocol(format!(
            "local extents hold {off} of {total} bytes"
        )));
    }
    Ok(())
}

/// Whether a failed put may be retried with a fresh reservation: only when nothing can have
/// been stored. Before its commit was sent, any retryable error; after, only a commit the
/// sidecar says was refused (UNAVAILABLE, BUSY). A TIMEOUT commit (metad's answer was lost) or a
/// connection lost after the commit was sent may have stored the value: a retry would answer
/// ALREADY_EXISTS for the caller's own value, so the caller gets the error instead.
fn may_retry_put(e: &Error, commit_sent: bool) -> bool {
    if commit_sent {
        matches!(
            e,
            Error::Server {
                code: pb::Code::Unavailable | pb::Code::Busy,
                ..
            }
        )
    } else {
        e.is_retryable() || matches!(e, Error::Disconnected(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_put_is_retried_only_when_nothing_can_have_been_stored() {
        let server = |code| Error::Server {
            key: "k".into(),
            code,
            message: String::new(),
        };
        let lost = || Error::Disconnected("eof".into());
        // Before the commit was sent: every transient failure.
        assert!(may_retry_put(&server(pb::Code::Unavailable), false));
        assert!(may_retry_put(&server(pb::Code::Timeout), false));
        assert!(may_retry_put(&lost(), false));
        // After: only a refused commit.
        assert!(may_retry_put(&server(pb::Code::Unavailable), true));
        assert!(!may_retry_put(&server(pb::Code::Timeout), true));
        assert!(!may_retry_put(&lost(), true));
        assert!(!may_retry_put(&server(pb::Code::Internal), true));
    }
}
