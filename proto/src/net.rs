//! What every accept loop of the daemons does the same way: back off when `accept` fails
//! (at the file-descriptor limit it fails at once, every time: a loop that retries at once
//! spins a core and floods the log) and cap the connections one listener holds open.
//!
//! Finding 5 of the hardening review: metad's HTTP loop used ~80 % of a core and wrote 1.48 GB
//! of log in 10 s at the fd limit; the sidecar's HTTP and UDS loops and tonic's gRPC loop spun
//! the same way.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The first pause after a failed accept; it doubles up to [`MAX_PAUSE`] while accepts keep
/// failing, and starts again after one succeeds.
pub const FIRST_PAUSE: Duration = Duration::from_millis(5);
pub const MAX_PAUSE: Duration = Duration::from_secs(1);
/// At most one log line per listener in this interval, with the count of failures since the
/// last line.
pub const LOG_EVERY: Duration = Duration::from_secs(5);

/// The back-off state of one accept loop.
#[derive(Debug)]
pub struct AcceptBackoff {
    what: &'static str,
    pause: Duration,
    unlogged: u64,
    logged_at: Option<Instant>,
}

impl AcceptBackoff {
    /// `what` names the listener in the log ("metrics", "UDS", "data plane 10.0.0.1:7600").
    pub fn new(what: &'static str) -> Self {
        Self {
            what,
            pause: FIRST_PAUSE,
            unlogged: 0,
            logged_at: None,
        }
    }

    /// After a failed accept: logs (rate-limited) and says how long to pause before the next.
    pub fn failed(&mut self, error: &std::io::Error, now: Instant) -> Duration {
        self.unlogged += 1;
        let due = self
            .logged_at
            .is_none_or(|at| now.duration_since(at) >= LOG_EVERY);
        if due {
            tracing::warn!(
                listener = self.what,
                error = %error,
                failures = self.unlogged,
                "accept failing (file-descriptor limit?): backing off"
            );
            self.unlogged = 0;
            self.logged_at = Some(now);
        }
        let pause = self.pause;
        self.pause = (self.pause * 2).min(MAX_PAUSE);
        pause
    }

    /// After a successful accept.
    pub fn succeeded(&mut self) {
        self.pause = FIRST_PAUSE;
    }

    /// [`Self::failed`], then the pause.
    pub async fn pause_after(&mut self, error: &std::io::Error) {
        let d = self.failed(error, Instant::now());
        tokio::time::sleep(d).await;
    }
}

/// The most connections one listener keeps open; a connection beyond it is closed at once
/// (and counted by the caller).
#[derive(Clone, Debug)]
pub struct ConnLimit {
    slots: Arc<Semaphore>,
    max: usize,
}

/// Held by a connection for as long as it is open.
#[derive(Debug)]
pub struct ConnSlot(#[allow(dead_code)] OwnedSemaphorePermit);

impl ConnLimit {
    pub fn new(max: usize) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(max)),
            max,
        }
    }

    /// A slot, or None when `max` connections are open.
    pub fn try_take(&self) -> Option<ConnSlot> {
        self.slots.clone().try_acquire_owned().ok().map(ConnSlot)
    }

    pub fn max(&self) -> usize {
        self.max
    }

    pub fn open(&self) -> usize {
        self.max - self.slots.available_permits()
    }
}

/// Connections still in their handshake (TLS, a token), counted apart from established ones:
/// at most `max` at once, and a new one past that closes the **oldest** (issue 14, finding 8:
/// refusing the newest instead lets silent connections lock real peers out for good).
#[derive(Clone, Debug)]
pub struct Handshakes {
    inner: Arc<std::sync::Mutex<PendingSet>>,
    max: usize,
}

#[derive(Debug, Default)]
struct PendingSet {
    next: u64,
    conns: std::collections::BTreeMap<u64, tokio_util::sync::CancellationToken>,
}

/// A connection's place among the pending handshakes: `evicted` fires when a newer connection
/// took it; dropping it (the handshake ended, either way) leaves the set.
#[derive(Debug)]
pub struct Pending {
    set: Arc<std::sync::Mutex<PendingSet>>,
    id: u64,
    pub evicted: tokio_util::sync::CancellationToken,
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Ok(mut s) = self.set.lock() {
            s.conns.remove(&self.id);
        }
    }
}

impl Handshakes {
    pub fn new(max: usize) -> Self {
        Self {
            inner: Arc::default(),
            max: max.max(1),
        }
    }

    /// Registers a new connection; returns its place and how many older ones it evicted.
    pub fn admit(&self) -> (Pending, usize) {
        let mut set = match self.inner.lock() {
            Ok(s) => s,
            Err(poisoned) => poisoned.into_inner(),
        };
        let mut evicted = 0;
        while set.conns.len() >= self.max {
            if let Some((_, oldest)) = set.conns.pop_first() {
                oldest.cancel();
                evicted += 1;
            }
        }
        let id = set.next;
        set.next += 1;
        let token = tokio_util::sync::CancellationToken::new();
        set.conns.insert(id, token.clone());
        let pending = Pending {
            set: self.inner.clone(),
            id,
            evicted: token,
        };
        (pending, evicted)
    }

    /// Connections in their handshake now.
    pub fn len(&self) -> usize {
        self.inner.lock().map(|s| s.conns.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_set_of_handshakes_closes_the_oldest_and_forgets_the_finished() {
        let h = Handshakes::new(2);
        let (a, n) = h.admit();
        assert_eq!(n, 0);
        let (b, _) = h.admit();
        let (c, n) = h.admit();
        assert_eq!(n, 1);
        assert!(a.evicted.is_cancelled(), "the oldest makes room");
        assert!(!b.evicted.is_cancelled() && !c.evicted.is_cancelled());
        drop(a);
        assert_eq!(h.len(), 2);
        drop(b);
        assert_eq!(h.len(), 1);
        let (_d, n) = h.admit();
        assert_eq!(n, 0, "a finished handshake frees its place");
        drop(c);
        assert_eq!(h.len(), 1);
    }

    #[test]
    fn pauses_double_to_a_ceiling_and_reset_after_a_success() {
        let mut b = AcceptBackoff::new("test");
        let e = std::io::Error::from_raw_os_error(24);
        let t = Instant::now();
        let pauses: Vec<Duration> = (0..12).map(|_| b.failed(&e, t)).collect();
        assert_eq!(pauses[0], FIRST_PAUSE);
        assert_eq!(pauses[1], FIRST_PAUSE * 2);
        assert_eq!(*pauses.last().unwrap(), MAX_PAUSE);
        assert!(pauses.windows(2).all(|w| w[0] <= w[1]));
        b.succeeded();
        assert_eq!(b.failed(&e, t), FIRST_PAUSE);
    }

    #[test]
    fn log_lines_are_rate_limited_and_carry_the_count() {
        let mut b = AcceptBackoff::new("test");
        let e = std::io::Error::from_raw_os_error(24);
        let t = Instant::now();
        b.failed(&e, t);
        assert_eq!((b.unlogged, b.logged_at), (0, Some(t)));
        for i in 1..=100 {
            b.failed(&e, t + Duration::from_millis(i));
        }
        assert_eq!(b.unlogged, 100, "no line within LOG_EVERY");
        b.failed(&e, t + LOG_EVERY);
        assert_eq!(b.unlogged, 0);
    }

    #[test]
    fn a_limit_hands_out_max_slots_and_takes_them_back_on_drop() {
        let l = ConnLimit::new(2);
        let a = l.try_take().unwrap();
        let _b = l.try_take().unwrap();
        assert!(l.try_take().is_none());
        assert_eq!(l.open(), 2);
        drop(a);
        assert!(l.try_take().is_some());
    }
}
