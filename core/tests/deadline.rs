//! `deadline` means one thing in Rust, Python and Node: the instant, on this process's monotonic
//! clock (not the store's wall clock), at which the holder must stop acting for the lease: the
//! send time of its last successful write + lease - skew (rule 2). `time_left` is that instant
//! less now, zero once it has passed. Python's `test_lease.py` and Node's `table.test.js` hold
//! their languages to the same meaning.

use std::sync::Arc;
use std::time::{Duration, Instant};

use leaselock::election::{ElectionOptions, LeaderElector, MemoryRegistry, StoreElection};
use leaselock::{Clock, Hold, LeaseStore, ManualClock, MemoryStore, SystemClock, TableConfig};

#[tokio::test]
async fn a_deadline_is_the_monotonic_instant_lease_less_skew_after_the_claim_was_sent() {
    let config = TableConfig::default();
    let (lease_ms, skew_ms) = (config.lease_ms(), config.skew_ms());
    let window = Duration::from_millis(lease_ms - skew_ms);
    let store = MemoryStore::new(config, Arc::new(SystemClock)).unwrap();

    let (before, wall_before) = (Instant::now(), SystemClock.now_ms());
    let lease = store.acquire("s1", "a").await.unwrap();
    let (after, wall_after) = (Instant::now(), SystemClock.now_ms());
    // Whole monotonic milliseconds: up to 1 ms before the exact instant, never after it.
    let deadline = lease.deadline();
    assert!(deadline + Duration::from_millis(1) >= before + window, "{:?} early", (before + window) - deadline);
    assert!(deadline <= after + window, "{:?} late", deadline - (after + window));
    // The stored expiry is on the (store's) wall clock, lease after the same send: the deadline
    // comes `skew` before it.
    assert!((wall_before + lease_ms..=wall_after + lease_ms).contains(&lease.expires_at_ms), "{lease:?}");

    let t0 = Instant::now();
    let left = lease.time_left();
    let t1 = Instant::now();
    assert!(left <= deadline - t0 && left >= deadline - t1, "{left:?}");
    assert!(left > window - Duration::from_secs(1), "{left:?} of {window:?}");

    // A session's deadline means the same.
    let before = Instant::now();
    let session = store.create_session("w", None).await.unwrap();
    let after = Instant::now();
    assert!(session.deadline() + Duration::from_millis(1) >= before + window && session.deadline() <= after + window);
    assert!(session.time_left() <= session.deadline() - after);
}

#[tokio::test]
async fn time_left_counts_down_on_the_store_clock_to_zero() {
    let config = TableConfig::default();
    let window = config.lease_ms() - config.skew_ms();
    let clock = Arc::new(ManualClock::new(1_000_000));
    clock.advance(7);
    let store: Arc<dyn LeaseStore> = Arc::new(MemoryStore::new(config, clock.clone()).unwrap());
    // Watched, not renewed: nothing moves the deadline but the clock.
    let hold = Hold::acquire(store, "s1", "a", false).await.unwrap();
    assert_eq!(hold.deadline_mono_ms(), 7 + window);
    assert_eq!(hold.current().deadline_mono_ms, 7 + window);
    assert_eq!(hold.time_left(), Duration::from_millis(window));
    clock.advance(5_000);
    assert_eq!(hold.time_left(), Duration::from_millis(window - 5_000));
    clock.advance(window - 5_001);
    assert_eq!(hold.time_left(), Duration::from_millis(1));
    clock.advance(1);
    assert_eq!(hold.time_left(), Duration::ZERO);
    clock.advance(60_000);
    assert_eq!(hold.time_left(), Duration::ZERO, "never negative, never wrapped");
}

#[tokio::test]
async fn an_election_terms_deadline_and_time_left_mean_the_same() {
    let config = TableConfig::default();
    let window = config.lease_ms() - config.skew_ms();
    let store = MemoryStore::new(config, Arc::new(SystemClock)).unwrap();
    let backend = Arc::new(StoreElection::new(store, MemoryRegistry::new(Arc::new(SystemClock))));
    let elector = LeaderElector::new(backend, "a", ElectionOptions::default()).unwrap();
    let before = SystemClock.monotonic_ms();
    let seen = elector
        .run_if_leader("job", |term| async move {
            let t0 = SystemClock.monotonic_ms();
            let left = term.time_left();
            let t1 = SystemClock.monotonic_ms();
            (term.deadline_mono_ms(), t0, left, t1)
        })
        .await
        .unwrap();
    let leaselock::Outcome::Led { value: (deadline, t0, left, t1), .. } = seen else { panic!("not led: {seen:?}") };
    assert!(
        (before + window..=t0 + window).contains(&deadline),
        "{} after the call, {window} the window",
        deadline - before
    );
    assert!(Duration::from_millis(deadline - t1) <= left && left <= Duration::from_millis(deadline - t0), "{left:?}");
}
