//! `/status` samples of metad replicas, taken over HTTP by the observer.
//!
//! The document is untrusted input: a body that does not parse is recorded as
//! [`SampleResult::Malformed`], never a panic.

use std::time::Duration;

use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::checker::LeaderClaim;

/// The fields of metad's `/status` the harness uses.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Status {
    pub id: u64,
    pub role: String,
    pub leader_id: Option<u64>,
    pub term: u64,
    #[serde(default)]
    pub last_applied: Option<u64>,
    #[serde(default)]
    pub members: Vec<Member>,
    #[serde(default)]
    pub keys: u64,
    #[serde(default)]
    pub evicted_objects: u64,
    #[serde(default)]
    pub dead_node_dropped_objects: u64,
    #[serde(default)]
    pub leader_ready: bool,
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Member {
    pub id: u64,
    #[serde(default)]
    pub addr: String,
    #[serde(default)]
    pub voter: bool,
}

impl Status {
    pub fn is_leader(&self) -> bool {
        self.role == "leader"
    }
}

#[derive(Clone, Debug)]
pub enum SampleResult {
    Status(Status),
    /// No answer (down, paused, cut off).
    Unreachable(String),
    /// An answer that is not a status document.
    Malformed(String),
}

/// One sample of one metad host.
#[derive(Clone, Debug)]
pub struct Sample {
    pub at_us: u64,
    /// The metad host (`m1`..).
    pub host: String,
    pub result: SampleResult,
}

/// Parses a `/status` body.
pub fn parse_status(body: &[u8]) -> SampleResult {
    match serde_json::from_slice::<Status>(body) {
        Ok(s) => SampleResult::Status(s),
        Err(e) => SampleResult::Malformed(format!(
            "{e}; body starts {:?}",
            String::from_utf8_lossy(&body[..body.len().min(120)])
        )),
    }
}

/// A minimal HTTP/1.1 GET (no client library needed, bounded in time and size).
pub async fn http_get(addr: &str, path: &str, timeout: Duration) -> Result<(u16, Vec<u8>), String> {
    http_request("GET", addr, path, timeout).await
}

/// A minimal HTTP/1.1 request without a body (GET, or a test hook's POST).
pub async fn http_request(
    method: &str,
    addr: &str,
    path: &str,
    timeout: Duration,
) -> Result<(u16, Vec<u8>), String> {
    const MAX_BODY: usize = 1 << 20;
    let fut = async {
        let mut s = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect {addr}: {e}"))?;
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        s.write_all(req.as_bytes())
            .await
            .map_err(|e| format!("write: {e}"))?;
        let mut buf = Vec::new();
        (&mut s)
            .take(MAX_BODY as u64)
            .read_to_end(&mut buf)
            .await
            .map_err(|e| format!("read: {e}"))?;
        parse_response(&buf)
    };
    tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| format!("no answer from {addr} within {timeout:?}"))?
}

fn parse_response(buf: &[u8]) -> Result<(u16, Vec<u8>), String> {
    let end = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no end of headers")?;
    let head = String::from_utf8_lossy(&buf[..end]);
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse::<u16>().ok())
        .ok_or_else(|| format!("bad status line {:?}", head.lines().next()))?;
    Ok((code, buf[end + 4..].to_vec()))
}

/// Samples `/status` once.
pub async fn sample(addr: &str, timeout: Duration) -> SampleResult {
    match http_get(addr, "/status", timeout).await {
        Ok((200, body)) => parse_status(&body),
        Ok((code, _)) => SampleResult::Malformed(format!("HTTP {code}")),
        Err(e) => SampleResult::Unreachable(e),
    }
}

/// The leader claims in a set of samples, for check (c).
pub fn leader_claims(samples: &[Sample]) -> Vec<LeaderClaim> {
    samples
        .iter()
        .filter_map(|s| match &s.result {
            SampleResult::Status(st) if st.is_leader() => Some(LeaderClaim {
                at_us: s.at_us,
                reporter: st.id,
                term: st.term,
                leader: st.id,
                self_report: true,
            }),
            SampleResult::Status(st) => st.leader_id.map(|l| LeaderClaim {
                at_us: s.at_us,
                reporter: st.id,
                term: st.term,
                leader: l,
                self_report: false,
            }),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_status_document_and_records_garbage() {
        let body = br#"{"id":2,"role":"leader","leader_id":2,"term":7,"last_applied":40,
            "members":[{"id":1,"addr":"a:1","voter":true}],"keys":3,"bytes_used":0,
            "bytes_total":0,"evicted_objects":0,"dead_node_dropped_objects":5,"leader_ready":true}"#;
        let SampleResult::Status(s) = parse_status(body) else {
            panic!("not parsed");
        };
        assert!(s.is_leader() && s.leader_ready);
        assert_eq!((s.id, s.term, s.dead_node_dropped_objects), (2, 7, 5));
        assert!(matches!(parse_status(b"\xff{"), SampleResult::Malformed(_)));
        assert!(matches!(
            parse_status(br#"{"id":"x"}"#),
            SampleResult::Malformed(_)
        ));
        assert!(matches!(
            parse_status(br#"{"id":1,"role":"follower","leader_id":null,"term":1}"#),
            SampleResult::Status(_)
        ));
    }

    #[test]
    fn parses_http_responses() {
        assert_eq!(
            parse_response(b"HTTP/1.1 200 OK\r\nA: b\r\n\r\nbody").unwrap(),
            (200, b"body".to_vec())
        );
        assert!(parse_response(b"HTTP/1.1 200 OK").is_err());
        assert!(parse_response(b"junk\r\n\r\n").is_err());
    }

    #[test]
    fn claims_come_from_leaders_and_named_leaders() {
        let st = |id, role: &str, leader_id, term| Sample {
            at_us: 1,
            host: format!("m{id}"),
            result: SampleResult::Status(Status {
                id,
                role: role.into(),
                leader_id,
                term,
                last_applied: None,
                members: vec![],
                keys: 0,
                evicted_objects: 0,
                dead_node_dropped_objects: 0,
                leader_ready: true,
            }),
        };
        let c = leader_claims(&[
            st(1, "leader", Some(1), 3),
            st(2, "follower", Some(1), 3),
            st(3, "candidate", None, 4),
        ]);
        assert_eq!(c.len(), 2);
        assert!(c[0].self_report && !c[1].self_report);
    }
}
