//! The reconciler over 10,000 orphans on the local engine: seeds the table, runs one
//! reconciliation as the Lambda handler does (default options, a deadline taken from an invocation
//! deadline of the default 30 s budget) while a fleet of consumers drains the hint queue, and
//! records the time in `bench-results/reconciler.txt`. The run must be complete: every orphan
//! hinted before the deadline. Run it with `lambdas/bench.sh` (or under
//! `scripts/with-services.sh cargo bench -p leaselock-lambdas --bench reconciler`).
//!
//! Knobs: `LEASELOCK_BENCH_ORPHANS` (10000), `LEASELOCK_BENCH_CONSUMERS` (8),
//! `LEASELOCK_BENCH_WAIT_S` (the consumers' long poll, 1), `LEASELOCK_BENCH_CONCURRENCY` (batches
//! in flight, the Lambda's 16), `LEASELOCK_BENCH_BUDGET_S` (the invocation's time limit, 30).

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use common::*;
use leaselock::lease::claim_cutoff;
use leaselock::{DesiredState, LeaseStore, TableConfig};
use leaselock_lambdas::reconciler::{self, Options, CONCURRENT_BATCHES};

fn knob(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

#[tokio::main]
async fn main() {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` does not, and must not seed 10,000 items.
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("reconciler bench: run it with `cargo bench` (lambdas/bench.sh)");
        return;
    }
    let Some(sdk) = services("reconciler bench").await else { return };
    let orphans = knob("LEASELOCK_BENCH_ORPHANS", 10_000);
    let consumers = knob("LEASELOCK_BENCH_CONSUMERS", 8);
    let budget = Duration::from_secs(knob("LEASELOCK_BENCH_BUDGET_S", 30) as u64);

    let store = table(&sdk, TableConfig::new(unique_name("ll-bench"))).await;
    let hints = queue(&sdk).await;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let seeded_at = Instant::now();
    let items = (0..orphans)
        .map(|i| Seed {
            id: format!("conn-{i:05}"),
            state: DesiredState::Started,
            // Half never claimed, half abandoned by a crashed owner a minute ago.
            expires_at_ms: if i % 2 == 0 { 0 } else { now - 60_000 },
            owner: (i % 2 == 1).then(|| "crashed-worker".to_string()),
        })
        .collect();
    seed(&store, items).await;
    let seeding = seeded_at.elapsed();
    eprintln!("seeded {orphans} orphans in {}", secs(seeding));

    let fleet = drain(&hints, orphans, consumers, knob("LEASELOCK_BENCH_WAIT_S", 1) as i32, Duration::from_secs(600));
    let started = Instant::now();
    let progress = {
        let hints = hints.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                eprintln!(
                    "{:>6.1} s: {} hints waiting in the queue",
                    started.elapsed().as_secs_f64(),
                    queue_depth(&hints).await
                );
            }
        })
    };
    // What the handler does with an invocation deadline `budget` from now.
    let invocation_deadline = std::time::SystemTime::now() + budget;
    let deadline_ms = invocation_deadline.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let options = Options {
        concurrency: knob("LEASELOCK_BENCH_CONCURRENCY", CONCURRENT_BATCHES),
        deadline: reconciler::run_deadline(deadline_ms, std::time::SystemTime::now()),
        ..Options::default()
    };
    let report = reconciler::reconcile_with(&store, &hints, options).await.expect("reconcile");
    let reconcile = started.elapsed();
    eprintln!("reconciled {} orphans in {}", report.orphans, secs(reconcile));
    let received = fleet.await.expect("consumers");
    let delivered = started.elapsed();
    progress.abort();
    let unique = received.iter().collect::<BTreeSet<_>>().len();

    // The query alone, for the record: what the run costs without SQS.
    let listed_at = Instant::now();
    let cutoff = claim_cutoff(store.clock().now_ms(), store.config());
    let listed = store.orphans(cutoff, None).await.expect("orphan query").len();
    let listing = listed_at.elapsed();

    assert!(report.complete, "the run was cut short: {:?} ({report:?})", report.cut_short);
    assert_eq!((report.orphans, report.hints_sent, report.hints_failed), (orphans as u64, orphans as u64, 0));
    assert_eq!(unique, orphans, "every orphan's hint arrives");
    assert_eq!(listed, orphans);

    let mut out = String::new();
    writeln!(out, "reconciler, {orphans} orphans, local engine at {}", std::env::var("AWS_ENDPOINT_URL").unwrap())
        .unwrap();
    writeln!(out, "reconcile (orphan query + {} SendMessageBatch + counts): {}", orphans.div_ceil(10), secs(reconcile))
        .unwrap();
    writeln!(
        out,
        "budget: {} invocation, {} reserve; complete within it: {} ({:.0} % of the budget used)",
        secs(budget),
        secs(reconciler::DEADLINE_RESERVE),
        report.complete,
        100.0 * reconcile.as_secs_f64() / budget.as_secs_f64()
    )
    .unwrap();
    writeln!(out, "every hint received by {consumers} consumers: {}", secs(delivered)).unwrap();
    writeln!(out, "orphan query alone ({} pages): {}", orphans.div_ceil(options.page_size), secs(listing)).unwrap();
    writeln!(out, "seeding with BatchWriteItem (not part of the run): {}", secs(seeding)).unwrap();
    writeln!(out, "batches in flight: {}, page size: {}", options.concurrency, options.page_size).unwrap();
    print!("{out}");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../bench-results");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("reconciler.txt"), out).unwrap();
}
