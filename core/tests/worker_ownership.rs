//! Ownership across workers, on the memory store under tokio's paused clock: two workers never
//! run the same work at once, and a full worker leaves the rest to the other.

mod worker_support;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use leaselock::worker::{BoxError, Worker, WorkerHandle};
use leaselock::LeaseStore;
use tokio::task::JoinHandle;
use worker_support::*;

struct Running {
    handle: WorkerHandle,
    task: JoinHandle<leaselock::WorkerSnapshot>,
}

/// A worker whose handlers record themselves in `tracker` and run until cancelled, or for a
/// random while when `churn` (then return, which gives the lease back): up to 8 s, so that
/// many handlers outlive a lease's deadline in a 4 s partition (with runs of up to 4 s, most
/// returned first, and a run could end with too few leases lost to show anything).
fn spawn_worker(
    store: Arc<dyn LeaseStore>,
    name: &'static str,
    max: usize,
    tracker: &Arc<Tracker>,
    churn: bool,
) -> Running {
    let tracker = tracker.clone();
    let worker = Worker::builder(store)
        .worker_id(name)
        .max_connections(max)
        .orphan_interval(Duration::from_millis(500))
        .desired_state_interval(Duration::from_secs(1))
        .metrics_writer(Lines::default())
        .build(move |conn| {
            let tracker = tracker.clone();
            async move {
                let _inside = tracker.enter(conn.id(), name);
                let work = if churn { Duration::from_millis(rand::random::<u64>() % 8_000) } else { Duration::MAX };
                tokio::select! {
                    _ = conn.cancelled() => {}
                    _ = tokio::time::sleep(work) => {}
                }
                Ok::<(), BoxError>(())
            }
        })
        .unwrap();
    let handle = worker.handle();
    Running { handle, task: tokio::spawn(worker.run_until(std::future::pending())) }
}

#[tokio::test(start_paused = true)]
async fn two_workers_never_run_the_same_id_at_once() {
    let base = memory_store(short_config());
    let ids = start_items(&base, "s", 20).await;
    let tracker = Arc::new(Tracker::default());
    // Clocks 400 ms apart (under the 500 ms skew); each worker alone could not take all 20.
    let stores = [Arc::new(Faulty::new(skewed(&base, 0))), Arc::new(Faulty::new(skewed(&base, 400)))];
    let a = spawn_worker(stores[0].clone(), "a", 15, &tracker, true);
    let b = spawn_worker(stores[1].clone(), "b", 15, &tracker, true);

    // 40 s of churn: handlers give work back at random, work is stopped and restarted, and every
    // 8 s one worker is cut off from the store for 4 s (longer than a lease), so its leases run
    // into their deadlines while the other worker waits for them to expire and takes over.
    // Every 10 ms: no id is held by both workers.
    let (ha, hb) = (a.handle.clone(), b.handle.clone());
    let checker = tokio::spawn(async move {
        let mut both = Vec::new();
        let mut checks = 0u32;
        while checks < 4_000 {
            let (held_a, held_b) = (ha.held_ids(), hb.held_ids());
            both.extend(held_a.into_iter().filter(|id| held_b.contains(id)));
            checks += 1;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        both
    });
    let start = tokio::time::Instant::now();
    let mut stopped: Vec<String> = Vec::new();
    let mut tick = 0u32;
    let mut deadlines = 0;
    while start.elapsed() < Duration::from_secs(40) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        tick += 1;
        match tick % 16 {
            2 => stores[(tick / 16 % 2) as usize].partitioned.store(true, Ordering::SeqCst),
            10 => stores[(tick / 16 % 2) as usize].partitioned.store(false, Ordering::SeqCst),
            _ => {}
        }
        if tick % 2 == 0 {
            let pick = ids[rand::random::<usize>() % ids.len()].clone();
            if stopped.contains(&pick) {
                base.start(&pick, "wss://feed.example/again").await.unwrap();
                stopped.retain(|s| s != &pick);
            } else {
                base.stop(&pick).await.unwrap();
                stopped.push(pick);
            }
        }
        deadlines = a.handle.snapshot().leases_lost + b.handle.snapshot().leases_lost;
        assert!(a.handle.snapshot().held.len() <= 15 && b.handle.snapshot().held.len() <= 15);
    }

    assert_eq!(tracker.violations(), Vec::<String>::new());
    assert_eq!(checker.await.unwrap(), Vec::<String>::new(), "held by both workers at once");
    assert!(tracker.entries() > 60, "too little churn to mean anything: {} handler runs", tracker.entries());
    assert!(deadlines >= 5, "partitions must have cost leases: {deadlines}");
    let (sa, sb) = (a.handle.snapshot(), b.handle.snapshot());
    assert!(sa.acquired > 10 && sb.acquired > 10, "both workers must have worked: {sa:?} {sb:?}");
    assert!(tracker.max_concurrent("a") <= 15 && tracker.max_concurrent("b") <= 15);

    a.handle.shutdown();
    b.handle.shutdown();
    let (ra, rb) = (a.task.await.unwrap(), b.task.await.unwrap());
    assert!(ra.held.is_empty() && rb.held.is_empty());
    let now = base.clock().now_ms();
    for item in base.items().await.unwrap() {
        assert_eq!(item.holder_at(now + 1_000), None, "{} must be released at shutdown", item.id);
    }
}

#[tokio::test(start_paused = true)]
async fn a_full_worker_claims_nothing_more_and_the_rest_go_to_the_other() {
    let base = memory_store(short_config());
    start_items(&base, "s", 20).await;
    let tracker = Arc::new(Tracker::default());
    let a = spawn_worker(Arc::new(skewed(&base, 0)), "a", 5, &tracker, false);
    wait_until(Duration::from_secs(5), "a holds 5", || a.handle.snapshot().held.len() == 5).await;
    // Several orphan polls with 15 orphans in sight: a stays at 5.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(a.handle.snapshot().held.len(), 5);

    let b = spawn_worker(Arc::new(skewed(&base, 0)), "b", 100, &tracker, false);
    wait_until(Duration::from_secs(5), "b holds the other 15", || b.handle.snapshot().held.len() == 15).await;
    tokio::time::sleep(Duration::from_secs(10)).await;

    let (sa, sb) = (a.handle.snapshot(), b.handle.snapshot());
    assert_eq!((sa.held.len(), sa.acquired), (5, 5), "{sa:?}");
    assert_eq!((sb.held.len(), sb.acquired), (15, 15), "{sb:?}");
    assert_eq!(tracker.max_concurrent("a"), 5);
    assert!(sa.held.iter().all(|id| !sb.held.contains(id)));
    assert_eq!(tracker.violations(), Vec::<String>::new());
}

#[tokio::test(start_paused = true)]
async fn metrics_lines_are_emf_with_deltas() {
    let base = memory_store(short_config());
    start_items(&base, "s", 3).await;
    let lines = Lines::default();
    let worker = Worker::builder(Arc::new(base.clone()))
        .worker_id("metrics-worker")
        .metrics_interval(Duration::from_secs(1))
        .metrics_writer(lines.clone())
        .build(|conn| async move {
            conn.cancelled().await;
            Ok::<(), BoxError>(())
        })
        .unwrap();
    let handle = worker.handle();
    let task = tokio::spawn(worker.run_until(tokio::time::sleep(Duration::from_millis(3_500))));
    wait_until(Duration::from_secs(2), "3 held", || handle.snapshot().held.len() == 3).await;
    let last = task.await.unwrap();
    assert_eq!(last.released, 3);

    let lines = lines.json();
    assert_eq!(lines.len(), 4, "one a second for 3.5 s, and a last one at shutdown: {lines:?}");
    let sum = |name: &str| lines.iter().map(|l| l[name].as_u64().unwrap()).sum::<u64>();
    assert_eq!((sum("Acquired"), sum("Released"), sum("LeasesLost")), (3, 3, 0));
    assert_eq!(lines[2]["ActiveConnections"], 3);
    assert_eq!(lines[3]["ActiveConnections"], 0);
    let first = &lines[0];
    assert_eq!((first["Service"].as_str(), first["WorkerId"].as_str()), (Some("worker"), Some("metrics-worker")));
    let cw = &first["_aws"]["CloudWatchMetrics"][0];
    assert_eq!(cw["Namespace"], "leaselock");
    assert_eq!(
        cw["Dimensions"],
        serde_json::json!([["Service"], ["Service", "WorkerId"]]),
        "fleet roll-up and per worker"
    );
    // Renewals every second: latency samples show up as a values array.
    let renewals: usize = lines.iter().filter_map(|l| l["RenewLatency"].as_array()).map(|a| a.len()).sum();
    assert!(renewals >= 6, "3 leases renewed at 1 s and 2 s at least: {renewals}");
    let units: Vec<_> = cw["Metrics"].as_array().unwrap().iter().map(|m| m["Unit"].as_str().unwrap()).collect();
    assert!(units.contains(&"Count"));
}
