//! The leaselock Lambda functions as a library: the `router` (START/STOP from API Gateway, SQS or
//! direct invocation) and the `reconciler` (scheduled orphan hints and metrics).
//!
//! Handlers take the store as `&impl LeaseStore` and the hint queue as `&dyn HintSender`, so they
//! run against [`leaselock::MemoryStore`] and [`MemoryHints`] in tests and against DynamoDB and
//! SQS in Lambda:
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use std::sync::Arc;
//! use lambda_runtime::{Context, LambdaEvent};
//! use leaselock::{ManualClock, MemoryStore, TableConfig};
//! use leaselock_lambdas::{router, Hint, MemoryHints};
//! use serde_json::json;
//!
//! let store = MemoryStore::new(TableConfig::default(), Arc::new(ManualClock::new(0))).unwrap();
//! let hints = MemoryHints::new();
//! let start = json!({"action": "START", "connection_id": "s1", "url": "wss://feed.example/s1"});
//! let out = router::handle(LambdaEvent::new(start, Context::default()), &store, &hints).await.unwrap();
//! assert_eq!(out["desired_state"], "STARTED");
//! assert_eq!(hints.sent(), vec![Hint::new("s1")]);
//! # });
//! ```

pub mod config;
pub mod emf;
pub mod hint_sender;
pub mod reconciler;
pub mod router;

pub use config::{Config, ConfigError};
pub use emf::EmfWriter;
pub use hint_sender::{Hint, HintError, HintSender, MemoryHints, SqsHints};
pub use reconciler::{Report, StateCounts};

use leaselock::LeaseTable;

/// The SDK clients, built once per process from the default chain (honours `AWS_ENDPOINT_URL`),
/// and the table checked once ([`LeaseTable::replication`]): a cold start on a global table in
/// multi-Region eventual consistency (or on a missing table) fails here, naming why.
pub async fn connect(config: &Config) -> Result<(LeaseTable, SqsHints), StartError> {
    let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let table = LeaseTable::new(aws_sdk_dynamodb::Client::new(&sdk), config.table.clone())?;
    let replication = table.replication().await?;
    tracing::info!(table = %config.table.table_name, replication = %replication.describe(), "table checked");
    let hints = SqsHints::new(aws_sdk_sqs::Client::new(&sdk), config.queue_url.clone());
    Ok((table, hints))
}

/// Why a function could not start (its table refused, missing or unreachable). `main` returning
/// it prints its Debug form: made the readable message, as [`ConfigError`]'s is.
#[derive(thiserror::Error)]
#[error("cannot start: {0}")]
pub struct StartError(#[from] pub leaselock::Error);

impl std::fmt::Debug for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}
