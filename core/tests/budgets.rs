//! Operations that hold no lease have a budget of their own (`operation_budget`), and a failed
//! request names its real cause: a store slow for a moment does not fail them, one that never
//! answers is a timeout (not throttling), a missing table is named, an unreachable store says so.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::proxy::client_to;
use common::stores;
use leaselock::{Error, LeaseStore, LeaseTable, TableConfig};

#[tokio::test]
async fn answers_slower_than_a_lease_attempt_still_succeed_within_the_operation_budget() {
    let Some((table, direct, faults)) = stores(TableConfig::default()).await else { return };
    // 2.5 s: longer than a lease operation's 2 s attempt, well inside the 5 s operation attempt.
    faults.delay_ms.store(2_500, Ordering::SeqCst);
    let t0 = Instant::now();
    table.start("s1", "wss://feed.example/s1").await.expect("a slow start succeeds");
    let stopped = table.stop("s1").await.expect("a slow stop succeeds");
    let took = t0.elapsed();
    eprintln!("start + stop through a 2.5 s delay: {took:?}");
    assert!(took >= Duration::from_millis(5_000), "both answers were delayed: {took:?}");
    assert!(took < Duration::from_secs(20), "each within its 10 s budget: {took:?}");
    assert_eq!(stopped.desired_state, Some(leaselock::DesiredState::Stopped));
    assert_eq!(faults.count("UpdateItem"), 2, "one attempt each: nothing timed out");
    faults.delay_ms.store(0, Ordering::SeqCst);
    assert_eq!(direct.get("s1").await.unwrap().unwrap().desired_state, Some(leaselock::DesiredState::Stopped));
}

#[tokio::test]
async fn a_store_that_never_answers_is_a_timeout_not_throttling() {
    let config = TableConfig::default()
        .operation_budget(Duration::from_secs(3))
        .operation_attempt_timeout(Duration::from_secs(1))
        .lease_duration(Duration::from_secs(3))
        .renew_interval(Duration::from_secs(1))
        .clock_skew(Duration::from_millis(500));
    let Some((table, direct, faults)) = stores(config).await else { return };
    table.start("s1", "wss://feed.example/s1").await.unwrap();
    faults.silent.store(true, Ordering::SeqCst);

    let t0 = Instant::now();
    let err = table.stop("s1").await.unwrap_err();
    let took = t0.elapsed();
    eprintln!("stop against a silent store: {err} after {took:?}");
    assert!(matches!(err, Error::Timeout { outcome_unknown: true }), "{err:?}");
    assert!(err.to_string().contains("did not answer in time"), "{err}");
    assert!(
        took >= Duration::from_millis(2_000) && took < Duration::from_millis(3_000 + 1_500),
        "within its budget: {took:?}"
    );

    let err = table.get("s1").await.unwrap_err();
    assert!(matches!(err, Error::Timeout { outcome_unknown: false }), "a read changes nothing: {err:?}");
    let err = table.acquire("s1", "a").await.unwrap_err();
    assert!(matches!(err, Error::Timeout { outcome_unknown: true }), "a claim too: {err:?}");
    assert_eq!(err.kind(), "Timeout");

    faults.silent.store(false, Ordering::SeqCst);
    let item = direct.get("s1").await.unwrap().unwrap();
    assert_eq!((item.desired_state, item.fence), (Some(leaselock::DesiredState::Started), 0), "nothing was forwarded");
}

#[tokio::test]
async fn a_missing_table_is_named_with_what_to_run() {
    let Some(direct) = common::table(TableConfig::default(), None).await else { return };
    let missing =
        TableConfig { table_name: format!("{}-missing", direct.config().table_name), ..direct.config().clone() };
    let table = LeaseTable::new(direct.client().clone(), missing.clone()).unwrap();
    for err in [
        table.start("s1", "wss://feed.example/s1").await.unwrap_err(),
        table.stop("s1").await.unwrap_err(),
        table.acquire("s1", "a").await.unwrap_err(),
        table.items().await.unwrap_err(),
    ] {
        assert!(matches!(&err, Error::TableNotFound { table } if *table == missing.table_name), "{err:?}");
        let text = err.to_string();
        assert!(text.contains(&missing.table_name) && text.contains("leaselock table create"), "{text}");
    }
}

#[tokio::test]
async fn an_unreachable_store_says_so() {
    if common::local_engine::endpoint("an_unreachable_store_says_so").is_none() {
        return;
    }
    // A port nobody listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let config = TableConfig::new("nowhere").operation_budget(Duration::from_millis(800));
    let table = LeaseTable::new(client_to(&format!("http://127.0.0.1:{port}")).await, config).unwrap();
    let t0 = Instant::now();
    let err = table.start("s1", "wss://feed.example/s1").await.unwrap_err();
    assert!(matches!(err, Error::Unreachable(_)), "{err:?}");
    assert!(t0.elapsed() < Duration::from_secs(5), "retried within the budget only: {:?}", t0.elapsed());
    assert!(err.to_string().starts_with("the store is unreachable"), "{err}");
}

#[tokio::test]
async fn throttling_past_the_budget_is_still_throttling() {
    let config = TableConfig::default().operation_budget(Duration::from_millis(1_500));
    let Some((table, _direct, faults)) = stores(config).await else { return };
    faults.throttle.store(u32::MAX, Ordering::SeqCst);
    assert!(matches!(table.start("s1", "wss://feed.example/s1").await, Err(Error::Throttled)));
    faults.throttle.store(0, Ordering::SeqCst);
}
