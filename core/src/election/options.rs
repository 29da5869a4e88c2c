//! The elector's options: plain data, validated in one place for every driver.

use std::time::Duration;

use crate::config::{validate_duration, validate_id, validate_key_prefix};
use crate::{Error, Result};

/// How an elector claims and holds. Every field has a builder method.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElectionOptions {
    /// How long a contender keeps retrying before it gives up with [`Outcome::Skipped`](super::Outcome::Skipped) (default 0: one try).
    pub wait: Duration,
    /// The lease is kept at least this long after the claim, even when the action is done sooner,
    /// so a job run on every host is not run twice in one period (default 0).
    pub min_lease: Duration,
    /// Prepended to every election key (`{prefix}leader/{name}`, `{prefix}group/{name}#slot-{i}`).
    pub key_prefix: String,
    /// Pause between two claim attempts, jittered to between half of it and all of it (default 200 ms).
    pub retry_delay: Duration,
    /// Strategic elections: how often the leader asks the strategy again; it steps down at the
    /// end of a term when the strategy picks someone else (default: the lease duration).
    pub term: Option<Duration>,
    /// Strategic elections: how long a candidate's registration lasts without a refresh
    /// (refreshed every third of it; default: the lease duration).
    pub candidate_ttl: Option<Duration>,
}

impl Default for ElectionOptions {
    fn default() -> Self {
        Self {
            wait: Duration::ZERO,
            min_lease: Duration::ZERO,
            key_prefix: String::new(),
            retry_delay: Duration::from_millis(200),
            term: None,
            candidate_ttl: None,
        }
    }
}

impl ElectionOptions {
    pub fn wait(mut self, d: Duration) -> Self {
        self.wait = d;
        self
    }

    pub fn min_lease(mut self, d: Duration) -> Self {
        self.min_lease = d;
        self
    }

    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    pub fn retry_delay(mut self, d: Duration) -> Self {
        self.retry_delay = d;
        self
    }

    pub fn term(mut self, d: Duration) -> Self {
        self.term = Some(d);
        self
    }

    pub fn candidate_ttl(mut self, d: Duration) -> Self {
        self.candidate_ttl = Some(d);
        self
    }
}

impl ElectionOptions {
    /// Checks the options and the owner an elector claims as.
    pub fn validate(&self, owner: &str) -> Result<()> {
        validate_id("owner", owner)?;
        validate_key_prefix("key_prefix", &self.key_prefix)?;
        let optional = [("term", self.term), ("candidate_ttl", self.candidate_ttl)];
        for (field, d) in [("wait", self.wait), ("min_lease", self.min_lease), ("retry_delay", self.retry_delay)]
            .into_iter()
            .chain(optional.into_iter().filter_map(|(f, d)| d.map(|d| (f, d))))
        {
            validate_duration(field, d)?;
        }
        if self.retry_delay.is_zero() {
            return Err(Error::invalid("retry_delay", "must be greater than zero"));
        }
        if self.term.is_some_and(|t| t.is_zero()) {
            return Err(Error::invalid("term", "must be greater than zero"));
        }
        if self.candidate_ttl.is_some_and(|t| t.is_zero()) {
            return Err(Error::invalid("candidate_ttl", "must be greater than zero"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(r: Result<()>) -> String {
        match r {
            Err(Error::InvalidInput { field, .. }) => field,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_key_prefix_and_timings_are_checked_at_construction() {
        let o = ElectionOptions::default;
        o().validate("host-a").unwrap();
        assert_eq!(field(o().key_prefix("app\r\n").validate("host-a")), "key_prefix");
        assert_eq!(field(o().key_prefix("p".repeat(513)).validate("host-a")), "key_prefix");
        let huge = Duration::from_millis(u64::MAX);
        assert_eq!(field(o().wait(huge).validate("host-a")), "wait");
        assert_eq!(field(o().min_lease(huge).validate("host-a")), "min_lease");
        assert_eq!(field(o().retry_delay(huge).validate("host-a")), "retry_delay");
        assert_eq!(field(o().term(huge).validate("host-a")), "term");
        assert_eq!(field(o().candidate_ttl(huge).validate("host-a")), "candidate_ttl");
        o().wait(crate::config::MAX_DURATION).validate("host-a").unwrap();
    }
}
