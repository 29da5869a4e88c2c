//! Write cost of holding work, per-item leases and session leases side by side, counted from the
//! requests each worker's `LeaseTable` actually sent: 4 workers per mode hold 400 connections
//! (100 each) for `LEASELOCK_BENCH_HOLD_S` (120) seconds at the default timing (lease 20 s, renew
//! 5 s, orphan query every 2 s), on the local engine, both modes at the same time. Writes per
//! connection-hour go to `bench/results/latest.json` as `writes_per_connection_hour` (per-item)
//! and `session_writes_per_connection_hour` (other keys of the file are kept). Run with `make bench`.
//!
//! Every request attempt the fleets' SDK clients transmit also passes through [`Meter`], which
//! reads the request (and, for queries, the answer) and prices it by DynamoDB's billing rules:
//! requests per connection-hour, write units per connection-hour (table and index writes), and the
//! read units of the orphan index queries per worker-hour.
//!
//! Knobs: `LEASELOCK_BENCH_CONNECTIONS` (400), `LEASELOCK_BENCH_WORKERS` (4),
//! `LEASELOCK_BENCH_HOLD_S` (120).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::config::interceptors::{
    AfterDeserializationInterceptorContextRef, BeforeTransmitInterceptorContextRef,
};
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_dynamodb::types::AttributeValue;
use aws_smithy_types::config_bag::{Storable, StoreReplace};

use leaselock::worker::{BoxError, Worker, WorkerHandle};
use leaselock::{LeaseMode, LeaseStore, LeaseTable, TableConfig, WorkerSnapshot};
use tokio::task::JoinHandle;

fn knob(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// What one mode's fleet sent, priced by DynamoDB's billing rules (on-demand / provisioned units
/// are the same units):
/// - a write of an item up to 1 KB is 1 write unit (every item here is smaller: checked at the
///   end), twice that inside TransactWriteItems (ConditionCheck items included);
/// - a global secondary index is written when a write touches it: a change of its key attributes
///   is a delete and an insert (2 units), a change of a projected attribute 1 unit. Every item
///   this bench writes carries `desired_state` (connections STARTED, sessions the session
///   partition), so it is in the orphan index (key desired_state + lease_expires_at_ms, ALL
///   attributes projected); the owner index (key lease_owner, KEYS_ONLY) is written only when
///   `lease_owner` is set;
/// - a Query costs the size of the items it read, rounded up to 4 KB, at 0.5 units per 4 KB
///   (index queries are eventually consistent), 0.5 units at least.
#[derive(Debug, Default)]
struct Meter {
    config: TableConfig,
    counts: Mutex<MeterCounts>,
}

#[derive(Debug, Default, Clone)]
struct MeterCounts {
    requests: BTreeMap<String, u64>,
    table_write_units: f64,
    index_write_units: f64,
    /// Orphan index queries for unowned work (`desired_state = STARTED`), and their read units.
    orphan_queries: u64,
    orphan_query_read_units: f64,
    /// Every other query (dead sessions, a worker's own items), and their read units.
    other_queries: u64,
    other_query_read_units: f64,
}

impl MeterCounts {
    fn minus(&self, before: &MeterCounts) -> MeterCounts {
        let mut requests = self.requests.clone();
        for (k, v) in &before.requests {
            *requests.entry(k.clone()).or_default() -= v;
        }
        MeterCounts {
            requests,
            table_write_units: self.table_write_units - before.table_write_units,
            index_write_units: self.index_write_units - before.index_write_units,
            orphan_queries: self.orphan_queries - before.orphan_queries,
            orphan_query_read_units: self.orphan_query_read_units - before.orphan_query_read_units,
            other_queries: self.other_queries - before.other_queries,
            other_query_read_units: self.other_query_read_units - before.other_query_read_units,
        }
    }

    fn total_requests(&self) -> u64 {
        self.requests.values().sum()
    }
}

/// Which kind of query an attempt in flight is, from its request to its answer.
#[derive(Debug, Clone, Copy)]
struct QueryKind {
    orphans: bool,
}

impl Storable for QueryKind {
    type Storer = StoreReplace<Self>;
}

/// The attribute names an update expression writes (`#name` placeholders and plain names).
fn written_attributes(request: &serde_json::Value) -> BTreeSet<String> {
    let names = &request["ExpressionAttributeNames"];
    let expr = request["UpdateExpression"].as_str().unwrap_or_default();
    let mut out = BTreeSet::new();
    for clause in expr.split(|c: char| c == ',' || c.is_whitespace()) {
        let word = clause.split(['=', '+', '-', '(', ')']).next().unwrap_or_default();
        match word {
            "" | "SET" | "REMOVE" | "ADD" | "DELETE" => {}
            w if w.starts_with('#') => out.extend(names[w].as_str().map(String::from)),
            w if !w.starts_with(':') && !w.contains(char::is_numeric) => {
                out.insert(w.to_string());
            }
            _ => {}
        }
    }
    out
}

impl Meter {
    /// Index write units of one write of an item that sets `written` (None: a whole-item Put or
    /// Delete, which writes every index the item is in).
    fn index_units(&self, written: Option<&BTreeSet<String>>) -> f64 {
        let a = &self.config.attributes;
        let touches = |attr: &str| written.is_none_or(|w| w.contains(attr));
        let orphan_index = if touches(&a.desired_state) || touches(&a.expires_at_ms) {
            2.0
        } else if written.is_none_or(|w| !w.is_empty()) {
            1.0
        } else {
            0.0
        };
        let owner_index = if touches(&a.owner) { 2.0 } else { 0.0 };
        orphan_index + owner_index
    }

    fn price_write(&self, counts: &mut MeterCounts, kind: &str, request: &serde_json::Value, transactional: bool) {
        let factor = if transactional { 2.0 } else { 1.0 };
        match kind {
            "Update" | "UpdateItem" => {
                counts.table_write_units += factor;
                counts.index_write_units += self.index_units(Some(&written_attributes(request)));
            }
            "Put" | "PutItem" | "Delete" | "DeleteItem" => {
                counts.table_write_units += factor;
                counts.index_write_units += self.index_units(None);
            }
            "ConditionCheck" => counts.table_write_units += factor,
            _ => {}
        }
    }
}

/// DynamoDB's item size: attribute names plus values (numbers: about one byte per two digits).
fn item_bytes(item: &std::collections::HashMap<String, AttributeValue>) -> usize {
    fn value_bytes(v: &AttributeValue) -> usize {
        match v {
            AttributeValue::S(s) => s.len(),
            AttributeValue::N(n) => n.trim_start_matches('-').replace('.', "").len().div_ceil(2) + 1,
            AttributeValue::B(b) => b.as_ref().len(),
            AttributeValue::Bool(_) | AttributeValue::Null(_) => 1,
            AttributeValue::Ss(v) => v.iter().map(String::len).sum(),
            AttributeValue::Ns(v) => v.iter().map(|n| n.len().div_ceil(2) + 1).sum(),
            AttributeValue::L(v) => 3 + v.iter().map(|x| 1 + value_bytes(x)).sum::<usize>(),
            AttributeValue::M(m) => 3 + m.iter().map(|(k, x)| 1 + k.len() + value_bytes(x)).sum::<usize>(),
            _ => 0,
        }
    }
    item.iter().map(|(k, v)| k.len() + value_bytes(v)).sum()
}

/// The meter as the SDK client holds it (one per fleet, shared by its workers' tables).
#[derive(Debug)]
struct MeterHandle(Arc<Meter>);

impl Intercept for MeterHandle {
    fn name(&self) -> &'static str {
        "WriteCostMeter"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), aws_sdk_dynamodb::error::BoxError> {
        let request = context.request();
        let operation =
            request.headers().get("x-amz-target").and_then(|t| t.rsplit('.').next()).unwrap_or("unknown").to_string();
        let body: serde_json::Value =
            request.body().bytes().and_then(|b| serde_json::from_slice(b).ok()).unwrap_or_default();
        let mut counts = self.0.counts.lock().unwrap();
        *counts.requests.entry(operation.clone()).or_default() += 1;
        match operation.as_str() {
            "UpdateItem" | "PutItem" | "DeleteItem" => self.0.price_write(&mut counts, &operation, &body, false),
            "TransactWriteItems" => {
                for item in body["TransactItems"].as_array().into_iter().flatten() {
                    for (kind, request) in item.as_object().into_iter().flatten() {
                        self.0.price_write(&mut counts, kind, request, true);
                    }
                }
            }
            "Query" => {
                let orphans = body["IndexName"].as_str() == Some(self.0.config.index_name.as_str())
                    && body["ExpressionAttributeValues"][":started"].is_object();
                cfg.interceptor_state().store_put(QueryKind { orphans });
            }
            _ => {}
        }
        Ok(())
    }

    fn read_after_deserialization(
        &self,
        context: &AfterDeserializationInterceptorContextRef<'_>,
        _components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), aws_sdk_dynamodb::error::BoxError> {
        let Some(kind) = cfg.load::<QueryKind>().copied() else { return Ok(()) };
        let Ok(output) = context.output_or_error() else { return Ok(()) };
        let Some(output) = output.downcast_ref::<aws_sdk_dynamodb::operation::query::QueryOutput>() else {
            return Ok(());
        };
        let bytes: usize = output.items().iter().map(item_bytes).sum();
        let units = (bytes.div_ceil(4096).max(1)) as f64 * 0.5;
        let mut counts = self.0.counts.lock().unwrap();
        if kind.orphans {
            counts.orphan_queries += 1;
            counts.orphan_query_read_units += units;
        } else {
            counts.other_queries += 1;
            counts.other_query_read_units += units;
        }
        Ok(())
    }
}

struct Fleet {
    meter: Arc<Meter>,
    tables: Vec<LeaseTable>,
    workers: Vec<(WorkerHandle, JoinHandle<WorkerSnapshot>)>,
}

impl Fleet {
    async fn start(sdk: &aws_config::SdkConfig, mode: LeaseMode, workers: usize, connections: usize) -> Fleet {
        let name = format!("bench-{}-{}-{}", mode.as_str(), std::process::id(), rand::random::<u32>());
        let config = TableConfig::new(name).mode(mode);
        let meter = Arc::new(Meter { config: config.clone(), counts: Mutex::default() });
        let client = aws_sdk_dynamodb::Client::from_conf(
            aws_sdk_dynamodb::config::Builder::from(sdk).interceptor(MeterHandle(meter.clone())).build(),
        );
        // Setting up 400 items on a loaded local engine may take longer than a command's budget.
        let setup = LeaseTable::new(client.clone(), config.clone().operation_budget(Duration::from_secs(120))).unwrap();
        setup.create_table().await.unwrap();
        for i in 0..connections {
            setup.start(&format!("c{i:04}"), &format!("wss://feed.example/c{i:04}")).await.unwrap();
        }
        let per_worker = connections.div_ceil(workers);
        let mut fleet = Fleet { meter, tables: Vec::new(), workers: Vec::new() };
        for w in 0..workers {
            // One table handle per worker: one request counter per worker.
            let table = LeaseTable::new(client.clone(), config.clone()).unwrap();
            let worker = Worker::builder(Arc::new(table.clone()) as Arc<dyn LeaseStore>)
                .worker_id(format!("{}-{w}", mode.as_str()))
                // Room for one more: a full worker stops querying the orphan index, and that
                // query's cost is measured here too.
                .max_connections(per_worker + 1)
                .metrics_writer(std::io::sink())
                .build(|conn| async move {
                    conn.cancelled().await;
                    Ok::<(), BoxError>(())
                })
                .unwrap();
            fleet.tables.push(table);
            let handle = worker.handle();
            fleet.workers.push((handle, tokio::spawn(worker.run_until(std::future::pending()))));
        }
        fleet
    }

    fn held(&self) -> usize {
        self.workers.iter().map(|(h, _)| h.snapshot().held.len()).sum()
    }

    fn metered(&self) -> MeterCounts {
        self.meter.counts.lock().unwrap().clone()
    }

    /// The largest item of the table, bytes (the write unit rule above assumes <= 1 KB).
    async fn largest_item(&self) -> usize {
        let table = &self.tables[0];
        let mut pages = table.client().scan().table_name(&table.config().table_name).into_paginator().items().send();
        let mut largest = 0;
        while let Some(item) = pages.next().await {
            largest = largest.max(item_bytes(&item.unwrap()));
        }
        largest
    }

    fn writes(&self) -> u64 {
        self.tables.iter().map(|t| t.requests_sent().writes()).sum()
    }

    async fn stop(self) {
        for (h, _) in &self.workers {
            h.shutdown();
        }
        for (_, task) in self.workers {
            let _ = task.await;
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("write-cost bench: run it with `cargo bench` (make bench)");
        return;
    }
    if std::env::var_os("AWS_ENDPOINT_URL").is_none() {
        eprintln!("write-cost bench: AWS_ENDPOINT_URL is not set; run it through scripts/with-services.sh");
        std::process::exit(1);
    }
    let connections = knob("LEASELOCK_BENCH_CONNECTIONS", 400) as usize;
    let workers = knob("LEASELOCK_BENCH_WORKERS", 4) as usize;
    let hold = Duration::from_secs(knob("LEASELOCK_BENCH_HOLD_S", 120));
    let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;

    let per_item = Fleet::start(&sdk, LeaseMode::PerItem, workers, connections).await;
    let session = Fleet::start(&sdk, LeaseMode::Session, workers, connections).await;
    let settle = Instant::now();
    while per_item.held() < connections || session.held() < connections {
        assert!(settle.elapsed() < Duration::from_secs(180), "fleets did not take all the work");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("both fleets hold {connections} connections after {:.1} s", settle.elapsed().as_secs_f64());
    // Counted over the holding window only: claims are not the heartbeat's cost.
    let (item_before, session_before) = (per_item.writes(), session.writes());
    let (item_metered_before, session_metered_before) = (per_item.metered(), session.metered());
    let start = Instant::now();
    tokio::time::sleep(hold).await;
    let elapsed = start.elapsed();
    let (item_writes, session_writes) = (per_item.writes() - item_before, session.writes() - session_before);
    let item_metered = per_item.metered().minus(&item_metered_before);
    let session_metered = session.metered().minus(&session_metered_before);
    assert_eq!(per_item.held(), connections, "per-item fleet lost work while holding");
    assert_eq!(session.held(), connections, "session fleet lost work while holding");
    let largest_item = per_item.largest_item().await.max(session.largest_item().await);
    assert!(largest_item <= 1024, "an item of {largest_item} bytes: the 1 KB write unit rule does not hold");
    let connection_hours = connections as f64 * elapsed.as_secs_f64() / 3600.0;
    let worker_hours = workers as f64 * elapsed.as_secs_f64() / 3600.0;
    let item_rate = item_writes as f64 / connection_hours;
    let session_rate = session_writes as f64 / connection_hours;
    let units = |m: &MeterCounts| (m.table_write_units + m.index_write_units) / connection_hours;
    // A worker with room queries once per (jittered, symmetric) interval: 1,800 queries an hour at
    // the default 2 s. A full worker does not query, so the figure is per query measured, times
    // the default rate.
    let queries_per_hour = 3600.0 / leaselock::worker::DEFAULT_ORPHAN_INTERVAL.as_secs_f64();
    let orphan_units_per_hour = |m: &MeterCounts| {
        assert!(m.orphan_queries > 0, "no orphan query in the window: no worker had room");
        m.orphan_query_read_units / m.orphan_queries as f64 * queries_per_hour
    };
    println!(
        "held {connections} connections with {workers} workers per mode for {:.1} s: per-item {item_writes} writes \
         ({item_rate:.1} per connection-hour), session {session_writes} writes ({session_rate:.2} per connection-hour)",
        elapsed.as_secs_f64()
    );
    println!(
        "per connection-hour: per-item {:.1} requests, {:.1} write units; session {:.2} requests, {:.2} write units; \
         orphan queries {:.0} read units per worker-hour",
        item_metered.total_requests() as f64 / connection_hours,
        units(&item_metered),
        session_metered.total_requests() as f64 / connection_hours,
        units(&session_metered),
        orphan_units_per_hour(&item_metered),
    );
    per_item.stop().await;
    session.stop().await;

    let round = |v: f64| (v * 100.0).round() / 100.0;
    let breakdown = |m: &MeterCounts, writes: u64| {
        serde_json::json!({
            "requests": m.requests, "writes_counted_by_table": writes,
            "table_write_units": round(m.table_write_units), "index_write_units": round(m.index_write_units),
            "orphan_queries": m.orphan_queries, "orphan_query_read_units": round(m.orphan_query_read_units),
            "other_queries": m.other_queries, "other_query_read_units": round(m.other_query_read_units),
        })
    };
    let results = serde_json::json!({
        "writes_per_connection_hour": round(item_rate),
        "session_writes_per_connection_hour": round(session_rate),
        "requests_per_connection_hour": round(item_metered.total_requests() as f64 / connection_hours),
        "session_requests_per_connection_hour": round(session_metered.total_requests() as f64 / connection_hours),
        "write_units_per_connection_hour": round(units(&item_metered)),
        "session_write_units_per_connection_hour": round(units(&session_metered)),
        "orphan_query_read_units_per_hour": round(orphan_units_per_hour(&item_metered)),
        "session_orphan_query_read_units_per_hour": round(orphan_units_per_hour(&session_metered)),
        "write_cost_setup": {
            "connections": connections, "workers_per_mode": workers, "held_s": round(elapsed.as_secs_f64()),
            "renew_interval_s": 5, "lease_s": 20, "orphan_interval_s": 2, "largest_item_bytes": largest_item,
            "per_item_writes": item_writes, "session_writes": session_writes,
            "per_item": breakdown(&item_metered, item_writes), "session": breakdown(&session_metered, session_writes),
            "counted_from": "every request attempt the workers' SDK clients transmitted (an interceptor), \
                             priced by DynamoDB's billing rules; writes also from each LeaseTable's own counter",
            "orphan_query_read_units_per_hour": "per worker with room to claim (a full worker does not query): the \
                                                 read units of the orphan index queries sent in the window (item bytes \
                                                 read rounded up to 4 KB, 0.5 units per 4 KB, 0.5 at least) per query, \
                                                 times 1,800 queries an hour (default 2 s interval)",
            "orphan_queries_per_worker_hour_measured": round(item_metered.orphan_queries as f64 / worker_hours),
        },
    });
    // Merged key by key into bench/results/latest.json by the helper every section uses.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut merge = std::process::Command::new("python3")
        .arg(root.join("bench/merge.py"))
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("python3 bench/merge.py");
    std::io::Write::write_all(merge.stdin.as_mut().unwrap(), results.to_string().as_bytes()).unwrap();
    drop(merge.stdin.take());
    assert!(merge.wait().unwrap().success(), "bench/merge.py failed");
    assert!(session_rate <= 10.0, "session mode: {session_rate:.2} writes per connection-hour");
}
