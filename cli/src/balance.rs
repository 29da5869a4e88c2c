//! The balance scenario (session mode): worker processes started one after another over a set of
//! streams. The first claims everything; each one that joins gets its fair share by graceful
//! hand-overs, so the fleet ends even, every stream gap-free and duplicate-free (the messages
//! table), and no stream moved more than twice. The last line printed is one JSON report.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use leaselock::worker::decide::DEFAULT_DESIRED_STATE_INTERVAL;
use leaselock::{Clock, LeaseItem, LeaseMode, LeaseStore, LeaseTable, SystemClock, TableConfig};
use tokio::time::Instant;

use crate::demo::{messages_by_stream, say, status_line, Fleet, Language, Launch, LocalFeed, Runtimes, Stage};
use crate::{other, CliResult, Failure, TableArgs};

#[derive(clap::Args, Debug, Clone)]
pub struct BalanceArgs {
    /// Streams to run.
    #[arg(long, default_value_t = 120)]
    pub connections: usize,
    /// Worker processes, started one after another.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(2..=16))]
    pub workers: u64,
    /// Seconds between two worker starts.
    #[arg(long, default_value_t = 10)]
    pub stagger_secs: u64,
    /// Seconds after the last start by which every worker must hold its share.
    #[arg(long, default_value_t = 30)]
    pub within_secs: u64,
    /// How far from connections / workers a worker may end.
    #[arg(long, default_value_t = 3)]
    pub tolerance: usize,
    /// Seconds the fleet must then stay even (no churn).
    #[arg(long, default_value_t = 5)]
    pub hold_secs: u64,
    /// Messages per second on each stream.
    #[arg(long, default_value_t = 0.5)]
    pub rate: f64,
    /// Orphan query interval of the workers, ms.
    #[arg(long, default_value_t = 1_000)]
    pub orphan_interval_ms: u64,
    /// Where worker logs go.
    #[arg(long, default_value = ".demo")]
    pub dir: PathBuf,
    /// Languages of the workers, in turn (worker i runs the i-th, cycling; the first claims
    /// everything): `rust` is `leaselock worker`, `python` examples/python_worker.py, `node`
    /// examples/node_worker.mjs.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "rust")]
    pub languages: Vec<Language>,
    #[command(flatten)]
    pub runtimes: Runtimes,
}

#[derive(Debug, Default, serde::Serialize)]
struct Report {
    balance: &'static str,
    connections: usize,
    workers: u64,
    /// The language of each worker, in the order started.
    languages: Vec<Language>,
    stagger_ms: u64,
    /// From the last worker's start until every worker held its share (and all was held).
    balanced_after_last_start_ms: Option<u64>,
    /// Streams held per worker when balanced, and after `hold_secs` more.
    held_when_balanced: BTreeMap<String, usize>,
    held_at_end: BTreeMap<String, usize>,
    /// Hand-overs per stream: claims after the first worker's, read from the fence.
    handovers_max: u64,
    handovers_total: u64,
    gaps: u64,
    duplicates: u64,
    double_owner: u64,
    messages: u64,
}

/// Streams held per worker now (session items are not streams), and how many are held at all.
fn holders(items: &[LeaseItem], config: &TableConfig, now: u64) -> (BTreeMap<String, usize>, usize) {
    let mut per: BTreeMap<String, usize> = BTreeMap::new();
    for i in items.iter().filter(|i| config.session_owner(&i.id).is_none()) {
        if let Some(owner) = i.holder_at(now) {
            *per.entry(owner.to_string()).or_default() += 1;
        }
    }
    let held = per.values().sum();
    (per, held)
}

/// Every worker holds within `tolerance` of its share, and every stream is held.
fn even(per: &BTreeMap<String, usize>, held: usize, workers: usize, total: usize, tolerance: usize) -> bool {
    let share = total.div_ceil(workers);
    held == total && per.len() == workers && per.values().all(|n| n.abs_diff(share) <= tolerance)
}

/// The stream items (session items are not streams); a read the loaded local engine did not
/// answer in time is tried again, up to a minute.
async fn streams(table: &LeaseTable, t0: Instant) -> CliResult<Vec<LeaseItem>> {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        match table.items().await {
            Ok(items) => {
                return Ok(items.into_iter().filter(|i| table.config().session_owner(&i.id).is_none()).collect())
            }
            Err(e) if Instant::now() < until => say(t0, format!("  table read failed ({e}); again")),
            Err(e) => return Err(e.into()),
        }
    }
}

pub async fn run(args: &TableArgs, b: BalanceArgs) -> CliResult {
    let t0 = Instant::now();
    let run_id = format!("{}", SystemClock.now_ms());
    let lease_table = format!("leaselock-balance-{run_id}");
    let messages_table = format!("{lease_table}-messages");
    let targs = TableArgs {
        table_name: lease_table.clone(),
        messages_table: messages_table.clone(),
        mode: LeaseMode::Session,
        ..args.clone()
    };
    say(t0, format!("creating tables {lease_table}, {messages_table} and the hint queue"));
    let Stage { table, config, queue_url, .. } = Stage::create(&targs).await?;

    let LocalFeed { addr: feed_addr, feed, stop: feed_stop, task: feed_task } = LocalFeed::start(b.rate).await?;
    say(t0, format!("upstream feed on ws://{feed_addr} ({} msg/s per stream)", b.rate));

    let ids: Vec<String> = (0..b.connections).map(|i| format!("stream-{i:03}")).collect();
    for id in &ids {
        table.start(id, &format!("ws://{feed_addr}/{id}")).await?;
    }
    say(t0, format!("STARTed {} streams", ids.len()));

    let logs = b.dir.join(&run_id);
    std::fs::create_dir_all(&logs).map_err(other)?;
    if b.languages.is_empty() {
        return Err(other("--languages: at least one language"));
    }
    let languages: Vec<Language> = b.languages.iter().copied().cycle().take(b.workers as usize).collect();
    let desired_state_interval_ms = DEFAULT_DESIRED_STATE_INTERVAL.as_millis() as u64;
    let launch =
        Launch::new(&b.runtimes, &targs, &config, &queue_url, b.orphan_interval_ms, desired_state_interval_ms)?;
    let spawn = |i: u64| -> CliResult<(String, std::process::Child)> {
        let language = languages[i as usize];
        let name = format!("balance-w{i}-{}", language.as_str());
        let log = std::fs::File::create(logs.join(format!("{name}.log"))).map_err(other)?;
        let child = launch
            .command(language, &name)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(other)?)
            .stderr(log)
            .spawn()
            .map_err(|e| other(format!("starting the {} worker {name}: {e}", language.as_str())))?;
        Ok((name, child))
    };
    let mut fleet = Fleet { children: Vec::new(), languages: languages.clone() };
    let n = ids.len();
    let mut report = Report {
        connections: n,
        workers: b.workers,
        languages: languages.clone(),
        stagger_ms: b.stagger_secs * 1000,
        ..Report::default()
    };

    // The first worker claims everything; the fences then are where hand-overs are counted from.
    fleet.children.push(spawn(0)?);
    let mut last_start = Instant::now();
    say(t0, format!("started {} (worker logs in {})", fleet.children[0].0, logs.display()));
    let until = Instant::now() + Duration::from_secs(60);
    let baseline: HashMap<String, u64> = loop {
        let items = streams(&table, t0).await?;
        let (per, held) = holders(&items, &config, SystemClock.now_ms());
        if held == n && per.len() == 1 {
            say(t0, format!("first worker holds all: {}", status_line(&items, SystemClock.now_ms(), n, None)));
            break items.iter().map(|i| (i.id.clone(), i.fence)).collect();
        }
        if Instant::now() >= until {
            return Err(other("the first worker did not claim every stream within 60 s"));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };

    // The others join one after another; the status is printed every second meanwhile.
    let mut last_print = Instant::now();
    for i in 1..b.workers {
        let next_start = last_start + Duration::from_secs(b.stagger_secs);
        while Instant::now() < next_start {
            if last_print.elapsed() >= Duration::from_secs(2) {
                let items = streams(&table, t0).await?;
                say(t0, status_line(&items, SystemClock.now_ms(), n, None));
                last_print = Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(100).min(next_start - Instant::now())).await;
        }
        fleet.children.push(spawn(i)?);
        last_start = Instant::now();
        say(t0, format!("started {}", fleet.children[i as usize].0));
    }

    // Even within the bound after the last start, and still even `hold_secs` later.
    let workers = b.workers as usize;
    let until = last_start + Duration::from_secs(b.within_secs);
    loop {
        let items = streams(&table, t0).await?;
        let now = SystemClock.now_ms();
        let (per, held) = holders(&items, &config, now);
        if even(&per, held, workers, n, b.tolerance) {
            report.balanced_after_last_start_ms = Some(last_start.elapsed().as_millis() as u64);
            report.held_when_balanced = per;
            say(
                t0,
                format!(
                    "even {} ms after the last start: {}",
                    last_start.elapsed().as_millis(),
                    status_line(&items, now, n, None)
                ),
            );
            break;
        }
        if Instant::now() >= until {
            say(
                t0,
                format!("not even {} s after the last start: {}", b.within_secs, status_line(&items, now, n, None)),
            );
            break;
        }
        if last_print.elapsed() >= Duration::from_secs(1) {
            say(t0, format!("  {}", status_line(&items, now, n, None)));
            last_print = Instant::now();
        }
        // A scan of the table each time: not more often, the local engine is serving the fleet.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tokio::time::sleep(Duration::from_secs(b.hold_secs)).await;
    let items = streams(&table, t0).await?;
    let now = SystemClock.now_ms();
    let (per, held) = holders(&items, &config, now);
    let still_even = even(&per, held, workers, n, b.tolerance);
    say(t0, format!("{} s later: {}", b.hold_secs, status_line(&items, now, n, None)));
    report.held_at_end = per;
    for item in &items {
        let moves = item.fence.saturating_sub(baseline.get(&item.id).copied().unwrap_or(item.fence));
        report.handovers_max = report.handovers_max.max(moves);
        report.handovers_total += moves;
    }

    // Graceful stop of the fleet (one session write each), then the messages of every stream.
    for i in 0..fleet.children.len() {
        fleet.signal(i, libc::SIGTERM)?;
    }
    for i in 0..fleet.children.len() {
        fleet.wait_exit(i, Duration::from_secs(30)).await?;
    }
    feed_stop.cancel();
    let _ = feed_task.await;
    let by_stream = messages_by_stream(table.client(), &messages_table).await?;
    for id in &ids {
        let rows = by_stream.get(id).map(Vec::as_slice).unwrap_or_default();
        let max = rows.iter().map(|r| r.0).max().unwrap_or(0);
        report.gaps += max - rows.len() as u64;
        report.duplicates += rows.iter().map(|r| r.1.saturating_sub(1)).sum::<u64>();
        report.messages += rows.len() as u64;
        let item = table.get(id).await?.unwrap_or_default();
        if item.last_seq.unwrap_or(0) > max {
            report.gaps += item.last_seq.unwrap_or(0) - max;
        }
    }
    report.double_owner = feed.stats().double_owner;

    let mut failures = Vec::new();
    match report.balanced_after_last_start_ms {
        None => failures.push(format!("not even within {} s of the last start", b.within_secs)),
        Some(_) if !still_even => failures.push(format!("not even any more {} s later (churn)", b.hold_secs)),
        Some(_) => {}
    }
    if report.handovers_max > 2 {
        failures.push(format!("a stream was handed over {} times", report.handovers_max));
    }
    for (what, count) in [("missing messages", report.gaps), ("duplicates", report.duplicates)] {
        if count > 0 {
            failures.push(format!("{count} {what}"));
        }
    }
    if report.double_owner > 0 {
        failures.push(format!("{} double-owner moments", report.double_owner));
    }
    say(
        t0,
        format!(
            "{} messages, {} hand-overs (at most {} of one stream), {} gaps, {} duplicates",
            report.messages, report.handovers_total, report.handovers_max, report.gaps, report.duplicates
        ),
    );
    for f in &failures {
        say(t0, format!("FAILED: {f}"));
    }
    report.balance = if failures.is_empty() { "ok" } else { "failed" };
    println!("{}", serde_json::to_string(&report).map_err(other)?);
    if failures.is_empty() {
        Ok(())
    } else {
        Err(Failure::Other(failures.join("; ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn even_means_every_worker_near_its_share_and_everything_held() {
        let per = |counts: &[usize]| -> BTreeMap<String, usize> {
            counts.iter().enumerate().map(|(i, n)| (format!("w{i}"), *n)).collect()
        };
        assert!(even(&per(&[30, 30, 30, 30]), 120, 4, 120, 3));
        assert!(even(&per(&[33, 27, 30, 30]), 120, 4, 120, 3));
        assert!(!even(&per(&[34, 26, 30, 30]), 120, 4, 120, 3));
        assert!(!even(&per(&[40, 40, 40]), 120, 4, 120, 3), "a worker holds nothing");
        assert!(!even(&per(&[30, 30, 30, 29]), 119, 4, 120, 3), "a stream is not held");
    }
}
