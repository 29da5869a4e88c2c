//! The manual's election sample (docs/src/election.md includes it from its first `use`):
//! bindings/python/tests/test_manual.py runs it twice against the local engine.

use leaselock::election::{ElectionOptions, LeaderElector, Outcome};
use leaselock::{DynamoRegistry, LeaseTable, StoreElection, TableConfig};
use std::sync::Arc;
use std::time::Duration;

#[tokio::main]
async fn main() -> leaselock::Result<()> {
    let table = LeaseTable::connect(TableConfig::new("leases")).await?;
    let backend = StoreElection::new(table.clone(), DynamoRegistry::for_table(&table));
    let options = ElectionOptions::default().min_lease(Duration::from_secs(60));
    let elector = LeaderElector::new(Arc::new(backend), "host-a", options)?;
    match elector.run_if_leader("nightly-report", |term| async move { term.fence() }).await? {
        Outcome::Led { fence, .. } => println!("ran under fence {fence}"),
        Outcome::Skipped { holder } => println!("skipped: {holder:?} leads"),
    }
    Ok(())
}
