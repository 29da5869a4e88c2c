//! The manual's session-mode sample (docs/src/session-mode.md includes it from its first `use`):
//! a table set to session mode. Run twice by bindings/python/tests/test_manual.py; no engine
//! needed.

use leaselock::{LeaseMode, TableConfig};

fn main() {
    let config = TableConfig::new("leases").mode(LeaseMode::Session);
    assert_eq!(config.session_partition, "SESSION");
}
