//! The short run in CI: every target replays its corpus and mutates for `REGOLITH_FUZZ_SECS`
//! (default 2 s). Longer: `REGOLITH_FUZZ_SECS=600 cargo test -p regolith-fuzz --release`.

use regolith_fuzz::runner::{self, Options};

fn fuzz(name: &str) {
    let target = regolith_fuzz::target(name).unwrap();
    match runner::run(target, &Options::from_env()) {
        Ok(report) => {
            assert!(
                report.corpus > 0,
                "{name}: no seed corpus in fuzz/corpus/{name}"
            );
            println!("{report}");
        }
        Err(crash) => panic!("{crash}"),
    }
}

#[test]
fn every_target_has_a_test() {
    let src = include_str!("targets.rs");
    for t in regolith_fuzz::TARGETS {
        assert!(
            src.contains(&format!("fn {}()", t.name)),
            "no test for {}",
            t.name
        );
    }
}

#[test]
fn uds_frame() {
    fuzz("uds_frame");
}

#[test]
fn uds_request() {
    fuzz("uds_request");
}

#[test]
fn uds_reply() {
    fuzz("uds_reply");
}

#[test]
fn dataplane_hello() {
    fuzz("dataplane_hello");
}

#[test]
fn dataplane_request() {
    fuzz("dataplane_request");
}

#[test]
fn dataplane_reply() {
    fuzz("dataplane_reply");
}

#[test]
fn rdma_upgrade() {
    fuzz("rdma_upgrade");
}

#[test]
fn raft_payload() {
    fuzz("raft_payload");
}

#[test]
fn snapshot_file() {
    fuzz("snapshot_file");
}

#[test]
fn snapshot_state() {
    fuzz("snapshot_state");
}

#[test]
fn sled_record() {
    fuzz("sled_record");
}
