//! The orphan index's hot partition, on the local engine with DynamoDB's per-partition limits
//! scaled down 20x (50 write units/s per partition key value instead of 1,000; see
//! scripts/partition_limits.py).
//!
//! In per-item mode every renewal moves the orphan index's sort key under one partition value
//! (`STARTED`): a delete and an insert in the index, 2 index write units per renewal. 50
//! connections renewing every second ask 100 units/s of that one index partition: twice what it
//! serves, so renewals are throttled there (as 1,000 connections renewing every second, or 2,500
//! every 5 s, would be on DynamoDB). Session mode holds the same 50 connections with one session
//! renewal per worker per second and does not touch the connection items while it holds them:
//! nothing is throttled.
//!
//! The test starts an engine of its own on a free loopback port (the project's `.venv`, as
//! `scripts/services.sh install` makes it) with `LEASELOCK_PARTITION_WCU=50` and stops it by its
//! pid; each mode runs two real workers (lease 3 s, renew 1 s, skew 0.5 s) on a table of its own,
//! both modes at once. The engine's counts (`/_leaselock/partitions`) are read over a steady window.

mod worker_support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use leaselock::worker::{BoxError, Worker, WorkerHandle};
use leaselock::{LeaseMode, LeaseStore, LeaseTable, TableConfig, WorkerSnapshot};
use serde_json::Value;
use tokio::task::JoinHandle;
use worker_support::*;

/// Write units per second per partition key value: DynamoDB's 1,000 / 20.
const PARTITION_WCU: u32 = 50;
/// Connections per mode: 2 index units per renewal every second = 100 units/s in per-item mode.
const CONNECTIONS: usize = 50;
const WORKERS: usize = 2;
/// How long the steady state is observed.
const WINDOW: Duration = Duration::from_secs(4);

/// The local engine with per-partition limits, on a port of its own; killed (by its pid) on drop.
struct LimitedEngine {
    child: Child,
    port: u16,
}

impl LimitedEngine {
    fn start(wcu: u32) -> Option<Self> {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
        let python = root.join(".venv/bin/python");
        if !python.exists() {
            let required = std::env::var_os("LEASELOCK_REQUIRE_SERVICES").is_some() || std::env::var_os("CI").is_some();
            assert!(!required, "{} is missing: scripts/services.sh install makes it", python.display());
            eprintln!("skipped: the hot partition test needs {} (scripts/services.sh install)", python.display());
            return None;
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new(python)
            .arg(root.join("scripts/local_engine.py"))
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .env("LEASELOCK_PARTITION_WCU", wcu.to_string())
            .env_remove("LEASELOCK_PARTITION_RCU")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the local engine");
        let mut engine = LimitedEngine { child, port };
        let deadline = Instant::now() + Duration::from_secs(60);
        while engine.get("/_leaselock/partitions").is_err() {
            assert!(engine.child.try_wait().unwrap().is_none(), "the limited engine exited");
            assert!(Instant::now() < deadline, "the limited engine did not answer within 60 s");
            std::thread::sleep(Duration::from_millis(100));
        }
        Some(engine)
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// One plain HTTP request to the engine's own counters (not a DynamoDB call).
    fn request(&self, method: &str, path: &str) -> std::io::Result<Value> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(s, "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n")?;
        let mut answer = String::new();
        s.read_to_string(&mut answer)?;
        let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
        if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
            return Err(std::io::Error::other(head.lines().next().unwrap_or("").to_string()));
        }
        serde_json::from_str(body).map_err(std::io::Error::other)
    }

    fn get(&self, path: &str) -> std::io::Result<Value> {
        self.request("GET", path)
    }

    fn reset(&self) {
        self.request("POST", "/_leaselock/partitions/reset").unwrap();
    }
}

impl Drop for LimitedEngine {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Fleet {
    table: LeaseTable,
    workers: Vec<(WorkerHandle, JoinHandle<WorkerSnapshot>)>,
}

impl Fleet {
    async fn start(sdk: &aws_config::SdkConfig, endpoint: &str, mode: LeaseMode) -> Fleet {
        let conf = aws_sdk_dynamodb::config::Builder::from(sdk).endpoint_url(endpoint).build();
        let config = TableConfig { table_name: unique("hot"), ..short_config().mode(mode) };
        let table = LeaseTable::new(aws_sdk_dynamodb::Client::from_conf(conf), config).unwrap();
        table.create_table().await.unwrap();
        start_items(&table, "conn-", CONNECTIONS).await;
        let store: Arc<dyn LeaseStore> = Arc::new(table.clone());
        let workers = (0..WORKERS)
            .map(|i| {
                let worker = Worker::builder(store.clone())
                    .worker_id(format!("{}-w{i}", mode.as_str()))
                    .max_connections(CONNECTIONS)
                    .orphan_interval(Duration::from_millis(500))
                    .metrics_writer(Lines::default())
                    .build(|conn| async move {
                        conn.cancelled().await;
                        Ok::<(), BoxError>(())
                    })
                    .unwrap();
                let handle = worker.handle();
                (handle, tokio::spawn(worker.run_until(std::future::pending())))
            })
            .collect();
        Fleet { table, workers }
    }

    /// How many connections each worker holds.
    fn spread(&self) -> Vec<usize> {
        self.workers.iter().map(|(h, _)| h.held_ids().len()).collect()
    }

    fn held(&self) -> usize {
        self.workers.iter().map(|(h, _)| h.held_ids().len()).sum()
    }

    async fn stop(self) {
        for (handle, task) in self.workers {
            handle.shutdown();
            let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
        }
    }
}

/// Per partition of `table` (index or table, partition value): (units, peak units/s, throttled).
fn partitions(stats: &Value, table: &str) -> Vec<(String, String, f64, f64, u64)> {
    stats["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["table"] == table && p["kind"] == "write")
        .map(|p| {
            (
                p["index"].as_str().unwrap_or("(table)").to_string(),
                p["partition"].as_str().unwrap_or("").to_string(),
                p["units"].as_f64().unwrap(),
                p["peak_units_per_s"].as_f64().unwrap(),
                p["throttled"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_item_renewals_throttle_on_the_started_index_partition_and_sessions_do_not() {
    let Some(sdk) = aws().await else { return };
    let Some(engine) = LimitedEngine::start(PARTITION_WCU) else { return };
    let endpoint = engine.endpoint();
    let (per_item, session) = tokio::join!(
        Fleet::start(&sdk, &endpoint, LeaseMode::PerItem),
        Fleet::start(&sdk, &endpoint, LeaseMode::Session)
    );
    let index = per_item.table.config().index_name.clone();
    let started = per_item.table.config().started_partition.clone();
    let session_partition = session.table.config().session_partition.clone();
    let (per_item_table, session_table) =
        (per_item.table.config().table_name.clone(), session.table.config().table_name.clone());

    // Session mode takes every connection and keeps them; it is observed once its workers have
    // balanced (who holds what unchanged for longer than the pace of hand-over rounds, and a
    // second more), so the window holds no claims or hand-overs.
    // Per-item mode cannot keep 50 at this limit (renewals past their deadline lose leases, which
    // are claimed again): by then it has taken at least as many as the index partition can renew.
    let began = Instant::now();
    let mut last = (session.spread(), Instant::now());
    loop {
        let spread = session.spread();
        if spread != last.0 {
            last = (spread, Instant::now());
        }
        let pace = leaselock::worker::decide::balance_pace_ms(session.table.config().renew_ms(), 500);
        let settled = last.1.elapsed() >= Duration::from_millis(pace + 1_000);
        if settled && session.held() == CONNECTIONS && per_item.held() >= CONNECTIONS / 2 {
            break;
        }
        assert!(
            began.elapsed() < Duration::from_secs(60),
            "fleets did not settle: session mode holds {:?} of {CONNECTIONS}, per-item {}",
            session.spread(),
            per_item.held()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    engine.reset();
    tokio::time::sleep(WINDOW).await;
    let stats = engine.get("/_leaselock/partitions").unwrap();
    let session_held = session.held();
    let per_item_held = per_item.held();
    tokio::join!(per_item.stop(), session.stop());

    let per_item_parts = partitions(&stats, &per_item_table);
    let session_parts = partitions(&stats, &session_table);
    eprintln!("per-item (holding {per_item_held} at the end): {per_item_parts:?}");
    eprintln!("session (holding {session_held} at the end): {session_parts:?}");

    // Per-item: the orphan index's STARTED partition is the hot one, run at its limit, and
    // throttled; no table partition is (each connection item is its own partition value).
    let hot = per_item_parts
        .iter()
        .find(|p| p.0 == index && p.1 == started)
        .expect("per-item wrote the STARTED index partition");
    assert!(hot.4 > 0, "per-item renewals were never throttled on {index}/{started}: {hot:?}");
    assert!(hot.3 >= f64::from(PARTITION_WCU) * 0.9, "the STARTED partition did not run at its limit: {hot:?}");
    let elsewhere: Vec<_> = per_item_parts.iter().filter(|p| p.4 > 0 && !(p.0 == index && p.1 == started)).collect();
    assert!(elsewhere.is_empty(), "per-item throttled elsewhere too: {elsewhere:?}");

    // Session: the same connections, renewed through the sessions only; nothing throttled, every
    // connection still held, and the renewals were seen (the window was not empty).
    let throttled: Vec<_> = session_parts.iter().filter(|p| p.4 > 0).collect();
    assert!(throttled.is_empty(), "session mode was throttled: {throttled:?}");
    assert_eq!(session_held, CONNECTIONS, "session mode lost connections");
    let sessions = session_parts
        .iter()
        .find(|p| p.0 == index && p.1 == session_partition)
        .expect("session renewals wrote the session partition of the index");
    assert!(sessions.2 >= (WORKERS as f64) * 2.0 * 2.0, "too few session renewals in the window: {sessions:?}");
    let started_units = session_parts.iter().find(|p| p.0 == index && p.1 == started).map_or(0.0, |p| p.2);
    assert!(
        started_units < hot.2 / 10.0,
        "session mode wrote the STARTED partition {started_units} units vs per-item {}",
        hot.2
    );
    let busiest = session_parts.iter().map(|p| p.3).fold(0.0, f64::max);
    assert!(
        busiest <= f64::from(PARTITION_WCU) / 2.0,
        "a session-mode partition ran near the limit: {session_parts:?}"
    );
}
