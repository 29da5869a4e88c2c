//! The handlers against the in-memory store and hint sender: no network.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;
use lambda_runtime::{Context, Diagnostic, LambdaEvent};
use leaselock::{
    Clock, DesiredState, Error, Lease, LeaseItem, LeaseStore, ManualClock, MemoryStore, OrphanCursor, OrphanPage,
    TableConfig,
};
use leaselock_lambdas::hint_sender::{HintError, HintSender};
use leaselock_lambdas::reconciler::{self, Options, StateCounts, SEND_ATTEMPTS};
use leaselock_lambdas::router::RouterError;
use leaselock_lambdas::{EmfWriter, Hint, MemoryHints};
use serde_json::{json, Value};

const T0: u64 = 1_700_000_000_000;

fn memory() -> (MemoryStore, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(T0));
    (MemoryStore::new(TableConfig::default(), clock.clone()).unwrap(), clock)
}

/// A memory store with `n` STARTED items never claimed.
async fn started(n: usize) -> MemoryStore {
    let (store, _) = memory();
    for i in 0..n {
        store.start(&format!("s{i:04}"), "wss://feed.example/s").await.unwrap();
    }
    store
}

fn http_body(response: &Value) -> Value {
    serde_json::from_str(response["body"].as_str().unwrap()).unwrap()
}

#[tokio::test]
async fn start_twice_then_stop_settles_the_same_through_every_kind() {
    let (store, _) = memory();
    for kind in KINDS {
        let hints = MemoryHints::new();
        let id = format!("stream-{kind:?}");
        let item = start_twice_then_stop(kind, &store, &hints, &id).await;
        assert_eq!(Settled::from(&item), expected_settled(&id), "{kind:?}");
        // Each START hints, the STOP does not.
        assert_eq!(hints.sent(), vec![Hint::new(id.as_str()), Hint::new(id.as_str())], "{kind:?}");
    }
}

#[tokio::test]
async fn malformed_requests_are_refused_and_write_nothing() {
    for kind in KINDS {
        let (store, _) = memory();
        let hints = MemoryHints::new();
        let refused = malformed_writes_nothing(kind, &store, &hints).await;
        assert!(refused >= 7, "{kind:?}: only {refused} cases");
        assert!(hints.sent().is_empty(), "{kind:?}: a refused request sent a hint");
    }
}

#[tokio::test]
async fn stop_of_an_unknown_id_is_not_found_and_writes_nothing() {
    let (store, _) = memory();
    let hints = MemoryHints::new();
    for kind in KINDS {
        let verdict = verdict(kind, invoke(&store, &hints, stop_event(kind, "nobody")).await);
        let expected = if kind == Kind::Sqs { Verdict::Done } else { Verdict::NotFound };
        assert_eq!(verdict, expected, "{kind:?}");
    }
    assert!(store.items().await.unwrap().is_empty());
}

#[tokio::test]
async fn http_routes_answer_with_json() {
    let (store, _) = memory();
    let hints = MemoryHints::new();

    let started = invoke(&store, &hints, sample("http-start.json")).await.unwrap();
    assert_eq!(started["statusCode"], 200);
    let body = http_body(&started);
    assert_eq!(body["connection_id"], "stream-1");
    assert_eq!(body["desired_state"], "STARTED");
    assert_eq!(body["url"], "wss://feed.example/stream-1");
    assert_eq!(body["fence"], 0);
    assert_eq!(body["hint_sent"], true);

    let got = invoke(&store, &hints, sample("http-get.json")).await.unwrap();
    assert_eq!(got["statusCode"], 200);
    assert_eq!(http_body(&got)["desired_state"], "STARTED");
    assert!(http_body(&got).get("hint_sent").is_none());

    let stopped = invoke(&store, &hints, sample("http-stop.json")).await.unwrap();
    assert_eq!(
        (stopped["statusCode"].as_u64(), http_body(&stopped)["desired_state"].as_str()),
        (Some(200), Some("STOPPED"))
    );

    let missing = http_event("GET", "/connections/{id}", "/connections/nobody", Some("nobody"), None);
    let missing = invoke(&store, &hints, missing).await.unwrap();
    assert_eq!(missing["statusCode"], 404);
    assert!(http_body(&missing)["error"].as_str().unwrap().contains("nobody"));

    let wrong_method = http_event("GET", "$default", "/connections/stream-1/start", None, None);
    let wrong_method = invoke(&store, &hints, wrong_method).await.unwrap();
    assert_eq!(
        (wrong_method["statusCode"].as_u64(), wrong_method["headers"]["allow"].as_str()),
        (Some(405), Some("POST"))
    );

    // A REST API (payload format 1.0) event is refused as such, not read as a command.
    let rest = json!({"httpMethod": "GET", "path": "/connections/stream-1", "requestContext": {"stage": "prod"}});
    let rest = invoke(&store, &hints, rest).await.unwrap();
    assert_eq!((rest["statusCode"].as_u64(), http_body(&rest)["field"].as_str()), (Some(400), Some("event")));

    let no_route = invoke(&store, &hints, http_event("GET", "$default", "/health", None, None)).await.unwrap();
    assert_eq!(no_route["statusCode"], 404);

    // A `$default` route with a stage prefix and an escaped id.
    let escaped = http_event("GET", "$default", "/prod/connections/stream%2D1", None, None);
    assert_eq!(http_body(&invoke(&store, &hints, escaped).await.unwrap())["connection_id"], "stream-1");

    // Base64 bodies (binary media types) are decoded.
    let mut b64 = start_event(Kind::Http, "stream-b64", "wss://feed.example/b64");
    b64["body"] = json!("eyJ1cmwiOiAid3NzOi8vZmVlZC5leGFtcGxlL2I2NCJ9"); // {"url": "wss://feed.example/b64"}
    b64["isBase64Encoded"] = json!(true);
    assert_eq!(invoke(&store, &hints, b64).await.unwrap()["statusCode"], 200);

    // A body naming another id than the path is refused.
    let mut mismatch = start_event(Kind::Http, "stream-x", "wss://feed.example/x");
    mismatch["body"] = json!(r#"{"url": "wss://feed.example/x", "connection_id": "stream-y"}"#);
    let mismatch = invoke(&store, &hints, mismatch).await.unwrap();
    assert_eq!(
        (mismatch["statusCode"].as_u64(), http_body(&mismatch)["field"].as_str()),
        (Some(400), Some("connection_id"))
    );
    assert!(store.get("stream-x").await.unwrap().is_none());
}

#[tokio::test]
async fn the_sample_events_do_what_their_names_say() {
    let (store, _) = memory();
    let hints = MemoryHints::new();

    let batch = invoke(&store, &hints, sample("sqs-batch.json")).await.unwrap();
    assert_eq!(batch, json!({"batchItemFailures": []}));
    assert_eq!(store.get("stream-2").await.unwrap().unwrap().desired_state, Some(DesiredState::Started));
    assert_eq!(store.get("stream-3").await.unwrap().unwrap().desired_state, Some(DesiredState::Stopped));

    let before = store.items().await.unwrap();
    let dropped = invoke(&store, &hints, sample("sqs-batch-malformed.json")).await.unwrap();
    assert_eq!(dropped, json!({"batchItemFailures": []}), "malformed records are dropped, not retried");
    assert_eq!(store.items().await.unwrap(), before);

    let started = invoke(&store, &hints, sample("direct-start.json")).await.unwrap();
    assert_eq!((started["connection_id"].as_str(), started["hint_sent"].as_bool()), (Some("stream-5"), Some(true)));
    let stopped = invoke(&store, &hints, sample("direct-stop.json")).await.unwrap();
    assert_eq!(stopped["desired_state"], "STOPPED");

    let err = invoke(&store, &hints, sample("direct-malformed.json")).await.unwrap_err();
    let diagnostic = Diagnostic::from(err);
    assert_eq!(diagnostic.error_type, "InvalidRequest");
    assert_eq!(diagnostic.error_message, "invalid request (non-retryable): connection_id: missing");

    let bad = invoke(&store, &hints, sample("http-start-malformed.json")).await.unwrap();
    assert_eq!((bad["statusCode"].as_u64(), http_body(&bad)["field"].as_str()), (Some(400), Some("body")));

    let hinted: Vec<String> = hints.sent().into_iter().map(|h| h.connection_id).collect();
    assert_eq!(hinted, ["stream-2", "stream-3", "stream-5"]);
    assert_eq!(store.items().await.unwrap().len(), 3);
}

#[tokio::test]
async fn a_start_whose_hint_fails_still_succeeds() {
    let (store, _) = memory();
    let hints = MemoryHints::new();
    hints.fail_next_requests(1);
    let out = invoke(&store, &hints, start_command("s1", "wss://feed.example/s1")).await.unwrap();
    assert_eq!(out["hint_sent"], false);
    assert_eq!(store.get("s1").await.unwrap().unwrap().desired_state, Some(DesiredState::Started));
    assert!(hints.sent().is_empty());
}

/// A store whose writes fail (throttled) for ids containing "flaky" (the table is missing for
/// ids containing "gone"), and whose orphan query fails for a page that starts after one.
struct Flaky(MemoryStore);

impl Flaky {
    fn check(id: &str) -> leaselock::Result<()> {
        if id.contains("flaky") {
            Err(Error::Throttled)
        } else if id.contains("gone") {
            Err(Error::TableNotFound { table: "leases".into() })
        } else {
            Ok(())
        }
    }
}

#[async_trait::async_trait]
impl LeaseStore for Flaky {
    fn config(&self) -> &TableConfig {
        self.0.config()
    }
    fn clock(&self) -> &dyn Clock {
        self.0.clock()
    }
    async fn start(&self, id: &str, url: &str) -> leaselock::Result<LeaseItem> {
        Self::check(id)?;
        self.0.start(id, url).await
    }
    async fn stop(&self, id: &str) -> leaselock::Result<LeaseItem> {
        Self::check(id)?;
        self.0.stop(id).await
    }
    async fn acquire(&self, id: &str, owner: &str) -> leaselock::Result<Lease> {
        self.0.acquire(id, owner).await
    }
    async fn renew(&self, lease: &mut Lease) -> leaselock::Result<()> {
        self.0.renew(lease).await
    }
    async fn release(&self, lease: &Lease) -> leaselock::Result<()> {
        self.0.release(lease).await
    }
    async fn checkpoint(&self, lease: &mut Lease, seq: u64) -> leaselock::Result<()> {
        self.0.checkpoint(lease, seq).await
    }
    async fn get(&self, id: &str) -> leaselock::Result<Option<LeaseItem>> {
        Self::check(id)?;
        self.0.get(id).await
    }
    async fn batch_desired_states(&self, ids: &[String]) -> leaselock::Result<HashMap<String, Option<DesiredState>>> {
        self.0.batch_desired_states(ids).await
    }
    async fn orphans_page(
        &self,
        cutoff: u64,
        size: usize,
        after: Option<OrphanCursor>,
    ) -> leaselock::Result<OrphanPage> {
        if let Some(cursor) = &after {
            Self::check(&cursor.key)?;
        }
        self.0.orphans_page(cutoff, size, after).await
    }
    async fn owned_by(&self, owner: &str) -> leaselock::Result<Vec<LeaseItem>> {
        self.0.owned_by(owner).await
    }
    async fn items(&self) -> leaselock::Result<Vec<LeaseItem>> {
        self.0.items().await
    }
}

#[tokio::test]
async fn store_failures_are_retried_and_hopeless_records_are_not() {
    let (inner, _) = memory();
    let store = Flaky(inner);
    let hints = MemoryHints::new();
    let bodies = [
        start_command("ok-1", "wss://feed.example/1").to_string(),
        start_command("flaky-1", "wss://feed.example/2").to_string(),
        "{not json".to_string(),
        stop_command("nobody").to_string(),
        start_command("ok-2", "wss://feed.example/3").to_string(),
    ];
    let event = sqs_event(&bodies);
    let ids: Vec<String> =
        event["Records"].as_array().unwrap().iter().map(|r| r["messageId"].as_str().unwrap().into()).collect();
    let out = invoke(&store, &hints, event).await.unwrap();
    assert_eq!(out, json!({"batchItemFailures": [{"itemIdentifier": ids[1]}]}));
    let written: BTreeSet<String> = store.items().await.unwrap().into_iter().map(|i| i.id).collect();
    assert_eq!(written, BTreeSet::from(["ok-1".to_string(), "ok-2".to_string()]));

    // FIFO: after a failure the rest of the batch is returned too, unapplied, to keep the order.
    let mut fifo = sqs_event(&[
        start_command("ok-3", "wss://feed.example/3").to_string(),
        start_command("flaky-2", "wss://feed.example/4").to_string(),
        stop_command("ok-3").to_string(),
    ]);
    for record in fifo["Records"].as_array_mut().unwrap() {
        record["eventSourceARN"] = json!("arn:aws:sqs:us-east-1:123456789012:commands.fifo");
    }
    let ids: Vec<String> =
        fifo["Records"].as_array().unwrap().iter().map(|r| r["messageId"].as_str().unwrap().into()).collect();
    let out = invoke(&store, &hints, fifo).await.unwrap();
    assert_eq!(out, json!({"batchItemFailures": [{"itemIdentifier": ids[1]}, {"itemIdentifier": ids[2]}]}));
    assert_eq!(store.get("ok-3").await.unwrap().unwrap().desired_state, Some(DesiredState::Started));

    // The other kinds say "retry".
    assert_eq!(
        verdict(Kind::Http, invoke(&store, &hints, start_event(Kind::Http, "flaky-3", "wss://x/3")).await),
        Verdict::Retry
    );
    let err = invoke(&store, &hints, start_command("flaky-4", "wss://x/4")).await.unwrap_err();
    assert!(matches!(err, RouterError::Store(Error::Throttled)) && err.is_retryable());
    assert_eq!(Diagnostic::from(err).error_type, "StoreUnavailable");
}

/// A missing table (or a role that may not use it) is the deployment's fault: HTTP says 500, not
/// "retry"; a direct invocation gets a non-retryable `Misconfigured`; SQS keeps the command (it
/// is valid) for redelivery once the deployment is fixed, or for the dead-letter queue.
#[tokio::test]
async fn a_missing_table_is_a_misconfiguration_not_a_retry() {
    let (inner, _) = memory();
    let store = Flaky(inner);
    let hints = MemoryHints::new();
    let response = invoke(&store, &hints, start_event(Kind::Http, "gone-1", "wss://x/1")).await.unwrap();
    assert_eq!(response["statusCode"], 500, "{response}");
    let body: Value = serde_json::from_str(response["body"].as_str().unwrap()).unwrap();
    let error = body["error"].as_str().unwrap();
    assert!(error.contains("misconfigured") && error.contains("leases"), "{error}");

    let err = invoke(&store, &hints, start_command("gone-2", "wss://x/2")).await.unwrap_err();
    assert!(matches!(err, RouterError::Misconfigured(Error::TableNotFound { .. })) && !err.is_retryable());
    let diagnostic = Diagnostic::from(err);
    assert_eq!(diagnostic.error_type, "Misconfigured");
    assert!(diagnostic.error_message.contains("non-retryable"), "{}", diagnostic.error_message);

    let batch = sqs_event(&[start_command("gone-3", "wss://x/3").to_string()]);
    let id = batch["Records"][0]["messageId"].as_str().unwrap().to_string();
    let out = invoke(&store, &hints, batch).await.unwrap();
    assert_eq!(out, json!({"batchItemFailures": [{"itemIdentifier": id}]}));
    assert!(hints.sent().is_empty(), "no hint for a command that was not applied");
}

// ---------------------------------------------------------------------------------------------
// Reconciler

async fn run_reconciler(store: &MemoryStore, hints: &MemoryHints) -> (Value, Value) {
    let metrics = EmfWriter::new("leaselock-test", "reconciler", Vec::new());
    let event = LambdaEvent::new(sample("schedule.json"), Context::default());
    let report = reconciler::handle(event, store, hints, &metrics).await.unwrap();
    let text = String::from_utf8(metrics.into_inner()).unwrap();
    assert_eq!(text.lines().count(), 1, "one EMF line per run: {text}");
    (report, serde_json::from_str(text.trim()).unwrap())
}

#[tokio::test]
async fn the_reconciler_hints_every_orphan_counts_the_fleet_and_claims_nothing() {
    let (store, clock) = memory();
    for i in 0..10 {
        store.start(&format!("s{i}"), "wss://feed.example/s").await.unwrap();
    }
    // s0..s3 are held; s4 was held but expired long ago; s8, s9 are stopped; s5..s7 never claimed.
    for i in 0..5 {
        store.acquire(&format!("s{i}"), "worker-a").await.unwrap();
    }
    clock.advance(30_000);
    for i in 0..4 {
        store.acquire(&format!("s{i}"), "worker-b").await.unwrap();
    }
    store.stop("s8").await.unwrap();
    store.stop("s9").await.unwrap();
    // A leader key carries no desired state: never an orphan, never counted.
    store.acquire("leader/main", "worker-a").await.unwrap();
    let before = store.items().await.unwrap();

    let hints = MemoryHints::new();
    let (report, emf) = run_reconciler(&store, &hints).await;
    assert_eq!(report["orphans"], 4);
    assert_eq!(report["hints_sent"], 4);
    assert_eq!(report["hints_failed"], 0);
    assert_eq!(report["owned"], 4);
    assert_eq!(report["started"], 8);
    assert_eq!(report["stopped"], 2);
    assert_eq!(report["cutoff_ms"], T0 + 30_000 - 1_000);
    let hinted: BTreeSet<String> = hints.sent().into_iter().map(|h| h.connection_id).collect();
    assert_eq!(hinted, ["s4", "s5", "s6", "s7"].into_iter().map(String::from).collect());
    assert_eq!(store.items().await.unwrap(), before, "the reconciler must not write");

    let directive = &emf["_aws"]["CloudWatchMetrics"][0];
    assert_eq!(directive["Namespace"], "leaselock-test");
    assert_eq!(directive["Dimensions"], json!([["Service"]]));
    let names: BTreeSet<&str> =
        directive["Metrics"].as_array().unwrap().iter().map(|m| m["Name"].as_str().unwrap()).collect();
    for name in ["Orphans", "Started", "Stopped", "HintsSent"] {
        assert!(names.contains(name), "{name} missing from {names:?}");
    }
    assert_eq!(emf["Service"], "reconciler");
    assert_eq!((emf["Orphans"].as_u64(), emf["HintsSent"].as_u64()), (Some(4), Some(4)));
    assert_eq!((emf["Started"].as_u64(), emf["Stopped"].as_u64()), (Some(8), Some(2)));
    assert_eq!(emf["_aws"]["Timestamp"], T0 + 30_000);
}

#[tokio::test]
async fn refused_hints_are_retried_a_bounded_number_of_times() {
    let store = started(25).await;
    let hints = MemoryHints::new();
    hints.fail_next_entries(7);
    hints.fail_next_requests(1);
    let (report, _) = run_reconciler(&store, &hints).await;
    assert_eq!(
        (report["orphans"].as_u64(), report["hints_sent"].as_u64(), report["hints_failed"].as_u64()),
        (Some(25), Some(25), Some(0))
    );
    assert_eq!(hints.sent().into_iter().map(|h| h.connection_id).collect::<BTreeSet<_>>().len(), 25);

    // A queue that keeps refusing: the run still completes and says how many were not sent.
    let hints = MemoryHints::new();
    hints.fail_next_requests(3 * SEND_ATTEMPTS as usize);
    let (report, emf) = run_reconciler(&store, &hints).await;
    assert_eq!((report["hints_sent"].as_u64(), report["hints_failed"].as_u64()), (Some(0), Some(25)));
    assert_eq!(emf["HintsFailed"], 25);
}

#[tokio::test]
async fn the_reconciler_reads_every_page() {
    let n = reconciler::PAGE_SIZE * 2 + 500;
    let store = started(n).await;
    let hints = MemoryHints::new();
    let (report, _) = run_reconciler(&store, &hints).await;
    assert_eq!(report["orphans"].as_u64(), Some(n as u64));
    let unique: BTreeSet<String> = hints.sent().into_iter().map(|h| h.connection_id).collect();
    assert_eq!(unique.len(), n);
}

#[tokio::test]
async fn the_reconciler_accepts_any_payload() {
    let (store, _) = memory();
    let hints = MemoryHints::new();
    let metrics = EmfWriter::new("leaselock", "reconciler", Vec::new());
    for payload in [json!({}), json!(null), json!("tick"), sample("schedule.json")] {
        let event = LambdaEvent::new(payload, Context::default());
        reconciler::handle(event, &store, &hints, &metrics).await.unwrap();
    }
    assert_eq!(String::from_utf8(metrics.into_inner()).unwrap().lines().count(), 4);
}

/// Hints that take `delay` (tokio time) per request.
struct SlowHints {
    inner: MemoryHints,
    delay: Duration,
}

impl SlowHints {
    fn new(delay: Duration) -> Self {
        SlowHints { inner: MemoryHints::new(), delay }
    }

    fn unique(&self) -> BTreeSet<String> {
        self.inner.sent().into_iter().map(|h| h.connection_id).collect()
    }
}

#[async_trait::async_trait]
impl HintSender for SlowHints {
    async fn send(&self, hint: &Hint) -> Result<(), HintError> {
        tokio::time::sleep(self.delay).await;
        self.inner.send(hint).await
    }

    async fn send_batch(&self, hints: &[Hint]) -> Result<Vec<usize>, HintError> {
        tokio::time::sleep(self.delay).await;
        self.inner.send_batch(hints).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_run_starts_no_request_after_its_deadline() {
    let store = started(500).await;
    let hints = SlowHints::new(Duration::from_millis(100));
    let began = tokio::time::Instant::now();
    let deadline = began + Duration::from_secs(1);
    let options = Options { concurrency: 2, deadline: Some(deadline), ..Options::default() };
    let report = reconciler::reconcile_with(&store, &hints, options).await.unwrap();
    // 2 batches of 10 in flight, 100 ms each: 10 rounds fit before the deadline.
    assert_eq!((report.orphans, report.hints_sent, report.hints_deferred), (500, 200, 300));
    assert_eq!(report.hints_failed, 0);
    assert!(!report.complete);
    assert!(report.cut_short.as_deref().unwrap().contains("deadline"), "{:?}", report.cut_short);
    assert_eq!(hints.unique().len(), 200);
    assert!(began.elapsed() <= Duration::from_millis(1_100), "{:?}", began.elapsed());
    assert!(report.metrics().contains(&("Incomplete", 1)) && report.metrics().contains(&("HintsDeferred", 300)));

    // The same run without a deadline hints everything.
    let hints = SlowHints::new(Duration::from_millis(100));
    let options = Options { concurrency: 2, ..Options::default() };
    let report = reconciler::reconcile_with(&store, &hints, options).await.unwrap();
    assert_eq!((report.hints_sent, report.hints_deferred, report.complete), (500, 0, true));
    assert_eq!(report.cut_short, None);
    assert!(report.metrics().contains(&("Incomplete", 0)));
}

#[tokio::test(start_paused = true)]
async fn pages_are_read_while_hints_are_sent_and_none_after_the_deadline() {
    let store = started(500).await;
    let hints = SlowHints::new(Duration::from_millis(100));
    let began = tokio::time::Instant::now();
    let options = Options {
        page_size: 50,
        concurrency: 5,
        deadline: Some(began + Duration::from_millis(350)),
        ..Options::default()
    };
    let report = reconciler::reconcile_with(&store, &hints, options).await.unwrap();
    // A page's 5 batches take one round (100 ms), and the next page is read meanwhile: the pages
    // sent at 0, 100, 200 and 300 ms go out whole; the one read at 300 ms is the last.
    assert_eq!((report.orphans, report.hints_sent, report.hints_deferred), (250, 200, 50));
    assert!(report.cut_short.as_deref().unwrap().contains("next page"), "{:?}", report.cut_short);
    assert_eq!(hints.unique().len(), 200);
}

#[tokio::test(start_paused = true)]
async fn a_page_that_cannot_be_read_ends_the_run_with_what_was_done() {
    let (inner, _) = memory();
    for i in 0..30 {
        let id = if i == 9 { "s009-flaky".to_string() } else { format!("s{i:03}") };
        inner.start(&id, "wss://feed.example/s").await.unwrap();
    }
    let store = Flaky(inner);
    let hints = MemoryHints::new();
    let options = Options { page_size: 10, ..Options::default() };
    let report = reconciler::reconcile_with(&store, &hints, options).await.unwrap();
    assert_eq!((report.orphans, report.hints_sent, report.complete), (10, 10, false));
    assert!(report.cut_short.as_deref().unwrap().contains("next page failed"), "{:?}", report.cut_short);
    assert_eq!(hints.sent().len(), 10);
}

#[async_trait::async_trait]
impl StateCounts for Flaky {
    async fn count_by_state(&self, state: DesiredState, min: Option<u64>) -> leaselock::Result<u64> {
        self.0.count_by_state(state, min).await
    }
}

#[tokio::test(start_paused = true)]
async fn the_handler_keeps_a_reserve_before_the_invocation_deadline() {
    let store = started(600).await;
    let hints = SlowHints::new(Duration::from_millis(500));
    let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
    let mut context = Context::default();
    // 1 s of work after the reserve: 2 rounds of 16 batches in flight (of 60).
    context.deadline = now_ms + reconciler::DEADLINE_RESERVE.as_millis() as u64 + 1_000;
    let metrics = EmfWriter::new("leaselock-test", "reconciler", Vec::new());
    let began = tokio::time::Instant::now();
    let report = reconciler::handle(LambdaEvent::new(json!({}), context), &store, &hints, &metrics).await.unwrap();
    assert!(began.elapsed() <= Duration::from_millis(1_100), "{:?}", began.elapsed());
    assert_eq!(report["complete"], false);
    assert_eq!(report["orphans"], 600);
    let sent = report["hints_sent"].as_u64().unwrap();
    assert!((160..=320).contains(&sent), "sent {sent}");
    assert_eq!(sent + report["hints_deferred"].as_u64().unwrap(), 600);
    let emf: Value = serde_json::from_str(String::from_utf8(metrics.into_inner()).unwrap().trim()).unwrap();
    assert_eq!(emf["Incomplete"], 1);
    assert_eq!(emf["HintsDeferred"].as_u64(), Some(600 - sent));
}

#[test]
fn the_run_deadline_comes_from_the_invocation_deadline() {
    let now = UNIX_EPOCH + Duration::from_millis(T0);
    assert_eq!(reconciler::run_deadline(0, now), None, "no deadline in the context: no limit");
    let at = tokio::time::Instant::now();
    let ahead = reconciler::run_deadline(T0 + 10_000, now).unwrap().duration_since(at);
    let expected = Duration::from_millis(10_000) - reconciler::DEADLINE_RESERVE;
    assert!(ahead >= expected && ahead < expected + Duration::from_millis(500), "{ahead:?}");
    // Within the reserve: stop at once.
    assert!(reconciler::run_deadline(T0 + 1_000, now).unwrap() <= tokio::time::Instant::now());
    // Not in the future, or not a time at all (a relative timeout, as a local emulator sends):
    // no usable deadline.
    assert_eq!(reconciler::run_deadline(T0, now), None);
    assert_eq!(reconciler::run_deadline(T0 - 5, now), None);
    assert_eq!(reconciler::run_deadline(600_000, now), None);
}

#[tokio::test]
async fn hostile_ids_and_urls_are_refused_bounded_and_write_nothing() {
    for kind in KINDS {
        let (store, _) = memory();
        let hints = MemoryHints::new();
        let sent = hostile_writes_nothing(kind, &store, &hints).await;
        assert!(sent >= 30, "{kind:?}: only {sent} cases");
        assert!(hints.sent().is_empty(), "{kind:?}: a refused request sent a hint");
    }
}
