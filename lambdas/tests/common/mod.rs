//! Shared by the handler tests (memory) and the local-engine tests (moto): events built from the
//! samples in `lambdas/events/`, the router scenarios, and the local engine's setup.
#![allow(dead_code)]

#[path = "../../../core/tests/local_engine/mod.rs"]
mod local_engine;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::{AttributeValue, PutRequest, WriteRequest};
use futures::StreamExt;
use lambda_runtime::{Context, LambdaEvent};
use leaselock::{DesiredState, LeaseItem, LeaseStore, LeaseTable, TableConfig};
use leaselock_lambdas::router::{self, RouterError};
use leaselock_lambdas::{Hint, HintSender, SqsHints};
use serde_json::{json, Value};

// ---------------------------------------------------------------------------------------------
// Events

pub fn sample(name: &str) -> Value {
    let path = format!("{}/events/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The three ways a command reaches the router.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Http,
    Sqs,
    Direct,
}

pub const KINDS: [Kind; 3] = [Kind::Http, Kind::Sqs, Kind::Direct];

static MESSAGE_SEQ: AtomicU64 = AtomicU64::new(0);

/// An HTTP API event for `method path`, shaped like the samples.
pub fn http_event(method: &str, route: &str, raw_path: &str, id: Option<&str>, body: Option<&str>) -> Value {
    let mut ev = sample("http-get.json");
    ev["routeKey"] = json!(if route == "$default" { route.to_string() } else { format!("{method} {route}") });
    ev["requestContext"]["routeKey"] = ev["routeKey"].clone();
    ev["rawPath"] = json!(raw_path);
    ev["requestContext"]["http"]["method"] = json!(method);
    ev["requestContext"]["http"]["path"] = json!(raw_path);
    ev["pathParameters"] = match id {
        Some(id) => json!({ "id": id }),
        None => json!({}),
    };
    if let Some(body) = body {
        ev["body"] = json!(body);
    }
    ev
}

/// An SQS batch whose record bodies are `bodies`, shaped like the sample.
pub fn sqs_event(bodies: &[String]) -> Value {
    let template = sample("sqs-batch.json")["Records"][0].clone();
    let records: Vec<Value> = bodies
        .iter()
        .map(|body| {
            let mut r = template.clone();
            r["messageId"] = json!(format!("msg-{}", MESSAGE_SEQ.fetch_add(1, Ordering::SeqCst)));
            r["body"] = json!(body);
            r
        })
        .collect();
    json!({ "Records": records })
}

pub fn start_command(id: &str, url: &str) -> Value {
    json!({"action": "START", "connection_id": id, "url": url})
}

pub fn stop_command(id: &str) -> Value {
    json!({"action": "STOP", "connection_id": id})
}

pub fn start_event(kind: Kind, id: &str, url: &str) -> Value {
    match kind {
        Kind::Http => {
            let body = json!({ "url": url }).to_string();
            http_event("POST", "/connections/{id}/start", &format!("/connections/{id}/start"), Some(id), Some(&body))
        }
        Kind::Sqs => sqs_event(&[start_command(id, url).to_string()]),
        Kind::Direct => start_command(id, url),
    }
}

pub fn stop_event(kind: Kind, id: &str) -> Value {
    match kind {
        Kind::Http => http_event("POST", "/connections/{id}/stop", &format!("/connections/{id}/stop"), Some(id), None),
        Kind::Sqs => sqs_event(&[stop_command(id).to_string()]),
        Kind::Direct => stop_command(id),
    }
}

/// Bad requests of every sort, through `kind`: (what is wrong, the field that must be named, event).
pub fn malformed(kind: Kind) -> Vec<(&'static str, &'static str, Value)> {
    let long = "x".repeat(1025);
    let url = "wss://feed.example/s";
    match kind {
        Kind::Http => {
            let post = |path: &str, id: Option<&str>, body: Option<&str>| {
                http_event("POST", "/connections/{id}/start", path, id, body)
            };
            let url_body = json!({ "url": url }).to_string();
            vec![
                ("bad JSON body", "body", post("/connections/s1/start", Some("s1"), Some(r#"{"url": "wss://x""#))),
                ("no body", "body", post("/connections/s1/start", Some("s1"), None)),
                ("missing id", "connection_id", post("/connections//start", None, Some(&url_body))),
                ("empty id", "connection_id", post("/connections//start", Some(""), Some(&url_body))),
                ("bad url", "url", post("/connections/s1/start", Some("s1"), Some(r#"{"url": "https://x"}"#))),
                ("missing url", "url", post("/connections/s1/start", Some("s1"), Some("{}"))),
                (
                    "unknown action",
                    "action",
                    http_event("POST", "$default", "/connections/s1/restart", None, Some(&url_body)),
                ),
                (
                    "id over 1,024 bytes",
                    "connection_id",
                    post(&format!("/connections/{long}/start"), Some(&long), Some(&url_body)),
                ),
                (
                    "id over 1,024 bytes (stop)",
                    "connection_id",
                    http_event(
                        "POST",
                        "/connections/{id}/stop",
                        &format!("/connections/{long}/stop"),
                        Some(&long),
                        None,
                    ),
                ),
            ]
        }
        Kind::Sqs | Kind::Direct => {
            let cases = vec![
                ("bad JSON body", "body", None),
                ("missing id", "connection_id", Some(json!({"action": "START", "url": url}))),
                ("bad url", "url", Some(json!({"action": "START", "connection_id": "s1", "url": "https://x"}))),
                ("missing url", "url", Some(json!({"action": "START", "connection_id": "s1"}))),
                ("unknown action", "action", Some(json!({"action": "RESTART", "connection_id": "s1", "url": url}))),
                ("missing action", "action", Some(json!({"connection_id": "s1", "url": url}))),
                (
                    "id over 1,024 bytes",
                    "connection_id",
                    Some(json!({"action": "START", "connection_id": long, "url": url})),
                ),
                ("id over 1,024 bytes (stop)", "connection_id", Some(json!({"action": "STOP", "connection_id": long}))),
            ];
            cases
                .into_iter()
                .map(|(what, field, command)| {
                    let event = match (kind, command) {
                        (Kind::Sqs, Some(c)) => sqs_event(&[c.to_string()]),
                        (Kind::Sqs, None) => sqs_event(&[r#"{"action": "START", "connection_id": "s1""#.to_string()]),
                        // A direct payload is parsed by the runtime: the nearest to bad JSON is a non-object.
                        (_, Some(c)) => c,
                        (_, None) => json!(r#"{"action": "START", "connection_id": "s1""#),
                    };
                    (what, field, event)
                })
                .collect()
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Invoking the router and reading its answer the same way for every kind

pub async fn invoke<S: LeaseStore + ?Sized>(
    store: &S,
    hints: &dyn HintSender,
    payload: Value,
) -> Result<Value, RouterError> {
    router::handle(LambdaEvent::new(payload, Context::default()), store, hints).await
}

/// The router's answer, in terms common to the three kinds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Done,
    /// 400 / a non-retryable error naming this field / an SQS record dropped without retry.
    Refused(Option<String>),
    NotFound,
    /// 503 / a retryable error / a record listed in batchItemFailures.
    Retry,
}

pub fn verdict(kind: Kind, result: Result<Value, RouterError>) -> Verdict {
    match kind {
        Kind::Http => {
            let response = result.expect("HTTP requests always get a response");
            let body: Value = serde_json::from_str(response["body"].as_str().expect("a JSON body")).expect("JSON body");
            assert_eq!(response["headers"]["content-type"], "application/json");
            match response["statusCode"].as_u64().expect("a status code") {
                200 => Verdict::Done,
                400 => {
                    assert!(body["error"].as_str().is_some_and(|e| !e.is_empty()), "{body}");
                    Verdict::Refused(body["field"].as_str().map(str::to_string))
                }
                404 => Verdict::NotFound,
                503 => Verdict::Retry,
                other => panic!("unexpected status {other}: {body}"),
            }
        }
        Kind::Sqs => {
            let failures = result.expect("an SQS batch always gets a batch response")["batchItemFailures"].clone();
            if failures.as_array().expect("batchItemFailures is an array").is_empty() {
                Verdict::Done
            } else {
                Verdict::Retry
            }
        }
        Kind::Direct => match result {
            Ok(_) => Verdict::Done,
            Err(e) => {
                let message = e.to_string();
                match &e {
                    RouterError::Invalid(invalid) => {
                        assert!(message.contains("non-retryable") && message.contains(invalid.field), "{message}");
                        Verdict::Refused(Some(invalid.field.to_string()))
                    }
                    RouterError::NotFound { .. } => {
                        assert!(message.contains("non-retryable"), "{message}");
                        Verdict::NotFound
                    }
                    RouterError::Store(_) => {
                        assert!(message.contains("retryable") && e.is_retryable(), "{message}");
                        Verdict::Retry
                    }
                    RouterError::Misconfigured(_) => {
                        assert!(message.contains("non-retryable") && !e.is_retryable(), "{message}");
                        Verdict::Retry
                    }
                }
            }
        },
    }
}

// ---------------------------------------------------------------------------------------------
// Scenarios, run against MemoryStore and against DynamoDB on the local engine

/// What a client can rely on after START, START, STOP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settled {
    pub desired_state: Option<DesiredState>,
    pub url: Option<String>,
    pub owner: Option<String>,
    pub fence: u64,
    pub last_seq: Option<u64>,
    pub ttl_set: bool,
}

impl From<&LeaseItem> for Settled {
    fn from(i: &LeaseItem) -> Self {
        Settled {
            desired_state: i.desired_state,
            url: i.url.clone(),
            owner: i.owner.clone(),
            fence: i.fence,
            last_seq: i.last_seq,
            ttl_set: i.ttl.is_some(),
        }
    }
}

/// START, a worker claims, START again (owner, fence and expiry untouched), STOP (same).
/// Returns the final item.
pub async fn start_twice_then_stop<S: LeaseStore + ?Sized>(
    kind: Kind,
    store: &S,
    hints: &dyn HintSender,
    id: &str,
) -> LeaseItem {
    let url = format!("wss://feed.example/{id}");
    assert_eq!(verdict(kind, invoke(store, hints, start_event(kind, id, &url)).await), Verdict::Done, "{kind:?} START");
    let first = store.get(id).await.unwrap().expect("START wrote the item");
    assert_eq!((first.desired_state, first.url.as_deref(), first.fence), (Some(DesiredState::Started), Some(&*url), 0));

    let mut lease = store.acquire(id, "worker-a").await.unwrap();
    store.checkpoint(&mut lease, 7).await.unwrap();
    let held = store.get(id).await.unwrap().unwrap();

    assert_eq!(
        verdict(kind, invoke(store, hints, start_event(kind, id, &url)).await),
        Verdict::Done,
        "{kind:?} START again"
    );
    let again = store.get(id).await.unwrap().unwrap();
    assert_eq!(again, held, "{kind:?}: a repeated START must not disturb the holder");

    assert_eq!(verdict(kind, invoke(store, hints, stop_event(kind, id)).await), Verdict::Done, "{kind:?} STOP");
    let stopped = store.get(id).await.unwrap().unwrap();
    assert_eq!(stopped.desired_state, Some(DesiredState::Stopped));
    assert_eq!(
        (stopped.owner.as_deref(), stopped.fence, stopped.expires_at_ms),
        (Some("worker-a"), lease.fence, held.expires_at_ms)
    );
    // The holder learns of the STOP from the desired state and releases; the router never does.
    store.release(&lease).await.unwrap();
    assert!(matches!(store.acquire(id, "worker-b").await, Err(leaselock::Error::Stopped { .. })));
    store.get(id).await.unwrap().unwrap()
}

/// The state every kind must end in.
pub fn expected_settled(id: &str) -> Settled {
    Settled {
        desired_state: Some(DesiredState::Stopped),
        url: Some(format!("wss://feed.example/{id}")),
        owner: Some("worker-a".into()),
        fence: 1,
        last_seq: Some(7),
        ttl_set: true,
    }
}

/// Every malformed request is refused, names its field (where the kind can say it), and nothing
/// is written. Returns how many requests were refused.
pub async fn malformed_writes_nothing<S: LeaseStore + ?Sized>(kind: Kind, store: &S, hints: &dyn HintSender) -> usize {
    let cases = malformed(kind);
    for (what, field, event) in &cases {
        let verdict = verdict(kind, invoke(store, hints, event.clone()).await);
        match kind {
            // Dropped, not retried: SQS must not redeliver a request that can never succeed.
            Kind::Sqs => assert_eq!(verdict, Verdict::Done, "{kind:?} {what}: must not be retried"),
            _ => assert_eq!(verdict, Verdict::Refused(Some(field.to_string())), "{kind:?} {what}"),
        }
        assert!(store.items().await.unwrap().is_empty(), "{kind:?} {what}: something was written");
    }
    cases.len()
}

// ---------------------------------------------------------------------------------------------
// The local engine

/// The local engine's SDK config, or `None` (after saying so) when `AWS_ENDPOINT_URL` is unset.
/// With `LEASELOCK_REQUIRE_SERVICES=1` a missing engine is a failure, not a skip.
pub async fn services(test: &str) -> Option<aws_config::SdkConfig> {
    local_engine::endpoint(test)?;
    Some(aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await)
}

static NAME_SEQ: AtomicU64 = AtomicU64::new(0);

/// A name no other test (or test process) uses.
pub fn unique_name(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    format!("{prefix}-{}-{nanos}-{}", std::process::id(), NAME_SEQ.fetch_add(1, Ordering::SeqCst))
}

/// A fresh lease table with its index.
pub async fn table(sdk: &aws_config::SdkConfig, config: TableConfig) -> LeaseTable {
    let table = LeaseTable::new(aws_sdk_dynamodb::Client::new(sdk), config).unwrap();
    table.create_table().await.unwrap();
    table
}

/// A fresh hint queue.
pub async fn queue(sdk: &aws_config::SdkConfig) -> SqsHints {
    let client = aws_sdk_sqs::Client::new(sdk);
    let out = client.create_queue().queue_name(unique_name("ll-hints")).send().await.unwrap();
    SqsHints::new(client, out.queue_url().unwrap())
}

/// Receives (and deletes) hints until `expected` arrived and the queue then stays empty for a
/// second; panics after `limit`.
pub async fn receive_hints(hints: &SqsHints, expected: usize, limit: Duration) -> Vec<Hint> {
    let until = Instant::now() + limit;
    let mut got = Vec::new();
    let mut quiet_polls = 0;
    while quiet_polls < 2 || got.len() < expected {
        assert!(Instant::now() < until, "received {} of {expected} hints within {limit:?}", got.len());
        let out = hints
            .client()
            .receive_message()
            .queue_url(hints.queue_url())
            .max_number_of_messages(10)
            .visibility_timeout(300)
            .wait_time_seconds(if got.len() < expected { 1 } else { 0 })
            .send()
            .await
            .unwrap();
        let messages = out.messages();
        if messages.is_empty() {
            quiet_polls += 1;
            if got.len() >= expected {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            continue;
        }
        quiet_polls = 0;
        for m in messages {
            got.push(Hint::from_json(m.body().unwrap()).expect("a hint body"));
            hints
                .client()
                .delete_message()
                .queue_url(hints.queue_url())
                .receipt_handle(m.receipt_handle().unwrap())
                .send()
                .await
                .unwrap();
        }
    }
    got
}

/// Messages waiting on the queue (exact on the local engine).
pub async fn queue_depth(hints: &SqsHints) -> u64 {
    let out = hints
        .client()
        .get_queue_attributes()
        .queue_url(hints.queue_url())
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages)
        .send()
        .await
        .unwrap();
    out.attributes()
        .and_then(|a| a.get(&aws_sdk_sqs::types::QueueAttributeName::ApproximateNumberOfMessages))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// One seeded item: id, desired state, expiry, owner.
pub struct Seed {
    pub id: String,
    pub state: DesiredState,
    pub expires_at_ms: u64,
    pub owner: Option<String>,
}

/// Writes items straight to the table with BatchWriteItem (25 per call, 8 calls at once).
pub async fn seed(table: &LeaseTable, items: Vec<Seed>) {
    let config = table.config().clone();
    let a = &config.attributes;
    let requests: Vec<WriteRequest> = items
        .into_iter()
        .map(|s| {
            let mut item = HashMap::from([
                (a.id.clone(), AttributeValue::S(config.key(&s.id))),
                // The orphan index's partition value: STARTED (or its shard), or STOPPED.
                (
                    a.desired_state.clone(),
                    AttributeValue::S(match s.state {
                        DesiredState::Started => config.started_value(&s.id),
                        DesiredState::Stopped => s.state.as_str().into(),
                    }),
                ),
                (a.url.clone(), AttributeValue::S(format!("wss://feed.example/{}", s.id))),
                (a.expires_at_ms.clone(), AttributeValue::N(s.expires_at_ms.to_string())),
            ]);
            if let Some(owner) = s.owner {
                item.insert(a.owner.clone(), AttributeValue::S(owner));
                item.insert(a.fence.clone(), AttributeValue::N("1".into()));
            }
            WriteRequest::builder().put_request(PutRequest::builder().set_item(Some(item)).build().unwrap()).build()
        })
        .collect();
    let chunks: Vec<Vec<WriteRequest>> = requests.chunks(25).map(<[_]>::to_vec).collect();
    futures::stream::iter(chunks)
        .map(|chunk| {
            let client = table.client().clone();
            let name = config.table_name.clone();
            async move {
                let mut pending = chunk;
                for _ in 0..20 {
                    let out = client
                        .batch_write_item()
                        .request_items(name.clone(), pending.clone())
                        .send()
                        .await
                        .expect("BatchWriteItem");
                    pending = out.unprocessed_items().and_then(|u| u.get(&name)).cloned().unwrap_or_default();
                    if pending.is_empty() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                panic!("BatchWriteItem left items unprocessed");
            }
        })
        .buffer_unordered(8)
        .collect::<Vec<()>>()
        .await;
}

/// Consumes hints while they are sent, as a fleet of workers would: `consumers` receivers that
/// long-poll for `wait_seconds` and delete what they receive. Keeping the queue short matters on
/// the local engine, whose SendMessage cost grows with the number of messages waiting. Returns
/// every id received (duplicates included) once `expected` distinct ids have arrived, or
/// whatever arrived by `limit`.
pub fn drain(
    hints: &SqsHints,
    expected: usize,
    consumers: usize,
    wait_seconds: i32,
    limit: Duration,
) -> tokio::task::JoinHandle<Vec<String>> {
    let hints = hints.clone();
    tokio::spawn(async move {
        let until = Instant::now() + limit;
        let received = std::sync::Arc::new(std::sync::Mutex::new((Vec::new(), std::collections::HashSet::new())));
        let count = std::sync::Arc::new(AtomicU64::new(0));
        let tasks: Vec<_> = (0..consumers)
            .map(|_| {
                let (hints, received, count) = (hints.clone(), received.clone(), count.clone());
                tokio::spawn(async move {
                    while (count.load(Ordering::SeqCst) as usize) < expected && Instant::now() < until {
                        let Ok(out) = hints
                            .client()
                            .receive_message()
                            .queue_url(hints.queue_url())
                            .max_number_of_messages(10)
                            .visibility_timeout(300)
                            .wait_time_seconds(wait_seconds)
                            .send()
                            .await
                        else {
                            continue;
                        };
                        let messages = out.messages();
                        if messages.is_empty() {
                            if wait_seconds == 0 {
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                            continue;
                        }
                        let entries: Vec<_> = messages
                            .iter()
                            .enumerate()
                            .map(|(i, m)| {
                                aws_sdk_sqs::types::DeleteMessageBatchRequestEntry::builder()
                                    .id(i.to_string())
                                    .receipt_handle(m.receipt_handle().unwrap_or_default())
                                    .build()
                                    .unwrap()
                            })
                            .collect();
                        let ids: Vec<String> = messages
                            .iter()
                            .map(|m| Hint::from_json(m.body().unwrap_or_default()).expect("a hint body").connection_id)
                            .collect();
                        {
                            // Delivery is at least once: stop on distinct ids, keep every copy.
                            let (all, distinct) = &mut *received.lock().unwrap();
                            distinct.extend(ids.iter().cloned());
                            all.extend(ids);
                            count.store(distinct.len() as u64, Ordering::SeqCst);
                        }
                        let _ = hints
                            .client()
                            .delete_message_batch()
                            .queue_url(hints.queue_url())
                            .set_entries(Some(entries))
                            .send()
                            .await;
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        let out = received.lock().unwrap().0.clone();
        out
    })
}

// ---------------------------------------------------------------------------------------------
// Hostile input: ids and urls no entry point may accept, and what the answers may show of them

/// Ids that look harmless or forge output: control characters (Unicode Cc) and invisible
/// format characters.
pub const HOSTILE_IDS: &[(&str, &str)] = &[
    ("NUL", "s1\0"),
    ("CR LF", "s1\r\n2026-01-01T00:00:00Z INFO forged log line"),
    ("LF", "s1\n"),
    ("TAB", "s\t1"),
    ("DEL", "s1\u{7f}"),
    ("ESC sequence", "\u{1b}[2J\u{1b}[Hs1"),
    ("OSC title", "\u{1b}]0;pwned\u{7}s1"),
    ("C1 CSI", "\u{9b}31ms1"),
    ("bidi override", "s1\u{202e}gpj.exe"),
    ("bidi isolate", "\u{2066}s1\u{2069}"),
    ("zero-width space", "s\u{200b}1"),
    ("byte order mark", "\u{feff}s1"),
];

/// Every byte of `s` as `%XX` except unreserved ASCII.
pub fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// A hostile request: what it is, the field the answer must name, a phrase the answer's
/// message must hold (HTTP and direct; SQS only logs it), and the event.
pub struct Hostile {
    pub what: String,
    pub field: &'static str,
    pub says: &'static str,
    pub event: Value,
}

fn command_event(kind: Kind, command: Value) -> Value {
    match kind {
        Kind::Http => unreachable!("HTTP requests are built from paths"),
        Kind::Sqs => sqs_event(&[command.to_string()]),
        Kind::Direct => command,
    }
}

/// Bad ids and urls through `kind`: START and STOP with each hostile id (over HTTP both as a
/// path parameter and percent-encoded in a `$default` path), urls with control characters,
/// invisible characters or too long (the length is what must be reported), huge ids.
pub fn hostile(kind: Kind) -> Vec<Hostile> {
    let chars = "control and invisible format characters";
    let url = "wss://feed.example/s";
    let mut cases = Vec::new();
    let mut push = |what: String, field, says, event| cases.push(Hostile { what, field, says, event });
    let url_body = json!({ "url": url }).to_string();
    let huge_id = "\u{1b}".repeat(2_000_000);
    for (name, id) in HOSTILE_IDS.iter().copied().chain([("2 MB of ESC", huge_id.as_str())]) {
        let says = if id.len() > 1024 { "too long" } else { chars };
        match kind {
            Kind::Http => {
                let path = |action: &str| format!("/connections/{}/{action}", percent_encode(id));
                let start = "/connections/{id}/start";
                let stop = "/connections/{id}/stop";
                push(
                    format!("START {name}"),
                    "connection_id",
                    says,
                    http_event("POST", start, &path("start"), Some(id), Some(&url_body)),
                );
                push(
                    format!("STOP {name}"),
                    "connection_id",
                    says,
                    http_event("POST", stop, &path("stop"), Some(id), None),
                );
                push(
                    format!("GET {name}"),
                    "connection_id",
                    says,
                    http_event(
                        "GET",
                        "/connections/{id}",
                        &format!("/connections/{}", percent_encode(id)),
                        Some(id),
                        None,
                    ),
                );
                push(
                    format!("START {name}, percent-encoded in a $default path"),
                    "connection_id",
                    says,
                    http_event("POST", "$default", &path("start"), None, Some(&url_body)),
                );
            }
            _ => {
                push(format!("START {name}"), "connection_id", says, command_event(kind, start_command(id, url)));
                push(format!("STOP {name}"), "connection_id", says, command_event(kind, stop_command(id)));
            }
        }
    }
    let urls: Vec<(&str, String, &'static str)> = vec![
        ("url with ESC", "wss://feed.example/\u{1b}[2J".into(), "U+001B"),
        ("url with CR LF", "wss://feed.example/s\r\nHost: evil".into(), "U+000D"),
        ("url with NUL", "wss://feed.example/\0".into(), "U+0000"),
        ("url with a bidi override", "wss://feed.example/\u{202e}s".into(), "U+202E"),
        ("url over 4 kB", format!("wss://feed.example/{}", "x".repeat(5000)), "too long"),
        ("url over 4 kB without a host", format!("wss://{}", "/".repeat(5000)), "too long"),
        ("url over 4 kB of escapes", format!("https://{}", "\u{1b}\"".repeat(1_000_000)), "too long"),
    ];
    for (name, bad, says) in urls {
        let event = match kind {
            Kind::Http => {
                let body = json!({ "url": bad }).to_string();
                http_event("POST", "/connections/{id}/start", "/connections/s1/start", Some("s1"), Some(&body))
            }
            _ => command_event(kind, start_command("s1", &bad)),
        };
        push(name.to_string(), "url", says, event);
    }
    cases
}

/// The size of the answer as the Lambda runtime would send it.
pub fn answer_size(result: &Result<Value, RouterError>) -> usize {
    match result {
        Ok(v) => v.to_string().len(),
        Err(e) => json!({ "errorType": e.kind(), "errorMessage": e.to_string() }).to_string().len(),
    }
}

/// The error text the caller reads: the HTTP body's `error`, the direct invocation's message.
pub fn error_text(kind: Kind, result: &Result<Value, RouterError>) -> Option<String> {
    match (kind, result) {
        (Kind::Http, Ok(response)) => {
            let body: Value = serde_json::from_str(response["body"].as_str()?).ok()?;
            body["error"].as_str().map(str::to_string)
        }
        (_, Err(e)) => Some(e.to_string()),
        _ => None,
    }
}

/// Whether a text shows a character ids refuse (it would reach a terminal or a log raw).
pub fn shows_raw(text: &str) -> bool {
    text.chars().any(leaselock::config::is_refused_char)
}

/// The router's log lines while `f` runs, as `target: message field=value ...` (only ours).
pub struct LogCapture {
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    _guard: tracing::dispatcher::DefaultGuard,
}

impl LogCapture {
    /// Captures the current thread's events from now on (tokio tests run on one thread).
    pub fn start() -> Self {
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let guard = tracing::dispatcher::set_default(&tracing::Dispatch::new(Capture(lines.clone())));
        LogCapture { lines, _guard: guard }
    }

    /// Takes the lines captured so far.
    pub fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.lines.lock().unwrap())
    }
}

struct Capture(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

struct Line(String);

impl tracing::field::Visit for Line {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        use std::fmt::Write;
        // As tracing-subscriber's fmt layer writes a field: `%` values through Display.
        let _ = write!(self.0, " {}={value:?}", field.name());
    }
}

impl tracing::Subscriber for Capture {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        metadata.target().starts_with("leaselock")
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut line = Line(format!("{}:", event.metadata().target()));
        event.record(&mut line);
        self.0.lock().unwrap().push(line.0);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// The largest answer or log line a refused request may produce.
pub const MAX_ERROR_BYTES: usize = 8 * 1024;

/// Every hostile request is refused naming its field and saying why, its answer and log lines
/// are small and show no raw control character, and nothing is written or hinted (checked on
/// `store` after each case; the caller checks the queue). Returns how many requests were sent.
pub async fn hostile_writes_nothing<S: LeaseStore + ?Sized>(kind: Kind, store: &S, hints: &dyn HintSender) -> usize {
    let cases = hostile(kind);
    let logs = LogCapture::start();
    for Hostile { what, field, says, event } in &cases {
        let result = invoke(store, hints, event.clone()).await;
        let size = answer_size(&result);
        assert!(size < MAX_ERROR_BYTES, "{kind:?} {what}: a {size}-byte answer");
        let text = error_text(kind, &result);
        let verdict = verdict(kind, result);
        let lines = logs.take();
        match kind {
            Kind::Sqs => {
                assert_eq!(verdict, Verdict::Done, "{kind:?} {what}: dropped, not retried");
                let line = lines.iter().find(|l| l.contains("dropping")).unwrap_or_else(|| panic!("{what}: {lines:?}"));
                assert!(line.contains(field) && line.contains(says), "{kind:?} {what}: {line}");
            }
            _ => {
                assert_eq!(verdict, Verdict::Refused(Some(field.to_string())), "{kind:?} {what}");
                let text = text.unwrap_or_else(|| panic!("{kind:?} {what}: no error text"));
                assert!(text.contains(says), "{kind:?} {what}: {text:?} should say {says:?}");
                assert!(!shows_raw(&text), "{kind:?} {what}: raw control characters in {text:?}");
                assert!(!text.contains(r"\\u{"), "{kind:?} {what}: escaped twice: {text}");
            }
        }
        for line in &lines {
            assert!(line.len() < MAX_ERROR_BYTES, "{kind:?} {what}: a {}-byte log line", line.len());
            assert!(!shows_raw(line), "{kind:?} {what}: raw control characters logged: {line:?}");
            assert!(!line.contains(r"\\u{"), "{kind:?} {what}: escaped twice in the log: {line}");
        }
        assert!(store.items().await.unwrap().is_empty(), "{kind:?} {what}: something was written");
    }
    cases.len()
}

/// Receives from the hint queue once (long poll `wait` seconds) and returns the bodies.
pub async fn receive_bodies(hints: &SqsHints, wait: i32) -> Vec<String> {
    let out = hints
        .client()
        .receive_message()
        .queue_url(hints.queue_url())
        .max_number_of_messages(10)
        .wait_time_seconds(wait)
        .send()
        .await
        .unwrap();
    out.messages().iter().map(|m| m.body().unwrap_or_default().to_string()).collect()
}
