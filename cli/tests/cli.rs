//! The `leaselock` binary as an operator uses it: help text, exit codes, one-line errors, and
//! the table commands against the local engine.

#[path = "../../core/tests/local_engine/mod.rs"]
mod local_engine;

use std::process::{Command, Output};

fn leaselock(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_leaselock")).args(args).output().expect("run leaselock")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn every_subcommand_has_complete_help() {
    let top = leaselock(&["--help"]);
    assert!(top.status.success());
    let text = stdout(&top);
    for sub in ["table", "start", "stop", "ls", "status", "worker", "upstream", "demo"] {
        assert!(text.contains(sub), "top-level help lists {sub}");
    }
    for (args, must) in [
        (vec!["table", "--help"], vec!["create", "describe"]),
        (vec!["table", "create", "--help"], vec!["--table", "LEASELOCK_TABLE"]),
        (vec!["start", "--help"], vec!["--url", "<ID>", "--queue-url"]),
        (vec!["stop", "--help"], vec!["<ID>"]),
        (vec!["ls", "--help"], vec!["--state", "--owner", "--orphans", "--json"]),
        (vec!["status", "--help"], vec!["--watch", "--interval-ms"]),
        (vec!["worker", "--help"], vec!["--worker-id", "--max-connections", "--queue-url", "--lease-ms"]),
        (vec!["upstream", "--help"], vec!["--listen", "--rate"]),
        (vec!["demo", "--help"], vec!["--connections", "--workers", "--zombie"]),
    ] {
        let out = leaselock(&args);
        assert!(out.status.success(), "{args:?}");
        let text = stdout(&out);
        for m in must {
            assert!(text.contains(m), "{args:?} help mentions {m}:\n{text}");
        }
    }
}

/// `leaselock table create` and then an example worker or a sample of the manual, all without
/// naming a table, must meet on one table.
#[test]
fn the_cli_and_the_example_workers_default_to_the_table_the_samples_use() {
    let help = stdout(&leaselock(&["table", "create", "--help"]));
    assert!(help.contains("[default: leases]"), "{help}");
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    for (file, default) in [
        ("examples/python_worker.py", r#"env("LEASELOCK_TABLE", "leases")"#),
        ("examples/node_worker.mjs", "env.LEASELOCK_TABLE ?? 'leases'"),
        ("docs/src/quick-start.md", r#"LeaseTable("leases")"#),
    ] {
        let text = std::fs::read_to_string(format!("{root}/{file}")).unwrap();
        assert!(text.contains(default), "{file} does not default to the table `leases`");
    }
}

#[test]
fn bad_flags_and_ids_exit_2_with_one_line() {
    let long = "x".repeat(1025);
    for args in [
        vec!["start", "s1"],
        vec!["start", "s1", "--url", "http://not-a-websocket"],
        vec!["start", "", "--url", "wss://a.example/"],
        vec!["start", &long, "--url", "wss://a.example/"],
        vec!["stop", ""],
        vec!["ls", "--state", "RUNNING"],
        vec!["--lease-ms", "1000", "ls"],
        vec!["demo", "--workers", "2"],
        vec!["frobnicate"],
    ] {
        let out = leaselock(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        let first = err.lines().next().unwrap_or_default();
        assert!(first.starts_with("error:"), "{args:?}: {err}");
    }
    // Our own validation errors are exactly one line and name the field.
    let out = leaselock(&["start", "s1", "--url", "http://x"]);
    assert_eq!(stderr(&out).lines().count(), 1);
    assert!(stderr(&out).contains("url"));
    let out = leaselock(&["--lease-ms", "1000", "ls"]);
    assert!(stderr(&out).contains("lease_duration"), "{}", stderr(&out));
}

/// Runs against the local engine when it is configured.
fn engine() -> bool {
    local_engine::endpoint(module_path!()).is_some()
}

#[test]
fn table_start_ls_stop_round_trip() {
    if !engine() {
        return;
    }
    let table = format!("cli-{}", std::process::id());
    let t = ["--table", table.as_str(), "--messages-table", "cli-messages"];
    let run = |args: &[&str]| leaselock(&[&t[..], args].concat());
    assert!(run(&["table", "create"]).status.success());
    assert!(run(&["table", "create"]).status.success(), "idempotent");
    let described = run(&["table", "describe"]);
    assert!(stdout(&described).contains("desired_state-lease_expires_at_ms-index"), "{}", stdout(&described));

    let bad = run(&["start", "", "--url", "wss://a.example/"]);
    assert_eq!(bad.status.code(), Some(2));
    let empty = run(&["ls"]);
    assert!(stdout(&empty).contains("0 item(s)"), "nothing written: {}", stdout(&empty));

    assert!(run(&["start", "s1", "--url", "wss://a.example/1"]).status.success());
    assert!(run(&["start", "s2", "--url", "wss://a.example/2"]).status.success());
    assert!(run(&["stop", "s2"]).status.success());
    let missing = run(&["stop", "nope"]);
    assert_eq!(missing.status.code(), Some(1), "{}", stderr(&missing));
    assert!(stderr(&missing).contains("not found"));

    let all = stdout(&run(&["ls"]));
    assert!(all.lines().next().unwrap().starts_with("ID"), "{all}");
    assert!(all.contains("2 item(s)"));
    let started = stdout(&run(&["ls", "--state", "started"]));
    assert!(started.contains("s1") && !started.contains("s2"), "{started}");
    let orphans = stdout(&run(&["ls", "--orphans", "--json"]));
    let ids: Vec<String> = orphans
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids, ["s1"], "a STARTED item nobody holds is an orphan");
    let status = stdout(&run(&["status"]));
    assert!(status.contains("1 started, 1 stopped, 0 owned, 1 orphaned"), "{status}");
}
