//! An idle `leaselock worker` with a hint queue exits promptly on SIGTERM: 20 fresh processes
//! against the local engine and a real SQS queue, each SIGTERMed once.
//!
//! Every worker's SQS traffic goes through a loopback proxy (`AWS_ENDPOINT_URL_SQS`), which
//! sees when each long poll was sent and when it was answered. Half the runs signal at a random
//! moment of a long poll (it is drained, as it must be: SQS may already have handed it
//! messages); the other half right after a poll was answered by a hint, while the worker
//! handles it and no poll is in flight. Bounds: exit within the hint wait (5 s, the default)
//! plus 1 s of the signal; within 1 s of the signal when no poll was in flight, or of the
//! drained poll's answer; and no long poll sent after the worker saw the signal (one reaching
//! the proxy within 100 ms of it was sent before, and is drained). Four lanes of five runs each
//! run at once to keep the test near 30 s.

#[path = "../../core/tests/local_engine/mod.rs"]
mod local_engine;

#[path = "../../core/tests/worker_support/proxy.rs"]
#[allow(dead_code)]
mod proxy;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use leaselock::{Hint, LeaseTable, TableConfig};
use proxy::Proxy;

const HINT_WAIT: Duration = leaselock::worker::DEFAULT_HINT_WAIT;
const SLACK: Duration = Duration::from_secs(1);
const LANES: usize = 4;
const RUNS_PER_LANE: usize = 5;
const RECEIVE: &str = "AmazonSQS.ReceiveMessage";
/// A signal is delivered while the worker runs on: a long poll it sent before it saw the signal
/// can reach the proxy just after the signal was sent. One arriving this soon after counts as in
/// flight at the signal (drained like any other); one arriving later was started after it.
const SIGNAL_SEEN: Duration = Duration::from_millis(100);

/// How one run went.
#[derive(Debug)]
struct Run {
    poll_in_flight: bool,
    /// Signal to exit.
    exit: Duration,
    /// The in-flight poll's answer (or the signal, when none was in flight) to exit.
    after_last_poll: Duration,
    polls_after_signal: usize,
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}-{:06x}", std::process::id(), rand::random::<u32>() & 0xff_ffff)
}

struct Worker(Child);

impl Drop for Worker {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

async fn wait_for(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let until = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < until, "timed out after {limit:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// One fresh worker process, signalled while a poll is in flight or right after one was
/// answered by a hint.
async fn run_once(sqs: &aws_sdk_sqs::Client, table: &str, queue_url: &str, in_flight: bool) -> Run {
    let proxy = Proxy::to_engine().await;
    let child = Command::new(env!("CARGO_BIN_EXE_leaselock"))
        .args(["--table", table, "worker", "--queue-url", queue_url, "--metrics-interval-ms", "60000"])
        .env("AWS_ENDPOINT_URL_SQS", proxy.url())
        .env("LEASELOCK_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the worker");
    let mut worker = Worker(child);
    let polls = || proxy.requests_with(RECEIVE);
    wait_for(Duration::from_secs(20), "the worker's first long poll", || !polls().is_empty()).await;
    if in_flight {
        // A random moment of the poll.
        let into = HINT_WAIT.mul_f64(rand::random::<f64>() * 0.9);
        tokio::time::sleep(into).await;
    } else {
        let answered_before = polls().iter().filter(|r| r.answered().is_some()).count();
        sqs.send_message().queue_url(queue_url).message_body(Hint::new("no-such-work").to_json()).send().await.unwrap();
        wait_for(HINT_WAIT + SLACK, "the poll answered with the hint", || {
            polls().iter().filter(|r| r.answered().is_some()).count() > answered_before
        })
        .await;
    }
    // SAFETY: kill(2) on a child this test started and has not reaped.
    assert_eq!(unsafe { libc::kill(worker.0.id() as i32, libc::SIGTERM) }, 0);
    let signalled = Instant::now();
    let status = loop {
        if let Some(status) = worker.0.try_wait().unwrap() {
            break status;
        }
        assert!(signalled.elapsed() < HINT_WAIT + Duration::from_secs(15), "the worker did not exit");
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    let exited = Instant::now();
    assert!(status.success(), "worker exit status {status}");
    let polls = polls();
    let seen = signalled + SIGNAL_SEEN;
    let in_flight_then: Vec<_> =
        polls.iter().filter(|r| r.arrived < seen && r.answered().is_none_or(|a| a > signalled)).collect();
    let last_answer = in_flight_then.iter().filter_map(|r| r.answered()).max().unwrap_or(signalled).max(signalled);
    Run {
        poll_in_flight: !in_flight_then.is_empty(),
        exit: exited - signalled,
        after_last_poll: exited.saturating_duration_since(last_answer),
        polls_after_signal: polls.iter().filter(|r| r.arrived >= seen).count(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_worker_exits_promptly_on_sigterm_twenty_times() {
    if local_engine::endpoint(module_path!()).is_none() {
        return;
    }
    let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let table_name = unique("sigterm");
    LeaseTable::new(aws_sdk_dynamodb::Client::new(&sdk), TableConfig::new(&table_name))
        .unwrap()
        .create_table()
        .await
        .unwrap();
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let mut lanes = Vec::new();
    for lane in 0..LANES {
        let queue_url = sqs
            .create_queue()
            .queue_name(unique(&format!("sigterm-{lane}")))
            .send()
            .await
            .unwrap()
            .queue_url()
            .unwrap()
            .to_string();
        let (sqs, table_name) = (sqs.clone(), table_name.clone());
        lanes.push(tokio::spawn(async move {
            let mut runs = Vec::new();
            for i in 0..RUNS_PER_LANE {
                runs.push(run_once(&sqs, &table_name, &queue_url, (lane + i) % 2 == 0).await);
            }
            runs
        }));
    }
    let mut runs = Vec::new();
    for lane in lanes {
        runs.extend(lane.await.unwrap());
    }
    for run in &runs {
        eprintln!("{run:?}");
    }
    let (busy, idle): (Vec<&Run>, Vec<&Run>) = runs.iter().partition(|r| r.poll_in_flight);
    let max = |rs: &[&Run], f: fn(&Run) -> Duration| rs.iter().map(|r| f(r)).max().unwrap_or_default();
    eprintln!(
        "{} runs: poll in flight {} (exit max {:?}, after its answer max {:?}); none in flight {} (exit max {:?})",
        runs.len(),
        busy.len(),
        max(&busy, |r| r.exit),
        max(&busy, |r| r.after_last_poll),
        idle.len(),
        max(&idle, |r| r.exit),
    );
    assert_eq!(runs.len(), LANES * RUNS_PER_LANE);
    assert!(idle.len() >= 5, "the no-poll-in-flight condition was met only {} times", idle.len());
    for run in &runs {
        assert_eq!(run.polls_after_signal, 0, "a long poll started after SIGTERM: {run:?}");
        assert!(run.exit <= HINT_WAIT + SLACK, "exit later than the hint wait + {SLACK:?}: {run:?}");
        assert!(run.after_last_poll <= SLACK, "exit later than {SLACK:?} after no poll was in flight: {run:?}");
    }
}
