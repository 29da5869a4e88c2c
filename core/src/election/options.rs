//! The elector's options: plain data, validated in one place for every driver.

use std::time::Duration;

use crate::config::validate_id;
use crate::{Error, Result};

/// How an elector claims and holds. Every field has a builder method.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElectionOptions {
    /// How long a contender keeps retrying before it gives up with [`Outcome::Skipped`] (default 0: one try).
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
