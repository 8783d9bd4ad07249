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

    // The flusher is held while the appends are issued, so the test does not depend on how
    // fast this disk's fsync is against how fast appends arrive.
    let callbacks_before = stats.durable_callbacks();
    let pause = store.pause_flusher().await.unwrap();
    let fsyncs_before = stats.fsyncs();

    // Every future writes its entry and queues its callback on its first poll, so the first
    // poll of join_all issues all the appends; each then waits for its own callback.
    let appends = (1..=APPENDS).map(|i| {
        let mut store = store.clone();
        async move {
            let value = format!("value-{i}");
            store.blocking_append([set(1, i, "key", &value)]).await
        }
    });
    let mut all = Box::pin(futures::future::join_all(appends));
    assert!(
        futures::poll!(&mut all).is_pending(),
        "acknowledged while the flusher was held"
    );
    assert_eq!(
        stats.append_batches(),
        APPENDS,
        "every append written before any fsync"
    );
    assert_eq!(
        stats.durable_callbacks() - callbacks_before,
        1,
        "only the pause completed so far"
    );
    drop(pause);
    for result in all.await {
        result.expect("append");
    }

    assert_eq!(stats.appended_entries(), APPENDS);
    assert_eq!(stats.durable_callbacks() - callbacks_before, APPENDS + 1);
    let fsyncs = stats.fsyncs() - fsyncs_before;
    assert_eq!(
        fsyncs, 1,
        "{APPENDS} appends queued behind one flush took {fsyncs} fsyncs: group commit is not grouping"
    );
    let histogram = stats.flush_latency();
    assert_eq!(histogram.count, stats.fsyncs());

    let mut reader = store.clone();
    assert_eq!(
        reader.try_get_log_entries(1..=APPENDS).await.unwrap().len() as u64,
        APPENDS
    );
}
