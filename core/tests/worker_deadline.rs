//! Nothing a handler awaits outlives the lease's local deadline: a checkpoint or a checkpointing
//! fenced write stuck in the store, or waiting behind a renewal stuck in the network, fails with
//! `Lost` by the deadline, and sends nothing after it.
//!
//! Under tokio's paused clock (memory store) the call resolves exactly at the deadline; over the
//! network (local engine behind a loopback proxy that stalls, or a listener that never answers)
//! within [`MARGIN`] of it.

mod worker_support;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
use futures::future::BoxFuture;
use leaselock::worker::{BoxError, Connection, Worker, WorkerHandle};
use leaselock::{Error, LeaseStore, LeaseTable, Result, SystemClock, WorkerSnapshot};
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;
use worker_support::proxy::Proxy;
use worker_support::*;

/// How late, at most, a call over the network may resolve after the deadline (timer and
/// scheduling latency on a loaded machine).
const MARGIN: Duration = Duration::from_millis(200);

/// The call a handler makes when told to.
type Call = Arc<dyn Fn(Connection) -> BoxFuture<'static, Result<()>> + Send + Sync>;

/// What the handler's call came to.
#[derive(Debug)]
struct Outcome {
    result: Result<()>,
    /// When it returned: tokio's clock, and the store clock's monotonic ms.
    returned: tokio::time::Instant,
    returned_mono: u64,
    /// The lease's local deadline then, on the store clock.
    deadline_mono: u64,
}

struct Harness {
    _handle: WorkerHandle,
    _task: JoinHandle<WorkerSnapshot>,
    ready: mpsc::UnboundedReceiver<Connection>,
    go: Arc<Notify>,
    outcomes: mpsc::UnboundedReceiver<Outcome>,
}

/// A worker whose handler checkpoints 1 if `first_checkpoint`, says it is ready, waits to be told,
/// makes `call` and reports how it ended, then waits for its token.
fn spawn_worker(store: Arc<dyn LeaseStore>, first_checkpoint: bool, call: Call) -> Harness {
    let (ready_tx, ready) = mpsc::unbounded_channel();
    let (outcome_tx, outcomes) = mpsc::unbounded_channel();
    let go = Arc::new(Notify::new());
    let s = store.clone();
    let worker = Worker::builder(store)
        .worker_id("w1")
        .orphan_interval(Duration::from_millis(500))
        .desired_state_interval(Duration::from_secs(60))
        .metrics_writer(Lines::default())
        .build({
            let go = go.clone();
            move |conn: Connection| {
                let (ready_tx, outcome_tx, go, call, s) =
                    (ready_tx.clone(), outcome_tx.clone(), go.clone(), call.clone(), s.clone());
                async move {
                    if first_checkpoint {
                        conn.checkpoint(1).await?;
                    }
                    let _ = ready_tx.send(conn.clone());
                    go.notified().await;
                    let result = call(conn.clone()).await;
                    let _ = outcome_tx.send(Outcome {
                        result,
                        returned: tokio::time::Instant::now(),
                        returned_mono: s.clock().monotonic_ms(),
                        deadline_mono: conn.deadline_mono_ms(),
                    });
                    conn.cancelled().await;
                    Ok::<(), BoxError>(())
                }
            }
        })
        .unwrap();
    let (handle, task) = worker.spawn();
    Harness { _handle: handle, _task: task, ready, go, outcomes }
}

impl Harness {
    async fn ready(&mut self, limit: Duration) -> Connection {
        tokio::time::timeout(limit, self.ready.recv()).await.expect("work claimed").unwrap()
    }

    async fn outcome(&mut self, limit: Duration) -> Outcome {
        tokio::time::timeout(limit, self.outcomes.recv()).await.expect("the call returned").unwrap()
    }
}

fn checkpoint_2() -> Call {
    Arc::new(|conn: Connection| Box::pin(async move { conn.checkpoint(2).await }))
}

fn assert_lost(outcome: &Outcome) {
    assert!(matches!(outcome.result, Err(Error::Lost { .. })), "the deadline error: {:?}", outcome.result);
}

/// When each checkpoint of the claim with `fence` reached the store. Past the deadline the worker
/// releases the work and its next orphan poll may claim it again (a new fence, whose handler
/// checkpoints too): that claim is not the one under test.
fn checkpoints_of<S>(store: &Faulty<S>, fence: u64) -> Vec<u64> {
    store.checkpoint_calls.lock().unwrap().iter().filter(|(_, f)| *f == fence).map(|(at, _)| *at).collect()
}

#[tokio::test(start_paused = true)]
async fn a_checkpoint_behind_a_stuck_renewal_fails_at_the_deadline_without_acting() {
    let store = Arc::new(Faulty::new(memory_store(short_config())));
    store.start("s1", "wss://feed.example/s1").await.unwrap();
    let mut w = spawn_worker(store.clone(), true, checkpoint_2());
    let fence = w.ready(Duration::from_secs(5)).await.fence();
    store.renew_hangs.store(true, Ordering::SeqCst);
    // The next renewal (1 s interval) starts, never answers, and holds the lease's lock.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    w.go.notify_one();
    let outcome = w.outcome(Duration::from_secs(10)).await;
    assert_lost(&outcome);
    assert_eq!(outcome.returned_mono, outcome.deadline_mono, "resolved exactly at the deadline: {outcome:?}");
    let calls = checkpoints_of(&store, fence);
    assert_eq!(calls.len(), 1, "only the first checkpoint reached the store: {calls:?}");
}

#[tokio::test(start_paused = true)]
async fn a_checkpoint_stuck_in_the_store_fails_at_the_deadline() {
    let store = Arc::new(Faulty::new(memory_store(short_config())));
    store.start("s1", "wss://feed.example/s1").await.unwrap();
    let mut w = spawn_worker(store.clone(), true, checkpoint_2());
    let fence = w.ready(Duration::from_secs(5)).await.fence();
    store.checkpoint_hangs.store(true, Ordering::SeqCst);
    w.go.notify_one();
    let outcome = w.outcome(Duration::from_secs(10)).await;
    assert_lost(&outcome);
    assert_eq!(outcome.returned_mono, outcome.deadline_mono, "resolved exactly at the deadline: {outcome:?}");
    let calls = checkpoints_of(&store, fence);
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert!(calls.iter().all(|&at| at < outcome.deadline_mono), "no call at or after the deadline: {calls:?}");
}

/// The lease table as seen through `proxy`.
fn through(sdk: &aws_config::SdkConfig, proxy: &Proxy, table: &LeaseTable) -> LeaseTable {
    let client = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(sdk).endpoint_url(proxy.url()).build(),
    );
    LeaseTable::new(client, table.config().clone()).unwrap()
}

/// The deadline on the system clock (the lease table's) as a tokio instant.
fn deadline_instant(deadline_mono: u64) -> tokio::time::Instant {
    SystemClock::instant_at(deadline_mono).into()
}

/// Arrivals after the deadline of requests containing `needle`.
fn sent_after(proxy: &Proxy, needle: &str, deadline: tokio::time::Instant) -> usize {
    proxy.requests_with(needle).iter().filter(|r| tokio::time::Instant::from_std(r.arrived) >= deadline).count()
}

fn assert_within_margin(outcome: &Outcome) -> tokio::time::Instant {
    let deadline = deadline_instant(outcome.deadline_mono);
    assert!(outcome.returned >= deadline, "not before the deadline either: {outcome:?}");
    let late = outcome.returned - deadline;
    assert!(late <= MARGIN, "resolved {late:?} after the deadline (margin {MARGIN:?})");
    eprintln!("resolved {late:?} after the deadline");
    deadline
}

const RENEWAL: &str = "SET #exp = :exp";
const CHECKPOINT_2: &str = r#"":seq":{"N":"2"}"#;

/// The issue seen in the field: a renewal stuck in the network holds the lease's lock; a call
/// behind it must give up at the deadline instead of sending after it. Returns the proxy.
async fn behind_a_renewal_stuck_in_the_network(call: impl FnOnce(aws_sdk_dynamodb::Client) -> Call) -> Option<Proxy> {
    let sdk = aws().await?;
    let table = lease_table(&sdk, short_config()).await;
    table.start("s1", "wss://feed.example/s1").await.unwrap();
    let proxy = Proxy::to_engine().await;
    let via_proxy = through(&sdk, &proxy, &table);
    let call = call(via_proxy.client().clone());
    let mut w = spawn_worker(Arc::new(via_proxy), true, call);
    w.ready(Duration::from_secs(10)).await;
    proxy.stall();
    wait_until(Duration::from_secs(3), "a renewal sent into the stall", || {
        proxy.requests_with(RENEWAL).iter().any(|r| r.stalled)
    })
    .await;
    w.go.notify_one();
    let outcome = w.outcome(Duration::from_secs(10)).await;
    assert_lost(&outcome);
    let deadline = assert_within_margin(&outcome);
    assert_eq!(sent_after(&proxy, "#seq", deadline), 0, "nothing sent for the lease after the deadline");
    Some(proxy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_behind_a_renewal_stuck_in_the_network_fails_by_the_deadline() {
    let Some(proxy) = behind_a_renewal_stuck_in_the_network(|_| checkpoint_2()).await else { return };
    assert_eq!(proxy.requests_with(CHECKPOINT_2).len(), 0, "the checkpoint never had the lock, so sent nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_write_behind_a_renewal_stuck_in_the_network_fails_by_the_deadline_unsent() {
    let Some(proxy) = behind_a_renewal_stuck_in_the_network(fenced_write_with_checkpoint_2).await else { return };
    assert_eq!(proxy.requests_with("TransactWriteItems").len(), 0, "the write never had the lock, so sent nothing");
}

/// A handler's checkpointing fenced write of message 2 through `data`.
fn fenced_write_with_checkpoint_2(data: aws_sdk_dynamodb::Client) -> Call {
    Arc::new(move |conn: Connection| {
        let data = data.clone();
        Box::pin(async move {
            let put = Put::builder()
                .table_name("messages")
                .item("stream", AttributeValue::S(conn.id().to_string()))
                .item("seq", AttributeValue::N("2".into()))
                .build()
                .unwrap();
            conn.fenced_write_with_checkpoint(&data, 2, vec![TransactWriteItem::builder().put(put).build()]).await
        })
    })
}

/// A checkpoint whose request is stuck in the network (the renewal waits behind it for the lock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_stuck_in_the_network_fails_by_the_deadline_and_sends_nothing_after_it() {
    let Some(sdk) = aws().await else { return };
    let table = lease_table(&sdk, short_config()).await;
    table.start("s1", "wss://feed.example/s1").await.unwrap();
    let proxy = Proxy::to_engine().await;
    let mut w = spawn_worker(Arc::new(through(&sdk, &proxy, &table)), true, checkpoint_2());
    w.ready(Duration::from_secs(10)).await;
    // Right after a renewal was answered, so the checkpoint takes the lock before the next one.
    let before = proxy.requests_with(RENEWAL).len();
    wait_until(Duration::from_secs(3), "a renewal answered", || {
        proxy.requests_with(RENEWAL).iter().skip(before).any(|r| r.answered().is_some())
    })
    .await;
    proxy.stall();
    w.go.notify_one();
    let outcome = w.outcome(Duration::from_secs(10)).await;
    assert_lost(&outcome);
    let deadline = assert_within_margin(&outcome);
    let sent = proxy.requests_with(CHECKPOINT_2);
    assert!(!sent.is_empty() && sent.iter().all(|r| r.stalled), "the checkpoint went into the stall");
    assert_eq!(sent_after(&proxy, "#seq", deadline), 0, "no checkpoint attempt after the deadline");
}

/// A checkpointing fenced write through a DynamoDB client whose endpoint accepts and never
/// answers: the lease's lock is held across the write, so no renewal moves the deadline, and
/// the write gives up at it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_write_with_checkpoint_stuck_in_the_network_fails_by_the_deadline() {
    let Some(sdk) = aws().await else { return };
    let table = lease_table(&sdk, short_config()).await;
    table.start("s1", "wss://feed.example/s1").await.unwrap();
    let silent = Proxy::start(None).await;
    let data = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(&sdk).endpoint_url(silent.url()).build(),
    );
    let mut w = spawn_worker(Arc::new(table.clone()), false, fenced_write_with_checkpoint_2(data));
    w.ready(Duration::from_secs(10)).await;
    w.go.notify_one();
    let outcome = w.outcome(Duration::from_secs(10)).await;
    assert_lost(&outcome);
    let deadline = assert_within_margin(&outcome);
    assert!(!silent.requests_with("TransactWriteItems").is_empty(), "the write was sent");
    assert_eq!(sent_after(&silent, "TransactWriteItems", deadline), 0, "nothing sent after the deadline");
    assert_eq!(table.get("s1").await.unwrap().unwrap().last_seq, None);
}
