//! The cross-language conformance scenarios (`tests/conformance/*.json`, format in its README)
//! replayed through [`LeaseTable`] against the local engine, one test per scenario. The Python
//! and Node runners replay the same files; `CONFORMANCE_DIR` points all three at another
//! directory (`tests/conformance/broken` shows that a wrong expectation fails).
//!
//! A plain `main` (`harness = false`): libtest cannot name tests found at run time.

mod local_engine;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_dynamodb::Client;
use leaselock::{Attributes, Error, Lease, LeaseItem, LeaseMode, LeaseStore, LeaseTable, Session, TableConfig};
use serde_json::{json, Map, Value};

type Outcome<T = ()> = std::result::Result<T, String>;

struct Scenario {
    name: String,
    table: Map<String, Value>,
    steps: Vec<Value>,
}

fn scenario_dir() -> PathBuf {
    // A relative CONFORMANCE_DIR is taken from the repository's root, as in the other runners.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    match std::env::var_os("CONFORMANCE_DIR") {
        Some(dir) => root.join(dir),
        None => root.join("tests/conformance"),
    }
}

/// Every scenario of every `*.json` file in the directory (a file holds one scenario, or
/// `{"scenarios": [...]}`), in file-name order.
fn load(dir: &Path) -> Vec<Scenario> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    let mut out: Vec<Scenario> = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let doc: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let list = match doc.get("scenarios") {
            Some(Value::Array(list)) => list.clone(),
            _ => vec![doc],
        };
        for s in list {
            let name = s["name"].as_str().unwrap_or_else(|| panic!("{}: a scenario without a name", file.display()));
            assert!(!out.iter().any(|o| o.name == name), "two scenarios named {name}");
            out.push(Scenario {
                name: name.to_string(),
                table: s.get("table").and_then(Value::as_object).cloned().unwrap_or_default(),
                steps: s["steps"].as_array().unwrap_or_else(|| panic!("{name}: no steps")).clone(),
            });
        }
    }
    assert!(!out.is_empty(), "no scenarios in {}", dir.display());
    out
}

fn main() {
    // libtest's own flags: a filter, `--exact`, `--skip NAME`, `--list`; others are accepted.
    let mut filters = Vec::new();
    let mut skips = Vec::new();
    let (mut exact, mut list_only) = (false, false);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--exact" => exact = true,
            "--list" => list_only = true,
            "--skip" => skips.extend(args.next()),
            "--test-threads" | "--format" | "--color" | "--logfile" | "-Z" => drop(args.next()),
            flag if flag.starts_with('-') => {}
            filter => filters.push(filter.to_string()),
        }
    }
    let selected = |name: &str| {
        let full = format!("conformance::{name}");
        let hit = |f: &String| if exact { *f == full || f == name } else { full.contains(f.as_str()) };
        (filters.is_empty() || filters.iter().any(hit)) && !skips.iter().any(|s| full.contains(s.as_str()))
    };
    let scenarios: Vec<Scenario> = load(&scenario_dir()).into_iter().filter(|s| selected(&s.name)).collect();
    if list_only {
        for s in &scenarios {
            println!("conformance::{}: test", s.name);
        }
        return;
    }
    if local_engine::endpoint("the conformance vectors").is_none() {
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    println!("\nrunning {} tests", scenarios.len());
    // Scenarios run concurrently, each on a table of its own.
    let results: Vec<(String, Outcome)> = runtime.block_on(async {
        let client =
            aws_sdk_dynamodb::Client::new(&aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await);
        let runs = scenarios.iter().map(|s| {
            let client = client.clone();
            async move { (s.name.clone(), run(s, client).await) }
        });
        futures::future::join_all(runs).await
    });
    let mut failed = Vec::new();
    for (name, result) in &results {
        match result {
            Ok(()) => println!("test conformance::{name} ... ok"),
            Err(why) => {
                println!("test conformance::{name} ... FAILED");
                failed.push((name, why));
            }
        }
    }
    for (name, why) in &failed {
        println!("\n---- conformance::{name} ----\n{why}");
    }
    let passed = results.len() - failed.len();
    let verdict = if failed.is_empty() { "ok" } else { "FAILED" };
    println!("\ntest result: {verdict}. {passed} passed; {} failed\n", failed.len());
    if !failed.is_empty() {
        std::process::exit(101);
    }
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

/// The scenario's table options over the library's defaults; invalid ones fail with the
/// field named in the scenarios' vocabulary.
fn config(table_name: &str, options: &Map<String, Value>) -> leaselock::Result<TableConfig> {
    let ms = |key: &str| options.get(key).and_then(Value::as_u64).map(Duration::from_millis);
    let mut config = TableConfig::new(table_name);
    if let Some(d) = ms("lease_ms") {
        config = config.lease_duration(d);
    }
    if let Some(d) = ms("renew_ms") {
        config = config.renew_interval(d);
    }
    if let Some(d) = ms("clock_skew_ms") {
        config = config.clock_skew(d);
    }
    if let Some(p) = options.get("key_prefix").and_then(Value::as_str) {
        config = config.key_prefix(p);
    }
    if let Some(i) = options.get("index_name").and_then(Value::as_str) {
        config = config.index_name(i);
    }
    if let Some(names) = options.get("attributes").and_then(Value::as_object) {
        let mut a = Attributes::default();
        for (key, name) in names {
            let name = name.as_str().unwrap().to_string();
            let slot = match key.as_str() {
                "id" => &mut a.id,
                "desired_state" => &mut a.desired_state,
                "url" => &mut a.url,
                "owner" => &mut a.owner,
                "expires_at_ms" => &mut a.expires_at_ms,
                "last_seq" => &mut a.last_seq,
                "fence" => &mut a.fence,
                "ttl" => &mut a.ttl,
                "session_epoch" => &mut a.session_epoch,
                other => panic!("no attribute {other}"),
            };
            *slot = name;
        }
        config = config.attributes(a);
    }
    if let Some(mode) = options.get("mode").and_then(Value::as_str) {
        config = config.mode(LeaseMode::parse(mode).unwrap_or_else(|| panic!("no mode {mode}")));
    }
    config.validated().map_err(|e| match e {
        Error::InvalidInput { field, message } => {
            let field = match field.as_str() {
                "lease_duration" => "lease_ms",
                "renew_interval" => "renew_ms",
                "clock_skew" => "clock_skew_ms",
                other => other,
            };
            Error::InvalidInput { field: field.to_string(), message }
        }
        other => other,
    })
}

/// An error in the scenarios' vocabulary, with the fields the scenarios may check.
fn error_value(e: &Error) -> Value {
    match e {
        Error::Held { owner, expires_at_ms } => {
            json!({"error": "held", "owner": owner, "expires_at_ms": expires_at_ms})
        }
        Error::Lost { .. } => json!({"error": "lost"}),
        Error::NotFound { .. } => json!({"error": "not_found"}),
        Error::Stopped { .. } => json!({"error": "stopped"}),
        Error::SeqNotIncreasing { last_seq, seq, .. } => {
            json!({"error": "seq_not_increasing", "last_seq": last_seq, "seq": seq})
        }
        Error::InvalidInput { field, .. } => json!({"error": "invalid_input", "field": field}),
        Error::Throttled => json!({"error": "throttled"}),
        Error::Timeout { .. } => json!({"error": "timeout"}),
        Error::Unreachable(_) => json!({"error": "unreachable"}),
        Error::AccessDenied(_) => json!({"error": "access_denied"}),
        Error::NotConfigured(_) => json!({"error": "not_configured"}),
        Error::TableNotFound { .. } => json!({"error": "table_not_found"}),
        Error::Script(_) | Error::Store(_) => json!({"error": "store", "message": e.to_string()}),
    }
}

fn lease_value(l: &Lease) -> Value {
    json!({"id": l.id, "owner": l.owner, "fence": l.fence, "expires_at_ms": l.expires_at_ms,
           "last_seq": l.last_seq, "url": l.url, "desired_state": l.desired_state.map(|d| d.as_str())})
}

fn item_value(i: &LeaseItem) -> Value {
    json!({"id": i.id, "owner": i.owner, "fence": i.fence, "expires_at_ms": i.expires_at_ms,
           "last_seq": i.last_seq, "url": i.url, "desired_state": i.desired_state.map(|d| d.as_str())})
}

fn session_value(s: &Session) -> Value {
    json!({"owner": s.owner, "epoch": s.epoch, "expires_at_ms": s.expires_at_ms})
}

fn ids_value(items: &[LeaseItem]) -> Value {
    json!({"ids": items.iter().map(|i| i.id.clone()).collect::<Vec<_>>()})
}

/// A raw DynamoDB item as the scenarios write it: S as a string, N as a number.
fn raw_value(item: &HashMap<String, AttributeValue>) -> Value {
    let mut out = Map::new();
    for (k, v) in item {
        let v = match v {
            AttributeValue::S(s) => json!(s),
            AttributeValue::N(n) => n.parse::<i64>().map(Value::from).unwrap_or_else(|_| json!({"N": n})),
            other => json!(format!("{other:?}")),
        };
        out.insert(k.clone(), v);
    }
    Value::Object(out)
}

struct Run {
    table: LeaseTable,
    client: Client,
    options: Map<String, Value>,
    leases: HashMap<String, Lease>,
    sessions: HashMap<String, Session>,
    /// Saved values that `{"var": "name.field"}` reads: leases, sessions, snapshots.
    vars: HashMap<String, Value>,
}

async fn run(scenario: &Scenario, client: Client) -> Outcome {
    let suffix: String = format!("{:08x}", rand::random::<u32>());
    let safe: String =
        scenario.name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '-' }).collect();
    let table_name = format!("conf-rust-{safe}-{suffix}");
    let config = config(&table_name, &scenario.table).map_err(|e| format!("table options: {e}"))?;
    let table = LeaseTable::new(client.clone(), config).map_err(|e| e.to_string())?;
    table.create_table().await.map_err(|e| format!("create table: {e}"))?;
    let mut run = Run {
        table,
        client,
        options: scenario.table.clone(),
        leases: HashMap::new(),
        sessions: HashMap::new(),
        vars: HashMap::new(),
    };
    for (n, step) in scenario.steps.iter().enumerate() {
        run.step(step).await.map_err(|why| format!("step {} ({}): {why}\n  step: {step}", n + 1, step["op"]))?;
    }
    Ok(())
}

/// A string argument; `{"repeat": s, "times": n}` builds a long one.
fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Object(o) if o.contains_key("repeat") => {
            o["repeat"].as_str().unwrap().repeat(o["times"].as_u64().unwrap() as usize)
        }
        other => panic!("not a string argument: {other}"),
    }
}

impl Run {
    fn arg(&self, step: &Value, key: &str) -> String {
        text(step.get(key).unwrap_or_else(|| panic!("missing argument {key}")))
    }

    fn lease(&self, step: &Value) -> Outcome<(String, Lease)> {
        let name = self.arg(step, "lease");
        let lease = self.leases.get(&name).cloned().ok_or(format!("no lease saved as {name}"))?;
        Ok((name, lease))
    }

    fn session(&self, step: &Value) -> Outcome<(String, Session)> {
        let name = self.arg(step, "session");
        let session = self.sessions.get(&name).cloned().ok_or(format!("no session saved as {name}"))?;
        Ok((name, session))
    }

    fn save_lease(&mut self, name: Option<String>, lease: Lease) -> Value {
        let view = lease_value(&lease);
        if let Some(name) = name {
            self.vars.insert(name.clone(), view.clone());
            self.leases.insert(name, lease);
        }
        view
    }

    fn save_session(&mut self, name: Option<String>, session: Session) -> Value {
        let view = session_value(&session);
        if let Some(name) = name {
            self.vars.insert(name.clone(), view.clone());
            self.sessions.insert(name, session);
        }
        view
    }

    /// The stored key a raw step addresses: `raw_key` verbatim, `id` under the prefix, or
    /// `session`'s item.
    fn raw_key(&self, step: &Value) -> String {
        let config = self.table.config();
        if let Some(k) = step.get("raw_key") {
            text(k)
        } else if let Some(owner) = step.get("session") {
            config.key(&config.session_id(&text(owner)))
        } else {
            config.key(&self.arg(step, "id"))
        }
    }

    async fn read_raw(&self, key: &str) -> Outcome<Option<HashMap<String, AttributeValue>>> {
        let config = self.table.config();
        let out = self
            .client
            .get_item()
            .table_name(&config.table_name)
            .key(&config.attributes.id, AttributeValue::S(key.to_string()))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| format!("raw read: {e:?}"))?;
        Ok(out.item)
    }

    async fn step(&mut self, step: &Value) -> Outcome {
        let op = step["op"].as_str().ok_or("a step without op")?;
        let name = step.get("as").map(text);
        let result: leaselock::Result<Value> = match op {
            "start" => self.table.start(&self.arg(step, "id"), &self.arg(step, "url")).await.map(|i| item_value(&i)),
            "stop" => self.table.stop(&self.arg(step, "id")).await.map(|i| item_value(&i)),
            "acquire" => match self.table.acquire(&self.arg(step, "id"), &self.arg(step, "owner")).await {
                Ok(lease) => Ok(self.save_lease(name, lease)),
                Err(e) => Err(e),
            },
            "contend" => return self.contend(step, name).await,
            "renew" | "checkpoint" | "release" => {
                let (lease_name, mut lease) = self.lease(step)?;
                let done = match op {
                    "renew" => self.table.renew(&mut lease).await,
                    "checkpoint" => {
                        let seq = step["seq"].as_u64().ok_or("seq must be a number")?;
                        self.table.checkpoint(&mut lease, seq).await
                    }
                    _ => self.table.release(&lease).await,
                };
                done.map(|()| self.save_lease(Some(lease_name), lease))
            }
            "get" => {
                self.table.get(&self.arg(step, "id")).await.map(|i| i.as_ref().map(item_value).unwrap_or(Value::Null))
            }
            "orphans" => {
                let cutoff = leaselock::lease::claim_cutoff(self.table.clock().now_ms(), self.table.config());
                let limit = step.get("limit").and_then(Value::as_u64).map(|l| l as usize);
                self.table.orphans(cutoff, limit).await.map(|items| ids_value(&items))
            }
            "owned_by" => self.table.owned_by(&self.arg(step, "owner")).await.map(|items| ids_value(&items)),
            "desired_states" => {
                let ids: Vec<String> = step["ids"].as_array().ok_or("ids")?.iter().map(text).collect();
                self.table.batch_desired_states(&ids).await.map(|states| {
                    let states: BTreeMap<String, Value> =
                        states.into_iter().map(|(k, v)| (k, json!(v.map(|d| d.as_str())))).collect();
                    json!({ "states": states })
                })
            }
            "open" => {
                let mut options = self.options.clone();
                for (k, v) in step["table"].as_object().ok_or("table")? {
                    options.insert(k.clone(), v.clone());
                }
                config(&self.table.config().table_name, &options).map(|_| json!({}))
            }
            "create_session" => {
                let previous = step.get("previous_epoch").and_then(Value::as_u64);
                match self.table.create_session(&self.arg(step, "owner"), previous).await {
                    Ok(session) => Ok(self.save_session(name, session)),
                    Err(e) => Err(e),
                }
            }
            "renew_session" | "end_session" => {
                let (session_name, mut session) = self.session(step)?;
                let done = match op {
                    "renew_session" => self.table.renew_session(&mut session).await,
                    _ => self.table.end_session(&session).await,
                };
                done.map(|()| self.save_session(Some(session_name), session))
            }
            "claim" => {
                let (_, session) = self.session(step)?;
                match self.table.claim_in_session(&self.arg(step, "id"), &session).await {
                    Ok(lease) => Ok(self.save_lease(name, lease)),
                    Err(e) => Err(e),
                }
            }
            "sessions" => self.table.sessions(u64::MAX).await.map(|mut list| {
                list.sort_by(|a, b| a.owner.cmp(&b.owner));
                let list: Vec<Value> = list
                    .iter()
                    .map(|s| json!({"owner": s.owner, "epoch": s.epoch, "expires_at_ms": s.expires_at_ms}))
                    .collect();
                json!({ "sessions": list })
            }),
            // Raw steps: the item itself, through the SDK, behind the library's back.
            "put_raw" => return self.put_raw(step).await,
            "age" => return self.age(step).await,
            "snapshot" => {
                let key = self.raw_key(step);
                let item = self.read_raw(&key).await?.map(|i| raw_value(&i)).unwrap_or(Value::Null);
                self.vars.insert(self.arg(step, "as"), item);
                return Ok(());
            }
            "expect_item" => return self.expect_item(step).await,
            "expect_keys" => return self.expect_keys(step).await,
            other => return Err(format!("unknown op {other}")),
        };
        self.check_result(step, result)
    }

    fn check_result(&self, step: &Value, result: leaselock::Result<Value>) -> Outcome {
        let got = match &result {
            Ok(v) => v.clone(),
            Err(e) => error_value(e),
        };
        match step.get("expect") {
            None => match result {
                Ok(_) => Ok(()),
                Err(e) => Err(format!("expected success, got {}", error_value(&e))),
            },
            Some(Value::Null) => match got {
                Value::Null => Ok(()),
                other => Err(format!("expected null, got {other}")),
            },
            Some(want) => {
                let wants_error = want.get("error").is_some();
                if result.is_err() != wants_error {
                    return Err(format!("expected {want}, got {got}"));
                }
                self.matches_subset(want, &got).map_err(|why| format!("{why}\n  expected {want}\n  got {got}"))
            }
        }
    }

    async fn contend(&mut self, step: &Value, name: Option<String>) -> Outcome {
        let id = self.arg(step, "id");
        let owners: Vec<String> = step["owners"].as_array().ok_or("owners")?.iter().map(text).collect();
        let claims = owners.iter().map(|o| self.table.acquire(&id, o));
        let results = futures::future::join_all(claims).await;
        let mut winners = Vec::new();
        let mut held = Vec::new();
        let mut others = Vec::new();
        for r in results {
            match r {
                Ok(lease) => winners.push(lease),
                Err(Error::Held { owner, .. }) => held.push(owner),
                Err(e) => others.push(error_value(&e)),
            }
        }
        let named = winners.len() == 1 && held.iter().all(|o| *o == winners[0].owner);
        let mut got = json!({"winners": winners.len(), "held": held.len(), "others": others,
                             "held_names_winner": named});
        if let Some(w) = winners.first() {
            got["fence"] = json!(w.fence);
            got["owner"] = json!(w.owner);
        }
        if let Some(w) = winners.into_iter().next() {
            self.save_lease(name, w);
        }
        self.check_result(step, Ok(got))
    }

    /// A raw item from a scenario's value: strings are S, numbers N, `{"now_plus_ms": d}` N.
    fn attribute(&self, v: &Value) -> AttributeValue {
        match v {
            Value::String(s) => AttributeValue::S(s.clone()),
            Value::Number(n) => AttributeValue::N(n.to_string()),
            Value::Object(o) if o.contains_key("now_plus_ms") => {
                AttributeValue::N((now_ms() + o["now_plus_ms"].as_i64().unwrap()).to_string())
            }
            Value::Object(o) if o.contains_key("S") => AttributeValue::S(o["S"].as_str().unwrap().into()),
            Value::Object(o) if o.contains_key("N") => AttributeValue::N(o["N"].as_str().unwrap().into()),
            other => panic!("not a raw attribute value: {other}"),
        }
    }

    async fn put_raw(&self, step: &Value) -> Outcome {
        let mut put = self.client.put_item().table_name(&self.table.config().table_name);
        for (k, v) in step["item"].as_object().ok_or("item")? {
            put = put.item(k, self.attribute(v));
        }
        put.send().await.map_err(|e| format!("raw put: {e:?}"))?;
        Ok(())
    }

    /// Rewrites the item's expiry relative to now, on the item as it is (it must exist).
    async fn age(&self, step: &Value) -> Outcome {
        let config = self.table.config();
        let expires = now_ms() + step["expires_in_ms"].as_i64().ok_or("expires_in_ms")?;
        self.client
            .update_item()
            .table_name(&config.table_name)
            .key(&config.attributes.id, AttributeValue::S(self.raw_key(step)))
            .update_expression("SET #exp = :exp")
            .condition_expression("attribute_exists(#id)")
            .expression_attribute_names("#exp", &config.attributes.expires_at_ms)
            .expression_attribute_names("#id", &config.attributes.id)
            .expression_attribute_values(":exp", AttributeValue::N(expires.to_string()))
            .send()
            .await
            .map_err(|e| format!("age: {e:?}"))?;
        Ok(())
    }

    async fn expect_item(&self, step: &Value) -> Outcome {
        let key = self.raw_key(step);
        let got = self.read_raw(&key).await?.map(|i| raw_value(&i)).unwrap_or(Value::Null);
        let want = match step.get("same_as") {
            Some(snap) => {
                let snap = text(snap);
                let saved = self.vars.get(&snap).ok_or(format!("no snapshot {snap}"))?;
                return if *saved == got { Ok(()) } else { Err(format!("item {key} changed: was {saved}, now {got}")) };
            }
            None => step.get("item").ok_or("expect_item needs item or same_as")?,
        };
        match (want, &got) {
            (Value::Null, Value::Null) => Ok(()),
            (Value::Null, _) | (_, Value::Null) => Err(format!("item {key}: expected {want}, got {got}")),
            (Value::Object(w), Value::Object(g)) => {
                if let Some(extra) = g.keys().find(|k| !w.contains_key(*k)) {
                    return Err(format!("item {key}: unexpected attribute {extra}\n  expected {want}\n  got {got}"));
                }
                self.matches_subset(want, &got)
                    .map_err(|why| format!("item {key}: {why}\n  expected {want}\n  got {got}"))
            }
            _ => Err(format!("item {key}: bad expectation {want}")),
        }
    }

    async fn expect_keys(&self, step: &Value) -> Outcome {
        let config = self.table.config();
        let mut keys = Vec::new();
        let mut start = None;
        loop {
            let out = self
                .client
                .scan()
                .table_name(&config.table_name)
                .consistent_read(true)
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| format!("scan: {e:?}"))?;
            for item in out.items() {
                if let Some(AttributeValue::S(k)) = item.get(&config.attributes.id) {
                    keys.push(k.clone());
                }
            }
            start = out.last_evaluated_key;
            if start.is_none() {
                break;
            }
        }
        keys.sort();
        let mut want: Vec<String> = step["keys"].as_array().ok_or("keys")?.iter().map(text).collect();
        want.sort();
        if keys == want {
            Ok(())
        } else {
            Err(format!("stored keys {keys:?}, expected {want:?}"))
        }
    }

    /// Every key of `want` matches `got`'s (other keys of `got` are not checked).
    fn matches_subset(&self, want: &Value, got: &Value) -> Outcome {
        let (Some(w), Some(g)) = (want.as_object(), got.as_object()) else {
            return self.matches(want, got);
        };
        for (k, wv) in w {
            let gv = g.get(k).unwrap_or(&Value::Null);
            self.matches(wv, gv).map_err(|why| format!("{k}: {why}"))?;
        }
        Ok(())
    }

    /// One expected value (a literal or a matcher) against a value.
    fn matches(&self, want: &Value, got: &Value) -> Outcome {
        if let Value::Object(m) = want {
            if let Some(range) = m.get("ms_from_now") {
                let (lo, hi) = (range[0].as_i64().unwrap(), range[1].as_i64().unwrap());
                let now = now_ms();
                let v = got.as_i64().ok_or(format!("{got} is not a time"))?;
                return if (now + lo..=now + hi).contains(&v) {
                    Ok(())
                } else {
                    Err(format!("{v} is {} ms from now, expected {lo}..={hi}", v - now))
                };
            }
            if m.contains_key("any") {
                return if got.is_null() { Err("absent".into()) } else { Ok(()) };
            }
            if let Some(options) = m.get("one_of") {
                let options = options.as_array().unwrap();
                return if options.contains(got) { Ok(()) } else { Err(format!("{got} is not one of {options:?}")) };
            }
            if let Some(list) = m.get("unordered") {
                let mut w: Vec<String> = list.as_array().unwrap().iter().map(|v| v.to_string()).collect();
                let mut g: Vec<String> =
                    got.as_array().ok_or(format!("{got} is not a list"))?.iter().map(|v| v.to_string()).collect();
                w.sort();
                g.sort();
                return if w == g { Ok(()) } else { Err(format!("{got} is not {list} in any order")) };
            }
            if let Some(path) = m.get("var") {
                let path = path.as_str().unwrap();
                let (name, field) = path.split_once('.').ok_or("var is name.field")?;
                let value = self.vars.get(name).ok_or(format!("no saved {name}"))?.get(field).cloned();
                let value = value.ok_or(format!("saved {name} has no {field}"))?;
                return if value == *got { Ok(()) } else { Err(format!("{got} is not {path} ({value})")) };
            }
            let g = got.as_object().ok_or(format!("{got} is not an object"))?;
            if g.len() != m.len() {
                return Err(format!("{got} has other keys than {want}"));
            }
            return self.matches_subset(want, got);
        }
        if let (Value::Array(w), Value::Array(g)) = (want, got) {
            if w.len() != g.len() {
                return Err(format!("{got} is not {want}"));
            }
            for (wv, gv) in w.iter().zip(g) {
                self.matches(wv, gv)?;
            }
            return Ok(());
        }
        let equal = match (want, got) {
            (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
            _ => want == got,
        };
        if equal {
            Ok(())
        } else {
            Err(format!("{got} is not {want}"))
        }
    }
}
