//! The handlers against DynamoDB and SQS on the local engine (moto). Each test makes its own table
//! and queue. Skipped when `AWS_ENDPOINT_URL` is unset, unless `LEASELOCK_REQUIRE_SERVICES=1`.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::*;
use lambda_runtime::{Context, LambdaEvent};
use leaselock::{DesiredState, LeaseStore, LeaseTable, TableConfig};
use leaselock_lambdas::{reconciler, EmfWriter};
use serde_json::Value;

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

#[tokio::test]
async fn router_start_twice_then_stop_settles_the_same_through_every_kind() {
    let Some(sdk) = services("router_start_twice_then_stop_settles_the_same_through_every_kind").await else { return };
    let store = table(&sdk, TableConfig::new(unique_name("ll-router"))).await;
    let hints = queue(&sdk).await;
    for kind in KINDS {
        let id = format!("stream-{kind:?}");
        let item = start_twice_then_stop(kind, &store, &hints, &id).await;
        assert_eq!(Settled::from(&item), expected_settled(&id), "{kind:?}");
    }
    // Two STARTs per kind, each with its hint on the queue, and nothing else.
    let received = receive_hints(&hints, 6, Duration::from_secs(30)).await;
    let mut per_id: BTreeMap<String, usize> = BTreeMap::new();
    for hint in received {
        *per_id.entry(hint.connection_id).or_default() += 1;
    }
    let expected: BTreeMap<String, usize> = KINDS.iter().map(|k| (format!("stream-{k:?}"), 2)).collect();
    assert_eq!(per_id, expected);
}

#[tokio::test]
async fn router_refuses_malformed_requests_and_writes_nothing() {
    let Some(sdk) = services("router_refuses_malformed_requests_and_writes_nothing").await else { return };
    let store = table(&sdk, TableConfig::new(unique_name("ll-malformed"))).await;
    let hints = queue(&sdk).await;
    for kind in KINDS {
        malformed_writes_nothing(kind, &store, &hints).await;
    }
    assert!(store.items().await.unwrap().is_empty(), "a scan finds nothing");
    assert_eq!(queue_depth(&hints).await, 0, "no hint was sent");
    assert_eq!(receive_bodies(&hints, 1).await, Vec::<String>::new(), "a receive finds nothing");
    // STOP of an id that was never started: refused, and still nothing written.
    for kind in KINDS {
        let expected = if kind == Kind::Sqs { Verdict::Done } else { Verdict::NotFound };
        assert_eq!(verdict(kind, invoke(&store, &hints, stop_event(kind, "nobody")).await), expected, "{kind:?}");
    }
    assert!(store.items().await.unwrap().is_empty(), "STOP of an unknown id must not create it");
}

#[tokio::test]
async fn router_refuses_hostile_ids_and_urls_and_writes_nothing() {
    let Some(sdk) = services("router_refuses_hostile_ids_and_urls_and_writes_nothing").await else { return };
    let store = table(&sdk, TableConfig::new(unique_name("ll-hostile"))).await;
    let hints = queue(&sdk).await;
    for kind in KINDS {
        let sent = hostile_writes_nothing(kind, &store, &hints).await;
        assert!(sent >= 30, "{kind:?}: only {sent} cases");
    }
    assert!(store.items().await.unwrap().is_empty(), "a scan finds nothing");
    assert_eq!(receive_bodies(&hints, 1).await, Vec::<String>::new(), "no hint was sent");
    // The same table and queue do take a good request: the checks above could see one.
    assert_eq!(
        verdict(Kind::Direct, invoke(&store, &hints, start_command("s1", "wss://feed.example/s1")).await),
        Verdict::Done
    );
    assert_eq!(store.items().await.unwrap().len(), 1);
    assert_eq!(receive_bodies(&hints, 5).await, vec![leaselock::Hint::new("s1").to_json()]);
}

#[tokio::test]
async fn router_serves_the_sample_http_events() {
    let Some(sdk) = services("router_serves_the_sample_http_events").await else { return };
    let store = table(&sdk, TableConfig::new(unique_name("ll-http"))).await;
    let hints = queue(&sdk).await;
    let body = |v: Value| -> (u64, Value) {
        (v["statusCode"].as_u64().unwrap(), serde_json::from_str(v["body"].as_str().unwrap()).unwrap())
    };
    let (status, _) = body(invoke(&store, &hints, sample("http-get.json")).await.unwrap());
    assert_eq!(status, 404);
    let (status, started) = body(invoke(&store, &hints, sample("http-start.json")).await.unwrap());
    assert_eq!(
        (status, started["desired_state"].as_str(), started["hint_sent"].as_bool()),
        (200, Some("STARTED"), Some(true))
    );
    let (status, got) = body(invoke(&store, &hints, sample("http-get.json")).await.unwrap());
    assert_eq!((status, got["url"].as_str()), (200, Some("wss://feed.example/stream-1")));
    let (status, stopped) = body(invoke(&store, &hints, sample("http-stop.json")).await.unwrap());
    assert_eq!((status, stopped["desired_state"].as_str()), (200, Some("STOPPED")));
    let received = receive_hints(&hints, 1, Duration::from_secs(30)).await;
    assert_eq!(received, vec![leaselock::Hint::new("stream-1")]);
}

/// Seeds `started` STARTED items of which `orphaned` have expired (half never claimed, half
/// abandoned by a crashed owner), plus `stopped` STOPPED items. Returns the orphans' ids.
async fn seed_fleet(store: &LeaseTable, started: usize, orphaned: usize, stopped: usize) -> BTreeSet<String> {
    let now = now_ms();
    let mut items = Vec::new();
    let mut orphans = BTreeSet::new();
    for i in 0..started {
        let id = format!("conn-{i:05}");
        let (expires_at_ms, owner) = if i < orphaned / 2 {
            (0, None)
        } else if i < orphaned {
            (now - 60_000, Some("crashed-worker".to_string()))
        } else {
            (now + 600_000, Some(format!("worker-{}", i % 7)))
        };
        if i < orphaned {
            orphans.insert(id.clone());
        }
        items.push(Seed { id, state: DesiredState::Started, expires_at_ms, owner });
    }
    for i in 0..stopped {
        items.push(Seed { id: format!("gone-{i:04}"), state: DesiredState::Stopped, expires_at_ms: 0, owner: None });
    }
    seed(store, items).await;
    orphans
}

#[tokio::test]
async fn reconciler_hints_exactly_the_expired_and_emits_metrics() {
    let Some(sdk) = services("reconciler_hints_exactly_the_expired_and_emits_metrics").await else { return };
    let name = unique_name("ll-reconcile");
    let store = table(&sdk, TableConfig::new(&name).key_prefix("app1/")).await;
    let hints = queue(&sdk).await;
    let orphans = seed_fleet(&store, 1000, 400, 50).await;
    // Another application shares the table under its own prefix: never hinted, never counted.
    let neighbour = LeaseTable::new(store.client().clone(), TableConfig::new(&name).key_prefix("app2/")).unwrap();
    seed_fleet(&neighbour, 30, 30, 5).await;
    // A leader key has no desired state, so the sparse index never shows it.
    store.acquire("leader/main", "worker-1").await.unwrap();
    let before = store.items().await.unwrap();

    let metrics = EmfWriter::new("leaselock-test", "reconciler", Vec::new());
    let event = LambdaEvent::new(sample("schedule.json"), Context::default());
    let report = reconciler::handle(event, &store, &hints, &metrics).await.unwrap();
    assert_eq!(report["orphans"], 400);
    assert_eq!(report["hints_sent"], 400);
    assert_eq!(report["hints_failed"], 0);
    assert_eq!(report["started"], 1000);
    assert_eq!(report["owned"], 600);
    assert_eq!(report["stopped"], 50);

    let received = receive_hints(&hints, 400, Duration::from_secs(60)).await;
    assert_eq!(received.len(), 400, "exactly one hint per orphan");
    let hinted: BTreeSet<String> = received.into_iter().map(|h| h.connection_id).collect();
    assert_eq!(hinted, orphans);

    let line = String::from_utf8(metrics.into_inner()).unwrap();
    let emf: Value = serde_json::from_str(line.trim()).unwrap();
    assert_eq!(emf["_aws"]["CloudWatchMetrics"][0]["Namespace"], "leaselock-test");
    assert_eq!(emf["Service"], "reconciler");
    assert_eq!(
        (emf["Orphans"].as_u64(), emf["Started"].as_u64(), emf["Stopped"].as_u64(), emf["HintsSent"].as_u64()),
        (Some(400), Some(1000), Some(50), Some(400))
    );
    assert_eq!(store.items().await.unwrap(), before, "the reconciler never writes a lease");
}

/// With the orphan index sharded (`LEASELOCK_ORPHAN_SHARDS`), the reconciler finds the orphans of
/// every shard and its counts add every shard; the router's START writes the item's shard value.
#[tokio::test]
async fn reconciler_and_router_follow_a_sharded_orphan_index() {
    let Some(sdk) = services("reconciler_and_router_follow_a_sharded_orphan_index").await else { return };
    let store = table(&sdk, TableConfig::new(unique_name("ll-shards")).orphan_shards(16)).await;
    let hints = queue(&sdk).await;
    let orphans = seed_fleet(&store, 300, 120, 10).await;
    let shards: BTreeSet<u32> = orphans.iter().map(|id| leaselock::orphan_shard_of(id, 16)).collect();
    assert_eq!(shards.len(), 16, "the orphans cover every shard");

    let metrics = EmfWriter::new("leaselock-test", "reconciler", Vec::new());
    let event = LambdaEvent::new(sample("schedule.json"), Context::default());
    let report = reconciler::handle(event, &store, &hints, &metrics).await.unwrap();
    assert_eq!(
        (report["orphans"].as_u64(), report["started"].as_u64(), report["owned"].as_u64(), report["stopped"].as_u64()),
        (Some(120), Some(300), Some(180), Some(10))
    );
    let received = receive_hints(&hints, 120, Duration::from_secs(60)).await;
    let hinted: BTreeSet<String> = received.into_iter().map(|h| h.connection_id).collect();
    assert_eq!(hinted, orphans);

    // START through the router: the stored value is the id's shard.
    let start = serde_json::json!({"action": "START", "connection_id": "late-1", "url": "wss://feed.example/late-1"});
    leaselock_lambdas::router::handle(LambdaEvent::new(start, Context::default()), &store, &hints).await.unwrap();
    let raw = store
        .client()
        .get_item()
        .table_name(&store.config().table_name)
        .key(&store.config().attributes.id, aws_sdk_dynamodb::types::AttributeValue::S(store.config().key("late-1")))
        .consistent_read(true)
        .send()
        .await
        .unwrap();
    let state = raw.item().unwrap()["desired_state"].as_s().unwrap().clone();
    assert_eq!(state, format!("STARTED#{}", leaselock::orphan_shard_of("late-1", 16)));
    assert_eq!(store.get("late-1").await.unwrap().unwrap().desired_state, Some(DesiredState::Started));
}

/// 10,000 orphans, every hint delivered to a fleet that drains the queue meanwhile, with the
/// Lambda's default 16 batches in flight. `lambdas/bench.sh` times the same run and records it.
#[tokio::test]
async fn reconciler_hints_ten_thousand_orphans() {
    let Some(sdk) = services("reconciler_hints_ten_thousand_orphans").await else { return };
    let store = table(&sdk, TableConfig::new(unique_name("ll-10k"))).await;
    let hints = queue(&sdk).await;
    let seeded = Instant::now();
    let orphans = seed_fleet(&store, 10_000, 10_000, 0).await;
    eprintln!("seeded 10,000 orphans in {:?}", seeded.elapsed());
    let fleet = drain(&hints, 10_000, 8, 1, Duration::from_secs(300));
    let started = Instant::now();
    let report = reconciler::reconcile(&store, &hints).await.unwrap();
    let took = started.elapsed();
    let received = fleet.await.unwrap();
    eprintln!("reconciled {} orphans in {took:?}; every hint received after {:?}", report.orphans, started.elapsed());
    assert_eq!((report.orphans, report.hints_sent, report.hints_failed), (10_000, 10_000, 0));
    // SQS delivers at least once.
    eprintln!("{} messages received for {} orphans", received.len(), orphans.len());
    assert_eq!(received.into_iter().collect::<BTreeSet<_>>(), orphans, "a hint for every orphan");
    // A guard against the run going quadratic; the bench measures it against the 30 s budget.
    assert!(took < Duration::from_secs(180), "took {took:?}");
}

/// Session mode: the connections of a dead session (one that stopped renewing, one that ended)
/// are orphans and get hinted; those of a live session are not, though their items look alike
/// (the held sentinel expiry).
#[tokio::test]
async fn reconciler_hints_dead_sessions_work_and_not_live_ones() {
    let Some(sdk) = services("reconciler_hints_dead_sessions_work_and_not_live_ones").await else { return };
    let name = unique_name("ll-sessions");
    let config = TableConfig::new(&name).mode(leaselock::LeaseMode::Session);
    let store = table(&sdk, config.clone()).await;
    let hints = queue(&sdk).await;
    // The crashed worker's sessions last 4 s (room for its claims on a slow engine: a claim
    // past the session's deadline is refused); the live one has the default 20 s.
    let short = config
        .clone()
        .lease_duration(Duration::from_secs(4))
        .renew_interval(Duration::from_secs(1))
        .clock_skew(Duration::from_millis(100));
    let crashed_store = LeaseTable::new(store.client().clone(), short).unwrap();
    for i in 0..9 {
        store.start(&format!("conn-{i}"), &format!("wss://feed.example/conn-{i}")).await.unwrap();
    }
    let crashed = crashed_store.create_session("crashed", None).await.unwrap();
    let left = store.create_session("left", None).await.unwrap();
    let live = store.create_session("live", None).await.unwrap();
    let mut dead_work = BTreeSet::new();
    for i in 0..3 {
        crashed_store.claim_in_session(&format!("conn-{i}"), &crashed).await.unwrap();
    }
    for i in 0..3 {
        store.claim_in_session(&format!("conn-{}", i + 3), &left).await.unwrap();
        store.claim_in_session(&format!("conn-{}", i + 6), &live).await.unwrap();
        dead_work.extend([format!("conn-{i}"), format!("conn-{}", i + 3)]);
    }
    // `left` ends (expiry 0, dead at once); `crashed` stops renewing and expires beyond the skew.
    store.end_session(&left).await.unwrap();
    let until = Instant::now() + Duration::from_secs(15);
    loop {
        let cutoff = leaselock::lease::claim_cutoff(now_ms(), store.config());
        let dead: BTreeSet<String> = store.sessions(cutoff).await.unwrap().into_iter().map(|s| s.owner).collect();
        if dead.contains("crashed") {
            assert!(!dead.contains("live"), "a live session listed as dead");
            break;
        }
        assert!(Instant::now() < until, "the crashed session never expired: {dead:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let before = store.items().await.unwrap();

    let report = reconciler::reconcile(&store, &hints).await.unwrap();
    assert_eq!((report.dead_session_work, report.orphans, report.hints_sent), (6, 6, 6));
    let received = receive_hints(&hints, 6, Duration::from_secs(30)).await;
    let hinted: BTreeSet<String> = received.into_iter().map(|h| h.connection_id).collect();
    assert_eq!(hinted, dead_work, "exactly the dead sessions' connections");
    assert_eq!(queue_depth(&hints).await, 0, "nothing else hinted");
    assert_eq!(store.items().await.unwrap(), before, "the reconciler never writes a lease");
}
