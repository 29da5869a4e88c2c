//! The local demo: an upstream feed, a fleet of worker processes (Rust, Python and Node, on the
//! same table), 30 streams; one worker is killed with SIGKILL, another (optionally) frozen with
//! SIGSTOP past its deadline and thawed, another stopped with SIGTERM; every stream must be owned
//! again within the bounds, with no gap and no two owners at once. The last line printed is one
//! JSON report.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use leaselock::lease::HELD_UNDER_SESSION_MS;
use leaselock::{Clock, DesiredState, Hint, LeaseItem, LeaseStore, LeaseTable, SystemClock, TableConfig};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::upstream::Feed;
use crate::{other, CliResult, Failure, TableArgs};

/// The language of a worker process: the CLI's `leaselock worker`, or one of the reference
/// workers in examples/ through its binding.
#[derive(clap::ValueEnum, serde::Serialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    Rust,
    Python,
    Node,
}

impl Language {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Language::Rust => "rust",
            Language::Python => "python",
            Language::Node => "node",
        }
    }
}

#[derive(clap::Args, Debug, Clone)]
pub struct DemoArgs {
    /// Streams to run.
    #[arg(long, default_value_t = 30)]
    pub connections: usize,
    /// Worker processes (at least 3: one is killed, one stopped, one survives).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(3..=16))]
    pub workers: u64,
    /// Messages per second on each stream.
    #[arg(long, default_value_t = 2.0)]
    pub rate: f64,
    /// Seconds of steady state before the first failure.
    #[arg(long, default_value_t = 5)]
    pub settle_secs: u64,
    /// Also freeze a worker with SIGSTOP past its lease deadline, then SIGCONT it: its writes
    /// must all be refused by the fence.
    #[arg(long)]
    pub zombie: bool,
    /// Orphan query interval of the workers, ms.
    #[arg(long, default_value_t = 2_000)]
    pub orphan_interval_ms: u64,
    /// Desired-state check interval of the workers, ms.
    #[arg(long, default_value_t = 10_000)]
    pub desired_state_interval_ms: u64,
    /// Where worker logs go.
    #[arg(long, default_value = ".demo")]
    pub dir: PathBuf,
    /// Languages of the workers, in turn (worker i runs the i-th, cycling): `rust` is
    /// `leaselock worker`, `python` examples/python_worker.py, `node` examples/node_worker.mjs.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "rust,python,node")]
    pub languages: Vec<Language>,
    /// The language each failure hits, in the order they happen: the SIGKILL, the SIGSTOP (with
    /// --zombie), the SIGTERM. Each goes to the busiest worker of that language not hit yet;
    /// without this, to the busiest worker not hit yet.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub victims: Vec<Language>,
    #[command(flatten)]
    pub runtimes: Runtimes,
}

/// What runs the workers that are not `leaselock worker` (the demo's and the balance scenario's).
#[derive(clap::Args, Debug, Clone)]
pub struct Runtimes {
    /// The Python interpreter with the binding installed (default: the repository's .venv).
    #[arg(long)]
    pub python: Option<PathBuf>,
    /// The Node executable.
    #[arg(long, default_value = "node")]
    pub node: PathBuf,
    /// Where examples/python_worker.py and examples/node_worker.mjs are (default: the
    /// repository's examples/).
    #[arg(long)]
    pub examples: Option<PathBuf>,
}

impl DemoArgs {
    /// Each worker's language: `languages` cycled over `workers`.
    fn fleet_languages(&self) -> Vec<Language> {
        self.languages.iter().copied().cycle().take(self.workers as usize).collect()
    }

    /// Refuses victims the fleet cannot provide: more failures than phases, or more hits on a
    /// language than it has workers (one worker must survive every phase).
    fn check_victims(&self) -> CliResult {
        let phases = if self.zombie { 3 } else { 2 };
        if self.languages.is_empty() {
            return Err(other("--languages: at least one language"));
        }
        if self.victims.len() > phases {
            return Err(other(format!("--victims: {phases} failures in this demo, {} given", self.victims.len())));
        }
        let fleet = self.fleet_languages();
        for lang in &self.victims {
            let hits = self.victims.iter().filter(|v| *v == lang).count();
            let have = fleet.iter().filter(|l| *l == lang).count();
            if hits > have {
                return Err(other(format!("--victims: {hits} hits on {} but {have} such workers", lang.as_str())));
            }
        }
        Ok(())
    }
}

/// The repository this CLI was built from (examples/ and .venv are found there by default).
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_default()
}

#[derive(Debug, Default, serde::Serialize)]
struct Report {
    demo: &'static str,
    /// `per-item` or `session`.
    mode: &'static str,
    connections: usize,
    workers: u64,
    lease_ms: u64,
    clock_skew_ms: u64,
    gaps: u64,
    duplicates: u64,
    double_owner: u64,
    crash_failover_max_ms: u64,
    graceful_handover_max_ms: u64,
    /// From SIGTERM to the exit of the worker stopped gracefully.
    sigterm_exit_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    zombie_failover_max_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    zombie_writes_accepted: Option<u64>,
    messages: u64,
    max_subscribers_per_stream: usize,
    /// Workers that did not end with exit status 0 when stopped by SIGTERM (or ended unasked).
    unclean_exits: u64,
    /// The languages of the workers run, each once, in the order started.
    languages: Vec<Language>,
    /// The language of the worker killed (SIGKILL), frozen (SIGSTOP + SIGCONT) and stopped
    /// (SIGTERM).
    killed: Option<Language>,
    #[serde(skip_serializing_if = "Option::is_none")]
    frozen: Option<Language>,
    terminated: Option<Language>,
}

pub(crate) struct Fleet {
    pub(crate) children: Vec<(String, Child)>,
    /// The language of each child.
    pub(crate) languages: Vec<Language>,
}

impl Fleet {
    fn pid(&self, i: usize) -> i32 {
        self.children[i].1.id() as i32
    }

    pub(crate) fn signal(&self, i: usize, signal: i32) -> CliResult {
        // SAFETY: kill(2) on a child process this demo started and has not reaped.
        if unsafe { libc::kill(self.pid(i), signal) } != 0 {
            return Err(other(format!("kill {} failed: {}", self.pid(i), std::io::Error::last_os_error())));
        }
        Ok(())
    }

    /// The first worker that exited though no failure was aimed at it yet, as an error naming
    /// its log (a worker that cannot start fails the demo at once, not by a timeout).
    fn exited_early(&mut self, logs: &Path, among: &[usize]) -> CliResult {
        for (i, (name, child)) in self.children.iter_mut().enumerate() {
            if !among.contains(&i) {
                continue;
            }
            if let Some(status) = child.try_wait().map_err(other)? {
                let log = logs.join(format!("{name}.log"));
                let tail = std::fs::read_to_string(&log).unwrap_or_default();
                let last = tail.lines().map(str::trim).rev().find(|l| !l.is_empty()).unwrap_or_default();
                return Err(other(format!("worker {name} exited early ({status}): {last:?} (see {})", log.display())));
            }
        }
        Ok(())
    }

    /// Waits (polling, bounded) for child `i` to exit; returns its status.
    pub(crate) async fn wait_exit(&mut self, i: usize, limit: Duration) -> CliResult<std::process::ExitStatus> {
        let until = Instant::now() + limit;
        loop {
            if let Some(status) = self.children[i].1.try_wait().map_err(other)? {
                return Ok(status);
            }
            if Instant::now() >= until {
                return Err(other(format!("{} did not exit within {limit:?}", self.children[i].0)));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for (_, child) in &mut self.children {
            if child.try_wait().ok().flatten().is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// How a worker of each language is started: all of them get the same tables, lease settings,
/// hint queue and intervals (the CLI's flags, the examples' LEASELOCK_* environment).
pub(crate) struct Launch<'a> {
    exe: PathBuf,
    python: PathBuf,
    node: PathBuf,
    examples: PathBuf,
    lease_table: &'a str,
    messages_table: &'a str,
    config: &'a TableConfig,
    queue_url: &'a str,
    orphan_interval_ms: u64,
    desired_state_interval_ms: u64,
}

impl<'a> Launch<'a> {
    /// Workers of `targs`' tables (`config`) and of the hint queue, run by `runtimes`.
    pub(crate) fn new(
        runtimes: &Runtimes,
        targs: &'a TableArgs,
        config: &'a TableConfig,
        queue_url: &'a str,
        orphan_interval_ms: u64,
        desired_state_interval_ms: u64,
    ) -> CliResult<Self> {
        Ok(Launch {
            exe: std::env::current_exe().map_err(other)?,
            python: runtimes.python.clone().unwrap_or_else(|| repo_root().join(".venv/bin/python")),
            node: runtimes.node.clone(),
            examples: runtimes.examples.clone().unwrap_or_else(|| repo_root().join("examples")),
            lease_table: &targs.table_name,
            messages_table: &targs.messages_table,
            config,
            queue_url,
            orphan_interval_ms,
            desired_state_interval_ms,
        })
    }

    pub(crate) fn command(&self, language: Language, name: &str) -> Command {
        let c = self.config;
        let mut cmd = match language {
            Language::Rust => {
                let mut cmd = Command::new(&self.exe);
                cmd.args(["--table", self.lease_table, "--messages-table", self.messages_table])
                    .args(["--index-name", &c.index_name, "--key-prefix", &c.key_prefix])
                    .args(["--lease-ms", &c.lease_ms().to_string(), "--renew-ms", &c.renew_ms().to_string()])
                    .args(["--clock-skew-ms", &c.skew_ms().to_string(), "--mode", c.mode.as_str()])
                    .args([
                        "worker",
                        "--worker-id",
                        name,
                        "--queue-url",
                        self.queue_url,
                        "--metrics-interval-ms",
                        "5000",
                    ])
                    .args(["--orphan-interval-ms", &self.orphan_interval_ms.to_string()])
                    .args(["--desired-state-interval-ms", &self.desired_state_interval_ms.to_string()]);
                cmd
            }
            Language::Python => {
                let mut cmd = Command::new(&self.python);
                cmd.arg(self.examples.join("python_worker.py")).env("PYTHONUNBUFFERED", "1");
                cmd
            }
            Language::Node => {
                let mut cmd = Command::new(&self.node);
                cmd.arg(self.examples.join("node_worker.mjs"));
                cmd
            }
        };
        if language != Language::Rust {
            cmd.envs([
                ("LEASELOCK_TABLE", self.lease_table.to_string()),
                ("LEASELOCK_MESSAGES_TABLE", self.messages_table.to_string()),
                ("LEASELOCK_INDEX_NAME", c.index_name.clone()),
                ("LEASELOCK_OWNER_INDEX_NAME", c.owner_index_name.clone()),
                ("LEASELOCK_KEY_PREFIX", c.key_prefix.clone()),
                ("LEASELOCK_LEASE_MS", c.lease_ms().to_string()),
                ("LEASELOCK_RENEW_MS", c.renew_ms().to_string()),
                ("LEASELOCK_CLOCK_SKEW_MS", c.skew_ms().to_string()),
                ("LEASELOCK_MODE", c.mode.as_str().to_string()),
                ("LEASELOCK_ORPHAN_SHARDS", c.orphan_shards.to_string()),
                ("LEASELOCK_WORKER_ID", name.to_string()),
                ("LEASELOCK_QUEUE_URL", self.queue_url.to_string()),
                ("LEASELOCK_METRICS_INTERVAL_MS", "5000".to_string()),
                ("LEASELOCK_ORPHAN_INTERVAL_MS", self.orphan_interval_ms.to_string()),
                ("LEASELOCK_DESIRED_STATE_INTERVAL_MS", self.desired_state_interval_ms.to_string()),
            ]);
        }
        cmd.env("LEASELOCK_LOG", std::env::var("LEASELOCK_LOG").unwrap_or_else(|_| "info".into()));
        cmd
    }
}

/// Waits (polling the logs, bounded) until every worker has said `worker NAME: running`, which
/// each language prints as its worker starts.
/// What a worker's engine logs (info) once the store's clock is measured within its tolerance:
/// it claims from then on, not before.
const CLAIMS_RESUME: &str = "the store's clock is measured: claims resume";

/// Waits until every worker says it runs and may claim (its clock measured against the store's),
/// so that no worker takes the first streams only because it was ready sooner.
async fn wait_running(fleet: &mut Fleet, logs: &Path, limit: Duration) -> CliResult {
    let until = Instant::now() + limit;
    let all: Vec<usize> = (0..fleet.children.len()).collect();
    loop {
        fleet.exited_early(logs, &all)?;
        let waiting: Vec<&str> = fleet
            .children
            .iter()
            .map(|(name, _)| name.as_str())
            .filter(|name| {
                let log = std::fs::read_to_string(logs.join(format!("{name}.log"))).unwrap_or_default();
                !(log.contains(&format!("worker {name}: running")) && log.contains(CLAIMS_RESUME))
            })
            .collect();
        if waiting.is_empty() {
            return Ok(());
        }
        if Instant::now() >= until {
            return Err(other(format!("not running after {limit:?}: {}", waiting.join(", "))));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Fails as soon as any worker exits (for a phase no signal is part of).
async fn watch_exits(fleet: &mut Fleet, logs: &Path) -> CliResult {
    let all: Vec<usize> = (0..fleet.children.len()).collect();
    loop {
        fleet.exited_early(logs, &all)?;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub(crate) fn say(t0: Instant, msg: impl AsRef<str>) {
    println!("[{:>6.1}s] {}", t0.elapsed().as_secs_f64(), msg.as_ref());
}

/// `owned 20/30  demo-w1:10 demo-w2:10`, and with `gone` (a worker killed or leaving) its
/// unexpired leases apart, as what they are: `  waiting on expiry: 10 of demo-w0 (in 2.1-3.9s)`,
/// then the expired ones nobody claimed yet: `  unowned 10`. `total` is every stream of the
/// demo, whichever worker a phase is about.
pub(crate) fn status_line(items: &[LeaseItem], now: u64, total: usize, gone: Option<&str>) -> String {
    let mut per: BTreeMap<&str, usize> = BTreeMap::new();
    let mut waiting: Vec<u64> = Vec::new();
    let mut in_session = 0;
    let mut unowned = 0;
    for i in items {
        match i.holder_at(now) {
            // Held under a session: it ends with the session, not at the item's expiry.
            Some(o) if Some(o) == gone && i.expires_at_ms == Some(HELD_UNDER_SESSION_MS) => in_session += 1,
            Some(o) if Some(o) == gone => waiting.push(i.expires_at_ms.unwrap_or(now) - now),
            Some(o) => *per.entry(o).or_default() += 1,
            None => unowned += 1,
        }
    }
    let owned: usize = per.values().sum();
    let workers: Vec<String> = per.iter().map(|(w, n)| format!("{w}:{n}")).collect();
    let mut line = format!("owned {owned}/{total}  {}", workers.join(" ")).trim_end().to_string();
    if let (Some(gone), Some(first), Some(last)) = (gone, waiting.iter().min(), waiting.iter().max()) {
        let secs = |ms: &u64| *ms as f64 / 1000.0;
        line.push_str(&format!(
            "  waiting on expiry: {} of {gone} (in {:.1}-{:.1}s)",
            waiting.len(),
            secs(first),
            secs(last)
        ));
    }
    if let (Some(gone), true) = (gone, in_session > 0) {
        line.push_str(&format!("  waiting on the session of {gone}: {in_session}"));
    }
    if gone.is_some() && unowned > 0 {
        line.push_str(&format!("  unowned {unowned}"));
    }
    line
}

/// Polls the table until every id in `ids` is held by someone other than `former` (and, if
/// given, other than `also_not`), printing progress; returns each id's time to recovery.
async fn wait_recovered(
    table: &LeaseTable,
    ids: &[String],
    former: &str,
    limit: Duration,
    t0: Instant,
) -> CliResult<HashMap<String, (u64, u64)>> {
    let since = Instant::now();
    let mut recovered: HashMap<String, (u64, u64)> = HashMap::new();
    let mut last_print = Instant::now();
    while recovered.len() < ids.len() {
        if since.elapsed() > limit {
            return Err(other(format!(
                "{} of {} streams not re-owned within {limit:?}",
                ids.len() - recovered.len(),
                ids.len()
            )));
        }
        let items = table.items().await?;
        let now = SystemClock.now_ms();
        for item in items.iter().filter(|i| ids.contains(&i.id)) {
            if let Some(holder) = item.holder_at(now) {
                if holder != former && !recovered.contains_key(&item.id) {
                    recovered.insert(item.id.clone(), (since.elapsed().as_millis() as u64, now));
                }
            }
        }
        if last_print.elapsed() >= Duration::from_secs(1) {
            let status = status_line(&items, now, items.len(), Some(former));
            say(t0, format!("  {}/{} re-owned  {status}", recovered.len(), ids.len()));
            last_print = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(recovered)
}

async fn held_by(table: &LeaseTable, worker: &str) -> CliResult<Vec<String>> {
    Ok(table.owned_by(worker).await?.into_iter().map(|i| i.id).collect())
}

/// Takes out of `candidates` (indexes into the fleet) the worker holding the most streams (of
/// `language`, if given), and returns its index, name and streams: a phase aimed at a worker that
/// holds nothing measures nothing, and which worker claims what first is a race.
async fn busiest(
    table: &LeaseTable,
    fleet: &Fleet,
    candidates: &mut Vec<usize>,
    language: Option<Language>,
) -> CliResult<(usize, String, Vec<String>)> {
    let mut best: Option<(usize, String, Vec<String>)> = None;
    for &i in candidates.iter().filter(|&&i| language.is_none_or(|l| fleet.languages[i] == l)) {
        let name = fleet.children[i].0.clone();
        let held = held_by(table, &name).await?;
        if best.as_ref().is_none_or(|(_, _, most)| held.len() > most.len()) {
            best = Some((i, name, held));
        }
    }
    let best = best.ok_or_else(|| other("no worker left to test"))?;
    if best.2.is_empty() {
        return Err(other(format!("{} holds no stream: the phase aimed at it would measure nothing", best.1)));
    }
    candidates.retain(|&i| i != best.0);
    Ok(best)
}

/// Polls until `check(items, now)` holds, printing a status line each second.
async fn wait_until(
    table: &LeaseTable,
    total: usize,
    limit: Duration,
    t0: Instant,
    what: &str,
    check: impl Fn(&[LeaseItem], u64) -> bool,
) -> CliResult {
    let until = Instant::now() + limit;
    let mut last_print = Instant::now();
    loop {
        // Session items (session mode) are not streams.
        let items: Vec<LeaseItem> =
            table.items().await?.into_iter().filter(|i| table.config().session_owner(&i.id).is_none()).collect();
        let now = SystemClock.now_ms();
        if check(&items, now) {
            say(t0, format!("{what}: {}", status_line(&items, now, total, None)));
            return Ok(());
        }
        if Instant::now() >= until {
            return Err(other(format!("timed out after {limit:?} waiting for: {what}")));
        }
        if last_print.elapsed() >= Duration::from_secs(1) {
            say(t0, format!("  waiting for {what}: {}", status_line(&items, now, total, None)));
            last_print = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One (seq, writes, worker, written_at) row of the messages table.
pub(crate) type MessageRow = (u64, u64, String, u64);

/// Every row of the messages table, by stream: one consistent scan (the local engine answers a
/// query by going through the whole table, so a query per stream costs the table once each).
pub(crate) async fn messages_by_stream(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
) -> CliResult<HashMap<String, Vec<MessageRow>>> {
    let num = |v: Option<&AttributeValue>| v.and_then(|v| v.as_n().ok()).and_then(|n| n.parse().ok()).unwrap_or(0);
    let text = |v: Option<&AttributeValue>| v.and_then(|v| v.as_s().ok()).cloned().unwrap_or_default();
    let mut rows: HashMap<String, Vec<MessageRow>> = HashMap::new();
    let mut pages = client.scan().table_name(table).consistent_read(true).into_paginator().items().send();
    while let Some(item) = pages.next().await {
        let item = item.map_err(|e| other(aws_sdk_dynamodb::error::DisplayErrorContext(e)))?;
        let row =
            (num(item.get("seq")), num(item.get("writes")), text(item.get("worker")), num(item.get("written_at_ms")));
        rows.entry(text(item.get("stream"))).or_default().push(row);
    }
    Ok(rows)
}

/// What a local scenario (the demo, the balance scenario, the failover bench) runs against: the
/// lease table of `targs`, its messages table and a hint queue named after the lease table, all
/// created here.
pub(crate) struct Stage {
    pub(crate) table: LeaseTable,
    pub(crate) config: TableConfig,
    pub(crate) sqs: aws_sdk_sqs::Client,
    pub(crate) queue_url: String,
}

impl Stage {
    pub(crate) async fn create(targs: &TableArgs) -> CliResult<Stage> {
        let config: TableConfig = targs.config()?;
        let sdk = crate::ops::sdk_config().await;
        let table = LeaseTable::new(aws_sdk_dynamodb::Client::new(&sdk), config.clone())?;
        let sqs = aws_sdk_sqs::Client::new(&sdk);
        table.create_table().await?;
        crate::ops::create_messages_table(table.client(), &targs.messages_table).await?;
        let queue_url = sqs
            .create_queue()
            .queue_name(&targs.table_name)
            .send()
            .await
            .map_err(|e| other(aws_sdk_sqs::error::DisplayErrorContext(e)))?
            .queue_url()
            .ok_or_else(|| other("no queue url"))?
            .to_string();
        Ok(Stage { table, config, sqs, queue_url })
    }
}

/// The local upstream feed (`rate` messages a second per stream) on an ephemeral loopback port,
/// served until `stop` fires; `task` ends after that.
pub(crate) struct LocalFeed {
    pub(crate) addr: std::net::SocketAddr,
    pub(crate) feed: std::sync::Arc<Feed>,
    pub(crate) stop: CancellationToken,
    pub(crate) task: tokio::task::JoinHandle<()>,
}

impl LocalFeed {
    pub(crate) async fn start(rate: f64) -> CliResult<LocalFeed> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.map_err(other)?;
        let addr = listener.local_addr().map_err(other)?;
        let feed = Feed::new(rate);
        let stop = CancellationToken::new();
        let task = tokio::spawn(crate::upstream::serve(listener, feed.clone(), stop.clone()));
        Ok(LocalFeed { addr, feed, stop, task })
    }
}

pub async fn run(args: &TableArgs, d: DemoArgs) -> CliResult {
    d.check_victims()?;
    let t0 = Instant::now();
    let run_id = format!("{}", SystemClock.now_ms());
    let lease_table = format!("leaselock-demo-{run_id}");
    let messages_table = format!("{lease_table}-messages");
    let targs = TableArgs { table_name: lease_table.clone(), messages_table: messages_table.clone(), ..args.clone() };
    say(t0, format!("creating tables {lease_table}, {messages_table} and the hint queue"));
    let Stage { table, config, sqs, queue_url } = Stage::create(&targs).await?;

    let LocalFeed { addr: feed_addr, feed, stop: feed_stop, task: feed_task } = LocalFeed::start(d.rate).await?;
    say(t0, format!("upstream feed on ws://{feed_addr} ({} msg/s per stream)", d.rate));

    let logs = d.dir.join(&run_id);
    std::fs::create_dir_all(&logs).map_err(other)?;
    let launch =
        Launch::new(&d.runtimes, &targs, &config, &queue_url, d.orphan_interval_ms, d.desired_state_interval_ms)?;
    let mut fleet = Fleet { children: Vec::new(), languages: Vec::new() };
    for (i, language) in d.fleet_languages().into_iter().enumerate() {
        let name = format!("demo-w{i}-{}", language.as_str());
        let log = std::fs::File::create(logs.join(format!("{name}.log"))).map_err(other)?;
        let child = launch
            .command(language, &name)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(other)?)
            .stderr(log)
            .spawn()
            .map_err(|e| other(format!("starting the {} worker {name}: {e}", language.as_str())))?;
        say(t0, format!("started worker {name} (pid {})", child.id()));
        fleet.children.push((name, child));
        fleet.languages.push(language);
    }
    say(t0, format!("worker logs in {}", logs.display()));
    // Streams STARTed before a worker runs would all go to the quicker starters.
    wait_running(&mut fleet, &logs, Duration::from_secs(60)).await?;
    say(t0, "every worker is running");

    let ids: Vec<String> = (0..d.connections).map(|i| format!("stream-{i:02}")).collect();
    // One hint per START, each sent as its stream starts: a batch of ten would go to whichever
    // worker's long poll answers first, and a worker that claims nothing at the start has
    // nothing to lose when a failure is aimed at it.
    for id in &ids {
        table.start(id, &format!("ws://{feed_addr}/{id}")).await?;
        sqs.send_message()
            .queue_url(&queue_url)
            .message_body(Hint::new(id).to_json())
            .send()
            .await
            .map_err(|e| other(aws_sdk_sqs::error::DisplayErrorContext(e)))?;
    }
    say(t0, format!("STARTed {} streams (with SQS hints)", ids.len()));
    let n = ids.len();
    let owned = wait_until(&table, n, Duration::from_secs(60), t0, "every stream owned", |items, now| {
        items.iter().filter(|i| i.holder_at(now).is_some()).count() == n
    });
    tokio::select! {
        owned = owned => owned?,
        early = watch_exits(&mut fleet, &logs) => early?,
    }
    for _ in 0..d.settle_secs {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let items = table.items().await?;
        say(t0, status_line(&items, SystemClock.now_ms(), n, None));
    }

    let recovery_limit = config.lease_duration + config.clock_skew + Duration::from_secs(15);
    let mut report = Report {
        mode: config.mode.as_str(),
        connections: n,
        workers: d.workers,
        lease_ms: config.lease_ms(),
        clock_skew_ms: config.skew_ms(),
        languages: fleet.languages.iter().fold(Vec::new(), |mut seen, l| {
            if !seen.contains(l) {
                seen.push(*l);
            }
            seen
        }),
        ..Report::default()
    };

    // Each phase picks, among the workers not yet used, the one holding the most streams.
    let mut candidates: Vec<usize> = (0..fleet.children.len()).collect();
    let mut victims = d.victims.iter().copied();
    fleet.exited_early(&logs, &candidates)?;

    // 1. Crash: SIGKILL, no release; the leases must expire and be claimed by others.
    let (victim_i, victim, victim_ids) = busiest(&table, &fleet, &mut candidates, victims.next()).await?;
    report.killed = Some(fleet.languages[victim_i]);
    say(t0, format!("kill -9 {victim} (holding {} streams)", victim_ids.len()));
    fleet.signal(victim_i, libc::SIGKILL)?;
    let crash = wait_recovered(&table, &victim_ids, &victim, recovery_limit, t0).await?;
    report.crash_failover_max_ms = crash.values().map(|(ms, _)| *ms).max().unwrap_or(0);
    say(t0, format!("crash failover: max {} ms over {} streams", report.crash_failover_max_ms, crash.len()));

    let mut frozen_i = None;
    // 2. Optionally a zombie: frozen past its deadline, its streams taken over, then thawed.
    if d.zombie {
        fleet.exited_early(&logs, &candidates)?;
        let (zombie_i, zombie, zombie_ids) = busiest(&table, &fleet, &mut candidates, victims.next()).await?;
        report.frozen = Some(fleet.languages[zombie_i]);
        frozen_i = Some(zombie_i);
        say(t0, format!("SIGSTOP {zombie} (holding {} streams)", zombie_ids.len()));
        fleet.signal(zombie_i, libc::SIGSTOP)?;
        let taken = wait_recovered(&table, &zombie_ids, &zombie, recovery_limit, t0).await?;
        report.zombie_failover_max_ms = Some(taken.values().map(|(ms, _)| *ms).max().unwrap_or(0));
        say(t0, format!("SIGCONT {zombie}: it must stop, and every write it tries must be refused"));
        fleet.signal(zombie_i, libc::SIGCONT)?;
        wait_until(&table, n, Duration::from_secs(10), t0, "the thawed worker holds nothing it lost", |items, now| {
            items.iter().all(|i| !(zombie_ids.contains(&i.id) && i.holder_at(now) == Some(zombie.as_str())))
        })
        .await?;
        // Give the thawed process time to try: a renewal, a checkpoint, a message write.
        tokio::time::sleep(config.renew_interval).await;
        let mut accepted = 0;
        let rows = messages_by_stream(table.client(), &messages_table).await?;
        for id in &zombie_ids {
            let taken_at = taken[id].1;
            accepted +=
                rows.get(id).into_iter().flatten().filter(|(_, _, w, at)| *w == zombie && *at > taken_at).count()
                    as u64;
        }
        report.zombie_writes_accepted = Some(accepted);
        say(t0, format!("writes by the thawed worker after takeover that landed: {accepted}"));
    }

    // 3. Graceful: SIGTERM; the leases are released and claimed at once, and the process exits
    // (timed while the hand-over is watched, so a slow table read does not count as a slow exit).
    // The thawed worker runs on too (holding nothing it lost): it must not have died either.
    let alive: Vec<usize> = candidates.iter().copied().chain(frozen_i).collect();
    fleet.exited_early(&logs, &alive)?;
    let (leaving_i, leaving, leaving_ids) = busiest(&table, &fleet, &mut candidates, victims.next()).await?;
    report.terminated = Some(fleet.languages[leaving_i]);
    say(t0, format!("SIGTERM {leaving} (holding {} streams)", leaving_ids.len()));
    fleet.signal(leaving_i, libc::SIGTERM)?;
    let signalled = Instant::now();
    let exited = async {
        let status = fleet.wait_exit(leaving_i, Duration::from_secs(30)).await?;
        Ok::<_, Failure>((status, signalled.elapsed()))
    };
    let (graceful, exited) = tokio::join!(wait_recovered(&table, &leaving_ids, &leaving, recovery_limit, t0), exited);
    let (graceful, (status, exit_after)) = (graceful?, exited?);
    report.graceful_handover_max_ms = graceful.values().map(|(ms, _)| *ms).max().unwrap_or(0);
    report.sigterm_exit_ms = exit_after.as_millis() as u64;
    say(
        t0,
        format!(
            "graceful hand-over: max {} ms; {leaving} exited with {status} {} ms after SIGTERM",
            report.graceful_handover_max_ms, report.sigterm_exit_ms
        ),
    );
    wait_until(&table, n, Duration::from_secs(30), t0, "every stream owned again", |items, now| {
        items.iter().filter(|i| i.holder_at(now).is_some()).count() == n
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;

    // 4. STOP everything; owners let go within a desired-state interval (or at their next renewal).
    for id in &ids {
        table.stop(id).await?;
    }
    say(t0, "STOPped every stream");
    let stop_limit = Duration::from_millis(d.desired_state_interval_ms) + config.lease_duration;
    wait_until(&table, n, stop_limit, t0, "every lease released", |items, now| {
        items.iter().all(|i| i.holder_at(now).is_none() && i.desired_state == Some(DesiredState::Stopped))
    })
    .await?;
    // Every worker but the killed one ends by SIGTERM, with exit status 0.
    let mut unclean = Vec::new();
    if !status.success() {
        unclean.push(format!("{leaving} exited with {status} after SIGTERM"));
    }
    for i in (0..fleet.children.len()).filter(|&i| i != victim_i && i != leaving_i) {
        let name = fleet.children[i].0.clone();
        if let Some(status) = fleet.children[i].1.try_wait().map_err(other)? {
            unclean.push(format!("{name} exited on its own with {status}"));
            continue;
        }
        fleet.signal(i, libc::SIGTERM)?;
        let status = fleet.wait_exit(i, Duration::from_secs(30)).await?;
        if !status.success() {
            unclean.push(format!("{name} exited with {status} after SIGTERM"));
        }
    }
    report.unclean_exits = unclean.len() as u64;
    feed_stop.cancel();
    let _ = feed_task.await;

    // 5. Every stream's messages must be contiguous from 1.
    let messages = messages_by_stream(table.client(), &messages_table).await?;
    for id in &ids {
        let rows = messages.get(id).map(Vec::as_slice).unwrap_or_default();
        let max = rows.iter().map(|r| r.0).max().unwrap_or(0);
        report.gaps += max - rows.len() as u64;
        report.duplicates += rows.iter().map(|r| r.1.saturating_sub(1)).sum::<u64>();
        report.messages += rows.len() as u64;
        let item = table.get(id).await?.unwrap_or_default();
        if item.last_seq.unwrap_or(0) > max {
            report.gaps += item.last_seq.unwrap_or(0) - max;
        }
    }
    let stats = feed.stats();
    report.double_owner = stats.double_owner;
    report.max_subscribers_per_stream = stats.max_subscribers_per_stream;

    let crash_bound = config.lease_ms() + config.skew_ms() + 3_000;
    let mut failures = Vec::new();
    if report.gaps > 0 {
        failures.push(format!("{} missing messages", report.gaps));
    }
    if report.double_owner > 0 {
        failures.push(format!("{} double-owner moments", report.double_owner));
    }
    if report.crash_failover_max_ms > crash_bound {
        failures.push(format!("crash failover {} ms > {crash_bound} ms", report.crash_failover_max_ms));
    }
    if report.graceful_handover_max_ms > 2_000 {
        failures.push(format!("graceful hand-over {} ms > 2000 ms", report.graceful_handover_max_ms));
    }
    failures.extend(unclean);
    if report.zombie_writes_accepted.unwrap_or(0) > 0 {
        failures.push("a frozen worker wrote after losing its lease".into());
    }
    say(
        t0,
        format!(
            "{} messages written, {} duplicate deliveries, {} gaps",
            report.messages, report.duplicates, report.gaps
        ),
    );
    for f in &failures {
        say(t0, format!("FAILED: {f}"));
    }
    report.demo = if failures.is_empty() { "ok" } else { "failed" };
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

    fn held(id: &str, owner: &str, expires_at_ms: u64) -> LeaseItem {
        LeaseItem { id: id.into(), owner: Some(owner.into()), expires_at_ms: Some(expires_at_ms), ..Default::default() }
    }

    fn demo_args(cli: &[&str]) -> DemoArgs {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            demo: DemoArgs,
        }
        let argv = std::iter::once("demo").chain(cli.iter().copied());
        <Cli as clap::Parser>::try_parse_from(argv).expect("demo arguments parse").demo
    }

    #[test]
    fn workers_cycle_through_the_languages_and_victims_must_exist() {
        use Language::*;
        assert_eq!(demo_args(&[]).fleet_languages(), [Rust, Python, Node]);
        assert_eq!(demo_args(&["--workers", "5"]).fleet_languages(), [Rust, Python, Node, Rust, Python]);
        assert_eq!(demo_args(&["--languages", "node", "--workers", "3"]).fleet_languages(), [Node, Node, Node]);
        assert!(demo_args(&["--zombie", "--victims", "node,rust,python"]).check_victims().is_ok());
        // Without --zombie there are two failures: a third victim has no phase.
        assert!(demo_args(&["--victims", "node,rust,python"]).check_victims().is_err());
        // One Python worker cannot be hit twice.
        assert!(demo_args(&["--zombie", "--victims", "python,python"]).check_victims().is_err());
        assert!(demo_args(&["--workers", "4", "--zombie", "--victims", "rust,rust"]).check_victims().is_ok());
        let json = serde_json::to_string(&[Rust, Python, Node]).unwrap();
        assert_eq!(json, r#"["rust","python","node"]"#);
    }

    #[test]
    fn the_progress_line_counts_a_dead_workers_leases_as_waiting_not_owned() {
        let now = 1_000_000;
        let mut items: Vec<LeaseItem> = (0..10).map(|i| held(&format!("a{i}"), "w0", now + 2_000 + i * 100)).collect();
        items.extend((0..10).map(|i| held(&format!("b{i}"), "w1", now + 15_000)));
        items.extend((0..9).map(|i| held(&format!("c{i}"), "w2", now + 15_000)));
        items.push(held("d0", "w2", now - 1));
        let line = status_line(&items, now, items.len(), Some("w0"));
        assert_eq!(line, "owned 19/30  w1:10 w2:9  waiting on expiry: 10 of w0 (in 2.0-2.9s)  unowned 1");
        // Without a gone worker every unexpired lease counts, out of every stream.
        assert_eq!(status_line(&items, now, 30, None), "owned 29/30  w0:10 w1:10 w2:9");
        // Once the gone worker's leases expired they are unowned until someone claims them.
        assert_eq!(status_line(&items, now + 3_000, 30, Some("w0")), "owned 19/30  w1:10 w2:9  unowned 11");
        assert_eq!(status_line(&[], now, 30, None), "owned 0/30");
        // Session mode: a gone worker's items wait on its session, not on their sentinel expiry.
        let in_session: Vec<LeaseItem> = (0..3).map(|i| held(&format!("s{i}"), "w0", HELD_UNDER_SESSION_MS)).collect();
        assert_eq!(status_line(&in_session, now, 3, Some("w0")), "owned 0/3  waiting on the session of w0: 3");
    }
}
