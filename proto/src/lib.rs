//! Regolith's wire formats and the leader-following metad client.
//!
//! This crate depends on no other Regolith crate, so the sidecar, the CLI and the Python wheel can
//! talk to metad without linking the server.
//!
//! Two halves. Always built, what every end of the UDS and the data plane needs:
//! * [`common`] — generated code of the messages both services share (`proto/common.proto`):
//!   one Rust type each for a version, an extent and a put's options.
//! * [`checksum`] — the object checksum: xxh3-64 per 64 KiB chunk, seeded with the version.
//! * [`frame`] — the UDS frame codec (`length | opcode | request id | body`).
//! * [`fdpass`] — file descriptors over a Unix socket (SCM_RIGHTS).
//! * [`uds`] — the client-to-sidecar protocol: opcodes and messages (`proto/uds.proto`).
//! * [`dataplane`] — the sidecar-to-sidecar data-plane wire protocol (handshake, slices).
//! * [`rdma`] — the RDMA upgrade of a data-plane connection: the queue pairs, the segment's
//!   registration and the staging window each end tells the other.
//! * [`grant`] — the leader's grants of segment extents that the data plane checks (MACs).
//! * [`units`] — parsing of sizes (`1GiB`) and durations (`500ms`) in flags and config files.
//! * [`shutdown`] — [`shutdown::Shutdown`], how tasks learn that the process is stopping.
//! * [`net`] — what every accept loop shares: back-off when accept fails, a cap on open
//!   connections.
//! * [`sdnotify`] — systemd's `sd_notify` protocol: `READY=1`, `STOPPING=1`, `MAINPID=` and
//!   the barrier a successor sidecar waits on before its predecessor exits.
//!
//! With the `grpc` feature (on by default; `regolith-client`, and so the Python wheel, turns it
//! off and links none of tonic, tracing-subscriber or clap):
//! * `metad` — generated gRPC code of the metadata API (`proto/metad.proto`); the shared
//!   messages are re-exported there under their names.
//! * `raft` — generated gRPC code of the Raft RPCs between replicas (`proto/raft.proto`).
//! * `auth` — the cluster token carried on gRPC calls and data-plane connections.
//! * `leader` — how followers name the leader in a `NOT_LEADER` answer.
//! * `client` — `client::MetadClient`, which finds the leader, follows redirects and retries
//!   idempotent calls across elections.
//! * `httpd` — the daemons' HTTP listeners: connection cap, header timeout, accept back-off.
//! * `daemon` — the daemons' shared `main` shell: argv, logging, runtime, signals, exit code.
//! * `launch` — `launch::MetadLaunch` / `launch::SidecarLaunch`: a daemon's command line,
//!   typed, for every Rust launcher.
//! * `tls` — mutual TLS (rustls) for gRPC and the data plane: certificate files, rotation
//!   without a restart, the stream types and tonic's connector.
//! * `error` — the error enum of the metad client and token files.
//! * `backup` — the metad snapshot file (`regolith metad snapshot save`, `--restore-from`):
//!   header, info, checksum, validation.
//!
//! With the `pki` feature (the CLI, tests): `pki`, a private CA issuing certificates for a
//! cluster's mutual TLS.

// No unwrap/expect outside tests: nothing a peer, a client or a config file sends may panic
// a process; the few invariants that are ours alone say so where they are allowed.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod checksum;
pub mod dataplane;
pub mod disk_tier;
pub mod fdpass;
pub mod frame;
pub mod grant;
pub mod net;
pub mod rdma;
pub mod sdnotify;
pub mod shutdown;
pub mod uds;
pub mod units;

/// Generated code of `proto/common.proto`: the messages both services share.
pub mod common {
    #![allow(clippy::all, missing_docs)]
    include!(concat!(env!("OUT_DIR"), "/regolith.common.v1.rs"));

    impl Version {
        /// The checksum seed of the object this reservation writes.
        pub fn seed(&self) -> u64 {
            crate::checksum::seed(self.term, self.id)
        }
    }
}

#[cfg(feature = "grpc")]
pub mod auth;
#[cfg(feature = "grpc")]
pub mod backup;
#[cfg(feature = "grpc")]
pub mod client;
#[cfg(feature = "grpc")]
pub mod daemon;
#[cfg(feature = "grpc")]
pub mod error;
#[cfg(feature = "grpc")]
pub mod httpd;
#[cfg(feature = "grpc")]
pub mod launch;
#[cfg(feature = "grpc")]
pub mod leader;
#[cfg(any(feature = "pki", test))]
pub mod pki;
#[cfg(feature = "grpc")]
pub mod tls;

/// Generated code of `proto/metad.proto`; the shared messages are re-exported under their names.
#[cfg(feature = "grpc")]
pub mod metad {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("regolith.metad.v1");
    pub use crate::common::{Extent, PinKind, PutOptions, Version};
}

/// Generated code of `proto/raft.proto`.
#[cfg(feature = "grpc")]
pub mod raft {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("regolith.raft.v1");
}

#[cfg(feature = "grpc")]
pub use error::{Error, Result};
