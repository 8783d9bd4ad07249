//! One connection to the sidecar: the hello (which brings the segment and staging memfds), then
//! pipelined requests answered by id. A reader task routes replies to their waiters; writes are
//! serialized by a lock on the write side.

use std::collections::HashMap;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

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

pub struct Conn {
    sock: Arc<UnixStream>,
    write: tokio::sync::Mutex<()>,
    next_id: AtomicU64,
    waiters: Waiters,
    alive: Arc<AtomicBool>,
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
        let reader = tokio::spawn(read_loop(
            sock.clone(),
            codec,
            waiters.clone(),
            alive.clone(),
        ));
        let conn = Arc::new(Conn {
            sock,
            write: tokio::sync::Mutex::new(()),
            next_id: AtomicU64::new(1),
            waiters,
            alive,
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
        let frame = rx
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

async fn read_loop(
    sock: Arc<UnixStream>,
    mut codec: FrameCodec,
    waiters: Waiters,
    alive: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 256 * 1024];
    let why = 'outer: loop {
        loop {
            match codec.next_frame() {
                Ok(Some(f)) => {
                    if let Some(tx) = waiters.lock().remove(&f.request_id) {
                        let _ = tx.send(Ok(f));
                    }
                }
                Ok(None) => break,
                Err(e) => break 'outer format!("bad frame from the sidecar: {e}"),
            }
        }
        if let Err(e) = sock.readable().await {
            break format!("{e}");
        }
        match sock.try_read(&mut buf) {
            Ok(0) => break "the sidecar closed the connection".to_string(),
            Ok(n) => codec.feed(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => break format!("{e}"),
        }
    };
    alive.store(false, Ordering::Release);
    for (_, tx) in waiters.lock().drain() {
        let _ = tx.send(Err(Error::Disconnected(why.clone())));
    }
}

/// Encodes a frame body (for tests and tools).
pub fn body<M: Message>(m: &M) -> Bytes {
    Bytes::from(m.encode_to_vec())
}
