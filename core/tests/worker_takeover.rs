//! A crashed worker (its tasks dropped, nothing released) has its work taken over within
//! lease + skew + about a second, because the orphan poll also looks a little ahead and wakes
//! right after the earliest expiry instead of at its next regular tick. Lease 3 s, renew 1 s,
//! skew 0.5 s, orphan poll 2 s.

mod worker_support;

use std::sync::Arc;
use std::time::Duration;

use leaselock::worker::{BoxError, Worker, WorkerHandle};
use leaselock::{LeaseStore, WorkerSnapshot};
use tokio::task::JoinHandle;
use worker_support::*;

struct Running {
    handle: WorkerHandle,
    task: JoinHandle<WorkerSnapshot>,
}

fn spawn_worker(store: Arc<dyn LeaseStore>, name: &'static str, tracker: &Arc<Tracker>) -> Running {
    let tracker = tracker.clone();
    let worker = Worker::builder(store)
        .worker_id(name)
        .metrics_writer(Lines::default())
        .build(move |conn| {
            let tracker = tracker.clone();
            async move {
                let _inside = tracker.enter(conn.id(), name);
                conn.cancelled().await;
                Ok::<(), BoxError>(())
            }
        })
        .unwrap();
    let handle = worker.handle();
    Running { handle, task: tokio::spawn(worker.run_until(std::future::pending())) }
}

/// lease + skew + 1 s.
const BOUND: Duration = Duration::from_millis(4_500);

/// Starts `a` with 10 items, then `b`, crashes `a` after `settle`, and returns how long `b` took
/// to hold all 10.
async fn crash_and_take_over(store_a: Arc<dyn LeaseStore>, store_b: Arc<dyn LeaseStore>, settle: Duration) -> Duration {
    start_items(&*store_a, "s", 10).await;
    let tracker = Arc::new(Tracker::default());
    let a = spawn_worker(store_a, "a", &tracker);
    wait_until(Duration::from_secs(20), "a holds 10", || a.handle.snapshot().held.len() == 10).await;
    let b = spawn_worker(store_b, "b", &tracker);
    tokio::time::sleep(settle).await;
    assert!(b.handle.snapshot().held.is_empty(), "b took nothing from a live worker");

    a.task.abort();
    let took = wait_until(Duration::from_secs(20), "b holds 10", || b.handle.snapshot().held.len() == 10).await;
    assert_eq!(tracker.violations(), Vec::<String>::new());
    b.handle.shutdown();
    b.task.await.unwrap();
    took
}

#[tokio::test(start_paused = true)]
async fn a_crashed_workers_work_is_taken_over_right_after_expiry() {
    let mut times = Vec::new();
    // Crash at many points of the renewal and poll cycles.
    for settle_ms in [1_000u64, 1_130, 1_270, 1_410, 1_555, 1_690, 1_820, 1_960, 2_333, 2_777, 3_100, 3_999] {
        let base = memory_store(short_config());
        let took =
            crash_and_take_over(Arc::new(base.clone()), Arc::new(skewed(&base, 0)), Duration::from_millis(settle_ms))
                .await;
        times.push(took);
    }
    let (min, max) = (times.iter().min().unwrap(), times.iter().max().unwrap());
    eprintln!("crash takeover (memory store, paused clock): min {min:?}, max {max:?}");
    // The last renewal was at most 1 s before the crash: expiry + skew is 2.5 to 3.5 s after it.
    assert!(*min >= Duration::from_millis(2_500), "{times:?}");
    assert!(*max <= BOUND, "{times:?}");
    // The look-ahead wakes the poll right after the expiry: a plain 2 s poll would need up to
    // 3.5 s + 2.4 s.
    assert!(*max <= Duration::from_millis(3_600), "{times:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_workers_work_is_taken_over_on_dynamodb() {
    let Some(sdk) = aws().await else { return };
    let table = lease_table(&sdk, short_config()).await;
    let took = crash_and_take_over(Arc::new(table.clone()), Arc::new(table), Duration::from_millis(1_300)).await;
    eprintln!("crash takeover (local engine, real time): {took:?}");
    assert!(took <= BOUND, "took {took:?}");
    assert!(took >= Duration::from_millis(2_500), "took {took:?}");
}
