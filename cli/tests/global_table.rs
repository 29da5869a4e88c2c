//! The commands that write check the table first: against a recorded global table in
//! multi-Region eventual consistency they refuse in one line naming the table and the opt-in
//! (exit 1), having sent nothing but DescribeTable; with the opt-in they write; `table create`
//! says what kind of table it made.

#[path = "../../core/tests/local_engine/mod.rs"]
mod local_engine;

#[path = "../../core/tests/common/recorded.rs"]
#[allow(dead_code)]
mod recorded;

use std::process::Output;

use tokio::process::Command;

async fn leaselock(endpoint: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_leaselock"));
    cmd.args(args)
        .env("AWS_ENDPOINT_URL", endpoint)
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env_remove("LEASELOCK_LOG")
        .env_remove("LEASELOCK_QUEUE_URL")
        .env_remove("LEASELOCK_REDIS_URL")
        .env_remove(leaselock::config::ALLOW_EVENTUAL_GLOBAL_TABLE_ENV);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().await.expect("run leaselock")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

const REFUSED: &str = "error: invalid table: leases is a global table in multi-Region eventual consistency \
    (replicas: us-east-1, eu-west-1), where concurrent writes in two Regions resolve last-writer-wins, so a lease on \
    it is not exclusive across Regions; use a single-Region table or a multi-Region strong consistency (MRSC) global \
    table, or, if every writer of this table writes in one Region, opt in with allow_eventual_global_table \
    (LEASELOCK_ALLOW_EVENTUAL_GLOBAL_TABLE=1)";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writing_commands_refuse_an_eventually_consistent_global_table() {
    let stopped = r#"{"Attributes":{"connection_id":{"S":"s1"},"desired_state":{"S":"STOPPED"},"fence":{"N":"0"}}}"#;
    let (endpoint, asked) = recorded::recorded(move |op, _| match op {
        "DescribeTable" => recorded::global_table("leases", None),
        "UpdateItem" => (200, stopped.to_string()),
        other => panic!("unexpected {other}"),
    })
    .await;
    for args in [
        vec!["start", "s1", "--url", "wss://feed.example/s1"],
        vec!["stop", "s1"],
        vec!["worker"],
        vec!["run-if-leader", "nightly", "--", "true"],
    ] {
        let out = leaselock(&endpoint, &[&["--table", "leases"][..], &args].concat(), &[]).await;
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        assert_eq!(stderr(&out).trim_end(), REFUSED, "{args:?}");
    }
    assert!(asked.lock().unwrap().iter().all(|op| op == "DescribeTable"), "only described: {asked:?}");

    // Opted in (the variable, or the flag): nothing is described and the write goes out.
    for (args, env) in [
        (vec!["stop", "s1"], vec![(leaselock::config::ALLOW_EVENTUAL_GLOBAL_TABLE_ENV, "1")]),
        (vec!["stop", "s1", "--allow-eventual-global-table"], vec![]),
    ] {
        asked.lock().unwrap().clear();
        let out = leaselock(&endpoint, &[&["--table", "leases"][..], &args].concat(), &env).await;
        assert!(out.status.success(), "{args:?} {env:?}: {}", stderr(&out));
        assert!(String::from_utf8_lossy(&out.stdout).starts_with("s1 STOPPED"));
        assert_eq!(*asked.lock().unwrap(), ["UpdateItem"]);
    }

    // A bad value of the variable is refused before any request.
    asked.lock().unwrap().clear();
    let out = leaselock(
        &endpoint,
        &["--table", "leases", "stop", "s1"],
        &[(leaselock::config::ALLOW_EVENTUAL_GLOBAL_TABLE_ENV, "maybe")],
    )
    .await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(asked.lock().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_create_says_what_it_made() {
    let Some(engine) = local_engine::endpoint(module_path!()) else {
        return;
    };
    let table = format!("cli-kind-{}-{:04x}", std::process::id(), rand::random::<u16>());
    let out =
        leaselock(&engine, &["--table", &table, "--messages-table", &format!("{table}-m"), "table", "create"], &[])
            .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("lease table {table} ready (index ")), "{text}");
    assert!(text.contains("): a single-Region table\n"), "{text}");
    assert!(text.contains("multi-Region strong consistency (MRSC)"), "{text}");
}
