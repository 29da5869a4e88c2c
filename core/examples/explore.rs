//! The fault explorer (`leaselock::engine::explore`) over a range of seeds.
//!
//! ```text
//! explore [--first S] [--seeds N | --faults F] [--max-faults K] [--broken none|index-lag|rule2] [--json]
//! explore --seed S [--prefix K] [--broken ...]     replay one seed (its first K faults), printing it
//! ```
//!
//! `--faults F` runs seeds until F faults have been judged. A failing seed is printed with the
//! shortest prefix of its schedule that still fails, and the command that replays it; the exit
//! status is 1. `--json` prints the figures as one JSON object for `bench/merge.py`, with the
//! seeds each broken engine took to be caught.

use std::time::Instant;

use leaselock::engine::explore::{explore, run, shrink, Broken, Scenario, Summary};
use serde_json::json;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let num = |name: &str| arg(name).map(|v| v.parse::<u64>().unwrap_or_else(|_| panic!("{name}: a number")));
    let broken =
        arg("--broken").map_or(Broken::None, |b| Broken::parse(&b).expect("--broken: none, index-lag or rule2"));
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
            println!("shortest failing prefix: {} of {} faults: {v:?}", p.faults.len(), s.faults.len());
            std::process::exit(1);
        }
        return;
    }
    let first = num("--first").unwrap_or(0);
    let target_faults = num("--faults");
    let seeds = num("--seeds").unwrap_or(if target_faults.is_some() { u64::MAX } else { 1_000 });
    let started = Instant::now();
    let mut sum = Summary::default();
    let mut seed = first;
    // In batches, so that a run for a number of faults stops close to it.
    while sum.seeds < seeds && target_faults.is_none_or(|f| sum.faults < f) {
        let n = (seeds - sum.seeds).min(100);
        let part = explore(seed, n, broken, max_faults, true);
        seed += part.seeds;
        add(&mut sum, part);
        if sum.failure.is_some() {
            break;
        }
    }
    let wall_s = started.elapsed().as_secs_f64();
    let rate = sum.faults as f64 / wall_s;
    eprintln!(
        "{} seeds from {first} ({broken:?}): {} faults judged in {wall_s:.1} s ({rate:.0} a second), {} store operations, \
         {} handlers started, {} checkpoints, {} violations; slowest recovery {} ms after a storm",
        sum.seeds, sum.faults, sum.ops, sum.handlers_started, sum.checkpoints, sum.violations, sum.max_recovery_ms
    );
    if let Some((seed, s, v)) = &sum.failure {
        eprintln!(
            "FAILED at seed {seed} (after {} seeds): {}\nshortest failing prefix ({} faults):\n{s}",
            sum.seeds,
            v.what,
            s.faults.len()
        );
        let name = match broken {
            Broken::None => "none",
            Broken::IndexLagTrusted => "index-lag",
            Broken::NoRule2 => "rule2",
        };
        eprintln!(
            "replay: cargo run --release -p leaselock --example explore -- --seed {seed} --prefix {} --broken {name}",
            s.faults.len()
        );
    }
    if args.iter().any(|a| a == "--json") {
        let mut out = json!({
            "seeds": sum.seeds, "first_seed": first, "faults_judged": sum.faults, "wall_s": wall_s,
            "faults_per_s": rate, "store_ops": sum.ops, "handlers_started": sum.handlers_started,
            "checkpoints": sum.checkpoints, "violations": sum.violations, "max_recovery_ms": sum.max_recovery_ms,
        });
        if let Some((seed, s, v)) = &sum.failure {
            out["failure"] = json!({ "seed": seed, "prefix": s.faults.len(), "what": v.what });
        }
        // Each broken engine, from the same first seed: how many seeds until it is caught.
        if broken == Broken::None {
            let mut caught = serde_json::Map::new();
            for (name, b) in [("index_lag_fix_off", Broken::IndexLagTrusted), ("rule2_off", Broken::NoRule2)] {
                let s = explore(first, 10_000, b, max_faults, true);
                caught.insert(
                    name.into(),
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

fn add(sum: &mut Summary, part: Summary) {
    sum.seeds += part.seeds;
    sum.faults += part.faults;
    sum.ops += part.ops;
    sum.handlers_started += part.handlers_started;
    sum.checkpoints += part.checkpoints;
    sum.violations += part.violations;
    sum.max_recovery_ms = sum.max_recovery_ms.max(part.max_recovery_ms);
    if sum.failure.is_none() {
        if let Some(f) = part.failure {
            sum.seeds_to_failure = part.seeds_to_failure.map(|n| sum.seeds - part.seeds + n);
            sum.failure = Some(f);
        }
    }
}
