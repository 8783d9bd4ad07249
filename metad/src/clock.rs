//! The clocks handed to the sans-I/O core (the only place metad reads time for it).

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::config::Now;

/// Monotonic milliseconds since the process started, and wall-clock milliseconds.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    start: Instant,
}

impl Default for Clock {
    fn default() -> Self {
        Self {
            start: Instant::now(),
        }
    }
}

impl Clock {
    pub fn now(&self) -> Now {
        Now {
            // Offset so that 0 never means "now" for timers initialised to 0.
            mono_ms: self.start.elapsed().as_millis() as u64 + 1_000,
            wall_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
        }
    }
}
