//! Election on the lease store: in-process checks on the memory store, then real processes
//! contending on the local engine (DynamoDB).

mod common;
mod election_support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use election_support::Setup;
use leaselock::election::{
    Candidate, ElectionBackend, ElectionOptions, LeaderElector, MemoryRegistry, Outcome, StoreElection, Strategy,
    TermEnd,
};
use leaselock::{DynamoRegistry, LeaseStore, MemoryStore, SystemClock, TableConfig};

/// The body of every contender process these tests start.
#[test]
#[ignore = "run as a child process by the election tests"]
fn contender() {
    election_support::contender_main();
}

fn memory(lease_ms: u64) -> (MemoryStore, Arc<dyn ElectionBackend>) {
    let config = TableConfig::new("leases")
        .lease_duration(Duration::from_millis(lease_ms))
        .renew_interval(Duration::from_millis(lease_ms / 4))
        .clock_skew(Duration::from_millis(lease_ms / 10));
    let store = MemoryStore::new(config, Arc::new(SystemClock)).unwrap();
    let backend = StoreElection::new(store.clone(), MemoryRegistry::new(Arc::new(SystemClock)));
    (store, Arc::new(backend))
}

fn elector(backend: &Arc<dyn ElectionBackend>, owner: &str, options: ElectionOptions) -> LeaderElector {
    LeaderElector::new(backend.clone(), owner, options).unwrap()
}

#[tokio::test]
async fn a_contender_is_skipped_while_the_leader_runs_and_fences_increase() {
    let (store, backend) = memory(2_000);
    let a = elector(&backend, "a", ElectionOptions::default());
    let b = elector(&backend, "b", ElectionOptions::default());
    let out = a
        .run_if_leader("job", |term| {
            let b = b.clone();
            async move {
                let inner = b.run_if_leader("job", |_| async { unreachable!("b must not run") }).await.unwrap();
                (term.fence(), inner)
            }
        })
        .await
        .unwrap();
    let Outcome::Led { fence, value: (seen, inner), end } = out else { panic!("a leads") };
    assert_eq!((fence, seen, end), (1, 1, TermEnd::Finished));
    assert_eq!(inner, Outcome::Skipped { holder: Some("a".into()) });
    // Released: the next leader runs at once with the next fence; the key has no desired state.
    let out = b.run_if_leader("job", |term| async move { term.fence() }).await.unwrap();
    assert!(matches!(out, Outcome::Led { fence: 2, value: 2, .. }));
    let item = store.get("leader/job").await.unwrap().unwrap();
    assert_eq!((item.desired_state, item.expires_at_ms), (None, Some(0)));
    assert!(store.orphans(u64::MAX / 2, None).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_waiting_contender_runs_once_the_leader_is_done() {
    let (_, backend) = memory(2_000);
    let a = elector(&backend, "a", ElectionOptions::default());
    let b = elector(
        &backend,
        "b",
        ElectionOptions::default().wait(Duration::from_secs(3)).retry_delay(Duration::from_millis(50)),
    );
    let started = Instant::now();
    // b contends once a leads (told by a's action, not by a guess at how long a takes to claim).
    let (leading, led) = tokio::sync::oneshot::channel();
    let (ra, rb) = tokio::join!(
        a.run_if_leader("job", |_| async move {
            let _ = leading.send(());
            tokio::time::sleep(Duration::from_millis(300)).await;
        }),
        async {
            led.await.expect("a leads");
            b.run_if_leader("job", |t| async move { t.fence() }).await
        }
    );
    assert!(matches!(ra.unwrap(), Outcome::Led { fence: 1, .. }));
    assert!(matches!(rb.unwrap(), Outcome::Led { value: 2, .. }));
    assert!(started.elapsed() >= Duration::from_millis(300));
}

#[tokio::test]
async fn the_minimum_lease_outlives_a_short_action() {
    let (_, backend) = memory(1_000);
    let opts =
        ElectionOptions::default().min_lease(Duration::from_millis(1_800)).retry_delay(Duration::from_millis(40));
    let a = elector(&backend, "a", opts.clone());
    let b = elector(&backend, "b", opts.wait(Duration::from_secs(5)));
    let claimed = Instant::now();
    assert!(matches!(a.run_if_leader("job", |_| async {}).await.unwrap(), Outcome::Led { .. }));
    let second = b.run_if_leader("job", |_| async { Instant::now() }).await.unwrap();
    let Outcome::Led { value: ran_at, .. } = second else { panic!("b runs in the end") };
    assert!(ran_at - claimed >= Duration::from_millis(1_800), "{:?}", ran_at - claimed);
}

#[tokio::test]
async fn a_lost_lease_cancels_the_action() {
    let (store, backend) = memory(1_000);
    let a = elector(&backend, "a", ElectionOptions::default());
    let out = a
        .run_if_leader("job", |term| {
            let store = store.clone();
            async move {
                // Someone takes the lease over (released, then claimed with the next fence).
                store.release(term.lease()).await.unwrap();
                store.acquire("leader/job", "thief").await.unwrap();
                let started = Instant::now();
                term.cancelled().await;
                assert!(term.is_cancelled());
                started.elapsed()
            }
        })
        .await
        .unwrap();
    let Outcome::Led { value: waited, end, .. } = out else { panic!("led") };
    assert_eq!(end, TermEnd::Lost);
    // Noticed at the first renewal (a quarter of the lease), well before the deadline.
    assert!(waited < Duration::from_millis(900), "{waited:?}");
}

#[tokio::test]
async fn the_deadline_cancels_an_action_whose_renewals_cannot_get_through() {
    // A backend whose renewals never answer: the term must end at sent_at + lease - skew.
    struct Silent(Arc<dyn ElectionBackend>);
    #[async_trait::async_trait]
    impl ElectionBackend for Silent {
        fn timing(&self) -> leaselock::election::Timing {
            self.0.timing()
        }
        fn clock(&self) -> &dyn leaselock::Clock {
            self.0.clock()
        }
        async fn claim(&self, key: &str, owner: &str) -> leaselock::Result<leaselock::Lease> {
            self.0.claim(key, owner).await
        }
        async fn claim_slot(&self, key: &str, slots: u32, owner: &str) -> leaselock::Result<leaselock::Lease> {
            self.0.claim_slot(key, slots, owner).await
        }
        async fn renew(&self, _: &mut leaselock::Lease) -> leaselock::Result<()> {
            std::future::pending().await
        }
        async fn release(&self, lease: &leaselock::Lease) -> leaselock::Result<()> {
            self.0.release(lease).await
        }
        async fn register(&self, e: &str, c: &Candidate, ttl: Duration) -> leaselock::Result<()> {
            self.0.register(e, c, ttl).await
        }
        async fn withdraw(&self, e: &str, id: &str) -> leaselock::Result<()> {
            self.0.withdraw(e, id).await
        }
        async fn candidates(&self, e: &str) -> leaselock::Result<Vec<Candidate>> {
            self.0.candidates(e).await
        }
    }
    let (_, inner) = memory(1_000);
    let backend: Arc<dyn ElectionBackend> = Arc::new(Silent(inner));
    let a = elector(&backend, "a", ElectionOptions::default());
    let started = Instant::now();
    let out = a
        .run_if_leader("job", |term| async move {
            term.cancelled().await;
            term.deadline_mono_ms()
        })
        .await
        .unwrap();
    assert!(matches!(out, Outcome::Led { end: TermEnd::Lost, .. }));
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(880) && took < Duration::from_millis(1_000), "{took:?}");
}

#[tokio::test]
async fn a_group_admits_at_most_its_slots() {
    let (_, backend) = memory(2_000);
    let running = Arc::new(AtomicU32::new(0));
    let most = Arc::new(AtomicU32::new(0));
    let mut tasks = Vec::new();
    for i in 0..9 {
        let e = elector(
            &backend,
            &format!("w{i}"),
            ElectionOptions::default().wait(Duration::from_secs(5)).retry_delay(Duration::from_millis(10)),
        );
        let (running, most) = (running.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            e.run_if_slot("pool", 3, |term| async move {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(30)).await;
                running.fetch_sub(1, Ordering::SeqCst);
                term.slot().unwrap()
            })
            .await
        }));
    }
    for t in tasks {
        let Outcome::Led { value: slot, .. } = t.await.unwrap().unwrap() else {
            panic!("every worker gets a slot in the end")
        };
        assert!(slot < 3);
    }
    assert_eq!(most.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn only_the_strategys_pick_competes() {
    let (_, backend) = memory(2_000);
    let opts = ElectionOptions::default().wait(Duration::from_millis(300)).retry_delay(Duration::from_millis(20));
    let low = elector(&backend, "low", opts.clone());
    let high = elector(&backend, "high", opts);
    // High is a candidate (registered as its heartbeat would) and nobody leads: low, not the
    // pick, does not compete, and its action never runs.
    let candidates = low.candidates_key("svc");
    backend.register(&candidates, &Candidate::new("high", 9.0), Duration::from_secs(10)).await.unwrap();
    let ran = AtomicU32::new(0);
    let a = low
        .run_if_elected("svc", Candidate::new("", 1.0), &Strategy::HighestScore, |_| async {
            ran.fetch_add(1, Ordering::SeqCst);
        })
        .await
        .unwrap();
    assert!(a.is_skipped(), "{a:?}");
    assert_eq!(ran.load(Ordering::SeqCst), 0, "low's action ran although high is the pick");
    // High, the pick, leads.
    let b = high
        .run_if_elected("svc", Candidate::new("", 9.0), &Strategy::HighestScore, |t| async move { t.fence() })
        .await
        .unwrap();
    assert!(matches!(b, Outcome::Led { .. }), "{b:?}");
    let preferred = Strategy::PreferredNode("low".into());
    let out = low.run_if_elected("svc2", Candidate::new("", 1.0), &preferred, |_| async { "ran" }).await.unwrap();
    assert!(matches!(out, Outcome::Led { value: "ran", .. }));
}

fn dynamo_setup(space: String) -> Setup {
    Setup { backend: "dynamo", space, lease_ms: 1_500, renew_ms: 400, skew_ms: 300, retry_ms: 100 }
}

/// A fresh table on the local engine, or `None` when no engine is configured.
fn dynamo_table() -> Option<String> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(common::table(TableConfig::new("election"), None)).map(|t| t.config().table_name.clone())
}

#[tokio::test]
async fn dynamodb_candidate_registry_lists_refreshes_and_forgets() {
    let Some(table) = common::table(TableConfig::new("registry"), None).await else { return };
    let registry = DynamoRegistry::for_table(&table);
    use leaselock::election::CandidateRegistry;
    let ttl = Duration::from_millis(1_500);
    registry.register("candidates/x", &Candidate::new("a", 1.0).meta("zone", "z1"), ttl).await.unwrap();
    // Short, but longer than the three round trips to a loaded engine before the listing.
    registry.register("candidates/x", &Candidate::new("b", 2.0).load(0.5), Duration::from_millis(1_000)).await.unwrap();
    registry.register("candidates/x", &Candidate::new("a", 3.0).meta("zone", "z1"), ttl).await.unwrap();
    let listed = registry.candidates("candidates/x").await.unwrap();
    assert_eq!(listed.iter().map(|c| (c.id.as_str(), c.score)).collect::<Vec<_>>(), [("a", 3.0), ("b", 2.0)]);
    assert_eq!(listed[0].metadata["zone"], "z1");
    assert_eq!(listed[1].load, 0.5);
    // b's short registration runs out; a withdraws.
    let until = Instant::now() + Duration::from_secs(5);
    while registry.candidates("candidates/x").await.unwrap().len() != 1 {
        assert!(Instant::now() < until, "b never ran out");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    registry.withdraw("candidates/x", "a").await.unwrap();
    registry.withdraw("candidates/none", "a").await.unwrap();
    assert!(registry.candidates("candidates/x").await.unwrap().is_empty());
    // The registry item is not fleet work.
    assert!(table.orphans(u64::MAX / 2, None).await.unwrap().is_empty());
}

#[test]
fn dynamodb_200_terms_across_processes_never_two_leaders() {
    let Some(space) = dynamo_table() else { return };
    election_support::leader_terms(&Setup { retry_ms: 60, ..dynamo_setup(space) }, 3, 200);
}

#[test]
fn dynamodb_killed_leader_is_replaced_in_time() {
    let Some(space) = dynamo_table() else { return };
    election_support::killed_leader_replaced(&dynamo_setup(space));
}

#[test]
fn dynamodb_group_never_exceeds_its_slots() {
    let Some(space) = dynamo_table() else { return };
    election_support::group_limit(&dynamo_setup(space), 2);
}

#[test]
fn dynamodb_strategic_election_hands_over_at_term_boundaries() {
    let Some(space) = dynamo_table() else { return };
    election_support::strategic(&dynamo_setup(space), 1_500);
}

#[test]
fn dynamodb_minimum_lease_across_processes() {
    let Some(space) = dynamo_table() else { return };
    election_support::min_lease(&dynamo_setup(space), 2_500);
}

#[test]
fn dynamodb_frozen_leader_is_cancelled_and_fenced_off() {
    let Some(space) = dynamo_table() else { return };
    election_support::frozen_leader(&dynamo_setup(space));
}

/// The stored candidate ids of a registry item, expired ones included.
async fn stored_candidates(table: &leaselock::LeaseTable, election: &str) -> Vec<String> {
    let out = table
        .client()
        .get_item()
        .table_name(&table.config().table_name)
        .key(&table.config().attributes.id, aws_sdk_dynamodb::types::AttributeValue::S(table.config().key(election)))
        .consistent_read(true)
        .send()
        .await
        .unwrap();
    let mut ids: Vec<String> = out
        .item()
        .and_then(|i| i.get(leaselock::protocol::election::CANDIDATES_ATTRIBUTE))
        .and_then(|m| m.as_m().ok())
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default();
    ids.sort();
    ids
}

/// A listing that, between its read and its prune, lets a candidate register again: the
/// interleaving a live re-registration must survive.
struct RegisterBetweenReadAndPrune {
    list: leaselock::protocol::ListCandidates,
    again: Option<leaselock::protocol::request::UpdateItem>,
    prune: Option<leaselock::protocol::Step<Vec<Candidate>>>,
    prunes_sent: Arc<AtomicU32>,
}

impl leaselock::protocol::Operation for RegisterBetweenReadAndPrune {
    type Output = Vec<Candidate>;
    fn next(&mut self, input: leaselock::protocol::Input) -> leaselock::protocol::Step<Vec<Candidate>> {
        use leaselock::protocol::{Answer, Request, Step};
        if let Some(prune) = self.prune.take() {
            assert!(matches!(input.answer, Some(Answer::Ok(_))), "the registration landed: {:?}", input.answer);
            self.prunes_sent.fetch_add(1, Ordering::SeqCst);
            return prune;
        }
        let step = self.list.next(input);
        if let Step::Send { request: Request::UpdateItem(u), .. } = &step {
            if u.update_expression.starts_with("REMOVE") {
                if let Some(again) = self.again.take() {
                    self.prune = Some(step);
                    return Step::Send { request: Request::UpdateItem(again), attempt_timeout_ms: 2_000 };
                }
            }
        }
        step
    }
}

#[tokio::test]
async fn dynamodb_registry_prunes_long_expired_candidates_but_never_a_live_registration() {
    use leaselock::election::CandidateRegistry;
    use leaselock::protocol::election::refresh_request;
    let Some(table) = common::table(TableConfig::new("prune"), None).await else { return };
    // Its waits are timed on this process's clock: the table decides on the same one (the
    // store's clock, as measured, can be behind it by up to its uncertainty, past the margins).
    let table = table.with_clock(Arc::new(SystemClock));
    let grace = Duration::from_millis(1_500);
    let registry = DynamoRegistry::for_table(&table).prune_after(grace);
    let election = "candidates/p";
    let short = Duration::from_millis(100);
    registry.register(election, &Candidate::new("live", 1.0), Duration::from_secs(60)).await.unwrap();
    // Both short registrations run out after `registered + short` and before `done + short`.
    let registered = Instant::now();
    registry.register(election, &Candidate::new("gone", 2.0), short).await.unwrap();
    registry.register(election, &Candidate::new("back", 3.0), short).await.unwrap();
    let done = Instant::now();
    // Expired but within the grace: left out of the listing, not removed.
    loop {
        let listed = registry.candidates(election).await.unwrap();
        if listed.len() == 1 {
            assert_eq!(listed[0].id, "live");
            break;
        }
        assert!(registered.elapsed() < Duration::from_secs(1), "the short registrations never ran out");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(registered.elapsed() < grace, "the engine is too slow for this check");
    assert_eq!(stored_candidates(&table, election).await, ["back", "gone", "live"]);
    tokio::time::sleep((done + short + grace + Duration::from_millis(100)).saturating_duration_since(Instant::now()))
        .await;

    // "back" registers again after the read that found it long expired, before the prune: the
    // prune's condition on the expiry it read fails, and the fresh registration stays.
    let now = leaselock::Clock::now_ms(&SystemClock);
    let prunes_sent = Arc::new(AtomicU32::new(0));
    let again = refresh_request(table.config(), election, &Candidate::new("back", 3.0), now + 60_000);
    let op = RegisterBetweenReadAndPrune {
        list: leaselock::protocol::ListCandidates::new(table.config(), election)
            .unwrap()
            .prune_after_ms(grace.as_millis() as u64),
        again: Some(again),
        prune: None,
        prunes_sent: prunes_sent.clone(),
    };
    let listed = table.run(op).await.unwrap();
    assert_eq!(listed.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(), ["live"], "listed as read");
    assert_eq!(prunes_sent.load(Ordering::SeqCst), 1, "the prune was sent after the registration");
    assert_eq!(stored_candidates(&table, election).await, ["back", "gone", "live"]);

    // The next listing prunes "gone" (long expired) and keeps both live registrations.
    let listed = registry.candidates(election).await.unwrap();
    assert_eq!(listed.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(), ["back", "live"]);
    assert_eq!(stored_candidates(&table, election).await, ["back", "live"]);
}
