//! The candidate registry on DynamoDB: one item per election (`{prefix}candidates/{name}`)
//! holding a map of candidates (score, load, metadata, expiry), so listing is one consistent
//! GetItem and a heartbeat one UpdateItem. The item has no desired state: it is never in the
//! orphan index.
//!
//! Every request is first built as plain data ([`Request`], values in DynamoDB's JSON shape:
//! `{"S": ..}`, `{"N": ..}`, `{"M": ..}`) by the functions of [`requests`], with no I/O; the
//! executor below only converts and sends it.

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_dynamodb::Client;

use super::registry::{is_live, CandidateRegistry};
use super::Candidate;
use crate::config::validate_id;
use crate::{Clock, Error, LeaseTable, Result, SystemClock, TableConfig};

/// The attribute of a registry item holding the candidates.
pub const CANDIDATES_ATTRIBUTE: &str = "candidates";

/// One UpdateItem as plain data.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub table_name: String,
    /// `{attributes.id: {"S": stored key}}`
    pub key: serde_json::Value,
    pub update_expression: String,
    pub condition_expression: Option<String>,
    pub names: serde_json::Map<String, serde_json::Value>,
    pub values: serde_json::Map<String, serde_json::Value>,
}

/// The registry's requests and the reading of its item: no I/O.
pub mod requests {
    use serde_json::{json, Map, Value};

    use super::{Candidate, Request, CANDIDATES_ATTRIBUTE};
    use crate::TableConfig;

    fn key(config: &TableConfig, election: &str) -> Value {
        json!({ config.attributes.id.clone(): { "S": config.key(election) } })
    }

    /// A candidate's entry in the map.
    pub fn entry(candidate: &Candidate, expires_at_ms: u64) -> Value {
        let meta: Map<String, Value> = candidate.metadata.iter().map(|(k, v)| (k.clone(), json!({ "S": v }))).collect();
        json!({ "M": {
            "score": { "N": candidate.score.to_string() },
            "load": { "N": candidate.load.to_string() },
            "meta": { "M": meta },
            "exp": { "N": expires_at_ms.to_string() },
        }})
    }

    fn names(pairs: &[(&str, &str)]) -> Map<String, Value> {
        pairs.iter().map(|(k, v)| (k.to_string(), json!(v))).collect()
    }

    /// Sets one entry of an existing map (the heartbeat).
    pub fn refresh(config: &TableConfig, election: &str, candidate: &Candidate, expires_at_ms: u64) -> Request {
        Request {
            table_name: config.table_name.clone(),
            key: key(config, election),
            update_expression: "SET #c.#id = :entry".into(),
            condition_expression: Some("attribute_exists(#c)".into()),
            names: names(&[("#c", CANDIDATES_ATTRIBUTE), ("#id", &candidate.id)]),
            values: Map::from_iter([(":entry".to_string(), entry(candidate, expires_at_ms))]),
        }
    }

    /// Creates the map with its first entry (when [`refresh`] found no map).
    pub fn create(config: &TableConfig, election: &str, candidate: &Candidate, expires_at_ms: u64) -> Request {
        let map = json!({ "M": { candidate.id.clone(): entry(candidate, expires_at_ms) } });
        Request {
            table_name: config.table_name.clone(),
            key: key(config, election),
            update_expression: "SET #c = :map".into(),
            condition_expression: Some("attribute_not_exists(#c)".into()),
            names: names(&[("#c", CANDIDATES_ATTRIBUTE)]),
            values: Map::from_iter([(":map".to_string(), map)]),
        }
    }

    /// Removes one entry (its condition fails harmlessly when there is no map).
    pub fn withdraw(config: &TableConfig, election: &str, candidate_id: &str) -> Request {
        Request {
            table_name: config.table_name.clone(),
            key: key(config, election),
            update_expression: "REMOVE #c.#id".into(),
            condition_expression: Some("attribute_exists(#c)".into()),
            names: names(&[("#c", CANDIDATES_ATTRIBUTE), ("#id", candidate_id)]),
            values: Map::new(),
        }
    }

    /// The candidates of a registry item (its `candidates` attribute, DynamoDB JSON), all of them.
    pub fn parse(map: &Value) -> Vec<Candidate> {
        let num = |v: &Value, f: &str| v.get(f).and_then(|x| x.get("N")).and_then(|n| n.as_str()?.parse::<f64>().ok());
        let mut out: Vec<Candidate> = map
            .get("M")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .filter_map(|(id, e)| {
                let e = e.get("M")?;
                let metadata = e
                    .get("meta")
                    .and_then(|m| m.get("M"))
                    .and_then(Value::as_object)
                    .into_iter()
                    .flatten()
                    .filter_map(|(k, v)| Some((k.clone(), v.get("S")?.as_str()?.to_string())))
                    .collect();
                Some(Candidate {
                    id: id.clone(),
                    score: num(e, "score")?,
                    load: num(e, "load").unwrap_or(0.0),
                    metadata,
                    expires_at_ms: num(e, "exp")? as u64,
                })
            })
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn entries_round_trip_and_requests_use_placeholders() {
            let config = TableConfig::new("leases").key_prefix("app/");
            let c = Candidate::new("node-1", 30.5).load(0.25).meta("zone", "a");
            let r = refresh(&config, "candidates/jobs", &c, 99);
            assert_eq!(r.key, json!({ "connection_id": { "S": "app/candidates/jobs" } }));
            assert_eq!(r.update_expression, "SET #c.#id = :entry");
            assert_eq!(r.names["#id"], json!("node-1"));
            let map = json!({ "M": { "node-1": r.values[":entry"].clone() } });
            assert_eq!(parse(&map), vec![Candidate { expires_at_ms: 99, ..c.clone() }]);
            let created = create(&config, "candidates/jobs", &c, 99);
            assert_eq!(parse(&created.values[":map"]), vec![Candidate { expires_at_ms: 99, ..c }]);
        }
    }
}

/// The DynamoDB candidate registry, in the lease table.
#[derive(Debug, Clone)]
pub struct DynamoRegistry {
    client: Client,
    config: TableConfig,
    clock: Arc<dyn Clock>,
}

impl DynamoRegistry {
    pub fn new(client: Client, config: TableConfig) -> Self {
        Self { client, config, clock: Arc::new(SystemClock) }
    }

    /// The registry in `table`'s table, under its key prefix.
    pub fn for_table(table: &LeaseTable) -> Self {
        use crate::LeaseStore;
        Self::new(table.client().clone(), table.config().clone())
    }

    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Sends `req`; `Ok(false)` when its condition failed.
    async fn send(&self, req: Request) -> Result<bool> {
        let key = attrs(&req.key);
        let names = req.names.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string())).collect();
        let mut op = self
            .client
            .update_item()
            .table_name(req.table_name)
            .set_key(Some(key))
            .update_expression(req.update_expression)
            .set_condition_expression(req.condition_expression)
            .set_expression_attribute_names(Some(names));
        if !req.values.is_empty() {
            op = op.set_expression_attribute_values(Some(
                req.values.iter().map(|(k, v)| (k.clone(), attribute(v))).collect(),
            ));
        }
        match op.send().await {
            Ok(_) => Ok(true),
            Err(e) if e.as_service_error().is_some_and(|e| e.is_conditional_check_failed_exception()) => Ok(false),
            Err(e) => Err(sdk_error(e)),
        }
    }
}

fn sdk_error<E: std::error::Error + 'static, R: std::fmt::Debug>(e: aws_sdk_dynamodb::error::SdkError<E, R>) -> Error {
    use aws_sdk_dynamodb::error::SdkError;
    let text = aws_smithy_types::error::display::DisplayErrorContext(&e).to_string();
    match e {
        SdkError::TimeoutError(_) => Error::Timeout { outcome_unknown: true },
        SdkError::DispatchFailure(_) => Error::Unreachable(text),
        _ if text.contains("Throttling") || text.contains("ProvisionedThroughputExceeded") => Error::Throttled,
        _ => Error::Store(text),
    }
}

/// DynamoDB JSON to the SDK's value (S, N, M, BOOL, NULL and L are all the registry writes).
fn attribute(v: &serde_json::Value) -> AttributeValue {
    let obj = v.as_object();
    let field = |name: &str| obj.and_then(|o| o.get(name));
    if let Some(s) = field("S").and_then(|s| s.as_str()) {
        AttributeValue::S(s.to_string())
    } else if let Some(n) = field("N").and_then(|s| s.as_str()) {
        AttributeValue::N(n.to_string())
    } else if let Some(m) = field("M") {
        AttributeValue::M(attrs(m))
    } else if let Some(l) = field("L").and_then(|l| l.as_array()) {
        AttributeValue::L(l.iter().map(attribute).collect())
    } else if let Some(b) = field("BOOL").and_then(|b| b.as_bool()) {
        AttributeValue::Bool(b)
    } else {
        AttributeValue::Null(true)
    }
}

fn attrs(v: &serde_json::Value) -> std::collections::HashMap<String, AttributeValue> {
    v.as_object().into_iter().flatten().map(|(k, v)| (k.clone(), attribute(v))).collect()
}

/// The SDK's value back to DynamoDB JSON.
fn json_of(v: &AttributeValue) -> serde_json::Value {
    use serde_json::json;
    match v {
        AttributeValue::S(s) => json!({ "S": s }),
        AttributeValue::N(n) => json!({ "N": n }),
        AttributeValue::M(m) => {
            json!({ "M": m.iter().map(|(k, v)| (k.clone(), json_of(v))).collect::<serde_json::Map<_, _>>() })
        }
        AttributeValue::L(l) => json!({ "L": l.iter().map(json_of).collect::<Vec<_>>() }),
        AttributeValue::Bool(b) => json!({ "BOOL": b }),
        _ => json!({ "NULL": true }),
    }
}

#[async_trait::async_trait]
impl CandidateRegistry for DynamoRegistry {
    async fn register(&self, election: &str, candidate: &Candidate, ttl: Duration) -> Result<()> {
        validate_id("candidate.id", &candidate.id)?;
        if !candidate.score.is_finite() || !candidate.load.is_finite() {
            return Err(Error::invalid("candidate", "score and load must be finite numbers"));
        }
        let exp = self.clock.now_ms() + ttl.as_millis() as u64;
        // Two writers may race to create the map: whoever loses retries the refresh.
        for _ in 0..3 {
            if self.send(requests::refresh(&self.config, election, candidate, exp)).await? {
                return Ok(());
            }
            if self.send(requests::create(&self.config, election, candidate, exp)).await? {
                return Ok(());
            }
        }
        Err(Error::Store(format!("candidate registry {election}: the map kept changing")))
    }

    async fn withdraw(&self, election: &str, candidate_id: &str) -> Result<()> {
        self.send(requests::withdraw(&self.config, election, candidate_id)).await.map(|_| ())
    }

    async fn candidates(&self, election: &str) -> Result<Vec<Candidate>> {
        let out = self
            .client
            .get_item()
            .table_name(&self.config.table_name)
            .key(&self.config.attributes.id, AttributeValue::S(self.config.key(election)))
            .consistent_read(true)
            .send()
            .await
            .map_err(sdk_error)?;
        let now = self.clock.now_ms();
        let map = out.item().and_then(|i| i.get(CANDIDATES_ATTRIBUTE)).map(json_of);
        Ok(map
            .map(|m| requests::parse(&m))
            .unwrap_or_default()
            .into_iter()
            .filter(|c| is_live(c.expires_at_ms, now))
            .collect())
    }
}
