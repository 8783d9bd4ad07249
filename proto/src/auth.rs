//! The cluster token (`--cluster-token-file`): presented on every gRPC call as
//! `authorization: Bearer <token>` and on every data-plane connection in the handshake.
//! The Raft peer credential (`--peer-token-file`, metad only): presented by replicas on every
//! Raft message as `x-regolith-peer-token`, so that a holder of the cluster token (every
//! sidecar and CLI user) cannot pose as a member (issue 14).

use std::path::Path;

use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::{Request, Status};

use crate::error::{Error, Result};

/// gRPC metadata key carrying the token.
pub const HEADER: &str = "authorization";

/// Longest token accepted (a token file is a short secret, not a document).
pub use crate::dataplane::MAX_TOKEN_LEN;

/// Reads a token file: its content with surrounding whitespace trimmed; it must not be empty.
pub fn read_token_file(path: &Path) -> Result<String> {
    let raw = std::fs::read_to_string(path).map_err(|e| {
        Error::Config(format!(
            "cannot read cluster token file {}: {e}",
            path.display()
        ))
    })?;
    let token = raw.trim();
    if token.is_empty() || token.len() > MAX_TOKEN_LEN {
        return Err(Error::Config(format!(
            "cluster token file {} must hold 1..={MAX_TOKEN_LEN} bytes of token",
            path.display()
        )));
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Error::Config(format!(
            "cluster token in {} must be printable ASCII without spaces",
            path.display()
        )));
    }
    Ok(token.to_string())
}

/// Compares two byte strings in time independent of where they differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// gRPC metadata key carrying a request's deadline: milliseconds since the Unix epoch on the
/// client's clock. metad does not act on a request (propose it, reserve for it) once its clock
/// has passed the deadline, so an attempt the client gave up on cannot take effect after the
/// client retried it elsewhere and answered its caller (issue 17: a remove held in TCP
/// retransmission through a partition reached the next leader four seconds later and removed
/// a newer put). Absent: no deadline.
pub const DEADLINE_HEADER: &str = "regolith-deadline-ms";

/// Milliseconds since the Unix epoch now (0 if the clock is before it).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Client side: adds the token to every request, and its deadline when one is set.
#[derive(Clone, Debug, Default)]
pub struct TokenInterceptor {
    value: Option<MetadataValue<tonic::metadata::Ascii>>,
    deadline: Option<std::time::Duration>,
}

impl TokenInterceptor {
    pub fn new(token: Option<&str>) -> Result<Self> {
        let value = match token {
            None => None,
            Some(t) => Some(
                format!("Bearer {t}")
                    .parse()
                    .map_err(|_| Error::Config("cluster token is not valid header text".into()))?,
            ),
        };
        Ok(Self {
            value,
            deadline: None,
        })
    }

    /// Stamps every request with a deadline `timeout` after it is sent ([`DEADLINE_HEADER`]):
    /// the attempt's own timeout, after which the client no longer waits for it.
    pub fn with_deadline(mut self, timeout: std::time::Duration) -> Self {
        self.deadline = Some(timeout);
        self
    }
}

impl Interceptor for TokenInterceptor {
    fn call(&mut self, mut req: Request<()>) -> std::result::Result<Request<()>, Status> {
        if let Some(v) = &self.value {
            req.metadata_mut().insert(HEADER, v.clone());
        }
        if let Some(t) = self.deadline {
            let at = unix_ms().saturating_add(t.as_millis() as u64);
            req.metadata_mut()
                .insert(DEADLINE_HEADER, MetadataValue::from(at));
        }
        Ok(req)
    }
}

/// Server side: refuses a request without the expected token before its body is read.
#[derive(Clone, Debug, Default)]
pub struct TokenCheck {
    expected: Option<std::sync::Arc<str>>,
}

impl TokenCheck {
    pub fn new(token: Option<String>) -> Self {
        Self {
            expected: token.map(Into::into),
        }
    }

    pub fn check<T>(&self, req: &Request<T>) -> std::result::Result<(), Status> {
        let Some(expected) = &self.expected else {
            return Ok(());
        };
        let presented = req
            .metadata()
            .get(HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        match presented {
            Some(p) if constant_time_eq(p.as_bytes(), expected.as_bytes()) => Ok(()),
            Some(_) => Err(Status::unauthenticated("wrong cluster token")),
            None => Err(Status::unauthenticated(
                "missing cluster token (authorization: Bearer ...)",
            )),
        }
    }
}

impl Interceptor for TokenCheck {
    fn call(&mut self, req: Request<()>) -> std::result::Result<Request<()>, Status> {
        self.check(&req)?;
        Ok(req)
    }
}

/// gRPC metadata key carrying the Raft peer credential.
pub const PEER_HEADER: &str = "x-regolith-peer-token";

/// Client side of Raft: the cluster token and, when set, the peer credential.
#[derive(Clone, Debug, Default)]
pub struct PeerInterceptor {
    token: TokenInterceptor,
    peer: Option<MetadataValue<tonic::metadata::Ascii>>,
}

impl PeerInterceptor {
    pub fn new(token: Option<&str>, peer: Option<&str>) -> Result<Self> {
        let peer =
            match peer {
                None => None,
                Some(p) => Some(p.parse().map_err(|_| {
                    Error::Config("peer credential is not valid header text".into())
                })?),
            };
        Ok(Self {
            token: TokenInterceptor::new(token)?,
            peer,
        })
    }
}

impl Interceptor for PeerInterceptor {
    fn call(&mut self, req: Request<()>) -> std::result::Result<Request<()>, Status> {
        let mut req = self.token.call(req)?;
        if let Some(v) = &self.peer {
            req.metadata_mut().insert(PEER_HEADER, v.clone());
        }
        Ok(req)
    }
}

/// Server side of Raft: the cluster token, then (when configured) the peer credential, both
/// before the message body is read.
#[derive(Clone, Debug, Default)]
pub struct PeerCheck {
    token: TokenCheck,
    peer: Option<std::sync::Arc<str>>,
}

impl PeerCheck {
    pub fn new(token: Option<String>, peer: Option<String>) -> Self {
        Self {
            token: TokenCheck::new(token),
            peer: peer.map(Into::into),
        }
    }

    pub fn check<T>(&self, req: &Request<T>) -> std::result::Result<(), Status> {
        self.token.check(req)?;
        let Some(expected) = &self.peer else {
            return Ok(());
        };
        match req.metadata().get(PEER_HEADER).and_then(|v| v.to_str().ok()) {
            Some(p) if constant_time_eq(p.as_bytes(), expected.as_bytes()) => Ok(()),
            Some(_) => Err(Status::permission_denied(
                "wrong Raft peer credential (--peer-token-file differs from this replica's)",
            )),
            None => Err(Status::permission_denied(
                "Raft messages need the peer credential (x-regolith-peer-token; metad's --peer-token-file): the cluster token alone does not make a member",
            )),
        }
    }
}

impl Interceptor for PeerCheck {
    fn call(&mut self, req: Request<()>) -> std::result::Result<Request<()>, Status> {
        self.check(&req)?;
        Ok(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_check_accepts_only_the_right_token() {
        let check = TokenCheck::new(Some("s3cret".into()));
        let with = |t: Option<&str>| {
            let mut i = TokenInterceptor::new(t).unwrap();
            let req = i.call(Request::new(())).unwrap();
            check.check(&req).map_err(|s| s.code())
        };
        assert_eq!(with(Some("s3cret")), Ok(()));
        assert_eq!(with(Some("s3creT")), Err(tonic::Code::Unauthenticated));
        assert_eq!(with(None), Err(tonic::Code::Unauthenticated));
        assert!(TokenCheck::new(None).check(&Request::new(())).is_ok());
    }

    #[test]
    fn peer_check_needs_both_credentials() {
        let check = PeerCheck::new(Some("tok".into()), Some("peer".into()));
        let with = |t: Option<&str>, p: Option<&str>| {
            let mut i = PeerInterceptor::new(t, p).unwrap();
            let req = i.call(Request::new(())).unwrap();
            check.check(&req).map_err(|s| s.code())
        };
        assert_eq!(with(Some("tok"), Some("peer")), Ok(()));
        assert_eq!(with(Some("tok"), None), Err(tonic::Code::PermissionDenied));
        assert_eq!(
            with(Some("tok"), Some("peeR")),
            Err(tonic::Code::PermissionDenied)
        );
        assert_eq!(with(None, Some("peer")), Err(tonic::Code::Unauthenticated));
        // Without a configured credential, the cluster token suffices (the old behaviour).
        let open = PeerCheck::new(Some("tok".into()), None);
        let mut i = PeerInterceptor::new(Some("tok"), None).unwrap();
        assert!(open.check(&i.call(Request::new(())).unwrap()).is_ok());
    }
}
