//! `check_table`: whether leases on the table can be exclusive, decided once from DescribeTable
//! before a process claims anything. A single-Region table can; so can a global table in
//! multi-Region strong consistency (MRSC), whose conditional writes hold across Regions (it
//! answers cross-Region contention with `ReplicatedWriteConflictException`, retried as any
//! conflict). A global table in multi-Region eventual consistency (MREC, the default) resolves
//! concurrent writes in two Regions last-writer-wins: two workers in two Regions can both
//! "claim" the same lease, so it is refused unless the table's settings opt in.

use serde::{Deserialize, Serialize};

use super::request::{DescribeTable, Request, TableDescription};
use super::{read_answer, Budget, Input, Operation, Step};
use crate::config::ALLOW_EVENTUAL_GLOBAL_TABLE_ENV;
use crate::{Error, TableConfig};

/// What the table is, as far as lease exclusivity goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum TableReplication {
    /// No replicas: one Region, conditional writes are serialized there.
    SingleRegion,
    /// A global table in multi-Region strong consistency (MRSC), with its replicas' Regions.
    Strong { regions: Vec<String> },
    /// Not described: the settings accept an eventually consistent global table
    /// ([`TableConfig::allow_eventual_global_table`]), so there was nothing to decide.
    NotChecked,
}

impl TableReplication {
    /// One line for operators (`leaselock table create`).
    pub fn describe(&self) -> String {
        match self {
            TableReplication::SingleRegion => "a single-Region table".into(),
            TableReplication::Strong { regions } => {
                format!("a global table in multi-Region strong consistency (MRSC; replicas: {})", regions.join(", "))
            }
            TableReplication::NotChecked => format!(
                "not checked for global-table replication ({} is set)",
                crate::config::ALLOW_EVENTUAL_GLOBAL_TABLE_ENV
            ),
        }
    }
}

/// The decision on a table description: single-Region and MRSC tables are accepted; a global
/// table in any other consistency (`EVENTUAL`, or the field absent, which means `EVENTUAL`) is
/// refused with an error naming the table, its replicas and the opt-in.
pub fn replication_verdict(config: &TableConfig, table: &TableDescription) -> crate::Result<TableReplication> {
    if table.replicas.is_empty() {
        return Ok(TableReplication::SingleRegion);
    }
    let regions: Vec<String> =
        table.replicas.iter().map(|r| crate::render::text(r.region_name.as_deref().unwrap_or("?"))).collect();
    match table.multi_region_consistency.as_deref() {
        Some("STRONG") => Ok(TableReplication::Strong { regions }),
        mode => Err(eventual_global_table(&config.table_name, mode, &regions)),
    }
}

/// The refusal of a global table whose replicas resolve concurrent writes last-writer-wins.
pub fn eventual_global_table(table: &str, mode: Option<&str>, regions: &[String]) -> Error {
    let consistency = match mode {
        None | Some("EVENTUAL") => "multi-Region eventual consistency".to_string(),
        Some(other) => format!("multi-Region consistency {}", crate::render::value(other)),
    };
    Error::invalid(
        "table",
        format!(
            "{table} is a global table in {consistency} (replicas: {}), where concurrent writes in two \
             Regions resolve last-writer-wins, so a lease on it is not exclusive across Regions; use a \
             single-Region table or a multi-Region strong consistency (MRSC) global table, or, if every \
             writer of this table writes in one Region, opt in with allow_eventual_global_table \
             ({ALLOW_EVENTUAL_GLOBAL_TABLE_ENV}=1)",
            regions.join(", ")
        ),
    )
}

/// `check_table`: one DescribeTable (with the operation budget: an unreadable answer or a
/// throttled one is asked again) and [`replication_verdict`] on it. `TableNotFound` when the
/// table does not exist. With [`TableConfig::allow_eventual_global_table`] nothing is sent.
#[derive(Debug, Clone)]
pub struct CheckTable {
    config: TableConfig,
    budget: Budget,
}

impl CheckTable {
    pub fn new(config: &TableConfig) -> Self {
        Self { config: config.clone(), budget: Budget::operation(config) }
    }
}

impl Operation for CheckTable {
    type Output = TableReplication;
    fn next(&mut self, mut input: Input) -> Step<TableReplication> {
        let Some(answer) = input.answer.take() else {
            if self.config.allow_eventual_global_table {
                return Step::Done(TableReplication::NotChecked);
            }
            let request = Request::DescribeTable(DescribeTable { table_name: self.config.table_name.clone() });
            return self.budget.send(input.mono_ms, request);
        };
        match read_answer(&mut self.budget, &input, answer, &self.config.table_name) {
            Ok(out) => match out.table {
                Some(table) => match replication_verdict(&self.config, &table) {
                    Ok(kind) => Step::Done(kind),
                    Err(e) => Step::Fail(e),
                },
                None => Step::Fail(Error::Store("DescribeTable answered without a table description".into())),
            },
            Err(step) => step,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Answer, Output};

    fn input(mono: u64) -> Input {
        Input::new(1_800_000_000_000 + mono, mono, 0.5)
    }

    /// A DescribeTable answer as the JSON API (and the JavaScript SDK) returns it.
    fn described(json: serde_json::Value) -> Answer {
        Answer::Ok(serde_json::from_value::<Output>(json).expect("a DescribeTable output"))
    }

    /// The check of `config` answered with `answer`.
    fn check(config: &TableConfig, answer: Answer) -> Step<TableReplication> {
        let mut op = CheckTable::new(config);
        match op.next(input(0)) {
            Step::Send { request: Request::DescribeTable(d), .. } => assert_eq!(d.table_name, config.table_name),
            other => panic!("expected a DescribeTable, got {other:?}"),
        }
        op.next(input(5).with(answer))
    }

    fn refusal(step: Step<TableReplication>) -> String {
        match step {
            Step::Fail(e @ Error::InvalidInput { .. }) => e.to_string(),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    const MREC_MESSAGE: &str = "invalid table: leases is a global table in multi-Region eventual consistency \
        (replicas: us-east-1, eu-west-1), where concurrent writes in two Regions resolve last-writer-wins, so a \
        lease on it is not exclusive across Regions; use a single-Region table or a multi-Region strong \
        consistency (MRSC) global table, or, if every writer of this table writes in one Region, opt in with \
        allow_eventual_global_table (LEASELOCK_ALLOW_EVENTUAL_GLOBAL_TABLE=1)";

    #[test]
    fn a_table_without_replicas_is_single_region() {
        let config = TableConfig::new("leases");
        let plain = serde_json::json!({"Table": {"TableName": "leases", "TableStatus": "ACTIVE", "ItemCount": 3}});
        assert!(matches!(check(&config, described(plain)), Step::Done(TableReplication::SingleRegion)));
        // After its last replica was removed the list is empty.
        let emptied = serde_json::json!({"Table": {"TableStatus": "ACTIVE", "Replicas": []}});
        assert!(matches!(check(&config, described(emptied)), Step::Done(TableReplication::SingleRegion)));
    }

    #[test]
    fn a_strongly_consistent_global_table_is_accepted() {
        let mrsc = serde_json::json!({"Table": {
            "TableName": "leases",
            "TableStatus": "ACTIVE",
            "Replicas": [
                {"RegionName": "us-east-1", "ReplicaStatus": "ACTIVE"},
                {"RegionName": "us-east-2", "ReplicaStatus": "ACTIVE"}
            ],
            "GlobalTableWitnesses": [{"RegionName": "us-west-2", "WitnessStatus": "ACTIVE"}],
            "MultiRegionConsistency": "STRONG"
        }});
        match check(&TableConfig::new("leases"), described(mrsc)) {
            Step::Done(TableReplication::Strong { regions }) => assert_eq!(regions, ["us-east-1", "us-east-2"]),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_eventually_consistent_global_table_is_refused_naming_the_table_and_the_opt_in() {
        let replicas = serde_json::json!([
            {"RegionName": "us-east-1", "ReplicaStatus": "ACTIVE"},
            {"RegionName": "eu-west-1", "ReplicaStatus": "ACTIVE"}
        ]);
        let config = TableConfig::new("leases");
        let mrec = serde_json::json!({"Table": {"TableStatus": "ACTIVE", "Replicas": replicas, "MultiRegionConsistency": "EVENTUAL"}});
        assert_eq!(refusal(check(&config, described(mrec))), MREC_MESSAGE);
        // The field absent is the default, EVENTUAL (tables made before MRSC existed).
        let unnamed = serde_json::json!({"Table": {"TableStatus": "ACTIVE", "Replicas": replicas}});
        assert_eq!(refusal(check(&config, described(unnamed))), MREC_MESSAGE);
        // A mode this version does not know is not taken for strong consistency.
        let unknown = serde_json::json!({"Table": {"TableStatus": "ACTIVE", "Replicas": replicas, "MultiRegionConsistency": "LINEAR"}});
        let text = refusal(check(&config, described(unknown)));
        assert!(text.contains(r#"in multi-Region consistency "LINEAR" (replicas"#), "{text}");
    }

    #[test]
    fn the_opt_in_accepts_an_eventually_consistent_global_table_without_asking() {
        let config = TableConfig::new("leases").allow_eventual_global_table(true);
        let mut op = CheckTable::new(&config);
        assert!(matches!(op.next(input(0)), Step::Done(TableReplication::NotChecked)));
    }

    #[test]
    fn a_missing_table_is_named_as_before_and_a_throttled_check_is_asked_again() {
        let config = TableConfig::new("leases");
        let missing = Answer::from_service_error("ResourceNotFoundException", "Requested resource not found", 400);
        match check(&config, missing) {
            Step::Fail(e) => assert_eq!(e.to_string(), "table leases does not exist (run `leaselock table create`)"),
            other => panic!("{other:?}"),
        }
        let throttled = Answer::from_service_error("ThrottlingException", "slow down", 400);
        assert!(matches!(check(&config, throttled), Step::Sleep { .. }));
        let denied = Answer::from_service_error(
            "AccessDeniedException",
            "not authorized to perform: dynamodb:DescribeTable",
            400,
        );
        match check(&config, denied) {
            Step::Fail(Error::AccessDenied(m)) => assert!(m.contains("dynamodb:DescribeTable"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn region_names_are_printed_escaped() {
        let config = TableConfig::new("leases");
        let hostile = serde_json::json!({"Table": {"Replicas": [{"RegionName": "us\u{1b}[2J"}]}});
        let text = refusal(check(&config, described(hostile)));
        assert!(text.contains(r"replicas: us\u{1b}[2J)"), "{text}");
    }
}
