//! Snapshots a follower installs from the leader: the file format of `regolith_raft_log`
//! (header, meta, checksum; validated on install and on open) and metad's state-machine payload
//! inside it (`StateMachine::read_snapshot`).

use std::cell::RefCell;
use std::io::Write;
use std::path::PathBuf;

use regolith_metad::state::StateMachine;
use regolith_raft_log::fuzz as raft_log;

thread_local! {
    /// One scratch file per thread (the test harness runs targets on several): the validator
    /// reads a file, as it does on install.
    static SCRATCH: RefCell<Option<(tempfile::TempDir, PathBuf)>> = const { RefCell::new(None) };
}

/// The bytes as a snapshot file: what validates has a payload length that fits the file, and
/// its meta re-encodes to a file that validates equal.
pub fn snapshot_file(data: &[u8]) {
    with_scratch(|path| {
        let Ok(mut f) = std::fs::File::create(path) else {
            return;
        };
        if f.write_all(data).is_err() {
            return;
        }
        drop(f);
        let Ok((meta, payload_len)) = raft_log::snapshot_file(path) else {
            return;
        };
        assert!(
            payload_len <= data.len() as u64,
            "payload longer than the file"
        );
        let payload = &data[data.len() - payload_len as usize..];
        let again = path.with_extension("again");
        // The writer creates its file exclusively (as for a snapshot received from the leader).
        let _ = std::fs::remove_file(&again);
        match raft_log::write_snapshot_file(&again, &meta, payload) {
            Ok(_) => match raft_log::snapshot_file(&again) {
                Ok((meta2, len2)) => {
                    assert_eq!(meta2, meta, "snapshot meta changed on re-encoding");
                    assert_eq!(len2, payload_len);
                }
                Err(e) => panic!("a re-written snapshot does not validate: {e}"),
            },
            Err(e) => panic!("a validated snapshot does not re-write: {e}"),
        }
    });
}

/// Runs `f` on this thread's scratch path, creating its directory on first use.
fn with_scratch(f: impl FnOnce(&std::path::Path)) {
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        if s.is_none() {
            let Ok(dir) = tempfile::tempdir() else {
                return;
            };
            let path = dir.path().join("snap.snap");
            *s = Some((dir, path));
        }
        if let Some((_, path)) = s.as_ref() {
            f(path);
        }
    });
}

/// The bytes as a state-machine snapshot payload: what reads back writes a snapshot that reads
/// back and writes the same bytes.
pub fn snapshot_state(data: &[u8]) {
    let Ok(sm) = StateMachine::read_snapshot(&mut &data[..]) else {
        return;
    };
    let once = sm.snapshot_bytes();
    let twice = match StateMachine::read_snapshot(&mut once.as_slice()) {
        Ok(sm2) => sm2.snapshot_bytes(),
        Err(e) => panic!("a re-written state-machine snapshot does not read: {e}"),
    };
    assert!(once == twice, "read → write is not a fixed point");
}
