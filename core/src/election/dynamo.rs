//! The candidate registry on DynamoDB, in the lease table: the requests and the reading of
//! their answers are the protocol's ([`crate::protocol::election`]); this only runs them with
//! the table's client, as [`LeaseTable::run`] does.

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::Client;

use super::registry::CandidateRegistry;
use super::Candidate;
use crate::dynamo::drive;
use crate::protocol::{ListCandidates, Operation, RegisterCandidate, WithdrawCandidate};
use crate::{Clock, LeaseTable, Result, SystemClock, TableConfig};

pub use crate::protocol::election::CANDIDATES_ATTRIBUTE;

/// The DynamoDB candidate registry, in the lease table.
#[derive(Debug, Clone)]
pub struct DynamoRegistry {
    client: Client,
    config: TableConfig,
    clock: Arc<dyn Clock>,
    prune_after: Option<Duration>,
}

impl DynamoRegistry {
    pub fn new(client: Client, config: TableConfig) -> Self {
        Self {
            client: crate::dynamo::single_attempt_client(&client),
            config,
            clock: Arc::new(SystemClock),
            prune_after: None,
        }
    }

    /// The registry in `table`'s table, under its key prefix, on the table's clock (the
    /// store's, measured from every answer).
    pub fn for_table(table: &LeaseTable) -> Self {
        use crate::LeaseStore;
        let (client, clock) = table.requests_client_and_clock();
        Self { client, config: table.config().clone(), clock, prune_after: None }
    }

    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Listing removes entries that ran out longer ago than this (default: one lease).
    pub fn prune_after(mut self, d: Duration) -> Self {
        self.prune_after = Some(d);
        self
    }

    async fn run<O: Operation>(&self, op: O) -> Result<O::Output> {
        drive(&self.client, &*self.clock, op, &[], None).await
    }
}

#[async_trait::async_trait]
impl CandidateRegistry for DynamoRegistry {
    async fn register(&self, election: &str, candidate: &Candidate, ttl: Duration) -> Result<()> {
        self.run(RegisterCandidate::new(&self.config, election, candidate, ttl.as_millis() as u64)?).await
    }

    async fn withdraw(&self, election: &str, candidate_id: &str) -> Result<()> {
        self.run(WithdrawCandidate::new(&self.config, election, candidate_id)?).await
    }

    async fn candidates(&self, election: &str) -> Result<Vec<Candidate>> {
        let mut op = ListCandidates::new(&self.config, election)?;
        if let Some(d) = self.prune_after {
            op = op.prune_after_ms(d.as_millis() as u64);
        }
        self.run(op).await
    }
}
