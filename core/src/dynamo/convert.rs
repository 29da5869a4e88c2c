//! The protocol's DynamoDB data to and from `aws-sdk-dynamodb` types, field for field.

use std::collections::HashMap;

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types as sdk;
use aws_smithy_types::base64;

use crate::protocol::request::{
    AttributeDefinition, CancellationReason, ConditionCheck, GlobalSecondaryIndex, KeySchemaElement, KeysAndAttributes,
    Names, TransactWriteItem, Update,
};
use crate::protocol::{AttributeValue, Item};

type SdkItem = HashMap<String, sdk::AttributeValue>;

/// A builder that refused its input (a required field was missing).
#[derive(Debug)]
pub(crate) struct Invalid(pub String);

fn invalid(e: impl std::fmt::Display) -> Invalid {
    Invalid(e.to_string())
}

pub(crate) fn to_sdk(v: &AttributeValue) -> sdk::AttributeValue {
    let blob = |b: &String| Blob::new(base64::decode(b).unwrap_or_default());
    match v {
        AttributeValue::S(s) => sdk::AttributeValue::S(s.clone()),
        AttributeValue::N(n) => sdk::AttributeValue::N(n.clone()),
        AttributeValue::B(b) => sdk::AttributeValue::B(blob(b)),
        AttributeValue::Bool(b) => sdk::AttributeValue::Bool(*b),
        AttributeValue::Null(b) => sdk::AttributeValue::Null(*b),
        AttributeValue::M(m) => sdk::AttributeValue::M(to_sdk_item(m)),
        AttributeValue::L(l) => sdk::AttributeValue::L(l.iter().map(to_sdk).collect()),
        AttributeValue::Ss(v) => sdk::AttributeValue::Ss(v.clone()),
        AttributeValue::Ns(v) => sdk::AttributeValue::Ns(v.clone()),
        AttributeValue::Bs(v) => sdk::AttributeValue::Bs(v.iter().map(blob).collect()),
    }
}

pub(crate) fn from_sdk(v: &sdk::AttributeValue) -> AttributeValue {
    let text = |b: &Blob| base64::encode(b.as_ref());
    match v {
        sdk::AttributeValue::S(s) => AttributeValue::S(s.clone()),
        sdk::AttributeValue::N(n) => AttributeValue::N(n.clone()),
        sdk::AttributeValue::B(b) => AttributeValue::B(text(b)),
        sdk::AttributeValue::Bool(b) => AttributeValue::Bool(*b),
        sdk::AttributeValue::Null(b) => AttributeValue::Null(*b),
        sdk::AttributeValue::M(m) => AttributeValue::M(from_sdk_item(m)),
        sdk::AttributeValue::L(l) => AttributeValue::L(l.iter().map(from_sdk).collect()),
        sdk::AttributeValue::Ss(v) => AttributeValue::Ss(v.clone()),
        sdk::AttributeValue::Ns(v) => AttributeValue::Ns(v.clone()),
        sdk::AttributeValue::Bs(v) => AttributeValue::Bs(v.iter().map(text).collect()),
        // A value type newer than this SDK's model: nothing the lease model reads.
        _ => AttributeValue::Null(true),
    }
}

pub(crate) fn to_sdk_item(item: &Item) -> SdkItem {
    item.iter().map(|(k, v)| (k.clone(), to_sdk(v))).collect()
}

pub(crate) fn from_sdk_item(item: &SdkItem) -> Item {
    item.iter().map(|(k, v)| (k.clone(), from_sdk(v))).collect()
}

/// `None` for an empty map (the API refuses empty expression maps).
pub(crate) fn values(item: &Item) -> Option<SdkItem> {
    (!item.is_empty()).then(|| to_sdk_item(item))
}

pub(crate) fn names(names: &Names) -> Option<HashMap<String, String>> {
    (!names.is_empty()).then(|| names.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
}

pub(crate) fn return_on_failure(v: &Option<String>) -> Option<sdk::ReturnValuesOnConditionCheckFailure> {
    v.as_deref().map(sdk::ReturnValuesOnConditionCheckFailure::from)
}

pub(crate) fn condition_check(c: &ConditionCheck) -> Result<sdk::ConditionCheck, Invalid> {
    sdk::ConditionCheck::builder()
        .table_name(&c.table_name)
        .set_key(Some(to_sdk_item(&c.key)))
        .condition_expression(&c.condition_expression)
        .set_expression_attribute_names(names(&c.expression_attribute_names))
        .set_expression_attribute_values(values(&c.expression_attribute_values))
        .set_return_values_on_condition_check_failure(return_on_failure(&c.return_values_on_condition_check_failure))
        .build()
        .map_err(invalid)
}

pub(crate) fn update(u: &Update) -> Result<sdk::Update, Invalid> {
    sdk::Update::builder()
        .table_name(&u.table_name)
        .set_key(Some(to_sdk_item(&u.key)))
        .update_expression(&u.update_expression)
        .set_condition_expression(u.condition_expression.clone())
        .set_expression_attribute_names(names(&u.expression_attribute_names))
        .set_expression_attribute_values(values(&u.expression_attribute_values))
        .set_return_values_on_condition_check_failure(return_on_failure(&u.return_values_on_condition_check_failure))
        .build()
        .map_err(invalid)
}

pub(crate) fn transact_item(t: &TransactWriteItem) -> Result<sdk::TransactWriteItem, Invalid> {
    let mut b = sdk::TransactWriteItem::builder();
    if let Some(c) = &t.condition_check {
        b = b.condition_check(condition_check(c)?);
    }
    if let Some(u) = &t.update {
        b = b.update(update(u)?);
    }
    Ok(b.build())
}

pub(crate) fn keys_and_attributes(k: &KeysAndAttributes) -> Result<sdk::KeysAndAttributes, Invalid> {
    sdk::KeysAndAttributes::builder()
        .set_keys(Some(k.keys.iter().map(to_sdk_item).collect()))
        .set_projection_expression(k.projection_expression.clone())
        .set_expression_attribute_names(names(&k.expression_attribute_names))
        .set_consistent_read(k.consistent_read)
        .build()
        .map_err(invalid)
}

fn keys_back(k: &sdk::KeysAndAttributes) -> KeysAndAttributes {
    KeysAndAttributes {
        keys: k.keys().iter().map(from_sdk_item).collect(),
        projection_expression: k.projection_expression().map(str::to_string),
        expression_attribute_names: k
            .expression_attribute_names()
            .map(|n| n.iter().map(|(a, b)| (a.clone(), b.clone())).collect())
            .unwrap_or_default(),
        consistent_read: k.consistent_read(),
    }
}

pub(crate) fn attribute_definition(a: &AttributeDefinition) -> Result<sdk::AttributeDefinition, Invalid> {
    sdk::AttributeDefinition::builder()
        .attribute_name(&a.attribute_name)
        .attribute_type(sdk::ScalarAttributeType::from(a.attribute_type.as_str()))
        .build()
        .map_err(invalid)
}

fn key_schema(k: &KeySchemaElement) -> Result<sdk::KeySchemaElement, Invalid> {
    sdk::KeySchemaElement::builder()
        .attribute_name(&k.attribute_name)
        .key_type(sdk::KeyType::from(k.key_type.as_str()))
        .build()
        .map_err(invalid)
}

pub(crate) fn key_schemas(k: &[KeySchemaElement]) -> Result<Vec<sdk::KeySchemaElement>, Invalid> {
    k.iter().map(key_schema).collect()
}

fn projection(g: &GlobalSecondaryIndex) -> sdk::Projection {
    sdk::Projection::builder().projection_type(sdk::ProjectionType::from(g.projection.projection_type.as_str())).build()
}

pub(crate) fn gsi(g: &GlobalSecondaryIndex) -> Result<sdk::GlobalSecondaryIndex, Invalid> {
    sdk::GlobalSecondaryIndex::builder()
        .index_name(&g.index_name)
        .set_key_schema(Some(key_schemas(&g.key_schema)?))
        .projection(projection(g))
        .build()
        .map_err(invalid)
}

pub(crate) fn gsi_create(g: &GlobalSecondaryIndex) -> Result<sdk::CreateGlobalSecondaryIndexAction, Invalid> {
    sdk::CreateGlobalSecondaryIndexAction::builder()
        .index_name(&g.index_name)
        .set_key_schema(Some(key_schemas(&g.key_schema)?))
        .projection(projection(g))
        .build()
        .map_err(invalid)
}

pub(crate) fn table_description(t: &sdk::TableDescription) -> crate::protocol::request::TableDescription {
    crate::protocol::request::TableDescription {
        table_status: t.table_status().map(|s| s.as_str().to_string()),
        global_secondary_indexes: t
            .global_secondary_indexes()
            .iter()
            .map(|g| crate::protocol::request::IndexDescription {
                index_name: g.index_name().unwrap_or_default().to_string(),
                index_status: g.index_status().map(|s| s.as_str().to_string()),
            })
            .collect(),
        replicas: t
            .replicas()
            .iter()
            .map(|r| crate::protocol::request::ReplicaDescription {
                region_name: r.region_name().map(str::to_string),
                replica_status: r.replica_status().map(|s| s.as_str().to_string()),
            })
            .collect(),
        multi_region_consistency: t.multi_region_consistency().map(|c| c.as_str().to_string()),
    }
}

pub(crate) fn unprocessed(
    u: Option<&HashMap<String, sdk::KeysAndAttributes>>,
) -> Option<std::collections::BTreeMap<String, KeysAndAttributes>> {
    u.map(|u| u.iter().map(|(t, k)| (t.clone(), keys_back(k))).collect())
}

pub(crate) fn responses(
    r: Option<&HashMap<String, Vec<SdkItem>>>,
) -> Option<std::collections::BTreeMap<String, Vec<Item>>> {
    r.map(|r| r.iter().map(|(t, items)| (t.clone(), items.iter().map(from_sdk_item).collect())).collect())
}

pub(crate) fn cancellation_reasons(reasons: &[sdk::CancellationReason]) -> Vec<CancellationReason> {
    reasons
        .iter()
        .map(|r| CancellationReason {
            code: r.code().map(str::to_string),
            message: r.message().map(str::to_string),
            item: r.item().map(from_sdk_item),
        })
        .collect()
}

/// The last evaluated key of a page, `None` on the last page.
pub(crate) fn last_key(k: Option<&SdkItem>) -> Option<Item> {
    k.filter(|k| !k.is_empty()).map(from_sdk_item)
}
