//! The records the Raft log store reads back from sled (`regolith_raft_log`): log entries
//! under their big-endian index, and the vote, committed and last-purged ids of the meta tree.
//! A damaged disk or a bug must become an error, never a panic of metad.

use openraft::{Entry, LogId, Vote};
use regolith_metad::raft_types::TypeConfig;
use regolith_raft_log::fuzz as raft_log;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Byte 0 picks the record; for a log entry the next 8 bytes are its key.
pub fn sled_record(data: &[u8]) {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    match pick % 4 {
        0 => log_entry(rest),
        1 => meta::<Vote<u64>>("vote", rest),
        2 => meta::<LogId<u64>>("committed", rest),
        _ => meta::<LogId<u64>>("last_purged", rest),
    }
}

fn log_entry(rest: &[u8]) {
    let (key, value) = rest.split_at(rest.len().min(8));
    let Ok(entry) = raft_log::log_entry::<TypeConfig>(key, value) else {
        return;
    };
    assert_eq!(
        key,
        entry.log_id.index.to_be_bytes(),
        "entry under another index"
    );
    let once = encode(&entry);
    match raft_log::log_entry::<TypeConfig>(key, &once) {
        Ok(e2) => assert_eq!(encode::<Entry<TypeConfig>>(&e2), once, "not a fixed point"),
        Err(e) => panic!("a re-encoded log entry does not decode: {e}"),
    }
}

fn meta<T: Serialize + DeserializeOwned>(key: &str, bytes: &[u8]) {
    let Ok(v) = raft_log::meta_record::<T>(key, bytes) else {
        return;
    };
    let once = encode(&v);
    match raft_log::meta_record::<T>(key, &once) {
        Ok(v2) => assert_eq!(encode(&v2), once, "not a fixed point"),
        Err(e) => panic!("a re-encoded {key} record does not decode: {e}"),
    }
}

/// The encoding the log store writes (`bincode::serialize`).
fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    match bincode::serialize(v) {
        Ok(b) => b,
        Err(e) => panic!("a decoded record does not re-encode: {e}"),
    }
}
