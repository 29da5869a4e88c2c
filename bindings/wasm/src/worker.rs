//! The JavaScript `Worker`'s options, validated with core's defaults and limits (the engine
//! takes every decision: `crate::engine`), and cancel reasons by name.

use leaselock::worker::decide::{self, CancelReason};
use leaselock::Error;
use serde::Serialize;
use serde_json::Value;

fn ms(d: std::time::Duration) -> u64 {
    d.as_millis() as u64
}

/// `new Worker(...)`'s settings, with core's defaults filled in, and the worker's fixed limits
/// (claims in flight, how long a long poll or a hand-over hint may take).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Settings {
    pub worker_id: String,
    pub max_connections: u64,
    pub orphan_interval_ms: u64,
    pub desired_state_interval_ms: u64,
    pub handler_grace_ms: u64,
    pub hint_wait_ms: u64,
    /// Session mode: how far behind the table the owner index may be.
    pub index_lag_ms: u64,
    pub claim_concurrency: usize,
    pub hint_claim_concurrency: usize,
    pub poll_answer_margin_ms: u64,
    pub hand_over_timeout_ms: u64,
    pub metrics_interval_ms: u64,
    /// An SQS client was given: hints are received and sent.
    pub hints: bool,
    /// The CloudWatch namespace of the metrics lines.
    pub metrics_namespace: String,
    /// Session mode: claim no more than the fair share and hand the excess over.
    pub balance: bool,
    /// Claims wait until the store's clock is known within this (none: half the clock skew).
    pub clock_tolerance_ms: Option<u64>,
    /// Whether claims wait for the store's clock at all.
    pub wait_for_store_clock: bool,
}

const SETTINGS: &[&str] = &[
    "workerId",
    "queueUrl",
    "maxConnections",
    "orphanIntervalMs",
    "desiredStateIntervalMs",
    "handlerGraceMs",
    "hintWaitMs",
    "indexLagMs",
    "metricsIntervalMs",
    "metricsNamespace",
    "balance",
    "clockToleranceMs",
    "waitForStoreClock",
    "hints",
];

fn invalid(field: &str, msg: impl std::fmt::Display) -> Error {
    Error::invalid(field, msg)
}

/// Validates the worker's options (JSON, without `table`, `sqs` and `handler`; `hints` says
/// whether an SQS client was given), naming the offending option.
pub fn settings(json: &str) -> leaselock::Result<Settings> {
    let v: Value = serde_json::from_str(json).map_err(|e| invalid("options", e))?;
    let map = v.as_object().ok_or_else(|| invalid("options", "must be an object"))?;
    if let Some(k) = map.keys().find(|k| !SETTINGS.contains(&k.as_str())) {
        let known = SETTINGS[..SETTINGS.len() - 1].join(", ");
        return Err(invalid("options", format!("{} is not an option (known: {known})", leaselock::render::value(k))));
    }
    let num = |key: &str, default: u64, min: u64| -> leaselock::Result<u64> {
        match map.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => v.as_u64().filter(|n| *n >= min).ok_or_else(|| {
                let shown = leaselock::render::value(&v.to_string());
                invalid(key, format!("{shown} is not a whole number of at least {min}"))
            }),
        }
    };
    let worker_id =
        map.get("workerId").and_then(Value::as_str).ok_or_else(|| invalid("workerId", "must be a string"))?;
    leaselock::config::validate_id("workerId", worker_id)?;
    let hints = map.get("hints").and_then(Value::as_bool).unwrap_or(false);
    let balance = match map.get("balance") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(v) => return Err(invalid("balance", format!("{v} is not true or false"))),
    };
    let wait_for_store_clock = match map.get("waitForStoreClock") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(v) => return Err(invalid("waitForStoreClock", format!("{v} is not true or false"))),
    };
    let clock_tolerance_ms = match map.get("clockToleranceMs") {
        None | Some(Value::Null) => None,
        Some(_) => Some(num("clockToleranceMs", 0, 1)?),
    };
    match map.get("queueUrl") {
        None | Some(Value::Null) if hints => return Err(invalid("queueUrl", "required with sqs")),
        Some(Value::String(_)) if !hints => return Err(invalid("sqs", "an SQSClient is required with queueUrl")),
        Some(Value::String(url)) => leaselock::config::validate_queue_url(url)?,
        None | Some(Value::Null) => {}
        Some(_) => return Err(invalid("queueUrl", "must be a string")),
    }
    let metrics_namespace = match map.get("metricsNamespace") {
        None | Some(Value::Null) => leaselock::metrics::NAMESPACE.to_string(),
        Some(Value::String(ns)) if !ns.is_empty() => {
            leaselock::config::validate_text("metricsNamespace", ns, 255)?;
            ns.clone()
        }
        Some(_) => return Err(invalid("metricsNamespace", "must be a non-empty string")),
    };
    let settings = Settings {
        worker_id: worker_id.to_string(),
        max_connections: num("maxConnections", decide::DEFAULT_MAX_CONNECTIONS as u64, 1)?,
        orphan_interval_ms: num("orphanIntervalMs", ms(decide::DEFAULT_ORPHAN_INTERVAL), 1)?,
        desired_state_interval_ms: num("desiredStateIntervalMs", ms(decide::DEFAULT_DESIRED_STATE_INTERVAL), 1)?,
        handler_grace_ms: num("handlerGraceMs", ms(decide::DEFAULT_HANDLER_GRACE), 0)?,
        hint_wait_ms: num("hintWaitMs", ms(decide::DEFAULT_HINT_WAIT), 0)?,
        index_lag_ms: num("indexLagMs", ms(decide::DEFAULT_INDEX_LAG), 0)?,
        claim_concurrency: decide::CLAIM_CONCURRENCY,
        hint_claim_concurrency: decide::HINT_CLAIM_CONCURRENCY,
        poll_answer_margin_ms: ms(decide::POLL_ANSWER_MARGIN),
        hand_over_timeout_ms: ms(decide::HAND_OVER_TIMEOUT),
        metrics_interval_ms: num("metricsIntervalMs", ms(decide::DEFAULT_METRICS_INTERVAL), 1)?,
        metrics_namespace,
        hints,
        balance,
        clock_tolerance_ms,
        wait_for_store_clock,
    };
    let max_wait = ms(decide::MAX_HINT_WAIT);
    if settings.hint_wait_ms > max_wait {
        return Err(invalid("hintWaitMs", format!("{} ms is too long: at most {max_wait} ms", settings.hint_wait_ms)));
    }
    let limit = decide::MAX_CONNECTIONS_LIMIT as u64;
    if settings.max_connections > limit {
        return Err(invalid("maxConnections", format!("{} is out of range: 1 to {limit}", settings.max_connections)));
    }
    for (field, v) in [
        ("orphanIntervalMs", settings.orphan_interval_ms),
        ("desiredStateIntervalMs", settings.desired_state_interval_ms),
        ("handlerGraceMs", settings.handler_grace_ms),
        ("metricsIntervalMs", settings.metrics_interval_ms),
        ("clockToleranceMs", settings.clock_tolerance_ms.unwrap_or(1)),
    ] {
        leaselock::config::validate_duration(field, std::time::Duration::from_millis(v))?;
    }
    Ok(settings)
}

/// A cancellation reason by name (`Deadline`, `Lost`, `Stopped`, `Shutdown`, `Released`);
/// anything else (`undefined`) is "none".
pub fn reason(name: Option<&str>) -> Option<CancelReason> {
    [
        CancelReason::Deadline,
        CancelReason::Lost,
        CancelReason::Stopped,
        CancelReason::Shutdown,
        CancelReason::Released,
        CancelReason::HandOver,
    ]
    .into_iter()
    .find(|r| Some(r.as_str()) == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_default_and_name_the_option() {
        let s = settings(r#"{"workerId":"w1"}"#).unwrap();
        assert_eq!((s.max_connections, s.orphan_interval_ms, s.hint_wait_ms), (700, 2_000, 5_000));
        let err = |json: &str| settings(json).unwrap_err().to_string();
        assert!(err(r#"{"workerId":"w1","maxConnections":0}"#).contains("maxConnections"));
        assert!(err(r#"{"workerId":""}"#).contains("workerId"));
        assert!(err(r#"{"workerId":"w","hints":true}"#).contains("queueUrl"));
        let q = r#""queueUrl":"https://sqs.us-east-1.amazonaws.com/123456789012/hints""#;
        assert!(err(&format!(r#"{{"workerId":"w","hintWaitMs":21000,"hints":true,{q}}}"#)).contains("hintWaitMs"));
        assert!(
            err(r#"{"workerId":"w","hints":true,"queueUrl":"file:///etc/passwd"}"#).starts_with("invalid queue_url")
        );
        assert!(err(r#"{"workerId":"w","maxConnections":100001}"#).contains("maxConnections"));
        assert!(err(r#"{"workerId":"w","orphanIntervalMs":1e15}"#).contains("orphanIntervalMs"));
        assert!(err(r#"{"workerId":"w","maxConection":3}"#).contains("maxConection"));
        assert!(err(r#"{"workerId":"w","balance":"no"}"#).contains("balance"));
        assert!(settings(r#"{"workerId":"w"}"#).unwrap().balance);
        assert_eq!(settings(r#"{"workerId":"w"}"#).unwrap().index_lag_ms, 10_000);
        assert_eq!(settings(r#"{"workerId":"w","indexLagMs":30000}"#).unwrap().index_lag_ms, 30_000);
        assert!(err(r#"{"workerId":"w","indexLagMs":-1}"#).contains("indexLagMs"));
        assert!(!settings(r#"{"workerId":"w","balance":false}"#).unwrap().balance);
    }

    #[test]
    fn claims_wait_for_the_store_clock_unless_told_otherwise() {
        let s = settings(r#"{"workerId":"w"}"#).unwrap();
        assert_eq!((s.clock_tolerance_ms, s.wait_for_store_clock), (None, true));
        let s = settings(r#"{"workerId":"w","clockToleranceMs":80,"waitForStoreClock":false}"#).unwrap();
        assert_eq!((s.clock_tolerance_ms, s.wait_for_store_clock), (Some(80), false));
        let err = |json: &str| settings(json).unwrap_err().to_string();
        assert!(err(r#"{"workerId":"w","clockToleranceMs":0}"#).contains("clockToleranceMs"));
        assert!(err(r#"{"workerId":"w","clockToleranceMs":1e15}"#).contains("clockToleranceMs"));
        assert!(err(r#"{"workerId":"w","waitForStoreClock":1}"#).contains("waitForStoreClock"));
    }

    #[test]
    fn reasons_by_name() {
        assert_eq!(reason(Some("Lost")), Some(CancelReason::Lost));
        assert_eq!(reason(None), None);
        assert_eq!(reason(Some("lost")), None);
    }
}
