//! The DynamoDB requests the protocol sends and the outputs it reads, shaped like the API's JSON:
//! field names are the API's (`TableName`, `Key`, `UpdateExpression`, ...), so a request's body can
//! be handed as is to the AWS SDK for JavaScript v3 (`new UpdateItemCommand(body)`) or to a boto3
//! client (`client.update_item(**body)`). A [`Request`] serializes as `{"UpdateItem": {..body..}}`:
//! the operation's name, then its input.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::value::Item;

/// Expression attribute names (`#owner` -> `lease_owner`).
pub type Names = BTreeMap<String, String>;

/// One request to send, named by its DynamoDB operation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Request {
    GetItem(GetItem),
    UpdateItem(UpdateItem),
    Query(Query),
    Scan(Scan),
    BatchGetItem(BatchGetItem),
    /// The protocol sends only the lease's own action; the driver appends the caller's writes
    /// after it (see [`super::FencedWrite`]).
    TransactWriteItems(TransactWriteItems),
    CreateTable(TableDefinition),
    UpdateTable(UpdateTable),
    DescribeTable(DescribeTable),
    DescribeTimeToLive(DescribeTimeToLive),
    UpdateTimeToLive(UpdateTimeToLive),
}

impl Request {
    /// The DynamoDB operation's name (`"UpdateItem"`).
    pub fn operation(&self) -> &'static str {
        match self {
            Request::GetItem(_) => "GetItem",
            Request::UpdateItem(_) => "UpdateItem",
            Request::Query(_) => "Query",
            Request::Scan(_) => "Scan",
            Request::BatchGetItem(_) => "BatchGetItem",
            Request::TransactWriteItems(_) => "TransactWriteItems",
            Request::CreateTable(_) => "CreateTable",
            Request::UpdateTable(_) => "UpdateTable",
            Request::DescribeTable(_) => "DescribeTable",
            Request::DescribeTimeToLive(_) => "DescribeTimeToLive",
            Request::UpdateTimeToLive(_) => "UpdateTimeToLive",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct GetItem {
    pub table_name: String,
    pub key: Item,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consistent_read: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct UpdateItem {
    pub table_name: String,
    pub key: Item,
    pub update_expression: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub condition_expression: Option<String>,
    #[serde(default, skip_serializing_if = "Names::is_empty")]
    pub expression_attribute_names: Names,
    #[serde(default, skip_serializing_if = "Item::is_empty")]
    pub expression_attribute_values: Item,
    /// `ALL_NEW`: the protocol reads the written item back from the answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub return_values: Option<String>,
    /// `ALL_OLD`: a failed condition carries the item that failed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub return_values_on_condition_check_failure: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Query {
    pub table_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index_name: Option<String>,
    pub key_condition_expression: String,
    #[serde(default, skip_serializing_if = "Names::is_empty")]
    pub expression_attribute_names: Names,
    #[serde(default, skip_serializing_if = "Item::is_empty")]
    pub expression_attribute_values: Item,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclusive_start_key: Option<Item>,
    /// `COUNT`: the answer has a count and no items.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub select: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter_expression: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Scan {
    pub table_name: String,
    /// `true`: a strongly consistent read of the base table (twice the read units).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consistent_read: Option<bool>,
    /// The most items the page evaluates (before the filter).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub projection_expression: Option<String>,
    /// Applied after the read: it trims the answer, not the read units.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter_expression: Option<String>,
    #[serde(default, skip_serializing_if = "Names::is_empty")]
    pub expression_attribute_names: Names,
    #[serde(default, skip_serializing_if = "Item::is_empty")]
    pub expression_attribute_values: Item,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclusive_start_key: Option<Item>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct BatchGetItem {
    /// Table name to the keys to read from it.
    pub request_items: BTreeMap<String, KeysAndAttributes>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct KeysAndAttributes {
    pub keys: Vec<Item>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub projection_expression: Option<String>,
    #[serde(default, skip_serializing_if = "Names::is_empty")]
    pub expression_attribute_names: Names,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consistent_read: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct TransactWriteItems {
    pub transact_items: Vec<TransactWriteItem>,
    /// The same on every attempt, so a retried transaction that was applied is not applied twice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_request_token: Option<String>,
}

/// One action of a transaction (only the kinds the lease's own action uses).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct TransactWriteItem {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub condition_check: Option<ConditionCheck>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update: Option<Update>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ConditionCheck {
    pub table_name: String,
    pub key: Item,
    pub condition_expression: String,
    #[serde(default, skip_serializing_if = "Names::is_empty")]
    pub expression_attribute_names: Names,
    #[serde(default, skip_serializing_if = "Item::is_empty")]
    pub expression_attribute_values: Item,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub return_values_on_condition_check_failure: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Update {
    pub table_name: String,
    pub key: Item,
    pub update_expression: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub condition_expression: Option<String>,
    #[serde(default, skip_serializing_if = "Names::is_empty")]
    pub expression_attribute_names: Names,
    #[serde(default, skip_serializing_if = "Item::is_empty")]
    pub expression_attribute_values: Item,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub return_values_on_condition_check_failure: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct AttributeDefinition {
    pub attribute_name: String,
    /// `S` or `N`.
    pub attribute_type: String,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct KeySchemaElement {
    pub attribute_name: String,
    /// `HASH` or `RANGE`.
    pub key_type: String,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct Projection {
    /// `ALL` or `KEYS_ONLY`.
    pub projection_type: String,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct GlobalSecondaryIndex {
    pub index_name: String,
    pub key_schema: Vec<KeySchemaElement>,
    pub projection: Projection,
}

/// The table definition: key, the orphan index and the owner index, on-demand billing.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct TableDefinition {
    pub table_name: String,
    pub attribute_definitions: Vec<AttributeDefinition>,
    pub key_schema: Vec<KeySchemaElement>,
    /// `PAY_PER_REQUEST`.
    pub billing_mode: String,
    pub global_secondary_indexes: Vec<GlobalSecondaryIndex>,
}

/// Adds an index to an existing table.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct UpdateTable {
    pub table_name: String,
    pub attribute_definitions: Vec<AttributeDefinition>,
    pub global_secondary_index_updates: Vec<GlobalSecondaryIndexUpdate>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct GlobalSecondaryIndexUpdate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create: Option<GlobalSecondaryIndex>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct DescribeTable {
    pub table_name: String,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct DescribeTimeToLive {
    pub table_name: String,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct UpdateTimeToLive {
    pub table_name: String,
    pub time_to_live_specification: TimeToLiveSpecification,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct TimeToLiveSpecification {
    pub enabled: bool,
    pub attribute_name: String,
}

/// What a successful request returned: the union of the outputs the protocol reads, under the
/// API's names. A driver may pass the SDK's whole output object; unknown fields are ignored.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct Output {
    /// GetItem.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub item: Option<Item>,
    /// UpdateItem with `ReturnValues`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attributes: Option<Item>,
    /// Query, Scan.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub items: Option<Vec<Item>>,
    /// Query, Scan: where the next page starts (absent or empty on the last page).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_evaluated_key: Option<Item>,
    /// Query with `Select: COUNT`: the items of this page that matched.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// Scan: the items this page evaluated, before the filter.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scanned_count: Option<u64>,
    /// BatchGetItem: table name to the items found.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub responses: Option<BTreeMap<String, Vec<Item>>>,
    /// BatchGetItem: the keys to ask again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unprocessed_keys: Option<BTreeMap<String, KeysAndAttributes>>,
    /// DescribeTable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub table: Option<TableDescription>,
    /// DescribeTimeToLive.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_to_live_description: Option<TimeToLiveDescription>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct TableDescription {
    /// `CREATING`, `ACTIVE`, `UPDATING`, ...
    #[serde(skip_serializing_if = "Option::is_none")]
    pub table_status: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub global_secondary_indexes: Vec<IndexDescription>,
    /// The replicas of a global table (absent or empty for a single-Region table).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub replicas: Vec<ReplicaDescription>,
    /// A global table's consistency mode: `EVENTUAL` (MREC, also what an absent field means) or
    /// `STRONG` (MRSC).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub multi_region_consistency: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ReplicaDescription {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub region_name: Option<String>,
    /// `CREATING`, `ACTIVE`, `UPDATING`, `DELETING`, ...
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replica_status: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct IndexDescription {
    pub index_name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index_status: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct TimeToLiveDescription {
    /// `ENABLED`, `ENABLING`, `DISABLED`, `DISABLING`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_to_live_status: Option<String>,
}

/// One entry of a cancelled transaction's `CancellationReasons`, in the order of its actions.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct CancellationReason {
    /// `None`, `ConditionalCheckFailed`, `TransactionConflict`, ...
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The old item, when the action asked for it (`ALL_OLD`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub item: Option<Item>,
}
