//! Each function checks its table at cold start: on a recorded global table in multi-Region
//! eventual consistency the bootstrap exits at once with the refusal as its message, before it
//! asks the runtime API for an event; with the opt-in it gets past the check.

#[path = "../../core/tests/common/recorded.rs"]
#[allow(dead_code)]
mod recorded;

use std::process::Output;
use std::time::Duration;

use tokio::process::Command;

async fn cold_start(function: &str, endpoint: &str, env: &[(&str, &str)]) -> Output {
    let program = match function {
        "router" => env!("CARGO_BIN_EXE_router"),
        _ => env!("CARGO_BIN_EXE_reconciler"),
    };
    let mut cmd = Command::new(program);
    cmd.env_clear()
        .env("LEASELOCK_TABLE", "leases")
        .env("LEASELOCK_QUEUE_URL", format!("{endpoint}/000000000000/hints"))
        .env("AWS_ENDPOINT_URL", endpoint)
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        // Nothing listens here: a function that got past its start fails asking for an event.
        .env("AWS_LAMBDA_RUNTIME_API", "127.0.0.1:9")
        .env("AWS_LAMBDA_FUNCTION_NAME", function)
        .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128")
        .env("AWS_LAMBDA_FUNCTION_VERSION", "1")
        .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    tokio::time::timeout(Duration::from_secs(20), cmd.output()).await.expect("the bootstrap exits").unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_start_on_an_eventually_consistent_global_table_fails_naming_why() {
    let (endpoint, asked) = recorded::recorded(|op, _| match op {
        "DescribeTable" => recorded::global_table("leases", Some("EVENTUAL")),
        other => panic!("unexpected {other}"),
    })
    .await;
    for function in ["router", "reconciler"] {
        asked.lock().unwrap().clear();
        let out = cold_start(function, &endpoint, &[]).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{function}: {stderr}");
        assert!(
            stderr.contains(
                "cannot start: invalid table: leases is a global table in multi-Region eventual consistency \
                 (replicas: us-east-1, eu-west-1)"
            ),
            "{function}: {stderr}"
        );
        assert!(stderr.contains("LEASELOCK_ALLOW_EVENTUAL_GLOBAL_TABLE=1"), "{function}: {stderr}");
        assert_eq!(*asked.lock().unwrap(), ["DescribeTable"], "{function}");

        // Opted in: nothing is described, and the start goes on to the runtime API.
        asked.lock().unwrap().clear();
        let out = cold_start(function, &endpoint, &[("LEASELOCK_ALLOW_EVENTUAL_GLOBAL_TABLE", "1")]).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("cannot start"), "{function}: {stderr}");
        assert!(asked.lock().unwrap().is_empty(), "{function}");
    }
}
