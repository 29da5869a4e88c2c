//! The Redis election store: a leader is a token-owned key (`SET NX PX` with the token
//! `{owner}|{fence}`), renewed and released by compare-and-extend / compare-and-delete scripts;
//! every claim's fence is `max(server TIME in µs, the key's last fence + 1)` (the last one kept
//! in `{key}:fence`); a group's slots are the members of a sorted set scored by their expiry on
//! the server's `TIME`; candidates live in a hash, each entry with its own expiry. Every decision
//! is made by one script on the server, against the server's clock, so clients' clocks never
//! decide who holds a lease.
//!
//! The server may lose its state (a restart without persistence, an older snapshot, a failover
//! to a replica behind, `FLUSHALL`): every script notices it from a marker key and refuses
//! claims for one lease + skew afterwards, so no holder of the lost state still acts when a new
//! one is elected, and fences stay above every fence issued before ([`incarnation`]). The server's
//! clock must not step back by more than the time a restart (plus that hold-off) takes.
//!
//! ```no_run
//! # async fn demo() -> leaselock::Result<()> {
//! use std::sync::Arc;
//! use leaselock::election::{ElectionOptions, LeaderElector};
//! use leaselock::redis::{RedisElection, RedisOptions};
//!
//! let redis = RedisElection::connect("redis://127.0.0.1:6379", RedisOptions::default()).await?;
//! let elector = LeaderElector::new(Arc::new(redis), "host-a", ElectionOptions::default())?;
//! elector.run_if_leader("nightly-report", |term| async move { term.fence() }).await?;
//! # Ok(()) }
//! ```

pub mod incarnation;

use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisError, Script};
use tracing::{debug, warn};

use crate::election::{slot_id, slot_of, Candidate, ElectionBackend, Timing};
use crate::{Clock, Error, Lease, Result, SystemClock};

/// The marker of a prefix's keys (see [`incarnation`]): a hash without expiry, `{prefix}incarnation`.
const MARKER: &str = "incarnation";

/// Connection and lease settings of a [`RedisElection`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisOptions {
    /// How long a claim or renewal holds (default 20 s).
    pub lease: Duration,
    /// How often a holder renews (default 5 s).
    pub renew: Duration,
    /// Taken off the holder's own deadline (default 1 s): the server's expiry decides claims,
    /// the skew covers the holder's clock running slow against it.
    pub skew: Duration,
    /// Prepended to every Redis key.
    pub key_prefix: String,
    /// How long one command may take before it counts as timed out (default 2 s).
    pub response_timeout: Duration,
    /// How long connecting may take (default 2 s).
    pub connect_timeout: Duration,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(20),
            renew: Duration::from_secs(5),
            skew: Duration::from_secs(1),
            key_prefix: "leaselock:".into(),
            response_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(2),
        }
    }
}

impl RedisOptions {
    pub fn lease(mut self, d: Duration) -> Self {
        self.lease = d;
        self
    }

    pub fn renew(mut self, d: Duration) -> Self {
        self.renew = d;
        self
    }

    pub fn skew(mut self, d: Duration) -> Self {
        self.skew = d;
        self
    }

    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    pub fn response_timeout(mut self, d: Duration) -> Self {
        self.response_timeout = d;
        self
    }

    /// The same timing rules as a lease table's.
    pub fn validate(&self) -> Result<()> {
        for (field, d) in [("lease", self.lease), ("renew", self.renew), ("skew", self.skew)] {
            crate::config::validate_duration(field, d)?;
        }
        crate::config::validate_key_prefix("key_prefix", &self.key_prefix)?;
        if self.skew.is_zero() {
            return Err(Error::invalid("skew", "must be greater than zero"));
        }
        if self.lease <= self.skew * 2 {
            return Err(Error::invalid(
                "lease",
                format!("{:?} must be greater than 2 x skew ({:?})", self.lease, self.skew),
            ));
        }
        if self.renew.is_zero() || self.renew >= self.lease - self.skew {
            return Err(Error::invalid("renew", "must be greater than zero and less than lease - skew"));
        }
        Ok(())
    }
}

/// First thing in every script: the server's clock (`now` in ms, `us` in µs), then the state-loss
/// check of [`incarnation::check`] on the marker `KEYS[1]`, with the caller's server run id
/// `ARGV[1]` and hold-off `ARGV[2]` (ms): a missing marker or another run id is a loss, noticed
/// now. `open_at` is when claims are accepted again. `fmt` prints a number as an integer (Lua's
/// `tostring` would round a µs time to 14 digits).
const PRELUDE: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local function fmt(n) return string.format('%.0f', n) end
local open_at
local mark = redis.call('HMGET', KEYS[1], 'run', 'lost')
if mark[1] ~= ARGV[1] then
  redis.call('HSET', KEYS[1], 'run', ARGV[1], 'lost', fmt(now))
  open_at = now + tonumber(ARGV[2])
else
  open_at = tonumber(mark[2] or 0) + tonumber(ARGV[2])
end
-- incarnation::next_fence: the clock in µs, or the key's last fence + 1 when higher.
local function next_fence(key)
  local f = fmt(math.max(us, tonumber(redis.call('GET', key) or 0) + 1))
  redis.call('SET', key, f)
  return f
end
"#;

/// KEYS: marker. Claims open at, server now.
const STATE: &str = r#"
return {'ok', fmt(open_at), fmt(now)}
"#;

/// KEYS: marker, lease, fence. ARGV: run, hold-off, owner, lease ms.
const CLAIM: &str = r#"
if now < open_at then return {'wait', fmt(open_at)} end
local cur = redis.call('GET', KEYS[2])
if cur then return {'held', cur, fmt(now + redis.call('PTTL', KEYS[2]))} end
local fence = next_fence(KEYS[3])
redis.call('SET', KEYS[2], ARGV[3] .. '|' .. fence, 'NX', 'PX', ARGV[4])
return {'ok', fence, fmt(now + tonumber(ARGV[4]))}
"#;

/// Compare-and-extend. KEYS: marker, lease. ARGV: run, hold-off, token, lease ms.
const RENEW: &str = r#"
if redis.call('GET', KEYS[2]) ~= ARGV[3] then return {'lost'} end
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return {'ok', fmt(now + tonumber(ARGV[4]))}
"#;

/// Compare-and-delete. KEYS: marker, lease. ARGV: run, hold-off, token.
const RELEASE: &str = r#"
if redis.call('GET', KEYS[2]) ~= ARGV[3] then return {'lost'} end
redis.call('DEL', KEYS[2])
return {'ok'}
"#;

/// KEYS: marker, group set, fence. ARGV: run, hold-off, owner, slots, lease ms. Members are
/// `slot|owner|fence`.
const CLAIM_SLOT: &str = r#"
if now < open_at then return {'wait', fmt(open_at)} end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local members = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
local used = {}
for i = 1, #members, 2 do
  local slot = string.match(members[i], '^(%d+)|')
  if slot then used[tonumber(slot)] = true end
end
for s = 0, tonumber(ARGV[4]) - 1 do
  if not used[s] then
    local fence = next_fence(KEYS[3])
    local exp = now + tonumber(ARGV[5])
    redis.call('ZADD', KEYS[2], exp, s .. '|' .. ARGV[3] .. '|' .. fence)
    redis.call('PEXPIRE', KEYS[2], ARGV[5])
    return {'ok', fence, fmt(exp), tostring(s)}
  end
end
return {'held', members[1], members[2]}
"#;

/// KEYS: marker, group set. ARGV: run, hold-off, member, lease ms.
const RENEW_SLOT: &str = r#"
local score = redis.call('ZSCORE', KEYS[2], ARGV[3])
if (not score) or tonumber(score) <= now then return {'lost'} end
local exp = now + tonumber(ARGV[4])
redis.call('ZADD', KEYS[2], 'XX', exp, ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return {'ok', fmt(exp)}
"#;

/// KEYS: marker, group set. ARGV: run, hold-off, member.
const RELEASE_SLOT: &str = r#"
local score = redis.call('ZSCORE', KEYS[2], ARGV[3])
if (not score) or tonumber(score) <= now then return {'lost'} end
redis.call('ZREM', KEYS[2], ARGV[3])
return {'ok'}
"#;

/// KEYS: marker, candidates hash. ARGV: run, hold-off, id, ttl ms, candidate JSON. Entries are
/// `expiry|json`. Not held off: a registration claims nothing (the candidate's claim of the
/// leader key is).
const REGISTER: &str = r#"
redis.call('HSET', KEYS[2], ARGV[3], fmt(now + tonumber(ARGV[4])) .. '|' .. ARGV[5])
if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[4]) then redis.call('PEXPIRE', KEYS[2], ARGV[4]) end
return {'ok'}
"#;

/// KEYS: marker, candidates hash. Drops entries that ran out, returns the others.
const CANDIDATES: &str = r#"
local all = redis.call('HGETALL', KEYS[2])
local out = {'ok'}
for i = 1, #all, 2 do
  local exp = tonumber(string.match(all[i + 1], '^(%d+)|'))
  if exp and exp > now then
    table.insert(out, all[i + 1])
  else
    redis.call('HDEL', KEYS[2], all[i])
  end
end
return out
"#;

/// KEYS: marker, lease (or group set), target. ARGV: run, hold-off, token (or member), is_slot,
/// value.
const FENCED_SET: &str = r#"
local held
if ARGV[4] == '1' then
  local score = redis.call('ZSCORE', KEYS[2], ARGV[3])
  held = score and tonumber(score) > now
else
  held = redis.call('GET', KEYS[2]) == ARGV[3]
end
if not held then return {'lost'} end
redis.call('SET', KEYS[3], ARGV[5])
return {'ok'}
"#;

struct Scripts {
    claim: Script,
    renew: Script,
    release: Script,
    claim_slot: Script,
    renew_slot: Script,
    release_slot: Script,
    register: Script,
    candidates: Script,
    fenced_set: Script,
    state: Script,
}

impl Scripts {
    fn new() -> Self {
        let s = |body: &str| Script::new(&format!("{PRELUDE}{body}"));
        Self {
            claim: s(CLAIM),
            renew: s(RENEW),
            release: s(RELEASE),
            claim_slot: s(CLAIM_SLOT),
            renew_slot: s(RENEW_SLOT),
            release_slot: s(RELEASE_SLOT),
            register: s(REGISTER),
            candidates: s(CANDIDATES),
            fenced_set: s(FENCED_SET),
            state: s(STATE),
        }
    }
}

/// Leader, group and candidate leases on one Redis server.
#[derive(Clone)]
pub struct RedisElection {
    link: Arc<Link>,
    options: RedisOptions,
    clock: Arc<dyn Clock>,
    scripts: Arc<Scripts>,
}

impl std::fmt::Debug for RedisElection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisElection").field("options", &self.options).finish()
    }
}

/// A claim refused while claims are held off after a loss: held until they open again.
fn held_off(out: &[String]) -> Error {
    Error::Held { owner: HOLD_OFF_HOLDER.into(), expires_at_ms: num(out.get(1)).unwrap_or(0) }
}

/// Maps a Redis failure to what happened; `write` says whether the command may have been applied.
pub fn redis_error(e: &RedisError, write: bool) -> Error {
    let text = e.to_string();
    let code = e.code().unwrap_or_default();
    if e.is_timeout() {
        Error::Timeout { outcome_unknown: write }
    } else if e.kind() == redis::ErrorKind::AuthenticationFailed || matches!(code, "NOAUTH" | "WRONGPASS" | "NOPERM") {
        Error::AccessDenied(text)
    } else if e.is_connection_refusal() || e.is_io_error() || e.is_connection_dropped() {
        Error::Unreachable(text)
    } else if matches!(code, "NOSCRIPT" | "BUSY" | "WRONGTYPE")
        || e.detail().is_some_and(|d| d.contains("script") || d.contains("@user_script"))
    {
        Error::Script(text)
    } else {
        Error::Store(text)
    }
}

fn num(v: Option<&String>) -> Result<u64> {
    v.and_then(|s| s.parse::<u64>().ok().or_else(|| s.parse::<f64>().ok().map(|f| f as u64)))
        .ok_or_else(|| Error::Store("unexpected script answer".into()))
}

/// The holder a claim refused during a hold-off reports.
pub const HOLD_OFF_HOLDER: &str = "(hold-off after a Redis state loss)";

/// A connection and the run id of the server process it reached.
#[derive(Clone)]
struct Connected {
    conn: MultiplexedConnection,
    run_id: Arc<str>,
    generation: u64,
}

/// The connection to the server, opened again after it broke (a restarted server is a new
/// process with a new run id, read once per connection).
struct Link {
    client: redis::Client,
    config: AsyncConnectionConfig,
    current: std::sync::Mutex<Option<Connected>>,
    connecting: tokio::sync::Mutex<u64>,
}

impl Link {
    async fn get(&self) -> Result<Connected> {
        if let Some(c) = self.current.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            return Ok(c);
        }
        let mut generation = self.connecting.lock().await;
        if let Some(c) = self.current.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            return Ok(c);
        }
        let mut conn = self
            .client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await
            .map_err(|e| redis_error(&e, false))?;
        let run_id = server_run_id(&mut conn).await?;
        *generation += 1;
        let c = Connected { conn, run_id: run_id.into(), generation: *generation };
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = Some(c.clone());
        Ok(c)
    }

    /// Drops the connection `c` after it failed so the next call opens a new one (unless a
    /// newer one is already in place).
    fn broken(&self, c: &Connected, e: &RedisError) {
        if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() || e.is_timeout() {
            let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
            if current.as_ref().is_some_and(|now| now.generation == c.generation) {
                debug!(error = %e, "redis connection dropped; reconnecting on the next call");
                *current = None;
            }
        }
    }
}

/// The server's run id (`INFO server`): a restarted server, or another one after a failover,
/// has another. A user not allowed `INFO` gets an empty run id: a missing marker is then the
/// only sign of a loss.
async fn server_run_id(conn: &mut MultiplexedConnection) -> Result<String> {
    match redis::cmd("INFO").arg("server").query_async::<String>(conn).await {
        Ok(info) => info
            .lines()
            .find_map(|l| l.strip_prefix("run_id:"))
            .map(|id| id.trim().to_string())
            .ok_or_else(|| Error::Store("INFO server has no run_id".into())),
        Err(e) if e.code() == Some("NOPERM") => {
            warn!("INFO is not allowed: a restart from a snapshot or a failover is not detected");
            Ok(String::new())
        }
        Err(e) => Err(redis_error(&e, false)),
    }
}

impl RedisElection {
    /// Connects to `url` (`redis://[user:password@]host:port[/db]`).
    pub async fn connect(url: &str, options: RedisOptions) -> Result<Self> {
        options.validate()?;
        let client = redis::Client::open(url).map_err(|e| Error::invalid("redis url", e))?;
        let config = AsyncConnectionConfig::new()
            .set_response_timeout(Some(options.response_timeout))
            .set_connection_timeout(Some(options.connect_timeout));
        let link =
            Link { client, config, current: std::sync::Mutex::new(None), connecting: tokio::sync::Mutex::new(0) };
        link.get().await?;
        Ok(Self { link: Arc::new(link), options, clock: Arc::new(SystemClock), scripts: Arc::new(Scripts::new()) })
    }

    pub fn options(&self) -> &RedisOptions {
        &self.options
    }

    fn key(&self, key: &str) -> String {
        format!("{}{key}", self.options.key_prefix)
    }

    /// How long claims are refused after a loss was noticed.
    fn hold_off_ms(&self) -> u64 {
        incarnation::hold_off_ms(self.timing().lease_ms(), self.timing().skew_ms())
    }

    /// Runs `script` in one round trip, with the marker and the state-loss check's arguments
    /// in front of the script's own keys and arguments.
    async fn run(&self, script: &Script, keys: &[String], args: &[String], write: bool) -> Result<Vec<String>> {
        let c = self.link.get().await?;
        let mut inv = script.prepare_invoke();
        inv.key(self.key(MARKER));
        for k in keys {
            inv.key(k);
        }
        inv.arg(&*c.run_id).arg(self.hold_off_ms());
        for a in args {
            inv.arg(a);
        }
        let mut conn = c.conn.clone();
        inv.invoke_async(&mut conn).await.map_err(|e| {
            self.link.broken(&c, &e);
            redis_error(&e, write)
        })
    }

    /// How long claims are still refused after the server lost its state (zero when they are
    /// accepted). Like every operation, this notices a loss and starts the hold-off.
    pub async fn claims_open_in(&self) -> Result<Duration> {
        let out = self.run(&self.scripts.state, &[], &[], true).await?;
        Ok(Duration::from_millis(num(out.get(1))?.saturating_sub(num(out.get(2))?)))
    }

    fn lease(&self, id: &str, owner: &str, fence: u64, expires_at_ms: u64, sent_mono: u64) -> Lease {
        Lease {
            id: id.to_string(),
            owner: owner.to_string(),
            fence,
            expires_at_ms,
            last_seq: None,
            url: None,
            desired_state: None,
            deadline_mono_ms: sent_mono + self.timing().lease_ms() - self.timing().skew_ms(),
        }
    }

    /// The stored key and the token (or set member) of a lease.
    fn token(&self, lease: &Lease) -> (String, String, bool) {
        match slot_of(&lease.id) {
            Some(slot) => {
                let group = lease.id.rsplit_once("#slot-").map(|(g, _)| g).unwrap_or(&lease.id);
                (self.key(group), format!("{slot}|{}|{}", lease.owner, lease.fence), true)
            }
            None => (self.key(&lease.id), format!("{}|{}", lease.owner, lease.fence), false),
        }
    }

    /// Sets `key` (prefixed) to `value` only while `lease` is still held: `Lost` otherwise. A
    /// holder resumed after a pause past its lease cannot write any more.
    pub async fn fenced_set(&self, lease: &Lease, key: &str, value: &str) -> Result<()> {
        let (lease_key, token, slot) = self.token(lease);
        let args = [token, if slot { "1" } else { "0" }.to_string(), value.to_string()];
        let out = self.run(&self.scripts.fenced_set, &[lease_key, self.key(key)], &args, true).await?;
        match out.first().map(String::as_str) {
            Some("ok") => Ok(()),
            _ => Err(Error::Lost { id: lease.id.clone() }),
        }
    }

    /// Reads a plain key (prefixed), as [`fenced_set`](Self::fenced_set) wrote it.
    pub async fn get_value(&self, key: &str) -> Result<Option<String>> {
        let c = self.link.get().await?;
        let mut conn = c.conn.clone();
        redis::cmd("GET").arg(self.key(key)).query_async(&mut conn).await.map_err(|e| {
            self.link.broken(&c, &e);
            redis_error(&e, false)
        })
    }
}

#[async_trait::async_trait]
impl ElectionBackend for RedisElection {
    fn timing(&self) -> Timing {
        Timing { lease: self.options.lease, renew: self.options.renew, skew: self.options.skew }
    }

    fn clock(&self) -> &dyn Clock {
        &*self.clock
    }

    async fn claim(&self, key: &str, owner: &str) -> Result<Lease> {
        crate::config::validate_id("owner", owner)?;
        let sent = self.clock.monotonic_ms();
        let keys = [self.key(key), self.key(&format!("{key}:fence"))];
        let args = [owner.to_string(), self.timing().lease_ms().to_string()];
        let out = self.run(&self.scripts.claim, &keys, &args, true).await?;
        match out.first().map(String::as_str) {
            Some("ok") => Ok(self.lease(key, owner, num(out.get(1))?, num(out.get(2))?, sent)),
            Some("wait") => Err(held_off(&out)),
            _ => {
                let holder = out.get(1).and_then(|t| t.rsplit_once('|')).map(|(o, _)| o.to_string());
                Err(Error::Held { owner: holder.unwrap_or_default(), expires_at_ms: num(out.get(2)).unwrap_or(0) })
            }
        }
    }

    async fn claim_slot(&self, key: &str, slots: u32, owner: &str) -> Result<Lease> {
        crate::config::validate_id("owner", owner)?;
        crate::election::validate_slots(slots)?;
        let sent = self.clock.monotonic_ms();
        let keys = [self.key(key), self.key(&format!("{key}:fence"))];
        let args = [owner.to_string(), slots.to_string(), self.timing().lease_ms().to_string()];
        let out = self.run(&self.scripts.claim_slot, &keys, &args, true).await?;
        match out.first().map(String::as_str) {
            Some("ok") => {
                let slot = num(out.get(3))? as u32;
                Ok(self.lease(&slot_id(key, slot), owner, num(out.get(1))?, num(out.get(2))?, sent))
            }
            Some("wait") => Err(held_off(&out)),
            _ => {
                let holder = out.get(1).and_then(|m| m.split('|').nth(1)).map(str::to_string);
                Err(Error::Held { owner: holder.unwrap_or_default(), expires_at_ms: num(out.get(2)).unwrap_or(0) })
            }
        }
    }

    async fn renew(&self, lease: &mut Lease) -> Result<()> {
        let sent = self.clock.monotonic_ms();
        if lease.is_past_deadline(sent) {
            return Err(Error::Lost { id: lease.id.clone() });
        }
        let (key, token, slot) = self.token(lease);
        let script = if slot { &self.scripts.renew_slot } else { &self.scripts.renew };
        let out = self.run(script, &[key], &[token, self.timing().lease_ms().to_string()], true).await?;
        match out.first().map(String::as_str) {
            Some("ok") => {
                *lease = self.lease(&lease.id, &lease.owner, lease.fence, num(out.get(1))?, sent);
                Ok(())
            }
            _ => Err(Error::Lost { id: lease.id.clone() }),
        }
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let (key, token, slot) = self.token(lease);
        let script = if slot { &self.scripts.release_slot } else { &self.scripts.release };
        let out = self.run(script, &[key], &[token], true).await?;
        match out.first().map(String::as_str) {
            Some("ok") => Ok(()),
            _ => Err(Error::Lost { id: lease.id.clone() }),
        }
    }

    async fn register(&self, election: &str, candidate: &Candidate, ttl: Duration) -> Result<()> {
        candidate.validate()?;
        let json = serde_json::to_string(candidate).map_err(|e| Error::invalid("candidate", e))?;
        let args = [candidate.id.clone(), (ttl.as_millis() as u64).to_string(), json];
        self.run(&self.scripts.register, &[self.key(election)], &args, true).await.map(|_| ())
    }

    async fn withdraw(&self, election: &str, candidate_id: &str) -> Result<()> {
        let c = self.link.get().await?;
        let mut conn = c.conn.clone();
        redis::cmd("HDEL")
            .arg(self.key(election))
            .arg(candidate_id)
            .query_async::<i64>(&mut conn)
            .await
            .map(|_| ())
            .map_err(|e| {
                self.link.broken(&c, &e);
                redis_error(&e, true)
            })
    }

    async fn candidates(&self, election: &str) -> Result<Vec<Candidate>> {
        let out = self.run(&self.scripts.candidates, &[self.key(election)], &[], false).await?;
        let mut all: Vec<Candidate> = out
            .iter()
            .skip(1)
            .filter_map(|entry| {
                let (exp, json) = entry.split_once('|')?;
                let c: Candidate = serde_json::from_str(json).ok()?;
                Some(Candidate { expires_at_ms: exp.parse().ok()?, ..c })
            })
            .collect();
        all.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(all)
    }
}
