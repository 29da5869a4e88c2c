//! A worker whose wall clock is off (a real `leaselock worker` process under libfaketime, its
//! monotonic clock untouched) among two peers on the true clock, 2 s and 5 s behind and ahead,
//! each worker frozen (SIGSTOP) past the renew interval in turn. Leases run on the store's
//! clock, measured from DynamoDB's answers, so:
//!
//! - no lease changes hands while every worker lives (none lost to the shifted worker's peers
//!   nor taken by it), and no worker counts a lost lease;
//! - the shifted worker reports its offset to the store within 100 ms of the truth;
//! - it still claims and holds its share;
//! - no message row is stamped backwards along its stream, the shifted worker's stamps are on
//!   the store's clock, and no stream stalls.
//!
//! 12 streams, lease 3 s, renew 1 s, skew 500 ms (the fleet test's timing); at most 5 streams a
//! worker, so that each has room to take work it should not. `scripts/faketime.sh` installs
//! libfaketime when missing.

#[path = "../../core/tests/local_engine/mod.rs"]
mod local_engine;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::AttributeValue;
use leaselock::{Clock, LeaseStore, LeaseTable, SystemClock, TableConfig};

const STREAMS: usize = 12;
const MAX_PER_WORKER: usize = 5;
const LEASE_MS: u64 = 3_000;
const RENEW_MS: u64 = 1_000;
const SKEW_MS: u64 = 500;
/// Past the renew interval, within what a lease allows after its last renewal was sent
/// (lease − skew − renew).
const FREEZE: Duration = Duration::from_millis(1_300);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}-{:06x}", std::process::id(), rand::random::<u32>() & 0xff_ffff)
}

/// A child process killed with the test.
struct Proc {
    name: String,
    child: Child,
}

impl Proc {
    fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on a child this test started and has not reaped.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, signal) }, 0, "signal {signal} to {}", self.name);
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// libfaketime's library, installed by the project's script when missing.
fn faketime() -> String {
    let out = Command::new(repo().join("scripts/faketime.sh")).output().expect("run scripts/faketime.sh");
    assert!(out.status.success(), "scripts/faketime.sh: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// What one run saw.
#[derive(Debug)]
struct Outcome {
    shift_ms: i64,
    /// The shifted worker's last reported offset and uncertainty (its metrics lines).
    offset_ms: i64,
    uncertainty_ms: i64,
    /// Leases that changed hands after every stream was held, as (id, from, to).
    changed_hands: Vec<(String, String, String)>,
    /// LeasesLost over every worker's metrics lines.
    leases_lost: u64,
    /// Streams the shifted worker held at the end, and those held by anyone.
    shifted_held: usize,
    held: usize,
    /// Message rows stamped earlier than the row before them in their stream.
    stamped_backwards: usize,
    /// Newest stamp of the shifted worker's rows less the newest of its peers'.
    shifted_stamps_behind_ms: i64,
    /// Streams with no row in the last 2 s of the run.
    stalled: Vec<String>,
    rows: usize,
}

struct Run {
    table: LeaseTable,
    messages: String,
    workers: Vec<Proc>,
    logs: PathBuf,
    _upstream: Proc,
}

fn worker_command(table: &str, messages: &str, name: &str, logs: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_leaselock"));
    cmd.args(["--table", table, "--messages-table", messages])
        .args(["--lease-ms", &LEASE_MS.to_string(), "--renew-ms", &RENEW_MS.to_string()])
        .args(["--clock-skew-ms", &SKEW_MS.to_string()])
        .args(["worker", "--worker-id", name, "--max-connections", &MAX_PER_WORKER.to_string()])
        .args(["--metrics-interval-ms", "1000", "--orphan-interval-ms", "1000", "--desired-state-interval-ms", "1000"])
        .env("LEASELOCK_LOG", "info")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(logs.join(format!("{name}.metrics"))).unwrap())
        .stderr(std::fs::File::create(logs.join(format!("{name}.log"))).unwrap());
    cmd
}

/// A run with the shifted worker's clock off by `shift_ms`; `local_clock`: its leases on its own
/// clock (`--local-clock`), the control.
async fn start(shift_ms: i64, local_clock: bool, faketime: &str) -> Run {
    let control = if local_clock { "-local" } else { "" };
    let logs = repo().join("target/clock-logs").join(format!("shift{shift_ms:+}{control}"));
    std::fs::create_dir_all(&logs).unwrap();
    let (table_name, messages) = (unique("clk"), unique("clk-msg"));
    let created = Command::new(env!("CARGO_BIN_EXE_leaselock"))
        .args(["--table", &table_name, "--messages-table", &messages, "table", "create"])
        .output()
        .unwrap();
    assert!(created.status.success(), "table create: {}", String::from_utf8_lossy(&created.stderr));
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let upstream = Command::new(env!("CARGO_BIN_EXE_leaselock"))
        .args(["upstream", "--listen", &format!("127.0.0.1:{port}"), "--rate", "4"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(logs.join("upstream.log")).unwrap())
        .spawn()
        .unwrap();
    let upstream = Proc { name: "upstream".into(), child: upstream };
    let ms = Duration::from_millis;
    let config =
        TableConfig::new(&table_name).lease_duration(ms(LEASE_MS)).renew_interval(ms(RENEW_MS)).clock_skew(ms(SKEW_MS));
    let table = LeaseTable::connect(config).await.unwrap();
    for i in 0..STREAMS {
        table.start(&format!("s{i:02}"), &format!("ws://127.0.0.1:{port}/s{i:02}")).await.unwrap();
    }
    let mut workers = Vec::new();
    for name in ["shifted", "peer-a", "peer-b"] {
        let mut cmd = worker_command(&table_name, &messages, name, &logs);
        if name == "shifted" {
            let secs = format!("{:+}", shift_ms as f64 / 1000.0);
            cmd.env("LD_PRELOAD", faketime).env("FAKETIME", secs).env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
            if local_clock {
                cmd.arg("--local-clock");
            }
        }
        workers.push(Proc { name: name.into(), child: cmd.spawn().unwrap() });
    }
    Run { table, messages, workers, logs, _upstream: upstream }
}

/// Each stream's (owner, fence), as held now on the true clock (unheld streams left out).
async fn holders(table: &LeaseTable) -> BTreeMap<String, (String, u64)> {
    let now = SystemClock.now_ms();
    let items = table.items().await.unwrap();
    items.into_iter().filter_map(|i| Some((i.id.clone(), (i.holder_at(now)?.to_string(), i.fence)))).collect()
}

/// Every EMF line a worker wrote.
fn metrics(logs: &Path, name: &str) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(logs.join(format!("{name}.metrics"))).unwrap_or_default();
    text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

async fn scenario(shift_ms: i64, local_clock: bool, faketime: &str) -> Outcome {
    let mut run = start(shift_ms, local_clock, faketime).await;
    let since = Instant::now();
    // Every stream held (on the true clock), or 30 s (the control may never get there).
    while holders(&run.table).await.len() < STREAMS && since.elapsed() < Duration::from_secs(30) {
        for w in &mut run.workers {
            assert!(w.child.try_wait().unwrap().is_none(), "{} exited: see {}", w.name, run.logs.display());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut baseline = holders(&run.table).await;
    for i in 0..STREAMS {
        baseline.entry(format!("s{i:02}")).or_insert_with(|| ("nobody".to_string(), 0));
    }
    // Freeze each worker past the renew interval in turn, twice, watching who holds what.
    let mut changed: HashMap<String, (String, String)> = HashMap::new();
    for round in 0..4 {
        let frozen = &run.workers[round % run.workers.len()];
        frozen.signal(libc::SIGSTOP);
        let thaw = Instant::now() + FREEZE;
        let until = thaw + Duration::from_millis(2_500);
        let mut thawed = false;
        while Instant::now() < until {
            if !thawed && Instant::now() >= thaw {
                frozen.signal(libc::SIGCONT);
                thawed = true;
            }
            for (id, (owner, fence)) in holders(&run.table).await {
                let (was, at) = &baseline[&id];
                if fence != *at || owner != *was {
                    changed.entry(id).or_insert((was.clone(), owner));
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let end = holders(&run.table).await;
    let end_ms = SystemClock.now_ms() as i64;
    for w in &run.workers {
        w.signal(libc::SIGTERM);
    }
    for w in &mut run.workers {
        let _ = w.child.wait();
    }
    // What the workers reported.
    let shifted = metrics(&run.logs, "shifted");
    let last = shifted.iter().rev().find(|l| l.get("ClockOffsetMs").is_some()).expect("a line with ClockOffsetMs");
    let leases_lost = ["shifted", "peer-a", "peer-b"]
        .iter()
        .flat_map(|w| metrics(&run.logs, w))
        .filter_map(|l| l.get("LeasesLost").and_then(|v| v.as_u64()))
        .sum();
    // The message rows.
    let client = run.table.client();
    let mut rows: BTreeMap<String, Vec<(u64, i64, String)>> = BTreeMap::new();
    let mut pages = client.scan().table_name(&run.messages).consistent_read(true).into_paginator().send();
    let text = |v: Option<&AttributeValue>| v.and_then(|v| v.as_s().ok()).cloned().unwrap_or_default();
    let num = |v: Option<&AttributeValue>| v.and_then(|v| v.as_n().ok()).and_then(|n| n.parse::<i64>().ok());
    while let Some(page) = pages.next().await {
        for item in page.unwrap().items() {
            let (seq, at) = (num(item.get("seq")).unwrap() as u64, num(item.get("written_at_ms")).unwrap());
            rows.entry(text(item.get("stream"))).or_default().push((seq, at, text(item.get("worker"))));
        }
    }
    let mut stamped_backwards = 0;
    let mut newest: HashMap<bool, i64> = HashMap::new();
    let mut stalled = Vec::new();
    for (stream, list) in &mut rows {
        list.sort();
        stamped_backwards += list.windows(2).filter(|w| w[1].1 < w[0].1).count();
        for (_, at, worker) in list.iter() {
            let e = newest.entry(worker == "shifted").or_insert(i64::MIN);
            *e = (*e).max(*at);
        }
        if list.last().is_none_or(|(_, at, _)| *at < end_ms - 2_000) {
            stalled.push(stream.clone());
        }
    }
    Outcome {
        shift_ms,
        offset_ms: last["ClockOffsetMs"].as_i64().unwrap(),
        uncertainty_ms: last["ClockUncertaintyMs"].as_i64().unwrap(),
        changed_hands: changed.into_iter().map(|(id, (from, to))| (id, from, to)).collect(),
        leases_lost,
        shifted_held: end.values().filter(|(o, _)| o == "shifted").count(),
        held: end.len(),
        stamped_backwards,
        shifted_stamps_behind_ms: newest.get(&false).copied().unwrap_or(0) - newest.get(&true).copied().unwrap_or(0),
        stalled,
        rows: rows.values().map(Vec::len).sum(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_with_its_clock_off_by_2_and_5_s_either_way_keeps_exclusion_and_measures_the_offset() {
    if local_engine::endpoint(module_path!()).is_none() {
        return;
    }
    let faketime = faketime();
    let shifts: Vec<i64> = match std::env::var("CLOCK_TEST_SHIFTS_MS") {
        Ok(list) => list.split(',').map(|s| s.trim().parse().unwrap()).collect(),
        Err(_) => vec![-5_000, -2_000, 2_000, 5_000],
    };
    let mut failures = Vec::new();
    // The control first: the same run with the shifted worker's leases on its own clock must
    // fail these checks (it did before the store's clock was measured).
    if std::env::var_os("CLOCK_TEST_SHIFTS_MS").is_none() {
        let o = scenario(-5_000, true, &faketime).await;
        let failed = failed_checks(&o);
        println!("control, shift -5000 ms on the local clock: {o:?}\n  fails: {failed:?}");
        for must in ["no worker lost a lease", "the shifted worker stamps on the store's clock"] {
            assert!(failed.contains(&must), "the control run must fail {must:?}: {o:?}");
        }
    }
    for shift in shifts {
        let o = scenario(shift, false, &faketime).await;
        let error = (o.offset_ms + o.shift_ms).abs();
        println!(
            "shift {:+} ms: reported offset {:+} ms ± {} (error {error} ms); held {}/{STREAMS}, {} by the shifted worker; \
             changed hands {:?}; leases lost {}; rows {}, stamped backwards {}, shifted stamps behind by {} ms; stalled {:?}",
            o.shift_ms,
            o.offset_ms,
            o.uncertainty_ms,
            o.held,
            o.shifted_held,
            o.changed_hands,
            o.leases_lost,
            o.rows,
            o.stamped_backwards,
            o.shifted_stamps_behind_ms,
            o.stalled
        );
        for what in failed_checks(&o) {
            failures.push(format!("shift {shift:+} ms: {what}"));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The checks `o` fails.
fn failed_checks(o: &Outcome) -> Vec<&'static str> {
    // The local engine runs on the true clock: the store's offset to the shifted one is −shift.
    let error = (o.offset_ms + o.shift_ms).abs();
    let checks = [
        // The estimate is an interval: the truth within it (its half-width is the uncertainty,
        // a round trip's half on a loaded host), or within 100 ms; and the interval itself narrow.
        ("the offset within its uncertainty (or 100 ms) of the truth", error <= (o.uncertainty_ms + 1).max(100)),
        ("the offset known within 500 ms", o.uncertainty_ms <= 500),
        ("no lease changed hands while every worker lived", o.changed_hands.is_empty()),
        ("no worker lost a lease", o.leases_lost == 0),
        ("every stream held at the end", o.held == STREAMS),
        ("the shifted worker holds its share", o.shifted_held >= STREAMS - 2 * MAX_PER_WORKER),
        ("no row stamped backwards", o.stamped_backwards == 0),
        ("the shifted worker stamps on the store's clock", o.shifted_stamps_behind_ms.abs() <= 1_000),
        ("no stalled stream", o.stalled.is_empty()),
    ];
    checks.into_iter().filter(|(_, ok)| !ok).map(|(what, _)| what).collect()
}
