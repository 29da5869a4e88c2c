//! Workers in session mode: one session renewal per renew interval for the whole worker, a
//! crashed worker's work taken over as a dead session's (transactions of several at once) within
//! lease + skew + a poll, a graceful shutdown that frees everything with one session write, and
//! no two handlers of one id running at once. Lease 3 s, renew 1 s, skew 0.5 s.

mod worker_support;

use std::sync::Arc;
use std::time::Duration;

use leaselock::worker::{BoxError, Worker, WorkerHandle};
use leaselock::{LeaseMode, LeaseStore, LeaseTable, TableConfig, WorkerSnapshot};
use tokio::task::JoinHandle;
use worker_support::*;

struct Running {
    handle: WorkerHandle,
    task: JoinHandle<WorkerSnapshot>,
}

fn session_config() -> TableConfig {
    short_config().mode(LeaseMode::Session)
}

fn spawn_worker(store: Arc<dyn LeaseStore>, name: &'static str, tracker: &Arc<Tracker>) -> Running {
    let tracker = tracker.clone();
    let worker = Worker::builder(store)
        .worker_id(name)
        .orphan_interval(Duration::from_secs(1))
        // These tests pin the takeover paths; the fleet's balance has tests of its own.
        .balance(false)
        .metrics_writer(Lines::default())
        .build(move |conn| {
            let tracker = tracker.clone();
            async move {
                let _inside = tracker.enter(conn.id(), name);
                let mut seq = conn.last_seq().unwrap_or(0);
                loop {
                    tokio::select! {
                        _ = conn.cancelled() => return Ok::<(), BoxError>(()),
                        _ = tokio::time::sleep(Duration::from_millis(700)) => {
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

/// lease + skew + 3 s.
const FAILOVER_BOUND: Duration = Duration::from_millis(6_500);

#[tokio::test(start_paused = true)]
async fn a_crashed_sessions_work_is_taken_over_and_checkpoints_continue() {
    let base = memory_store(session_config());
    start_items(&base, "s", 10).await;
    let tracker = Arc::new(Tracker::default());
    let a = spawn_worker(Arc::new(base.clone()), "a", &tracker);
    wait_until(Duration::from_secs(20), "a holds 10", || a.handle.snapshot().held.len() == 10).await;
    assert!(a.handle.snapshot().session_epoch.is_some());
    let b = spawn_worker(Arc::new(skewed(&base, 300)), "b", &tracker);
    // Several session renewals of a: b takes nothing from a live session.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(b.handle.snapshot().held.is_empty(), "b took work of a live session");
    let mut before = Vec::new();
    for i in 0..10 {
        before.push(base.get(&format!("s{i:02}")).await);
    }

    a.task.abort();
    let took = wait_until(Duration::from_secs(20), "b holds 10", || b.handle.snapshot().held.len() == 10).await;
    assert!(took <= FAILOVER_BOUND, "took {took:?}");
    assert!(took >= Duration::from_millis(2_000), "took {took:?}: before the session could expire");
    assert_eq!(b.handle.snapshot().session_takeovers, 10);
    assert_eq!(tracker.violations(), Vec::<String>::new());
    for (i, old) in before.into_iter().enumerate() {
        let old = old.unwrap().unwrap();
        let now = base.get(&format!("s{i:02}")).await.unwrap().unwrap();
        assert_eq!((now.owner.as_deref(), now.fence), (Some("b"), old.fence + 1));
        assert!(now.last_seq >= old.last_seq, "resumed from the checkpoint");
    }
    b.handle.shutdown();
    b.task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn handlers_stop_at_the_session_deadline_when_the_store_is_silent() {
    let base = memory_store(session_config());
    start_items(&base, "s", 5).await;
    let faulty = Arc::new(Faulty::new(base.clone()));
    let tracker = Arc::new(Tracker::default());
    let a = spawn_worker(faulty.clone(), "a", &tracker);
    wait_until(Duration::from_secs(20), "a holds 5", || a.handle.snapshot().held.len() == 5).await;
    faulty.renew_hangs.store(true, std::sync::atomic::Ordering::SeqCst);
    // Rule 2 on the session: within lease - skew of the last renewal every handler has stopped.
    let stopped = wait_until(Duration::from_secs(10), "a stops", || tracker.running("a") == 0).await;
    assert!(stopped <= Duration::from_millis(2_600), "stopped after {stopped:?}");
    a.task.abort();
}

/// A claim whose answer arrives after a session renewal has landed acts until the renewed
/// session's deadline, not the one read before the claim was sent: no handler of a live,
/// renewed session is ever cancelled at a deadline.
#[tokio::test(start_paused = true)]
async fn a_claim_answered_after_a_session_renewal_acts_until_the_renewed_deadline() {
    let base = memory_store(session_config());
    start_items(&base, "s", 3).await;
    let faulty = Arc::new(Faulty::new(base.clone()));
    // Two session renewals (every 1 s) land while the answer is on its way; the session read
    // before the claim ends 2.5 s after its last renewal was sent.
    faulty.session_claim_answer_delay_ms.store(2_400, std::sync::atomic::Ordering::SeqCst);
    let reasons = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = reasons.clone();
    let worker = Worker::builder(faulty.clone())
        .worker_id("a")
        .orphan_interval(Duration::from_secs(1))
        .balance(false)
        .metrics_writer(Lines::default())
        .build(move |conn| {
            let seen = seen.clone();
            async move {
                conn.cancelled().await;
                seen.lock().unwrap().push((conn.id().to_string(), conn.cancel_reason()));
                Ok::<(), BoxError>(())
            }
        })
        .unwrap();
    let handle = worker.handle();
    let task = tokio::spawn(worker.run_until(std::future::pending()));
    wait_until(Duration::from_secs(20), "a holds 3", || handle.snapshot().held.len() == 3).await;
    // Many session renewals later, every claim is still held and no handler was cancelled.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let snapshot = handle.snapshot();
    assert_eq!(reasons.lock().unwrap().clone(), Vec::new(), "cancelled while the session was live");
    assert_eq!((snapshot.held.len(), snapshot.acquired, snapshot.leases_lost), (3, 3, 0));
    handle.shutdown();
    task.await.unwrap();
}

/// A LeaseTable of its own (its own request counter) on `table`'s table.
fn counted(table: &LeaseTable) -> LeaseTable {
    LeaseTable::new(table.client().clone(), table.config().clone()).unwrap()
}

/// A dead session's connections, claimed together, are taken over by transactions of several
/// connections each (the claims the engine starts at once): fewer transactions than connections,
/// never two handlers of one id at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_sessions_work_is_taken_over_in_transactions_of_several_on_dynamodb() {
    let Some(sdk) = aws().await else { return };
    let table = lease_table(&sdk, session_config()).await;
    let ids = start_items(&table, "t", 24).await;
    let tracker = Arc::new(Tracker::default());
    let a = spawn_worker(Arc::new(counted(&table)), "a", &tracker);
    wait_until(Duration::from_secs(30), "a holds 24", || a.handle.snapshot().held.len() == 24).await;
    let mut before = Vec::new();
    for id in &ids {
        before.push(table.get(id).await.unwrap().unwrap());
    }
    let store_b = counted(&table);
    let b = spawn_worker(Arc::new(store_b.clone()), "b", &tracker);
    a.task.abort();
    wait_until(Duration::from_secs(30), "b holds 24", || b.handle.snapshot().held.len() == 24).await;
    assert_eq!(b.handle.snapshot().session_takeovers, 24);
    let transactions = store_b.requests_sent().snapshot().get("TransactWriteItems").copied().unwrap_or(0);
    eprintln!("{transactions} TransactWriteItems for 24 connections taken over");
    // At most 16 claims start at once: two transactions, and a few more if a claim raced.
    assert!((2..=6).contains(&transactions), "{transactions} transactions for 24 connections");
    for old in before {
        // Claimed by b, at a higher fence (+1, unless a claim's answer was lost under load and
        // the work claimed again).
        let now = table.get(&old.id).await.unwrap().unwrap();
        assert!(now.owner.as_deref() == Some("b") && now.fence > old.fence, "{}: {now:?} after {old:?}", old.id);
    }
    assert_eq!(tracker.violations(), Vec::<String>::new());
    b.handle.shutdown();
    b.task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_session_write_per_renewal_and_one_to_leave_on_dynamodb() {
    let Some(sdk) = aws().await else { return };
    let table = lease_table(&sdk, session_config()).await;
    start_items(&table, "s", 12).await;
    let tracker = Arc::new(Tracker::default());
    let store_a = counted(&table);
    let a = spawn_worker(Arc::new(store_a.clone()), "a", &tracker);
    wait_until(Duration::from_secs(30), "a holds 12", || a.handle.snapshot().held.len() == 12).await;
    let counts = store_a.requests_sent().snapshot();
    let start = std::time::Instant::now();
    let writes_before = store_a.requests_sent().writes();
    let checkpoints_before = counts.get("UpdateItem").copied().unwrap_or(0);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let elapsed = start.elapsed().as_secs_f64();
    // Handlers checkpoint every 0.7 s (12 x ~7 writes); renewals are one per second in all.
    let writes = store_a.requests_sent().writes() - writes_before;
    let per_item_renewals = 12.0 * elapsed;
    assert!((writes as f64) < 12.0 * elapsed / 0.7 + elapsed + 3.0, "{writes} writes in {elapsed:.1} s");
    eprintln!("{writes} writes in {elapsed:.1} s with 12 held (per-item renewals alone: {per_item_renewals:.0}); before: {checkpoints_before}");

    let b_store = counted(&table);
    let b = spawn_worker(Arc::new(b_store), "b", &tracker);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(b.handle.snapshot().held.is_empty());
    // Graceful: handlers stop, then one session write frees all 12.
    let writes_before = store_a.requests_sent().writes();
    let left = std::time::Instant::now();
    a.handle.shutdown();
    a.task.await.unwrap();
    let leave_writes = store_a.requests_sent().writes() - writes_before;
    assert!(leave_writes <= 1 + 12, "{leave_writes}");
    let ended = store_a.requests_sent().snapshot();
    eprintln!("leaving: {leave_writes} writes ({ended:?})");
    let took = wait_until(Duration::from_secs(20), "b holds 12", || b.handle.snapshot().held.len() == 12).await;
    eprintln!("graceful hand-over: {:?} after shutdown began", left.elapsed());
    assert!(took <= Duration::from_secs(4), "b took {took:?}");
    assert_eq!(tracker.violations(), Vec::<String>::new());
    b.handle.shutdown();
    b.task.await.unwrap();
}
