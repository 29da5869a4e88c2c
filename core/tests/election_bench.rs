//! `make bench`: `run_if_leader` throughput with a trivial action, side by side on the local
//! engine (DynamoDB API) and the local Redis, merged into bench/results/latest.json as
//! `election_dynamodb_ops_per_s` and `election_redis_ops_per_s`, beside bluetape4k-leader's own
//! figures (641 ops/s on DynamoDB Local, 1,456 on Redis with Lettuce).
//!
//! One elector, one name, one call after another: each call is a claim and a release (two
//! round trips); a second figure runs 8 names concurrently from the same process.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use leaselock::election::{ElectionBackend, ElectionOptions, LeaderElector, Outcome};
use leaselock::redis::{RedisElection, RedisOptions};
use leaselock::{DynamoRegistry, StoreElection, TableConfig};
use serde_json::{json, Value};

const BLUETAPE4K_DYNAMODB: f64 = 641.0;
const BLUETAPE4K_REDIS: f64 = 1456.0;

fn seconds() -> Duration {
    Duration::from_secs(std::env::var("LEASELOCK_BENCH_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(5))
}

/// Calls `run_if_leader` on `names` names concurrently for the bench duration; ops/s.
async fn throughput(backend: Arc<dyn ElectionBackend>, names: usize) -> f64 {
    let elector = LeaderElector::new(backend, "bench", ElectionOptions::default()).unwrap();
    let run = |name: String, until: Instant| {
        let elector = elector.clone();
        async move {
            let mut ops = 0u64;
            while Instant::now() < until {
                match elector.run_if_leader(&name, |term| async move { term.fence() }).await.unwrap() {
                    Outcome::Led { .. } => ops += 1,
                    Outcome::Skipped { holder } => panic!("{name} skipped, held by {holder:?}"),
                }
            }
            ops
        }
    };
    // Warm up: connections, scripts loaded, items created.
    futures::future::join_all(
        (0..names).map(|i| run(format!("bench-{i}"), Instant::now() + Duration::from_millis(300))),
    )
    .await;
    let started = Instant::now();
    let until = started + seconds();
    let ops: u64 =
        futures::future::join_all((0..names).map(|i| run(format!("bench-{i}"), until))).await.into_iter().sum();
    ops as f64 / started.elapsed().as_secs_f64()
}

/// Merged key by key into bench/results/latest.json by the helper every section uses.
fn merge(results: &[(&str, Value)]) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let figures: serde_json::Map<String, Value> = results.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
    let mut merge = std::process::Command::new("python3")
        .arg(root.join("bench/merge.py"))
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("python3 bench/merge.py");
    std::io::Write::write_all(merge.stdin.as_mut().unwrap(), Value::Object(figures).to_string().as_bytes()).unwrap();
    drop(merge.stdin.take());
    assert!(merge.wait().unwrap().success(), "bench/merge.py failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: make bench"]
async fn election_throughput() {
    let lease = Duration::from_secs(10);
    let config = TableConfig::new("bench").lease_duration(lease).renew_interval(Duration::from_secs(3));
    let table = common::table(config, None).await.expect("make bench runs with the local engine");
    let registry = DynamoRegistry::for_table(&table);
    let dynamo: Arc<dyn ElectionBackend> = Arc::new(StoreElection::new(table, registry));
    let url = std::env::var("LEASELOCK_REDIS_URL").expect("make bench runs with the local Redis");
    let prefix = format!("bench-{}:", std::process::id());
    let redis = RedisElection::connect(&url, RedisOptions::default().lease(lease).key_prefix(prefix)).await.unwrap();
    // A new prefix is held off like a server that lost its state: one lease + skew.
    let until = Instant::now() + lease * 2;
    loop {
        let left = redis.claims_open_in().await.unwrap();
        if left.is_zero() {
            break;
        }
        assert!(Instant::now() < until, "claims still held off");
        tokio::time::sleep(left.min(Duration::from_millis(100))).await;
    }
    let redis: Arc<dyn ElectionBackend> = Arc::new(redis);

    let d1 = throughput(dynamo.clone(), 1).await;
    let r1 = throughput(redis.clone(), 1).await;
    let d8 = throughput(dynamo, 8).await;
    let r8 = throughput(redis, 8).await;
    println!("run_if_leader, trivial action     leaselock    bluetape4k (its own figure)");
    println!("DynamoDB (local engine), 1 name   {d1:>9.0}    {BLUETAPE4K_DYNAMODB:>9.0} (DynamoDB Local)");
    println!("Redis (local), 1 name             {r1:>9.0}    {BLUETAPE4K_REDIS:>9.0} (Lettuce)");
    println!("DynamoDB (local engine), 8 names  {d8:>9.0}");
    println!("Redis (local), 8 names            {r8:>9.0}");
    let round = |x: f64| (x * 10.0).round() / 10.0;
    merge(&[
        ("election_dynamodb_ops_per_s", json!(round(d1))),
        ("election_redis_ops_per_s", json!(round(r1))),
        ("election_dynamodb_ops_per_s_8_names", json!(round(d8))),
        ("election_redis_ops_per_s_8_names", json!(round(r8))),
        ("election_bluetape4k_dynamodb_local_ops_per_s", json!(BLUETAPE4K_DYNAMODB)),
        ("election_bluetape4k_redis_ops_per_s", json!(BLUETAPE4K_REDIS)),
        (
            "election_bench_note",
            json!("run_if_leader with a trivial action (claim + release), one process; the local engine is moto, not DynamoDB Local"),
        ),
    ]);
}
