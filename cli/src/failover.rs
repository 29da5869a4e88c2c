//! `make bench`: failover distributions over many forced failures of real worker processes.
//!
//! A fleet of reference-worker processes (`leaselock worker`, each its own process, streaming from
//! an in-process upstream feed) holds the streams. Each round picks the worker holding the most
//! streams and either kills it with SIGKILL (`--kind crash`: no release, the leases must expire)
//! or stops it with SIGTERM (`--kind graceful`: it releases and hints its work), then measures, per
//! stream it held, the time from the signal to the moment another worker claimed the stream, and
//! starts a replacement worker. The last line printed is one JSON object with every sample.
//!
//! The claim instant is read from the item itself: a claim writes `lease_expires_at_ms = now +
//! lease`, so `expires - lease` is the claimer's clock at the claim (a later renewal only moves it
//! towards the moment the table was read, never before the claim); all processes share one clock.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use leaselock::{Clock, Hint, LeaseStore, LeaseTable, SystemClock};
use tokio::time::Instant;

use crate::demo::{LocalFeed, Stage};
use crate::{other, CliResult, TableArgs};

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// SIGKILL: the leases are not released, they expire.
    Crash,
    /// SIGTERM: the worker releases its leases and hints them to the fleet, then exits.
    Graceful,
}

#[derive(clap::Args, Debug, Clone)]
pub struct FailoverArgs {
    /// Which failure to force.
    #[arg(long, value_enum)]
    pub kind: Kind,
    /// Forced failures (rounds); each gives one sample per stream the victim held.
    #[arg(long, default_value_t = 50)]
    pub failures: usize,
    /// Streams held by the fleet.
    #[arg(long, default_value_t = 12)]
    pub connections: usize,
    /// Worker processes alive at any time.
    #[arg(long, default_value_t = 3)]
    pub workers: usize,
    /// Orphan index query interval of the workers, ms.
    #[arg(long, default_value_t = 2_000)]
    pub orphan_interval_ms: u64,
    /// Messages per second on each stream.
    #[arg(long, default_value_t = 1.0)]
    pub rate: f64,
    /// Where worker logs go.
    #[arg(long, default_value = "target/bench-failover")]
    pub dir: PathBuf,
}

#[derive(Debug, serde::Serialize)]
struct Report {
    kind: &'static str,
    failures: usize,
    connections: usize,
    workers: usize,
    lease_ms: u64,
    renew_ms: u64,
    clock_skew_ms: u64,
    orphan_interval_ms: u64,
    /// One per stream held by a victim: signal to claim by another worker, ms.
    samples_ms: Vec<u64>,
    /// Streams the victim had already lost (claimed by another before the signal): not samples.
    moved_before_signal: usize,
    /// Per failure: the slowest of its streams, ms.
    per_failure_max_ms: Vec<u64>,
    /// Graceful: from SIGTERM to the process's exit, ms.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    exit_ms: Vec<u64>,
    /// The machine's 1-minute load average at the first and the last round (it is shared).
    load_average: Vec<f64>,
}

fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0.0)
}

struct Workers {
    exe: PathBuf,
    args: Vec<String>,
    logs: PathBuf,
    next: usize,
    alive: Vec<(String, Child)>,
}

impl Workers {
    fn spawn(&mut self) -> CliResult {
        let name = format!("fo-w{}", self.next);
        self.next += 1;
        let log = std::fs::File::create(self.logs.join(format!("{name}.log"))).map_err(other)?;
        let child = Command::new(&self.exe)
            .args(&self.args)
            .args(["--worker-id", &name])
            .env("LEASELOCK_LOG", std::env::var("LEASELOCK_LOG").unwrap_or_else(|_| "warn".into()))
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(other)?)
            .stderr(log)
            .spawn()
            .map_err(other)?;
        self.alive.push((name, child));
        Ok(())
    }

    fn signal(&self, i: usize, signal: i32) -> CliResult {
        let pid = self.alive[i].1.id() as i32;
        // SAFETY: kill(2) on a child process this bench started and has not reaped.
        if unsafe { libc::kill(pid, signal) } != 0 {
            return Err(other(format!("kill {pid} failed: {}", std::io::Error::last_os_error())));
        }
        Ok(())
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for (_, child) in &mut self.alive {
            if child.try_wait().ok().flatten().is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// Waits (polling, bounded) for `child` to exit; returns how long after `since` it did.
async fn wait_exit(child: &mut Child, since: Instant, limit: Duration) -> CliResult<Duration> {
    loop {
        if child.try_wait().map_err(other)?.is_some() {
            return Ok(since.elapsed());
        }
        if since.elapsed() > limit {
            return Err(other(format!("worker pid {} did not exit within {limit:?}", child.id())));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Streams' current holders (unexpired leases only), by stream id.
async fn holders(table: &LeaseTable) -> CliResult<HashMap<String, (String, u64)>> {
    let now = SystemClock.now_ms();
    Ok(table
        .items()
        .await?
        .into_iter()
        .filter(|i| table.config().session_owner(&i.id).is_none())
        .filter_map(|i| {
            let owner = i.holder_at(now)?.to_string();
            Some((i.id, (owner, i.expires_at_ms.unwrap_or(0))))
        })
        .collect())
}

pub async fn run(args: &TableArgs, f: FailoverArgs) -> CliResult {
    let run_id = format!("{}-{}", SystemClock.now_ms(), std::process::id());
    let kind = match f.kind {
        Kind::Crash => "crash",
        Kind::Graceful => "graceful",
    };
    let lease_table = format!("bench-failover-{kind}-{run_id}");
    let messages_table = format!("{lease_table}-messages");
    let targs = TableArgs { table_name: lease_table.clone(), messages_table: messages_table.clone(), ..args.clone() };
    let Stage { table, config, sqs, queue_url } = Stage::create(&targs).await?;

    let LocalFeed { addr: feed_addr, stop: feed_stop, task: feed_task, .. } = LocalFeed::start(f.rate).await?;

    let logs = f.dir.join(format!("failover-{run_id}"));
    std::fs::create_dir_all(&logs).map_err(other)?;
    // The survivors alone can hold every stream, and no worker holds them all.
    let max = f.connections.div_ceil(f.workers.saturating_sub(1).max(1));
    let mut workers = Workers {
        exe: std::env::current_exe().map_err(other)?,
        args: [
            ["--table", &lease_table, "--messages-table", &messages_table],
            ["--index-name", &config.index_name, "--key-prefix", &config.key_prefix],
            ["--lease-ms", &config.lease_ms().to_string(), "--renew-ms", &config.renew_ms().to_string()],
            ["--skew-ms", &config.skew_ms().to_string(), "--mode", config.mode.as_str()],
        ]
        .iter()
        .flatten()
        .map(|s| s.to_string())
        .chain(
            [
                "worker",
                "--queue-url",
                &queue_url,
                "--max-connections",
                &max.to_string(),
                "--orphan-interval-ms",
                &f.orphan_interval_ms.to_string(),
                "--metrics-interval-ms",
                "600000",
            ]
            .map(String::from),
        )
        .collect(),
        logs: logs.clone(),
        next: 0,
        alive: Vec::new(),
    };
    for _ in 0..f.workers {
        workers.spawn()?;
    }

    let ids: Vec<String> = (0..f.connections).map(|i| format!("stream-{i:02}")).collect();
    for id in &ids {
        table.start(id, &format!("ws://{feed_addr}/{id}")).await?;
        let hint = Hint::new(id).to_json();
        sqs.send_message()
            .queue_url(&queue_url)
            .message_body(hint)
            .send()
            .await
            .map_err(|e| other(aws_sdk_sqs::error::DisplayErrorContext(e)))?;
    }
    let all_owned = Instant::now();
    while holders(&table).await?.len() < ids.len() {
        if all_owned.elapsed() > Duration::from_secs(60) {
            return Err(other("the fleet did not take every stream within 60 s"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "failover bench ({kind}): {} workers hold {} streams (lease {} ms, renew {} ms, skew {} ms, orphan query {} ms)",
        f.workers,
        ids.len(),
        config.lease_ms(),
        config.renew_ms(),
        config.skew_ms(),
        f.orphan_interval_ms
    );

    let lease_ms = config.lease_ms();
    let limit = Duration::from_millis(3 * lease_ms + 3 * f.orphan_interval_ms) + Duration::from_secs(15);
    let mut report = Report {
        kind,
        failures: f.failures,
        connections: f.connections,
        workers: f.workers,
        lease_ms,
        renew_ms: config.renew_ms(),
        clock_skew_ms: config.skew_ms(),
        orphan_interval_ms: f.orphan_interval_ms,
        samples_ms: Vec::new(),
        moved_before_signal: 0,
        per_failure_max_ms: Vec::new(),
        exit_ms: Vec::new(),
        load_average: vec![load_average()],
    };
    for round in 0..f.failures {
        // A random phase against the victim's renewal schedule (a crash lands anywhere in it); a
        // hand-over does not depend on it, a short pause lets the replacement settle.
        let phase_ms = if f.kind == Kind::Crash { config.renew_ms() } else { 500 };
        tokio::time::sleep(Duration::from_millis(rand::random::<u64>() % phase_ms.max(1))).await;
        let held = holders(&table).await?;
        let mut per: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (id, (owner, _)) in &held {
            per.entry(owner.as_str()).or_default().push(id.as_str());
        }
        let (victim_i, victim, victim_ids) = workers
            .alive
            .iter()
            .enumerate()
            .map(|(i, (name, _))| (i, name.clone(), per.get(name.as_str()).cloned().unwrap_or_default()))
            .max_by_key(|(_, _, ids)| ids.len())
            .ok_or_else(|| other("no worker alive"))?;
        if victim_ids.is_empty() {
            return Err(other("no worker holds a stream"));
        }
        let victim_ids: Vec<String> = victim_ids.into_iter().map(String::from).collect();
        let signalled_ms = SystemClock.now_ms();
        let signalled = Instant::now();
        workers.signal(victim_i, if f.kind == Kind::Crash { libc::SIGKILL } else { libc::SIGTERM })?;
        let (_, mut child) = workers.alive.remove(victim_i);
        let exit = tokio::spawn(async move { wait_exit(&mut child, signalled, Duration::from_secs(30)).await });

        let mut claimed: HashMap<String, Option<u64>> = HashMap::new();
        while claimed.len() < victim_ids.len() {
            if signalled.elapsed() > limit {
                return Err(other(format!(
                    "round {round}: {} of {} streams of {victim} not claimed within {limit:?}",
                    victim_ids.len() - claimed.len(),
                    victim_ids.len()
                )));
            }
            let read_at = SystemClock.now_ms();
            for (id, (owner, expires)) in holders(&table).await? {
                if owner != victim && victim_ids.contains(&id) && !claimed.contains_key(&id) {
                    // Claimed before the signal: the victim had already lost it (a missed
                    // deadline), so it is no failover sample.
                    let at = expires.saturating_sub(lease_ms).min(read_at);
                    claimed.insert(id, at.checked_sub(signalled_ms));
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let exited = exit.await.map_err(other)??;
        if f.kind == Kind::Graceful {
            report.exit_ms.push(exited.as_millis() as u64);
        }
        report.moved_before_signal += claimed.values().filter(|c| c.is_none()).count();
        let slowest = claimed.values().flatten().copied().max().unwrap_or(0);
        eprintln!(
            "  {kind} {}/{}: {victim} held {}, all claimed by others after {slowest} ms",
            round + 1,
            f.failures,
            victim_ids.len()
        );
        report.per_failure_max_ms.push(slowest);
        report.samples_ms.extend(claimed.into_values().flatten());
        workers.spawn()?;
    }
    report.load_average.push(load_average());
    for i in 0..workers.alive.len() {
        workers.signal(i, libc::SIGTERM)?;
    }
    for (_, child) in &mut workers.alive {
        wait_exit(child, Instant::now(), Duration::from_secs(30)).await?;
    }
    feed_stop.cancel();
    let _ = feed_task.await;
    println!("{}", serde_json::to_string(&report).map_err(other)?);
    Ok(())
}
