//! Global tables: the table check at start through the SDK (against recorded DescribeTable
//! answers of a global table, which the local engine cannot make, and against the local engine
//! for a single-Region table), and `ReplicatedWriteConflictException` reaching the protocol as
//! contention.

mod common;

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
use common::recorded::{global_table, recorded, Answer};
use leaselock::election::{ElectionOptions, LeaderElector, MemoryRegistry, StoreElection};
use leaselock::protocol::TableReplication;
use leaselock::worker::Worker;
use leaselock::{Error, Hold, LeaseStore, LeaseTable, SystemClock, TableConfig};

fn table_at(endpoint: &str, config: TableConfig) -> LeaseTable {
    let client = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .endpoint_url(endpoint)
            .credentials_provider(Credentials::new("AKIDEXAMPLE", "secret", None, None, "test"))
            .build(),
    );
    LeaseTable::new(client, config).unwrap()
}

const REFUSED: &str = "invalid table: leases is a global table in multi-Region eventual consistency (replicas: \
    us-east-1, eu-west-1), where concurrent writes in two Regions resolve last-writer-wins, so a lease on it is not \
    exclusive across Regions; use a single-Region table or a multi-Region strong consistency (MRSC) global table, \
    or, if every writer of this table writes in one Region, opt in with allow_eventual_global_table \
    (LEASELOCK_ALLOW_EVENTUAL_GLOBAL_TABLE=1)";

fn unexpected(operation: &str) -> Answer {
    panic!("nothing but DescribeTable may be sent, got {operation}")
}

#[tokio::test]
async fn an_eventually_consistent_global_table_is_refused_before_any_claim() {
    for consistency in [Some("EVENTUAL"), None] {
        let (endpoint, asked) =
            recorded(
                move |op, _| if op == "DescribeTable" { global_table("leases", consistency) } else { unexpected(op) },
            )
            .await;
        let table = table_at(&endpoint, TableConfig::new("leases"));
        assert_eq!(table.replication().await.unwrap_err().to_string(), REFUSED, "{consistency:?}");

        // A held lease: refused, nothing written.
        let store: Arc<dyn LeaseStore> = Arc::new(table.clone());
        let err = Hold::acquire(store.clone(), "leader", "a", true).await.unwrap_err();
        assert_eq!(err.to_string(), REFUSED);

        // The elector: refused before its first claim.
        let backend = StoreElection::new(table.clone(), MemoryRegistry::new(Arc::new(SystemClock)));
        let elector = LeaderElector::new(Arc::new(backend), "a", ElectionOptions::default()).unwrap();
        let err = elector.run_if_leader("nightly", |_| async {}).await.unwrap_err();
        assert!(matches!(&err, Error::InvalidInput { field, .. } if field == "table"), "{err:?}");

        // The worker: the error before the run, and a run that claims nothing and returns.
        let worker =
            Worker::builder(store).metrics_writer(std::io::sink()).build(|_| async { Ok::<(), Error>(()) }).unwrap();
        assert_eq!(worker.check_table().await.unwrap_err().to_string(), REFUSED);
        let snapshot = tokio::time::timeout(Duration::from_secs(5), worker.run_until(std::future::pending()))
            .await
            .expect("a refused worker returns at once");
        assert_eq!((snapshot.acquired, snapshot.orphan_polls, snapshot.held.len()), (0, 0, 0));

        let asked = asked.lock().unwrap().clone();
        assert!(asked.iter().all(|op| op == "DescribeTable"), "{asked:?}");
    }
}

#[tokio::test]
async fn a_strongly_consistent_global_table_is_described_once_per_table() {
    let (endpoint, asked) =
        recorded(|op, _| if op == "DescribeTable" { global_table("leases", Some("STRONG")) } else { unexpected(op) })
            .await;
    let table = table_at(&endpoint, TableConfig::new("leases"));
    let strong = TableReplication::Strong { regions: vec!["us-east-1".into(), "eu-west-1".into()] };
    assert_eq!(table.replication().await.unwrap(), strong);
    table.check_table().await.unwrap();
    table.clone().check_table().await.unwrap();
    assert_eq!(asked.lock().unwrap().len(), 1, "one DescribeTable for the table and its clones");
}

#[tokio::test]
async fn the_opt_in_sends_nothing() {
    let (endpoint, asked) = recorded(|op, _| unexpected(op)).await;
    let table = table_at(&endpoint, TableConfig::new("leases").allow_eventual_global_table(true));
    assert_eq!(table.replication().await.unwrap(), TableReplication::NotChecked);
    assert!(asked.lock().unwrap().is_empty());
}

/// `ReplicatedWriteConflictException` as DynamoDB sends it (HTTP 400, JSON 1.0 error body).
const CONFLICT: &str = r#"{"__type":"com.amazonaws.dynamodb.v20120810#ReplicatedWriteConflictException","message":"The request was rejected because one or more items in the request are being modified by a request in another Region."}"#;

#[tokio::test]
async fn a_replicated_write_conflict_reaches_the_protocol_as_contention() {
    // The first two claims meet a write in another Region; the third lands.
    let (endpoint, asked) = recorded(|op, nth| match (op, nth) {
        ("UpdateItem", 0 | 1) => (400, CONFLICT.to_string()),
        ("UpdateItem", _) => (
            200,
            r#"{"Attributes":{"connection_id":{"S":"leader"},"lease_owner":{"S":"a"},"fence":{"N":"1"},
            "lease_expires_at_ms":{"N":"99999999999999"}}}"#
                .to_string(),
        ),
        (op, _) => unexpected(op),
    })
    .await;
    let table = table_at(&endpoint, TableConfig::new("leases"));
    let lease = table.acquire("leader", "a").await.expect("claimed after the conflicts");
    assert_eq!((lease.owner.as_str(), lease.fence), ("a", 1));
    assert_eq!(*asked.lock().unwrap(), ["UpdateItem", "UpdateItem", "UpdateItem"]);

    // Conflicts for the whole claim budget: throttled (nothing was claimed), not lost or held.
    let (endpoint, _) =
        recorded(|op, _| if op == "UpdateItem" { (400, CONFLICT.to_string()) } else { unexpected(op) }).await;
    let config = TableConfig::new("leases").renew_interval(Duration::from_millis(300));
    let err = table_at(&endpoint, config).acquire("leader", "a").await.unwrap_err();
    assert!(matches!(err, Error::Throttled), "{err:?}");
}

#[tokio::test]
async fn a_single_region_table_of_the_local_engine_passes_and_a_missing_one_is_named() {
    // On this process's clock: the worker claims at once, and every DescribeTable counted is
    // the table check's (measuring the store's clock would send some of its own).
    let clock: Arc<dyn leaselock::Clock> = Arc::new(SystemClock);
    let Some(table) = common::table(TableConfig::new("global-check"), Some(clock)).await else { return };
    let before = table.requests_sent().snapshot().get("DescribeTable").copied().unwrap_or(0);
    assert_eq!(table.replication().await.unwrap(), TableReplication::SingleRegion);
    let worker = Worker::builder(Arc::new(table.clone()))
        .metrics_writer(std::io::sink())
        .build(|_| async { Ok::<(), Error>(()) })
        .unwrap();
    worker.check_table().await.unwrap();
    let (handle, task) = worker.spawn();
    tokio::time::sleep(Duration::from_millis(300)).await;
    handle.shutdown();
    let snapshot = task.await.unwrap();
    assert!(snapshot.orphan_polls >= 1, "the worker ran: {snapshot:?}");
    let after = table.requests_sent().snapshot().get("DescribeTable").copied().unwrap_or(0);
    assert_eq!(after - before, 1, "described once for the check, the worker's start and its run");

    let missing =
        LeaseTable::new(table.client().clone(), TableConfig::new(format!("{}-gone", table.config().table_name)))
            .unwrap();
    let err = missing.check_table().await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("table {} does not exist (run `leaselock table create`)", missing.config().table_name)
    );
}
