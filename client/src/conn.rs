//! One connection to the sidecar: the hello (which brings the segment and staging memfds), then
//! pipelined requests answered by id. Replies are read and routed to their waiters by whoever
//! gets there first: a reader task, or a caller polling for its own reply (the blocking client
//! polls while it spins, so a reply it reads itself costs no wake-up of the reader's thread).
//! Writes are serialized by a lock on the write side.

use std::collections::HashMap;
use std::future::Future;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;

use bytes::Bytes;
use parking_lot::Mutex;
use prost::Message;
use regolith_proto::fdpass;
use regolith_proto::fdpass::write_all_async as write_all;
use regolith_proto::frame::{self, Frame, FrameCodec};
use regolith_proto::uds::{self, pb, Op};
use tokio::net::UnixStream;
use tokio::sync::oneshot;

use crate::error::{Error, Result};

type Waiters = Arc<Mutex<HashMap<u64, oneshot::Sender<Result<Frame>>>>>;

/// The read side: what was read and not yet routed, shared by the reader task and callers.
struct Rx {
    sock: Arc<UnixStream>,
    state: Mutex<RxState>,
    waiters: Waiters,
    alive: Arc<AtomicBool>,
}

struct RxState {
    codec: FrameCodec,
    buf: Vec<u8>,
}

/// What one pass over the socket found.
enum Pumped {
    /// Nothing more to read now.
    Idle,
    /// Another reader holds the read side.
    Busy,
    /// The connection is finished (why).
    Closed(String),
}

impl Rx {
    /// Reads what the socket has without waiting and routes every complete reply. The reader
    /// task (`task`) waits for the read side and reads through the runtime, so that a read
    /// that finds nothing clears the readiness it waits on; a caller gives up at once if the
    /// read side is busy, and reads the socket directly (the runtime's readiness lags until
    /// its I/O thread wakes up).
    fn pump(&self, task: bool) -> Pumped {
        let mut st = if task {
            self.state.lock()
        } else {
            match self.state.try_lock() {
                Some(st) => st,
                None => return Pumped::Busy,
            }
        };
        let RxState { codec, buf } = &mut *st;
        loop {
            loop {
                match codec.next_frame() {
                    Ok(Some(f)) => {
                        if let Some(tx) = self.waiters.lock().remove(&f.request_id) {
                            let _ = tx.send(Ok(f));
                        }
                    }
                    Ok(None) => break,
                    Err(e) => return Pumped::Closed(format!("bad frame from the sidecar: {e}")),
                }
            }
            let read = if task {
                self.sock
                    .try_io(tokio::io::Interest::READABLE, || read_now(&self.sock, buf))
            } else {
                read_now(&self.sock, buf)
            };
            match read {
                Ok(0) => return Pumped::Closed("the sidecar closed the connection".into()),
                Ok(n) => codec.feed(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Pumped::Idle,
                Err(e) => return Pumped::Closed(format!("{e}")),
            }
        }
    }

    /// Marks the connection dead and fails every waiter.
    fn close(&self, why: &str) {
        self.alive.store(false, Ordering::Release);
        for (_, tx) in self.waiters.lock().drain() {
            let _ = tx.send(Err(Error::Disconnected(why.to_string())));
        }
    }
}

pub struct Conn {
    sock: Arc<UnixStream>,
    write: tokio::sync::Mutex<()>,
    next_id: AtomicU64,
    waiters: Waiters,
    alive: Arc<AtomicBool>,
    rx: Arc<Rx>,
    reader: tokio::task::JoinHandle<()>,
    pub path: PathBuf,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// What hello brought back.
pub struct Hello {
    pub reply: pb::HelloReply,
    pub segment_fd: Option<OwnedFd>,
    pub staging_fd: OwnedFd,
}

impl Conn {
    /// Connects and says hello; returns the connection and what hello brought.
    pub async fn connect(
        path: &Path,
        staging_size: u64,
        client_name: &str,
    ) -> Result<(Arc<Conn>, Hello)> {
        let sock = UnixStream::connect(path)
            .await
            .map_err(|e| Error::Connect {
                path: path.to_path_buf(),
                source: std::sync::Arc::new(e),
            })?;
        let req = pb::HelloRequest {
            protocol_version: uds::PROTOCOL_VERSION,
            staging_size,
            client_name: client_name.to_string(),
        };
        let bytes = frame::encode_to_vec(Op::Hello as u16, 0, &req.encode_to_vec())
            .map_err(|e| Error::Protocol(e.to_string()))?;
        write_all(&sock, &bytes).await?;
        let mut codec = FrameCodec::new(uds::MAX_FRAME);
        let mut fds: Vec<OwnedFd> = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        let reply_frame = loop {
            if let Some(f) = codec
                .next_frame()
                .map_err(|e| Error::Protocol(e.to_string()))?
            {
                break f;
            }
            let (n, got) = fdpass::recv_fds_async(&sock, &mut buf, 4).await?;
            if n == 0 {
                return Err(Error::Hello {
                    path: path.to_path_buf(),
                    message: "sidecar closed the connection".into(),
                });
            }
            fds.extend(got);
            codec.feed(&buf[..n]);
        };
        let reply = pb::HelloReply::decode(reply_frame.body.as_ref())
            .map_err(|e| Error::Protocol(format!("hello reply: {e}")))?;
        if let Some(e) = reply.status.as_ref().filter(|s| s.code != 0) {
            return Err(Error::Hello {
                path: path.to_path_buf(),
                message: e.message.clone(),
            });
        }
        let want = if reply.segment_size > 0 { 2 } else { 1 };
        if fds.len() != want {
            return Err(Error::Hello {
                path: path.to_path_buf(),
                message: format!("expected {want} memfds with hello, got {}", fds.len()),
            });
        }
        let Some(staging_fd) = fds.pop() else {
            return Err(Error::Hello {
                path: path.to_path_buf(),
                message: "no staging memfd with hello".into(),
            });
        };
        let segment_fd = fds.pop();
        // Bytes after the hello reply (none expected) stay in the codec for the reader.
        let sock = Arc::new(sock);
        let waiters: Waiters = Arc::new(Mutex::new(HashMap::new()));
        let alive = Arc::new(AtomicBool::new(true));
        let rx = Arc::new(Rx {
            sock: sock.clone(),
            state: Mutex::new(RxState {
                codec,
                buf: vec![0u8; 256 * 1024],
            }),
            waiters: waiters.clone(),
            alive: alive.clone(),
        });
        let reader = tokio::spawn(read_loop(rx.clone()));
        let conn = Arc::new(Conn {
            sock,
            write: tokio::sync::Mutex::new(()),
            next_id: AtomicU64::new(1),
            waiters,
            alive,
            rx,
            reader,
            path: path.to_path_buf(),
        });
        Ok((
            conn,
            Hello {
                reply,
                segment_fd,
                staging_fd,
            },
        ))
    }

    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// Sends one request (with an optional fd) and waits for its reply frame.
    pub async fn call_raw(&self, op: Op, body: &[u8], fd: Option<BorrowedFd<'_>>) -> Result<Frame> {
        if !self.is_alive() {
            return Err(Error::Disconnected("the connection was closed".into()));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let bytes = frame::encode_to_vec(op as u16, id, body)
            .map_err(|e| Error::Protocol(e.to_string()))?;
        let (tx, rx) = oneshot::channel();
        self.waiters.lock().insert(id, tx);
        // The reader may have died between the check above and the insert; it drains the
        // waiters after marking the connection dead, so checking again closes the gap.
        if !self.is_alive() {
            self.waiters.lock().remove(&id);
            return Err(Error::Disconnected("the connection was closed".into()));
        }
        let sent = {
            let _w = self.write.lock().await;
            match fd {
                Some(fd) => fdpass::send_fds_async(&self.sock, &bytes, &[fd]).await,
                None => write_all(&self.sock, &bytes).await,
            }
        };
        if let Err(e) = sent {
            self.waiters.lock().remove(&id);
            self.alive.store(false, Ordering::Release);
            return Err(Error::Disconnected(format!("sending {}: {e}", op.name())));
        }
        let frame = self
            .reply(rx)
            .await
            .map_err(|_| Error::Disconnected("the sidecar closed the connection".into()))??;
        if frame.opcode == Op::Error as u16 {
            let e = pb::ErrorReply::decode(frame.body.as_ref()).unwrap_or_default();
            let st = e.status.unwrap_or_default();
            return Err(Error::Protocol(format!(
                "sidecar refused {}: {}",
                op.name(),
                st.message
            )));
        }
        if frame.opcode != op as u16 {
            return Err(Error::Protocol(format!(
                "reply opcode {} to a {} request",
                frame.opcode,
                op.name()
            )));
        }
        Ok(frame)
    }

    /// Sends a request message and decodes the reply message.
    pub async fn call<Req: Message, Rep: Message + Default>(
        &self,
        op: Op,
        req: &Req,
    ) -> Result<Rep> {
        let frame = self.call_raw(op, &req.encode_to_vec(), None).await?;
        Rep::decode(frame.body.as_ref())
            .map_err(|e| Error::Protocol(format!("{} reply: {e}", op.name())))
    }

    pub async fn call_with_fd<Req: Message, Rep: Message + Default>(
        &self,
        op: Op,
        req: &Req,
        fd: BorrowedFd<'_>,
    ) -> Result<Rep> {
        let frame = self.call_raw(op, &req.encode_to_vec(), Some(fd)).await?;
        Rep::decode(frame.body.as_ref())
            .map_err(|e| Error::Protocol(format!("{} reply: {e}", op.name())))
    }
}

impl Conn {
    /// Waits for a reply; each poll that finds it missing first reads the socket itself, if
    /// no other reader is at it (see the module docs).
    async fn reply(
        &self,
        mut rx: oneshot::Receiver<Result<Frame>>,
    ) -> std::result::Result<Result<Frame>, oneshot::error::RecvError> {
        std::future::poll_fn(|cx| {
            if let Poll::Ready(r) = Pin::new(&mut rx).poll(cx) {
                return Poll::Ready(r);
            }
            match self.rx.pump(false) {
                Pumped::Idle | Pumped::Busy => {}
                // The reader task sees the same end and fails the waiters.
                Pumped::Closed(why) => self.rx.close(&why),
            }
            Pin::new(&mut rx).poll(cx)
        })
        .await
    }
}

async fn read_loop(rx: Arc<Rx>) {
    let why = loop {
        match rx.pump(true) {
            Pumped::Idle | Pumped::Busy => {}
            Pumped::Closed(why) => break why,
        }
        if let Err(e) = rx.sock.readable().await {
            break format!("{e}");
        }
    };
    rx.close(&why);
}

/// One non-blocking `read` of the socket (its descriptor is non-blocking).
fn read_now(sock: &UnixStream, buf: &mut [u8]) -> std::io::Result<usize> {
    use std::os::fd::AsRawFd;
    // SAFETY: `buf` is writable for its length; the descriptor is the open socket.
    let n = unsafe {
        nix::libc::read(
            sock.as_raw_fd(),
            buf.as_mut_ptr() as *mut nix::libc::c_void,
            buf.len(),
        )
    };
    if n < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Encodes a frame body (for tests and tools).
pub fn body<M: Message>(m: &M) -> Bytes {
    Bytes::from(m.encode_to_vec())
}
