//! A minimal HTTP/1.1 GET over a plain socket: `regolith up` polls metad's `/status` with it
//! while the cluster starts, `status` and `bench` read the sidecars' `/status` and `/metrics`
//! (no HTTP client dependency for one request).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// The JSON body of `GET path` at `addr` when it answers 200, else None.
pub fn get_json(addr: SocketAddr, path: &str, timeout: Duration) -> Option<serde_json::Value> {
    serde_json::from_str(&get_text(addr, path, timeout)?).ok()
}

/// The body of `GET path` at `addr` when it answers 200, else None.
pub fn get_text(addr: SocketAddr, path: &str, timeout: Duration) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, timeout).ok()?;
    s.set_read_timeout(Some(timeout)).ok()?;
    s.set_write_timeout(Some(timeout)).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).ok()?;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let code: u16 = head.split_whitespace().nth(1)?.parse().ok()?;
    if code != 200 {
        return None;
    }
    Some(body.to_string())
}
