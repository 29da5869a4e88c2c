//! The sharded orphan index (`TableConfig::orphan_shards`): running work is spread over
//! `STARTED#0..N-1`, orphan listings page through every shard, and a worker finds orphans in
//! each of them, on the memory store and on the local AWS engine.

mod worker_support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use leaselock::worker::{BoxError, Connection, Worker};
use leaselock::{orphan_shard_of, DesiredState, LeaseStore, OrphanCursor, TableConfig};
use worker_support::*;

const SHARDS: u32 = 8;

fn sharded() -> TableConfig {
    short_config().orphan_shards(SHARDS).validated().unwrap()
}

/// Every orphan below `cutoff`, page by page (`page_size` each), with the cursors seen.
async fn walk(store: &dyn LeaseStore, cutoff: u64, page_size: usize) -> (Vec<String>, Vec<OrphanCursor>) {
    let (mut ids, mut cursors, mut after) = (Vec::new(), Vec::new(), None);
    for _ in 0..1_000 {
        let page = store.orphans_page(cutoff, page_size, after).await.unwrap();
        assert!(page.items.len() <= page_size);
        ids.extend(page.items.into_iter().map(|i| i.id));
        match page.next {
            Some(next) => {
                cursors.push(next.clone());
                after = Some(next);
            }
            None => return (ids, cursors),
        }
    }
    panic!("the listing never ended");
}

/// A first page read from each shard in turn (`orphans_page_from`, the worker's spread start)
/// begins in that shard and goes round the rest in order; a page large enough holds them all.
async fn pages_start_where_asked(store: &dyn LeaseStore, ids: &[String], cutoff: u64) {
    for k in 0..SHARDS {
        let page = store.orphans_page_from(cutoff, 6, k).await.unwrap();
        let order: Vec<u32> =
            page.items.iter().map(|i| (orphan_shard_of(&i.id, SHARDS) + SHARDS - k) % SHARDS).collect();
        assert_eq!(order.first(), Some(&0), "the page from shard {k} starts in it: {order:?}");
        assert!(order.windows(2).all(|w| w[0] <= w[1]), "shard by shard from {k}: {order:?}");
        assert!(page.next.is_some(), "more follow the first 6 of {}", ids.len());
        // Past the shard count it wraps round.
        let again = store.orphans_page_from(cutoff, 6, k + SHARDS).await.unwrap();
        assert_eq!(
            again.items.iter().map(|i| &i.id).collect::<Vec<_>>(),
            page.items.iter().map(|i| &i.id).collect::<Vec<_>>()
        );
        let all = store.orphans_page_from(cutoff, 100, k).await.unwrap();
        assert_eq!((all.items.len(), all.next), (ids.len(), None));
    }
}

/// Runs one worker on `store` until it holds `ids` (all of them), then shuts it down.
async fn worker_takes_all(store: Arc<dyn LeaseStore>, ids: &[String]) {
    let worker = Worker::builder(store)
        .worker_id("w")
        .orphan_interval(Duration::from_millis(500))
        .metrics_writer(Lines::default())
        .build(|conn: Connection| async move {
            conn.cancelled().await;
            Ok::<(), BoxError>(())
        })
        .unwrap();
    let handle = worker.handle();
    let task = tokio::spawn(worker.run_until(std::future::pending()));
    wait_until(Duration::from_secs(30), "every orphan claimed", || handle.snapshot().held.len() == ids.len()).await;
    let held: BTreeSet<String> = handle.snapshot().held.into_iter().collect();
    assert_eq!(held, ids.iter().cloned().collect::<BTreeSet<_>>());
    handle.shutdown();
    task.await.unwrap();
}

/// The shards `ids` fall in: the test's ids must cover every one of them.
fn shards_of(ids: &[String]) -> BTreeSet<u32> {
    ids.iter().map(|id| orphan_shard_of(id, SHARDS)).collect()
}

#[tokio::test(start_paused = true)]
async fn memory_store_lists_orphans_of_every_shard_and_a_worker_claims_them() {
    let store = memory_store(sharded());
    let ids = start_items(&store, "s", 40).await;
    assert_eq!(shards_of(&ids).len(), SHARDS as usize, "the ids cover every shard");
    let cutoff = store.clock().now_ms();

    // Pages of 3 through all 8 shards: each orphan once, shard after shard.
    let (listed, cursors) = walk(&store, cutoff, 3).await;
    assert_eq!(listed.iter().cloned().collect::<BTreeSet<_>>(), ids.iter().cloned().collect::<BTreeSet<_>>());
    assert_eq!(listed.len(), ids.len(), "no orphan listed twice");
    // Shard by shard, round all of them from the one the cutoff picks.
    let first = store.config().first_orphan_shard(cutoff);
    let order: Vec<u32> = listed.iter().map(|id| (orphan_shard_of(id, SHARDS) + SHARDS - first) % SHARDS).collect();
    assert!(order.windows(2).all(|w| w[0] <= w[1]), "shard by shard: {order:?}");
    assert!(cursors.iter().any(|c| c.shard > 0), "cursors name the shard to go on in");
    pages_start_where_asked(&store, &ids, cutoff).await;
    // One big page holds them all, and says nothing more follows.
    let page = store.orphans_page(cutoff, 100, None).await.unwrap();
    assert_eq!((page.items.len(), page.next), (ids.len(), None));

    // Claimed work leaves its shard; the rest is still listed.
    store.acquire_started(&ids[0], "x").await.unwrap();
    let (listed, _) = walk(&store, cutoff, 5).await;
    assert_eq!(listed.len(), ids.len() - 1);
    assert!(!listed.contains(&ids[0]));
    store.stop(&ids[0]).await.unwrap();

    worker_takes_all(Arc::new(store.clone()), &ids[1..]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_writes_the_shard_value_and_a_worker_finds_orphans_in_every_shard() {
    let Some(sdk) = aws().await else { return };
    let table = lease_table(&sdk, sharded()).await;
    let ids = start_items(&table, "s", 40).await;
    assert_eq!(shards_of(&ids).len(), SHARDS as usize, "the ids cover every shard");

    // The stored desired state is the item's shard value; reads see STARTED.
    let client = aws_sdk_dynamodb::Client::new(&sdk);
    let config = table.config().clone();
    for id in &ids[..5] {
        let raw = client
            .get_item()
            .table_name(&config.table_name)
            .key(&config.attributes.id, AttributeValue::S(config.key(id)))
            .consistent_read(true)
            .send()
            .await
            .unwrap();
        let state = raw.item().unwrap()[&config.attributes.desired_state].as_s().unwrap().clone();
        assert_eq!(state, format!("STARTED#{}", orphan_shard_of(id, SHARDS)));
        assert_eq!(table.get(id).await.unwrap().unwrap().desired_state, Some(DesiredState::Started));
    }

    // Paging through the shards lists each orphan once.
    let cutoff = leaselock::Clock::now_ms(table.clock());
    let (listed, cursors) = walk(&table, cutoff, 3).await;
    assert_eq!(listed.iter().cloned().collect::<BTreeSet<_>>(), ids.iter().cloned().collect::<BTreeSet<_>>());
    assert_eq!(listed.len(), ids.len(), "no orphan listed twice");
    assert!(cursors.iter().any(|c| c.shard > 0));
    pages_start_where_asked(&table, &ids, cutoff).await;
    // An unsharded reader of the same table queries `STARTED` alone and finds none of them.
    let plain = leaselock::LeaseTable::new(client.clone(), TableConfig { orphan_shards: 1, ..config.clone() }).unwrap();
    assert!(plain.orphans(cutoff, None).await.unwrap().is_empty());

    worker_takes_all(Arc::new(table.clone()), &ids).await;
}
