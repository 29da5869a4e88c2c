//! Election over any [`LeaseStore`]: the leader and each group slot are ordinary lease items
//! (`acquire`, `renew`, `release`), written without a desired state, so they never appear in
//! the orphan index; candidates live in a [`CandidateRegistry`].

use std::time::Duration;

use super::{rules, slot_id, Candidate, CandidateRegistry, ElectionBackend, Timing};
use crate::{Clock, Error, Lease, LeaseStore, Result};

/// An election backend made of a lease store and a candidate registry.
#[derive(Debug, Clone)]
pub struct StoreElection<S, R> {
    store: S,
    registry: R,
}

impl<S: LeaseStore, R: CandidateRegistry> StoreElection<S, R> {
    pub fn new(store: S, registry: R) -> Self {
        Self { store, registry }
    }

    pub fn store(&self) -> &S {
        &self.store
    }
}

#[async_trait::async_trait]
impl<S: LeaseStore, R: CandidateRegistry> ElectionBackend for StoreElection<S, R> {
    fn timing(&self) -> Timing {
        let c = self.store.config();
        Timing { lease: c.lease_duration, renew: c.renew_interval, skew: c.clock_skew }
    }

    fn clock(&self) -> &dyn Clock {
        self.store.clock()
    }

    async fn check(&self) -> Result<()> {
        self.store.check_table().await
    }

    async fn claim(&self, key: &str, owner: &str) -> Result<Lease> {
        self.store.acquire(key, owner).await
    }

    async fn claim_slot(&self, key: &str, slots: u32, owner: &str) -> Result<Lease> {
        super::validate_slots(slots)?;
        let mut held = None;
        for slot in rules::slot_order(slots, rand::random::<f64>()) {
            match self.store.acquire(&slot_id(key, slot), owner).await {
                Ok(lease) => return Ok(lease),
                Err(e @ Error::Held { .. }) => held = held.or(Some(e)),
                Err(e) => return Err(e),
            }
        }
        Err(held.expect("at least one slot was tried"))
    }

    async fn renew(&self, lease: &mut Lease) -> Result<()> {
        self.store.renew(lease).await
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.store.release(lease).await
    }

    async fn register(&self, election: &str, candidate: &Candidate, ttl: Duration) -> Result<()> {
        self.registry.register(election, candidate, ttl).await
    }

    async fn withdraw(&self, election: &str, candidate_id: &str) -> Result<()> {
        self.registry.withdraw(election, candidate_id).await
    }

    async fn candidates(&self, election: &str) -> Result<Vec<Candidate>> {
        self.registry.candidates(election).await
    }
}
