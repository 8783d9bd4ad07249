//! Staging windows (sans-I/O): how a holder lets a peer RDMA WRITE without exposing its
//! segment.
//!
//! The holder cannot refuse a one-sided WRITE, so the segment is registered for remote READ
//! only. Each upgraded connection gets its own staging window (a buffer registered for remote
//! WRITE, its rkey given to that peer alone); a put's slice is written there, then committed
//! over TCP (`RDMA_COMMIT`), where the holder admits it exactly as a TCP write (range, grant,
//! term, fence) and only then copies it into the segment. A stale or fenced writer can at most
//! scribble on its own window, which is never copied without a fresh admission.
//!
//! Chosen over a memory window per reservation (type-2 MW bound to the extent) because it
//! needs no MW support from the device or from `sideway` (which has no MW binding), keeps
//! fencing in one place for both transports, and bounds registered memory to the windows;
//! it costs one holder-side copy per written byte. `docs/rdma.md` says what was measured.
//!
//! [`WindowBudget`] caps the memory all windows take (`--rdma-staging-bytes`); a connection
//! that does not fit gets UNSUPPORTED and stays TCP. [`StagingWindow`] is one window's life:
//! `Idle` → `Committing` (a commit admitted, its copy running) → `Idle`, and `Retired` once its
//! connection ends, when the registration must be dropped (its rkey invalidated) before the
//! memory is reused.

use regolith_proto::dataplane::Status;
use regolith_proto::rdma::MIN_WINDOW;

/// The memory every connection's window takes together.
#[derive(Debug)]
pub struct WindowBudget {
    cap: u64,
    used: u64,
    /// Largest single window (the node's slice cap).
    max_window: u32,
}

impl WindowBudget {
    pub fn new(cap: u64, max_window: u32) -> Self {
        Self {
            cap,
            used: 0,
            max_window,
        }
    }

    /// A window for a client that moves slices of at most `wanted` bytes, or `None` when the
    /// budget has no room for one (the connection then stays TCP). Sized to the smaller of
    /// the client's and the node's slice caps, rounded up to whole checksum chunks.
    pub fn reserve(&mut self, wanted: u32) -> Option<u32> {
        let len = wanted
            .min(self.max_window)
            .max(MIN_WINDOW)
            .next_multiple_of(MIN_WINDOW);
        if self.used + u64::from(len) > self.cap {
            return None;
        }
        self.used += u64::from(len);
        Some(len)
    }

    /// Gives back a window's memory once its registration is gone.
    pub fn release(&mut self, len: u32) {
        self.used = self.used.saturating_sub(u64::from(len));
    }

    pub fn used(&self) -> u64 {
        self.used
    }
}

/// Where one window is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WindowState {
    /// Registered, its rkey known to its peer; nothing of it is being copied.
    Idle,
    /// A commit was admitted and its bytes are being copied into the segment.
    Committing { req_id: u64, len: u32 },
    /// Its connection ended: deregister before the memory is reused.
    Retired,
}

/// One connection's staging window.
#[derive(Debug)]
pub struct StagingWindow {
    len: u32,
    state: WindowState,
    commits: u64,
}

impl StagingWindow {
    pub fn new(len: u32) -> Self {
        Self {
            len,
            state: WindowState::Idle,
            commits: 0,
        }
    }

    pub fn len(&self) -> u32 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn state(&self) -> WindowState {
        self.state
    }

    /// Commits completed.
    pub fn commits(&self) -> u64 {
        self.commits
    }

    /// A commit of `len` bytes arrives. `Err` is the status to answer (the window is left as
    /// it was): a slice larger than the window, or a window that is not idle (one request at a
    /// time per connection: a second commit while one copies is a protocol violation).
    pub fn begin(&mut self, req_id: u64, len: u32) -> Result<(), Status> {
        match self.state {
            WindowState::Idle if len <= self.len => {
                self.state = WindowState::Committing { req_id, len };
                Ok(())
            }
            WindowState::Idle => Err(Status::TooLarge),
            WindowState::Committing { .. } => Err(Status::BadRequest),
            WindowState::Retired => Err(Status::Unsupported),
        }
    }

    /// The commit's copy ended (whatever its verdict): the window is idle again.
    pub fn finish(&mut self, req_id: u64) -> Result<(), Status> {
        match self.state {
            WindowState::Committing { req_id: r, .. } if r == req_id => {
                self.state = WindowState::Idle;
                self.commits += 1;
                Ok(())
            }
            _ => Err(Status::Internal),
        }
    }

    /// The connection ended (closed, timed out, broke mid-copy). Returns whether the caller
    /// must now drop the registration; only the first call does.
    pub fn retire(&mut self) -> bool {
        let first = self.state != WindowState::Retired;
        self.state = WindowState::Retired;
        first
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u32 = 1 << 20;

    #[test]
    fn budget_sizes_windows_and_refuses_past_its_cap() {
        let mut b = WindowBudget::new(u64::from(9 * MIB), 4 * MIB);
        // The client's slice when smaller; the node's cap when the client asks for more.
        assert_eq!(b.reserve(MIB), Some(MIB));
        assert_eq!(b.reserve(64 * MIB), Some(4 * MIB));
        // Tiny or odd asks round up to whole checksum chunks.
        assert_eq!(b.reserve(1), Some(MIN_WINDOW));
        assert_eq!(b.reserve(MIN_WINDOW + 1), Some(2 * MIN_WINDOW));
        assert_eq!(b.used(), u64::from(5 * MIB + 3 * MIN_WINDOW));
        // 9 MiB cap: another 4 MiB does not fit, a 1 MiB one still does.
        assert_eq!(b.reserve(4 * MIB), None);
        assert_eq!(b.reserve(MIB), Some(MIB));
        b.release(4 * MIB);
        assert_eq!(b.reserve(4 * MIB), Some(4 * MIB));
        b.release(u32::MAX);
        assert_eq!(b.used(), 0, "release never underflows");
    }

    #[test]
    fn a_window_copies_one_commit_at_a_time() {
        let mut w = StagingWindow::new(MIB);
        assert_eq!(w.state(), WindowState::Idle);
        assert_eq!(w.begin(1, MIB + 1), Err(Status::TooLarge));
        assert_eq!(
            w.state(),
            WindowState::Idle,
            "a refused commit leaves it idle"
        );
        w.begin(2, MIB).unwrap();
        assert_eq!(
            w.state(),
            WindowState::Committing {
                req_id: 2,
                len: MIB
            }
        );
        assert_eq!(w.begin(3, 10), Err(Status::BadRequest));
        assert_eq!(
            w.finish(3),
            Err(Status::Internal),
            "not the request copying"
        );
        w.finish(2).unwrap();
        assert_eq!(w.state(), WindowState::Idle);
        assert_eq!(w.commits(), 1);
        assert_eq!(w.finish(2), Err(Status::Internal), "finished twice");
    }

    #[test]
    fn a_retired_window_takes_no_commit_and_is_deregistered_once() {
        let mut w = StagingWindow::new(MIB);
        w.begin(1, 10).unwrap();
        // The connection breaks mid-copy.
        assert!(w.retire());
        assert!(!w.retire());
        assert_eq!(w.state(), WindowState::Retired);
        assert_eq!(w.begin(2, 10), Err(Status::Unsupported));
        assert_eq!(w.finish(1), Err(Status::Internal));
    }
}
