//! A toy key-value state machine and type config, shared by the integration tests.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io;
use std::path::Path;
use std::sync::Arc;

use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};
use parking_lot::Mutex;
use regolith_raft_log::{
    SledLogStore, SledStateMachine, SnapshotView, StateMachineCore, StorageConfig,
};
use serde::{Deserialize, Serialize};

openraft::declare_raft_types!(
    pub TypeConfig:
        D = KvCommand,
        R = KvResponse,
        NodeId = u64,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = tokio::fs::File,
        AsyncRuntime = openraft::TokioRuntime,
);

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum KvCommand {
    Set { key: String, value: String },
    Delete { key: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvResponse {
    pub previous: Option<String>,
}

/// Payload version of the toy snapshot format, so that the test also plays by the rules.
const KV_SNAPSHOT_VERSION: u8 = 1;

/// The application's handle: the test keeps a clone and reads the map directly.
#[derive(Debug, Clone, Default)]
pub struct Kv {
    pub map: Arc<Mutex<BTreeMap<String, String>>>,
    /// When set, the next snapshot view's write says so and waits to be released.
    pub hold: Arc<Mutex<Option<HoldWrite>>>,
}

/// Holds a snapshot view's write: `entered` hears when it starts, it goes on once `release`
/// receives (or its sender is dropped).
#[derive(Debug)]
pub struct HoldWrite {
    pub entered: std::sync::mpsc::Sender<()>,
    pub release: std::sync::mpsc::Receiver<()>,
}

/// The map as it was when the view was taken.
struct KvView {
    map: BTreeMap<String, String>,
    hold: Option<HoldWrite>,
}

impl SnapshotView for KvView {
    fn write(self: Box<Self>, w: &mut dyn io::Write) -> io::Result<()> {
        if let Some(h) = &self.hold {
            let _ = h.entered.send(());
            let _ = h.release.recv();
        }
        w.write_all(&[KV_SNAPSHOT_VERSION])?;
        bincode::serialize_into(w, &self.map).map_err(io::Error::other)
    }
}

impl Kv {
    pub fn get(&self, key: &str) -> Option<String> {
        self.map.lock().get(key).cloned()
    }

    pub fn len(&self) -> usize {
        self.map.lock().len()
    }

    pub fn snapshot(&self) -> BTreeMap<String, String> {
        self.map.lock().clone()
    }
}

impl StateMachineCore for Kv {
    type C = TypeConfig;

    fn apply(&mut self, _log_id: &LogId<u64>, data: &KvCommand) -> KvResponse {
        let mut map = self.map.lock();
        let previous = match data {
            KvCommand::Set { key, value } => map.insert(key.clone(), value.clone()),
            KvCommand::Delete { key } => map.remove(key),
        };
        KvResponse { previous }
    }

    fn empty_response(&self) -> KvResponse {
        KvResponse { previous: None }
    }

    fn snapshot_view(&self) -> Box<dyn SnapshotView> {
        Box::new(KvView {
            map: self.map.lock().clone(),
            hold: self.hold.lock().take(),
        })
    }

    fn install_snapshot(&mut self, r: &mut dyn io::Read) -> io::Result<()> {
        let mut version = [0u8; 1];
        r.read_exact(&mut version)?;
        if version[0] != KV_SNAPSHOT_VERSION {
            return Err(io::Error::other(format!(
                "unknown kv snapshot version {}",
                version[0]
            )));
        }
        let map = bincode::deserialize_from(r).map_err(io::Error::other)?;
        *self.map.lock() = map;
        Ok(())
    }
}

pub fn log_id(term: u64, index: u64) -> LogId<u64> {
    LogId::new(CommittedLeaderId::new(term, 0), index)
}

pub fn blank(term: u64, index: u64) -> Entry<TypeConfig> {
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Blank,
    }
}

pub fn set(term: u64, index: u64, key: &str, value: &str) -> Entry<TypeConfig> {
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Normal(KvCommand::Set {
            key: key.to_string(),
            value: value.to_string(),
        }),
    }
}

pub type Store = SledLogStore<TypeConfig>;
pub type Sm = SledStateMachine<Kv>;

/// Opens the storage in `dir` with a fresh application handle, which is returned too.
pub fn open(dir: &Path) -> (Store, Sm, Kv) {
    let kv = Kv::default();
    let (store, sm) =
        regolith_raft_log::open(dir, &StorageConfig::default(), kv.clone()).expect("open storage");
    (store, sm, kv)
}
