//! Fleet-aware balance in session mode: a worker that joins gets its fair share by graceful
//! hand-overs (checkpoint, release; the next owner resumes from the checkpoint), a few at a
//! time and paced, with no two handlers of one id at once, no checkpoint going back, no
//! connection moved more than needed, and no churn once even. Lease 3 s, renew 1 s, skew 0.5 s.

mod worker_support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use leaselock::worker::{BoxError, Worker, WorkerHandle};
use leaselock::{LeaseMode, LeaseStore, MemoryStore, TableConfig, WorkerSnapshot};
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
        .orphan_interval(Duration::from_secs(1))
        .metrics_writer(Lines::default())
        .build(move |conn| {
            let tracker = tracker.clone();
            async move {
                let _inside = tracker.enter(conn.id(), name);
                let mut seq = conn.last_seq().unwrap_or(0);
                loop {
                    tokio::select! {
                        _ = conn.cancelled() => return Ok::<(), BoxError>(()),
                        _ = tokio::time::sleep(Duration::from_millis(300)) => {
                            seq += 1;
                            if conn.checkpoint(seq).await.is_err() {
                                return Ok(());
                            }
                        }
                    }
                }
            }
        })
        .unwrap();
    let handle = worker.handle();
    Running { handle, task: tokio::spawn(worker.run_until(std::future::pending())) }
}

async fn fences(store: &MemoryStore, ids: &[String]) -> BTreeMap<String, (u64, u64)> {
    let mut out = BTreeMap::new();
    for id in ids {
        let item = store.get(id).await.unwrap().unwrap();
        out.insert(id.clone(), (item.fence, item.last_seq.unwrap_or(0)));
    }
    out
}

fn held(w: &Running) -> usize {
    w.handle.snapshot().held.len()
}

#[tokio::test(start_paused = true)]
async fn joining_workers_get_their_share_by_hand_overs_without_churn() {
    let base = memory_store(short_config().mode(LeaseMode::Session));
    let ids = start_items(&base, "s", 12).await;
    let tracker = Arc::new(Tracker::default());
    let a = spawn_worker(Arc::new(base.clone()), "a", &tracker);
    wait_until(Duration::from_secs(20), "a holds 12", || held(&a) == 12).await;
    let first = fences(&base, &ids).await;

    // A second worker: a hands over 6, in rounds of a few (not all at once).
    let b = spawn_worker(Arc::new(skewed(&base, 200)), "b", &tracker);
    let mut most_at_once = 0;
    let mut previous = 0;
    let took = wait_until(Duration::from_secs(30), "6 and 6", || {
        let now = held(&b);
        most_at_once = most_at_once.max(now.saturating_sub(previous));
        previous = now;
        held(&a) == 6 && now == 6
    })
    .await;
    assert!(took <= Duration::from_secs(15), "took {took:?}");
    assert!(most_at_once <= 4, "{most_at_once} moved in one poll");
    assert_eq!(a.handle.snapshot().handed_over, 6);

    // A third: 4 each, from both.
    let c = spawn_worker(Arc::new(skewed(&base, -200)), "c", &tracker);
    wait_until(Duration::from_secs(30), "4, 4 and 4", || held(&a) == 4 && held(&b) == 4 && held(&c) == 4).await;
    let moves = |w: &Running| w.handle.snapshot().handed_over;
    let handed = moves(&a) + moves(&b) + moves(&c);
    assert_eq!(handed, 10, "6 to b, then 2 from each of a and b to c");

    // Even: nothing moves any more.
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert_eq!((held(&a), held(&b), held(&c)), (4, 4, 4));
    assert_eq!(moves(&a) + moves(&b) + moves(&c), handed, "churn once even");
    assert_eq!(tracker.violations(), Vec::<String>::new());

    let last = fences(&base, &ids).await;
    let mut moved_twice = 0;
    for id in &ids {
        let ((f0, seq0), (f1, seq1)) = (first[id], last[id]);
        // Each hand-over is one claim; the least moved go first, so only b's 2 (all of b's
        // came from a) move a second time.
        assert!(f1 - f0 <= 2, "{id} claimed {} more times", f1 - f0);
        moved_twice += u64::from(f1 - f0 == 2);
        assert!(seq1 > seq0, "{id} did not go on from its checkpoint");
    }
    assert_eq!(moved_twice, 2);
    for w in [a, b, c] {
        w.handle.shutdown();
        w.task.await.unwrap();
    }
}

/// A peer that stops renewing (paused, or here partitioned from the store) stays live until its
/// session expires, a lease after its last renewal; meanwhile it can take nothing. The share of
/// a dead worker's work it would have been given must not wait for that: the workers that renew
/// take it all. Lease 10 s (a stalled peer stays live long after the dead one's session ends),
/// renew 1 s, skew 0.5 s, orphan poll 1 s.
#[tokio::test(start_paused = true)]
async fn a_dead_workers_work_does_not_wait_for_a_stalled_peer() {
    let config = TableConfig::new("leases")
        .lease_duration(Duration::from_secs(10))
        .renew_interval(Duration::from_secs(1))
        .clock_skew(Duration::from_millis(500))
        .mode(LeaseMode::Session)
        .validated()
        .unwrap();
    // Lease + skew + 3 s after the crash.
    let bound = config.lease_duration + config.clock_skew + Duration::from_secs(3);
    let base = memory_store(config);
    start_items(&base, "s", 12).await;
    let tracker = Arc::new(Tracker::default());
    let b_store = Arc::new(Faulty::new(skewed(&base, 200)));
    let a = spawn_worker(Arc::new(base.clone()), "a", &tracker);
    let b = spawn_worker(b_store.clone(), "b", &tracker);
    let c = spawn_worker(Arc::new(skewed(&base, -200)), "c", &tracker);
    wait_until(Duration::from_secs(60), "4, 4 and 4", || held(&a) == 4 && held(&b) == 4 && held(&c) == 4).await;
    let (b_ids, c_ids) = (b.handle.snapshot().held, c.handle.snapshot().held);

    // c crashes. Its session was renewed at most 1 s ago: it is dead 9.5 to 10.5 s from now.
    c.task.abort();
    let crashed = tokio::time::Instant::now();
    // b stops renewing (and claiming) before that, for far longer than a renew interval: its
    // session stays live until 10.5 s after its last renewal, 17.5 s or more after the crash.
    tokio::time::sleep(Duration::from_secs(8)).await;
    b_store.partitioned.store(true, std::sync::atomic::Ordering::SeqCst);
    let a_holds_all_of_c = || {
        let held = a.handle.snapshot().held;
        c_ids.iter().all(|id| held.contains(id))
    };
    wait_until(Duration::from_secs(30), "a holds all of c's work", a_holds_all_of_c).await;
    let took = crashed.elapsed();
    eprintln!("a dead worker's work beside a stalled peer: held again {took:?} after the crash");
    assert!(took <= bound, "c's work held again {took:?} after the crash (bound {bound:?})");
    // b's own work is still b's: its session lives.
    for id in &b_ids {
        assert_eq!(base.get(id).await.unwrap().unwrap().owner.as_deref(), Some("b"), "{id}");
    }
    assert_eq!(held(&a), 8);
    assert_eq!(tracker.violations(), Vec::<String>::new());

    b_store.partitioned.store(false, std::sync::atomic::Ordering::SeqCst);
    for w in [a, b] {
        w.handle.shutdown();
        w.task.await.unwrap();
    }
    assert_eq!(tracker.violations(), Vec::<String>::new());
}

#[tokio::test(start_paused = true)]
async fn without_balance_a_worker_keeps_what_it_claimed() {
    let base = memory_store(short_config().mode(LeaseMode::Session));
    start_items(&base, "s", 6).await;
    let tracker = Arc::new(Tracker::default());
    let a = spawn_worker(Arc::new(base.clone()), "a", &tracker);
    wait_until(Duration::from_secs(20), "a holds 6", || held(&a) == 6).await;
    let b = Worker::builder(Arc::new(base.clone()))
        .worker_id("b")
        .orphan_interval(Duration::from_secs(1))
        .balance(false)
        .metrics_writer(Lines::default())
        .build(|conn| async move {
            conn.cancelled().await;
            Ok::<(), BoxError>(())
        })
        .unwrap();
    let (b, b_task) = b.spawn();
    tokio::time::sleep(Duration::from_secs(10)).await;
    // b reports what it holds (nothing), so a, balanced, hands 3 over to it.
    assert_eq!((held(&a), b.snapshot().held.len()), (3, 3));
    assert_eq!(b.snapshot().claim_limit, None);
    a.handle.shutdown();
    a.task.await.unwrap();
    b.shutdown();
    b_task.await.unwrap();
}
