//! A fleet on the worker engine, simulated on a manual clock over the memory store
//! (`leaselock::engine::sim`): connections spread over workers, through a cold start, steady
//! state, a worker crash and a rolling deploy, in per-item and session mode. It reports the peak
//! capacity units per second of the hottest partition value of the table and of each index (as
//! DynamoDB bills them), the store writes per connection-hour, and how long work waited for an
//! owner. Prints one JSON object (`make bench` merges it into `bench/results/latest.json`).
//!
//!     cargo run --release -p leaselock --no-default-features --features sim --example fleet_sim -- [connections] [workers] [max_per_worker] [deployed] [shards,...]
//!
//! Partitions throttle as DynamoDB's do (`Behaviour::throttle`: 1,000 write and 3,000 read units
//! per second per partition value, no burst); `FLEET_SIM_THROTTLE=0` only counts, and
//! `FLEET_SIM_PARTITION_WCU` with `FLEET_SIM_PARTITION_RCU` set other limits (a fleet scaled
//! down, as `bench/fleet_point.sh` runs real processes beside it). Each phase
//! reports the requests answered throttled, by kind and by the place that refused them.
//!
//! Per-item mode also runs with the orphan index sharded (`TableConfig::orphan_shards`) over
//! each of the listed counts (default 128: 100,000 connections' renewals, 2 units every 5 s
//! each, put about 310 units a second on each value; an empty list runs none).
//!
//! Session mode runs with its orphan index sharded `FLEET_SIM_SESSION_SHARDS` ways (default 64:
//! one STARTED partition value takes 1,000 write units a second, and every claim moves its
//! item's index sort key, 2 units, so one value cold-starts at most 500 connections a second).
//! `FLEET_SIM_MODES` (mode names separated by `;`, e.g. `session;per-item, 64 shards`) runs
//! only those.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use leaselock::engine::sim::{block_on, Sim, ORPHAN_INDEX, TABLE};
use leaselock::engine::Settings;
use leaselock::{Clock, LeaseMode, LeaseStore, TableConfig};
use serde_json::{json, Value};

const START: u64 = 1_700_000_000_000;

struct Mode {
    name: String,
    mode: LeaseMode,
    /// Orphan-index partition values of running work (`TableConfig::orphan_shards`).
    shards: u32,
    lease_ms: u64,
    renew_ms: u64,
    skew_ms: u64,
    /// The workers' orphan query interval, if not the default (`FLEET_SIM_ORPHAN_INTERVAL_MS`).
    orphan_interval_ms: Option<u64>,
}

/// The design's defaults, with hints and a 1 s long poll, and the mode's orphan query interval.
fn settings(i: usize, max: usize, m: &Mode) -> Settings {
    let s = Settings::new(format!("w{i:04}"), max);
    Settings {
        hints: true,
        hint_wait_ms: 1_000,
        orphan_interval_ms: m.orphan_interval_ms.unwrap_or(s.orphan_interval_ms),
        ..s
    }
}

fn env_number(name: &str) -> Option<f64> {
    std::env::var(name).ok().map(|v| v.parse().unwrap_or_else(|_| panic!("{name}: a number, not {v:?}")))
}

fn peaks(sim: &Sim) -> Value {
    let mut out = serde_json::Map::new();
    for (place, (units, partition)) in &sim.partitions.peak {
        out.insert(place.to_string(), json!({ "units_per_s": units, "partition": partition }));
    }
    Value::Object(out)
}

/// Requests answered throttled since `before` (by kind, by place), and the counts now.
fn throttled(sim: &Sim, before: &mut (BTreeMap<String, u64>, BTreeMap<String, u64>)) -> Value {
    let now = |m: &BTreeMap<&'static str, u64>| m.iter().map(|(k, v)| (k.to_string(), *v)).collect::<BTreeMap<_, _>>();
    let (kinds, places) = (now(&sim.throttled), now(&sim.partitions.throttled));
    let since = |now: &BTreeMap<String, u64>, then: &BTreeMap<String, u64>| {
        now.iter()
            .map(|(k, v)| (k.clone(), v - then.get(k).copied().unwrap_or(0)))
            .filter(|(_, v)| *v > 0)
            .collect::<BTreeMap<_, _>>()
    };
    let out = json!({
        "requests": since(&kinds, &before.0).values().sum::<u64>(),
        "by_kind": since(&kinds, &before.0), "by_place": since(&places, &before.1),
    });
    *before = (kinds, places);
    out
}

/// Store operations run since `before` (by kind), and the counts now.
fn operations(sim: &Sim, before: &mut BTreeMap<String, u64>) -> Value {
    let now: BTreeMap<String, u64> = sim.ops.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    let since: BTreeMap<String, u64> =
        now.iter().map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0))).filter(|(_, v)| *v > 0).collect();
    *before = now;
    json!(since)
}

/// Runs until every id runs on exactly one live worker; returns how long that took (ms).
fn until_all_held(sim: &mut Sim, ids: &[String], limit_ms: u64) -> Option<u64> {
    let from = sim.clock.monotonic_ms();
    let held = sim.run_while(from + limit_ms, 100, |s| s.all_held_once(ids));
    held.then(|| sim.clock.monotonic_ms() - from)
}

fn run(m: &Mode, connections: usize, workers: usize, max: usize, deployed: usize) -> Value {
    let wall = Instant::now();
    let ms = Duration::from_millis;
    let mut config = TableConfig::new("leaselock")
        .lease_duration(ms(m.lease_ms))
        .renew_interval(ms(m.renew_ms))
        .clock_skew(ms(m.skew_ms))
        .orphan_shards(m.shards);
    config.mode = m.mode;
    let config = config.validated().expect("timing");
    let mut sim = Sim::new(config, START);
    sim.keep_log = false;
    sim.account = true;
    sim.behaviour.throttle = std::env::var("FLEET_SIM_THROTTLE").map_or(true, |v| v != "0");
    if let (Some(w), Some(r)) = (env_number("FLEET_SIM_PARTITION_WCU"), env_number("FLEET_SIM_PARTITION_RCU")) {
        sim.partitions.limits = Some((w, r));
    }
    let mut counted = Default::default();
    let mut ran = BTreeMap::new();
    let ids: Vec<String> = (0..connections)
        .map(|i| {
            let id = format!("c{i:06}");
            block_on(sim.store.start(&id, "wss://feed.example")).expect("start");
            id
        })
        .collect();
    let mut phases = serde_json::Map::new();

    // Cold start: every worker at once, all the work orphaned.
    for i in 0..workers {
        sim.spawn(settings(i, max, m), i as u64 + 1);
    }
    let cold_limit_ms = 300_000;
    let cold = until_all_held(&mut sim, &ids, cold_limit_ms);
    let held = sim.held_once_count();
    phases.insert(
        "cold_start".into(),
        json!({ "all_held_after_ms": cold, "limit_ms": cold_limit_ms, "held_at_end": held, "peaks": peaks(&sim),
               "throttled": throttled(&sim, &mut counted), "operations": operations(&sim, &mut ran) }),
    );
    eprintln!("{}: cold start {:?} ms, {held} held ({:.1} s)", m.name, cold, wall.elapsed().as_secs_f64());

    // Steady state: a minute after everything settled.
    sim.run_until(sim.clock.monotonic_ms() + 2 * m.lease_ms);
    sim.partitions.reset_peaks();
    throttled(&sim, &mut counted);
    operations(&sim, &mut ran);
    let before: f64 = [TABLE, leaselock::engine::sim::SESSION_ITEMS]
        .iter()
        .map(|p| sim.partitions.total.get(p).copied().unwrap_or(0.0))
        .sum();
    let steady_ms = 60_000;
    sim.run_until(sim.clock.monotonic_ms() + steady_ms);
    let after: f64 = [TABLE, leaselock::engine::sim::SESSION_ITEMS]
        .iter()
        .map(|p| sim.partitions.total.get(p).copied().unwrap_or(0.0))
        .sum();
    let per_hour = (after - before) / connections as f64 * (3_600_000.0 / steady_ms as f64);
    let orphan_peak = sim.partitions.peak.get(ORPHAN_INDEX).map_or(0.0, |p| p.0);
    // Connections one orphan-index partition value carries at 1,000 write units per second
    // (the hottest shard's share of the work at its peak), and the table with all its shards.
    let per_partition = connections as f64 / f64::from(m.shards);
    let fit = if orphan_peak > 0.0 { (1_000.0 / orphan_peak * per_partition) as u64 } else { u64::MAX };
    let table_fit = fit.saturating_mul(u64::from(m.shards));
    phases.insert(
        "steady".into(),
        json!({
            "writes_per_connection_hour": per_hour, "peaks": peaks(&sim), "throttled": throttled(&sim, &mut counted),
            "connections_within_1000_wcu": fit, "table_connections_within_1000_wcu": table_fit,
            "operations": operations(&sim, &mut ran),
        }),
    );
    eprintln!("{}: steady {per_hour:.1} writes/connection-hour ({:.1} s)", m.name, wall.elapsed().as_secs_f64());

    // A crash: worker 0 dies; its work must be held again elsewhere.
    sim.partitions.reset_peaks();
    let victims = sim.held_only_by(0);
    sim.crash(0);
    let crash_limit_ms = 120_000;
    operations(&sim, &mut ran);
    let crash = until_all_held(&mut sim, &ids, crash_limit_ms);
    phases.insert(
        "crash".into(),
        json!({ "connections": victims.len(), "all_held_after_ms": crash, "limit_ms": crash_limit_ms, "peaks": peaks(&sim),
               "throttled": throttled(&sim, &mut counted), "operations": operations(&sim, &mut ran) }),
    );
    eprintln!("{}: crash of {} -> {:?} ms ({:.1} s)", m.name, victims.len(), crash, wall.elapsed().as_secs_f64());

    // A rolling deploy: one worker at a time is shut down and replaced.
    sim.partitions.reset_peaks();
    sim.run_until(sim.clock.monotonic_ms() + 2 * m.lease_ms);
    operations(&sim, &mut ran);
    let mut gaps = Vec::new();
    for k in 1..=deployed.min(workers - 1) {
        let mine = sim.held_only_by(k);
        sim.shutdown(k);
        let from = sim.clock.monotonic_ms();
        sim.run_while(from + 60_000, 50, |s| s.nodes[k].finished);
        let next = workers + k - 1;
        sim.spawn(settings(next, max, m), next as u64 + 1);
        let held = sim.run_while(from + 60_000, 50, |s| mine.iter().all(|id| s.runs_once(id)));
        gaps.push(if held { sim.clock.monotonic_ms() - from } else { u64::MAX });
    }
    gaps.sort();
    let pct = |q: f64| gaps.get(((gaps.len() as f64 - 1.0) * q).round() as usize).copied();
    phases.insert(
        "rolling_deploy".into(),
        json!({
            "workers_replaced": gaps.len(),
            "hand_over_ms": { "p50": pct(0.5), "p99": pct(0.99), "max": gaps.last() },
            "peaks": peaks(&sim),
            "throttled": throttled(&sim, &mut counted),
            "operations": operations(&sim, &mut ran),
        }),
    );
    eprintln!("{}: deploy of {} ({:.1} s)", m.name, gaps.len(), wall.elapsed().as_secs_f64());
    let ops: BTreeMap<_, _> = sim.ops.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    json!({
        "lease_ms": m.lease_ms, "renew_ms": m.renew_ms, "skew_ms": m.skew_ms, "orphan_shards": m.shards,
        "throttle": sim.behaviour.throttle,
        "partition_limits": { "write_units_per_s": sim.partitions.limit(ORPHAN_INDEX),
                              "read_units_per_s": sim.partitions.limit(leaselock::engine::sim::ORPHAN_INDEX_READS) },
        "orphan_interval_ms": settings(0, max, m).orphan_interval_ms,
        "phases": phases, "store_operations": ops,
        "simulated_s": sim.clock.monotonic_ms() / 1_000, "run_s": wall.elapsed().as_secs_f64(),
        "wall_at_end_ms": sim.clock.now_ms(),
    })
}

fn main() {
    let arg = |i: usize, default: usize| std::env::args().nth(i).and_then(|a| a.parse().ok()).unwrap_or(default);
    let (connections, workers, max, deployed) = (arg(1, 100_000), arg(2, 150), arg(3, 700), arg(4, 20));
    // Per-item mode again with the orphan index sharded over each of these counts.
    let sharded: Vec<u32> = std::env::args()
        .nth(5)
        .unwrap_or_else(|| "128".into())
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().expect("shard counts: a comma-separated list of numbers"))
        .collect();
    let orphan_interval_ms = env_number("FLEET_SIM_ORPHAN_INTERVAL_MS").map(|ms| ms as u64);
    let mode = |name: String, mode, shards, (lease_ms, renew_ms, skew_ms)| Mode {
        name,
        mode,
        shards,
        lease_ms,
        renew_ms,
        skew_ms,
        orphan_interval_ms,
    };
    let defaults = (20_000, 5_000, 1_000);
    let mut modes = vec![mode("per-item".into(), LeaseMode::PerItem, 1, defaults)];
    for &n in &sharded {
        modes.push(mode(format!("per-item, {n} shards"), LeaseMode::PerItem, n, defaults));
    }
    let session_shards: u32 = std::env::var("FLEET_SIM_SESSION_SHARDS")
        .map_or(64, |v| v.parse().expect("FLEET_SIM_SESSION_SHARDS: a number"));
    modes.push(mode("session".into(), LeaseMode::Session, session_shards, defaults));
    modes.push(mode("session-5s".into(), LeaseMode::Session, session_shards, (5_000, 1_250, 250)));
    if let Ok(only) = std::env::var("FLEET_SIM_MODES") {
        let only: Vec<&str> = only.split(';').map(str::trim).collect();
        modes.retain(|m| only.contains(&m.name.as_str()));
    }
    let mut results = serde_json::Map::new();
    for m in &modes {
        results.insert(m.name.clone(), run(m, connections, workers, max, deployed));
    }
    let out = json!({ "fleet_sim": {
        "connections": connections, "workers": workers, "max_connections": max, "modes": results,
    }});
    println!("{out}");
}
