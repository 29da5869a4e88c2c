//! `leaselock run-if-leader` as cron would run it on every host: real processes, real signals,
//! against the local Redis and the local engine.

#[path = "../../core/tests/local_engine/mod.rs"]
mod local_engine;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

static NEXT: AtomicU32 = AtomicU32::new(0);

fn unique(label: &str) -> String {
    let ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis();
    format!("{label}-{}-{}-{ms}", std::process::id(), NEXT.fetch_add(1, Ordering::SeqCst))
}

/// A scratch directory, removed when the test passes (kept for a look when it fails).
struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn scratch(label: &str) -> Scratch {
    let dir = std::env::temp_dir().join(unique(&format!("leaselock-cli-{label}")));
    std::fs::create_dir_all(&dir).unwrap();
    Scratch(dir)
}

fn redis_url() -> Option<String> {
    local_engine::redis(module_path!())
}

/// `leaselock --lease-ms .. run-if-leader NAME [extra] -- sh -c SCRIPT`, on Redis or DynamoDB.
fn run_if_leader(backend: &Backend, name: &str, lease_ms: u64, extra: &[&str], script: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_leaselock"));
    let renew = (lease_ms / 4).to_string();
    let skew = (lease_ms / 6).to_string();
    cmd.args([
        "--lease-ms",
        &lease_ms.to_string(),
        "--renew-ms",
        &renew,
        "--clock-skew-ms",
        &skew,
        "--key-prefix",
        &backend.prefix,
    ]);
    match &backend.table {
        Some(table) => {
            cmd.env_remove("LEASELOCK_REDIS_URL").args(["--table", table]);
        }
        None => {
            cmd.env("LEASELOCK_REDIS_URL", backend.url.as_deref().unwrap());
        }
    }
    cmd.args(["run-if-leader", name]).args(extra).args(["--", "sh", "-c", script]);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd
}

struct Backend {
    url: Option<String>,
    table: Option<String>,
    prefix: String,
}

fn redis() -> Option<Backend> {
    let backend = Backend { url: Some(redis_url()?), table: None, prefix: unique("p") + "/" };
    // A prefix's first use holds claims off for one lease + skew, as after a loss of the
    // server's state: one run that waits it out (with the longest lease the tests use).
    let out = run_if_leader(&backend, "open", 3_000, &["--wait-ms", "10000"], "true").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    Some(backend)
}

fn dynamodb() -> Option<Backend> {
    local_engine::endpoint(module_path!())?;
    let table = unique("rif");
    let out = Command::new(env!("CARGO_BIN_EXE_leaselock"))
        .env_remove("LEASELOCK_REDIS_URL")
        .args(["--table", &table, "--messages-table", &format!("{table}-m"), "table", "create"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    Some(Backend { url: None, table: Some(table), prefix: String::new() })
}

fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let until = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < until, "{what} within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path).unwrap_or_default().lines().map(str::to_string).collect()
}

fn alive(pid: i32) -> bool {
    // A zombie waiting for its new parent to reap it no longer runs.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('Z')),
        Err(_) => false,
    }
}

fn three_at_once_run_once(backend: Backend) {
    let dir = scratch("once");
    let log = dir.join("ran");
    let script = format!("echo \"$LEASELOCK_FENCE\" >> {}; sleep 1", log.display());
    let children: Vec<Child> =
        (0..3).map(|_| run_if_leader(&backend, "nightly", 3_000, &[], &script).spawn().unwrap()).collect();
    let outputs: Vec<Output> = children.into_iter().map(|c| c.wait_with_output().unwrap()).collect();
    let mut codes: Vec<i32> = outputs.iter().map(|o| o.status.code().unwrap()).collect();
    codes.sort();
    assert_eq!(
        codes,
        [0, 75, 75],
        "one ran, two were skipped: {:?}",
        outputs.iter().map(|o| String::from_utf8_lossy(&o.stderr).to_string()).collect::<Vec<_>>()
    );
    let ran = lines(&log);
    assert_eq!(ran.len(), 1, "the command ran once: {ran:?}");
    if backend.url.is_none() {
        assert_eq!(ran, ["1"], "with fence 1");
    } else {
        // Redis fences are the server's clock in microseconds (2020 or later).
        assert!(ran[0].parse::<u64>().unwrap() > 1_577_836_800_000_000, "{ran:?}");
    }
    let skipped = outputs.iter().find(|o| o.status.code() == Some(75)).unwrap();
    assert!(String::from_utf8_lossy(&skipped.stderr).contains("skipped: nightly is led by"));
}

#[test]
fn help_names_the_options_and_the_exit_codes() {
    let out = Command::new(env!("CARGO_BIN_EXE_leaselock")).args(["run-if-leader", "--help"]).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for must in ["--slots", "--wait-ms", "--min-lease-ms", "--grace-ms", "--redis", "LEASELOCK_FENCE", "75", "143"] {
        assert!(text.contains(must), "help mentions {must}:\n{text}");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_leaselock")).args(["run-if-leader", "x"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "a command is required");
}

/// `leaselock run-if-leader args`, with `env` on top of this environment.
fn run_if_leader_cli(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_leaselock"));
    cmd.arg("run-if-leader").args(args).env_remove("LEASELOCK_RETRY_DELAY_MS").env_remove("LEASELOCK_RETRY_MS");
    cmd.envs(env.iter().copied()).output().unwrap()
}

#[test]
fn the_retry_delay_flag_is_named_as_the_option_is_and_reads_its_older_spellings() {
    let help = String::from_utf8_lossy(&run_if_leader_cli(&["--help"], &[]).stdout).into_owned();
    assert!(help.contains("--retry-delay-ms <RETRY_DELAY_MS>"), "{help}");
    assert!(help.contains("[env: LEASELOCK_RETRY_DELAY_MS=]") && help.contains("[default: 200]"), "{help}");
    assert!(
        !help.contains("--retry-ms") && !help.contains("LEASELOCK_RETRY_MS"),
        "the older spellings are not shown: {help}"
    );
    // The older variable sets the default; the new one, when set, wins over it.
    let help =
        String::from_utf8_lossy(&run_if_leader_cli(&["--help"], &[("LEASELOCK_RETRY_MS", "700")]).stdout).into_owned();
    assert!(help.contains("[default: 700]"), "{help}");
    let both = [("LEASELOCK_RETRY_MS", "700"), ("LEASELOCK_RETRY_DELAY_MS", "900")];
    let help = String::from_utf8_lossy(&run_if_leader_cli(&["--help"], &both).stdout).into_owned();
    assert!(help.contains("[env: LEASELOCK_RETRY_DELAY_MS=900]"), "{help}");
    // Every spelling is read: a value that is not a number is refused before anything runs,
    // under the flag's name, whichever spelling gave it.
    let refused = |flags: &[&str], env: &[(&str, &str)]| {
        let args: Vec<&str> = flags.iter().copied().chain(["nightly", "--", "true"]).collect();
        let out = run_if_leader_cli(&args, env);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(2), "{flags:?} {env:?}: {err}");
        assert!(err.contains("'soon' for '--retry-delay-ms <RETRY_DELAY_MS>'"), "{flags:?} {env:?}: {err}");
    };
    refused(&["--retry-delay-ms", "soon"], &[]);
    refused(&["--retry-ms", "soon"], &[]);
    refused(&[], &[("LEASELOCK_RETRY_DELAY_MS", "soon")]);
    refused(&[], &[("LEASELOCK_RETRY_MS", "soon")]);
}

#[test]
fn three_concurrent_invocations_run_the_command_once_on_redis() {
    let Some(backend) = redis() else { return };
    three_at_once_run_once(backend);
}

#[test]
fn three_concurrent_invocations_run_the_command_once_on_dynamodb() {
    let Some(backend) = dynamodb() else { return };
    three_at_once_run_once(backend);
}

#[test]
fn slots_run_the_command_on_at_most_n_hosts() {
    let Some(backend) = redis() else { return };
    let dir = scratch("slots");
    let log = dir.join("ran");
    let script = format!("echo \"$LEASELOCK_SLOT\" >> {}; sleep 1", log.display());
    let children: Vec<Child> =
        (0..5).map(|_| run_if_leader(&backend, "pool", 3_000, &["--slots", "2"], &script).spawn().unwrap()).collect();
    let mut codes: Vec<i32> =
        children.into_iter().map(|c| c.wait_with_output().unwrap().status.code().unwrap()).collect();
    codes.sort();
    assert_eq!(codes, [0, 0, 75, 75, 75]);
    let mut slots = lines(&log);
    slots.sort();
    assert_eq!(slots, ["0", "1"]);
}

/// Takes the lease over behind the runner's back, as a takeover after a partition would.
#[test]
fn a_command_that_cannot_run_claims_nothing() {
    let Some(backend) = redis() else { return };
    let url = backend.url.clone().unwrap();
    let port = url.rsplit(':').next().unwrap().trim_end_matches('/').to_string();
    let dir = scratch("norun");
    let not_executable = dir.join("data.txt");
    std::fs::write(&not_executable, "echo hi\n").unwrap();
    let missing = dir.join("nonexistent").join("cmd");
    for (name, program) in [
        ("missing", missing.to_str().unwrap()),
        ("not-executable", not_executable.to_str().unwrap()),
        ("not-on-path", "leaselock-no-such-command-xyz"),
    ] {
        let cmd = run_if_leader(&backend, name, 3_000, &[], "true");
        // Replace `sh -c true` with the program that cannot run.
        let args: Vec<String> = cmd.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        let at = args.iter().position(|a| a == "--").unwrap();
        let mut cmd2 = Command::new(env!("CARGO_BIN_EXE_leaselock"));
        cmd2.args(&args[..=at]).arg(program).env("LEASELOCK_REDIS_URL", &url);
        for (k, v) in cmd.get_envs() {
            match v {
                Some(v) => cmd2.env(k, v),
                None => cmd2.env_remove(k),
            };
        }
        let out = cmd2.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {stderr}");
        assert!(stderr.contains("cannot run") && stderr.contains("nothing was claimed"), "{name}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{name}: one line: {stderr}");
        // No claim was made: the leader key's fence counter was never created.
        for key in [
            format!("leaselock:{}leader/{name}", backend.prefix),
            format!("leaselock:{}leader/{name}:fence", backend.prefix),
        ] {
            let exists = Command::new("redis-cli").args(["-p", &port, "EXISTS", &key]).output().unwrap();
            assert_eq!(String::from_utf8_lossy(&exists.stdout).trim(), "0", "{name}: {key} was written");
        }
    }
}

fn steal(url: &str, prefix: &str, name: &str) {
    let port = url.rsplit(':').next().unwrap().trim_end_matches('/');
    let key = format!("leaselock:{prefix}leader/{name}");
    let out = Command::new("redis-cli").args(["-p", port, "SET", &key, "thief|999", "PX", "60000"]).output().unwrap();
    assert!(out.status.success());
}

#[test]
fn a_command_that_outlives_the_lease_is_signalled() {
    let Some(backend) = redis() else { return };
    let dir = scratch("outlive");
    let log = dir.join("log");
    let script = format!(
        "trap 'echo term >> {0}; exit 7' TERM; echo started >> {0}; while true; do sleep 0.05; done",
        log.display()
    );
    let child = run_if_leader(&backend, "long", 1_200, &[], &script).spawn().unwrap();
    wait_until("the command started", Duration::from_secs(10), || lines(&log) == ["started"]);
    steal(backend.url.as_deref().unwrap(), &backend.prefix, "long");
    let stolen = Instant::now();
    let out = child.wait_with_output().unwrap();
    // Seen at the next renewal (a quarter of the lease), then SIGTERM.
    assert!(stolen.elapsed() < Duration::from_millis(1_200), "{:?}", stolen.elapsed());
    assert_eq!(out.status.code(), Some(7), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(lines(&log), ["started", "term"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("the lease ended"));
}

#[test]
fn a_command_ignoring_sigterm_is_killed_after_the_grace() {
    let Some(backend) = redis() else { return };
    let dir = scratch("grace");
    let log = dir.join("log");
    let script = format!("trap '' TERM; echo started >> {}; sleep 30", log.display());
    let child = run_if_leader(&backend, "stubborn", 1_200, &["--grace-ms", "300"], &script).spawn().unwrap();
    wait_until("the command started", Duration::from_secs(10), || lines(&log) == ["started"]);
    steal(backend.url.as_deref().unwrap(), &backend.prefix, "stubborn");
    let stolen = Instant::now();
    let out = child.wait_with_output().unwrap();
    assert!(stolen.elapsed() < Duration::from_millis(1_500), "{:?}", stolen.elapsed());
    assert_eq!(out.status.code(), Some(128 + 9), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn sigkill_of_run_if_leader_does_not_leave_the_command_running() {
    let Some(backend) = redis() else { return };
    let dir = scratch("orphan");
    let pidfile = dir.join("pid");
    let script = format!("echo $$ > {}; exec sleep 30", pidfile.display());
    let mut runner = run_if_leader(&backend, "orphan", 3_000, &[], &script).spawn().unwrap();
    wait_until("the command started", Duration::from_secs(10), || lines(&pidfile).len() == 1);
    let pid: i32 = lines(&pidfile)[0].parse().unwrap();
    assert!(alive(pid));
    runner.kill().unwrap();
    let killed = Instant::now();
    runner.wait().unwrap();
    // Well within the lease (3 s) it ran under, so never alongside the next leader.
    wait_until("the command ended", Duration::from_millis(1_500), || !alive(pid));
    eprintln!("the command ended {:?} after run-if-leader was killed", killed.elapsed());
}
