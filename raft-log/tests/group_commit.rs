//! Group commit: appends issued back to back share fsyncs.

mod common;

use common::{open, set};
use openraft::storage::RaftLogStorageExt;
use openraft::RaftLogReader;

#[tokio::test]
async fn back_to_back_appends_share_fsyncs() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _sm, _kv) = open(dir.path());
    let stats = store.stats();
    const APPENDS: u64 = 500;

    // Every future writes its entry and queues its callback on its first poll, so join_all
    // issues all the appends before any callback has run; each then waits for its own.
    let appends = (1..=APPENDS).map(|i| {
        let mut store = store.clone();
        async move {
            let value = format!("value-{i}");
            store.blocking_append([set(1, i, "key", &value)]).await
        }
    });
    for result in futures::future::join_all(appends).await {
        result.expect("append");
    }

    assert_eq!(stats.append_batches(), APPENDS);
    assert_eq!(stats.appended_entries(), APPENDS);
    assert_eq!(stats.durable_callbacks(), APPENDS);
    let fsyncs = stats.fsyncs();
    eprintln!("{APPENDS} appends, {fsyncs} fsyncs");
    assert!(
        fsyncs * 10 <= APPENDS,
        "{APPENDS} appends took {fsyncs} fsyncs: group commit is not grouping"
    );
    let histogram = stats.flush_latency();
    assert_eq!(histogram.count, fsyncs);

    let mut reader = store.clone();
    assert_eq!(
        reader.try_get_log_entries(1..=APPENDS).await.unwrap().len() as u64,
        APPENDS
    );
}
