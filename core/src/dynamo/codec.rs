//! Lease items to and from DynamoDB attribute maps, under the configured names.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use crate::{DesiredState, LeaseItem, TableConfig};

pub(crate) type Attrs = HashMap<String, AttributeValue>;

pub(crate) fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

pub(crate) fn n(v: u64) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

fn get_s<'a>(attrs: &'a Attrs, name: &str) -> Option<&'a str> {
    attrs.get(name).and_then(|v| v.as_s().ok()).map(String::as_str)
}

fn get_n(attrs: &Attrs, name: &str) -> Option<u64> {
    // Numbers written by other workers may carry a fraction or a sign; read what fits.
    attrs
        .get(name)
        .and_then(|v| v.as_n().ok())
        .and_then(|n| n.parse::<u64>().ok().or_else(|| n.parse::<f64>().ok().filter(|f| *f >= 0.0).map(|f| f as u64)))
}

pub(crate) fn item_from_attrs(config: &TableConfig, attrs: &Attrs) -> LeaseItem {
    let a = &config.attributes;
    LeaseItem {
        id: config.id_of(get_s(attrs, &a.id).unwrap_or_default()).to_string(),
        desired_state: get_s(attrs, &a.desired_state).and_then(DesiredState::parse),
        url: get_s(attrs, &a.url).map(str::to_string),
        owner: get_s(attrs, &a.owner).map(str::to_string),
        expires_at_ms: get_n(attrs, &a.expires_at_ms),
        last_seq: get_n(attrs, &a.last_seq),
        fence: get_n(attrs, &a.fence).unwrap_or(0),
        ttl: get_n(attrs, &a.ttl),
    }
}

/// The primary key of an id.
pub(crate) fn key(config: &TableConfig, id: &str) -> Attrs {
    HashMap::from([(config.attributes.id.clone(), s(config.key(id)))])
}
