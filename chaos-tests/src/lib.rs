//! regolith-chaos: Regolith's chaos suite (design section 10). The real `regolith-metad` and
//! `regolith-sidecar` binaries of this build (no daemon library is linked: they are driven from
//! outside) run in network namespaces; named faults are
//! injected and healed on a seeded schedule while clients record every operation; a checker
//! then looks for lost or wrong data, split leadership and missing recovery.
//!
//! Module map:
//! * [`netns`] — hosts as network namespaces on Linux bridges (sidecar hosts have two NICs),
//!   per-run name prefixes, cleanup on drop, on SIGINT/SIGTERM and of dead runs' leftovers;
//!   [`netns::NsRuntime`] runs tokio tasks inside a host.
//! * [`firewall`] — the nftables tables that make network faults.
//! * [`proxy`] — a fault-injecting TCP proxy (delay, dropped connections, refusal).
//! * [`cluster`] — metad replicas in their hosts: start, kill, pause, restart, membership
//!   changes, and the `/status` sampler.
//! * [`status`] — parsing of `/status` samples (untrusted input) and the leader claims in them.
//! * [`nemesis`] — every fault as a named [`nemesis::Nemesis`] with inject and heal;
//!   [`byzantine`] — the hostile client of the `byzantine-client` fault.
//! * [`schedule`] — seeded fault schedules: the quick profile and the long one.
//! * [`workload`] — the pluggable [`workload::Workload`] / [`workload::WorkloadClient`] traits
//!   and the client loops; [`sidecars`] — the workload of real sidecars and the Rust client
//!   (bytes over the data plane); [`metad_only`] — the workload that talks to metad alone.
//! * [`feed`] — metad's change feed followed by the observer: where every object is (memory
//!   or a disk) as metad lists it, recorded for the checker.
//! * [`preload`] — a state of N objects loaded under the run (`HarnessConfig::preload`).
//! * [`value`] — values derived from (key, write id), traceable to the put that wrote them.
//! * [`history`] — the recorded operations and events.
//! * [`checker`] — checks (a)–(f) and the summary table.
//! * [`run`] — a whole run: [`run::Harness`] and [`run::run_profile`].
//! * [`error`] — the crate's error enum.

// No unwrap/expect outside tests: nothing a peer, a client or a config file sends may panic
// a process; the few invariants that are ours alone say so where they are allowed.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod byzantine;
pub mod checker;
pub mod cluster;
pub mod error;
pub mod feed;
pub mod firewall;
pub mod history;
pub mod metad_only;
pub mod nemesis;
pub mod netns;
pub mod preload;
pub mod proxy;
pub mod run;
pub mod schedule;
pub mod sidecars;
pub mod status;
pub mod value;
pub mod workload;

pub use error::{Error, Result};
