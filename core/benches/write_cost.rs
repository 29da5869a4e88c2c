//! Write cost of holding work, per-item leases and session leases side by side, counted from the
//! requests each worker's `LeaseTable` actually sent: 4 workers per mode hold 400 connections
//! (100 each) for `LEASELOCK_BENCH_HOLD_S` (120) seconds at the default timing (lease 20 s, renew
//! 5 s), on the local engine, both modes at the same time. Writes per connection-hour go to
//! `bench/results/latest.json` as `writes_per_connection_hour` (per-item) and
//! `session_writes_per_connection_hour` (other keys of the file are kept). Run with `make bench`.
//!
//! Knobs: `LEASELOCK_BENCH_CONNECTIONS` (400), `LEASELOCK_BENCH_WORKERS` (4),
//! `LEASELOCK_BENCH_HOLD_S` (120).

use std::sync::Arc;
use std::time::{Duration, Instant};

use leaselock::worker::{BoxError, Worker, WorkerHandle};
use leaselock::{LeaseMode, LeaseStore, LeaseTable, TableConfig, WorkerSnapshot};
use tokio::task::JoinHandle;

fn knob(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

struct Fleet {
    tables: Vec<LeaseTable>,
    workers: Vec<(WorkerHandle, JoinHandle<WorkerSnapshot>)>,
}

impl Fleet {
    async fn start(sdk: &aws_config::SdkConfig, mode: LeaseMode, workers: usize, connections: usize) -> Fleet {
        let name = format!("bench-{}-{}-{}", mode.as_str(), std::process::id(), rand::random::<u32>());
        let config = TableConfig::new(name).mode(mode);
        let client = aws_sdk_dynamodb::Client::new(sdk);
        let setup = LeaseTable::new(client.clone(), config.clone()).unwrap();
        setup.create_table().await.unwrap();
        for i in 0..connections {
            setup.start(&format!("c{i:04}"), &format!("wss://feed.example/c{i:04}")).await.unwrap();
        }
        let per_worker = connections.div_ceil(workers);
        let mut fleet = Fleet { tables: Vec::new(), workers: Vec::new() };
        for w in 0..workers {
            // One table handle per worker: one request counter per worker.
            let table = LeaseTable::new(client.clone(), config.clone()).unwrap();
            let worker = Worker::builder(Arc::new(table.clone()) as Arc<dyn LeaseStore>)
                .worker_id(format!("{}-{w}", mode.as_str()))
                .max_connections(per_worker)
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
    let start = Instant::now();
    tokio::time::sleep(hold).await;
    let elapsed = start.elapsed();
    let (item_writes, session_writes) = (per_item.writes() - item_before, session.writes() - session_before);
    assert_eq!(per_item.held(), connections, "per-item fleet lost work while holding");
    assert_eq!(session.held(), connections, "session fleet lost work while holding");
    let connection_hours = connections as f64 * elapsed.as_secs_f64() / 3600.0;
    let item_rate = item_writes as f64 / connection_hours;
    let session_rate = session_writes as f64 / connection_hours;
    println!(
        "held {connections} connections with {workers} workers per mode for {:.1} s: per-item {item_writes} writes \
         ({item_rate:.1} per connection-hour), session {session_writes} writes ({session_rate:.2} per connection-hour)",
        elapsed.as_secs_f64()
    );
    per_item.stop().await;
    session.stop().await;

    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../bench/results/latest.json");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut results: serde_json::Map<String, serde_json::Value> =
        std::fs::read_to_string(&path).ok().and_then(|s| serde_json::from_str(&s).ok()).unwrap_or_default();
    let round = |v: f64| (v * 100.0).round() / 100.0;
    results.insert("writes_per_connection_hour".into(), round(item_rate).into());
    results.insert("session_writes_per_connection_hour".into(), round(session_rate).into());
    results.insert(
        "write_cost_setup".into(),
        serde_json::json!({
            "connections": connections, "workers_per_mode": workers, "held_s": round(elapsed.as_secs_f64()),
            "renew_interval_s": 5, "lease_s": 20,
            "per_item_writes": item_writes, "session_writes": session_writes,
            "counted_from": "requests sent by each worker's LeaseTable (UpdateItem + TransactWriteItems)",
        }),
    );
    std::fs::write(&path, serde_json::to_string_pretty(&serde_json::Value::Object(results)).unwrap() + "\n").unwrap();
    println!("written to {}", path.display());
    assert!(session_rate <= 10.0, "session mode: {session_rate:.2} writes per connection-hour");
}
