//! regolith-test-support: what Regolith's test harnesses share, with no dependency at all.
//!
//! * [`ports`] — free loopback ports outside the kernel's ephemeral range, for processes a
//!   harness is about to start.
//! * [`bins`] — where the real `regolith-metad`, `regolith-sidecar` and `regolith` binaries of
//!   this build are (the harnesses drive the binaries from outside, design section 2).
//! * [`python`] — the flag tables of `python/regolith/_launch.py`, for the tests that check them
//!   against the binaries' parsers.
//!
//! Only test code and test harnesses use it (`e2e`, `chaos-tests`, the daemons' integration
//! tests, `regolith-metad-bench`); the shipped crates (`proto`, `client`, the Python wheel, the
//! daemons' libraries) never call it.

pub mod bins;
pub mod ports;
pub mod python;

pub use ports::free_loopback_port;
