//! `leaselock::fenced` for Python: the downstream writes of a fenced transaction, given in the
//! shape boto3's `transact_write_items(TransactItems=[...])` takes (`{"Put": {...}}`,
//! `{"Update": {...}}`, `{"Delete": {...}}`, `{"ConditionCheck": {...}}`, attribute values as
//! `{"S": "..."}`, `{"N": "1"}` and so on).

use std::collections::HashMap;

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{AttributeValue, ConditionCheck, Delete, Put, TransactWriteItem, Update};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::errors::invalid;

type Attrs = HashMap<String, AttributeValue>;

fn bad(py: Python<'_>, field: &str, why: &str) -> PyErr {
    invalid(py, field, &format!("invalid {field}: {why}"))
}

fn value(py: Python<'_>, field: &str, v: &Bound<'_, PyAny>) -> PyResult<AttributeValue> {
    let d = v.cast::<PyDict>().map_err(|_| bad(py, field, "an attribute value is a dict like {\"S\": \"x\"}"))?;
    if d.len() != 1 {
        return Err(bad(py, field, "an attribute value has exactly one type key"));
    }
    let (k, inner) = d.iter().next().expect("one entry");
    let strings = |inner: &Bound<'_, PyAny>| inner.extract::<Vec<String>>();
    let kind: String = k.extract()?;
    let out = match kind.as_str() {
        "S" => AttributeValue::S(inner.extract()?),
        "N" => AttributeValue::N(inner.extract()?),
        "B" => AttributeValue::B(Blob::new(inner.extract::<Vec<u8>>()?)),
        "BOOL" => AttributeValue::Bool(inner.extract()?),
        "NULL" => AttributeValue::Null(true),
        "SS" => AttributeValue::Ss(strings(&inner)?),
        "NS" => AttributeValue::Ns(strings(&inner)?),
        "BS" => AttributeValue::Bs(inner.extract::<Vec<Vec<u8>>>()?.into_iter().map(Blob::new).collect()),
        "M" => AttributeValue::M(attrs(py, field, &inner)?),
        "L" => {
            let list = inner.cast::<PyList>().map_err(|_| bad(py, field, "L takes a list"))?;
            AttributeValue::L(list.iter().map(|v| value(py, field, &v)).collect::<PyResult<_>>()?)
        }
        other => return Err(bad(py, field, &format!("unknown attribute type {}", leaselock::render::value(other)))),
    };
    Ok(out)
}

fn attrs(py: Python<'_>, field: &str, v: &Bound<'_, PyAny>) -> PyResult<Attrs> {
    let d = v.cast::<PyDict>().map_err(|_| bad(py, field, "must be a dict"))?;
    d.iter().map(|(k, v)| Ok((k.extract::<String>()?, value(py, field, &v)?))).collect()
}

/// The parts every action shares.
struct Parts {
    table: String,
    condition: Option<String>,
    names: Option<HashMap<String, String>>,
    values: Option<Attrs>,
}

fn parts(py: Python<'_>, field: &str, d: &Bound<'_, PyDict>) -> PyResult<Parts> {
    let table = d.get_item("TableName")?.ok_or_else(|| bad(py, field, "TableName is required"))?.extract()?;
    let condition = d.get_item("ConditionExpression")?.map(|c| c.extract()).transpose()?;
    let names = d.get_item("ExpressionAttributeNames")?.map(|n| n.extract()).transpose()?;
    let values = d.get_item("ExpressionAttributeValues")?.map(|v| attrs(py, field, &v)).transpose()?;
    Ok(Parts { table, condition, names, values })
}

fn required(py: Python<'_>, field: &str, d: &Bound<'_, PyDict>, key: &str) -> PyResult<Attrs> {
    let v = d.get_item(key)?.ok_or_else(|| bad(py, field, &format!("{key} is required")))?;
    attrs(py, field, &v)
}

fn built<T, E: std::fmt::Display>(py: Python<'_>, field: &str, r: Result<T, E>) -> PyResult<T> {
    r.map_err(|e| bad(py, field, &e.to_string()))
}

/// One downstream action.
fn action(py: Python<'_>, field: &str, v: &Bound<'_, PyAny>) -> PyResult<TransactWriteItem> {
    let d = v.cast::<PyDict>().map_err(|_| bad(py, field, "each write is a dict like {\"Put\": {...}}"))?;
    if d.len() != 1 {
        return Err(bad(py, field, "each write has exactly one of Put, Update, Delete, ConditionCheck"));
    }
    let (k, body) = d.iter().next().expect("one entry");
    let body = body.cast::<PyDict>().map_err(|_| bad(py, field, "the action body must be a dict"))?;
    let p = parts(py, field, body)?;
    let kind: String = k.extract()?;
    let item = match kind.as_str() {
        "Put" => TransactWriteItem::builder().put(built(
            py,
            field,
            Put::builder()
                .table_name(p.table)
                .set_item(Some(required(py, field, body, "Item")?))
                .set_condition_expression(p.condition)
                .set_expression_attribute_names(p.names)
                .set_expression_attribute_values(p.values)
                .build(),
        )?),
        "Update" => {
            let expr: String = body
                .get_item("UpdateExpression")?
                .ok_or_else(|| bad(py, field, "UpdateExpression is required"))?
                .extract()?;
            TransactWriteItem::builder().update(built(
                py,
                field,
                Update::builder()
                    .table_name(p.table)
                    .set_key(Some(required(py, field, body, "Key")?))
                    .update_expression(expr)
                    .set_condition_expression(p.condition)
                    .set_expression_attribute_names(p.names)
                    .set_expression_attribute_values(p.values)
                    .build(),
            )?)
        }
        "Delete" => TransactWriteItem::builder().delete(built(
            py,
            field,
            Delete::builder()
                .table_name(p.table)
                .set_key(Some(required(py, field, body, "Key")?))
                .set_condition_expression(p.condition)
                .set_expression_attribute_names(p.names)
                .set_expression_attribute_values(p.values)
                .build(),
        )?),
        "ConditionCheck" => TransactWriteItem::builder().condition_check(built(
            py,
            field,
            ConditionCheck::builder()
                .table_name(p.table)
                .set_key(Some(required(py, field, body, "Key")?))
                .set_condition_expression(p.condition)
                .set_expression_attribute_names(p.names)
                .set_expression_attribute_values(p.values)
                .build(),
        )?),
        other => return Err(bad(py, field, &format!("unknown action {}", leaselock::render::value(other)))),
    };
    Ok(item.build())
}

/// The `writes` argument of the fenced write helpers.
pub(crate) fn writes(py: Python<'_>, v: &Bound<'_, PyAny>) -> PyResult<Vec<TransactWriteItem>> {
    let list = v.cast::<PyList>().map_err(|_| bad(py, "writes", "must be a list of actions"))?;
    list.iter()
        .enumerate()
        .map(|(i, w)| {
            let field = format!("writes[{i}]");
            // A value of the wrong type (an int for a str, a lone surrogate) is bad input too.
            action(py, &field, &w).map_err(|e| {
                if e.is_instance_of::<crate::errors::InvalidInput>(py) {
                    e
                } else {
                    bad(py, &field, &leaselock::render::text(&e.to_string()))
                }
            })
        })
        .collect()
}
