//! The cluster token (`--cluster-token-file`): presented on every gRPC call as
//! `authorization: Bearer <token>` and on every data-plane connection in the handshake.

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

/// Client side: adds the token to every request.
#[derive(Clone, Debug, Default)]
pub struct TokenInterceptor {
    value: Option<MetadataValue<tonic::metadata::Ascii>>,
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
        Ok(Self { value })
    }
}

impl Interceptor for TokenInterceptor {
    fn call(&mut self, mut req: Request<()>) -> std::result::Result<Request<()>, Status> {
        if let Some(v) = &self.value {
            req.metadata_mut().insert(HEADER, v.clone());
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
}
