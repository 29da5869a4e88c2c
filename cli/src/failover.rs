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
//! In session mode a claim writes no time (the connection item carries the held sentinel): the
//! instant is read from the claimers' logs, where the engine logs each claim (`claimed
//! connection_id=...`, info) with its wall clock as the answer arrives. Reading the table instead
//! would add requests to the engine the claims are waiting on. Between session-mode rounds the
//! replacement worker is given time to take its share (the busiest worker then holds at most
//! its fair share and 2), so each victim holds what a worker of a balanced fleet holds.
//!
//! With `--steady-ms`, before the first round and once the fleet has settled (who holds what
//! unchanged for 3 s), the lease table's writes are counted over that window by the local
//! engine's per-partition counts (`/_leaselock/partitions`, scripts/partition_limits.py; the
//! engine must run with `LEASELOCK_PARTITION_WCU` or `_RCU` set): every item write to the lease
//! table except those of transactions that also write another table (the workers' fenced
//! message writes with their checkpoints, the application's writes). Divided by the connections
//! held and the window, that is the lease keeping's writes per connection-hour.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Seek};
use std::path::{Path, PathBuf};
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
    /// A stream STARTed (and hinted), its claimer killed with SIGKILL as soon as the claim has
    /// landed: the claim may not be in the owner index yet (a lagging index), and the stream
    /// must be owned again all the same. One sample per round; a stream not claimed again
    /// within the round's limit counts as stranded.
    Fresh,
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
    /// Count the lease table's writes over this many ms of steady holding before the first
    /// round (0: not counted).
    #[arg(long, default_value_t = 0)]
    pub steady_ms: u64,
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
    /// Per failure: the quickest of its streams, ms (the failure's detection plus one claim).
    per_failure_min_ms: Vec<u64>,
    /// Graceful: from SIGTERM to the process's exit, ms.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    exit_ms: Vec<u64>,
    /// The machine's 1-minute load average at the first and the last round (it is shared).
    load_average: Vec<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mode: Option<&'static str>,
    /// How a claim's instant was found: `claim expiry` (per-item) or `poll` (session).
    claim_instant: &'static str,
    /// With `--steady-ms`: the lease table's writes in the steady window.
    #[serde(skip_serializing_if = "Option::is_none")]
    steady: Option<WriteCount>,
    /// With `--steady-ms`: the lease table's writes from the first round to the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    rounds: Option<WriteCount>,
    /// `fresh`: streams not claimed again within the round's limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    stranded: Option<usize>,
    /// `fresh`: how long a round waited for a claim again before counting its stream stranded, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    stranded_after_ms: Option<u64>,
}

/// The lease table's item writes over a window, as the local engine counted them.
#[derive(Debug, serde::Serialize)]
struct WriteCount {
    window_ms: u64,
    connections: usize,
    /// Item writes to the lease table, by operation (transactions with other tables left out).
    writes: BTreeMap<String, u64>,
    /// Writes of the workers' fenced transactions (message + checkpoint), not lease keeping.
    application_writes: u64,
    writes_per_connection_hour: f64,
    /// Requests the engine refused for a partition over its limit (the whole engine).
    throttled_requests: u64,
    /// The three busiest write partitions of the lease table and its indexes: (index or
    /// `(table)`, partition value, peak write units in one second).
    peak_write_partitions: Vec<(String, String, f64)>,
}

/// Session mode: how often the claimers' logs are read during a round (ms).
const SESSION_POLL_MS: u64 = 20;

/// Session mode's claim instants: the `claimed` lines of the workers' logs, read as they grow.
#[derive(Default)]
struct ClaimLogs {
    /// How far each log has been read (to the end of its last whole line).
    read: HashMap<PathBuf, u64>,
}

impl ClaimLogs {
    /// Skips what the logs in `dir` hold so far.
    fn skip(&mut self, dir: &Path) -> CliResult {
        for path in logs_in(dir)? {
            let len = std::fs::metadata(&path).map_err(other)?.len();
            self.read.insert(path, len);
        }
        Ok(())
    }

    /// The claims logged since the last read, but not by `except`'s log: (stream, wall ms).
    fn claims(&mut self, dir: &Path, except: &str) -> CliResult<Vec<(String, u64)>> {
        let mut found = Vec::new();
        for path in logs_in(dir)? {
            if path.file_stem().is_some_and(|s| s == except) {
                continue;
            }
            let from = self.read.get(&path).copied().unwrap_or(0);
            let mut file = std::fs::File::open(&path).map_err(other)?;
            file.seek(std::io::SeekFrom::Start(from)).map_err(other)?;
            let mut text = String::new();
            file.read_to_string(&mut text).map_err(other)?;
            let Some(end) = text.rfind('\n') else { continue };
            self.read.insert(path, from + end as u64 + 1);
            found.extend(text[..end].lines().filter_map(claim_line));
        }
        Ok(found)
    }
}

fn logs_in(dir: &Path) -> CliResult<Vec<PathBuf>> {
    let mut paths = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(other)? {
        let path = entry.map_err(other)?.path();
        if path.extension().is_some_and(|e| e == "log") {
            paths.push(path);
        }
    }
    Ok(paths)
}

/// `2026-12-03T09:19:53.533936Z  INFO leaselock::engine::claims: claimed connection_id=stream-07 ...`
/// (the worker's log line without colours) as (stream, wall ms).
fn claim_line(line: &str) -> Option<(String, u64)> {
    let (stamp, rest) = line.split_once(' ')?;
    let rest = rest.split_once(": claimed ")?.1;
    let id = rest.split_once("connection_id=")?.1.split(' ').next()?;
    Some((id.to_string(), rfc3339_ms(stamp)?))
}

/// `YYYY-MM-DDTHH:MM:SS[.fraction]Z` as epoch ms.
fn rfc3339_ms(stamp: &str) -> Option<u64> {
    let stamp = stamp.strip_suffix('Z')?;
    let (date, time) = stamp.split_once('T')?;
    let mut d = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, fraction) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.splitn(3, ':').map(|p| p.parse::<i64>().ok());
    let (hh, mm, ss) = (t.next()??, t.next()??, t.next()??);
    let ms: i64 = format!("{fraction:0<3}")[..3].parse().ok()?;
    // Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's days_from_civil).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    u64::try_from(((days * 24 + hh) * 60 + mm) * 60_000 + ss * 1_000 + ms).ok()
}

/// The local engine's per-partition counts (`GET`), or a reset of them (`POST .../reset`).
async fn engine_counts(method: &str) -> CliResult<serde_json::Value> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let endpoint = std::env::var("AWS_ENDPOINT_URL").map_err(|_| other("AWS_ENDPOINT_URL is not set"))?;
    let host = endpoint.trim_start_matches("http://").trim_end_matches('/').to_string();
    let path = if method == "POST" { "/_leaselock/partitions/reset" } else { "/_leaselock/partitions" };
    let mut stream = tokio::net::TcpStream::connect(&host).await.map_err(other)?;
    let request = format!("{method} {path} HTTP/1.0\r\nHost: {host}\r\nContent-Length: 0\r\n\r\n");
    stream.write_all(request.as_bytes()).await.map_err(other)?;
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_string(&mut answer))
        .await
        .map_err(other)?
        .map_err(other)?;
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    if !head.contains(" 200 ") {
        return Err(other(format!(
            "the local engine at {endpoint} keeps no per-partition counts (start it with LEASELOCK_PARTITION_WCU set): {}",
            head.lines().next().unwrap_or("")
        )));
    }
    serde_json::from_str(body).map_err(other)
}

fn write_count(
    counts: &serde_json::Value,
    before: Option<&serde_json::Value>,
    table: &str,
    window: Duration,
    connections: usize,
) -> WriteCount {
    let ops = |c: &serde_json::Value| -> BTreeMap<String, u64> {
        c["writes"][table]
            .as_object()
            .map(|o| o.iter().map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(0))).collect())
            .unwrap_or_default()
    };
    let mut writes = ops(counts);
    if let Some(before) = before {
        for (op, n) in ops(before) {
            let e = writes.entry(op).or_default();
            *e = e.saturating_sub(n);
        }
    }
    let application_writes = writes.remove("TransactWriteItems (with other tables)").unwrap_or(0);
    let lease_writes: u64 = writes.values().sum();
    let hours = window.as_secs_f64() / 3600.0;
    let throttled = counts["throttled_requests"].as_u64().unwrap_or(0)
        - before.map_or(0, |b| b["throttled_requests"].as_u64().unwrap_or(0));
    let mut peak_write_partitions: Vec<(String, String, f64)> = counts["partitions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["table"] == table && p["kind"] == "write")
        .map(|p| {
            (
                p["index"].as_str().unwrap_or("(table)").to_string(),
                p["partition"].as_str().unwrap_or("").to_string(),
                p["peak_units_per_s"].as_f64().unwrap_or(0.0),
            )
        })
        .collect();
    peak_write_partitions.sort_by(|a, b| b.2.total_cmp(&a.2));
    peak_write_partitions.truncate(3);
    WriteCount {
        window_ms: window.as_millis() as u64,
        connections,
        writes,
        application_writes,
        writes_per_connection_hour: (lease_writes as f64 / connections as f64 / hours * 100.0).round() / 100.0,
        throttled_requests: throttled,
        peak_write_partitions,
    }
}

/// Streams held per worker, by worker. Session mode reads what each live session said it holds
/// at its last renewal (one query of the session partition); per-item mode reads the table (a
/// scan: a few items there).
async fn spread(table: &LeaseTable, session: bool) -> CliResult<BTreeMap<String, usize>> {
    let mut per = BTreeMap::new();
    if session {
        let now = SystemClock.now_ms();
        for s in table.sessions(u64::MAX).await? {
            if s.expires_at_ms > now {
                per.insert(s.owner, s.load.map_or(0, |l| l.held as usize));
            }
        }
    } else {
        for (owner, _) in holders(table).await?.values() {
            *per.entry(owner.clone()).or_default() += 1;
        }
    }
    Ok(per)
}

/// Session mode, between rounds: waits (bounded) until the busiest live worker holds at most its
/// fair share and 2, the replacement having taken its share by balance.
async fn balanced(table: &LeaseTable, connections: usize, workers: usize) -> CliResult {
    let fair = connections.div_ceil(workers.max(1));
    let began = Instant::now();
    loop {
        let per = spread(table, true).await?;
        let held: usize = per.values().sum();
        if per.len() == workers && held == connections && per.values().all(|n| *n <= fair + 2) {
            return Ok(());
        }
        if began.elapsed() > Duration::from_secs(60) {
            eprintln!("  the fleet did not balance within 60 s: {per:?}");
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
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
    /// The workers' `LEASELOCK_LOG` when the bench's own is not set.
    log_filter: String,
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
            .env("LEASELOCK_LOG", std::env::var("LEASELOCK_LOG").unwrap_or_else(|_| self.log_filter.clone()))
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

/// `--kind fresh`: what its rounds use.
struct Fresh<'a> {
    table: &'a LeaseTable,
    sqs: &'a aws_sdk_sqs::Client,
    queue_url: &'a str,
    feed: std::net::SocketAddr,
    /// How long a round waits for the stream to be claimed again.
    limit: Duration,
}

impl Fresh<'_> {
    /// The stream's holder now, by a consistent read of its item (no index).
    async fn holder(&self, id: &str) -> CliResult<Option<String>> {
        let now = SystemClock.now_ms();
        Ok(self.table.get(id).await?.and_then(|i| i.holder_at(now).map(str::to_string)))
    }

    /// Each round: a new stream STARTed and hinted; its claimer killed once the claim has
    /// landed (read every 2 ms); a replacement started; the time from the kill to another
    /// worker's claim (read every 20 ms) is the round's sample.
    async fn rounds(&self, workers: &mut Workers, report: &mut Report, failures: usize) -> CliResult {
        report.stranded = Some(0);
        report.stranded_after_ms = Some(self.limit.as_millis() as u64);
        for round in 0..failures {
            let id = format!("fresh-{round:02}");
            self.table.start(&id, &format!("ws://{}/{id}", self.feed)).await?;
            self.sqs
                .send_message()
                .queue_url(self.queue_url)
                .message_body(Hint::new(&id).to_json())
                .send()
                .await
                .map_err(|e| other(aws_sdk_sqs::error::DisplayErrorContext(e)))?;
            let started = Instant::now();
            let claimer = loop {
                if let Some(owner) = self.holder(&id).await? {
                    break owner;
                }
                if started.elapsed() > Duration::from_secs(30) {
                    return Err(other(format!("round {round}: {id} not claimed within 30 s")));
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            };
            let i = workers
                .alive
                .iter()
                .position(|(name, _)| *name == claimer)
                .ok_or_else(|| other(format!("{id} claimed by {claimer}, no worker of this bench")))?;
            let killed = Instant::now();
            workers.signal(i, libc::SIGKILL)?;
            let (_, mut child) = workers.alive.remove(i);
            wait_exit(&mut child, killed, Duration::from_secs(30)).await?;
            workers.spawn()?;
            let again = loop {
                match self.holder(&id).await? {
                    Some(owner) if owner != claimer => break Some(killed.elapsed()),
                    _ if killed.elapsed() > self.limit => break None,
                    _ => tokio::time::sleep(Duration::from_millis(20)).await,
                }
            };
            let n = round + 1;
            match again {
                Some(after) => {
                    let ms = after.as_millis() as u64;
                    eprintln!(
                        "  fresh {n}/{failures}: {claimer} killed once it claimed {id}, claimed again after {ms} ms"
                    );
                    report.samples_ms.push(ms);
                    report.per_failure_max_ms.push(ms);
                    report.per_failure_min_ms.push(ms);
                }
                None => {
                    let limit = self.limit;
                    eprintln!("  fresh {n}/{failures}: {claimer} killed once it claimed {id}: STRANDED (not claimed again within {limit:?})");
                    *report.stranded.get_or_insert(0) += 1;
                }
            }
        }
        Ok(())
    }
}

pub async fn run(args: &TableArgs, f: FailoverArgs) -> CliResult {
    let run_id = format!("{}-{}", SystemClock.now_ms(), std::process::id());
    let kind = match f.kind {
        Kind::Crash => "crash",
        Kind::Graceful => "graceful",
        Kind::Fresh => "fresh",
    };
    let lease_table = format!("bench-failover-{kind}-{run_id}");
    let messages_table = format!("{lease_table}-messages");
    let targs = TableArgs { table_name: lease_table.clone(), messages_table: messages_table.clone(), ..args.clone() };
    let Stage { table, config, sqs, queue_url } = Stage::create(&targs).await?;

    let LocalFeed { addr: feed_addr, stop: feed_stop, task: feed_task, .. } = LocalFeed::start(f.rate).await?;

    let logs = f.dir.join(format!("failover-{run_id}"));
    std::fs::create_dir_all(&logs).map_err(other)?;
    // The survivors alone can hold every stream, and no worker holds them all.
    // (A fresh claim's rounds add a stream each: any worker may hold them all.)
    let max = match f.kind {
        Kind::Fresh => f.connections + f.failures,
        _ => f.connections.div_ceil(f.workers.saturating_sub(1).max(1)),
    };
    let mut workers = Workers {
        exe: std::env::current_exe().map_err(other)?,
        args: [
            ["--table", &lease_table, "--messages-table", &messages_table],
            ["--index-name", &config.index_name, "--key-prefix", &config.key_prefix],
            ["--lease-ms", &config.lease_ms().to_string(), "--renew-ms", &config.renew_ms().to_string()],
            ["--clock-skew-ms", &config.skew_ms().to_string(), "--mode", config.mode.as_str()],
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
        // Session mode reads the claims from the logs.
        log_filter: if config.mode == leaselock::LeaseMode::Session { "warn,leaselock::engine=info" } else { "warn" }
            .to_string(),
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
    let session = config.mode == leaselock::LeaseMode::Session;
    let all_owned = Instant::now();
    while spread(&table, session).await?.values().sum::<usize>() < ids.len() {
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

    let mut steady = None;
    let mut window_counts = None;
    if f.steady_ms > 0 {
        // Settled: who holds what unchanged for 3 s (balance hand-overs are over).
        let began = Instant::now();
        let mut last = (spread(&table, session).await?, Instant::now());
        while last.1.elapsed() < Duration::from_secs(3) {
            if began.elapsed() > Duration::from_secs(120) {
                return Err(other("the fleet did not settle within 120 s"));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            let now = spread(&table, session).await?;
            if now != last.0 || now.values().sum::<usize>() < ids.len() {
                last = (now, Instant::now());
            }
        }
        engine_counts("POST").await?;
        let started = Instant::now();
        tokio::time::sleep(Duration::from_millis(f.steady_ms)).await;
        let counts = engine_counts("GET").await?;
        let held: usize = spread(&table, session).await?.values().sum();
        if held < ids.len() {
            return Err(other(format!(
                "the fleet held {held} of {} streams at the end of the steady window",
                ids.len()
            )));
        }
        let count = write_count(&counts, None, &lease_table, started.elapsed(), ids.len());
        eprintln!(
            "failover bench ({kind}): steady window {} ms: lease writes {:?}, {} per connection-hour",
            count.window_ms, count.writes, count.writes_per_connection_hour
        );
        steady = Some(count);
        window_counts = Some(counts);
    }
    let rounds_began = Instant::now();

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
        per_failure_min_ms: Vec::new(),
        exit_ms: Vec::new(),
        load_average: vec![load_average()],
        mode: session.then_some("session"),
        claim_instant: if session { "claimer's log" } else { "claim expiry" },
        steady,
        rounds: None,
        stranded: None,
        stranded_after_ms: None,
    };
    // The signal rounds (a fresh claim's rounds are their own).
    let rounds = if f.kind == Kind::Fresh {
        let fresh = Fresh { table: &table, sqs: &sqs, queue_url: &queue_url, feed: feed_addr, limit };
        fresh.rounds(&mut workers, &mut report, f.failures).await?;
        0
    } else {
        f.failures
    };
    for round in 0..rounds {
        // A random phase against the victim's renewal schedule (a crash lands anywhere in it); a
        // hand-over does not depend on it, a short pause lets the replacement settle.
        let phase_ms = if f.kind == Kind::Crash { config.renew_ms() } else { 500 };
        tokio::time::sleep(Duration::from_millis(rand::random::<u64>() % phase_ms.max(1))).await;
        let (victim_i, victim, victim_ids) = if session {
            // The busiest live session (by what it said at its last renewal), and what it holds
            // now (the owner index, then consistent reads): no scan of the table, whose length
            // would hold the engine (it serves one DynamoDB request at a time).
            let per = spread(&table, session).await?;
            let (i, name) = workers
                .alive
                .iter()
                .enumerate()
                .map(|(i, (name, _))| (i, name.clone()))
                .max_by_key(|(_, name)| per.get(name).copied().unwrap_or(0))
                .ok_or_else(|| other("no worker alive"))?;
            let held: Vec<String> = table.owned_by(&name).await?.into_iter().map(|i| i.id).collect();
            (i, name, held)
        } else {
            let held = holders(&table).await?;
            let mut per: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
            for (id, (owner, _)) in &held {
                per.entry(owner.as_str()).or_default().push(id.as_str());
            }
            let (i, name, ids) = workers
                .alive
                .iter()
                .enumerate()
                .map(|(i, (name, _))| (i, name.clone(), per.get(name.as_str()).cloned().unwrap_or_default()))
                .max_by_key(|(_, _, ids)| ids.len())
                .ok_or_else(|| other("no worker alive"))?;
            (i, name, ids.into_iter().map(String::from).collect())
        };
        if victim_ids.is_empty() {
            return Err(other("no worker holds a stream"));
        }
        let mut claim_logs = ClaimLogs::default();
        if session {
            claim_logs.skip(&logs)?;
        }
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
            if session {
                // No claim time on the item: the claimers' logs say when each claim landed.
                for (id, at) in claim_logs.claims(&logs, &victim)? {
                    if victim_ids.contains(&id) && !claimed.contains_key(&id) {
                        // Claimed before the signal: handed over before it (a balance hand-over
                        // in flight), so it is no failover sample.
                        claimed.insert(id, at.checked_sub(signalled_ms));
                    }
                }
            } else {
                let read_at = SystemClock.now_ms();
                for (id, (owner, expires)) in holders(&table).await? {
                    if owner != victim && victim_ids.contains(&id) && !claimed.contains_key(&id) {
                        // Claimed before the signal: the victim had already lost it (a missed
                        // deadline), so it is no failover sample.
                        let at = expires.saturating_sub(lease_ms).min(read_at);
                        claimed.insert(id, at.checked_sub(signalled_ms));
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(if session { SESSION_POLL_MS } else { 20 })).await;
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
        report.per_failure_min_ms.push(claimed.values().flatten().copied().min().unwrap_or(0));
        report.samples_ms.extend(claimed.into_values().flatten());
        workers.spawn()?;
        if session && round + 1 < f.failures {
            balanced(&table, f.connections, f.workers).await?;
        }
    }
    report.load_average.push(load_average());
    if let Some(before) = &window_counts {
        let counts = engine_counts("GET").await?;
        report.rounds = Some(write_count(&counts, Some(before), &lease_table, rounds_began.elapsed(), ids.len()));
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_lines_give_the_stream_and_the_claimers_wall_clock() {
        let line =
            "2026-12-03T09:19:53.533936Z  INFO leaselock::engine::claims: claimed connection_id=stream-07 fence=3 \
                    source=\"dead session\" worker_id=fo-w2";
        assert_eq!(claim_line(line), Some(("stream-07".into(), 1_796_289_593_533)));
        assert_eq!(rfc3339_ms("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(rfc3339_ms("2000-02-29T23:59:59.9Z"), Some(951_868_799_900));
        assert_eq!(
            claim_line("2026-12-03T09:19:53.5Z  INFO leaselock::engine::orphan_round: took over a dead session's work"),
            None
        );
        assert_eq!(claim_line("garbage"), None);
    }
}
