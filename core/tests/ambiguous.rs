//! Faults between the store and DynamoDB, injected by a loopback proxy in front of the local
//! engine: responses lost after the write was applied must be resolved by a consistent re-read
//! (not reported as failures nor retried blindly), and throttling must be retried with backoff
//! only while the lease's deadline allows.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::stores;
use leaselock::{Error, LeaseStore, TableConfig};

#[tokio::test]
async fn lost_responses_are_resolved_by_rereading() {
    let Some((table, direct, faults)) = stores(TableConfig::default()).await else { return };
    table.start("s1", "wss://feed.example/s1").await.unwrap();

    faults.lose_responses.store(1, Ordering::SeqCst);
    let mut lease = table.acquire("s1", "a").await.expect("an applied claim is ours, not Held by ourselves");
    assert_eq!(faults.lose_responses.load(Ordering::SeqCst), 0, "the claim's response was lost");
    assert_eq!(lease.fence, 1);
    assert_eq!(direct.get("s1").await.unwrap().unwrap().fence, 1, "claimed once");

    faults.lose_responses.store(1, Ordering::SeqCst);
    table.renew(&mut lease).await.expect("an applied renewal counts");
    assert_eq!(Some(lease.expires_at_ms), direct.get("s1").await.unwrap().unwrap().expires_at_ms);

    faults.lose_responses.store(1, Ordering::SeqCst);
    table.checkpoint(&mut lease, 9).await.expect("an applied checkpoint counts");
    assert_eq!(direct.get("s1").await.unwrap().unwrap().last_seq, Some(9));

    faults.lose_responses.store(1, Ordering::SeqCst);
    table.release(&lease).await.expect("an applied release counts");
    assert_eq!(direct.get("s1").await.unwrap().unwrap().expires_at_ms, Some(0));
    assert_eq!(faults.lose_responses.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn throttling_is_retried_while_the_deadline_allows() {
    let config = TableConfig::default()
        .lease_duration(Duration::from_millis(3_000))
        .renew_interval(Duration::from_millis(1_000))
        .clock_skew(Duration::from_millis(500));
    let Some((table, direct, faults)) = stores(config).await else { return };

    faults.throttle.store(3, Ordering::SeqCst);
    let mut lease = table.acquire("s1", "a").await.expect("three throttles are retried");
    assert_eq!(faults.throttle.load(Ordering::SeqCst), 0);
    assert_eq!(direct.get("s1").await.unwrap().unwrap().fence, 1);

    faults.throttle.store(2, Ordering::SeqCst);
    table.renew(&mut lease).await.expect("renewal retried through throttling");

    // Throttled without end: the renewal gives up as Lost before its deadline, having sent
    // nothing that landed.
    faults.throttle.store(u32::MAX, Ordering::SeqCst);
    let forwarded = faults.forwarded.load(Ordering::SeqCst);
    let started = std::time::Instant::now();
    let deadline = lease.deadline();
    assert!(matches!(table.renew(&mut lease).await, Err(Error::Lost { .. })));
    assert!(std::time::Instant::now() <= deadline, "gave up by the deadline");
    assert!(started.elapsed() >= Duration::from_millis(500), "it did retry: {:?}", started.elapsed());
    assert_eq!(faults.forwarded.load(Ordering::SeqCst), forwarded);

    // Without a lease deadline, a claim gives up within its budget with Throttled.
    assert!(matches!(table.acquire("s2", "a").await, Err(Error::Throttled)));
    faults.throttle.store(0, Ordering::SeqCst);
}
