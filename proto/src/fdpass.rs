//! File descriptors over a Unix stream socket (SCM_RIGHTS), alongside a small byte payload.
//!
//! The sidecar hands its segment and staging memfds to a local client this way, and a client
//! hands the sidecar memfds of its own (`register_shm`). The descriptors ride on the first byte
//! of the payload, so the payload must not be empty; the receiver should call [`recv_fds`] when
//! its protocol says descriptors come next, with a buffer large enough for that payload.
//!
//! The receiver accepts only a single `SCM_RIGHTS` message of at most `max_fds` descriptors;
//! anything else (truncated control data, other control-message types, too many descriptors) is
//! an error, and every descriptor the kernel installed is closed before the error is returned.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::cmsg_space;
use nix::errno::Errno;
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

/// Most descriptors one message may carry.
pub const MAX_FDS: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum FdPassError {
    #[error("fd passing needs a non-empty payload to carry the descriptors")]
    EmptyPayload,
    #[error("cannot send {count} descriptors in one message (max {MAX_FDS})")]
    TooManyToSend { count: usize },
    #[error("peer closed the socket")]
    Closed,
    #[error("peer sent {got} descriptors, at most {max} expected")]
    TooMany { got: usize, max: usize },
    #[error(
        "control data was truncated (peer sent more than {MAX_FDS} descriptors or other data)"
    )]
    ControlTruncated,
    #[error("unexpected control message: {0}")]
    UnexpectedControl(String),
    #[error("payload of {sent} bytes only partly sent ({written} bytes)")]
    ShortSend { written: usize, sent: usize },
    #[error("socket: {0}")]
    Sys(#[from] Errno),
}

impl FdPassError {
    /// True for a non-blocking socket that is not ready (retry after readiness).
    pub fn is_would_block(&self) -> bool {
        matches!(self, FdPassError::Sys(Errno::EAGAIN))
    }
}

impl From<FdPassError> for std::io::Error {
    fn from(e: FdPassError) -> Self {
        match e {
            FdPassError::Sys(errno) => std::io::Error::from(errno),
            FdPassError::Closed => std::io::ErrorKind::UnexpectedEof.into(),
            other => std::io::Error::new(std::io::ErrorKind::InvalidData, other),
        }
    }
}

/// Sends `payload` with `fds` attached. The whole payload is sent by one `sendmsg`, or the call
/// fails with [`FdPassError::ShortSend`] (keep payloads small: a few KiB at most).
pub fn send_fds(
    sock: BorrowedFd<'_>,
    payload: &[u8],
    fds: &[BorrowedFd<'_>],
) -> Result<(), FdPassError> {
    if payload.is_empty() {
        return Err(FdPassError::EmptyPayload);
    }
    if fds.len() > MAX_FDS {
        return Err(FdPassError::TooManyToSend { count: fds.len() });
    }
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let cmsgs = [ControlMessage::ScmRights(&raw)];
    let cmsgs: &[ControlMessage] = if raw.is_empty() { &[] } else { &cmsgs };
    let iov = [IoSlice::new(payload)];
    let written = loop {
        match sendmsg::<()>(sock.as_raw_fd(), &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None) {
            Err(Errno::EINTR) => continue,
            r => break r?,
        }
    };
    if written != payload.len() {
        return Err(FdPassError::ShortSend {
            written,
            sent: payload.len(),
        });
    }
    Ok(())
}

/// Receives up to `buf.len()` payload bytes and the descriptors attached to them (at most
/// `max_fds`, which is clamped to [`MAX_FDS`]). Returns the byte count and the descriptors,
/// which are close-on-exec. A payload without descriptors returns an empty vector.
pub fn recv_fds(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
    max_fds: usize,
) -> Result<(usize, Vec<OwnedFd>), FdPassError> {
    let max_fds = max_fds.min(MAX_FDS);
    // Room for MAX_FDS even when fewer are expected, so an over-sending peer shows up as
    // TooMany (with its descriptors closed) rather than as a silent kernel-side truncation.
    let mut cmsg_buf = cmsg_space!([RawFd; MAX_FDS]);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = loop {
        match recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg_buf),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Err(Errno::EINTR) => continue,
            r => break r?,
        }
    };
    let bytes = msg.bytes;
    let truncated = msg.flags.contains(MsgFlags::MSG_CTRUNC);

    // Take ownership of every descriptor first so that each error path below closes them.
    let mut fds = Vec::new();
    let mut unexpected = None;
    for c in msg.cmsgs()? {
        match c {
            ControlMessageOwned::ScmRights(raw) => {
                // SAFETY: the kernel just installed these descriptors in this process for
                // this message; nothing else owns them.
                fds.extend(raw.into_iter().map(|r| unsafe { OwnedFd::from_raw_fd(r) }));
            }
            other => unexpected = Some(format!("{other:?}")),
        }
    }
    if truncated {
        return Err(FdPassError::ControlTruncated);
    }
    if let Some(u) = unexpected {
        return Err(FdPassError::UnexpectedControl(u));
    }
    if fds.len() > max_fds {
        return Err(FdPassError::TooMany {
            got: fds.len(),
            max: max_fds,
        });
    }
    if bytes == 0 && fds.is_empty() {
        return Err(FdPassError::Closed);
    }
    Ok((bytes, fds))
}

/// [`send_fds`] on a tokio socket.
pub async fn send_fds_async(
    sock: &tokio::net::UnixStream,
    payload: &[u8],
    fds: &[BorrowedFd<'_>],
) -> std::io::Result<()> {
    sock.async_io(tokio::io::Interest::WRITABLE, || {
        send_fds(sock.as_fd(), payload, fds).map_err(Into::into)
    })
    .await
}

/// [`recv_fds`] on a tokio socket.
pub async fn recv_fds_async(
    sock: &tokio::net::UnixStream,
    buf: &mut [u8],
    max_fds: usize,
) -> std::io::Result<(usize, Vec<OwnedFd>)> {
    sock.async_io(tokio::io::Interest::READABLE, || {
        recv_fds(sock.as_fd(), buf, max_fds).map_err(Into::into)
    })
    .await
}

/// Writes all of `buf` to a tokio Unix socket shared by reference (a frame's bytes need no
/// descriptors; both ends of the UDS protocol write this way).
pub async fn write_all_async(sock: &tokio::net::UnixStream, mut buf: &[u8]) -> std::io::Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
    use std::fs::File;
    use std::io::{Read, Seek, SeekFrom, Write};

    fn pair() -> (OwnedFd, OwnedFd) {
        socketpair(
            AddressFamily::Unix,
            SockType::Stream,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap()
    }

    fn memfd_with(content: &[u8]) -> File {
        let fd = memfd_create(c"fdpass-test", MemFdCreateFlag::MFD_CLOEXEC).unwrap();
        let mut f = File::from(fd);
        f.write_all(content).unwrap();
        f
    }

    #[test]
    fn memfd_travels_with_payload() {
        let (a, b) = pair();
        let m = memfd_with(b"hello segment");
        send_fds(a.as_fd(), b"HELLO", &[m.as_fd()]).unwrap();
        let mut buf = [0u8; 64];
        let (n, fds) = recv_fds(b.as_fd(), &mut buf, 1).unwrap();
        assert_eq!(&buf[..n], b"HELLO");
        assert_eq!(fds.len(), 1);
        let mut got = File::from(fds.into_iter().next().unwrap());
        got.seek(SeekFrom::Start(0)).unwrap();
        let mut s = String::new();
        got.read_to_string(&mut s).unwrap();
        assert_eq!(s, "hello segment");
    }

    #[test]
    fn payload_without_fds_and_eof() {
        let (a, b) = pair();
        send_fds(a.as_fd(), b"x", &[]).unwrap();
        let mut buf = [0u8; 4];
        let (n, fds) = recv_fds(b.as_fd(), &mut buf, 4).unwrap();
        assert_eq!((n, fds.len()), (1, 0));
        drop(a);
        assert!(matches!(
            recv_fds(b.as_fd(), &mut buf, 4),
            Err(FdPassError::Closed)
        ));
    }

    #[test]
    fn too_many_fds_are_refused_and_closed() {
        let (a, b) = pair();
        let m = memfd_with(b"x");
        send_fds(a.as_fd(), b"p", &[m.as_fd(), m.as_fd(), m.as_fd()]).unwrap();
        let mut buf = [0u8; 4];
        let err = recv_fds(b.as_fd(), &mut buf, 2).unwrap_err();
        assert!(matches!(err, FdPassError::TooMany { got: 3, max: 2 }));
        // Descriptors beyond MAX_FDS are refused by the sender.
        let many: Vec<_> = (0..MAX_FDS + 1).map(|_| m.as_fd()).collect();
        assert!(matches!(
            send_fds(a.as_fd(), b"p", &many),
            Err(FdPassError::TooManyToSend { .. })
        ));
        assert!(matches!(
            send_fds(a.as_fd(), b"", &[]),
            Err(FdPassError::EmptyPayload)
        ));
    }

    #[test]
    fn other_control_messages_are_refused() {
        use nix::sys::socket::{setsockopt, sockopt::PassCred, UnixCredentials};
        let (a, b) = pair();
        setsockopt(&b, PassCred, &true).unwrap();
        let creds = UnixCredentials::new();
        let iov = [IoSlice::new(b"c")];
        sendmsg::<()>(
            a.as_raw_fd(),
            &iov,
            &[ControlMessage::ScmCredentials(&creds)],
            MsgFlags::empty(),
            None,
        )
        .unwrap();
        let mut buf = [0u8; 4];
        assert!(matches!(
            recv_fds(b.as_fd(), &mut buf, 1),
            Err(FdPassError::UnexpectedControl(_))
        ));
    }

    #[tokio::test]
    async fn async_wrappers() {
        let (a, b) = tokio::net::UnixStream::pair().unwrap();
        let m = memfd_with(b"abc");
        send_fds_async(&a, b"Z", &[m.as_fd()]).await.unwrap();
        let mut buf = [0u8; 8];
        let (n, fds) = recv_fds_async(&b, &mut buf, 1).await.unwrap();
        assert_eq!((n, fds.len()), (1, 1));
    }
}
