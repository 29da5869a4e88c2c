//! The DynamoDB store against the local engine: exclusivity, expiry and fencing, release,
//! checkpoints, the orphan index, batched reads and input validation.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use leaselock::{Clock, DesiredState, Error, LeaseStore, ManualClock, TableConfig};

const T0: u64 = 1_800_000_000_000;

fn config() -> TableConfig {
    TableConfig::new("leases")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_claimers_one_winner_per_round() {
    let Some(table) = common::table(config(), None).await else { return };
    let table = Arc::new(table);
    for round in 0..50u64 {
        let barrier = Arc::new(tokio::sync::Barrier::new(16));
        let tasks: Vec<_> = (0..16)
            .map(|w| {
                let (table, barrier) = (table.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    table.acquire("contended", &format!("worker-{w}")).await
                })
            })
            .collect();
        let mut winners = Vec::new();
        for task in tasks {
            match task.await.unwrap() {
                Ok(lease) => winners.push(lease),
                Err(Error::Held { .. }) => {}
                Err(e) => panic!("round {round}: unexpected {e}"),
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: {} winners", winners.len());
        assert_eq!(winners[0].fence, round + 1, "fence counts every claim");
        table.release(&winners[0]).await.unwrap();
    }
}

#[tokio::test]
async fn expired_lease_is_taken_only_after_skew_and_the_old_owner_is_fenced() {
    // Two workers: A's clock stands still (a paused process), B's moves on.
    let clock_a = Arc::new(ManualClock::new(T0));
    let clock_b = Arc::new(ManualClock::new(T0));
    let Some(table_a) = common::table(config(), Some(clock_a.clone())).await else { return };
    let table_b = table_a.clone().with_clock(clock_b.clone());

    table_a.start("s1", "wss://feed.example/s1").await.unwrap();
    let mut lease_a = table_a.acquire("s1", "a").await.unwrap();
    table_a.checkpoint(&mut lease_a, 10).await.unwrap();
    assert_eq!((lease_a.fence, lease_a.expires_at_ms), (1, T0 + 20_000));

    // At exactly expiry + skew the lease is still A's.
    clock_b.advance(20_000 + 1_000);
    match table_b.acquire("s1", "b").await {
        Err(Error::Held { owner, expires_at_ms }) => assert_eq!((owner.as_str(), expires_at_ms), ("a", T0 + 20_000)),
        other => panic!("expected Held, got {other:?}"),
    }
    clock_b.advance(1);
    let lease_b = table_b.acquire("s1", "b").await.unwrap();
    assert_eq!(lease_b.fence, 2);
    assert_eq!(lease_b.last_seq, Some(10), "the new owner resumes from the checkpoint");

    let before = table_b.get("s1").await.unwrap().unwrap();
    // A still believes its deadline is ahead, so these reach DynamoDB, which refuses them.
    assert!(matches!(table_a.renew(&mut lease_a.clone()).await, Err(Error::Lost { .. })));
    assert!(matches!(table_a.checkpoint(&mut lease_a.clone(), 11).await, Err(Error::Lost { .. })));
    assert!(matches!(table_a.release(&lease_a).await, Err(Error::Lost { .. })));
    assert_eq!(table_b.get("s1").await.unwrap().unwrap(), before, "the old owner changed nothing");
}

#[tokio::test]
async fn an_owner_past_its_deadline_stops_without_writing() {
    let clock = Arc::new(ManualClock::new(T0));
    let Some(table) = common::table(config(), Some(clock.clone())).await else { return };
    let mut lease = table.acquire("s1", "a").await.unwrap();
    clock.advance(20_000 - 1_000);
    let before = table.get("s1").await.unwrap();
    assert!(matches!(table.renew(&mut lease).await, Err(Error::Lost { .. })));
    assert!(matches!(table.checkpoint(&mut lease, 5).await, Err(Error::Lost { .. })));
    assert_eq!(table.get("s1").await.unwrap(), before);
}

#[tokio::test]
async fn renew_extends_from_send_time_and_reports_desired_state() {
    let clock = Arc::new(ManualClock::new(T0));
    let Some(table) = common::table(config(), Some(clock.clone())).await else { return };
    table.start("s1", "ws://127.0.0.1:9/s1").await.unwrap();
    let mut lease = table.acquire("s1", "a").await.unwrap();
    assert_eq!(lease.deadline_mono_ms, 19_000);
    clock.advance(5_000);
    table.renew(&mut lease).await.unwrap();
    assert_eq!((lease.expires_at_ms, lease.deadline_mono_ms, lease.fence), (T0 + 25_000, 24_000, 1));
    table.stop("s1").await.unwrap();
    table.renew(&mut lease).await.unwrap();
    assert_eq!(lease.desired_state, Some(DesiredState::Stopped));
    let item = table.get("s1").await.unwrap().unwrap();
    assert!(item.ttl.is_some(), "stopped work gets a cleanup TTL");
}

#[tokio::test]
async fn release_makes_it_claimable_at_once_and_checkpoints_only_move_forward() {
    let clock = Arc::new(ManualClock::new(T0));
    let Some(table) = common::table(config(), Some(clock.clone())).await else { return };
    let mut lease = table.acquire("s1", "a").await.unwrap();
    table.checkpoint(&mut lease, 5).await.unwrap();
    for stale in [5, 4, 0] {
        match table.checkpoint(&mut lease, stale).await {
            Err(Error::SeqNotIncreasing { last_seq: 5, seq, .. }) => assert_eq!(seq, stale),
            other => panic!("checkpoint {stale}: {other:?}"),
        }
    }
    table.checkpoint(&mut lease, 6).await.unwrap();
    assert!(matches!(table.acquire("s1", "b").await, Err(Error::Held { .. })));
    table.release(&lease).await.unwrap();
    let next = table.acquire("s1", "b").await.unwrap();
    assert_eq!((next.fence, next.last_seq, next.owner.as_str()), (2, Some(6), "b"));
    assert!(matches!(table.release(&lease).await, Err(Error::Lost { .. })), "a released lease is gone");
}

#[tokio::test]
async fn stopped_work_is_not_claimed_and_stop_needs_an_item() {
    let Some(table) = common::table(config(), None).await else { return };
    table.start("s1", "wss://feed.example/s1").await.unwrap();
    table.stop("s1").await.unwrap();
    assert!(matches!(table.acquire("s1", "a").await, Err(Error::Stopped { .. })));
    assert!(matches!(table.stop("missing").await, Err(Error::NotFound { .. })));
    assert_eq!(table.get("missing").await.unwrap(), None);
    // STARTing again makes it claimable, and a repeated START leaves the owner alone.
    table.start("s1", "wss://feed.example/s1").await.unwrap();
    let lease = table.acquire("s1", "a").await.unwrap();
    let item = table.start("s1", "wss://feed.example/s1").await.unwrap();
    assert_eq!((item.owner.as_deref(), item.fence, item.ttl), (Some("a"), lease.fence, None));
}

#[tokio::test]
async fn orphans_are_exactly_the_started_and_expired_items_across_pages() {
    let clock = Arc::new(ManualClock::new(T0));
    let Some(table) = common::table(config(), Some(clock.clone())).await else { return };
    let table = Arc::new(table);
    let mut expected = BTreeSet::new();
    // 130 started and claimed (they will expire), 60 started never claimed (expiry 0),
    // 40 stopped and expired, 30 leader-style keys (no desired state), expired.
    let mut jobs = Vec::new();
    for i in 0..130 {
        expected.insert(format!("run-{i:03}"));
        jobs.push((format!("run-{i:03}"), true, true));
    }
    for i in 0..60 {
        expected.insert(format!("new-{i:03}"));
        jobs.push((format!("new-{i:03}"), true, false));
    }
    for i in 0..40 {
        jobs.push((format!("stopped-{i:03}"), true, true));
    }
    for i in 0..30 {
        jobs.push((format!("leader/{i:03}"), false, true));
    }
    run_concurrently(jobs, |(id, start, claim)| {
        let table = table.clone();
        async move {
            if start {
                table.start(&id, &format!("wss://feed.example/{id}")).await.unwrap();
            }
            if claim {
                table.acquire(&id, "w1").await.unwrap();
            }
        }
    })
    .await;
    run_concurrently((0..40).map(|i| format!("stopped-{i:03}")).collect(), |id| {
        let table = table.clone();
        async move {
            table.stop(&id).await.unwrap();
        }
    })
    .await;

    // Nothing has expired yet: only never-claimed work is orphaned.
    let cutoff = leaselock::lease::claim_cutoff(clock.now_ms(), table.config());
    let early: BTreeSet<_> = table.orphans(cutoff, None).await.unwrap().into_iter().map(|i| i.id).collect();
    assert_eq!(early, expected.iter().filter(|id| id.starts_with("new-")).cloned().collect());

    // 100 more, held now by a second worker, must not show up after the others expire.
    clock.advance(21_001);
    run_concurrently((0..100).map(|i| format!("held-{i:03}")).collect(), |id| {
        let table = table.clone();
        async move {
            table.start(&id, "wss://feed.example/h").await.unwrap();
            table.acquire(&id, "w2").await.unwrap();
        }
    })
    .await;
    let cutoff = leaselock::lease::claim_cutoff(clock.now_ms(), table.config());
    let mut seen = Vec::new();
    let mut after = None;
    let mut pages = 0;
    loop {
        let page = table.orphans_page(cutoff, 25, after).await.unwrap();
        pages += 1;
        seen.extend(page.items);
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert!(pages >= 8, "{pages} pages of 25");
    let ids: BTreeSet<_> = seen.iter().map(|i| i.id.clone()).collect();
    assert_eq!(ids.len(), seen.len(), "no item twice");
    assert_eq!(ids, expected, "exactly the started, expired items");
    assert!(seen.windows(2).all(|w| w[0].expires_at_ms <= w[1].expires_at_ms), "oldest first");
    assert_eq!(table.orphans(cutoff, Some(7)).await.unwrap().len(), 7);
    assert_eq!(table.owned_by("w2").await.unwrap().len(), 100);
    assert!(table.owned_by("w1").await.unwrap().is_empty(), "w1's leases have expired");
}

#[tokio::test]
async fn batch_desired_states_reads_any_number_of_ids() {
    let Some(table) = common::table(config(), None).await else { return };
    let table = Arc::new(table);
    let ids: Vec<String> = (0..260).map(|i| format!("id-{i:03}")).collect();
    run_concurrently(ids[..250].to_vec(), |id| {
        let table = table.clone();
        async move {
            table.start(&id, "wss://feed.example/x").await.unwrap();
            if id.ends_with('7') {
                table.stop(&id).await.unwrap();
            }
        }
    })
    .await;
    let mut query = ids.clone();
    query.extend(ids[..5].iter().cloned()); // repeats are fine
    let states = table.batch_desired_states(&query).await.unwrap();
    assert_eq!(states.len(), 260);
    for (i, id) in ids.iter().enumerate() {
        let want = match i {
            250.. => None,
            _ if id.ends_with('7') => Some(DesiredState::Stopped),
            _ => Some(DesiredState::Started),
        };
        assert_eq!(states[id], want, "{id}");
    }
    assert!(table.batch_desired_states(&[]).await.unwrap().is_empty());
}

#[tokio::test]
async fn bad_input_names_the_field_and_writes_nothing() {
    let Some(table) = common::table(config(), None).await else { return };
    let long = "x".repeat(1025);
    let cases: Vec<(&str, leaselock::Result<()>)> = vec![
        ("id", table.start("", "wss://a.example/").await.map(drop)),
        ("id", table.start(&long, "wss://a.example/").await.map(drop)),
        ("url", table.start("s1", "https://a.example/").await.map(drop)),
        ("url", table.start("s1", "wss://").await.map(drop)),
        ("id", table.acquire("", "w").await.map(drop)),
        ("owner", table.acquire("s1", "").await.map(drop)),
        ("id", table.stop(&long).await.map(drop)),
        ("id", table.batch_desired_states(&["ok".into(), String::new()]).await.map(drop)),
    ];
    for (field, result) in cases {
        match result {
            Err(Error::InvalidInput { field: named, message }) => assert_eq!(named, field, "{message:?}"),
            other => panic!("expected InvalidInput naming {field}, got {other:?}"),
        }
    }
    assert!(table.items().await.unwrap().is_empty(), "nothing was written");
    let bad = TableConfig::new("leases").lease_duration(Duration::from_millis(1500));
    match leaselock::LeaseTable::new(table.client().clone(), bad) {
        Err(Error::InvalidInput { field, message }) => assert_eq!(field, "lease_duration", "{message}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn key_prefixes_keep_applications_apart() {
    let clock = Arc::new(ManualClock::new(T0));
    let Some(app1) = common::table(config().key_prefix("app1/"), Some(clock.clone())).await else { return };
    let app2 = leaselock::LeaseTable::new(app1.client().clone(), app1.config().clone().key_prefix("app2/"))
        .unwrap()
        .with_clock(clock.clone());
    app1.start("s1", "wss://a.example/1").await.unwrap();
    app2.start("s1", "wss://a.example/2").await.unwrap();
    app2.start("s2", "wss://a.example/2").await.unwrap();
    let l1 = app1.acquire("s1", "w").await.unwrap();
    let l2 = app2.acquire("s1", "w").await.unwrap();
    assert_eq!((l1.fence, l2.fence), (1, 1), "same id, different items");
    let cutoff = leaselock::lease::claim_cutoff(clock.now_ms(), app1.config());
    let ids = |items: Vec<leaselock::LeaseItem>| items.into_iter().map(|i| i.id).collect::<Vec<_>>();
    assert_eq!(ids(app2.orphans(cutoff, None).await.unwrap()), vec!["s2"]);
    assert!(app1.orphans(cutoff, None).await.unwrap().is_empty());
    assert_eq!(ids(app1.items().await.unwrap()), vec!["s1"]);
    let raw = app1.client().scan().table_name(&app1.config().table_name).send().await.unwrap();
    let keys: BTreeSet<_> = raw.items().iter().map(|i| i["connection_id"].as_s().unwrap().clone()).collect();
    assert_eq!(keys, ["app1/s1", "app2/s1", "app2/s2"].map(String::from).into());
}

/// Runs `f` over `inputs`, 8 at a time.
async fn run_concurrently<T, F, Fut>(inputs: Vec<T>, f: F)
where
    F: Fn(T) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    use futures::StreamExt;
    futures::stream::iter(inputs.into_iter().map(f)).buffer_unordered(8).collect::<Vec<()>>().await;
}
