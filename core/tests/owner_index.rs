//! `owned_by` reads the owner index (a Query, then one batched consistent read of the ids found),
//! never the whole table; `create_table` adds that index to a table created without it.

mod common;

use std::sync::Arc;

use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType, Projection, ProjectionType,
    ScalarAttributeType,
};
use futures::{stream, StreamExt};
use leaselock::{Clock, LeaseStore, LeaseTable, ManualClock, TableConfig};

const T0: u64 = 1_800_000_000_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owned_by_queries_the_owner_index_and_returns_exactly_the_owners_held_items() {
    let clock = Arc::new(ManualClock::new(T0));
    let Some((table, direct, faults)) = common::stores_with_clock(TableConfig::default(), Some(clock.clone())).await
    else {
        return;
    };
    let owners = ["w0", "w1", "w2", "w3", "w4"];
    let ids: Vec<String> = (0..520).map(|i| format!("item-{i:03}")).collect();
    let owner_of = |i: usize| owners[i % owners.len()];
    let claim = |ids: Vec<(usize, String)>| {
        let direct = direct.clone();
        async move {
            stream::iter(ids)
                .map(|(i, id)| {
                    let direct = direct.clone();
                    async move {
                        direct.start(&id, &format!("wss://feed.example/{id}")).await.unwrap();
                        direct.acquire(&id, owner_of(i)).await.unwrap()
                    }
                })
                .buffer_unordered(16)
                .collect::<Vec<_>>()
                .await
        }
    };
    // w2's leases are claimed first and have expired by the time the others are claimed.
    let indexed: Vec<(usize, String)> = ids.iter().cloned().enumerate().collect();
    let (early, late): (Vec<_>, Vec<_>) = indexed.into_iter().partition(|(i, _)| owner_of(*i) == "w2");
    claim(early).await;
    clock.advance(TableConfig::default().lease_ms() + 1);
    let leases = claim(late).await;
    // A few of w1's are released; one of w3's is taken over by w1 after a release.
    let mut released = Vec::new();
    for lease in leases.iter().filter(|l| l.owner == "w1").take(7) {
        direct.release(lease).await.unwrap();
        released.push(lease.id.clone());
    }
    let w3 = leases.iter().find(|l| l.owner == "w3").unwrap();
    direct.release(w3).await.unwrap();
    direct.acquire(&w3.id, "w1").await.unwrap();
    let _unclaimed = direct.start("never-claimed", "wss://feed.example/never").await.unwrap();

    let mut expected: Vec<String> = (0..ids.len())
        .filter(|&i| owner_of(i) == "w1" && !released.contains(&ids[i]))
        .map(|i| ids[i].clone())
        .chain([w3.id.clone()])
        .collect();
    expected.sort();

    let before = faults.operations.lock().unwrap().len();
    let owned = table.owned_by("w1").await.unwrap();
    let sent: Vec<String> = faults.operations.lock().unwrap()[before..].to_vec();
    let got: Vec<String> = owned.iter().map(|i| i.id.clone()).collect();
    assert_eq!(got, expected, "exactly w1's held items");
    assert!(owned.iter().all(|i| i.holder_at(clock.now_ms()) == Some("w1")));
    eprintln!("owned_by over {} items sent: {sent:?}", ids.len() + 1);
    assert!(!sent.iter().any(|op| op == "Scan"), "no scan: {sent:?}");
    assert!(sent.iter().any(|op| op == "Query"), "{sent:?}");
    // The index names every item w1 last claimed, released ones too: one batched read per 100.
    let in_index = (0..ids.len()).filter(|&i| owner_of(i) == "w1").count() + 1;
    assert_eq!(sent.iter().filter(|op| *op == "BatchGetItem").count(), in_index.div_ceil(100), "{sent:?}");

    // Expired leases are nobody's; an owner without items has none.
    assert_eq!(table.owned_by("w2").await.unwrap(), vec![]);
    assert_eq!(table.owned_by("nobody").await.unwrap(), vec![]);
    let w0 = table.owned_by("w0").await.unwrap();
    assert_eq!(w0.len(), (0..ids.len()).filter(|&i| owner_of(i) == "w0").count());
}

#[tokio::test]
async fn create_table_adds_the_owner_index_to_a_table_without_it() {
    let Some(fresh) = common::table(TableConfig::default(), None).await else { return };
    let config = TableConfig { table_name: format!("{}-old", fresh.config().table_name), ..fresh.config().clone() };
    let client = fresh.client().clone();
    let a = &config.attributes;
    let attr = |n: &str, t| AttributeDefinition::builder().attribute_name(n).attribute_type(t).build().unwrap();
    let key = |n: &str, t| KeySchemaElement::builder().attribute_name(n).key_type(t).build().unwrap();
    // The table as the previous release created it: the orphan index only.
    client
        .create_table()
        .table_name(&config.table_name)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(attr(&a.id, ScalarAttributeType::S))
        .attribute_definitions(attr(&a.desired_state, ScalarAttributeType::S))
        .attribute_definitions(attr(&a.expires_at_ms, ScalarAttributeType::N))
        .key_schema(key(&a.id, KeyType::Hash))
        .global_secondary_indexes(
            GlobalSecondaryIndex::builder()
                .index_name(&config.index_name)
                .key_schema(key(&a.desired_state, KeyType::Hash))
                .key_schema(key(&a.expires_at_ms, KeyType::Range))
                .projection(Projection::builder().projection_type(ProjectionType::All).build())
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    let table = LeaseTable::new(client.clone(), config.clone()).unwrap();
    table.start("s1", "wss://feed.example/s1").await.unwrap();
    table.acquire("s1", "w").await.unwrap();

    table.create_table().await.unwrap();
    let described = client.describe_table().table_name(&config.table_name).send().await.unwrap();
    let indexes = described.table().unwrap().global_secondary_indexes();
    let owner = indexes.iter().find(|g| g.index_name() == Some(config.owner_index_name.as_str())).expect("added");
    assert_eq!(owner.projection().and_then(|p| p.projection_type()), Some(&ProjectionType::KeysOnly));
    assert_eq!(owner.key_schema()[0].attribute_name(), "lease_owner");
    assert_eq!(indexes.len(), 2, "the orphan index is kept");
    assert_eq!(table.owned_by("w").await.unwrap().len(), 1, "existing items are in the new index");
    table.create_table().await.expect("a second run changes nothing");
}
