//! The manual's sharding sample (docs/src/configuration.md includes it from its first `use`): an
//! orphan index sharded 64 ways, and which shard an id lands on. Run twice by
//! bindings/python/tests/test_manual.py; no engine needed.

use leaselock::{orphan_shard_of, TableConfig};

fn main() {
    let config = TableConfig::new("leases").orphan_shards(64).validated().unwrap();
    assert_eq!(config.started_partitions().len(), 64); // STARTED#0 .. STARTED#63
    assert_eq!(config.started_value("meeting-42"), format!("STARTED#{}", orphan_shard_of("meeting-42", 64)));
    assert!(TableConfig::new("leases").orphan_shards(0).validated().is_err()); // 1 to 256
}
