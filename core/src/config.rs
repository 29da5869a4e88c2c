//! Table layout and lease timing: every name the store writes, and the three durations the
//! safety rules depend on.

use std::time::Duration;

use crate::error::{Error, Result};

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

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "per-item" | "per_item" | "item" => Some(LeaseMode::PerItem),
            "session" => Some(LeaseMode::Session),
            _ => None,
        }
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
    /// The orphan index's partition value for running work. Kept here, and only here, so the
    /// index can later be sharded over several values without touching callers.
    pub started_partition: String,
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
            operation_budget: Duration::from_secs(10),
            operation_attempt_timeout: Duration::from_secs(5),
            mode: LeaseMode::PerItem,
            session_partition: "SESSION".into(),
        }
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

    /// Checks the names and the timing rules; returns the config unchanged when valid.
    pub fn validated(self) -> Result<Self> {
        self.validate()?;
        Ok(self)
    }

    pub fn validate(&self) -> Result<()> {
        let invalid = |msg: String| Err(Error::InvalidInput(msg));
        if self.table_name.len() < 3
            || self.table_name.len() > 255
            || !self.table_name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        {
            return invalid(format!(
                "table_name {:?}: 3 to 255 characters of a-z, A-Z, 0-9, '_', '-', '.'",
                self.table_name
            ));
        }
        if self.index_name.len() < 3 {
            return invalid(format!("index_name {:?}: at least 3 characters", self.index_name));
        }
        if self.owner_index_name.len() < 3 || self.owner_index_name == self.index_name {
            return invalid(format!(
                "owner_index_name {:?}: at least 3 characters, not the orphan index's name",
                self.owner_index_name
            ));
        }
        if self.operation_budget.is_zero() || self.operation_attempt_timeout.is_zero() {
            return invalid("operation_budget and operation_attempt_timeout: must be greater than zero".into());
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
        ];
        for (i, (field, name)) in names.iter().enumerate() {
            if name.is_empty() || name.len() > 255 {
                return invalid(format!("{field}: must be 1 to 255 bytes"));
            }
            if let Some((other, _)) = names[..i].iter().find(|(_, n)| n == name) {
                return invalid(format!("{field}: {name:?} is already used by {other}"));
            }
        }
        if self.session_partition.is_empty()
            || self.session_partition == self.started_partition
            || crate::DesiredState::parse(&self.session_partition).is_some()
        {
            return invalid(format!(
                "session_partition {:?}: must be non-empty and not a desired state",
                self.session_partition
            ));
        }
        if self.key_prefix.len() > 512 {
            return invalid("key_prefix: at most 512 bytes".into());
        }
        if self.clock_skew.is_zero() {
            return invalid("clock_skew: must be greater than zero".into());
        }
        if self.lease_duration <= self.clock_skew * 2 {
            return invalid(format!(
                "lease_duration ({:?}) must be greater than 2 x clock_skew ({:?})",
                self.lease_duration, self.clock_skew
            ));
        }
        if self.renew_interval.is_zero() || self.renew_interval >= self.lease_duration - self.clock_skew {
            return invalid(format!(
                "renew_interval ({:?}) must be greater than zero and less than lease_duration - clock_skew ({:?})",
                self.renew_interval,
                self.lease_duration - self.clock_skew
            ));
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

/// Rejects an empty or oversized id before anything is written.
pub fn validate_id(field: &str, id: &str) -> Result<()> {
    if id.is_empty() {
        return Err(Error::InvalidInput(format!("{field}: must not be empty")));
    }
    if id.len() > MAX_ID_BYTES {
        return Err(Error::InvalidInput(format!("{field}: {} bytes, at most {MAX_ID_BYTES} allowed", id.len())));
    }
    Ok(())
}

/// Accepts only `ws://` and `wss://` URLs with a host.
pub fn validate_url(url: &str) -> Result<()> {
    let rest = url
        .strip_prefix("wss://")
        .or_else(|| url.strip_prefix("ws://"))
        .ok_or_else(|| Error::InvalidInput(format!("url {url:?}: must start with ws:// or wss://")))?;
    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
    if host.is_empty() || url.chars().any(|c| c.is_whitespace() || c.is_control()) || url.len() > 4096 {
        return Err(Error::InvalidInput(format!("url {url:?}: needs a host and no spaces")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn prefix_round_trip() {
        let c = TableConfig::new("leases").key_prefix("app1/");
        assert_eq!(c.key("s1"), "app1/s1");
        assert_eq!(c.id_of("app1/s1"), "s1");
    }
}
