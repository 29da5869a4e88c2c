//! Leader, group and strategic election over any election backend: the DynamoDB lease table
//! (through [`LeaseStore`](crate::LeaseStore)), Redis, or memory.
//!
//! Every elected action gets a [`Term`]: the lease's fence (strictly increasing across the
//! leaders of one name, for fenced writes) and a cancellation that fires at the holder's local
//! deadline (rule 2: `sent_at + lease - skew` of the last successful renewal), so the action
//! stops before anyone else can be elected.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use std::sync::Arc;
//! use leaselock::election::{ElectionOptions, LeaderElector, MemoryRegistry, Outcome, StoreElection};
//! use leaselock::{MemoryStore, SystemClock, TableConfig};
//!
//! let store = MemoryStore::new(TableConfig::default(), Arc::new(SystemClock)).unwrap();
//! let backend = StoreElection::new(store, MemoryRegistry::new(Arc::new(SystemClock)));
//! let elector = LeaderElector::new(Arc::new(backend), "host-a", ElectionOptions::default()).unwrap();
//! let outcome = elector.run_if_leader("nightly-report", |term| async move { term.fence() }).await.unwrap();
//! assert!(matches!(outcome, Outcome::Led { value: 1, .. }));
//! # });
//! ```
//!
//! The candidates, the strategies, the elector's decisions ([`rules`]) and its machine
//! ([`machine::Elector`]: every claim attempt, pause, heartbeat, renewal, step-down and release of
//! a call) build without the native features (for wasm); the tokio elector, which drives the
//! machine, and the backends need tokio.

#[cfg(feature = "dynamodb")]
pub mod dynamo;
#[cfg(any(feature = "dynamodb", feature = "redis"))]
mod elector;
pub mod machine;
mod options;
#[cfg(any(feature = "dynamodb", feature = "redis"))]
mod registry;
pub mod rules;
#[cfg(any(feature = "dynamodb", feature = "redis"))]
mod store;
mod strategy;
pub mod vectors;

use std::time::Duration;

#[cfg(any(feature = "dynamodb", feature = "redis"))]
pub use elector::{LeaderElector, Outcome, Term};
pub use machine::TermEnd;
pub use options::ElectionOptions;
#[cfg(any(feature = "dynamodb", feature = "redis"))]
pub use registry::{CandidateRegistry, MemoryRegistry};
#[cfg(any(feature = "dynamodb", feature = "redis"))]
pub use store::StoreElection;
pub use strategy::Strategy;
// A candidate is what the registry stores: its type is the registry protocol's.
pub use crate::protocol::election::Candidate;

#[cfg(any(feature = "dynamodb", feature = "redis"))]
use crate::{Clock, Lease, Result};

/// The lease timing an election backend writes with (the same three durations as a lease table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    pub lease: Duration,
    pub renew: Duration,
    pub skew: Duration,
}

impl Timing {
    pub fn lease_ms(&self) -> u64 {
        self.lease.as_millis() as u64
    }

    pub fn skew_ms(&self) -> u64 {
        self.skew.as_millis() as u64
    }

    pub fn renew_ms(&self) -> u64 {
        self.renew.as_millis() as u64
    }
}

#[cfg(any(feature = "dynamodb", feature = "redis"))]
/// What an election needs from a store: named leases with a fence, fixed-size groups of them,
/// and a registry of candidates. Implemented by [`StoreElection`] (any [`LeaseStore`](crate::LeaseStore))
/// and by the Redis store.
#[async_trait::async_trait]
pub trait ElectionBackend: Send + Sync {
    /// The lease, renew interval and skew every claim of this backend uses.
    fn timing(&self) -> Timing;
    /// The clock the returned leases' deadlines are measured on.
    fn clock(&self) -> &dyn Clock;
    /// Whether this backend's leases can be exclusive, asked before every election (a lease
    /// table answers it once: see [`crate::LeaseStore::check_table`]).
    async fn check(&self) -> Result<()> {
        Ok(())
    }
    /// Claims the lease `key` for `owner` (a new, higher fence); `Held` names the holder.
    async fn claim(&self, key: &str, owner: &str) -> Result<Lease>;
    /// Claims one free slot of the group `key` (at most `slots` holders); `Held` when all are taken.
    async fn claim_slot(&self, key: &str, slots: u32, owner: &str) -> Result<Lease>;
    /// Extends a lease this backend returned; `Lost` when it is no longer ours.
    async fn renew(&self, lease: &mut Lease) -> Result<()>;
    /// Gives the lease up at once; `Lost` when it was no longer ours.
    async fn release(&self, lease: &Lease) -> Result<()>;
    /// Registers or refreshes `candidate` in `election` for `ttl`.
    async fn register(&self, election: &str, candidate: &Candidate, ttl: Duration) -> Result<()>;
    /// Removes a candidate (a no-op when it is not registered).
    async fn withdraw(&self, election: &str, candidate_id: &str) -> Result<()>;
    /// The candidates whose registration has not run out, in one consistent read.
    async fn candidates(&self, election: &str) -> Result<Vec<Candidate>>;
}

/// The most slots a group election may have: every claim may try each of them in turn.
pub const MAX_SLOTS: u32 = 1_000;

/// Refuses a slot count outside 1 to [`MAX_SLOTS`].
pub fn validate_slots(slots: u32) -> crate::Result<()> {
    if !(1..=MAX_SLOTS).contains(&slots) {
        return Err(crate::Error::invalid("slots", format!("{slots} is out of range: 1 to {MAX_SLOTS}")));
    }
    Ok(())
}

/// A slot count as a binding received it (any whole number), checked and narrowed.
pub fn slots_from(slots: u64) -> crate::Result<u32> {
    let n = u32::try_from(slots).unwrap_or(u32::MAX);
    if n as u64 != slots || !(1..=MAX_SLOTS).contains(&n) {
        return Err(crate::Error::invalid("slots", format!("{slots} is out of range: 1 to {MAX_SLOTS}")));
    }
    Ok(n)
}

/// The most metadata entries a candidate registers, and their sizes in bytes.
pub const MAX_METADATA_ENTRIES: usize = 64;
pub const MAX_METADATA_KEY_BYTES: usize = 128;
pub const MAX_METADATA_VALUE_BYTES: usize = 1024;

impl Candidate {
    /// Checks what a registration writes: the id rule, finite score and load, bounded metadata
    /// without control or invisible format characters.
    pub fn validate(&self) -> crate::Result<()> {
        use crate::config::{validate_id, validate_text};
        validate_id("candidate.id", &self.id)?;
        for (field, v) in [("candidate.score", self.score), ("candidate.load", self.load)] {
            if !v.is_finite() {
                return Err(crate::Error::invalid(field, format!("{v} is not a finite number")));
            }
        }
        if self.metadata.len() > MAX_METADATA_ENTRIES {
            return Err(crate::Error::invalid(
                "candidate.metadata",
                format!("{} entries, at most {MAX_METADATA_ENTRIES} allowed", self.metadata.len()),
            ));
        }
        for (key, value) in &self.metadata {
            if key.is_empty() {
                return Err(crate::Error::invalid("candidate.metadata", "a key must not be empty"));
            }
            validate_text("candidate.metadata", key, MAX_METADATA_KEY_BYTES)?;
            validate_text("candidate.metadata", value, MAX_METADATA_VALUE_BYTES)?;
        }
        Ok(())
    }
}

/// The stored id of a group slot lease (`{group}#slot-{i}`), and back.
pub fn slot_id(group: &str, slot: u32) -> String {
    format!("{group}#slot-{slot}")
}

/// The slot number of a slot lease id.
pub fn slot_of(id: &str) -> Option<u32> {
    id.rsplit_once("#slot-").and_then(|(_, n)| n.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_counts_and_candidates_are_bounded() {
        let field = |r: crate::Result<()>| match r {
            Err(crate::Error::InvalidInput { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        validate_slots(1).unwrap();
        assert_eq!(slots_from(7).unwrap(), 7);
        assert_eq!(field(slots_from(1 << 33).map(drop)), "slots");
        validate_slots(MAX_SLOTS).unwrap();
        for bad in [0, MAX_SLOTS + 1, u32::MAX] {
            assert_eq!(field(validate_slots(bad)), "slots");
        }
        Candidate::new("a", 1.0).meta("zone", "eu-1").validate().unwrap();
        assert_eq!(field(Candidate::new("a", f64::INFINITY).validate()), "candidate.score");
        assert_eq!(field(Candidate::new("a", 1.0).load(f64::NAN).validate()), "candidate.load");
        assert_eq!(field(Candidate::new("a", 1.0).meta("k\u{1b}", "v").validate()), "candidate.metadata");
        assert_eq!(field(Candidate::new("a", 1.0).meta("k", "v".repeat(5000)).validate()), "candidate.metadata");
        assert_eq!(field(Strategy::PreferredNode("b\0".into()).validate()), "strategy");
        Strategy::PreferredNode("b".into()).validate().unwrap();
    }
}
