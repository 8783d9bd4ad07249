//! systemd's notification protocol (`sd_notify(3)`) for units of `Type=notify`: `READY=1` once
//! a daemon serves, `STOPPING=1` when it stops, and, when a sidecar's successor has taken the
//! node over, `MAINPID=` followed by a barrier (`BARRIER=1` carrying a pipe's write end, as
//! `sd_notify_barrier` does): systemd closes its copy once it has read every message before
//! it, so the old process exits only after systemd has made the successor the unit's main
//! process (else systemd would take the old one's exit for the service's end and stop the
//! successor with it). Without `$NOTIFY_SOCKET` (not started by systemd) nothing is sent.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

use nix::fcntl::OFlag;
use nix::sys::socket::{connect, socket, AddressFamily, SockFlag, SockType, UnixAddr};

use crate::fdpass;

/// Where `$NOTIFY_SOCKET` points: a path, or `@name` in the abstract namespace.
fn target() -> Option<UnixAddr> {
    parse(&std::env::var_os("NOTIFY_SOCKET")?)
}

fn parse(v: &std::ffi::OsStr) -> Option<UnixAddr> {
    let b = v.as_bytes();
    match b.first() {
        Some(b'@') => UnixAddr::new_abstract(&b[1..]).ok(),
        Some(b'/') => UnixAddr::new(std::path::Path::new(&v)).ok(),
        _ => None,
    }
}

/// Sends `state` (lines of `KEY=VALUE`); `Ok(false)` when not under systemd.
pub fn notify(state: &str) -> io::Result<bool> {
    send(target().as_ref(), state, &[])
}

fn send(to: Option<&UnixAddr>, state: &str, fds: &[BorrowedFd<'_>]) -> io::Result<bool> {
    let Some(addr) = to else {
        return Ok(false);
    };
    let sock = socket(
        AddressFamily::Unix,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    connect(sock.as_raw_fd(), addr)?;
    fdpass::send_fds(sock.as_fd(), state.as_bytes(), fds)?;
    Ok(true)
}

/// The service manager's side: one notification read from `sock` (the socket
/// `$NOTIFY_SOCKET` names), its text and the descriptors it carried. Closing those is what
/// releases a [`barrier`]. Tests stand in for systemd with it.
pub fn receive(sock: &UnixDatagram) -> io::Result<(String, Vec<OwnedFd>)> {
    let mut buf = [0u8; 4096];
    let (n, fds) = fdpass::recv_fds(sock.as_fd(), &mut buf, fdpass::MAX_FDS)?;
    Ok((String::from_utf8_lossy(&buf[..n]).into_owned(), fds))
}

/// Waits at most `timeout` until systemd has processed every message this process sent before;
/// `Ok(false)` when not under systemd, an error when it did not answer in time.
pub fn barrier(timeout: Duration) -> io::Result<bool> {
    barrier_to(target().as_ref(), timeout)
}

fn barrier_to(to: Option<&UnixAddr>, timeout: Duration) -> io::Result<bool> {
    if to.is_none() {
        return Ok(false);
    }
    let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)?;
    send(to, "BARRIER=1", &[write.as_fd()])?;
    drop(write);
    // With every write end closed (ours now, systemd's once it has read the message) a read
    // returns 0; before, EAGAIN.
    let end = Instant::now() + timeout;
    let mut buf = [0u8; 1];
    loop {
        match nix::unistd::read(read.as_raw_fd(), &mut buf) {
            Ok(0) => return Ok(true),
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(nix::errno::Errno::EAGAIN) => {
                if Instant::now() >= end {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("systemd did not confirm the notification within {timeout:?}"),
                    ));
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receive(sock: &UnixDatagram) -> (String, Vec<OwnedFd>) {
        super::receive(sock).unwrap()
    }

    #[test]
    fn messages_reach_the_socket_and_a_barrier_waits_for_the_descriptor_to_close() {
        assert!(
            !send(None, "READY=1", &[]).unwrap(),
            "not under systemd: nothing sent"
        );
        assert!(!barrier_to(None, Duration::from_millis(10)).unwrap());
        assert!(parse(std::ffi::OsStr::new("relative/path")).is_none());

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let sock = UnixDatagram::bind(&path).unwrap();
        let to = parse(path.as_os_str()).unwrap();
        assert!(send(Some(&to), "MAINPID=42\nREADY=1", &[]).unwrap());
        assert_eq!(receive(&sock).0, "MAINPID=42\nREADY=1");

        // A "systemd" that holds the descriptor: the barrier times out.
        assert!(barrier_to(Some(&to), Duration::from_millis(50)).is_err());
        let (text, held) = receive(&sock);
        assert_eq!((text.as_str(), held.len()), ("BARRIER=1", 1));
        drop(held);

        // One that closes it after 100 ms: the barrier returns then, not before.
        let closer = std::thread::spawn(move || {
            let (text, fds) = receive(&sock);
            assert_eq!(text, "BARRIER=1");
            std::thread::sleep(Duration::from_millis(100));
            drop(fds);
        });
        let start = Instant::now();
        assert!(barrier_to(Some(&to), Duration::from_secs(5)).unwrap());
        assert!(start.elapsed() >= Duration::from_millis(90));
        closer.join().unwrap();

        // The abstract namespace.
        let name = format!("regolith-sdnotify-test-{}", std::process::id());
        let addr = UnixAddr::new_abstract(name.as_bytes()).unwrap();
        let raw = socket(
            AddressFamily::Unix,
            SockType::Datagram,
            SockFlag::empty(),
            None,
        )
        .unwrap();
        nix::sys::socket::bind(raw.as_raw_fd(), &addr).unwrap();
        let abstract_sock = UnixDatagram::from(raw);
        let to = parse(std::ffi::OsStr::new(&format!("@{name}"))).unwrap();
        assert!(send(Some(&to), "STOPPING=1", &[]).unwrap());
        assert_eq!(receive(&abstract_sock).0, "STOPPING=1");
    }
}
