//! `leaselock start` / `stop` have a retry budget of their own (`LEASELOCK_OPERATION_BUDGET_MS`):
//! through a store that answers every request 2.5 s late they still succeed, and against one that
//! never answers they fail with a timeout message, not a throttling one.

#[path = "../../core/tests/local_engine/mod.rs"]
mod local_engine;

#[path = "../../core/tests/common/proxy.rs"]
#[allow(dead_code)]
mod proxy;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::process::Command;

/// Runs `leaselock` against `endpoint` with `budget_ms`.
async fn leaselock(endpoint: &str, table: &str, budget_ms: u64, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_leaselock"))
        .args(["--table", table, "--messages-table", &format!("{table}-messages")])
        .args(args)
        .env("AWS_ENDPOINT_URL", endpoint)
        .env("LEASELOCK_OPERATION_BUDGET_MS", budget_ms.to_string())
        .env_remove("LEASELOCK_QUEUE_URL")
        .env_remove("LEASELOCK_LOG")
        .output()
        .await
        .expect("run leaselock")
}

fn text(o: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// The local engine's endpoint and a proxy in front of it, or `None` without an engine.
async fn setup() -> Option<(String, String, Arc<proxy::Faults>, String)> {
    let engine = local_engine::endpoint(module_path!())?;
    let faults = Arc::new(proxy::Faults::default());
    let upstream = engine.trim_start_matches("http://").trim_end_matches('/').to_string();
    let url = proxy::proxy(upstream, faults.clone()).await;
    let table = format!("budget-{}-{:04x}", std::process::id(), rand::random::<u16>());
    let created = leaselock(&engine, &table, 10_000, &["table", "create"]).await;
    assert!(created.status.success(), "{}", text(&created));
    Some((engine, url, faults, table))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_and_stop_succeed_through_answers_slower_than_a_lease_attempt() {
    let Some((_engine, proxied, faults, table)) = setup().await else { return };
    faults.delay_ms.store(2_500, Ordering::SeqCst);
    let t0 = Instant::now();
    let started = leaselock(&proxied, &table, 10_000, &["start", "s1", "--url", "wss://feed.example/s1"]).await;
    assert!(started.status.success(), "{}", text(&started));
    let stopped = leaselock(&proxied, &table, 10_000, &["stop", "s1"]).await;
    assert!(stopped.status.success(), "{}", text(&stopped));
    let took = t0.elapsed();
    eprintln!("start + stop through a 2.5 s delay: {took:?}");
    assert!(took >= Duration::from_secs(5), "both were delayed: {took:?}");
    assert_eq!(faults.count("UpdateItem"), 2, "one attempt each");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_never_answers_fails_with_a_timeout_not_throttling() {
    let Some((_engine, proxied, faults, table)) = setup().await else { return };
    // The table check (DescribeTable) gets through; the write after it is never answered.
    faults.pass_while_silent.store(1, Ordering::SeqCst);
    faults.silent.store(true, Ordering::SeqCst);
    let t0 = Instant::now();
    let out = leaselock(&proxied, &table, 3_000, &["stop", "s1"]).await;
    let took = t0.elapsed();
    let message = text(&out);
    eprintln!("stop against a silent store, {took:?}: {message}");
    assert_eq!(out.status.code(), Some(1), "{message}");
    assert!(message.contains("did not answer in time"), "{message}");
    assert!(message.contains("may have been applied"), "a write whose outcome is unknown says so: {message}");
    assert!(!message.contains("throttl"), "{message}");
    assert!(took < Duration::from_secs(10), "within the 3 s budget (and process start): {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_check_that_is_never_answered_fails_with_a_timeout_and_writes_nothing() {
    let Some((_engine, proxied, faults, table)) = setup().await else { return };
    faults.silent.store(true, Ordering::SeqCst);
    let out = leaselock(&proxied, &table, 3_000, &["stop", "s1"]).await;
    let message = text(&out);
    assert_eq!(out.status.code(), Some(1), "{message}");
    assert!(message.contains("did not answer in time"), "{message}");
    assert!(!message.contains("may have been applied"), "only the table was described: {message}");
}
