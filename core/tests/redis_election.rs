//! Election on the local Redis (`LEASELOCK_REDIS_URL`, started by scripts/with-services.sh):
//! the store's scripts, its typed errors, and the same contending processes as on DynamoDB.

mod election_support;
#[path = "local_engine/mod.rs"]
mod local_engine;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use election_support::{of_kind, Fleet, Role, Setup, Shared};
use leaselock::election::{Candidate, ElectionBackend};
use leaselock::redis::{RedisElection, RedisOptions, HOLD_OFF_HOLDER};
use leaselock::Error;
use serde_json::Value;

static NEXT: AtomicU32 = AtomicU32::new(0);

/// The body of every contender process these tests start.
#[test]
#[ignore = "run as a child process by the election tests"]
fn contender() {
    election_support::contender_main();
}

fn url() -> Option<String> {
    local_engine::redis(module_path!())
}

/// A key prefix no other test uses.
fn space() -> String {
    format!("t{}-{}-{}:", std::process::id(), NEXT.fetch_add(1, Ordering::SeqCst), election_support::now_ms())
}

fn options(lease_ms: u64) -> RedisOptions {
    RedisOptions::default()
        .lease(Duration::from_millis(lease_ms))
        .renew(Duration::from_millis(lease_ms / 4))
        .skew(Duration::from_millis(lease_ms / 10))
        .key_prefix(space())
}

/// Waits (polling, bounded) until the store accepts claims: a prefix's first use, like a loss,
/// holds claims off for one lease + skew.
async fn open(redis: &RedisElection) {
    let until = std::time::Instant::now() + redis.options().lease + redis.options().skew + Duration::from_secs(5);
    loop {
        let left = redis.claims_open_in().await.unwrap();
        if left.is_zero() {
            return;
        }
        assert!(std::time::Instant::now() < until, "claims still held off");
        tokio::time::sleep(left.min(Duration::from_millis(50))).await;
    }
}

async fn redis_cli(url: &str, args: &[&str]) -> String {
    let port = url.rsplit(':').next().unwrap().trim_end_matches('/').to_string();
    let out = tokio::process::Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port])
        .args(args)
        .output()
        .await
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[tokio::test]
async fn claims_fence_renew_release_and_slots() {
    let Some(url) = url() else { return };
    let redis = RedisElection::connect(&url, options(2_000)).await.unwrap();
    open(&redis).await;
    let a = redis.claim("leader/job", "a").await.unwrap();
    // The server's clock in microseconds (2020 or later).
    assert!(a.fence > 1_577_836_800_000_000, "{}", a.fence);
    match redis.claim("leader/job", "b").await {
        Err(Error::Held { owner, expires_at_ms }) => {
            assert_eq!(owner, "a");
            assert!(expires_at_ms >= a.expires_at_ms - 50);
        }
        other => panic!("held: {other:?}"),
    }
    let mut renewed = a.clone();
    redis.renew(&mut renewed).await.unwrap();
    assert!(renewed.deadline_mono_ms >= a.deadline_mono_ms);
    redis.fenced_set(&renewed, "out", "1").await.unwrap();
    redis.release(&renewed).await.unwrap();
    assert!(matches!(redis.release(&renewed).await, Err(Error::Lost { .. })));
    assert!(matches!(redis.fenced_set(&renewed, "out", "2").await, Err(Error::Lost { .. })));
    assert_eq!(redis.get_value("out").await.unwrap().as_deref(), Some("1"));
    let b = redis.claim("leader/job", "b").await.unwrap();
    assert!(b.fence > a.fence);
    let mut stale = a.clone();
    assert!(matches!(redis.renew(&mut stale).await, Err(Error::Lost { .. })), "a renewal by an old holder is refused");

    let owners = ["w0", "w1", "w2"];
    let s: Vec<_> = futures::future::join_all(owners.iter().map(|o| redis.claim_slot("group/g", 2, o))).await;
    let held: Vec<_> = s.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(held.len(), 2);
    assert!(s.iter().any(|r| matches!(r, Err(Error::Held { .. }))));
    let mut slots: Vec<u32> = held.iter().map(|l| leaselock::election::slot_of(&l.id).unwrap()).collect();
    slots.sort();
    assert_eq!(slots, [0, 1]);
    let mut first = held[0].clone();
    redis.renew(&mut first).await.unwrap();
    redis.release(&first).await.unwrap();
    let again = redis.claim_slot("group/g", 2, "w9").await.unwrap();
    assert_eq!(leaselock::election::slot_of(&again.id), leaselock::election::slot_of(&first.id));
}

#[tokio::test]
async fn an_expired_lease_is_claimable_by_the_servers_clock() {
    let Some(url) = url() else { return };
    let redis = RedisElection::connect(&url, options(600)).await.unwrap();
    open(&redis).await;
    let a = redis.claim("leader/x", "a").await.unwrap();
    let s = redis.claim_slot("group/x", 1, "a").await.unwrap();
    let until = std::time::Instant::now() + Duration::from_secs(5);
    let b = loop {
        match redis.claim("leader/x", "b").await {
            Ok(b) => break b,
            Err(Error::Held { .. }) => {
                assert!(std::time::Instant::now() < until);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert!(b.fence > a.fence);
    let t = redis.claim_slot("group/x", 1, "b").await.unwrap();
    assert!(t.fence > s.fence);
    let mut late = s.clone();
    assert!(matches!(redis.renew(&mut late).await, Err(Error::Lost { .. })));
}

#[tokio::test]
async fn the_candidate_registry_lists_live_candidates() {
    let Some(url) = url() else { return };
    let redis = RedisElection::connect(&url, options(2_000)).await.unwrap();
    redis.register("candidates/c", &Candidate::new("a", 1.0).meta("zone", "z"), Duration::from_secs(5)).await.unwrap();
    redis.register("candidates/c", &Candidate::new("b", 2.0).load(0.3), Duration::from_millis(200)).await.unwrap();
    let all = redis.candidates("candidates/c").await.unwrap();
    assert_eq!(all.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(), ["a", "b"]);
    assert_eq!(all[0].metadata["zone"], "z");
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while redis.candidates("candidates/c").await.unwrap().len() != 1 {
        assert!(std::time::Instant::now() < until, "b never ran out");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    redis.withdraw("candidates/c", "a").await.unwrap();
    assert!(redis.candidates("candidates/c").await.unwrap().is_empty());
}

#[tokio::test]
async fn failures_are_typed_errors() {
    let Some(url) = url() else { return };
    // Nothing listens: unreachable.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let err = RedisElection::connect(&format!("redis://127.0.0.1:{port}"), options(2_000)).await.unwrap_err();
    assert_eq!(err.kind(), "Unreachable", "{err}");
    // Something accepts but never answers: a timeout.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = silent.local_addr().unwrap().port();
    let keep = tokio::spawn(async move {
        let mut held = Vec::new();
        loop {
            let (s, _) = silent.accept().await.unwrap();
            held.push(s);
        }
    });
    let opts = RedisOptions {
        response_timeout: Duration::from_millis(300),
        connect_timeout: Duration::from_millis(300),
        ..options(2_000)
    };
    let err = match RedisElection::connect(&format!("redis://127.0.0.1:{port}"), opts).await {
        Err(e) => e,
        Ok(r) => r.claim("leader/t", "a").await.unwrap_err(),
    };
    assert_eq!(err.kind(), "Timeout", "{err}");
    keep.abort();
    // A key of the wrong type makes the script fail: a script error, not a lease answer.
    let redis = RedisElection::connect(&url, options(2_000)).await.unwrap();
    let key = format!("{}leader/typed", redis.options().key_prefix);
    redis_cli(&url, &["HSET", &key, "f", "v"]).await;
    let err = redis.renew(&mut redis_lease(&key)).await.unwrap_err();
    assert_eq!(err.kind(), "Script", "{err}");
    redis_cli(&url, &["DEL", &key]).await;
    // A server with a password: a wrong one is refused as access denied.
    let Some(server) = PasswordServer::start() else { return };
    let wrong =
        RedisElection::connect(&format!("redis://:nope@127.0.0.1:{}", server.port), options(2_000)).await.unwrap_err();
    assert_eq!(wrong.kind(), "AccessDenied", "{wrong}");
    let none = RedisElection::connect(&format!("redis://127.0.0.1:{}", server.port), options(2_000)).await;
    let denied = match none {
        Err(e) => e,
        Ok(r) => r.claim("leader/p", "a").await.unwrap_err(),
    };
    assert_eq!(denied.kind(), "AccessDenied", "{denied}");
    let right =
        RedisElection::connect(&format!("redis://:s3cret@127.0.0.1:{}", server.port), options(2_000)).await.unwrap();
    open(&right).await;
    right.claim("leader/p", "a").await.unwrap();
}

fn redis_lease(key: &str) -> leaselock::Lease {
    leaselock::Lease {
        id: key.split_once(':').map(|(_, k)| k).unwrap_or(key).to_string(),
        owner: "a".into(),
        fence: 1,
        expires_at_ms: 0,
        last_seq: None,
        url: None,
        desired_state: None,
        deadline_mono_ms: u64::MAX,
    }
}

/// A throwaway redis-server with a password, stopped (by pid) when dropped.
struct PasswordServer {
    port: u16,
    child: std::process::Child,
}

impl PasswordServer {
    fn start() -> Option<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0").ok()?.local_addr().ok()?.port();
        let child = std::process::Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string(), "--save", "", "--appendonly", "no"])
            .args(["--requirepass", "s3cret"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .ok()?;
        let until = std::time::Instant::now() + Duration::from_secs(5);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(std::time::Instant::now() < until, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(Self { port, child })
    }
}

impl Drop for PasswordServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn setup() -> Option<Setup> {
    url()?;
    Some(Setup { backend: "redis", space: space(), lease_ms: 1_500, renew_ms: 400, skew_ms: 300, retry_ms: 100 })
}

#[test]
fn redis_200_terms_across_processes_never_two_leaders() {
    let Some(setup) = setup() else { return };
    election_support::leader_terms(&Setup { retry_ms: 40, ..setup }, 3, 200);
}

#[test]
fn redis_killed_leader_is_replaced_in_time() {
    let Some(setup) = setup() else { return };
    election_support::killed_leader_replaced(&setup);
}

#[test]
fn redis_group_never_exceeds_its_slots() {
    let Some(setup) = setup() else { return };
    election_support::group_limit(&setup, 3);
}

#[test]
fn redis_strategic_election_hands_over_at_term_boundaries() {
    let Some(setup) = setup() else { return };
    election_support::strategic(&setup, 1_500);
}

#[test]
fn redis_minimum_lease_across_processes() {
    let Some(setup) = setup() else { return };
    election_support::min_lease(&setup, 2_500);
}

#[test]
fn redis_frozen_leader_is_cancelled_and_fenced_off() {
    let Some(setup) = setup() else { return };
    election_support::frozen_leader(&setup);
}

#[tokio::test]
async fn a_lost_state_holds_claims_off_and_fences_keep_rising() {
    let Some(url) = url() else { return };
    let redis = RedisElection::connect(&url, options(1_000)).await.unwrap();
    open(&redis).await;
    let a = redis.claim("leader/s", "a").await.unwrap();
    // The prefix's keys vanish, marker included, as in a restart without persistence.
    let prefix = redis.options().key_prefix.clone();
    let gone = [format!("{prefix}incarnation"), format!("{prefix}leader/s"), format!("{prefix}leader/s:fence")];
    let mut del = vec!["DEL"];
    del.extend(gone.iter().map(String::as_str));
    assert_eq!(redis_cli(&url, &del).await, "3");
    // The holder's renewal finds its key gone: lost at once.
    assert!(matches!(redis.renew(&mut a.clone()).await, Err(Error::Lost { .. })));
    // That script noticed the loss: claims are held off for lease + skew from then, for every process.
    let other = RedisElection::connect(&url, redis.options().clone()).await.unwrap();
    match other.claim("leader/s", "b").await {
        Err(Error::Held { owner, .. }) => assert_eq!(owner, HOLD_OFF_HOLDER),
        r => panic!("a claim during the hold-off: {r:?}"),
    }
    let (left_a, left_b) = (redis.claims_open_in().await.unwrap(), other.claims_open_in().await.unwrap());
    assert!(left_a > Duration::ZERO && left_a <= Duration::from_millis(1_100), "{left_a:?}");
    assert!(left_b <= left_a && left_a - left_b < Duration::from_millis(200), "{left_a:?} {left_b:?}");
    assert!(matches!(other.claim_slot("group/s", 2, "b").await, Err(Error::Held { .. })), "slots too");
    open(&other).await;
    let b = other.claim("leader/s", "b").await.unwrap();
    assert!(b.fence > a.fence, "{} after {}", b.fence, a.fence);
    // Another server run with the marker still there (a failover, an older snapshot): a loss too.
    other.release(&b).await.unwrap();
    redis_cli(&url, &["HSET", &gone[0], "run", "another-run"]).await;
    assert!(matches!(other.claim("leader/s", "c").await, Err(Error::Held { .. })));
    assert!(other.claims_open_in().await.unwrap() > Duration::from_millis(900));
}

/// A redis-server of the test's own, without persistence: SIGKILLed and started again empty.
struct OwnServer {
    port: u16,
    child: Option<std::process::Child>,
}

impl OwnServer {
    fn start(port: u16) -> Self {
        let mut server = OwnServer { port, child: None };
        server.restart();
        server
    }

    /// Starts the server (empty) and waits (polling, bounded) until it answers PING.
    fn restart(&mut self) {
        assert!(self.child.is_none());
        let child = std::process::Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string(), "--save", "", "--appendonly", "no"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server");
        self.child = Some(child);
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while !self.answers() {
            assert!(std::time::Instant::now() < until, "redis-server on {} did not answer", self.port);
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn answers(&self) -> bool {
        use std::io::{Read, Write};
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.port)) else { return false };
        let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
        let mut buf = [0u8; 7];
        s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    fn exists(&self, key: &str) -> bool {
        let out = std::process::Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "EXISTS", key])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim() == "1"
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Four contending processes while their Redis is SIGKILLed and started again empty, 12 times
/// (every fourth time twice in a row, the second during the hold-off the first one started):
/// never two leaders, fences strictly increasing across every restart, and a leader again within
/// lease + skew + 1 s of each restart.
#[test]
fn redis_losing_its_state_never_makes_two_leaders() {
    if url().is_none() {
        return;
    }
    let _serial = election_support::SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    const PORT: u16 = 6433;
    const RESTARTS: usize = 12;
    let setup = Setup { backend: "redis", space: space(), lease_ms: 1_500, renew_ms: 400, skew_ms: 300, retry_ms: 100 };
    let mut server = OwnServer::start(PORT);
    let shared = Shared::new("state-loss");
    let mut fleet = Fleet::new();
    fleet.env.push(("LEASELOCK_REDIS_URL".into(), format!("redis://127.0.0.1:{PORT}")));
    for i in 0..4 {
        let role = Role { action_ms: 700, wait_ms: 1_000, ..Role::new("leader", &format!("s{i}"), "state-loss") };
        fleet.spawn(&setup, &role, &shared);
    }
    let first = shared.wait_for("a first leader", Duration::from_secs(30), |e| e["kind"] == "enter");
    let mut since = first["t"].as_u64().unwrap();
    let bound = setup.lease_ms + setup.skew_ms + 1_000;
    let marker = format!("{}incarnation", setup.space);
    let (mut resumed, mut kills) = (Vec::new(), 0);
    for i in 0..RESTARTS {
        // Into a term, at a different point each time.
        let into = (i as u64 * 373) % 900;
        shared.wait_for("a term to be under way", Duration::from_secs(10), |e| {
            e["kind"] == "enter"
                && e["t"].as_u64().unwrap() + into <= election_support::now_ms()
                && e["t"].as_u64() >= Some(since)
        });
        server.kill();
        kills += 1;
        server.restart();
        if i % 4 == 3 {
            // Once a contender has noticed (the marker is back), lose everything again.
            let until = std::time::Instant::now() + Duration::from_secs(5);
            while !server.exists(&marker) {
                assert!(std::time::Instant::now() < until, "nobody noticed the restart");
                std::thread::sleep(Duration::from_millis(10));
            }
            server.kill();
            kills += 1;
            server.restart();
        }
        let ready = election_support::now_ms();
        let next = shared.wait_for("a leader after the restart", Duration::from_millis(bound + 10_000), |e| {
            e["kind"] == "enter" && e["t"].as_u64().unwrap() > ready
        });
        since = next["t"].as_u64().unwrap();
        resumed.push(since - ready);
    }
    shared.stop();
    fleet.join(Duration::from_secs(30));
    server.kill();
    let events = shared.events();
    let unsafe_: Vec<Value> = of_kind(&events, "violation")
        .into_iter()
        .filter(|e| e["what"] == "overlap" || e["what"] == "fence order")
        .collect();
    assert!(unsafe_.is_empty(), "violations: {unsafe_:?}");
    let enters = of_kind(&events, "enter");
    let fences: Vec<u64> = enters.iter().map(|e| e["fence"].as_u64().unwrap()).collect();
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "fences in order of entry: {fences:?}");
    let most = enters.iter().map(|e| e["holders"].as_u64().unwrap()).max().unwrap();
    assert_eq!(most, 1, "one leader at a time");
    let lost = of_kind(&events, "exit").iter().filter(|e| e["end"] == "Lost").count();
    let slowest = *resumed.iter().max().unwrap();
    eprintln!(
        "redis state loss: {kills} SIGKILLs in {RESTARTS} restarts, {} terms by {:?}, 0 overlaps, fences strictly \
         increasing, {lost} terms ended by the loss; leader again after {resumed:?} ms (slowest {slowest}, bound \
         {bound})",
        enters.len(),
        election_support::terms_by_id(&events),
    );
    assert!(slowest <= bound, "a leader again after {slowest} ms; bound lease + skew + 1 s = {bound} ms");
}
