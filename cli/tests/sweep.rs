//! `leaselock sweep` against the local engine: the ids of work held under an ended session, an
//! older epoch, or (with no grace) a dead session are printed, then one JSON line; work of a
//! live session never is; `--queue-url` sends a stranded START hint for each.

#[path = "../../core/tests/local_engine/mod.rs"]
mod local_engine;

use std::process::Output;
use std::time::Duration;

use leaselock::{LeaseMode, LeaseStore, LeaseTable, TableConfig};
use tokio::process::Command;

const LEASE_MS: u64 = 2_000;
const RENEW_MS: u64 = 500;
const SKEW_MS: u64 = 250;

async fn leaselock(table: &str, args: &[&str]) -> Output {
    let (lease, renew, skew) = (LEASE_MS.to_string(), RENEW_MS.to_string(), SKEW_MS.to_string());
    Command::new(env!("CARGO_BIN_EXE_leaselock"))
        .args(["--table", table, "--messages-table", &format!("{table}-messages"), "--mode", "session"])
        .args(["--lease-ms", &lease, "--renew-ms", &renew, "--clock-skew-ms", &skew])
        .args(args)
        .env_remove("LEASELOCK_QUEUE_URL")
        .env_remove("LEASELOCK_SWEEP_GRACE_MS")
        .env_remove("LEASELOCK_LOG")
        .output()
        .await
        .expect("run leaselock")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// The ids printed and the JSON summary (the last line).
fn swept(o: &Output) -> (Vec<String>, serde_json::Value) {
    assert!(o.status.success(), "{}", text(o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    let mut lines: Vec<&str> = stdout.lines().collect();
    let summary = serde_json::from_str(lines.pop().expect("a summary line")).expect("the last line is JSON");
    (lines.into_iter().map(str::to_string).collect(), summary)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_prints_and_hints_the_stranded_ids() {
    if local_engine::endpoint(module_path!()).is_none() {
        return;
    }
    let name = format!("sweep-{}-{:04x}", std::process::id(), rand::random::<u16>());
    let created = leaselock(&name, &["table", "create"]).await;
    assert!(created.status.success(), "{}", text(&created));
    let config = TableConfig::new(&name)
        .mode(LeaseMode::Session)
        .lease_duration(Duration::from_millis(LEASE_MS))
        .renew_interval(Duration::from_millis(RENEW_MS))
        .clock_skew(Duration::from_millis(SKEW_MS));
    let table = LeaseTable::connect(config).await.unwrap();
    for id in ["c-dead", "c-ended", "c-old-epoch", "c-live", "c-unclaimed"] {
        table.start(id, "wss://feed.example/s").await.unwrap();
    }
    // w-dead stops renewing at once; w-ended ends its session; w-restarted opens a new epoch.
    let dead = table.create_session("w-dead", None).await.unwrap();
    table.claim_in_session("c-dead", &dead).await.unwrap();
    let ended = table.create_session("w-ended", None).await.unwrap();
    table.claim_in_session("c-ended", &ended).await.unwrap();
    table.end_session(&ended).await.unwrap();
    let restarted = table.create_session("w-restarted", None).await.unwrap();
    table.claim_in_session("c-old-epoch", &restarted).await.unwrap();
    table.create_session("w-restarted", Some(restarted.epoch)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(LEASE_MS + SKEW_MS + 300)).await;
    // w-live lives throughout: renewed in the background.
    let mut live = table.create_session("w-live", None).await.unwrap();
    table.claim_in_session("c-live", &live).await.unwrap();
    let renewer = {
        let table = table.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(RENEW_MS)).await;
                table.renew_session(&mut live).await.unwrap();
            }
        })
    };

    let (ids, summary) = swept(&leaselock(&name, &["sweep"]).await);
    assert_eq!(ids, ["c-ended", "c-old-epoch"], "w-dead died within the 60 s grace");
    assert_eq!(summary["stranded"], 2);
    assert_eq!(summary["grace_ms"], 60_000);
    assert!(summary["items_read"].as_u64().unwrap() >= 9, "5 connections, 4 sessions: {summary}");
    assert!(summary.get("hints_sent").is_none(), "no queue, no hints: {summary}");

    let (ids, summary) = swept(&leaselock(&name, &["sweep", "--grace-ms", "0"]).await);
    assert_eq!(ids, ["c-dead", "c-ended", "c-old-epoch"], "never c-live nor c-unclaimed");
    assert_eq!(summary["stranded"], 3);

    // With a queue: one START hint per stranded id.
    let sqs = aws_sdk_sqs::Client::new(&aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await);
    let queue_url = sqs.create_queue().queue_name(format!("{name}-hints")).send().await.unwrap().queue_url.unwrap();
    let (ids, summary) = swept(&leaselock(&name, &["sweep", "--grace-ms", "0", "--queue-url", &queue_url]).await);
    assert_eq!((summary["hints_sent"].as_u64(), summary["hints_failed"].as_u64()), (Some(3), Some(0)), "{summary}");
    let mut bodies = Vec::new();
    for _ in 0..5 {
        let got = sqs.receive_message().queue_url(&queue_url).max_number_of_messages(10).send().await.unwrap();
        bodies.extend(got.messages().iter().filter_map(|m| m.body()).map(|b| {
            let hint: serde_json::Value = serde_json::from_str(b).unwrap();
            assert_eq!(hint["stranded"], true, "a stranded hint: {b}");
            hint["connection_id"].as_str().unwrap().to_string()
        }));
        if bodies.len() >= ids.len() {
            break;
        }
    }
    bodies.sort();
    assert_eq!(bodies, ids, "a hint per stranded id");

    // A hint lets a live worker take the work over: the sweep no longer names it.
    let taker = table.create_session("w-taker", None).await.unwrap();
    table.claim_in_session("c-old-epoch", &taker).await.unwrap();
    let (ids, _) = swept(&leaselock(&name, &["sweep", "--grace-ms", "0"]).await);
    assert_eq!(ids, ["c-dead", "c-ended"]);

    // A queue url that is not one is refused before any request (2); a missing queue after (1).
    let bad = leaselock(&name, &["sweep", "--queue-url", "hints"]).await;
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad));
    let missing = format!("{}-missing", queue_url);
    let gone = leaselock(&name, &["sweep", "--queue-url", &missing]).await;
    assert_eq!(gone.status.code(), Some(1), "{}", text(&gone));
    assert!(text(&gone).contains("does not exist"), "{}", text(&gone));
    renewer.abort();
}

#[test]
fn sweep_help_names_its_flags_and_variables() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_leaselock")).args(["sweep", "--help"]).output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for must in ["--grace-ms", "LEASELOCK_SWEEP_GRACE_MS", "--queue-url", "LEASELOCK_QUEUE_URL", "[default: 60000]"] {
        assert!(help.contains(must), "sweep --help mentions {must}:\n{help}");
    }
}
