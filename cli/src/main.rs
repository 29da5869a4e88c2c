//! `leaselock`: operate a lease table, run the reference worker, the local upstream feed and
//! the local demo.

mod balance;
mod clock;
mod demo;
mod failover;
mod leader;
mod ops;
mod refworker;
mod sweep;
mod upstream;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use leaselock::{DesiredState, TableConfig};

/// Leases and exactly-one ownership of long-lived work on DynamoDB.
///
/// Every command reads the table settings from flags or the environment. The AWS SDK's usual
/// configuration applies (AWS_REGION, credentials, AWS_ENDPOINT_URL for a local engine).
#[derive(Parser, Debug)]
#[command(name = "leaselock", version, propagate_version = true)]
struct Cli {
    #[command(flatten)]
    table: TableArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Args, Debug, Clone)]
pub struct TableArgs {
    /// Lease table name.
    #[arg(long = "table", env = "LEASELOCK_TABLE", default_value = "leases", global = true)]
    pub table_name: String,
    /// Name of the sparse orphan index (desired_state, lease_expires_at_ms).
    #[arg(long, env = "LEASELOCK_INDEX_NAME", default_value = leaselock::config::DEFAULT_INDEX_NAME, global = true)]
    pub index_name: String,
    /// Name of session mode's owner index (lease_owner, keys only).
    #[arg(
        long,
        env = "LEASELOCK_OWNER_INDEX_NAME",
        default_value = leaselock::config::DEFAULT_OWNER_INDEX_NAME,
        global = true
    )]
    pub owner_index_name: String,
    /// Prefix of every key this application writes.
    #[arg(long, env = "LEASELOCK_KEY_PREFIX", default_value = "", global = true)]
    pub key_prefix: String,
    /// Lease duration, ms.
    #[arg(long, env = "LEASELOCK_LEASE_MS", default_value_t = 20_000, global = true)]
    pub lease_ms: u64,
    /// Renew interval, ms.
    #[arg(long, env = "LEASELOCK_RENEW_MS", default_value_t = 5_000, global = true)]
    pub renew_ms: u64,
    /// Largest clock difference tolerated between workers, ms.
    // `--skew-ms`, the older spelling, is still accepted (hidden from --help).
    #[arg(
        long = "clock-skew-ms",
        alias = "skew-ms",
        value_name = "CLOCK_SKEW_MS",
        env = "LEASELOCK_CLOCK_SKEW_MS",
        default_value_t = 1_000,
        global = true
    )]
    pub skew_ms: u64,
    /// Retry budget of a command that holds no lease (start, stop, get, listings, table create), ms.
    #[arg(long, env = "LEASELOCK_OPERATION_BUDGET_MS", default_value_t = 10_000, global = true)]
    pub operation_budget_ms: u64,
    /// Lease mode: `per-item` (every held item renewed) or `session` (one heartbeat per worker).
    #[arg(long, env = "LEASELOCK_MODE", default_value = "per-item", global = true, value_parser = parse_mode)]
    pub mode: leaselock::LeaseMode,
    /// Orphan-index partition values running work is spread over (`STARTED#0..N-1`; 1, the
    /// default, is the reference schema's single `STARTED`). Every writer of the table must use
    /// the same count.
    #[arg(long, env = "LEASELOCK_ORPHAN_SHARDS", default_value_t = 1, global = true)]
    pub orphan_shards: u32,
    /// Accept a global table in multi-Region eventual consistency, where writes in two Regions
    /// resolve last-writer-wins (refused by default: leases on it are not exclusive across
    /// Regions). Only safe when every writer of the table writes in one Region.
    #[arg(long, env = leaselock::config::ALLOW_EVENTUAL_GLOBAL_TABLE_ENV, global = true, value_parser = parse_flag,
        num_args = 0..=1, default_missing_value = "1", value_name = "ON")]
    pub allow_eventual_global_table: Option<bool>,
    /// Table the reference worker writes messages to (created by `table create`).
    #[arg(long, env = "LEASELOCK_MESSAGES_TABLE", default_value = "leaselock-messages", global = true)]
    pub messages_table: String,
}

impl TableArgs {
    pub fn config(&self) -> leaselock::Result<TableConfig> {
        TableConfig::new(&self.table_name)
            .index_name(&self.index_name)
            .owner_index_name(&self.owner_index_name)
            .key_prefix(&self.key_prefix)
            .lease_duration(Duration::from_millis(self.lease_ms))
            .renew_interval(Duration::from_millis(self.renew_ms))
            .clock_skew(Duration::from_millis(self.skew_ms))
            .operation_budget(Duration::from_millis(self.operation_budget_ms))
            .mode(self.mode)
            .orphan_shards(self.orphan_shards)
            .allow_eventual_global_table(self.allow_eventual_global_table.unwrap_or(false))
            .validated()
    }
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create or describe the lease table.
    #[command(subcommand)]
    Table(TableCommand),
    /// Mark work as STARTED (idempotent; an owner keeps its lease).
    Start {
        /// The work's id (connection_id).
        id: String,
        /// Where a worker connects: ws:// or wss://.
        #[arg(long)]
        url: String,
        /// Also send a hint to this SQS queue so a worker claims it at once.
        #[arg(long, env = "LEASELOCK_QUEUE_URL")]
        queue_url: Option<String>,
    },
    /// Mark work as STOPPED; its owner lets go within one desired-state interval.
    Stop {
        /// The work's id (connection_id).
        id: String,
    },
    /// List lease items as a table.
    Ls(ops::LsArgs),
    /// Per-worker counts, orphans and leases expiring soon.
    Status {
        /// Refresh until interrupted.
        #[arg(long)]
        watch: bool,
        /// Refresh interval with --watch, ms.
        #[arg(long, default_value_t = 1_000)]
        interval_ms: u64,
    },
    /// This host's clock against the store's, measured from a dozen answers (exit 1 when
    /// off by more than half the clock skew).
    Clock(clock::ClockArgs),
    /// Session mode: find stranded work (held under a session that is gone, of another epoch or
    /// dead beyond the grace) with a consistent read of the whole table, and hint it.
    Sweep(sweep::SweepArgs),
    /// Run the reference worker: own leased streams, write every message with a fenced write.
    Worker(refworker::WorkerArgs),
    /// Run a local WebSocket feed: one sequenced stream per path, resumable with ?from=SEQ.
    Upstream(upstream::UpstreamArgs),
    /// Run the local demo: a fleet of workers, a crash and a graceful hand-over.
    Demo(demo::DemoArgs),
    /// Run the local balance scenario (session mode): workers started one after another each
    /// get their fair share by graceful hand-overs.
    BalanceDemo(balance::BalanceArgs),
    /// Run a command only on the elected process (exit 75 when skipped).
    RunIfLeader(leader::RunIfLeaderArgs),
    /// Failover distributions over forced failures of worker processes (make bench).
    #[command(hide = true)]
    BenchFailover(failover::FailoverArgs),
}

#[derive(Subcommand, Debug)]
enum TableCommand {
    /// Create the lease table (sparse orphan index, TTL) and the messages table; idempotent.
    Create,
    /// Show the lease table's status, key schema and indexes.
    Describe,
}

/// What the process exits with: 2 for bad input (refused before any request, nothing written),
/// 1 when the store (or the queue) failed or refused the operation.
pub enum Failure {
    Usage(String),
    Other(String),
}

impl From<leaselock::Error> for Failure {
    fn from(e: leaselock::Error) -> Self {
        use leaselock::Error as E;
        // Every variant decides its exit code here: a new one cannot fall through unnoticed.
        match e {
            E::InvalidInput { .. } => Failure::Usage(e.to_string()),
            E::Held { .. }
            | E::Lost { .. }
            | E::NotFound { .. }
            | E::Stopped { .. }
            | E::SeqNotIncreasing { .. }
            | E::Throttled
            | E::Timeout { .. }
            | E::Unreachable(_)
            | E::AccessDenied(_)
            | E::NotConfigured(_)
            | E::TableNotFound { .. }
            | E::Script(_)
            | E::Store(_) => Failure::Other(e.to_string()),
        }
    }
}

pub type CliResult<T = ()> = Result<T, Failure>;

pub fn other(e: impl std::fmt::Display) -> Failure {
    Failure::Other(e.to_string())
}

/// The SDK's own logs appear only when asked for (`LEASELOCK_LOG=debug`).
const QUIET_SDK: &str = "aws_config=off,aws_runtime=off,aws_smithy_runtime=off,aws_smithy_http_client=off,\
                         aws_sdk_dynamodb=off,aws_sdk_sqs=off,aws_sdk_sts=off,hyper=off";

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Without LEASELOCK_LOG: the long-running commands log our warnings; an operator command's
    // outcome is the one line it prints, so the retries behind it are not shown.
    let level = match cli.command {
        Command::Worker(_)
        | Command::Upstream(_)
        | Command::Demo(_)
        | Command::BalanceDemo(_)
        | Command::RunIfLeader(_)
        | Command::BenchFailover(_) => "warn",
        Command::Table(_)
        | Command::Start { .. }
        | Command::Stop { .. }
        | Command::Ls(_)
        | Command::Status { .. }
        | Command::Clock(_)
        | Command::Sweep(_) => "error",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("LEASELOCK_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(format!("{level},{QUIET_SDK}")));
    // Colours only on a terminal: a log file holds plain lines (the failover bench reads them).
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr).init();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        // One line each: anything that could break it is escaped.
        Err(Failure::Usage(msg)) => {
            eprintln!("error: {}", leaselock::render::one_line(&msg));
            ExitCode::from(2)
        }
        Err(Failure::Other(msg)) => {
            eprintln!("error: {}", leaselock::render::one_line(&msg));
            ExitCode::from(1)
        }
    }
}

async fn run(cli: Cli) -> CliResult {
    let args = cli.table;
    match cli.command {
        Command::Table(TableCommand::Create) => ops::table_create(&args).await,
        Command::Table(TableCommand::Describe) => ops::table_describe(&args).await,
        Command::Start { id, url, queue_url } => ops::start(&args, &id, &url, queue_url.as_deref()).await,
        Command::Stop { id } => ops::stop(&args, &id).await,
        Command::Ls(ls) => ops::ls(&args, &ls).await,
        Command::Status { watch, interval_ms } => ops::status(&args, watch, Duration::from_millis(interval_ms)).await,
        Command::Clock(c) => clock::run(&args, &c).await,
        Command::Sweep(s) => sweep::run(&args, &s).await,
        Command::Worker(w) => refworker::run(&args, w).await,
        Command::Upstream(u) => upstream::run(u).await,
        Command::Demo(d) => demo::run(&args, d).await,
        Command::BalanceDemo(b) => balance::run(&args, b).await,
        Command::RunIfLeader(r) => leader::run(&args, r).await,
        Command::BenchFailover(f) => failover::run(&args, f).await,
    }
}

/// An on/off value (`1`, `true`, `yes`, `on`, `0`, `false`, `no`, `off`); the bare flag is on.
fn parse_flag(s: &str) -> Result<bool, String> {
    leaselock::config::parse_flag(s).ok_or_else(|| format!("{s:?} is not 1/0, true/false, yes/no or on/off"))
}

/// A lease mode as every binding parses it (core's `LeaseMode::parse`: `per-item`, `item`, the
/// older spelling, or `session`).
fn parse_mode(s: &str) -> Result<leaselock::LeaseMode, String> {
    leaselock::LeaseMode::parse_option("mode", s).map_err(|e| e.to_string())
}

/// Parses a desired state given on the command line.
pub fn parse_state(s: &str) -> Result<DesiredState, String> {
    DesiredState::parse(&s.to_ascii_uppercase()).ok_or_else(|| format!("{s:?} is not STARTED or STOPPED"))
}
