//! `leaselock run-if-leader NAME -- COMMAND ARGS...`: runs a command only on the elected
//! process (cron on every host, one runs). The election itself is the core's `LeaderElector`;
//! this file only starts, watches and signals the child.
//!
//! The child never outlives the lease:
//! - it runs in its own process group, and when the term ends (the lease is lost or its local
//!   deadline passes) the group gets SIGTERM, then SIGKILL after `--grace-ms`;
//! - it is started with `PR_SET_PDEATHSIG = SIGKILL`, so if run-if-leader itself is killed
//!   (even with SIGKILL, when nothing can be forwarded) the kernel kills the child at once,
//!   before the lease it ran under can run out and another host be elected.
//!   The kernel's signal reaches the command itself; a shell command should `exec` its last
//!   program so that the program is that child.

use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use leaselock::election::{ElectionBackend, ElectionOptions, LeaderElector, Outcome, Term};
use leaselock::redis::{RedisElection, RedisOptions};
use leaselock::{DynamoRegistry, LeaseTable, StoreElection};
use tokio::signal::unix::{signal, SignalKind};

use crate::{other, CliResult, Failure, TableArgs};

/// The exit status when another process is leader (or every slot is taken) for the whole wait.
pub const SKIPPED_EXIT: i32 = 75;

/// Run a command only on the elected process; it gets the fence in LEASELOCK_FENCE.
///
/// Exits with the command's status (128 + N when it was ended by signal N, e.g. 143 after
/// the SIGTERM sent when the lease is lost), 75 when another process is leader for the
/// whole wait (skipped; nothing was run), or 2 when the command cannot run (not found, not
/// executable: checked before anything is claimed).
#[derive(Args, Debug)]
#[command(after_help = "Exit status: the command's own; 128 + N when it was ended by signal N (143 after the \
SIGTERM sent when the lease ends); 75 when skipped (another process led for the whole wait; nothing ran); \
2 when the command cannot run (not found on PATH, not executable: nothing was claimed).\n\
The command gets LEASELOCK_FENCE (the claim's fencing token, strictly increasing per name), \
LEASELOCK_ELECTION and, with --slots, LEASELOCK_SLOT.")]
pub struct RunIfLeaderArgs {
    /// The election's name: one leader per name (per slot with --slots).
    pub name: String,
    /// Let up to N processes run at once (group election) instead of one.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub slots: Option<u32>,
    /// Keep trying to be elected this long before giving up as skipped, ms.
    #[arg(long, env = "LEASELOCK_WAIT_MS", default_value_t = 0)]
    pub wait_ms: u64,
    /// Keep the lease at least this long after the claim, ms, even when the command ends
    /// sooner, so a job started on every host does not run twice in one period.
    #[arg(long, env = "LEASELOCK_MIN_LEASE_MS", default_value_t = 0)]
    pub min_lease_ms: u64,
    /// Pause between claim attempts while waiting (jittered), ms: the elector's retry delay.
    // `--retry-ms` and LEASELOCK_RETRY_MS, the older spellings, are still read (hidden from --help;
    // the older variable only when LEASELOCK_RETRY_DELAY_MS is unset).
    #[arg(
        long = "retry-delay-ms",
        alias = "retry-ms",
        value_name = "RETRY_DELAY_MS",
        env = "LEASELOCK_RETRY_DELAY_MS",
        default_value = older_retry_delay_ms()
    )]
    pub retry_delay_ms: u64,
    /// After SIGTERM, how long the command has before SIGKILL, ms (default: the clock skew,
    /// so it is gone before anyone else can be elected).
    #[arg(long, env = "LEASELOCK_GRACE_MS")]
    pub grace_ms: Option<u64>,
    /// Elect on this Redis (redis://[:password@]host:port) instead of the DynamoDB table.
    #[arg(long = "redis", env = "LEASELOCK_REDIS_URL")]
    pub redis_url: Option<String>,
    /// This process's id in the election (default: host name and pid).
    #[arg(long, env = "LEASELOCK_OWNER")]
    pub owner: Option<String>,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// The retry delay's default: LEASELOCK_RETRY_MS (the variable's older name) when it is set, as
/// given (a value that is not a number is refused as --retry-delay-ms's would be), else 200.
fn older_retry_delay_ms() -> &'static str {
    match std::env::var("LEASELOCK_RETRY_MS") {
        Ok(v) => Box::leak(v.into_boxed_str()),
        Err(_) => "200",
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_else(|_| "host".into())
}

async fn backend(table: &TableArgs, args: &RunIfLeaderArgs) -> CliResult<Arc<dyn ElectionBackend>> {
    let config = table.config()?;
    Ok(match &args.redis_url {
        Some(url) => {
            let options = RedisOptions::default()
                .lease(config.lease_duration)
                .renew(config.renew_interval)
                .skew(config.clock_skew)
                .key_prefix(format!("leaselock:{}", config.key_prefix));
            Arc::new(RedisElection::connect(url, options).await?)
        }
        None => {
            let table = LeaseTable::connect(config).await?;
            crate::ops::check(&table).await?;
            let registry = DynamoRegistry::for_table(&table);
            Arc::new(StoreElection::new(table, registry))
        }
    })
}

/// The program a command would run: a path (with a `/`) as given, or the first match on `PATH`;
/// refused (bad input, nothing claimed) unless it is a file this process may execute.
fn runnable(program: &str) -> CliResult<PathBuf> {
    let shown = leaselock::render::value(program);
    let executable = |p: &Path| {
        let Ok(c) = std::ffi::CString::new(p.as_os_str().as_bytes()) else { return false };
        // SAFETY: a NUL-terminated path; access() only reads it.
        p.is_file() && unsafe { libc::access(c.as_ptr(), libc::X_OK) } == 0
    };
    if program.is_empty() {
        return Err(Failure::Usage("cannot run the command: its name is empty".into()));
    }
    if program.contains('/') {
        let path = PathBuf::from(program);
        if executable(&path) {
            return Ok(path);
        }
        let why = if path.exists() { "not an executable file" } else { "no such file" };
        return Err(Failure::Usage(format!("cannot run {shown}: {why}; nothing was claimed")));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| executable(p))
        .ok_or_else(|| Failure::Usage(format!("cannot run {shown}: not found on PATH; nothing was claimed")))
}

/// Runs the election; exits the process with the command's status or [`SKIPPED_EXIT`].
pub async fn run(table: &TableArgs, mut args: RunIfLeaderArgs) -> CliResult {
    // A command that cannot start is bad input: found out before anything is claimed.
    let program = runnable(&args.command[0])?;
    args.command[0] = program.to_string_lossy().into_owned();
    let backend = backend(table, &args).await?;
    let grace = Duration::from_millis(args.grace_ms.unwrap_or(table.skew_ms));
    let options = ElectionOptions::default()
        .wait(Duration::from_millis(args.wait_ms))
        .min_lease(Duration::from_millis(args.min_lease_ms))
        .retry_delay(Duration::from_millis(args.retry_delay_ms.max(1)));
    let owner = args.owner.clone().unwrap_or_else(|| format!("{}-{}", hostname(), std::process::id()));
    let elector = LeaderElector::new(backend, owner, options)?;
    let command = args.command.clone();
    let name = args.name.clone();
    let action = |term: Term| supervise(term, name.clone(), command, grace);
    let outcome = match args.slots {
        Some(slots) => elector.run_if_slot(&args.name, slots, action).await?,
        None => elector.run_if_leader(&args.name, action).await?,
    };
    let code = match outcome {
        Outcome::Skipped { holder } => {
            eprintln!("skipped: {} is led by {}", args.name, holder.as_deref().unwrap_or("another process"));
            SKIPPED_EXIT
        }
        Outcome::Led { value, .. } => {
            let status = value?;
            status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
        }
    };
    std::process::exit(code)
}

/// Starts the command and waits for it; ends it (SIGTERM, then SIGKILL) when the term ends or
/// when run-if-leader is asked to stop.
async fn supervise(term: Term, name: String, command: Vec<String>, grace: Duration) -> CliResult<ExitStatus> {
    let parent = std::process::id() as i32;
    let mut cmd = tokio::process::Command::new(&command[0]);
    cmd.args(&command[1..])
        .env("LEASELOCK_FENCE", term.fence().to_string())
        .env("LEASELOCK_ELECTION", &name)
        .kill_on_drop(true);
    if let Some(slot) = term.slot() {
        cmd.env("LEASELOCK_SLOT", slot.to_string());
    }
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setpgid(0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // run-if-leader died before the line above: do not run unsupervised.
            if libc::getppid() != parent {
                libc::_exit(137);
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| Failure::Usage(format!("cannot run {:?}: {e}", command[0])))?;
    let pgid = child.id().map(|p| p as i32).ok_or_else(|| other("the command exited before it could be watched"))?;
    let mut sigterm = signal(SignalKind::terminate()).map_err(other)?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(other)?;
    let why = tokio::select! {
        status = child.wait() => return status.map_err(other),
        _ = term.cancelled() => "the lease ended",
        _ = sigterm.recv() => "run-if-leader got SIGTERM",
        _ = sigint.recv() => "run-if-leader got SIGINT",
    };
    tracing::warn!(fence = term.fence(), reason = why, "stopping the command");
    eprintln!("run-if-leader: {why}; sending SIGTERM to the command");
    unsafe { libc::killpg(pgid, libc::SIGTERM) };
    tokio::select! {
        status = child.wait() => status.map_err(other),
        _ = tokio::time::sleep(grace) => {
            eprintln!("run-if-leader: the command outlived its {grace:?} grace; sending SIGKILL");
            unsafe { libc::killpg(pgid, libc::SIGKILL) };
            child.wait().await.map_err(other)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(flags: &[&str]) -> RunIfLeaderArgs {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: RunIfLeaderArgs,
        }
        let argv = ["run-if-leader"].iter().chain(flags).chain(&["nightly", "--", "true"]).copied();
        <Cli as clap::Parser>::try_parse_from(argv).expect("run-if-leader arguments parse").args
    }

    #[test]
    fn the_retry_delay_is_read_from_its_flag_and_the_older_spelling() {
        assert_eq!(parsed(&["--retry-delay-ms", "350"]).retry_delay_ms, 350);
        assert_eq!(parsed(&["--retry-ms", "450"]).retry_delay_ms, 450);
        assert_eq!(parsed(&["--retry-delay-ms=550", "--wait-ms", "1000"]).retry_delay_ms, 550);
    }
}
