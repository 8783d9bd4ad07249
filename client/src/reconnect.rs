//! Spacing of reconnection attempts to a sidecar that went away (issue 14, finding 14).
//!
//! Without it, an application that retries every failed call in a loop turns a sidecar restart
//! into a storm of connection attempts and errors (457,580 in a 9 s outage). Sans-I/O: the
//! caller passes the time; [`crate::client::AsyncClient`] waits out [`Reconnect::wait`] before
//! each attempt, and the session lock makes concurrent callers share one attempt.

use std::time::{Duration, Instant};

/// First pause after a failed attempt; it doubles per failure up to [`MAX_DELAY`].
pub const FIRST_DELAY: Duration = Duration::from_millis(10);
/// Longest pause between two attempts.
pub const MAX_DELAY: Duration = Duration::from_secs(1);

/// When the next connection attempt may start.
#[derive(Clone, Debug, Default)]
pub struct Reconnect {
    failures: u32,
    not_before: Option<Instant>,
}

impl Reconnect {
    /// How long to wait at `now` before the next attempt (zero when one may start at once).
    pub fn wait(&self, now: Instant) -> Duration {
        self.not_before
            .map_or(Duration::ZERO, |t| t.saturating_duration_since(now))
    }

    /// An attempt failed at `now`: the next one waits twice as long as the last (capped).
    pub fn failed(&mut self, now: Instant) {
        let delay = FIRST_DELAY
            .saturating_mul(1u32 << self.failures.min(16))
            .min(MAX_DELAY);
        self.failures = self.failures.saturating_add(1);
        self.not_before = Some(now + delay);
    }

    /// An attempt succeeded: the next outage starts from the first delay again.
    pub fn succeeded(&mut self) {
        *self = Self::default();
    }

    /// Failed attempts since the last success.
    pub fn failures(&self) -> u32 {
        self.failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finding_14_attempts_are_spaced_doubling_to_a_cap() {
        let t0 = Instant::now();
        let mut r = Reconnect::default();
        assert_eq!(r.wait(t0), Duration::ZERO, "the first attempt goes at once");
        let mut delays = Vec::new();
        let mut now = t0;
        for _ in 0..10 {
            r.failed(now);
            let d = r.wait(now);
            delays.push(d.as_millis());
            now += d;
            assert_eq!(r.wait(now), Duration::ZERO);
        }
        assert_eq!(delays, [10, 20, 40, 80, 160, 320, 640, 1000, 1000, 1000]);
        // A 9 s outage costs a few dozen attempts, not hundreds of thousands.
        let mut r = Reconnect::default();
        let (mut now, end, mut attempts) = (t0, t0 + Duration::from_secs(9), 0);
        while now < end {
            attempts += 1;
            r.failed(now);
            now += r.wait(now);
        }
        assert!(attempts <= 16, "{attempts} attempts");
        r.succeeded();
        assert_eq!((r.failures(), r.wait(now)), (0, Duration::ZERO));
        // Far-future failures never overflow.
        for _ in 0..100 {
            r.failed(now);
        }
        assert_eq!(r.wait(now), MAX_DELAY);
    }
}
