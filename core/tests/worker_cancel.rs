//! How a handler's token fires, on the memory store under tokio's paused clock: STOP, a lease
//! taken by someone else, a checkpoint that finds the lease gone, an unreachable store, a
//! handler that panics or fails, and shutdown.

mod worker_support;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leaselock::lease::is_claimable;
use leaselock::worker::{BoxError, CancelReason, Connection, Worker, WorkerHandle};
use leaselock::{Error, LeaseItem, LeaseStore, TableConfig, WorkerSnapshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use worker_support::*;

/// What a handler saw when its token fired.
#[derive(Debug, Clone)]
struct Cancelled {
    id: String,
    fence: u64,
    reason: Option<CancelReason>,
    /// The store clock's monotonic time, and the connection's deadline on it.
    mono: u64,
    deadline: u64,
    /// The store clock's wall time, and the expiry the last renewal wrote.
    wall: u64,
    expires_at_ms: u64,
}

type Log = Arc<Mutex<Vec<Cancelled>>>;

fn cancellations(log: &Log, id: &str) -> Vec<Cancelled> {
    log.lock().unwrap().iter().filter(|c| c.id == id).cloned().collect()
}

async fn wait_cancelled(conn: &Connection, store: &dyn LeaseStore, log: &Log) {
    conn.cancelled().await;
    let expires_at_ms = conn.lease().await.expires_at_ms;
    log.lock().unwrap().push(Cancelled {
        id: conn.id().to_string(),
        fence: conn.fence(),
        reason: conn.cancel_reason(),
        mono: store.clock().monotonic_ms(),
        deadline: conn.deadline_mono_ms(),
        wall: store.clock().now_ms(),
        expires_at_ms,
    });
}

fn default_config() -> TableConfig {
    TableConfig::new("leases")
}

struct Running {
    handle: WorkerHandle,
    _task: JoinHandle<WorkerSnapshot>,
}

/// A worker (orphan poll 500 ms, desired-state check 2 s) whose handlers wait for their token
/// and log it.
fn spawn_waiting_worker(store: Arc<dyn LeaseStore>, log: &Log) -> Running {
    let log = log.clone();
    let s = store.clone();
    let worker = Worker::builder(store)
        .worker_id("w1")
        .orphan_interval(Duration::from_millis(500))
        .desired_state_interval(Duration::from_secs(2))
        .metrics_writer(Lines::default())
        .build(move |conn| {
            let (log, s) = (log.clone(), s.clone());
            async move {
                wait_cancelled(&conn, &*s, &log).await;
                Ok::<(), BoxError>(())
            }
        })
        .unwrap();
    let handle = worker.handle();
    Running { handle, _task: tokio::spawn(worker.run_until(std::future::pending())) }
}

#[tokio::test(start_paused = true)]
async fn stop_reaches_the_owner_within_one_desired_state_interval_and_releases() {
    // Renewals every 5 s: only the 2 s desired-state check can be this quick.
    let base = memory_store(default_config());
    start_items(&base, "s", 4).await;
    let log = Log::default();
    let w = spawn_waiting_worker(Arc::new(base.clone()), &log);
    wait_until(Duration::from_secs(3), "4 held", || w.handle.snapshot().held.len() == 4).await;

    for (i, pause_ms) in [3_300u64, 1_700, 2_950].into_iter().enumerate() {
        tokio::time::sleep(Duration::from_millis(pause_ms)).await;
        let id = format!("s{i:02}");
        base.stop(&id).await.unwrap();
        let t0 = Instant::now();
        let took =
            wait_until(Duration::from_secs(6), "handler cancelled", || !cancellations(&log, &id).is_empty()).await;
        assert!(took <= Duration::from_millis(2_000), "{id}: STOP took {took:?}");
        let c = &cancellations(&log, &id)[0];
        assert_eq!(c.reason, Some(CancelReason::Stopped));
        wait_until(Duration::from_secs(1), "released", || !w.handle.snapshot().held.contains(&id)).await;
        let item = base.get(&id).await.unwrap().unwrap();
        assert_eq!((item.expires_at_ms, item.fence), (Some(0), 1), "{id} released, not reclaimed");
        assert!(t0.elapsed() <= Duration::from_millis(2_000));
    }
    // Stopped work stays unclaimed.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(w.handle.snapshot().held, vec!["s03"]);
    let s = w.handle.snapshot();
    assert_eq!((s.released, s.leases_lost, s.acquired), (3, 0, 4));
}

#[tokio::test(start_paused = true)]
async fn a_renewal_that_reads_stopped_cancels_and_releases() {
    // Renewals every second; the batched check only once a minute.
    let base = memory_store(short_config());
    start_items(&base, "s", 1).await;
    let log = Log::default();
    let s = base.clone();
    let l = log.clone();
    let (handle, _task) = Worker::builder(Arc::new(base.clone()))
        .desired_state_interval(Duration::from_secs(60))
        .metrics_writer(Lines::default())
        .build(move |conn| {
            let (log, s) = (l.clone(), s.clone());
            async move {
                wait_cancelled(&conn, &s, &log).await;
                Ok::<(), BoxError>(())
            }
        })
        .unwrap()
        .spawn();
    wait_until(Duration::from_secs(3), "held", || handle.snapshot().held.len() == 1).await;
    tokio::time::sleep(Duration::from_millis(2_400)).await;
    base.stop("s00").await.unwrap();
    let took = wait_until(Duration::from_secs(5), "cancelled", || !cancellations(&log, "s00").is_empty()).await;
    assert!(took <= Duration::from_secs(1), "the next renewal sees it: {took:?}");
    assert_eq!(cancellations(&log, "s00")[0].reason, Some(CancelReason::Stopped));
    wait_until(Duration::from_secs(1), "released", || handle.snapshot().released == 1).await;
    assert_eq!(base.get("s00").await.unwrap().unwrap().expires_at_ms, Some(0));
}

#[tokio::test(start_paused = true)]
async fn a_lease_taken_by_another_owner_cancels_the_handler_before_its_deadline() {
    let base = memory_store(default_config());
    start_items(&base, "s", 1).await;
    let log = Log::default();
    let w = spawn_waiting_worker(Arc::new(base.clone()), &log);
    wait_until(Duration::from_secs(3), "held", || w.handle.snapshot().held.len() == 1).await;

    // Someone whose clock is 25 s ahead sees the lease as expired and takes it.
    tokio::time::sleep(Duration::from_secs(7)).await;
    let thief = skewed(&base, 25_000).acquire("s00", "thief").await.unwrap();
    assert_eq!(thief.fence, 2);
    let took =
        wait_until(Duration::from_secs(30), "handler cancelled", || !cancellations(&log, "s00").is_empty()).await;
    let c = &cancellations(&log, "s00")[0];
    assert_eq!(c.reason, Some(CancelReason::Lost));
    // Caught by the next renewal (every 5 s), long before the local deadline (19 s after the last).
    assert!(took <= Duration::from_secs(5), "took {took:?}");
    assert!(c.mono + 10_000 < c.deadline, "cancelled at {} with the deadline at {}", c.mono, c.deadline);

    wait_until(Duration::from_secs(1), "forgotten", || w.handle.snapshot().held.is_empty()).await;
    let item = base.get("s00").await.unwrap().unwrap();
    assert_eq!(item.owner.as_deref(), Some("thief"));
    assert_ne!(item.expires_at_ms, Some(0), "a lost lease is not released");
    let s = w.handle.snapshot();
    assert_eq!((s.leases_lost, s.released), (1, 0));
}

#[tokio::test(start_paused = true)]
async fn a_checkpoint_that_finds_the_lease_gone_cancels_at_once() {
    let base = memory_store(default_config());
    start_items(&base, "s", 1).await;
    let log = Log::default();
    let outcomes: Arc<Mutex<Vec<(u64, bool)>>> = Arc::default();
    let (l, o, s) = (log.clone(), outcomes.clone(), base.clone());
    let worker = Worker::builder(Arc::new(base.clone()))
        .metrics_writer(Lines::default())
        .build(move |conn| {
            let (log, outcomes, s) = (l.clone(), o.clone(), s.clone());
            async move {
                let mut seq = conn.last_seq().unwrap_or(0);
                while !conn.is_cancelled() {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    seq += 1;
                    let ok = conn.checkpoint(seq).await.is_ok();
                    outcomes.lock().unwrap().push((seq, ok));
                }
                wait_cancelled(&conn, &s, &log).await;
                Ok::<(), BoxError>(())
            }
        })
        .unwrap();
    let handle = worker.handle();
    let _task = tokio::spawn(worker.run_until(std::future::pending()));
    wait_until(Duration::from_secs(3), "checkpointing", || outcomes.lock().unwrap().len() >= 20).await;

    skewed(&base, 25_000).acquire("s00", "thief").await.unwrap();
    let stolen_at_seq = base.get("s00").await.unwrap().unwrap().last_seq.unwrap();
    let took = wait_until(Duration::from_secs(10), "cancelled", || !cancellations(&log, "s00").is_empty()).await;
    assert!(took <= Duration::from_millis(150), "the next checkpoint (100 ms) must see it: {took:?}");
    assert_eq!(cancellations(&log, "s00")[0].reason, Some(CancelReason::Lost));
    let outcomes = outcomes.lock().unwrap().clone();
    assert_eq!(outcomes.last().map(|(_, ok)| *ok), Some(false));
    assert!(outcomes.iter().filter(|(_, ok)| !ok).count() == 1, "one refused checkpoint, then stop: {outcomes:?}");
    assert_eq!(base.get("s00").await.unwrap().unwrap().last_seq, Some(stolen_at_seq), "nothing written after");
    wait_until(Duration::from_secs(1), "lost counted", || handle.snapshot().leases_lost == 1).await;
}

#[tokio::test(start_paused = true)]
async fn an_unreachable_store_cancels_the_handler_at_its_deadline() {
    let store = Arc::new(Faulty::new(memory_store(default_config())));
    start_items(&store.inner, "s", 1).await;
    let log = Log::default();
    let w = spawn_waiting_worker(store.clone(), &log);
    wait_until(Duration::from_secs(3), "held", || w.handle.snapshot().held.len() == 1).await;
    // One renewal done: the first after a claim comes at a point of the 5 s interval spread by
    // the connection (Keeper::spread_first_renewal), the next 5 s after it.
    tokio::time::sleep(Duration::from_secs(6)).await;
    store.renew_hangs.store(true, Ordering::SeqCst);

    wait_until(Duration::from_secs(30), "cancelled", || !cancellations(&log, "s00").is_empty()).await;
    let c = &cancellations(&log, "s00")[0];
    assert_eq!(c.reason, Some(CancelReason::Deadline));
    // At the deadline (the last renewal, sent before the store hung at 6 s, + 20 s lease - 1 s
    // skew), not a moment later.
    assert!(c.mono >= c.deadline && c.mono <= c.deadline + 10, "cancelled at {} for {}", c.mono, c.deadline);
    assert!((19_000..25_000).contains(&c.deadline), "deadline {} from a renewal in the first 6 s", c.deadline);
    // Rule 2 seen from outside: at that moment no claimer whose clock is up to the skew ahead
    // may take the lease yet.
    let config = default_config();
    let last_written = LeaseItem { expires_at_ms: Some(c.expires_at_ms), ..Default::default() };
    assert!(!is_claimable(&last_written, c.wall + config.skew_ms() - 1, &config));
    wait_until(Duration::from_secs(1), "lost counted", || w.handle.snapshot().leases_lost == 1).await;
}

#[tokio::test(start_paused = true)]
async fn a_handler_that_panics_or_fails_releases_its_lease_and_the_worker_goes_on() {
    let base = memory_store(default_config());
    for id in ["boom", "fails", "calm"] {
        base.start(id, "wss://feed.example/x").await.unwrap();
    }
    let worker = Worker::builder(Arc::new(base.clone()))
        .orphan_interval(Duration::from_millis(500))
        .metrics_writer(Lines::default())
        .build(|conn: Connection| async move {
            match (conn.id(), conn.fence()) {
                ("boom", 1) => panic!("handler bug"),
                ("fails", 1) => return Err::<(), BoxError>("upstream refused".into()),
                _ => conn.cancelled().await,
            }
            Ok(())
        })
        .unwrap();
    let handle = worker.handle();
    let _task = tokio::spawn(worker.run_until(std::future::pending()));

    // Released at once, so claimed again (fence 2) at the next orphan poll, far sooner than the
    // 20 s expiry a lease left behind would need.
    let took = wait_until(Duration::from_secs(30), "boom and fails claimed again", || {
        let s = handle.snapshot();
        s.held.len() == 3 && s.acquired == 5
    })
    .await;
    assert!(took < Duration::from_secs(2), "took {took:?}");
    for id in ["boom", "fails"] {
        assert_eq!(base.get(id).await.unwrap().unwrap().fence, 2, "{id}");
    }
    assert_eq!(base.get("calm").await.unwrap().unwrap().fence, 1, "the others were not disturbed");
    let s = handle.snapshot();
    assert_eq!((s.handler_panics, s.handler_errors, s.released, s.leases_lost), (1, 1, 2, 0));

    base.start("late", "wss://feed.example/late").await.unwrap();
    wait_until(Duration::from_secs(2), "still claiming", || handle.snapshot().held.contains(&"late".to_string())).await;
}

#[tokio::test(start_paused = true)]
async fn shutdown_cancels_every_handler_and_releases_every_lease_in_parallel() {
    let store = Arc::new(Faulty::new(memory_store(default_config())));
    let ids = start_items(&store.inner, "s", 20).await;
    store.inner.start("stubborn", "wss://feed.example/stubborn").await.unwrap();
    let log = Log::default();
    let (l, s) = (log.clone(), store.clone());
    let worker = Worker::builder(store.clone())
        .handler_grace(Duration::from_secs(2))
        .metrics_writer(Lines::default())
        .build(move |conn: Connection| {
            let (log, s) = (l.clone(), s.clone());
            async move {
                if conn.id() == "stubborn" {
                    // Ignores its token: aborted after the grace period.
                    loop {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
                wait_cancelled(&conn, &*s, &log).await;
                tokio::time::sleep(Duration::from_millis(100)).await; // winding down
                Ok::<(), BoxError>(())
            }
        })
        .unwrap();
    let handle = worker.handle();
    let task = tokio::spawn(worker.run_until(std::future::pending()));
    wait_until(Duration::from_secs(5), "21 held", || handle.snapshot().held.len() == 21).await;

    // Every release takes 1 s: one after the other would take 21 s.
    store.release_delay_ms.store(1_000, Ordering::SeqCst);
    let t0 = Instant::now();
    handle.shutdown();
    let last = task.await.unwrap();
    let took = t0.elapsed();
    handle.finished().await;

    // 100 ms wind-down + 1 s release in parallel; the stubborn one: 2 s grace + 1 s release.
    assert!(took >= Duration::from_secs(3) && took < Duration::from_millis(3_200), "shutdown took {took:?}");
    assert!(store.max_releases_in_flight.load(Ordering::SeqCst) >= 20, "releases ran in parallel");
    assert_eq!((last.released, last.held.len(), last.handler_panics), (21, 0, 0));
    assert!(last.stopping);
    for id in &ids {
        let c = cancellations(&log, id);
        assert_eq!(c.len(), 1, "{id}");
        assert_eq!(c[0].reason, Some(CancelReason::Shutdown), "{id}");
        assert_eq!(c[0].fence, 1);
    }
    for item in store.inner.items().await.unwrap() {
        assert_eq!(item.expires_at_ms, Some(0), "{} released", item.id);
    }
}

#[tokio::test(start_paused = true)]
async fn checkpoints_move_forward_and_are_refused_after_the_handler_returned() {
    let base = memory_store(default_config());
    start_items(&base, "s", 1).await;
    let kept: Arc<Mutex<Option<Connection>>> = Arc::default();
    let k = kept.clone();
    let worker = Worker::builder(Arc::new(base.clone()))
        .metrics_writer(Lines::default())
        .build(move |conn: Connection| {
            let kept = k.clone();
            async move {
                conn.checkpoint(5).await?;
                let refused = conn.checkpoint(5).await;
                assert!(matches!(refused, Err(Error::SeqNotIncreasing { last_seq: 5, .. })), "{refused:?}");
                assert_eq!(conn.lease().await.last_seq, Some(5));
                *kept.lock().unwrap() = Some(conn.clone());
                Ok::<(), Error>(())
            }
        })
        .unwrap();
    let handle = worker.handle();
    let _task = tokio::spawn(worker.run_until(std::future::pending()));
    wait_until(Duration::from_secs(3), "released", || handle.snapshot().released == 1).await;
    let conn = kept.lock().unwrap().clone().unwrap();
    assert_eq!(conn.cancel_reason(), Some(CancelReason::Released));
    assert!(matches!(conn.checkpoint(6).await, Err(Error::Lost { .. })), "a leftover clone may not act");
    assert_eq!(base.get("s00").await.unwrap().unwrap().last_seq, Some(5));
}

/// A claim applied whose answer is lost (the worker is told "outcome unknown") names the worker
/// with nobody renewing it. The worker reads it again at its next orphan poll and releases it, so
/// it is claimed again (fence 2) within a poll or two instead of after the 20 s lease.
#[tokio::test(start_paused = true)]
async fn a_claim_that_landed_unanswered_is_released_not_stranded() {
    let store = Arc::new(Faulty::new(memory_store(default_config())));
    start_items(&store.inner, "s", 1).await;
    store.claim_answers_lost.store(1, Ordering::SeqCst);
    let log = Log::default();
    let w = spawn_waiting_worker(store.clone(), &log);
    let took = wait_until(Duration::from_secs(40), "held", || w.handle.snapshot().held.len() == 1).await;
    assert_eq!(store.claim_answers_lost.load(Ordering::SeqCst), 0, "the first claim's answer was lost");
    assert!(took < Duration::from_secs(5), "held after {took:?}: the landed claim waited out its lease");
    let item = store.inner.get("s00").await.unwrap().unwrap();
    assert_eq!((item.owner.as_deref(), item.fence), (Some("w1"), 2), "released, then claimed again");
}
