//! `new LeaseTable({...})`'s options to a validated [`TableConfig`]. The option names are the
//! JavaScript ones; an error names the option the caller wrote, not the Rust field.

use std::time::Duration;

use leaselock::{Attributes, Error, LeaseMode, Result, TableConfig};
use serde_json::{Map, Value};

/// The options of `new LeaseTable(...)` other than `client`.
const OPTIONS: &[&str] = &[
    "tableName",
    "leaseMs",
    "renewMs",
    "clockSkewMs",
    "keyPrefix",
    "indexName",
    "ownerIndexName",
    "operationBudgetMs",
    "operationAttemptTimeoutMs",
    "attributeNames",
    "mode",
    "orphanShards",
    "allowEventualGlobalTable",
];

/// `attributeNames`' keys: any subset; the rest keep the reference schema's names.
const ATTRIBUTE_NAMES: &[&str] = &["id", "desiredState", "url", "owner", "expiresAtMs", "lastSeq", "fence", "ttl"];

/// Parses and validates the options (a JSON object), naming the offending option on error.
pub fn table_config(options_json: &str) -> Result<TableConfig> {
    let options = object("options", serde_json::from_str(options_json).map_err(|e| invalid("options", e))?)?;
    known_keys(&options, "", OPTIONS)?;
    let mode = match string(&options, "mode")? {
        None => LeaseMode::PerItem,
        Some(m) => LeaseMode::parse_option("mode", &m)?,
    };
    let table_name = string(&options, "tableName")?.ok_or_else(|| invalid("tableName", "required"))?;
    let mut config = TableConfig::new(table_name).mode(mode);
    if let Some(ms) = millis(&options, "leaseMs")? {
        config = config.lease_duration(ms);
    }
    if let Some(ms) = millis(&options, "renewMs")? {
        config = config.renew_interval(ms);
    }
    if let Some(ms) = millis(&options, "clockSkewMs")? {
        config = config.clock_skew(ms);
    }
    if let Some(prefix) = string(&options, "keyPrefix")? {
        config = config.key_prefix(prefix);
    }
    if let Some(index) = string(&options, "indexName")? {
        config = config.index_name(index);
    }
    if let Some(index) = string(&options, "ownerIndexName")? {
        config = config.owner_index_name(index);
    }
    if let Some(ms) = millis(&options, "operationBudgetMs")? {
        config = config.operation_budget(ms);
    }
    if let Some(ms) = millis(&options, "operationAttemptTimeoutMs")? {
        config = config.operation_attempt_timeout(ms);
    }
    match options.get("orphanShards") {
        None | Some(Value::Null) => {}
        Some(v) => {
            let n = v.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(|| {
                invalid(
                    "orphanShards",
                    format!("{} is not a whole number of shards", leaselock::render::value(&v.to_string())),
                )
            })?;
            config = config.orphan_shards(n);
        }
    }
    match options.get("allowEventualGlobalTable") {
        None | Some(Value::Null) => {}
        Some(Value::Bool(allow)) => config = config.allow_eventual_global_table(*allow),
        Some(_) => return Err(invalid("allowEventualGlobalTable", "must be a boolean")),
    }
    if let Some(names) = options.get("attributeNames").filter(|v| !v.is_null()) {
        let names = object("attributeNames", names.clone())?;
        known_keys(&names, "attributeNames.", ATTRIBUTE_NAMES)?;
        let name = |key: &str, default: String| -> Result<String> {
            Ok(string(&names, key)
                .map_err(|_| invalid(&format!("attributeNames.{key}"), "must be a string"))?
                .unwrap_or(default))
        };
        let d = Attributes::default();
        config = config.attributes(Attributes {
            id: name("id", d.id)?,
            desired_state: name("desiredState", d.desired_state)?,
            url: name("url", d.url)?,
            owner: name("owner", d.owner)?,
            expires_at_ms: name("expiresAtMs", d.expires_at_ms)?,
            last_seq: name("lastSeq", d.last_seq)?,
            fence: name("fence", d.fence)?,
            ttl: name("ttl", d.ttl)?,
            session_epoch: d.session_epoch,
        });
    }
    config.validated()
}

fn invalid(field: &str, msg: impl std::fmt::Display) -> Error {
    Error::invalid(field, msg)
}

pub(crate) fn object(field: &str, value: Value) -> Result<Map<String, Value>> {
    match value {
        Value::Object(map) => Ok(map),
        Value::Null => Ok(Map::new()),
        _ => Err(invalid(field, "must be an object")),
    }
}

pub(crate) fn known_keys(map: &Map<String, Value>, prefix: &str, known: &[&str]) -> Result<()> {
    match map.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => {
            let field =
                if prefix.is_empty() { "options".to_string() } else { prefix.trim_end_matches('.').to_string() };
            let shown = leaselock::render::value(k);
            Err(invalid(&field, format!("{shown} is not an option (known: {})", known.join(", "))))
        }
        None => Ok(()),
    }
}

/// An optional string option (`undefined` and `null` mean "not given").
pub(crate) fn string(map: &Map<String, Value>, key: &str) -> Result<Option<String>> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(invalid(key, "must be a string")),
    }
}

/// An optional duration in whole milliseconds.
pub(crate) fn millis(map: &Map<String, Value>, key: &str) -> Result<Option<Duration>> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(|ms| Some(Duration::from_millis(ms))).ok_or_else(|| {
            invalid(key, format!("{} is not a whole number of milliseconds", leaselock::render::value(&v.to_string())))
        }),
    }
}

/// The JavaScript name of a Rust config field, as the caller wrote it.
pub fn js_field(rust: &str) -> String {
    let known = [
        ("table_name", "tableName"),
        ("index_name", "indexName"),
        ("owner_index_name", "ownerIndexName"),
        ("operation_budget", "operationBudgetMs"),
        ("operation_attempt_timeout", "operationAttemptTimeoutMs"),
        ("key_prefix", "keyPrefix"),
        ("lease_duration", "leaseMs"),
        ("renew_interval", "renewMs"),
        ("clock_skew", "clockSkewMs"),
        ("wait", "waitMs"),
        ("min_lease", "minLeaseMs"),
        ("retry_delay", "retryDelayMs"),
        ("term", "termMs"),
        ("candidate_ttl", "candidateTtlMs"),
        ("queue_url", "queueUrl"),
        ("orphan_shards", "orphanShards"),
        ("allow_eventual_global_table", "allowEventualGlobalTable"),
    ];
    if let Some((_, js)) = known.iter().find(|(r, _)| *r == rust) {
        return js.to_string();
    }
    match rust.strip_prefix("attributes.") {
        Some(attr) => format!("attributeNames.{}", camel(attr)),
        None => camel(rust),
    }
}

fn camel(snake: &str) -> String {
    let mut out = String::with_capacity(snake.len());
    let mut upper = false;
    for c in snake.chars() {
        match c {
            '_' => upper = true,
            c if upper => {
                out.extend(c.to_uppercase());
                upper = false;
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_overrides() {
        let c = table_config(r#"{"tableName":"leases","leaseMs":3000,"renewMs":500,"clockSkewMs":200}"#).unwrap();
        assert_eq!((c.lease_ms(), c.renew_ms(), c.skew_ms()), (3000, 500, 200));
        assert_eq!(c.attributes, Attributes::default());
        let c = table_config(r#"{"tableName":"leases","attributeNames":{"lastSeq":"seq"},"keyPrefix":"a/"}"#).unwrap();
        assert_eq!((c.attributes.last_seq.as_str(), c.key("x").as_str()), ("seq", "a/x"));
    }

    #[test]
    fn js_names_in_errors() {
        assert_eq!(js_field("lease_duration"), "leaseMs");
        assert_eq!(js_field("attributes.expires_at_ms"), "attributeNames.expiresAtMs");
        assert_eq!(js_field("id"), "id");
        assert_eq!(table_config(r#"{"tableName":"leases","mode":"session"}"#).unwrap().mode, LeaseMode::Session);
        assert_eq!(table_config(r#"{"tableName":"leases","mode":"item"}"#).unwrap().mode, LeaseMode::PerItem);
        assert_eq!(table_config(r#"{"tableName":"leases","mode":"per-item"}"#).unwrap().mode, LeaseMode::PerItem);
        assert!(table_config(r#"{"tableName":"leases","mode":"sessions"}"#).unwrap_err().to_string().contains("mode"));
        assert!(table_config(r#"{"tableName":"leases","leseMs":1}"#).unwrap_err().to_string().contains("\"leseMs\""));
        assert!(matches!(
            table_config(r#"{"tableName":"leases","a\u001bb":1}"#),
            Err(Error::InvalidInput { field, message }) if field == "options" && message.contains(r"\u{1b}")
        ));
        assert_eq!(js_field("retry_delay"), "retryDelayMs");
        assert!(table_config(r#"{"tableName":"leases","leaseMs":"1"}"#).unwrap_err().to_string().contains("leaseMs"));
        let bad_attr = r#"{"tableName":"leases","attributeNames":{"fence":7}}"#;
        assert!(table_config(bad_attr).unwrap_err().to_string().contains("attributeNames.fence"));
        assert!(table_config(r#"{"leaseMs":1}"#).unwrap_err().to_string().contains("tableName"));
    }

    #[test]
    fn the_eventual_global_table_opt_in() {
        assert!(!table_config(r#"{"tableName":"leases"}"#).unwrap().allow_eventual_global_table);
        let c = table_config(r#"{"tableName":"leases","allowEventualGlobalTable":true}"#).unwrap();
        assert!(c.allow_eventual_global_table);
        let err = table_config(r#"{"tableName":"leases","allowEventualGlobalTable":1}"#).unwrap_err();
        assert!(matches!(&err, Error::InvalidInput { field, .. } if field == "allowEventualGlobalTable"), "{err}");
    }

    #[test]
    fn orphan_shards_option() {
        assert_eq!(table_config(r#"{"tableName":"leases"}"#).unwrap().orphan_shards, 1);
        assert_eq!(table_config(r#"{"tableName":"leases","orphanShards":64}"#).unwrap().orphan_shards, 64);
        for bad in ["0", "257", "1.5", "\"8\"", "-1", "4294967296"] {
            let err = table_config(&format!(r#"{{"tableName":"leases","orphanShards":{bad}}}"#)).unwrap_err();
            assert!(
                matches!(&err, Error::InvalidInput { field, .. } if js_field(field) == "orphanShards"),
                "{bad}: {err}"
            );
        }
    }
}
