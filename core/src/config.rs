//! Table layout and lease timing: every name the store writes, and the three durations the
//! safety rules depend on.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::render;

/// Attribute names of a lease item. The defaults are the AWS reference worker's schema, so a
/// leaselock worker and a worker written from that design can share a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attributes {
    pub id: String,
    pub desired_state: String,
    pub url: String,
    pub owner: String,
    pub expires_at_ms: String,
    pub last_seq: String,
    pub fence: String,
    pub ttl: String,
    /// Session mode: the epoch of the session a connection is held under.
    pub session_epoch: String,
}

impl Default for Attributes {
    fn default() -> Self {
        Self {
            id: "connection_id".into(),
            desired_state: "desired_state".into(),
            url: "ws_url".into(),
            owner: "lease_owner".into(),
            expires_at_ms: "lease_expires_at_ms".into(),
            last_seq: "last_seq".into(),
            fence: "fence".into(),
            ttl: "ttl".into(),
            session_epoch: "session_epoch".into(),
        }
    }
}

/// How held work is kept alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LeaseMode {
    /// Every held item is renewed on its own (the AWS reference design; the default).
    #[default]
    PerItem,
    /// One session item per worker is renewed; the items it holds are written only when claimed,
    /// checkpointed or released (see [`crate::Session`]).
    Session,
}

impl LeaseMode {
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseMode::PerItem => "per-item",
            LeaseMode::Session => "session",
        }
    }

    /// The mode named `s`: `per-item` (`item` is the older spelling, still accepted) or
    /// `session`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "per-item" | "item" => Some(LeaseMode::PerItem),
            "session" => Some(LeaseMode::Session),
            _ => None,
        }
    }

    /// [`LeaseMode::parse`], or an [`Error::InvalidInput`] naming `field` (the option as the
    /// caller wrote it) and quoting the value escaped: what every binding answers.
    pub fn parse_option(field: &str, s: &str) -> crate::Result<Self> {
        Self::parse(s).ok_or_else(|| {
            crate::Error::invalid(
                field,
                format!("{} is not a lease mode (\"per-item\" or \"session\")", crate::render::value(s)),
            )
        })
    }
}

/// Where leases live and how long they last.
///
/// ```
/// use std::time::Duration;
/// use leaselock::TableConfig;
///
/// let config = TableConfig::new("leases")
///     .lease_duration(Duration::from_secs(10))
///     .renew_interval(Duration::from_secs(2))
///     .validated()
///     .unwrap();
/// assert_eq!(config.clock_skew, Duration::from_secs(1));
///
/// // A lease must outlive twice the clock skew.
/// let bad = TableConfig::new("leases").clock_skew(Duration::from_secs(15)).validated();
/// assert!(bad.unwrap_err().to_string().contains("clock_skew"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableConfig {
    pub table_name: String,
    /// The orphan index (see [`DEFAULT_INDEX_NAME`]).
    pub index_name: String,
    /// The owner index: `lease_owner` partition, keys only (see [`DEFAULT_OWNER_INDEX_NAME`]).
    pub owner_index_name: String,
    /// Prepended to every id the store writes (several applications can share a table).
    pub key_prefix: String,
    pub attributes: Attributes,
    /// How long a claim or renewal holds the lease (default 20 s).
    pub lease_duration: Duration,
    /// How often an owner renews (default 5 s).
    pub renew_interval: Duration,
    /// The largest wall-clock difference tolerated between any two workers (default 1 s).
    pub clock_skew: Duration,
    /// How long a STOPPED item is kept before DynamoDB TTL may delete it (default 7 days).
    pub stopped_retention: Duration,
    /// The orphan index's partition value for running work (the `desired_state` written by
    /// `start`). Kept here, and only here, with [`TableConfig::orphan_shards`]: callers ask
    /// [`TableConfig::started_value`] and [`TableConfig::started_partitions`].
    pub started_partition: String,
    /// How many orphan-index partition values running work is spread over (default 1: every
    /// STARTED item has `desired_state = STARTED`, the AWS post's schema). With N > 1 an item's
    /// value is `STARTED#k`, k = [`orphan_shard_of`] its id, and orphan queries read all N, so
    /// renewals (each moves the item's index sort key) share N partitions' write capacity
    /// instead of one. Every writer of the table must use the same N.
    pub orphan_shards: u32,
    /// The retry budget of an operation that holds no lease (start, stop, get, listings, table
    /// creation), so a store slow for a moment does not fail an operator's command (default 10 s).
    /// Lease operations keep theirs: the deadline, or one renew interval.
    pub operation_budget: Duration,
    /// How long one attempt of such an operation may take (default 5 s).
    pub operation_attempt_timeout: Duration,
    /// Per-item leases (default) or one session per worker.
    pub mode: LeaseMode,
    /// The orphan index's partition value of session items (session mode), so dead sessions are
    /// a query of that index: `partition = session_partition AND expiry < cutoff`.
    pub session_partition: String,
    /// Session items only: how many connections the session holds, written by every session
    /// renewal, so each worker knows the fleet's load (fleet-aware balance).
    pub session_held_attribute: String,
    /// Session items only: the most connections the session's worker takes.
    pub session_capacity_attribute: String,
    /// Accept a global table in multi-Region eventual consistency (default false: refused, as
    /// concurrent writes in two Regions resolve last-writer-wins and a lease is not exclusive
    /// across them). Only safe when every writer of the table writes in one Region; with it the
    /// table is not described at all. Environment: [`ALLOW_EVENTUAL_GLOBAL_TABLE_ENV`].
    pub allow_eventual_global_table: bool,
}

/// The environment variable the CLI and the Lambdas read [`TableConfig::allow_eventual_global_table`]
/// from (`1` or `true` to opt in).
pub const ALLOW_EVENTUAL_GLOBAL_TABLE_ENV: &str = "LEASELOCK_ALLOW_EVENTUAL_GLOBAL_TABLE";

/// An on/off environment value: `1`, `true`, `yes`, `on` or `0`, `false`, `no`, `off` (any case);
/// `None` for anything else.
pub fn parse_flag(value: &str) -> Option<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// The most orphan-index partition values running work may be spread over: an orphan query
/// reads every one of them (an empty query costs 0.5 read units), and 256 values carry about
/// 250,000 connections renewing every 5 s at 1,000 write units per second each.
pub const MAX_ORPHAN_SHARDS: u32 = 256;

/// The orphan shard of work `id` among `shards`: the 64-bit FNV-1a hash of the id's UTF-8
/// bytes (the id as given, without the key prefix), mixed by MurmurHash3's 64-bit finalizer
/// (FNV-1a's low bits alone spread ids that differ in a digit badly), modulo `shards`. Stable
/// across releases and languages, so any writer can compute it.
pub fn orphan_shard_of(id: &str, shards: u32) -> u32 {
    (mixed_hash(id.bytes()) % u64::from(shards.max(1))) as u32
}

const SPLITMIX_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output function.
fn splitmix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A uniform draw in [0, 1) from the SplitMix64 generator whose state is `state` (the seeded
/// source of the engine, the holder and the elector: the same seed, the same draws).
pub(crate) fn unit_draw(state: &mut u64) -> f64 {
    *state = state.wrapping_add(SPLITMIX_GAMMA);
    (splitmix64(*state) >> 11) as f64 / (1u64 << 53) as f64
}

/// 64-bit FNV-1a of `bytes`, mixed by MurmurHash3's 64-bit finalizer.
pub(crate) fn mixed_hash(bytes: impl IntoIterator<Item = u8>) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    h
}

/// The default GSI name: `desired_state` partition, `lease_expires_at_ms` sort.
pub const DEFAULT_INDEX_NAME: &str = "desired_state-lease_expires_at_ms-index";

/// The default owner index name: `lease_owner` partition, keys only.
pub const DEFAULT_OWNER_INDEX_NAME: &str = "lease_owner-index";

impl Default for TableConfig {
    fn default() -> Self {
        Self::new("leaselock")
    }
}

impl TableConfig {
    pub fn new(table_name: impl Into<String>) -> Self {
        Self {
            table_name: table_name.into(),
            index_name: DEFAULT_INDEX_NAME.into(),
            owner_index_name: DEFAULT_OWNER_INDEX_NAME.into(),
            key_prefix: String::new(),
            attributes: Attributes::default(),
            lease_duration: Duration::from_secs(20),
            renew_interval: Duration::from_secs(5),
            clock_skew: Duration::from_secs(1),
            stopped_retention: Duration::from_secs(7 * 24 * 3600),
            started_partition: crate::DesiredState::Started.as_str().into(),
            orphan_shards: 1,
            operation_budget: Duration::from_secs(10),
            operation_attempt_timeout: Duration::from_secs(5),
            mode: LeaseMode::PerItem,
            session_partition: "SESSION".into(),
            session_held_attribute: "held_connections".into(),
            session_capacity_attribute: "max_connections".into(),
            allow_eventual_global_table: false,
        }
    }

    /// Spreads running work over `n` orphan-index partition values (see the field).
    pub fn orphan_shards(mut self, n: u32) -> Self {
        self.orphan_shards = n;
        self
    }

    /// The `desired_state` value (orphan-index partition value) of running work `id`:
    /// `STARTED`, or `STARTED#k` with sharding.
    pub fn started_value(&self, id: &str) -> String {
        if self.orphan_shards <= 1 {
            self.started_partition.clone()
        } else {
            format!("{}#{}", self.started_partition, orphan_shard_of(id, self.orphan_shards))
        }
    }

    /// The shard an orphan listing at `cutoff_ms` reads first; it then goes round all of them
    /// (`first`, `first + 1`, ... modulo N). Picked from the cutoff, so workers polling at
    /// different moments start at different shards and a round of claims spreads over the
    /// shards instead of taking one shard's work at once (whose renewals would then share one
    /// partition's second, every renew interval). Every page of one listing passes the same
    /// cutoff, so it is the same for all of them. 0 without sharding.
    pub fn first_orphan_shard(&self, cutoff_ms: u64) -> u32 {
        if self.orphan_shards <= 1 {
            return 0;
        }
        (splitmix64(cutoff_ms.wrapping_add(SPLITMIX_GAMMA)) % u64::from(self.orphan_shards)) as u32
    }

    /// Every orphan-index partition value of running work, shard 0 first.
    pub fn started_partitions(&self) -> Vec<String> {
        if self.orphan_shards <= 1 {
            vec![self.started_partition.clone()]
        } else {
            (0..self.orphan_shards).map(|k| format!("{}#{k}", self.started_partition)).collect()
        }
    }

    /// Reads a stored `desired_state`: `STOPPED`, or running work under this table's started
    /// value, sharded (`STARTED#k`) or not, whatever N it was written with.
    pub fn parse_desired_state(&self, value: &str) -> Option<crate::DesiredState> {
        let sharded = value
            .strip_prefix(self.started_partition.as_str())
            .and_then(|rest| rest.strip_prefix('#'))
            .is_some_and(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()));
        if value == self.started_partition || sharded {
            return Some(crate::DesiredState::Started);
        }
        crate::DesiredState::parse(value)
    }

    pub fn index_name(mut self, name: impl Into<String>) -> Self {
        self.index_name = name.into();
        self
    }

    pub fn owner_index_name(mut self, name: impl Into<String>) -> Self {
        self.owner_index_name = name.into();
        self
    }

    pub fn operation_budget(mut self, d: Duration) -> Self {
        self.operation_budget = d;
        self
    }

    pub fn operation_attempt_timeout(mut self, d: Duration) -> Self {
        self.operation_attempt_timeout = d;
        self
    }

    pub fn mode(mut self, mode: LeaseMode) -> Self {
        self.mode = mode;
        self
    }

    pub fn session_partition(mut self, value: impl Into<String>) -> Self {
        self.session_partition = value.into();
        self
    }

    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    pub fn attributes(mut self, attributes: Attributes) -> Self {
        self.attributes = attributes;
        self
    }

    pub fn lease_duration(mut self, d: Duration) -> Self {
        self.lease_duration = d;
        self
    }

    pub fn renew_interval(mut self, d: Duration) -> Self {
        self.renew_interval = d;
        self
    }

    pub fn clock_skew(mut self, d: Duration) -> Self {
        self.clock_skew = d;
        self
    }

    pub fn stopped_retention(mut self, d: Duration) -> Self {
        self.stopped_retention = d;
        self
    }

    /// Accepts a global table in multi-Region eventual consistency (see the field).
    pub fn allow_eventual_global_table(mut self, allow: bool) -> Self {
        self.allow_eventual_global_table = allow;
        self
    }

    /// Checks the names and the timing rules; returns the config unchanged when valid.
    pub fn validated(self) -> Result<Self> {
        self.validate()?;
        Ok(self)
    }

    pub fn validate(&self) -> Result<()> {
        let invalid = |field: &str, msg: String| Err(Error::invalid(field, msg));
        validate_table_name("table_name", &self.table_name)?;
        validate_table_name("index_name", &self.index_name)?;
        validate_table_name("owner_index_name", &self.owner_index_name)?;
        if self.owner_index_name == self.index_name {
            return invalid("owner_index_name", "must differ from the orphan index's name".into());
        }
        for (field, d) in [
            ("lease_duration", self.lease_duration),
            ("renew_interval", self.renew_interval),
            ("clock_skew", self.clock_skew),
            ("operation_budget", self.operation_budget),
            ("operation_attempt_timeout", self.operation_attempt_timeout),
        ] {
            validate_duration(field, d)?;
        }
        if self.operation_budget.is_zero() {
            return invalid("operation_budget", "must be greater than zero".into());
        }
        if self.operation_attempt_timeout.is_zero() {
            return invalid("operation_attempt_timeout", "must be greater than zero".into());
        }
        let a = &self.attributes;
        let names = [
            ("attributes.id", &a.id),
            ("attributes.desired_state", &a.desired_state),
            ("attributes.url", &a.url),
            ("attributes.owner", &a.owner),
            ("attributes.expires_at_ms", &a.expires_at_ms),
            ("attributes.last_seq", &a.last_seq),
            ("attributes.fence", &a.fence),
            ("attributes.ttl", &a.ttl),
            ("attributes.session_epoch", &a.session_epoch),
            ("session_held_attribute", &self.session_held_attribute),
            ("session_capacity_attribute", &self.session_capacity_attribute),
        ];
        for (i, (field, name)) in names.iter().enumerate() {
            if name.is_empty() || name.len() > 255 {
                return invalid(field, "must be 1 to 255 bytes".into());
            }
            refuse_chars(field, name)?;
            if let Some((other, _)) = names[..i].iter().find(|(_, n)| n == name) {
                return invalid(field, format!("{} is already used by {other}", render::value(name)));
            }
        }
        if !(1..=MAX_ORPHAN_SHARDS).contains(&self.orphan_shards) {
            return invalid("orphan_shards", format!("{} must be 1 to {MAX_ORPHAN_SHARDS}", self.orphan_shards));
        }
        if self.session_partition.is_empty()
            || self.session_partition == self.started_partition
            || self.parse_desired_state(&self.session_partition).is_some()
        {
            return invalid("session_partition", "must be non-empty and not a desired state".into());
        }
        validate_key_prefix("key_prefix", &self.key_prefix)?;
        if self.clock_skew.is_zero() {
            return invalid("clock_skew", "must be greater than zero".into());
        }
        if self.lease_duration <= self.clock_skew * 2 {
            return invalid(
                "lease_duration",
                format!("{:?} must be greater than 2 x clock_skew ({:?})", self.lease_duration, self.clock_skew),
            );
        }
        if self.renew_interval.is_zero() || self.renew_interval >= self.lease_duration - self.clock_skew {
            return invalid(
                "renew_interval",
                format!(
                    "{:?} must be greater than zero and less than lease_duration - clock_skew ({:?})",
                    self.renew_interval,
                    self.lease_duration - self.clock_skew
                ),
            );
        }
        Ok(())
    }

    /// The stored key of a work id.
    pub fn key(&self, id: &str) -> String {
        format!("{}{}", self.key_prefix, id)
    }

    /// The id of `owner`'s session item (the stored key adds the prefix).
    pub fn session_id(&self, owner: &str) -> String {
        format!("{SESSION_PREFIX}{owner}")
    }

    /// The owner of a session item's id, or `None` when the id is not a session's.
    pub fn session_owner<'a>(&self, id: &'a str) -> Option<&'a str> {
        id.strip_prefix(SESSION_PREFIX)
    }

    /// The work id of a stored key (the key itself when it lacks the prefix).
    pub fn id_of<'a>(&self, key: &'a str) -> &'a str {
        key.strip_prefix(&self.key_prefix).unwrap_or(key)
    }

    pub fn lease_ms(&self) -> u64 {
        self.lease_duration.as_millis() as u64
    }

    pub fn skew_ms(&self) -> u64 {
        self.clock_skew.as_millis() as u64
    }

    pub fn renew_ms(&self) -> u64 {
        self.renew_interval.as_millis() as u64
    }
}

/// Session items' ids: `session/{worker_id}` (under the key prefix).
pub const SESSION_PREFIX: &str = "session/";

/// Largest id, in bytes (DynamoDB's partition key limit is 2,048; the prefix needs room).
pub const MAX_ID_BYTES: usize = 1024;

/// Largest key prefix, in bytes.
pub const MAX_KEY_PREFIX_BYTES: usize = 512;

/// Largest url, in bytes.
pub const MAX_URL_BYTES: usize = 4096;

/// The longest duration any timing option may be (30 days): a lease, an interval, a wait, a
/// grace period. Longer values are refused, so deadlines computed from them stay far from any
/// clock's overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(30 * 24 * 3600);

/// Refuses a duration longer than [`MAX_DURATION`], naming `field`.
pub fn validate_duration(field: &str, d: Duration) -> Result<()> {
    if d > MAX_DURATION {
        return Err(Error::invalid(
            field,
            format!("{} ms is too long: at most {} ms (30 days)", d.as_millis(), MAX_DURATION.as_millis()),
        ));
    }
    Ok(())
}

/// A key prefix (of a table or an elector): at most [`MAX_KEY_PREFIX_BYTES`] bytes without
/// control or invisible format characters; empty is allowed.
pub fn validate_key_prefix(field: &str, prefix: &str) -> Result<()> {
    if prefix.len() > MAX_KEY_PREFIX_BYTES {
        return Err(Error::invalid(
            field,
            format!("too long: {} bytes, at most {MAX_KEY_PREFIX_BYTES} allowed", prefix.len()),
        ));
    }
    refuse_chars(field, prefix)
}

/// Free text the store writes or a log prints (a metrics namespace, candidate metadata): at
/// most `max_bytes` bytes without control or invisible format characters; empty is allowed.
pub fn validate_text(field: &str, text: &str, max_bytes: usize) -> Result<()> {
    if text.len() > max_bytes {
        return Err(Error::invalid(field, format!("too long: {} bytes, at most {max_bytes} allowed", text.len())));
    }
    refuse_chars(field, text)
}

pub use crate::render::{is_refused_char, REFUSED_FORMAT_CHARS};

/// Refuses a value holding a control or invisible format character, naming the first one.
fn refuse_chars(field: &str, value: &str) -> Result<()> {
    match value.char_indices().find(|&(_, c)| is_refused_char(c)) {
        None => Ok(()),
        Some((at, c)) => Err(Error::invalid(
            field,
            format!(
                "{} holds U+{:04X} at byte {at}: control and invisible format characters are not allowed",
                render::value(value),
                c as u32
            ),
        )),
    }
}

/// The id rule, the same for work ids, owners and worker ids: 1 to [`MAX_ID_BYTES`] bytes of
/// UTF-8 without control characters or [`REFUSED_FORMAT_CHARS`]. The length is checked first.
///
/// ```
/// use leaselock::{config::validate_id, Error};
///
/// validate_id("id", "stream-1").unwrap();
/// validate_id("id", "flux é/日本 #2").unwrap();
/// match validate_id("owner", "w1\r\nFORGED LOG LINE") {
///     Err(Error::InvalidInput { field, message }) => {
///         assert_eq!(field, "owner");
///         assert!(message.starts_with(r#""w1\r\nFORGED LOG LINE" holds U+000D at byte 2"#), "{message}");
///     }
///     other => panic!("{other:?}"),
/// }
/// ```
pub fn validate_id(field: &str, id: &str) -> Result<()> {
    if id.is_empty() {
        return Err(Error::invalid(field, "must not be empty"));
    }
    if id.len() > MAX_ID_BYTES {
        return Err(Error::invalid(field, format!("too long: {} bytes, at most {MAX_ID_BYTES} allowed", id.len())));
    }
    refuse_chars(field, id)
}

/// Accepts only `ws://` and `wss://` URLs with a host, at most [`MAX_URL_BYTES`] bytes, without
/// whitespace, control or invisible format characters. The length is checked first.
pub fn validate_url(url: &str) -> Result<()> {
    let invalid = |msg: String| Err(Error::invalid("url", msg));
    if url.len() > MAX_URL_BYTES {
        return invalid(format!("too long: {} bytes, at most {MAX_URL_BYTES} allowed", url.len()));
    }
    refuse_chars("url", url)?;
    if url.chars().any(char::is_whitespace) {
        return invalid(format!("{} holds whitespace", render::value(url)));
    }
    let Some(rest) = url.strip_prefix("wss://").or_else(|| url.strip_prefix("ws://")) else {
        return invalid(format!("{} must start with ws:// or wss://", render::value(url)));
    };
    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
    if host.is_empty() {
        return invalid(format!("{} needs a host", render::value(url)));
    }
    Ok(())
}

/// DynamoDB's rule for table and index names: 3 to 255 characters of `a-z A-Z 0-9 _ - .`.
pub fn validate_table_name(field: &str, name: &str) -> Result<()> {
    if name.len() < 3 || name.len() > 255 {
        return Err(Error::invalid(field, format!("{} must be 3 to 255 characters long", render::value(name))));
    }
    if let Some(c) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))) {
        return Err(Error::invalid(
            field,
            format!(
                "{} holds {}: only a-z, A-Z, 0-9, '_', '-', '.' are allowed",
                render::value(name),
                render::value(&c.to_string())
            ),
        ));
    }
    Ok(())
}

/// Largest SQS queue url accepted, in bytes.
pub const MAX_QUEUE_URL_BYTES: usize = 1024;

/// The shape of an SQS queue url, `http(s)://HOST/ACCOUNT/NAME`, with a 12-digit account and
/// a queue name of 1 to 80 characters of `a-z A-Z 0-9 _ -` (a `.fifo` suffix allowed).
///
/// ```
/// use leaselock::config::validate_queue_url;
///
/// validate_queue_url("https://sqs.us-east-1.amazonaws.com/123456789012/hints").unwrap();
/// validate_queue_url("http://127.0.0.1:4566/000000000000/orders.fifo").unwrap();
/// assert!(validate_queue_url("hints").is_err());
/// assert!(validate_queue_url("https://sqs.us-east-1.amazonaws.com/hints").is_err());
/// ```
pub fn validate_queue_url(url: &str) -> Result<()> {
    let invalid = |msg: String| Err(Error::invalid("queue_url", msg));
    if url.len() > MAX_QUEUE_URL_BYTES {
        return invalid(format!("too long: {} bytes, at most {MAX_QUEUE_URL_BYTES} allowed", url.len()));
    }
    refuse_chars("queue_url", url)?;
    let shape = "must look like https://sqs.REGION.amazonaws.com/ACCOUNT/QUEUE";
    let Some(rest) = url.strip_prefix("https://").or_else(|| url.strip_prefix("http://")) else {
        return invalid(format!("{} {shape}", render::value(url)));
    };
    let parts: Vec<&str> = rest.trim_end_matches('/').split('/').collect();
    let [host, account, name] = parts.as_slice() else {
        return invalid(format!("{} {shape}", render::value(url)));
    };
    let base = name.strip_suffix(".fifo").unwrap_or(name);
    let host_ok = !host.is_empty() && !host.contains(['?', '#', ' ', '@']);
    let account_ok = account.len() == 12 && account.bytes().all(|b| b.is_ascii_digit());
    let name_ok = (1..=80).contains(&name.len())
        && !base.is_empty()
        && base.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'));
    if !(host_ok && account_ok && name_ok) {
        return invalid(format!(
            "{} {shape} (a 12-digit account, a queue name of 1 to 80 of a-z A-Z 0-9 _ -)",
            render::value(url)
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orphan_shards_default_to_one_started_value_and_are_bounded() {
        let c = TableConfig::default();
        assert_eq!(
            (c.orphan_shards, c.started_value("s1"), c.started_partitions()),
            (1, "STARTED".into(), vec!["STARTED".into()])
        );
        let err = |n: u32| TableConfig::new("leases").orphan_shards(n).validate().unwrap_err().to_string();
        assert!(err(0).contains("orphan_shards") && err(0).contains("1 to 256"), "{}", err(0));
        assert!(err(MAX_ORPHAN_SHARDS + 1).contains("orphan_shards"));
        TableConfig::new("leases").orphan_shards(MAX_ORPHAN_SHARDS).validate().unwrap();
        let c = TableConfig::new("leases").orphan_shards(8);
        let parts = c.started_partitions();
        assert_eq!((parts.len(), parts[0].as_str(), parts[7].as_str()), (8, "STARTED#0", "STARTED#7"));
        assert!(parts.contains(&c.started_value("s1")));
        // Every form reads as STARTED, whatever the shard count it was written with.
        for v in ["STARTED", "STARTED#0", "STARTED#63"] {
            assert_eq!(c.parse_desired_state(v), Some(crate::DesiredState::Started), "{v}");
            assert_eq!(TableConfig::default().parse_desired_state(v), Some(crate::DesiredState::Started), "{v}");
        }
        for v in ["STARTED#", "STARTED#x", "STARTEDX", "SESSION"] {
            assert_eq!(c.parse_desired_state(v), None, "{v}");
        }
        assert_eq!(c.parse_desired_state("STOPPED"), Some(crate::DesiredState::Stopped));
        let mut bad = TableConfig::new("leases");
        bad.session_partition = "STARTED#3".into();
        assert!(bad.validate().unwrap_err().to_string().contains("session_partition"));
    }

    #[test]
    fn orphan_shards_spread_similar_ids_evenly() {
        // Ids that differ in a digit (the usual naming) land evenly: within 20% of the mean.
        for shards in [8u32, 64] {
            let mut counts = vec![0u32; shards as usize];
            for i in 0..64_000 {
                counts[orphan_shard_of(&format!("c{i:06}"), shards) as usize] += 1;
            }
            let mean = 64_000 / shards;
            assert!(counts.iter().all(|&n| n > mean * 8 / 10 && n < mean * 12 / 10), "{shards}: {counts:?}");
        }
        // Stable: these shards are what other writers compute (checked against an independent
        // implementation of the documented hash); changing them moves every stored item.
        assert_eq!(["s1", "c000000", "meeting-42"].map(|id| orphan_shard_of(id, 64)), [41, 12, 7]);
    }

    #[test]
    fn defaults_are_the_reference_schema_and_valid() {
        let c = TableConfig::default();
        c.validate().unwrap();
        assert_eq!(c.attributes.id, "connection_id");
        assert_eq!(c.attributes.expires_at_ms, "lease_expires_at_ms");
        assert_eq!((c.lease_ms(), c.renew_ms(), c.skew_ms()), (20_000, 5_000, 1_000));
    }

    #[test]
    fn timing_rules_name_the_field() {
        let err = |c: TableConfig| c.validate().unwrap_err().to_string();
        let base = TableConfig::new("leases");
        assert!(err(base.clone().lease_duration(Duration::from_secs(2))).contains("lease_duration"));
        assert!(err(base.clone().renew_interval(Duration::from_secs(19))).contains("renew_interval"));
        assert!(err(base.clone().renew_interval(Duration::ZERO)).contains("renew_interval"));
        assert!(err(base.clone().clock_skew(Duration::ZERO)).contains("clock_skew"));
        assert!(err(TableConfig::new("x")).contains("table_name"));
        let huge = Duration::from_millis(u64::MAX);
        assert!(err(base.clone().lease_duration(huge)).starts_with("invalid lease_duration"));
        assert!(err(base.clone().operation_budget(huge)).starts_with("invalid operation_budget"));
        let hostile = Attributes { owner: "holder\u{1b}[2J".into(), ..Attributes::default() };
        assert!(err(base.clone().attributes(hostile)).contains("attributes.owner"));
        let dup = Attributes { fence: "lease_owner".into(), ..Attributes::default() };
        assert!(err(base.attributes(dup)).contains("attributes.fence"));
    }

    #[test]
    fn ids_and_urls() {
        assert!(validate_id("id", "").unwrap_err().to_string().contains("id"));
        assert!(validate_id("id", &"x".repeat(1025)).is_err());
        validate_id("id", &"x".repeat(1024)).unwrap();
        validate_url("wss://feed.example/a?b=1").unwrap();
        validate_url("ws://127.0.0.1:9000/s").unwrap();
        for bad in ["http://x", "wss://", "ws:///path", "wss://a b", "feed"] {
            assert!(validate_url(bad).is_err(), "{bad}");
        }
    }

    fn refused(result: Result<()>) -> (String, String) {
        match result {
            Err(Error::InvalidInput { field, message }) => (field, message),
            other => panic!("expected InvalidInput, got {other:?}"),
        }
    }

    #[test]
    fn ids_refuse_control_and_invisible_characters() {
        for bad in ["a\0b", "a\r\nb", "a\nb", "tab\there", "del\u{7f}", "\u{1b}[31mred", "c1\u{85}", "\u{9b}2J"] {
            let (field, message) = refused(validate_id("id", bad));
            assert_eq!(field, "id");
            assert!(message.contains("control and invisible"), "{message}");
            assert!(!message.chars().any(char::is_control), "the message itself is escaped: {message:?}");
        }
        for bad in [
            "\u{200b}a",
            "a\u{200f}",
            "\u{202e}gpj.exe",
            "x\u{2066}y\u{2069}",
            "\u{feff}bom",
            "soft\u{ad}",
            "tag\u{e0041}",
        ] {
            assert_eq!(refused(validate_id("owner", bad)).0, "owner", "{bad:?}");
        }
        let (_, message) = refused(validate_id("worker_id", "w\u{1b}]0;x\u{7}"));
        assert_eq!(
            message,
            r#""w\u{1b}]0;x\u{7}" holds U+001B at byte 1: control and invisible format characters are not allowed"#
        );
        // Printable text of any script, spaces and punctuation stay allowed.
        for ok in ["stream-1", "a b", "flux/é#日本", "emoji🚀", "quote\"and\\slash", "leader/x"] {
            validate_id("id", ok).unwrap();
        }
    }

    #[test]
    fn lengths_are_checked_before_formats() {
        // Too long and full of control characters: the length is what is reported.
        let (field, message) = refused(validate_id("id", &"\u{1b}".repeat(2000)));
        assert_eq!((field.as_str(), message.as_str()), ("id", "too long: 2000 bytes, at most 1024 allowed"));
        let (field, message) = refused(validate_url(&format!("{}/x", "x".repeat(5000))));
        assert_eq!(field, "url");
        assert_eq!(message, "too long: 5002 bytes, at most 4096 allowed");
        let huge = format!("wss://{}", "\"".repeat(2_000_000));
        let (_, message) = refused(validate_url(&huge));
        assert!(message.starts_with("too long") && message.len() < 100, "{message}");
        // Under the limit, the value is quoted bounded and escaped.
        let (_, message) = refused(validate_url(&format!("https://{}", "y".repeat(3000))));
        assert_eq!(message, format!("\"https://{}\"... (3008 bytes) must start with ws:// or wss://", "y".repeat(56)));
        let (_, message) = refused(validate_url("wss://feed.example/\u{1b}[2J"));
        assert!(message.contains(r"\u{1b}[2J") && message.contains("U+001B"), "{message}");
        assert!(refused(validate_url("wss://a\u{202e}b/")).1.contains("U+202E"));
    }

    #[test]
    fn table_and_queue_names() {
        validate_table_name("table_name", "leases.v2_a-b").unwrap();
        for bad in ["ab", "has space", "emoji🚀", "semi;colon", &"t".repeat(256)] {
            assert_eq!(refused(validate_table_name("messages_table", bad)).0, "messages_table", "{bad:?}");
        }
        let err = |c: TableConfig| refused(c.validate()).0;
        assert_eq!(err(TableConfig::new("leases").index_name("bad index")), "index_name");
        assert_eq!(err(TableConfig::new("leases").key_prefix("app\u{1b}/")), "key_prefix");
        assert_eq!(err(TableConfig::new("leases").key_prefix("p".repeat(513))), "key_prefix");
        for bad in [
            "",
            "hints",
            "ftp://sqs.example/123456789012/q",
            "https://sqs.example/q",
            "https://sqs.example/12345/q",
            "https://sqs.example/123456789012/",
            "https://sqs.example/123456789012/q/extra",
            "https://sqs.example/123456789012/bad name",
            "https://sqs.example/123456789012/.fifo",
            "https://sqs.example/123456789012/q\n",
        ] {
            assert_eq!(refused(validate_queue_url(bad)).0, "queue_url", "{bad:?}");
        }
        validate_queue_url(&format!("https://sqs.eu-west-1.amazonaws.com/123456789012/{}", "q".repeat(80))).unwrap();
        assert!(validate_queue_url(&format!("https://sqs.example/123456789012/{}", "q".repeat(81))).is_err());
    }

    #[test]
    fn prefix_round_trip() {
        let c = TableConfig::new("leases").key_prefix("app1/");
        assert_eq!(c.key("s1"), "app1/s1");
        assert_eq!(c.id_of("app1/s1"), "s1");
    }
}
