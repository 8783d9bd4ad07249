//! openraft's storage conformance suite, run on `SledLogStore` + `SledStateMachine`.

mod common;

use common::{Kv, Sm, Store, TypeConfig};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{AnyError, ErrorSubject, ErrorVerb, StorageError, StorageIOError};
use regolith_raft_log::StorageConfig;
use tempfile::TempDir;

/// Builds each store in a fresh temp dir; the dir is the guard, removed after the test.
struct Builder;

impl StoreBuilder<TypeConfig, Store, Sm, TempDir> for Builder {
    async fn build(&self) -> Result<(TempDir, Store, Sm), StorageError<u64>> {
        let dir = tempfile::tempdir().map_err(|e| StorageIOError::write(AnyError::new(&e)))?;
        let (store, sm) =
            regolith_raft_log::open(dir.path(), &StorageConfig::default(), Kv::default())
                .map_err(|e| e.into_storage(ErrorSubject::Store, ErrorVerb::Write))?;
        Ok((dir, store, sm))
    }
}

#[test]
fn openraft_storage_suite() {
    Suite::test_all(Builder).expect("openraft storage suite");
}
