//! The worker against the local AWS engine: SQS hints get work claimed without waiting for the
//! orphan poll, and fenced writes are refused once the lease has changed hands.

mod worker_support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType, Put, ScalarAttributeType,
    TransactWriteItem,
};
use aws_sdk_sqs::types::QueueAttributeName;
use leaselock::worker::{BoxError, CancelReason, Connection, Worker, POLL_ANSWER_MARGIN};
use leaselock::{
    fenced_put, fenced_write_with_checkpoint, Clock, Error, Hint, LeaseMode, LeaseStore, LeaseTable, SkewedClock,
    SystemClock, TableConfig,
};
use tokio::time::Instant;
use worker_support::*;

/// Messages still in the queue, visible or in flight.
async fn queued(sqs: &aws_sdk_sqs::Client, url: &str) -> u64 {
    let attrs = sqs
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
        .send()
        .await
        .unwrap();
    attrs.attributes().unwrap().values().map(|v| v.parse::<u64>().unwrap()).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hint_gets_work_claimed_without_waiting_for_the_orphan_poll() {
    let Some(sdk) = aws().await else { return };
    let table = lease_table(&sdk, TableConfig::new("x")).await;
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let queue = sqs.create_queue().queue_name(unique("hints")).send().await.unwrap().queue_url.unwrap();
    let (handle, task) = spawn_hinted(Worker::builder(Arc::new(table.clone())), &sqs, &queue, Duration::from_secs(600));
    // The first orphan poll has run (and found nothing): the next one is 10 minutes away.
    wait_until(Duration::from_secs(10), "first orphan poll", || handle.snapshot().orphan_polls == 1).await;

    table.start("s1", "wss://feed.example/s1").await.unwrap();
    let t0 = Instant::now();
    sqs.send_message().queue_url(&queue).message_body(Hint::new("s1").to_json()).send().await.unwrap();
    wait_until(Duration::from_secs(10), "s1 claimed", || handle.snapshot().held == ["s1"]).await;
    let took = t0.elapsed();
    eprintln!("hint to claim: {took:?}");
    assert!(took < Duration::from_secs(10), "took {took:?}");

    // A hint for work someone else holds is a conflict; an unreadable one is dropped. Both are
    // deleted: they were only hints.
    table.start("s2", "wss://feed.example/s2").await.unwrap();
    table.acquire("s2", "someone-else").await.unwrap();
    sqs.send_message().queue_url(&queue).message_body(Hint::new("s2").to_json()).send().await.unwrap();
    sqs.send_message().queue_url(&queue).message_body("not a hint").send().await.unwrap();
    wait_until(Duration::from_secs(10), "hints handled", || {
        let s = handle.snapshot();
        s.hints_received == 3 && s.acquire_conflicts == 1
    })
    .await;
    let until = Instant::now() + Duration::from_secs(10);
    while queued(&sqs, &queue).await > 0 {
        assert!(Instant::now() < until, "hints must be deleted once handled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let s = handle.snapshot();
    // The periodic poll is 10 minutes away: every claim here came from a hint (directly, or
    // through the index query a hint triggers).
    assert_eq!((s.held.clone(), s.acquired), (vec!["s1".to_string()], 1), "{s:?}");

    // Shutdown lets the long poll in flight run out (never abandons it) and so takes at most
    // about the hint wait.
    let t0 = Instant::now();
    handle.shutdown();
    let last = task.await.unwrap();
    assert!(t0.elapsed() < Duration::from_secs(3), "shutdown took {:?}", t0.elapsed());
    assert_eq!(last.released, 1);
    assert_eq!(table.get("s1").await.unwrap().unwrap().expires_at_ms, Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_released_on_shutdown_is_hinted_to_the_fleet() {
    let Some(sdk) = aws().await else { return };
    let table = lease_table(&sdk, TableConfig::new("x")).await;
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let queue = sqs.create_queue().queue_name(unique("handover")).send().await.unwrap().queue_url.unwrap();
    let ids = start_items(&table, "h", 6).await;
    // The leaving worker polls often, so a claim or poll that fails on a loaded machine is
    // retried; the successor's periodic poll is 10 minutes away.
    let worker = |name: &str, orphan_interval: Duration| {
        Worker::builder(Arc::new(table.clone()))
            .worker_id(name)
            .orphan_interval(orphan_interval)
            .hint_queue(sqs.clone(), &queue)
            .metrics_writer(Lines::default())
            .build(|conn: Connection| async move {
                conn.cancelled().await;
                Ok::<(), BoxError>(())
            })
            .unwrap()
    };
    let leaving = worker("leaving", Duration::from_secs(1));
    let leaving_handle = leaving.handle();
    let leaving_task = tokio::spawn(leaving.run_until(std::future::pending()));
    wait_until(Duration::from_secs(10), "all claimed", || leaving_handle.snapshot().held.len() == ids.len()).await;

    // The successor's only orphan poll runs now and finds nothing: everything is held.
    let staying = worker("staying", Duration::from_secs(600));
    let staying_handle = staying.handle();
    let staying_task = tokio::spawn(staying.run_until(std::future::pending()));
    wait_until(Duration::from_secs(10), "first orphan poll", || staying_handle.snapshot().orphan_polls == 1).await;

    let t0 = Instant::now();
    leaving_handle.shutdown();
    assert_eq!(leaving_task.await.unwrap().released, ids.len() as u64);
    wait_until(Duration::from_secs(15), "hinted work claimed", || staying_handle.snapshot().held.len() == ids.len())
        .await;
    let took = t0.elapsed();
    eprintln!("shutdown to every lease claimed by the successor: {took:?}");
    // The periodic poll is 10 minutes away: only the hand-over hints explain a claim this soon.
    assert!(took < Duration::from_secs(10), "hand-over took {took:?}");
    let s = staying_handle.snapshot();
    assert!(s.hints_received >= 1, "claimed because of hints: {s:?}");
    staying_handle.shutdown();
    staying_task.await.unwrap();
}

/// Session mode with balance: a worker at its fair share that receives the hints of a peer's
/// shutdown reads the sessions once. The ended session reports what it freed, the share grows,
/// and the hints are claimed at once, not given back until an orphan poll (held back here, so
/// it cannot) finds the work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_its_share_a_worker_claims_a_leaving_peers_hints_at_once() {
    let Some(sdk) = aws().await else { return };
    let table = lease_table(&sdk, short_config().mode(LeaseMode::Session)).await;
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let queue = sqs.create_queue().queue_name(unique("share")).send().await.unwrap().queue_url.unwrap();
    start_items(&table, "p", 12).await;
    let worker = |store: Arc<dyn LeaseStore>, name: &str| {
        spawn_hinted(Worker::builder(store).worker_id(name), &sqs, &queue, Duration::from_millis(300))
    };
    let a_store = Arc::new(Faulty::new(table.clone()));
    let (a, a_task) = worker(a_store.clone(), "a");
    wait_until(Duration::from_secs(20), "a holds everything", || a.snapshot().held.len() == 12).await;
    let (b, b_task) = worker(Arc::new(table.clone()), "b");
    wait_until(Duration::from_secs(30), "six each, a at a share of 6", || {
        let (sa, sb) = (a.snapshot(), b.snapshot());
        sa.held.len() == 6 && sb.held.len() == 6 && sa.claim_limit == Some(6)
    })
    .await;

    a_store.orphan_reads_held_back.store(true, Ordering::SeqCst);
    wait_until(Duration::from_secs(5), "a's orphan poll held back", || {
        a_store.orphan_reads_waiting.load(Ordering::SeqCst) >= 1
    })
    .await;
    b.shutdown();
    b_task.await.unwrap();
    let took =
        wait_until(Duration::from_secs(5), "a holds the leaving peer's work", || a.snapshot().held.len() == 12).await;
    eprintln!("peer's shutdown to its work claimed from the hints: {took:?}");
    assert_eq!(a.snapshot().claim_limit, Some(12));
    a_store.orphan_reads_held_back.store(false, Ordering::SeqCst);
    a.shutdown();
    a_task.await.unwrap();
}

/// A table for the downstream writes, keyed by `pk`.
async fn data_table(client: &aws_sdk_dynamodb::Client) -> String {
    let name = unique("data");
    client
        .create_table()
        .table_name(&name)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(
            AttributeDefinition::builder().attribute_name("pk").attribute_type(ScalarAttributeType::S).build().unwrap(),
        )
        .key_schema(KeySchemaElement::builder().attribute_name("pk").key_type(KeyType::Hash).build().unwrap())
        .send()
        .await
        .unwrap();
    name
}

fn message(table: &str, id: &str, seq: u64, fence: u64) -> Put {
    Put::builder()
        .table_name(table)
        .item("pk", AttributeValue::S(format!("{id}#{seq}")))
        .item("seq", AttributeValue::N(seq.to_string()))
        .item("fence", AttributeValue::N(fence.to_string()))
        .build()
        .unwrap()
}

async fn written(client: &aws_sdk_dynamodb::Client, table: &str, pk: &str) -> bool {
    let out = client.get_item().table_name(table).key("pk", AttributeValue::S(pk.into())).consistent_read(true);
    out.send().await.unwrap().item.is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_write_is_refused_after_a_takeover_and_after_a_release() {
    let Some(sdk) = aws().await else { return };
    let table = lease_table(&sdk, TableConfig::new("x")).await;
    let client = table.client().clone();
    let data = data_table(&client).await;
    let config = table.config().clone();
    table.start("s1", "wss://feed.example/s1").await.unwrap();

    let old = table.acquire("s1", "old-owner").await.unwrap();
    fenced_put(&client, &config, &old, message(&data, "s1", 1, old.fence)).await.unwrap();
    assert!(written(&client, &data, "s1#1").await);

    // A worker whose clock is 25 s ahead takes over; the old owner, paused past its deadline,
    // wakes up and tries to write.
    let ahead = table.clone().with_clock(Arc::new(SkewedClock { inner: SystemClock, offset_ms: 25_000 }));
    let new = ahead.acquire("s1", "new-owner").await.unwrap();
    assert_eq!(new.fence, old.fence + 1);
    let refused = fenced_put(&client, &config, &old, message(&data, "s1", 2, old.fence)).await;
    assert!(matches!(refused, Err(Error::Lost { ref id }) if id == "s1"), "{refused:?}");
    assert!(!written(&client, &data, "s1#2").await, "nothing written by the old owner");
    fenced_put(&client, &config, &new, message(&data, "s1", 2, new.fence)).await.unwrap();
    assert!(written(&client, &data, "s1#2").await);

    // A failed condition of the write itself is not a lost lease.
    let once = Put::builder()
        .table_name(&data)
        .item("pk", AttributeValue::S("s1#2".into()))
        .condition_expression("attribute_not_exists(pk)")
        .build()
        .unwrap();
    let duplicate = fenced_put(&client, &config, &new, once).await;
    assert!(matches!(&duplicate, Err(Error::Store(m)) if m.contains("fenced write 0")), "{duplicate:?}");

    // After its own release the owner may not write either (the expiry is 0).
    ahead.release(&new).await.unwrap();
    let after_release = fenced_put(&client, &config, &new, message(&data, "s1", 3, new.fence)).await;
    assert!(matches!(after_release, Err(Error::Lost { .. })), "{after_release:?}");
    assert!(!written(&client, &data, "s1#3").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handlers_fenced_writes_stop_at_the_takeover() {
    let Some(sdk) = aws().await else { return };
    let table = lease_table(&sdk, TableConfig::new("x")).await;
    let client = table.client().clone();
    let data = data_table(&client).await;
    table.start("s1", "wss://feed.example/s1").await.unwrap();

    // (seq, outcome) of every write, and the reason the token fired.
    let writes: Arc<Mutex<Vec<(u64, &'static str)>>> = Arc::default();
    let reason: Arc<Mutex<Option<CancelReason>>> = Arc::default();
    let (w, r, c, d) = (writes.clone(), reason.clone(), client.clone(), data.clone());
    let worker = Worker::builder(Arc::new(table.clone()))
        .metrics_writer(Lines::default())
        .build(move |conn: Connection| {
            let (writes, reason, client, data) = (w.clone(), r.clone(), c.clone(), d.clone());
            async move {
                let mut seq = conn.last_seq().unwrap_or(0);
                while !conn.is_cancelled() {
                    seq += 1;
                    let outcome = match conn.fenced_put(&client, message(&data, conn.id(), seq, conn.fence())).await {
                        Ok(()) => {
                            conn.checkpoint(seq).await?;
                            "ok"
                        }
                        Err(Error::Lost { .. }) => "lost",
                        Err(e) => return Err(e),
                    };
                    writes.lock().unwrap().push((seq, outcome));
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                *reason.lock().unwrap() = conn.cancel_reason();
                Ok::<(), Error>(())
            }
        })
        .unwrap();
    let handle = worker.handle();
    let _task = tokio::spawn(worker.run_until(std::future::pending()));
    wait_until(Duration::from_secs(10), "5 writes", || writes.lock().unwrap().len() >= 5).await;

    let ahead: LeaseTable = table.clone().with_clock(Arc::new(SkewedClock { inner: SystemClock, offset_ms: 25_000 }));
    ahead.acquire("s1", "new-owner").await.unwrap();
    let took = wait_until(Duration::from_secs(10), "handler stopped", || reason.lock().unwrap().is_some()).await;
    assert!(took < Duration::from_secs(1), "the next write (every 50 ms) sees it: {took:?}");
    assert_eq!(*reason.lock().unwrap(), Some(CancelReason::Lost));

    let writes = writes.lock().unwrap().clone();
    let (last_ok, _) = *writes.iter().rev().find(|(_, o)| *o == "ok").unwrap();
    assert_eq!(writes.last().unwrap(), &(last_ok + 1, "lost"), "{writes:?}");
    assert!(!written(&client, &data, &format!("s1#{}", last_ok + 1)).await);
    let item = table.get("s1").await.unwrap().unwrap();
    assert_eq!((item.owner.as_deref(), item.last_seq), (Some("new-owner"), Some(last_ok)));
    wait_until(Duration::from_secs(5), "lost counted", || handle.snapshot().leases_lost == 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpointing_write_moves_output_and_resume_point_together() {
    let Some(sdk) = aws().await else { return };
    let clock_a = Arc::new(leaselock::ManualClock::new(SystemClock.now_ms()));
    let table = lease_table(&sdk, TableConfig::new("x")).await;
    let client = table.client().clone();
    let data = data_table(&client).await;
    let config = table.config().clone();
    let put = |seq: u64, fence: u64| TransactWriteItem::builder().put(message(&data, "s1", seq, fence)).build();
    table.start("s1", "wss://feed.example/s1").await.unwrap();

    let a = table.clone().with_clock(clock_a.clone());
    let lease = a.acquire("s1", "a").await.unwrap();
    let now = || clock_a.now_ms();
    fenced_write_with_checkpoint(&client, &config, &lease, now(), 1, vec![put(1, lease.fence)]).await.unwrap();
    fenced_write_with_checkpoint(&client, &config, &lease, now(), 2, vec![put(2, lease.fence)]).await.unwrap();
    assert!(written(&client, &data, "s1#2").await);
    assert_eq!(table.get("s1").await.unwrap().unwrap().last_seq, Some(2));

    // A sequence number that does not move forward: neither the write nor the checkpoint lands.
    match fenced_write_with_checkpoint(&client, &config, &lease, now(), 2, vec![put(99, lease.fence)]).await {
        Err(Error::SeqNotIncreasing { last_seq: 2, seq: 2, .. }) => {}
        other => panic!("expected SeqNotIncreasing, got {other:?}"),
    }
    assert!(!written(&client, &data, "s1#99").await);

    // After a takeover the old owner can write nothing, and the resume point stays put.
    let b = table.clone().with_clock(Arc::new(SkewedClock { inner: SystemClock, offset_ms: 22_000 }));
    let new = b.acquire("s1", "b").await.unwrap();
    assert_eq!((new.fence, new.last_seq), (2, Some(2)));
    match fenced_write_with_checkpoint(&client, &config, &lease, now(), 3, vec![put(3, lease.fence)]).await {
        Err(Error::Lost { .. }) => {}
        other => panic!("expected Lost, got {other:?}"),
    }
    assert!(!written(&client, &data, "s1#3").await);
    assert_eq!(table.get("s1").await.unwrap().unwrap().last_seq, Some(2));
}

/// A hint queue that never answers (a lost connection, an SQS client without timeouts) cannot
/// hold a worker's shutdown: its long poll counts as failed `POLL_ANSWER_MARGIN` after the wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hint_queue_that_never_answers_does_not_hold_shutdown() {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = silent.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let listener = {
        let accepted = accepted.clone();
        tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((connection, _)) = silent.accept().await {
                accepted.fetch_add(1, Ordering::SeqCst);
                open.push(connection);
            }
        })
    };
    let config = aws_sdk_sqs::Config::builder()
        .behavior_version_latest()
        .region(aws_sdk_sqs::config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_sqs::config::Credentials::new("testing", "testing", None, None, "test"))
        .endpoint_url(format!("http://{address}"))
        .build();
    let wait = Duration::from_secs(1);
    let worker = Worker::builder(Arc::new(memory_store(short_config())))
        .hint_queue(aws_sdk_sqs::Client::from_conf(config), format!("http://{address}/123456789012/hints"))
        .hint_wait(wait)
        .metrics_writer(Lines::default())
        .build(|conn: Connection| async move {
            conn.cancelled().await;
            Ok::<(), BoxError>(())
        })
        .unwrap();
    let (handle, task) = worker.spawn();
    wait_until(Duration::from_secs(10), "a long poll sent to the silent queue", || {
        accepted.load(Ordering::SeqCst) >= 1
    })
    .await;
    handle.shutdown();
    let limit = wait + POLL_ANSWER_MARGIN + Duration::from_secs(5);
    tokio::time::timeout(limit, task).await.expect("shutdown held by a poll nobody answers").unwrap();
    listener.abort();
}
