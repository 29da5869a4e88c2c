//! Real processes contending for elections: the test binary runs itself as a contender
//! (its ignored `contender` test) with the role in the environment. Contenders share a
//! directory: `state` (a counter of current holders and the last fence, updated under a file
//! lock, so an overlap is seen whatever the store says), `events` (one JSON line per
//! enter / act / exit) and `stop`.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use leaselock::election::{
    Candidate, ElectionBackend, ElectionOptions, LeaderElector, Outcome, Strategy, Term, TermEnd,
};
use leaselock::{Clock, Lease, SystemClock};
use serde_json::{json, Value};

pub fn now_ms() -> u64 {
    SystemClock.now_ms()
}

/// Which store the contenders use, and its timing.
#[derive(Debug, Clone)]
pub struct Setup {
    pub backend: &'static str,
    /// The DynamoDB table (created by the parent) or the Redis key prefix.
    pub space: String,
    pub lease_ms: u64,
    pub renew_ms: u64,
    pub skew_ms: u64,
    pub retry_ms: u64,
}

impl Setup {
    fn env(&self) -> Vec<(String, String)> {
        vec![
            ("ELECTION_BACKEND".into(), self.backend.into()),
            ("ELECTION_SPACE".into(), self.space.clone()),
            ("ELECTION_LEASE_MS".into(), self.lease_ms.to_string()),
            ("ELECTION_RENEW_MS".into(), self.renew_ms.to_string()),
            ("ELECTION_SKEW_MS".into(), self.skew_ms.to_string()),
            ("ELECTION_RETRY_MS".into(), self.retry_ms.to_string()),
        ]
    }

    fn from_env() -> Self {
        let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} not set"));
        let backend = match var("ELECTION_BACKEND").as_str() {
            "dynamo" => "dynamo",
            _ => "redis",
        };
        Setup {
            backend,
            space: var("ELECTION_SPACE"),
            lease_ms: var("ELECTION_LEASE_MS").parse().unwrap(),
            renew_ms: var("ELECTION_RENEW_MS").parse().unwrap(),
            skew_ms: var("ELECTION_SKEW_MS").parse().unwrap(),
            retry_ms: var("ELECTION_RETRY_MS").parse().unwrap(),
        }
    }
}

/// The backend, plus what a fenced write goes through (one per test process: its size is moot).
#[allow(clippy::large_enum_variant)]
pub enum Store {
    Dynamo(leaselock::LeaseTable),
    #[cfg(feature = "redis")]
    Redis(leaselock::redis::RedisElection),
}

pub async fn connect(setup: &Setup) -> (Arc<dyn ElectionBackend>, Store) {
    let ms = Duration::from_millis;
    match setup.backend {
        "dynamo" => {
            let config = leaselock::TableConfig::new(&setup.space)
                .lease_duration(ms(setup.lease_ms))
                .renew_interval(ms(setup.renew_ms))
                .clock_skew(ms(setup.skew_ms));
            let table = leaselock::LeaseTable::connect(config).await.expect("table");
            let registry = leaselock::DynamoRegistry::for_table(&table);
            (Arc::new(leaselock::StoreElection::new(table.clone(), registry)), Store::Dynamo(table))
        }
        #[cfg(feature = "redis")]
        _ => {
            let url = std::env::var("LEASELOCK_REDIS_URL").expect("LEASELOCK_REDIS_URL");
            let options = leaselock::redis::RedisOptions::default()
                .lease(ms(setup.lease_ms))
                .renew(ms(setup.renew_ms))
                .skew(ms(setup.skew_ms))
                .key_prefix(&setup.space);
            let redis = leaselock::redis::RedisElection::connect(&url, options).await.expect("redis");
            (Arc::new(redis.clone()), Store::Redis(redis))
        }
        #[cfg(not(feature = "redis"))]
        other => panic!("backend {other} needs the redis feature"),
    }
}

impl Store {
    /// A write that goes through only while `lease` is held; for DynamoDB it also refuses a
    /// fence that is not above the last one written (a store-side check of the fence order).
    pub async fn fenced_write(&self, lease: &Lease, name: &str) -> leaselock::Result<()> {
        match self {
            Store::Dynamo(table) => {
                use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem, Update};
                use leaselock::LeaseStore;
                let config = table.config();
                let update = Update::builder()
                    .table_name(&config.table_name)
                    .key(&config.attributes.id, AttributeValue::S(config.key(&format!("fencecheck/{name}"))))
                    .update_expression("SET #f = :f")
                    .condition_expression("attribute_not_exists(#f) OR #f <= :f")
                    .expression_attribute_names("#f", "last_fence")
                    .expression_attribute_values(":f", AttributeValue::N(lease.fence.to_string()))
                    .build()
                    .unwrap();
                let write = TransactWriteItem::builder().update(update).build();
                leaselock::fenced_write(table.client(), config, lease, now_ms(), vec![write]).await
            }
            #[cfg(feature = "redis")]
            Store::Redis(redis) => {
                redis.fenced_set(lease, &format!("fencecheck/{name}"), &lease.fence.to_string()).await
            }
        }
    }
}

/// What one contender does.
#[derive(Debug, Clone)]
pub struct Role {
    pub mode: &'static str,
    pub id: String,
    pub name: String,
    pub slots: u32,
    pub action_ms: u64,
    pub min_lease_ms: u64,
    pub wait_ms: u64,
    pub score: f64,
    pub term_ms: u64,
    /// Leader and slot modes: stop once this many terms were run (by anyone).
    pub terms: u64,
}

impl Role {
    pub fn new(mode: &'static str, id: &str, name: &str) -> Self {
        Role {
            mode,
            id: id.into(),
            name: name.into(),
            slots: 1,
            action_ms: 5,
            min_lease_ms: 0,
            wait_ms: 2_000,
            score: 0.0,
            term_ms: 0,
            terms: u64::MAX,
        }
    }

    fn env(&self) -> Vec<(String, String)> {
        vec![
            ("ELECTION_MODE".into(), self.mode.into()),
            ("ELECTION_ID".into(), self.id.clone()),
            ("ELECTION_NAME".into(), self.name.clone()),
            ("ELECTION_SLOTS".into(), self.slots.to_string()),
            ("ELECTION_ACTION_MS".into(), self.action_ms.to_string()),
            ("ELECTION_MIN_LEASE_MS".into(), self.min_lease_ms.to_string()),
            ("ELECTION_WAIT_MS".into(), self.wait_ms.to_string()),
            ("ELECTION_SCORE".into(), self.score.to_string()),
            ("ELECTION_TERM_MS".into(), self.term_ms.to_string()),
            ("ELECTION_TERMS".into(), self.terms.to_string()),
        ]
    }

    fn from_env() -> Self {
        let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} not set"));
        let mode = match var("ELECTION_MODE").as_str() {
            "slot" => "slot",
            "strategic" => "strategic",
            "frozen" => "frozen",
            _ => "leader",
        };
        Role {
            mode,
            id: var("ELECTION_ID"),
            name: var("ELECTION_NAME"),
            slots: var("ELECTION_SLOTS").parse().unwrap(),
            action_ms: var("ELECTION_ACTION_MS").parse().unwrap(),
            min_lease_ms: var("ELECTION_MIN_LEASE_MS").parse().unwrap(),
            wait_ms: var("ELECTION_WAIT_MS").parse().unwrap(),
            score: var("ELECTION_SCORE").parse().unwrap(),
            term_ms: var("ELECTION_TERM_MS").parse().unwrap(),
            terms: var("ELECTION_TERMS").parse().unwrap(),
        }
    }
}

/// The shared directory of one run. The test's own copy removes it when the test passes (a failed
/// run keeps it for a look); copies, and the children's, leave it.
#[derive(Debug)]
pub struct Shared {
    pub dir: PathBuf,
    owner: bool,
}

impl Clone for Shared {
    fn clone(&self) -> Self {
        Shared { dir: self.dir.clone(), owner: false }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        if self.owner && !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl Shared {
    pub fn new(label: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("leaselock-election-{label}-{}-{}", std::process::id(), now_ms()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("state"), json!({"holders": 0, "terms": 0, "last_fence": {}}).to_string()).unwrap();
        File::create(dir.join("events")).unwrap();
        Shared { dir, owner: true }
    }

    fn state_file(&self) -> File {
        OpenOptions::new().read(true).write(true).open(self.dir.join("state")).unwrap()
    }

    /// Runs `f` on the state under an exclusive file lock.
    pub fn with_state<T>(&self, f: impl FnOnce(&mut Value) -> T) -> T {
        let mut file = self.state_file();
        use std::os::fd::AsRawFd;
        assert_eq!(unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) }, 0);
        let mut text = String::new();
        file.read_to_string(&mut text).unwrap();
        let mut state: Value = serde_json::from_str(&text).unwrap();
        let out = f(&mut state);
        file.set_len(0).unwrap();
        file.rewind().unwrap();
        file.write_all(state.to_string().as_bytes()).unwrap();
        assert_eq!(unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_UN) }, 0);
        out
    }

    pub fn log(&self, event: Value) {
        let mut f = OpenOptions::new().append(true).open(self.dir.join("events")).unwrap();
        f.write_all(format!("{event}\n").as_bytes()).unwrap();
    }

    pub fn events(&self) -> Vec<Value> {
        std::fs::read_to_string(self.dir.join("events"))
            .unwrap()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    pub fn stop(&self) {
        std::fs::write(self.dir.join("stop"), "").unwrap();
    }

    pub fn stopped(&self) -> bool {
        self.dir.join("stop").exists()
    }

    pub fn terms(&self) -> u64 {
        self.with_state(|s| s["terms"].as_u64().unwrap())
    }

    /// Waits (polling, bounded) for an event matching `pred`.
    pub fn wait_for(&self, what: &str, limit: Duration, pred: impl Fn(&Value) -> bool) -> Value {
        let until = Instant::now() + limit;
        loop {
            if let Some(e) = self.events().into_iter().find(|e| pred(e)) {
                return e;
            }
            assert!(Instant::now() < until, "no {what} within {limit:?}; events: {:?}", self.events());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Contender processes of one run; killed (by pid) when dropped.
pub struct Fleet {
    pub children: Vec<(String, Child)>,
    /// Set in every contender's environment (e.g. a Redis of the test's own).
    pub env: Vec<(String, String)>,
}

impl Fleet {
    pub fn new() -> Self {
        Fleet { children: Vec::new(), env: Vec::new() }
    }

    /// Starts a contender: this test binary running its `contender` test.
    pub fn spawn(&mut self, setup: &Setup, role: &Role, shared: &Shared) {
        let child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "contender", "--ignored", "--nocapture", "--test-threads=1"])
            .envs(setup.env())
            .envs(role.env())
            .envs(self.env.iter().cloned())
            .env("ELECTION_DIR", &shared.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn contender");
        self.children.push((role.id.clone(), child));
    }

    pub fn pid(&self, id: &str) -> i32 {
        self.children.iter().find(|(i, _)| i == id).map(|(_, c)| c.id() as i32).expect("child")
    }

    pub fn signal(&self, id: &str, sig: i32) {
        unsafe { libc::kill(self.pid(id), sig) };
    }

    /// Waits for every contender to exit on its own; fails (and kills them) past `limit`.
    pub fn join(&mut self, limit: Duration) {
        let until = Instant::now() + limit;
        for (id, child) in &mut self.children {
            loop {
                if let Some(status) = child.try_wait().unwrap() {
                    assert!(status.success() || status.code().is_none(), "contender {id} failed: {status}");
                    break;
                }
                if Instant::now() > until {
                    let _ = child.kill();
                    panic!("contender {id} still running after {limit:?}");
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for (_, child) in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// No overlap, no fence out of order, no refused fenced write while held.
pub fn assert_no_violation(shared: &Shared) {
    let bad: Vec<Value> = shared.events().into_iter().filter(|e| e["kind"] == "violation").collect();
    assert!(bad.is_empty(), "violations: {bad:?}");
}

/// The contender's body (called from each test binary's ignored `contender` test).
pub fn contender_main() {
    if std::env::var_os("ELECTION_DIR").is_none() {
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(contend());
}

async fn contend() {
    let setup = Setup::from_env();
    let role = Role::from_env();
    let shared = Shared { dir: PathBuf::from(std::env::var("ELECTION_DIR").unwrap()), owner: false };
    let (backend, store) = connect(&setup).await;
    let store = Arc::new(store);
    let options = ElectionOptions::default()
        .wait(Duration::from_millis(role.wait_ms))
        .retry_delay(Duration::from_millis(setup.retry_ms))
        .min_lease(Duration::from_millis(role.min_lease_ms))
        .term(Duration::from_millis(if role.term_ms > 0 { role.term_ms } else { setup.lease_ms }))
        .candidate_ttl(Duration::from_millis(setup.lease_ms));
    let elector = LeaderElector::new(backend, role.id.clone(), options).unwrap();
    let started = Instant::now();
    while !shared.stopped() && started.elapsed() < Duration::from_secs(90) && shared.terms() < role.terms {
        let act = |term: Term| act(term, role.clone(), shared.clone(), store.clone());
        let outcome = match role.mode {
            "slot" => elector.run_if_slot(&role.name, role.slots, act).await,
            "strategic" => {
                let candidate = Candidate::new(&role.id, role.score);
                elector.run_if_elected(&role.name, candidate, &Strategy::HighestScore, act).await
            }
            _ => elector.run_if_leader(&role.name, act).await,
        };
        match outcome {
            Ok(Outcome::Led { fence, end, .. }) => {
                shared.log(
                    json!({"kind": "exit", "id": role.id, "fence": fence, "end": format!("{end:?}"), "t": now_ms()}),
                );
                // Give the others a turn before contending again.
                tokio::time::sleep(Duration::from_millis(setup.retry_ms)).await;
            }
            Ok(Outcome::Skipped { .. }) => {}
            Err(e) => {
                shared.log(json!({"kind": "error", "id": role.id, "error": e.to_string(), "t": now_ms()}));
                tokio::time::sleep(Duration::from_millis(setup.retry_ms)).await;
            }
        }
    }
}

fn slot_key(term: &Term) -> String {
    term.slot().map_or("leader".to_string(), |s| s.to_string())
}

async fn act(term: Term, role: Role, shared: Shared, store: Arc<Store>) -> TermEnd {
    let fence = term.fence();
    let limit = if role.mode == "slot" { role.slots as u64 } else { 1 };
    let slot = slot_key(&term);
    let id = role.id.clone();
    // Rule 2: a holder resumed past its deadline (a stalled process) does not act at all.
    let entered = shared.with_state(|s| {
        if term.is_cancelled() {
            return None;
        }
        let holders = s["holders"].as_u64().unwrap() + 1;
        let last = s["last_fence"][&slot].as_u64().unwrap_or(0);
        s["holders"] = json!(holders);
        s["terms"] = json!(s["terms"].as_u64().unwrap() + 1);
        s["last_fence"][&slot] = json!(fence);
        Some((holders, last))
    });
    let Some(entered) = entered else {
        shared.log(json!({"kind": "late", "id": id, "fence": fence, "t": now_ms()}));
        return TermEnd::Lost;
    };
    let t = now_ms();
    shared.log(json!({"kind": "enter", "id": id, "fence": fence, "slot": slot, "holders": entered.0, "pid": std::process::id(), "t": t}));
    if entered.0 > limit {
        shared.log(json!({"kind": "violation", "what": "overlap", "id": id, "holders": entered.0}));
    }
    if fence <= entered.1 {
        shared.log(json!({"kind": "violation", "what": "fence order", "id": id, "fence": fence, "last": entered.1}));
    }
    if role.mode != "slot" {
        match store.fenced_write(term.lease(), &role.name).await {
            Ok(()) => {}
            Err(e) if term.is_cancelled() => shared.log(json!({"kind": "late", "id": id, "error": e.to_string()})),
            Err(e) => {
                shared.log(json!({"kind": "violation", "what": "fenced write", "id": id, "error": e.to_string()}))
            }
        }
    }
    let until = Instant::now() + Duration::from_millis(role.action_ms);
    let mut end = TermEnd::Finished;
    while Instant::now() < until && !shared.stopped() {
        if term.is_cancelled() {
            let t = now_ms();
            shared.log(json!({"kind": "cancelled", "id": id, "fence": fence, "t": t}));
            if role.mode == "frozen" {
                // What a zombie would try: a write under the lease it had.
                let result = store.fenced_write(term.lease(), &role.name).await;
                let kind = result.err().map(|e| e.kind()).unwrap_or("Ok");
                shared.log(json!({"kind": "zombie_write", "id": id, "fence": fence, "result": kind}));
            }
            end = TermEnd::Lost;
            break;
        }
        if role.mode == "frozen" {
            let t0 = now_ms();
            let result = store.fenced_write(term.lease(), &role.name).await;
            let kind = result.err().map(|e| e.kind()).unwrap_or("Ok");
            shared.log(json!({"kind": "act", "id": id, "fence": fence, "result": kind, "t0": t0, "t": now_ms()}));
        }
        let left = until.saturating_duration_since(Instant::now()).min(Duration::from_millis(50));
        tokio::select! {
            _ = term.cancelled() => {}
            _ = tokio::time::sleep(left) => {}
        }
    }
    shared.with_state(|s| s["holders"] = json!(s["holders"].as_u64().unwrap().saturating_sub(1)));
    end
}

/// Events of `kind`, in order.
pub fn of_kind(events: &[Value], kind: &str) -> Vec<Value> {
    events.iter().filter(|e| e["kind"] == kind).cloned().collect()
}

/// Per holder id, how many terms it ran.
pub fn terms_by_id(events: &[Value]) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for e in of_kind(events, "enter") {
        *out.entry(e["id"].as_str().unwrap().to_string()).or_insert(0) += 1;
    }
    out
}

pub fn path(shared: &Shared, name: &str) -> PathBuf {
    Path::new(&shared.dir).join(name)
}

/// Runs scenarios one at a time: each is timing-sensitive and starts several processes.
pub static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Several processes over `terms` terms: never two leaders, fences strictly increasing.
pub fn leader_terms(setup: &Setup, procs: usize, terms: u64) {
    let _g = serial();
    let shared = Shared::new("terms");
    let mut fleet = Fleet::new();
    for i in 0..procs {
        let role = Role { terms, action_ms: 5, ..Role::new("leader", &format!("p{i}"), "terms") };
        fleet.spawn(setup, &role, &shared);
    }
    fleet.join(Duration::from_secs(150));
    let events = shared.events();
    assert_no_violation(&shared);
    assert!(of_kind(&events, "error").is_empty(), "errors: {:?}", of_kind(&events, "error"));
    let enters = of_kind(&events, "enter");
    assert!(enters.len() as u64 >= terms, "{} terms", enters.len());
    let fences: Vec<u64> = enters.iter().map(|e| e["fence"].as_u64().unwrap()).collect();
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "fences in order of entry: {fences:?}");
    let by_id = terms_by_id(&events);
    assert!(by_id.len() >= 2, "more than one process led: {by_id:?}");
    eprintln!("{}: {} terms, by process {by_id:?}", setup.backend, enters.len());
}

/// A leader killed with SIGKILL is replaced within lease + skew + retry delay.
pub fn killed_leader_replaced(setup: &Setup) -> u64 {
    let _g = serial();
    let shared = Shared::new("kill");
    let mut fleet = Fleet::new();
    for i in 0..3 {
        let role = Role { action_ms: 60_000, wait_ms: 5_000, ..Role::new("leader", &format!("k{i}"), "kill") };
        fleet.spawn(setup, &role, &shared);
    }
    let first = shared.wait_for("a first leader", Duration::from_secs(30), |e| e["kind"] == "enter");
    let victim = first["id"].as_str().unwrap().to_string();
    fleet.signal(&victim, libc::SIGKILL);
    let killed_at = now_ms();
    // The victim can no longer say it left.
    shared.with_state(|s| s["holders"] = json!(0));
    let bound = setup.lease_ms + setup.skew_ms + setup.retry_ms;
    let next = shared.wait_for("a new leader", Duration::from_millis(bound + 5_000), |e| {
        e["kind"] == "enter" && e["t"].as_u64().unwrap() > killed_at
    });
    let took = next["t"].as_u64().unwrap() - killed_at;
    shared.stop();
    fleet.children.retain(|(id, _)| id != &victim);
    fleet.join(Duration::from_secs(20));
    assert_no_violation(&shared);
    assert_ne!(next["id"], first["id"]);
    assert!(next["fence"].as_u64() > first["fence"].as_u64());
    // Slack for the claim's own round trip on a loaded machine.
    assert!(took <= bound + 400, "replaced after {took} ms; bound {bound} ms");
    eprintln!("{}: killed leader replaced after {took} ms (lease + skew + retry = {bound} ms)", setup.backend);
    took
}

/// A group of `slots` never has more than `slots` holders under 3 x `slots` contenders.
pub fn group_limit(setup: &Setup, slots: u32) {
    let _g = serial();
    let shared = Shared::new("group");
    let mut fleet = Fleet::new();
    for i in 0..3 * slots {
        let role = Role { slots, action_ms: 40, terms: 100, ..Role::new("slot", &format!("g{i}"), "group") };
        fleet.spawn(setup, &role, &shared);
    }
    fleet.join(Duration::from_secs(120));
    let events = shared.events();
    assert_no_violation(&shared);
    assert!(of_kind(&events, "error").is_empty(), "errors: {:?}", of_kind(&events, "error"));
    let enters = of_kind(&events, "enter");
    assert!(enters.len() >= 100);
    let most = enters.iter().map(|e| e["holders"].as_u64().unwrap()).max().unwrap();
    assert_eq!(most, slots as u64, "the group was full at times, never over");
    eprintln!("{}: {} slot terms, at most {most} holders of {slots}", setup.backend, enters.len());
}

/// Three candidates: the highest leads; when it dies the next takes over; a new higher one
/// takes over at the next term boundary, not before.
pub fn strategic(setup: &Setup, term_ms: u64) {
    let _g = serial();
    let shared = Shared::new("strategic");
    let mut fleet = Fleet::new();
    let cand = |id: &str, score: f64| Role {
        score,
        term_ms,
        action_ms: 60_000,
        wait_ms: 60_000,
        ..Role::new("strategic", id, "strategic")
    };
    for (id, score) in [("c10", 10.0), ("c20", 20.0), ("c30", 30.0)] {
        fleet.spawn(setup, &cand(id, score), &shared);
    }
    let top = shared.wait_for("c30 leading", Duration::from_secs(30), |e| e["kind"] == "enter" && e["id"] == "c30");
    let top_at = top["t"].as_u64().unwrap();
    // It keeps leadership: nobody else enters while it lives.
    std::thread::sleep(Duration::from_millis(2 * term_ms));
    let intruders: Vec<Value> = of_kind(&shared.events(), "enter")
        .into_iter()
        .filter(|e| e["t"].as_u64().unwrap() > top_at && e["id"] != "c30")
        .collect();
    assert!(intruders.is_empty(), "others entered while c30 led: {intruders:?}");
    fleet.signal("c30", libc::SIGKILL);
    let killed_at = now_ms();
    shared.with_state(|s| s["holders"] = json!(0));
    // Its registration runs out (one lease), then its lease (lease + skew).
    let next =
        shared.wait_for("the next candidate", Duration::from_millis(2 * setup.lease_ms + setup.skew_ms + 5_000), |e| {
            e["kind"] == "enter" && e["t"].as_u64().unwrap() > killed_at
        });
    assert_eq!(next["id"], "c20", "the next best took over");
    let c20_at = next["t"].as_u64().unwrap();
    // Let c20 be a while into a term, then bring a better candidate.
    std::thread::sleep(Duration::from_millis(term_ms / 3));
    let joined_at = now_ms();
    fleet.spawn(setup, &cand("c40", 40.0), &shared);
    let c40 = shared.wait_for("c40 leading", Duration::from_millis(3 * term_ms + 10_000), |e| {
        e["kind"] == "enter" && e["id"] == "c40"
    });
    shared.stop();
    let stopped_at = now_ms();
    fleet.children.retain(|(id, _)| id != "c30");
    fleet.join(Duration::from_secs(30));
    let events = shared.events();
    assert_no_violation(&shared);
    let stepped = of_kind(&events, "cancelled")
        .into_iter()
        .find(|e| e["id"] == "c20" && e["t"].as_u64().unwrap() > c20_at)
        .expect("c20 stepped down");
    let stepped_at = stepped["t"].as_u64().unwrap();
    let exit = of_kind(&events, "exit").into_iter().find(|e| e["id"] == "c20").expect("c20 exit");
    assert_eq!(exit["end"], "SteppedDown");
    assert!(stepped_at >= joined_at, "c20 did not step down before c40 appeared");
    assert!(c40["t"].as_u64().unwrap() >= stepped_at, "c40 entered only after c20 stepped down");
    // At a term boundary: a whole number of terms after c20's claim.
    let held = stepped_at - c20_at;
    let off = held % term_ms;
    let off = off.min(term_ms - off);
    assert!(held + 300 >= term_ms && off <= 300, "c20 stepped down {held} ms into its leadership (term {term_ms} ms)");
    let mid_term = of_kind(&events, "enter")
        .into_iter()
        .filter(|e| e["id"] == "c10" && (top_at..stopped_at).contains(&e["t"].as_u64().unwrap()))
        .count();
    assert_eq!(mid_term, 0, "c10 never led once better candidates were there");
    eprintln!("{}: c20 stepped down {held} ms after its claim (term {term_ms} ms)", setup.backend);
}

/// A 10 ms job does not run twice within its minimum lease across contending processes.
pub fn min_lease(setup: &Setup, min_lease_ms: u64) {
    let _g = serial();
    let shared = Shared::new("minlease");
    let mut fleet = Fleet::new();
    for i in 0..3 {
        let role = Role {
            action_ms: 10,
            min_lease_ms,
            terms: 4,
            wait_ms: 3_000,
            ..Role::new("leader", &format!("m{i}"), "minlease")
        };
        fleet.spawn(setup, &role, &shared);
    }
    fleet.join(Duration::from_secs(60));
    assert_no_violation(&shared);
    let starts: Vec<u64> = of_kind(&shared.events(), "enter").iter().map(|e| e["t"].as_u64().unwrap()).collect();
    assert!(starts.len() >= 4);
    let gaps: Vec<u64> = starts.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(gaps.iter().all(|&g| g >= min_lease_ms), "runs {gaps:?} ms apart; minimum lease {min_lease_ms} ms");
    eprintln!("{}: 10 ms job runs {gaps:?} ms apart (minimum lease {min_lease_ms} ms)", setup.backend);
}

/// A leader frozen with SIGSTOP past its deadline: on thaw its cancellation has fired, it does
/// not act, and the fenced write it still attempts is refused.
pub fn frozen_leader(setup: &Setup) {
    let _g = serial();
    let shared = Shared::new("frozen");
    let mut fleet = Fleet::new();
    for i in 0..2 {
        let role = Role { action_ms: 60_000, wait_ms: 5_000, ..Role::new("frozen", &format!("f{i}"), "frozen") };
        fleet.spawn(setup, &role, &shared);
    }
    let act =
        shared.wait_for("a leader acting", Duration::from_secs(30), |e| e["kind"] == "act" && e["result"] == "Ok");
    let frozen = act["id"].as_str().unwrap().to_string();
    fleet.signal(&frozen, libc::SIGSTOP);
    let frozen_at = now_ms();
    shared.with_state(|s| s["holders"] = json!(0));
    let other = shared.wait_for("a new leader", Duration::from_millis(setup.lease_ms + setup.skew_ms + 10_000), |e| {
        e["kind"] == "act" && e["result"] == "Ok" && e["id"] != frozen.as_str()
    });
    // Taken before the signal: the thawed process may run before this thread does again.
    let thawed_at = now_ms();
    fleet.signal(&frozen, libc::SIGCONT);
    let zombie = shared.wait_for("the thawed leader's write", Duration::from_secs(10), |e| {
        e["kind"] == "zombie_write" && e["id"] == frozen.as_str()
    });
    shared.stop();
    fleet.join(Duration::from_secs(30));
    let events = shared.events();
    assert_eq!(zombie["result"], "Lost", "the fenced write of the frozen leader is refused");
    // The frozen term's cancellation (an earlier term of the same process may have ended too).
    let cancelled = of_kind(&events, "cancelled")
        .into_iter()
        .find(|e| e["id"] == frozen.as_str() && e["fence"] == act["fence"])
        .expect("cancelled");
    assert!(cancelled["t"].as_u64().unwrap() >= thawed_at);
    let late_acts: Vec<Value> = of_kind(&events, "act")
        .into_iter()
        .filter(|e| e["id"] == frozen.as_str() && e["fence"] == act["fence"] && e["t0"].as_u64().unwrap() > frozen_at)
        .collect();
    assert!(late_acts.is_empty(), "the frozen leader acted after its thaw: {late_acts:?}");
    assert!(other["fence"].as_u64() > act["fence"].as_u64());
}
