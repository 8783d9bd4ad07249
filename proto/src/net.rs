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

#[cfg(test)]
mod tests {
    use super::*;

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
