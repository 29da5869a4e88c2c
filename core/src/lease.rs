//! The lease model: the stored item, the handle an owner holds, and the safety rules as plain
//! functions of (item, now, config). No I/O here; every store and every binding uses these.

use crate::config::TableConfig;

/// What the fleet should be doing with a unit of work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum DesiredState {
    Started,
    Stopped,
}

impl DesiredState {
    pub fn as_str(self) -> &'static str {
        match self {
            DesiredState::Started => "STARTED",
            DesiredState::Stopped => "STOPPED",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "STARTED" => Some(DesiredState::Started),
            "STOPPED" => Some(DesiredState::Stopped),
            _ => None,
        }
    }
}

impl std::fmt::Display for DesiredState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One stored lease item, as read (ids without the key prefix).
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct LeaseItem {
    pub id: String,
    pub desired_state: Option<DesiredState>,
    pub url: Option<String>,
    pub owner: Option<String>,
    /// Absolute expiry, epoch ms; 0 = released; absent = never claimed.
    pub expires_at_ms: Option<u64>,
    pub last_seq: Option<u64>,
    /// Claims so far; 0 when never claimed.
    pub fence: u64,
    pub ttl: Option<u64>,
}

impl LeaseItem {
    /// The owner whose lease has not expired at `now_ms` (by the writer's clock).
    pub fn holder_at(&self, now_ms: u64) -> Option<&str> {
        match (&self.owner, self.expires_at_ms) {
            (Some(o), Some(exp)) if exp > now_ms => Some(o),
            _ => None,
        }
    }
}

/// A held lease. `deadline_mono_ms` is when the owner must stop acting for it, on the owner's
/// monotonic clock, whatever DynamoDB says (see [`deadline`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Lease {
    pub id: String,
    pub owner: String,
    pub fence: u64,
    pub expires_at_ms: u64,
    pub last_seq: Option<u64>,
    pub url: Option<String>,
    pub desired_state: Option<DesiredState>,
    pub deadline_mono_ms: u64,
}

impl Lease {
    /// Builds the handle from the item a successful claim or renewal returned.
    pub fn from_item(item: LeaseItem, owner: &str, sent_at_mono_ms: u64, config: &TableConfig) -> Self {
        Lease {
            id: item.id,
            owner: owner.to_string(),
            fence: item.fence,
            expires_at_ms: item.expires_at_ms.unwrap_or(0),
            last_seq: item.last_seq,
            url: item.url,
            desired_state: item.desired_state,
            deadline_mono_ms: deadline(sent_at_mono_ms, config),
        }
    }

    /// True once the local deadline has passed: the owner must not act any more.
    pub fn is_past_deadline(&self, now_mono_ms: u64) -> bool {
        now_mono_ms >= self.deadline_mono_ms
    }

    /// When to send the next renewal, on the monotonic clock.
    pub fn next_renew_mono_ms(&self, config: &TableConfig) -> u64 {
        next_renew_at(self.deadline_mono_ms, config)
    }

    /// The local deadline: the `Instant` (this process's monotonic clock, not the store's
    /// wall clock) at which the owner must stop acting, `deadline_mono_ms` on the system clock.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn deadline(&self) -> std::time::Instant {
        crate::clock::SystemClock::instant_at(self.deadline_mono_ms)
    }

    /// How long the owner may still act: [`Lease::deadline`] less now, zero once it has passed.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn time_left(&self) -> std::time::Duration {
        self.deadline().saturating_duration_since(std::time::Instant::now())
    }
}

/// The expiry a connection held under a session carries: far in the future, so it leaves the
/// orphan range and a worker of the reference design sees it held. Nothing rewrites it while the
/// session lives; whether it is really held is the session's expiry.
pub const HELD_UNDER_SESSION_MS: u64 = 32_503_680_000_000; // 3000-01-01

/// A worker's session (session mode): one item, `session/{owner}`, renewed for every connection
/// the worker holds. `epoch` is the session item's fence: a new session of the same worker gets a
/// new epoch, which ends every connection claimed under the old one.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Session {
    pub owner: String,
    pub epoch: u64,
    pub expires_at_ms: u64,
    /// Rule 2 on the session: every connection held under it must stop acting by then.
    pub deadline_mono_ms: u64,
}

impl Session {
    pub fn is_past_deadline(&self, now_mono_ms: u64) -> bool {
        now_mono_ms >= self.deadline_mono_ms
    }

    /// The session's local deadline as an `Instant`, as [`Lease::deadline`].
    #[cfg(not(target_arch = "wasm32"))]
    pub fn deadline(&self) -> std::time::Instant {
        crate::clock::SystemClock::instant_at(self.deadline_mono_ms)
    }

    /// How long what is held under the session may still act, as [`Lease::time_left`].
    #[cfg(not(target_arch = "wasm32"))]
    pub fn time_left(&self) -> std::time::Duration {
        self.deadline().saturating_duration_since(std::time::Instant::now())
    }

    /// When to send the next session renewal, on the monotonic clock.
    pub fn next_renew_mono_ms(&self, config: &TableConfig) -> u64 {
        next_renew_at(self.deadline_mono_ms, config)
    }

    /// A connection held under this session acts until the session's deadline.
    pub fn cover(&self, lease: &mut Lease) {
        lease.deadline_mono_ms = self.deadline_mono_ms;
    }
}

/// A session item as stored (listings; dead-session queries).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SessionItem {
    pub owner: String,
    pub epoch: u64,
    /// 0 once ended.
    pub expires_at_ms: u64,
    /// What the session said it holds at its last renewal (absent: it has not said).
    #[serde(default)]
    pub load: Option<SessionLoad>,
}

/// What a session reports with every renewal: the connections it holds and the most it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SessionLoad {
    pub held: u64,
    pub max_connections: u64,
}

impl SessionItem {
    /// Rule 1 on sessions: a session is dead for a claimer once its expiry is older than the
    /// claimer's clock minus the skew.
    pub fn is_dead(&self, now_ms: u64, config: &TableConfig) -> bool {
        self.expires_at_ms < claim_cutoff(now_ms, config)
    }
}

/// Whether `item` is still `lease`'s: same owner and same fence (any later claim changes the fence).
pub fn holds(item: &Option<LeaseItem>, lease: &Lease) -> bool {
    item.as_ref().is_some_and(|i| i.owner.as_deref() == Some(lease.owner.as_str()) && i.fence == lease.fence)
}

/// Whether `lease` may still act on `item`: it [`holds`] it and has not released it (a release
/// writes expiry 0 and is final: renewing or checkpointing a released lease is refused as lost,
/// whoever claims next).
pub fn holds_unreleased(item: &Option<LeaseItem>, lease: &Lease) -> bool {
    holds(item, lease) && item.as_ref().is_some_and(|i| i.expires_at_ms != Some(0))
}

/// Rule 1: a claimer only takes a lease whose expiry is older than its own clock minus the skew.
pub fn claim_cutoff(now_ms: u64, config: &TableConfig) -> u64 {
    now_ms.saturating_sub(config.skew_ms())
}

/// Whether `item` may be claimed at `now_ms` (the store's condition says the same).
pub fn is_claimable(item: &LeaseItem, now_ms: u64, config: &TableConfig) -> bool {
    item.desired_state != Some(DesiredState::Stopped)
        && item.expires_at_ms.is_none_or(|exp| exp < claim_cutoff(now_ms, config))
}

/// Whether `item` is running work that nobody holds (what the orphan index returns).
pub fn is_orphan(item: &LeaseItem, now_ms: u64, config: &TableConfig) -> bool {
    item.desired_state == Some(DesiredState::Started) && item.expires_at_ms.unwrap_or(0) < claim_cutoff(now_ms, config)
}

/// The expiry a claim or renewal sent at wall time `now_ms` writes.
pub fn expiry_for(now_ms: u64, config: &TableConfig) -> u64 {
    now_ms + config.lease_ms()
}

/// Rule 2: an owner's deadline is measured on its monotonic clock from the moment it *sent* the
/// last successful write, less the skew, so it stops before any claimer's clock allows a claim.
pub fn deadline(sent_at_mono_ms: u64, config: &TableConfig) -> u64 {
    sent_at_mono_ms + config.lease_ms() - config.skew_ms()
}

/// The next renewal is one renew interval after the last successful one was sent.
pub fn next_renew_at(deadline_mono_ms: u64, config: &TableConfig) -> u64 {
    deadline_mono_ms + config.skew_ms() + config.renew_ms() - config.lease_ms()
}

/// Full-jitter exponential backoff: `unit` in [0, 1) is the random draw, passed in to keep this pure.
pub fn backoff_ms(attempt: u32, base_ms: u64, cap_ms: u64, unit: f64) -> u64 {
    let ceiling = base_ms.saturating_mul(1u64 << attempt.min(20)).min(cap_ms);
    ((ceiling as f64) * unit.clamp(0.0, 1.0)) as u64
}

/// Whether a retry after `delay_ms` still ends before the deadline.
pub fn retry_fits(now_mono_ms: u64, delay_ms: u64, deadline_mono_ms: u64) -> bool {
    now_mono_ms + delay_ms < deadline_mono_ms
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> TableConfig {
        TableConfig::default()
    }

    #[test]
    fn claim_needs_expiry_older_than_skew() {
        let item = LeaseItem { id: "a".into(), expires_at_ms: Some(10_000), ..Default::default() };
        assert!(!is_claimable(&item, 10_000, &cfg()));
        assert!(!is_claimable(&item, 11_000, &cfg()));
        assert!(is_claimable(&item, 11_001, &cfg()));
        let fresh = LeaseItem { id: "a".into(), ..Default::default() };
        assert!(is_claimable(&fresh, 0, &cfg()));
        let stopped = LeaseItem { desired_state: Some(DesiredState::Stopped), ..fresh };
        assert!(!is_claimable(&stopped, 99_000, &cfg()));
    }

    #[test]
    fn owner_stops_before_anyone_may_claim() {
        let c = cfg();
        // The owner sends at wall W (mono 0) and writes expiry W + lease.
        let w = 1_000_000;
        let exp = expiry_for(w, &c);
        let d = deadline(0, &c);
        // A claimer whose clock runs (skew - 1) ms ahead claims at the first true time t with
        // t + skew - 1 - skew > exp, i.e. t = exp + 2; the owner has stopped long before.
        let earliest_claim = exp + 2;
        assert!(w + d < earliest_claim);
        assert_eq!(earliest_claim - (w + d), c.skew_ms() + 2);
        assert_eq!(next_renew_at(d, &c), 5_000);
    }

    #[test]
    fn backoff_is_bounded_and_grows() {
        assert_eq!(backoff_ms(0, 50, 1_000, 0.999), 49);
        assert_eq!(backoff_ms(3, 50, 1_000, 0.5), 200);
        assert_eq!(backoff_ms(30, 50, 1_000, 1.0), 1_000);
        assert_eq!(backoff_ms(5, 50, 1_000, 0.0), 0);
        assert!(retry_fits(0, 10, 11));
        assert!(!retry_fits(0, 11, 11));
    }
}
