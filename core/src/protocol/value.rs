//! DynamoDB values in the API's own JSON (`{"S": ".."}`, `{"N": ".."}`, `{"M": {..}}`), and lease
//! items to and from attribute maps under the configured names.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{LeaseItem, TableConfig};

/// One attribute value, serialized exactly as the DynamoDB JSON API (and the AWS SDK for
/// JavaScript v3, and boto3's client) writes it. Binary values are base64 text, as in the JSON API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum AttributeValue {
    S(String),
    /// A number, as its decimal text.
    N(String),
    B(String),
    #[serde(rename = "BOOL")]
    Bool(bool),
    #[serde(rename = "NULL")]
    Null(bool),
    M(Item),
    L(Vec<AttributeValue>),
    #[serde(rename = "SS")]
    Ss(Vec<String>),
    #[serde(rename = "NS")]
    Ns(Vec<String>),
    #[serde(rename = "BS")]
    Bs(Vec<String>),
}

/// An item, a key, or a map of expression values: attribute name to value.
pub type Item = BTreeMap<String, AttributeValue>;

impl AttributeValue {
    pub fn as_s(&self) -> Option<&str> {
        match self {
            AttributeValue::S(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_n(&self) -> Option<&str> {
        match self {
            AttributeValue::N(n) => Some(n),
            _ => None,
        }
    }
}

/// A string value.
pub fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

/// A number value.
pub fn n(v: u64) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

fn get_s<'a>(attrs: &'a Item, name: &str) -> Option<&'a str> {
    attrs.get(name).and_then(AttributeValue::as_s)
}

fn get_n(attrs: &Item, name: &str) -> Option<u64> {
    // Numbers written by other workers may carry a fraction or a sign; read what fits.
    attrs
        .get(name)
        .and_then(AttributeValue::as_n)
        .and_then(|n| n.parse::<u64>().ok().or_else(|| n.parse::<f64>().ok().filter(|f| *f >= 0.0).map(|f| f as u64)))
}

/// The lease item an attribute map holds (the id without the key prefix).
pub fn item_from_attrs(config: &TableConfig, attrs: &Item) -> LeaseItem {
    let a = &config.attributes;
    LeaseItem {
        id: config.id_of(get_s(attrs, &a.id).unwrap_or_default()).to_string(),
        desired_state: get_s(attrs, &a.desired_state).and_then(|v| config.parse_desired_state(v)),
        url: get_s(attrs, &a.url).map(str::to_string),
        owner: get_s(attrs, &a.owner).map(str::to_string),
        expires_at_ms: get_n(attrs, &a.expires_at_ms),
        last_seq: get_n(attrs, &a.last_seq),
        fence: get_n(attrs, &a.fence).unwrap_or(0),
        ttl: get_n(attrs, &a.ttl),
    }
}

/// The primary key of a work id.
pub fn key(config: &TableConfig, id: &str) -> Item {
    Item::from([(config.attributes.id.clone(), s(config.key(id)))])
}

/// Whether an attribute map is under this table's key prefix (several applications may share a table).
pub fn is_own(config: &TableConfig, attrs: &Item) -> bool {
    get_s(attrs, &config.attributes.id).is_some_and(|k| k.starts_with(&config.key_prefix))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DesiredState;

    #[test]
    fn values_serialize_as_the_dynamodb_json_api() {
        let item = Item::from([
            ("a".to_string(), s("x")),
            ("b".to_string(), n(7)),
            ("c".to_string(), AttributeValue::Null(true)),
            ("d".to_string(), AttributeValue::Bool(false)),
            ("e".to_string(), AttributeValue::M(Item::from([("f".to_string(), AttributeValue::L(vec![n(1)]))]))),
            ("g".to_string(), AttributeValue::Ss(vec!["p".into()])),
        ]);
        let json = serde_json::to_string(&item).unwrap();
        assert_eq!(
            json,
            r#"{"a":{"S":"x"},"b":{"N":"7"},"c":{"NULL":true},"d":{"BOOL":false},"e":{"M":{"f":{"L":[{"N":"1"}]}}},"g":{"SS":["p"]}}"#
        );
        assert_eq!(serde_json::from_str::<Item>(&json).unwrap(), item);
    }

    #[test]
    fn items_read_under_the_configured_names() {
        let config = TableConfig::new("leases").key_prefix("app/");
        let mut attrs = key(&config, "s1");
        attrs.insert("lease_owner".into(), s("w"));
        attrs.insert("fence".into(), AttributeValue::N("3.0".into()));
        attrs.insert("desired_state".into(), s("STARTED"));
        let item = item_from_attrs(&config, &attrs);
        assert_eq!((item.id.as_str(), item.owner.as_deref(), item.fence), ("s1", Some("w"), 3));
        assert_eq!(item.desired_state, Some(DesiredState::Started));
        assert!(is_own(&config, &attrs));
        assert!(!is_own(&TableConfig::new("leases").key_prefix("other/"), &attrs));
    }
}
