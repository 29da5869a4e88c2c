//! The fault explorer (`leaselock::engine::explore`) over a range of seeds.
//!
//! ```text
//! explore [--first S] [--seeds N | --faults F] [--threads T] [--max-faults K] [--broken none|index-lag|rule2|fence|stop|deadline|cover] [--json]
//! explore --seed S [--prefix K] [--broken ...]     replay one seed (its first K faults), printing it
//! ```
//!
//! `--faults F` runs seeds until F faults have been judged (`make bench-explore`; without
//! `--seeds` or `--faults` it runs 1,000 seeds). Seeds are run in chunks of 50 on `--threads`
//! threads (default 2), the figures added in seed order; no chunk after one with a failing seed
//! is started, and a line of progress is printed every minute. A failing seed is printed with the
//! shortest prefix of its schedule that still fails and the command that replays it; the exit
//! status is then 1. `--json` prints the figures as one JSON object for `bench/merge.py`, with
//! the seeds each broken engine took to be caught (from seed `--first`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use leaselock::engine::explore::{explore, run, shrink, Broken, Scenario, Summary};
use serde_json::json;

const CHUNK: u64 = 50;

fn name(broken: Broken) -> &'static str {
    match broken {
        Broken::None => "none",
        Broken::IndexLagTrusted => "index-lag",
        Broken::NoRule2 => "rule2",
        Broken::FenceNotBumped => "fence",
        Broken::StopIgnored => "stop",
        Broken::DeadlineIgnored => "deadline",
        Broken::SessionCoverOff => "cover",
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let num = |name: &str| arg(name).map(|v| v.parse::<u64>().unwrap_or_else(|_| panic!("{name}: a number")));
    let broken = arg("--broken").map_or(Broken::None, |b| {
        Broken::parse(&b).expect("--broken: none, index-lag, rule2, fence, stop, deadline or cover")
    });
    let max_faults = num("--max-faults").unwrap_or(12) as usize;
    if let Some(seed) = num("--seed") {
        let mut s = Scenario::from_seed(seed, broken, max_faults);
        if let Some(k) = num("--prefix") {
            s = s.prefix(k as usize);
        }
        print!("{s}");
        let out = run(&s);
        println!("{out:?}");
        if let Some((p, v)) = out.violation.is_some().then(|| shrink(&s)).flatten() {
            println!("shortest failing prefix: {} of {} faults: {}", p.faults.len(), s.faults.len(), v.what);
            std::process::exit(1);
        }
        return;
    }
    let first = num("--first").unwrap_or(0);
    let target_faults = num("--faults");
    let seeds = num("--seeds").unwrap_or(if target_faults.is_some() { u64::MAX / 2 } else { 1_000 });
    let threads = num("--threads").unwrap_or(2).max(1);
    let started = Instant::now();
    // Chunks of seeds handed out in order; each chunk's figures kept by its index.
    let next = AtomicU64::new(0);
    let judged = AtomicU64::new(0);
    // A long run stops at its first violation (the chunks before it still finish).
    let failed_at = AtomicU64::new(u64::MAX);
    let reported = Mutex::new(Instant::now());
    let chunks: Mutex<BTreeMap<u64, Summary>> = Mutex::new(BTreeMap::new());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                if target_faults.is_some_and(|f| judged.load(Ordering::Relaxed) >= f) {
                    break;
                }
                let k = next.fetch_add(1, Ordering::Relaxed);
                let from = k * CHUNK;
                if from >= seeds || k > failed_at.load(Ordering::Relaxed) {
                    break;
                }
                let part = explore(first + from, CHUNK.min(seeds - from), broken, max_faults, false);
                if part.failure.is_some() {
                    failed_at.fetch_min(k, Ordering::Relaxed);
                }
                let total = judged.fetch_add(part.faults, Ordering::Relaxed) + part.faults;
                chunks.lock().unwrap().insert(k, part);
                let mut last = reported.lock().unwrap();
                if last.elapsed().as_secs() >= 60 {
                    *last = Instant::now();
                    let s = started.elapsed().as_secs_f64();
                    eprintln!("{total} faults judged in {s:.0} s ({:.0} a second)", total as f64 / s);
                }
            });
        }
    });
    let mut sum = Summary::default();
    for part in chunks.into_inner().unwrap().into_values() {
        sum.add(part);
    }
    let wall_s = started.elapsed().as_secs_f64();
    let rate = sum.faults as f64 / wall_s;
    eprintln!(
        "{} seeds from {first} ({broken:?}, {threads} threads): {} faults judged in {wall_s:.1} s ({rate:.0} a second), \
         {} store operations, {} handlers started, {} checkpoints, {} violations; slowest recovery {} ms after a storm's end",
        sum.seeds, sum.faults, sum.ops, sum.handlers_started, sum.checkpoints, sum.violations, sum.max_recovery_ms
    );
    for (k, (runs, end, share)) in &sum.by_cluster {
        eprintln!(
            "  last cluster of {k} faults: {runs} runs, recovered at most {end} ms after the storm's end ({:.0}% of the bound at most)",
            *share as f64 / 10.0
        );
    }
    if let Some((seed, s, v)) = &sum.failure {
        eprintln!("FAILED at seed {seed}: {}\nshortest failing prefix ({} faults):\n{s}", v.what, s.faults.len());
        eprintln!(
            "replay: cargo run --release -p leaselock --no-default-features --features sim --example explore -- --seed {seed} --prefix {} --broken {}",
            s.faults.len(),
            name(broken)
        );
    }
    if args.iter().any(|a| a == "--json") {
        let clusters: serde_json::Map<String, serde_json::Value> = sum
            .by_cluster
            .iter()
            .map(|(k, (runs, end, share))| {
                (
                    k.to_string(),
                    json!({ "runs": runs, "max_after_end_ms": end, "max_share_of_bound": *share as f64 / 1000.0 }),
                )
            })
            .collect();
        let mut out = json!({
            "seeds": sum.seeds, "first_seed": first, "threads": threads, "faults_judged": sum.faults, "wall_s": wall_s,
            "faults_per_s": rate, "store_ops": sum.ops, "handlers_started": sum.handlers_started,
            "checkpoints": sum.checkpoints, "violations": sum.violations, "max_recovery_ms": sum.max_recovery_ms,
            "by_last_cluster": clusters,
        });
        if let Some((seed, s, v)) = &sum.failure {
            out["failure"] = json!({ "seed": seed, "prefix": s.faults.len(), "what": v.what });
        }
        // Each broken engine, from the same first seed: how many seeds until it is caught.
        if broken == Broken::None {
            let mut caught = serde_json::Map::new();
            for b in [
                Broken::IndexLagTrusted,
                Broken::NoRule2,
                Broken::FenceNotBumped,
                Broken::StopIgnored,
                Broken::DeadlineIgnored,
                Broken::SessionCoverOff,
            ] {
                let s = explore(first, 10_000, b, max_faults, true);
                caught.insert(
                    name(b).into(),
                    json!({ "seed": s.failure.as_ref().map(|f| f.0), "seeds_needed": s.seeds_to_failure,
                            "prefix": s.failure.as_ref().map(|f| f.1.faults.len()),
                            "what": s.failure.as_ref().map(|f| f.2.what.clone()) }),
                );
            }
            out["broken"] = caught.into();
        }
        println!("{}", json!({ "explore": out }));
    }
    if sum.failure.is_some() {
        std::process::exit(1);
    }
}
