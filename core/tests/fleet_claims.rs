//! The fleet claims only work someone started: a hint (or an orphan) naming an id without an
//! item or without a desired state creates nothing, and a STOPPED one is not taken; leader-style
//! keys (`acquire`) keep creating their item.

mod worker_support;

use std::sync::Arc;
use std::time::Duration;

use leaselock::worker::Worker;
use leaselock::{DesiredState, Error, Hint, LeaseItem, LeaseStore, LeaseTable, TableConfig};
use worker_support::*;

async fn scan(table: &LeaseTable) -> Vec<LeaseItem> {
    let mut items = table.items().await.unwrap();
    items.sort_by(|a, b| a.id.cmp(&b.id));
    items
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hint_for_an_id_without_an_item_creates_nothing() {
    let Some(sdk) = aws().await else { return };
    let table = lease_table(&sdk, TableConfig::new("x")).await;
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let queue = sqs.create_queue().queue_name(unique("hints")).send().await.unwrap().queue_url.unwrap();
    table.start("stopped", "wss://feed.example/stopped").await.unwrap();
    table.stop("stopped").await.unwrap();
    // An item that was only ever a leader-style key: no desired state.
    let leader = table.acquire("leader", "someone").await.unwrap();
    table.release(&leader).await.unwrap();
    let before = scan(&table).await;

    let (handle, task) = spawn_hinted(Worker::builder(Arc::new(table.clone())), &sqs, &queue, Duration::from_secs(600));
    for id in ["typo-1", "stopped", "leader", "typo-2"] {
        sqs.send_message().queue_url(&queue).message_body(Hint::new(id).to_json()).send().await.unwrap();
    }
    wait_until(Duration::from_secs(15), "hints handled", || {
        let s = handle.snapshot();
        s.hints_received == 4 && s.acquire_conflicts + s.acquire_errors == 4
    })
    .await;
    // Real work still arrives through the same queue.
    table.start("s1", "wss://feed.example/s1").await.unwrap();
    sqs.send_message().queue_url(&queue).message_body(Hint::new("s1").to_json()).send().await.unwrap();
    wait_until(Duration::from_secs(15), "s1 claimed", || handle.snapshot().held == ["s1"]).await;

    let after: Vec<LeaseItem> = scan(&table).await.into_iter().filter(|i| i.id != "s1").collect();
    assert_eq!(after, before, "the hints wrote nothing: no typo item, the others untouched");
    assert_eq!(handle.snapshot().acquired, 1);
    handle.shutdown();
    task.await.unwrap();
}

#[tokio::test]
async fn acquire_started_refuses_without_writing_and_acquire_keeps_leader_keys() {
    let Some(sdk) = aws().await else { return };
    let table = lease_table(&sdk, TableConfig::new("x")).await;
    let memory = memory_store(TableConfig::new("memory"));
    for store in [&table as &dyn LeaseStore, &memory] {
        store.start("stopped", "wss://feed.example/stopped").await.unwrap();
        store.stop("stopped").await.unwrap();
        let leader = store.acquire("leader", "someone").await.unwrap();
        store.release(&leader).await.unwrap();
        store.start("s1", "wss://feed.example/s1").await.unwrap();
        let before = store.items().await.unwrap().len();

        assert!(matches!(store.acquire_started("missing", "w").await, Err(Error::NotFound { id }) if id == "missing"));
        assert!(matches!(store.acquire_started("leader", "w").await, Err(Error::NotFound { .. })));
        assert!(matches!(store.acquire_started("stopped", "w").await, Err(Error::Stopped { .. })));
        assert_eq!(store.items().await.unwrap().len(), before, "nothing created");
        assert!(store.get("missing").await.unwrap().is_none());

        let lease = store.acquire_started("s1", "w").await.unwrap();
        assert_eq!((lease.fence, lease.desired_state), (1, Some(DesiredState::Started)));
        assert!(matches!(store.acquire_started("s1", "v").await, Err(Error::Held { owner, .. }) if owner == "w"));
        // Leader-style keys: acquire creates the item, as before.
        assert_eq!(store.acquire("leader/new", "w").await.unwrap().fence, 1);
        assert_eq!(store.items().await.unwrap().len(), before + 1);
    }
}
