//! leaselock: exactly-one ownership of long-lived work through time-bounded leases stored in
//! DynamoDB, with fencing tokens and no coordination service beyond the table itself.
//!
//! The lease rules ([`lease`]) are pure functions; stores ([`LeaseStore`]) do the I/O:
//! [`LeaseTable`] on DynamoDB and [`MemoryStore`] in memory, with identical semantics.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! use std::sync::Arc;
//! use leaselock::{Error, LeaseStore, ManualClock, MemoryStore, TableConfig};
//!
//! let clock = Arc::new(ManualClock::new(1_700_000_000_000));
//! let store = MemoryStore::new(TableConfig::default(), clock.clone()).unwrap();
//! store.start("stream-1", "wss://feed.example/stream-1").await.unwrap();
//!
//! let mut lease = store.acquire("stream-1", "worker-a").await.unwrap();
//! assert_eq!(lease.fence, 1);
//! assert!(matches!(store.acquire("stream-1", "worker-b").await, Err(Error::Held { .. })));
//!
//! store.checkpoint(&mut lease, 7).await.unwrap();
//! store.release(&lease).await.unwrap();
//! let next = store.acquire("stream-1", "worker-b").await.unwrap();
//! assert_eq!((next.fence, next.last_seq), (2, Some(7)));
//! # });
//! ```

pub mod clock;
pub mod config;
pub mod error;
pub mod hint;
#[cfg(feature = "dynamodb")]
pub mod hold;
pub mod holder;
pub mod keeper;
pub mod lease;
pub mod memory;
pub mod metrics;
pub mod protocol;
pub mod render;
pub mod store;
pub mod store_clock;
pub mod trace_vector;

#[cfg(feature = "dynamodb")]
pub mod dynamo;
pub mod election;
pub mod engine;
#[cfg(feature = "dynamodb")]
pub mod fenced;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "dynamodb")]
pub mod worker;
/// Without the native runtime, the worker's decisions and its settings alone (the wasm build
/// drives them).
#[cfg(not(feature = "dynamodb"))]
pub mod worker {
    pub use crate::engine::decide;
    mod settings;
    pub use settings::{WorkerField, WorkerSettings, MAX_METRICS_NAMESPACE_BYTES};
}

#[cfg(not(target_arch = "wasm32"))]
pub use clock::SystemClock;
pub use clock::{Clock, ManualClock, SkewedClock};
pub use config::{orphan_shard_of, Attributes, LeaseMode, TableConfig, MAX_ORPHAN_SHARDS};
#[cfg(feature = "dynamodb")]
pub use dynamo::LeaseTable;
#[cfg(feature = "dynamodb")]
pub use election::dynamo::DynamoRegistry;
#[cfg(any(feature = "dynamodb", feature = "redis"))]
pub use election::{
    Candidate, ElectionBackend, ElectionOptions, LeaderElector, Outcome, StoreElection, Strategy, Term,
};
pub use error::{Error, Result};
#[cfg(feature = "dynamodb")]
pub use fenced::{fenced_put, fenced_write, fenced_write_with_checkpoint};
pub use hint::{EndedSession, Hint};
#[cfg(feature = "dynamodb")]
pub use hold::Hold;
pub use lease::{DesiredState, Lease, LeaseItem, Session, SessionItem, SessionLoad};
pub use memory::MemoryStore;
pub use store_clock::{Estimate, StoreClock, StoreOffset, StoreTime};

pub use store::{LeaseStore, OrphanCursor, OrphanPage, StrandedPage, SweepCursor};
#[cfg(feature = "dynamodb")]
pub use worker::{CancelReason, Connection, Worker, WorkerHandle, WorkerSnapshot};
