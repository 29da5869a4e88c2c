//! The reconciler's sweep for stranded work (session mode), against the in-memory store: work
//! held under a retired session or an older epoch is hinted, work under a live session or one
//! dead for less than the grace is not, and a sweep that is off or not due sends nothing of it.
//! Then the handler on DynamoDB and SQS (the local engine).

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use common::{queue, queue_depth, receive_hints, sample, services, table, unique_name};
use lambda_runtime::{Context, LambdaEvent};
use leaselock::{Clock, LeaseMode, LeaseStore, LeaseTable, ManualClock, MemoryStore, Session, TableConfig};
use leaselock_lambdas::reconciler::{self, Options, Sweep};
use leaselock_lambdas::{EmfWriter, MemoryHints};
use serde_json::{json, Value};

/// A whole multiple of 10 minutes since the epoch.
const T0: u64 = 1_800_000_000_000;

/// A scheduled event invoked at `time` (the sample, with another time).
fn scheduled(time: &str) -> Value {
    let mut event = sample("schedule.json");
    event["time"] = json!(time);
    event
}

/// Due at the default interval: 08:00 is a multiple of 10 minutes.
const DUE: &str = "2027-01-15T08:00:00Z";
/// Not due: 08:05.
const NOT_DUE: &str = "2027-01-15T08:05:00Z";

struct Fleet {
    store: MemoryStore,
    clock: Arc<ManualClock>,
    /// The live worker's session and the restarted worker's new one, renewed by
    /// [`Fleet::advance`].
    live: Session,
    restarted: Session,
}

impl Fleet {
    /// Moves time `ms` on in 5 s steps, the live worker renewing at each, `dying` too until
    /// `dies_at` (time since the start).
    async fn advance(&mut self, ms: u64, dying: &mut Session, dies_at: u64) {
        for _ in 0..ms / 5_000 {
            self.clock.advance(5_000);
            self.store.renew_session(&mut self.live).await.unwrap();
            self.store.renew_session(&mut self.restarted).await.unwrap();
            if self.clock.now_ms() - T0 < dies_at {
                self.store.renew_session(dying).await.unwrap();
            }
        }
    }
}

/// w-live holds live-1; w-retired held retired-1 and retired-2 and died at the start (its session
/// retired, as survivors do once the owner index lists nothing under it); w-restarted held
/// old-epoch-1 and opened a new epoch, which lives; w-recent holds recent-1 and died 30 s before
/// the run; never-claimed is an orphan.
/// The run is at T0 + 110 s: w-retired's session is dead beyond the 60 s grace, w-recent's is not.
async fn fleet() -> Fleet {
    let clock = Arc::new(ManualClock::new(T0));
    let store = MemoryStore::new(TableConfig::default().mode(LeaseMode::Session), clock.clone()).unwrap();
    for id in ["live-1", "retired-1", "retired-2", "old-epoch-1", "recent-1", "never-claimed"] {
        store.start(id, "wss://feed.example/s").await.unwrap();
    }
    let live = store.create_session("w-live", None).await.unwrap();
    let retired = store.create_session("w-retired", None).await.unwrap();
    let restarted = store.create_session("w-restarted", None).await.unwrap();
    let mut recent = store.create_session("w-recent", None).await.unwrap();
    for (id, session) in [
        ("live-1", &live),
        ("retired-1", &retired),
        ("retired-2", &retired),
        ("old-epoch-1", &restarted),
        ("recent-1", &recent),
    ] {
        store.claim_in_session(id, session).await.unwrap();
    }
    let again = store.create_session("w-restarted", Some(restarted.epoch)).await.unwrap();
    assert!(again.epoch > restarted.epoch, "a new epoch");
    let mut fleet = Fleet { store, clock, live, restarted: again };
    fleet.advance(110_000, &mut recent, 80_000).await;
    assert!(fleet.store.retire_session("w-retired", retired.epoch).await.unwrap(), "dead and retired");
    fleet
}

async fn run(store: &MemoryStore, event: Value, sweep: Sweep) -> (Value, Value, BTreeSet<String>, MemoryHints) {
    let hints = MemoryHints::new();
    let metrics = EmfWriter::new("leaselock-test", "reconciler", Vec::new());
    let report = reconciler::handle_with(LambdaEvent::new(event, Context::default()), store, &hints, &metrics, sweep)
        .await
        .unwrap();
    let text = String::from_utf8(metrics.into_inner()).unwrap();
    let hinted = hints.sent().into_iter().map(|h| h.connection_id).collect();
    (report, serde_json::from_str(text.trim()).unwrap(), hinted, hints)
}

fn ids(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn a_due_sweep_hints_work_under_a_retired_session_or_an_older_epoch() {
    let fleet = fleet().await;
    let (report, emf, hinted, hints) = run(&fleet.store, scheduled(DUE), Sweep::default()).await;
    assert_eq!(report["stranded"], 3, "{report}");
    assert_eq!(report["sweep_complete"], true);
    assert!(report["sweep_items_read"].as_u64().unwrap() >= 6, "{report}");
    assert_eq!(emf["Stranded"], 3);
    let names: Vec<&str> = emf["_aws"]["CloudWatchMetrics"][0]["Metrics"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["Name"].as_str())
        .collect();
    assert!(names.contains(&"Stranded"), "{names:?}");
    // The orphan and w-recent's work (a dead session still listed) come from the usual paths.
    assert_eq!(report["dead_session_work"], 1);
    assert_eq!(hinted, ids(&["never-claimed", "old-epoch-1", "recent-1", "retired-1", "retired-2"]));
    assert_eq!(report["hints_sent"], 5);
    // The sweep's hints say the work is stranded (taken whatever a worker's fair share); the
    // orphan's and the listed dead session's do not.
    let stranded: BTreeSet<String> = hints.sent().into_iter().filter(|h| h.stranded).map(|h| h.connection_id).collect();
    assert_eq!(stranded, ids(&["old-epoch-1", "retired-1", "retired-2"]));
}

#[tokio::test]
async fn a_hint_from_the_sweep_lets_a_live_worker_take_the_work_over() {
    let fleet = fleet().await;
    let (_, _, hinted, _) = run(&fleet.store, scheduled(DUE), Sweep::default()).await;
    for id in ["retired-1", "old-epoch-1"] {
        assert!(hinted.contains(id));
        let lease = fleet.store.claim_in_session(id, &fleet.live).await.unwrap();
        assert_eq!(lease.owner, "w-live", "{id}");
    }
    // Live work and work dead within the grace are not the sweep's: the claim says who holds it.
    assert!(matches!(fleet.store.claim_in_session("live-1", &fleet.live).await, Err(leaselock::Error::Held { .. })));
    let (report, _, _, _) = run(&fleet.store, scheduled(DUE), Sweep::default()).await;
    assert_eq!(report["stranded"], 1, "only retired-2 is left: {report}");
}

#[tokio::test]
async fn work_under_a_live_session_or_one_dead_within_the_grace_is_not_stranded() {
    let fleet = fleet().await;
    let grace = |grace_ms| Options { sweep_grace_ms: Some(grace_ms), ..Options::default() };
    let hints = MemoryHints::new();
    let report = reconciler::reconcile_with(&fleet.store, &hints, grace(60_000)).await.unwrap();
    assert_eq!(report.stranded, Some(3));
    // With no grace, w-recent's session (dead 30 s) counts too; live-1 never does.
    let hints = MemoryHints::new();
    let report = reconciler::reconcile_with(&fleet.store, &hints, grace(0)).await.unwrap();
    assert_eq!(report.stranded, Some(4));
    let hinted: BTreeSet<String> = hints.sent().into_iter().map(|h| h.connection_id).collect();
    assert!(!hinted.contains("live-1"), "{hinted:?}");
    assert_eq!(hints.sent().len(), hinted.len(), "recent-1, hinted as a dead session's work, is not hinted twice");
}

#[tokio::test]
async fn a_sweep_off_or_not_due_sends_nothing_of_it() {
    let fleet = fleet().await;
    let usual = ids(&["never-claimed", "recent-1"]);
    for (event, sweep, what) in [
        (scheduled(DUE), Sweep { every_minutes: 0, ..Sweep::default() }, "off"),
        (scheduled(DUE), Sweep::OFF, "off"),
        (scheduled(NOT_DUE), Sweep::default(), "not due at 08:05"),
        (
            scheduled("2027-01-15T08:10:00Z"),
            Sweep { every_minutes: 20, ..Sweep::default() },
            "not due at 08:10 every 20",
        ),
    ] {
        let (report, emf, hinted, _) = run(&fleet.store, event, sweep).await;
        assert!(report.get("stranded").is_none(), "{what}: {report}");
        assert!(emf.get("Stranded").is_none(), "{what}: no sweep, no metric");
        assert_eq!(hinted, usual, "{what}");
    }
    // `handle` never sweeps.
    let hints = MemoryHints::new();
    let metrics = EmfWriter::new("leaselock-test", "reconciler", Vec::new());
    let event = LambdaEvent::new(scheduled(DUE), Context::default());
    let report = reconciler::handle(event, &fleet.store, &hints, &metrics).await.unwrap();
    assert!(report.get("stranded").is_none(), "{report}");
}

#[tokio::test]
async fn without_an_event_time_the_store_clock_decides_and_per_item_mode_never_sweeps() {
    let fleet = fleet().await;
    // T0 + 110 s: minute 3,000,001 since the epoch, due every minute, not every 10.
    let (report, ..) = run(&fleet.store, json!({}), Sweep { every_minutes: 1, ..Sweep::default() }).await;
    assert_eq!(report["stranded"], 3);
    let (report, ..) = run(&fleet.store, json!({}), Sweep::default()).await;
    assert!(report.get("stranded").is_none(), "{report}");

    let clock = Arc::new(ManualClock::new(T0));
    let per_item = MemoryStore::new(TableConfig::default(), clock).unwrap();
    per_item.start("s1", "wss://feed.example/s").await.unwrap();
    let (report, ..) = run(&per_item, scheduled(DUE), Sweep::default()).await;
    assert!(report.get("stranded").is_none(), "no item holds the sentinel in per-item mode: {report}");
}

#[test]
fn the_invocation_minute_comes_from_the_scheduled_events_time() {
    let at = |time: &str| reconciler::event_time_ms(&json!({ "time": time }));
    assert_eq!(at("2026-03-12T19:05:00Z"), Some(1_773_342_300_000));
    assert_eq!(at("1970-01-01T00:00:00Z"), Some(0));
    assert_eq!(at("2000-02-29T23:59:59.5Z"), Some(951_868_799_500));
    assert_eq!(at("2024-12-31T00:10:00Z"), Some(1_735_603_800_000));
    for bad in ["2026-03-12 19:05:00Z", "2026-03-12T19:05:00", "2026-13-12T19:05:00Z", "2026-03-12T24:00:00Z", "soon"] {
        assert_eq!(at(bad), None, "{bad}");
    }
    assert_eq!(reconciler::event_time_ms(&json!({})), None);
    let sweep = Sweep::default();
    assert!(sweep.is_due(at("2027-01-15T08:00:00Z").unwrap()) && sweep.is_due(at("2027-01-15T08:10:59Z").unwrap()));
    assert!(!sweep.is_due(at("2027-01-15T08:05:00Z").unwrap()));
    assert!(!Sweep::OFF.is_due(0));
}

/// The handler on DynamoDB and SQS: work under an older epoch and under a dead, retired session
/// (which no index lists any more) is hinted by a due sweep; a live session's work is not.
#[tokio::test]
async fn on_dynamodb_a_due_sweep_hints_work_no_index_lists() {
    let Some(sdk) = services("on_dynamodb_a_due_sweep_hints_work_no_index_lists").await else { return };
    let config = TableConfig::new(unique_name("ll-sweep")).mode(LeaseMode::Session);
    let store = table(&sdk, config.clone()).await;
    let hints = queue(&sdk).await;
    // The crashed worker's session lasts 1.5 s.
    let short = config
        .lease_duration(Duration::from_millis(1_500))
        .renew_interval(Duration::from_millis(500))
        .clock_skew(Duration::from_millis(100));
    let crashed_store = LeaseTable::new(store.client().clone(), short).unwrap();
    for id in ["old-epoch", "retired", "live"] {
        store.start(id, "wss://feed.example/s").await.unwrap();
    }
    let crashed = crashed_store.create_session("crashed", None).await.unwrap();
    crashed_store.claim_in_session("retired", &crashed).await.unwrap();
    let restarted = store.create_session("restarted", None).await.unwrap();
    store.claim_in_session("old-epoch", &restarted).await.unwrap();
    store.create_session("restarted", Some(restarted.epoch)).await.unwrap();
    let live = store.create_session("live", None).await.unwrap();
    store.claim_in_session("live", &live).await.unwrap();
    // Dead beyond the reconciler's 1 s skew, then retired as survivors do after an empty listing.
    tokio::time::sleep(Duration::from_millis(1_500 + 1_000 + 300)).await;
    assert!(crashed_store.retire_session("crashed", crashed.epoch).await.unwrap());

    let metrics = EmfWriter::new("leaselock-test", "reconciler", Vec::new());
    let sweep = Sweep { grace_ms: 0, ..Sweep::default() };
    let event = LambdaEvent::new(scheduled(DUE), Context::default());
    let report = reconciler::handle_with(event, &store, &hints, &metrics, sweep).await.unwrap();
    assert_eq!((report["stranded"].as_u64(), report["dead_session_work"].as_u64()), (Some(2), Some(0)), "{report}");
    assert_eq!(report["sweep_complete"], true);
    let received = receive_hints(&hints, 2, Duration::from_secs(30)).await;
    assert!(received.iter().all(|h| h.stranded), "{received:?}");
    let hinted: BTreeSet<String> = received.into_iter().map(|h| h.connection_id).collect();
    assert_eq!(hinted, ids(&["old-epoch", "retired"]));
    assert_eq!(queue_depth(&hints).await, 0, "nothing else hinted");
}
