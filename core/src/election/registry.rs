//! The candidate registry of strategic elections: each candidate under its own short lease.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::rules::is_live;
use super::Candidate;
use crate::{Clock, Result};

/// Registers, refreshes, withdraws and lists the candidates of named elections.
#[async_trait::async_trait]
pub trait CandidateRegistry: Send + Sync {
    /// Registers or refreshes `candidate` for `ttl` from now.
    async fn register(&self, election: &str, candidate: &Candidate, ttl: Duration) -> Result<()>;
    /// Removes a candidate; a no-op when it is not there.
    async fn withdraw(&self, election: &str, candidate_id: &str) -> Result<()>;
    /// The candidates whose registration has not run out.
    async fn candidates(&self, election: &str) -> Result<Vec<Candidate>>;
}

/// An in-memory registry (tests, simulations); clones share the candidates.
#[derive(Debug, Clone)]
pub struct MemoryRegistry {
    clock: Arc<dyn Clock>,
    elections: Arc<Mutex<HashMap<String, HashMap<String, Candidate>>>>,
}

impl MemoryRegistry {
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self { clock, elections: Arc::default() }
    }
}

#[async_trait::async_trait]
impl CandidateRegistry for MemoryRegistry {
    async fn register(&self, election: &str, candidate: &Candidate, ttl: Duration) -> Result<()> {
        candidate.validate()?;
        let entry = Candidate { expires_at_ms: self.clock.now_ms() + ttl.as_millis() as u64, ..candidate.clone() };
        let mut all = self.elections.lock().expect("registry poisoned");
        all.entry(election.to_string()).or_default().insert(candidate.id.clone(), entry);
        Ok(())
    }

    async fn withdraw(&self, election: &str, candidate_id: &str) -> Result<()> {
        let mut all = self.elections.lock().expect("registry poisoned");
        if let Some(e) = all.get_mut(election) {
            e.remove(candidate_id);
        }
        Ok(())
    }

    async fn candidates(&self, election: &str) -> Result<Vec<Candidate>> {
        let now = self.clock.now_ms();
        let all = self.elections.lock().expect("registry poisoned");
        let mut out: Vec<Candidate> = all
            .get(election)
            .map(|e| e.values().filter(|c| is_live(c.expires_at_ms, now)).cloned().collect())
            .unwrap_or_default();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }
}
