//! Request deadlines: a client stamps each attempt with the time after which it no longer waits
//! for it ([`DEADLINE_HEADER`], milliseconds since the Unix epoch on its clock), and metad does
//! not act on a request once that time has passed on its own clock: no proposal, no
//! reservation.
//!
//! Why: a client that gave up on an attempt retries elsewhere, and answers its caller with what
//! the retry found. The attempt it gave up on may still arrive: a request held in TCP
//! retransmission through a partition is delivered when the partition heals, possibly to a
//! replica that has meanwhile become leader again. The chaos suite saw a remove sent at 84.9 s
//! to a leader cut off by a split (retried and answered at 87.1 s) reach that replica at 91.1 s,
//! when it had just won the next election, and remove a put acknowledged at 88.2 s (issue 17).
//! With the deadline it is refused instead. The cost is an assumption on the clocks: metad's
//! and its clients' must agree to well within a request timeout (NTP does; a server clock far
//! ahead refuses every write, which the refusal's message and
//! `regolith_metad_requests_past_deadline_total` say).
//!
//! The header is read once per call by [`WithDeadline`], around the gRPC service, into a
//! task-local that the proposer and the reservation path read ([`current`]).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use regolith_proto::auth::{unix_ms, DEADLINE_HEADER};
use tonic::codegen::{http, Service};
use tonic::server::NamedService;

use crate::error::{Error, Result};

tokio::task_local! {
    static DEADLINE_MS: u64;
}

/// The deadline of the request this task serves, if it has one.
pub fn current() -> Option<u64> {
    DEADLINE_MS.try_with(|d| *d).ok()
}

/// Runs `f` as serving a request with `deadline` (milliseconds since the Unix epoch).
pub async fn scope<F: Future>(deadline: Option<u64>, f: F) -> F::Output {
    match deadline {
        Some(d) => DEADLINE_MS.scope(d, f).await,
        None => f.await,
    }
}

/// Refuses when `deadline` is before `now_ms`.
pub fn check_at(deadline: Option<u64>, now_ms: u64) -> Result<()> {
    match deadline {
        Some(d) if now_ms > d => Err(Error::DeadlinePassed {
            late_ms: now_ms - d,
        }),
        _ => Ok(()),
    }
}

/// Refuses when the deadline of the request this task serves has passed.
pub fn check() -> Result<()> {
    check_at(current(), unix_ms())
}

/// The deadline a request carries; a malformed value counts as none (older clients send
/// none, and a deadline only ever refuses).
fn parse(headers: &http::HeaderMap) -> Option<u64> {
    headers
        .get(DEADLINE_HEADER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// A gRPC service whose calls run with their request's deadline ([`current`]).
#[derive(Clone, Debug)]
pub struct WithDeadline<S>(pub S);

impl<S: NamedService> NamedService for WithDeadline<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> Service<http::Request<B>> for WithDeadline<S>
where
    S: Service<http::Request<B>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = std::result::Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<std::result::Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let deadline = parse(req.headers());
        let fut = self.0.call(req);
        Box::pin(scope(deadline, fut))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_refused_only_after_its_deadline() {
        assert!(check_at(None, 5).is_ok());
        assert!(check_at(Some(5), 5).is_ok());
        assert!(matches!(
            check_at(Some(5), 8),
            Err(Error::DeadlinePassed { late_ms: 3 })
        ));
    }

    #[test]
    fn the_header_is_read_and_garbage_counts_as_none() {
        let mut h = http::HeaderMap::new();
        assert_eq!(parse(&h), None);
        h.insert(
            DEADLINE_HEADER,
            http::HeaderValue::from_static("1700000000123"),
        );
        assert_eq!(parse(&h), Some(1_700_000_000_123));
        h.insert(DEADLINE_HEADER, http::HeaderValue::from_static("soon"));
        assert_eq!(parse(&h), None);
    }

    #[tokio::test]
    async fn the_deadline_is_seen_inside_the_call_only() {
        assert_eq!(current(), None);
        let seen = scope(Some(42), async { current() }).await;
        assert_eq!(seen, Some(42));
        assert_eq!(scope(None, async { current() }).await, None);
    }
}
