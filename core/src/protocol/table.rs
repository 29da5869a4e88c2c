//! The table definition and `create_table`: the table with its two indexes (orphans; owner) and
//! TTL, created when missing; an existing table without the owner index gets it added.

use super::request::{
    AttributeDefinition, DescribeTable, DescribeTimeToLive, GlobalSecondaryIndex, GlobalSecondaryIndexUpdate,
    KeySchemaElement, Output, Projection, Request, TableDefinition, TimeToLiveSpecification, UpdateTable,
    UpdateTimeToLive,
};
use super::{read_answer, triage, Answer, Budget, Input, Operation, Step, Triage};
use crate::{Error, TableConfig};

/// How long `create_table` waits for the table and its indexes to become active.
pub const CREATE_TABLE_WAIT_MS: u64 = 120_000;
/// Between two DescribeTable calls while waiting.
const POLL_MS: u64 = 250;

fn attr(name: &str, t: &str) -> AttributeDefinition {
    AttributeDefinition { attribute_name: name.into(), attribute_type: t.into() }
}

fn key_el(name: &str, t: &str) -> KeySchemaElement {
    KeySchemaElement { attribute_name: name.into(), key_type: t.into() }
}

/// The orphan index: `desired_state` partition, expiry sort, all attributes (the reconciler reads
/// the items it finds). Sparse: items without a desired state are not in it.
pub fn orphan_index(config: &TableConfig) -> GlobalSecondaryIndex {
    let a = &config.attributes;
    GlobalSecondaryIndex {
        index_name: config.index_name.clone(),
        key_schema: vec![key_el(&a.desired_state, "HASH"), key_el(&a.expires_at_ms, "RANGE")],
        projection: Projection { projection_type: "ALL".into() },
    }
}

/// The owner index: `lease_owner` partition, keys only. Sparse (never-claimed items are not in
/// it), and a renewal, which changes neither the owner nor a projected attribute, writes nothing
/// to it.
pub fn owner_index(config: &TableConfig) -> GlobalSecondaryIndex {
    GlobalSecondaryIndex {
        index_name: config.owner_index_name.clone(),
        key_schema: vec![key_el(&config.attributes.owner, "HASH")],
        projection: Projection { projection_type: "KEYS_ONLY".into() },
    }
}

/// The CreateTable request `create_table` sends.
pub fn table_definition(config: &TableConfig) -> TableDefinition {
    let a = &config.attributes;
    TableDefinition {
        table_name: config.table_name.clone(),
        attribute_definitions: vec![
            attr(&a.id, "S"),
            attr(&a.desired_state, "S"),
            attr(&a.expires_at_ms, "N"),
            attr(&a.owner, "S"),
        ],
        key_schema: vec![key_el(&a.id, "HASH")],
        billing_mode: "PAY_PER_REQUEST".into(),
        global_secondary_indexes: vec![orphan_index(config), owner_index(config)],
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Create,
    Wait,
    AddOwnerIndex,
    Ttl,
    EnableTtl,
}

/// `create_table`: creates the table (nothing happens to one that exists), waits until it and its
/// indexes are active, adds the owner index to a table that lacks it (and waits again), and turns
/// TTL on. Each request has the operation budget; the waits end after [`CREATE_TABLE_WAIT_MS`].
#[derive(Debug, Clone)]
pub struct CreateTable {
    config: TableConfig,
    phase: Phase,
    budget: Budget,
    wait_until: Option<u64>,
    index_added: bool,
}

impl CreateTable {
    pub fn new(config: &TableConfig) -> Self {
        Self {
            config: config.clone(),
            phase: Phase::Create,
            budget: Budget::operation(config),
            wait_until: None,
            index_added: false,
        }
    }

    fn request(&self) -> Request {
        let table_name = self.config.table_name.clone();
        match self.phase {
            Phase::Create => Request::CreateTable(table_definition(&self.config)),
            Phase::Wait => Request::DescribeTable(DescribeTable { table_name }),
            Phase::AddOwnerIndex => Request::UpdateTable(UpdateTable {
                table_name,
                attribute_definitions: vec![attr(&self.config.attributes.owner, "S")],
                global_secondary_index_updates: vec![GlobalSecondaryIndexUpdate {
                    create: Some(owner_index(&self.config)),
                }],
            }),
            Phase::Ttl => Request::DescribeTimeToLive(DescribeTimeToLive { table_name }),
            Phase::EnableTtl => Request::UpdateTimeToLive(UpdateTimeToLive {
                table_name,
                time_to_live_specification: TimeToLiveSpecification {
                    enabled: true,
                    attribute_name: self.config.attributes.ttl.clone(),
                },
            }),
        }
    }

    fn go<T>(&mut self, phase: Phase, input: &Input) -> Step<T> {
        self.phase = phase;
        self.budget.restart(input.mono_ms);
        self.budget.send(input.mono_ms, self.request())
    }

    fn described(&mut self, out: Output, input: &Input) -> Step<()> {
        let table = out.table.unwrap_or_default();
        let active = table.table_status.as_deref() == Some("ACTIVE")
            && table.global_secondary_indexes.iter().all(|g| g.index_status.as_deref().is_none_or(|s| s == "ACTIVE"));
        if active {
            self.wait_until = None;
            let has_owner_index =
                table.global_secondary_indexes.iter().any(|g| g.index_name == self.config.owner_index_name);
            if !has_owner_index && !self.index_added {
                return self.go(Phase::AddOwnerIndex, input);
            }
            return self.go(Phase::Ttl, input);
        }
        let until = *self.wait_until.get_or_insert(input.mono_ms + CREATE_TABLE_WAIT_MS);
        if input.mono_ms >= until {
            return Step::Fail(Error::Store(format!(
                "table {} not active after {} s",
                self.config.table_name,
                CREATE_TABLE_WAIT_MS / 1000
            )));
        }
        self.budget.restart(input.mono_ms);
        Step::Sleep { ms: POLL_MS }
    }
}

impl Operation for CreateTable {
    type Output = ();
    fn next(&mut self, mut input: Input) -> Step<()> {
        let Some(answer) = input.answer.take() else {
            return self.budget.send(input.mono_ms, self.request());
        };
        match self.phase {
            Phase::Create | Phase::AddOwnerIndex => {
                let adding = self.phase == Phase::AddOwnerIndex;
                if let Answer::ResourceInUse(m) = &answer {
                    // The table exists (or is being changed): wait for it.
                    tracing::debug!(table = %self.config.table_name, %m, "in use");
                    self.index_added |= adding;
                    return self.go(Phase::Wait, &input);
                }
                match triage(answer, &self.config.table_name) {
                    Triage::Ok(_) => {
                        tracing::debug!(table = %self.config.table_name, adding, "created");
                        self.index_added |= adding;
                        self.go(Phase::Wait, &input)
                    }
                    // Sent again: a table or index that was created says so (in use / exists).
                    Triage::Retry(cause) => self.budget.pause(&input, cause),
                    Triage::Ambiguous => self.budget.pause(&input, super::Cause::Timeout),
                    Triage::Fail(e) => Step::Fail(e),
                    Triage::Condition(_) | Triage::Canceled(_) => super::unexpected(),
                }
            }
            Phase::Wait => match read_answer(&mut self.budget, &input, answer, &self.config.table_name) {
                Ok(out) => self.described(out, &input),
                Err(step) => step,
            },
            Phase::Ttl => match read_answer(&mut self.budget, &input, answer, &self.config.table_name) {
                Ok(out) => {
                    let status = out.time_to_live_description.and_then(|d| d.time_to_live_status);
                    if matches!(status.as_deref(), Some("ENABLED" | "ENABLING")) {
                        Step::Done(())
                    } else {
                        self.go(Phase::EnableTtl, &input)
                    }
                }
                Err(step) => step,
            },
            Phase::EnableTtl => match read_answer(&mut self.budget, &input, answer, &self.config.table_name) {
                Ok(_) => Step::Done(()),
                Err(step) => step,
            },
        }
    }
}
