//! The CLI against bad input and missing resources: every argument is checked before the first
//! request (exit 2, one line, nothing written), a missing table or queue is named in one line
//! with what to do (exit 1), and listings print ids from the table escaped.

#[path = "../../core/tests/local_engine/mod.rs"]
mod local_engine;

use std::collections::HashMap;
use std::process::{Command, Output};

use aws_sdk_dynamodb::types::AttributeValue;

fn leaselock(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_leaselock"));
    cmd.args(args).env_remove("LEASELOCK_LOG").env_remove("LEASELOCK_QUEUE_URL");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run leaselock")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Exactly one line on stderr, starting with `error:`, with no raw control character.
fn one_line(o: &Output) -> String {
    let err = stderr(o);
    assert_eq!(err.lines().count(), 1, "one line expected:\n{err}");
    assert!(err.starts_with("error: "), "{err}");
    let line = err.trim_end_matches('\n');
    assert!(!line.chars().any(leaselock::config::is_refused_char), "escaped: {line:?}");
    line.to_string()
}

const HOSTILE_IDS: &[&str] = &[
    "s1\0",
    "s1\r\n2026-01-01 INFO forged",
    "s1\u{7f}",
    "\u{1b}[2J\u{1b}[Hs1",
    "\u{1b}]0;pwned\u{7}",
    "\u{9b}31m",
    "s1\u{202e}gpj.exe",
    "s\u{200b}1",
    "\u{feff}s1",
];

/// Bad arguments of every class: (args, the field the error must name, a phrase it must hold).
fn bad_arguments(queue: &str) -> Vec<(Vec<String>, &'static str, &'static str)> {
    let chars = "control and invisible format characters";
    let s = |v: &[&str]| v.iter().map(|a| a.to_string()).collect::<Vec<_>>();
    let mut cases = Vec::new();
    for id in HOSTILE_IDS {
        // NUL cannot be passed in argv; the router tests cover it.
        if id.contains('\0') {
            continue;
        }
        cases.push((s(&["start", id, "--url", "wss://a.example/", "--queue-url", queue]), "id", chars));
        cases.push((s(&["stop", id]), "id", chars));
        cases.push((s(&["ls", "--owner", id]), "owner", chars));
    }
    let long_url = format!("wss://a.example/{}", "x".repeat(5000));
    let long_no_host = format!("https://{}", "\u{1b}".repeat(5000));
    cases.extend([
        (s(&["start", &"x".repeat(1025), "--url", "wss://a.example/"]), "id", "too long"),
        (s(&["start", "s1", "--url", &long_url]), "url", "too long"),
        (s(&["start", "s1", "--url", &long_no_host]), "url", "too long"),
        (s(&["start", "s1", "--url", "wss://a.example/\u{1b}[2J"]), "url", "U+001B"),
        (s(&["start", "s1", "--url", "wss://a.example/\r\nx"]), "url", "U+000D"),
        (s(&["start", "s1", "--url", "wss://a.example/", "--queue-url", "hints"]), "queue_url", "must look like"),
        (
            s(&["start", "s1", "--url", "wss://a.example/", "--queue-url", "https://sqs.example/hints"]),
            "queue_url",
            "must look like",
        ),
        (
            s(&["start", "s1", "--url", "wss://a.example/", "--queue-url", "http://127.0.0.1:4566/123456789012/a b"]),
            "queue_url",
            "must look like",
        ),
        (s(&["--table", "bad table", "start", "s1", "--url", "wss://a.example/"]), "table_name", "only a-z"),
        (s(&["--table", "ab", "stop", "s1"]), "table_name", "3 to 255"),
        (s(&["--table", &"t".repeat(256), "ls"]), "table_name", "3 to 255"),
        (s(&["--index-name", "bad/index", "ls"]), "index_name", "only a-z"),
        (s(&["--key-prefix", "app\u{1b}/", "ls"]), "key_prefix", chars),
        (s(&["--messages-table", "bad messages", "table", "create"]), "messages_table", "only a-z"),
        (s(&["--messages-table", "m", "table", "create"]), "messages_table", "3 to 255"),
        (s(&["--orphan-shards", "0", "start", "s1", "--url", "wss://a.example/"]), "orphan_shards", "1 to 256"),
        (s(&["--orphan-shards", "257", "stop", "s1"]), "orphan_shards", "1 to 256"),
    ]);
    cases
}

fn check_refused(args: &[String], field: &str, says: &str, env: &[(&str, &str)]) {
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = leaselock(&refs, env);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
    let line = one_line(&out);
    assert!(line.starts_with(&format!("error: invalid {field}: ")), "{args:?}: {line}");
    assert!(line.contains(says), "{args:?}: {line} should say {says:?}");
    assert!(line.len() < 1024, "{args:?}: a {}-byte error", line.len());
    assert!(!line.contains(r"\\u{"), "{args:?}: escaped twice: {line}");
}

#[test]
fn bad_arguments_exit_2_in_one_line_before_any_request() {
    // An endpoint nothing listens on: a request sent before the checks would fail otherwise.
    let env = [
        ("AWS_ENDPOINT_URL", "http://127.0.0.1:9"),
        ("AWS_REGION", "us-east-1"),
        ("AWS_ACCESS_KEY_ID", "x"),
        ("AWS_SECRET_ACCESS_KEY", "x"),
    ];
    let cases = bad_arguments("http://127.0.0.1:4566/123456789012/hints");
    assert!(cases.len() >= 35, "{} cases", cases.len());
    for (args, field, says) in &cases {
        check_refused(args, field, says, &env);
    }
    // The unreachable endpoint is what a good command meets: exit 1, one line, no SDK dump.
    let out = leaselock(&["stop", "s1"], &env);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    one_line(&out);
}

#[test]
fn the_clock_skew_flag_and_the_mode_are_read_as_every_surface_reads_them() {
    let env = [
        ("AWS_ENDPOINT_URL", "http://127.0.0.1:9"),
        ("AWS_REGION", "us-east-1"),
        ("AWS_ACCESS_KEY_ID", "x"),
        ("AWS_SECRET_ACCESS_KEY", "x"),
    ];
    // A skew of more than half the lease is refused before any request, whichever spelling set it.
    for flag in ["--clock-skew-ms", "--skew-ms"] {
        let args = [flag, "600", "--lease-ms", "1000", "--renew-ms", "200", "stop", "s1"].map(String::from);
        check_refused(&args, "lease_duration", "2 x clock_skew (600ms)", &env);
    }
    // The mode is parsed by core's LeaseMode::parse, as in every binding: `item` (the older
    // spelling) is taken, a misspelt mode refused before any request.
    let out = leaselock(&["--mode", "item", "stop", "s1"], &env);
    assert_eq!(out.status.code(), Some(1), "reached the (unreachable) endpoint: {}", stderr(&out));
    let out = leaselock(&["--mode", "sessions", "stop", "s1"], &env);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains(r#""sessions" is not a lease mode ("per-item" or "session")"#), "{}", stderr(&out));
    let help = stdout(&leaselock(&["--help"], &[]));
    assert!(help.contains("--clock-skew-ms <CLOCK_SKEW_MS>"), "{help}");
    assert!(!help.contains("skew-ms,") && !help.contains("--skew-ms"), "the older spelling is not shown: {help}");
}

/// `leaselock args` with no AWS setting but `env`: no profile files, no instance metadata.
fn without_aws_setup(args: &[&str], env: &[(&str, &str)], home: &std::path::Path) -> (Output, std::time::Duration) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_leaselock"));
    cmd.args(args).env_clear().env("HOME", home).env("AWS_EC2_METADATA_DISABLED", "true");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let started = std::time::Instant::now();
    let out = cmd.output().expect("run leaselock");
    (out, started.elapsed())
}

#[test]
fn missing_credentials_or_region_are_named_at_once() {
    let home = std::env::temp_dir().join(format!("leaselock-no-aws-{}", std::process::id()));
    std::fs::create_dir_all(&home).unwrap();
    let keys = [("AWS_ACCESS_KEY_ID", "x"), ("AWS_SECRET_ACCESS_KEY", "x")];
    let endpoint = ("AWS_ENDPOINT_URL", "http://127.0.0.1:9");
    let cases: [(Vec<(&str, &str)>, &str); 3] = [
        (
            vec![("AWS_REGION", "us-east-1"), endpoint],
            "error: AWS SDK not configured: no credentials (set AWS_ACCESS_KEY_ID",
        ),
        (vec![keys[0], keys[1], endpoint], "error: AWS SDK not configured: no region (set AWS_REGION"),
        (vec![keys[0], keys[1]], "error: AWS SDK not configured: no region (set AWS_REGION"),
    ];
    for (env, says) in &cases {
        for args in [&["stop", "s1"][..], &["start", "s1", "--url", "wss://feed.example/s1"], &["ls"]] {
            let (out, took) = without_aws_setup(args, env, &home);
            assert_eq!(out.status.code(), Some(1), "{args:?} {env:?}: {}", stderr(&out));
            let line = one_line(&out);
            assert!(line.starts_with(says), "{args:?} {env:?}: {line}");
            // Nothing to wait for: the SDK finds what is missing before sending anything.
            assert!(took < std::time::Duration::from_secs(3), "{args:?} {env:?}: {took:?}");
        }
    }
    std::fs::remove_dir_all(&home).unwrap();
}

// ---------------------------------------------------------------------------------------------
// Against the local engine

fn engine() -> Option<tokio::runtime::Runtime> {
    local_engine::endpoint(module_path!())?;
    Some(tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap())
}

fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    format!("{prefix}-{}-{nanos}", std::process::id())
}

struct Aws {
    rt: tokio::runtime::Runtime,
    dynamodb: aws_sdk_dynamodb::Client,
    sqs: aws_sdk_sqs::Client,
}

impl Aws {
    fn new(rt: tokio::runtime::Runtime) -> Self {
        let sdk = rt.block_on(aws_config::load_defaults(aws_config::BehaviorVersion::latest()));
        Aws { dynamodb: aws_sdk_dynamodb::Client::new(&sdk), sqs: aws_sdk_sqs::Client::new(&sdk), rt }
    }

    /// Every item of `table` (a full scan), or `None` when the table does not exist.
    fn scan(&self, table: &str) -> Option<Vec<HashMap<String, AttributeValue>>> {
        match self.rt.block_on(self.dynamodb.scan().table_name(table).consistent_read(true).send()) {
            Ok(out) => Some(out.items().to_vec()),
            Err(e) if e.as_service_error().is_some_and(|e| e.is_resource_not_found_exception()) => None,
            Err(e) => panic!("scan {table}: {e:?}"),
        }
    }

    fn queue(&self) -> String {
        let out = self.rt.block_on(self.sqs.create_queue().queue_name(unique("cli-hints")).send()).unwrap();
        out.queue_url().unwrap().to_string()
    }

    /// One receive (long poll of `wait` seconds): the bodies waiting.
    fn receive(&self, queue_url: &str, wait: i32) -> Vec<String> {
        let out = self
            .rt
            .block_on(
                self.sqs
                    .receive_message()
                    .queue_url(queue_url)
                    .max_number_of_messages(10)
                    .wait_time_seconds(wait)
                    .send(),
            )
            .unwrap();
        out.messages().iter().map(|m| m.body().unwrap_or_default().to_string()).collect()
    }

    fn put(&self, table: &str, item: HashMap<String, AttributeValue>) {
        self.rt.block_on(self.dynamodb.put_item().table_name(table).set_item(Some(item)).send()).unwrap();
    }
}

#[test]
fn bad_arguments_write_nothing_and_hint_nothing() {
    let Some(rt) = engine() else { return };
    let aws = Aws::new(rt);
    let table = unique("cli-bad");
    let messages = unique("cli-bad-msgs");
    let queue = aws.queue();
    let t = ["--table", table.as_str(), "--messages-table", messages.as_str()];
    assert!(leaselock(&[&t[..], &["table", "create"]].concat(), &[]).status.success());

    for (args, field, says) in bad_arguments(&queue) {
        // Cases that set table options themselves start with them; the others run on our table.
        let args: Vec<String> =
            if args[0].starts_with("--") { args } else { t.iter().map(|a| a.to_string()).chain(args).collect() };
        check_refused(&args, field, says, &[]);
    }
    assert_eq!(aws.scan(&table), Some(vec![]), "a full scan finds nothing");
    assert_eq!(aws.receive(&queue, 1), Vec::<String>::new(), "no hint was sent");

    // `table create` checks the messages table's name before creating the lease table.
    let fresh = unique("cli-never");
    let out = leaselock(&["--table", &fresh, "--messages-table", "no good", "table", "create"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(one_line(&out).contains("messages_table"));
    assert_eq!(aws.scan(&fresh), None, "the lease table was not created");

    // The same arguments, good, do write and hint: the checks above could have seen it.
    let good =
        leaselock(&[&t[..], &["start", "s1", "--url", "wss://a.example/1", "--queue-url", &queue]].concat(), &[]);
    assert!(good.status.success(), "{}", stderr(&good));
    assert_eq!(aws.scan(&table).unwrap().len(), 1);
    assert_eq!(aws.receive(&queue, 5), vec![r#"{"connection_id":"s1"}"#.to_string()]);
}

#[test]
fn a_missing_table_is_named_with_what_to_run() {
    let Some(rt) = engine() else { return };
    let aws = Aws::new(rt);
    let table = unique("cli-missing");
    for args in [
        vec!["stop", "s1"],
        vec!["start", "s1", "--url", "wss://a.example/"],
        vec!["ls"],
        vec!["ls", "--orphans"],
        vec!["status"],
        vec!["table", "describe"],
    ] {
        let out = leaselock(&[&["--table", table.as_str()][..], &args].concat(), &[]);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        let line = one_line(&out);
        assert_eq!(line, format!("error: table {table} does not exist (run `leaselock table create`)"), "{args:?}");
    }
    assert_eq!(aws.scan(&table), None, "nothing created it");
}

#[test]
fn a_missing_queue_is_named_and_nothing_is_written() {
    let Some(rt) = engine() else { return };
    let aws = Aws::new(rt);
    let table = unique("cli-noqueue");
    let t = ["--table", table.as_str(), "--messages-table", "cli-noqueue-messages"];
    assert!(leaselock(&[&t[..], &["table", "create"]].concat(), &[]).status.success());
    let queue = "http://127.0.0.1:4566/123456789012/cli-no-such-queue";
    let start = [&t[..], &["start", "s1", "--url", "wss://a.example/1", "--queue-url", queue]].concat();
    let out = leaselock(&start, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let line = one_line(&out);
    assert!(line.contains(queue) && line.contains("does not exist") && line.contains("--queue-url"), "{line}");
    assert!(line.contains("nothing was written"), "{line}");
    assert_eq!(aws.scan(&table), Some(vec![]), "the STARTED item was not written");
    // The environment variable is the same flag.
    let out = leaselock(
        &[&t[..], &["start", "s1", "--url", "wss://a.example/1"]].concat(),
        &[("LEASELOCK_QUEUE_URL", queue)],
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(aws.scan(&table), Some(vec![]));

    // The SDK's own account of the failure appears only when asked for.
    let debug = leaselock(&start, &[("LEASELOCK_LOG", "debug")]);
    assert_eq!(debug.status.code(), Some(1));
    assert!(stderr(&debug).lines().count() > 1, "debug output expected:\n{}", stderr(&debug));
}

#[test]
fn listings_print_bad_ids_already_in_a_table_escaped() {
    let Some(rt) = engine() else { return };
    let aws = Aws::new(rt);
    let table = unique("cli-escape");
    let t = ["--table", table.as_str(), "--messages-table", "cli-escape-messages"];
    assert!(leaselock(&[&t[..], &["table", "create"]].concat(), &[]).status.success());
    // Written by some other tool, bypassing the id rule.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let evil_id = "s1\u{1b}[2J\r\nforged 0 item(s)";
    let evil_owner = "w\u{1b}]0;pwned\u{7}";
    aws.put(
        &table,
        HashMap::from([
            ("connection_id".to_string(), AttributeValue::S(evil_id.into())),
            ("desired_state".to_string(), AttributeValue::S("STARTED".into())),
            ("lease_owner".to_string(), AttributeValue::S(evil_owner.into())),
            ("lease_expires_at_ms".to_string(), AttributeValue::N((now + 600_000).to_string())),
            ("fence".to_string(), AttributeValue::N("1".into())),
        ]),
    );
    for args in [vec!["ls"], vec!["status"]] {
        let out = leaselock(&[&t[..], &args].concat(), &[]);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        let text = stdout(&out);
        assert!(
            !text.chars().any(|c| c != '\n' && leaselock::config::is_refused_char(c)),
            "{args:?} printed raw control characters: {text:?}"
        );
        assert!(text.contains(r"w\u{1b}]0;pwned\u{7}"), "{args:?}: {text}");
        if args == ["ls"] {
            assert!(text.contains(r"s1\u{1b}[2J\r\nforged 0 item(s)"), "{text}");
            assert_eq!(text.lines().count(), 3, "header, one row, count: {text}");
        }
    }
    // JSON lines stay faithful data (JSON escapes control characters itself).
    let json = stdout(&leaselock(&[&t[..], &["ls", "--json"]].concat(), &[]));
    let value: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    assert_eq!(value["id"], evil_id);
}

#[test]
fn a_hint_that_fails_after_the_write_says_the_state_was_set() {
    let Some(rt) = engine() else { return };
    let aws = Aws::new(rt);
    let table = unique("cli-hintfail");
    let t = ["--table", table.as_str(), "--messages-table", "cli-hintfail-messages"];
    assert!(leaselock(&[&t[..], &["table", "create"]].concat(), &[]).status.success());
    // A FIFO queue exists (the check passes) but refuses a message without a group id.
    let fifo = aws
        .rt
        .block_on(
            aws.sqs
                .create_queue()
                .queue_name(format!("{}.fifo", unique("cli-fifo")))
                .attributes(aws_sdk_sqs::types::QueueAttributeName::FifoQueue, "true")
                .send(),
        )
        .unwrap()
        .queue_url()
        .unwrap()
        .to_string();
    let out = leaselock(&[&t[..], &["start", "s1", "--url", "wss://a.example/1", "--queue-url", &fifo]].concat(), &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let line = one_line(&out);
    assert!(line.contains("s1 is STARTED but its hint was not sent") && line.contains("orphan index"), "{line}");
    assert_eq!(aws.scan(&table).map(|items| items.len()), Some(1), "the state was set");
}
