//! The JavaScript `Worker`'s options, parsed into core's [`WorkerSettings`] (their defaults and
//! limits are core's; the engine takes every decision: `crate::engine`), and cancel reasons by
//! name.

use std::time::Duration;

use leaselock::render;
use leaselock::worker::decide::{self, CancelReason};
use leaselock::worker::{WorkerField, WorkerSettings};
use leaselock::Error;
use serde::Serialize;
use serde_json::Value;

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

/// An option as the JavaScript caller spells it.
pub fn js_name(field: WorkerField) -> &'static str {
    match field {
        WorkerField::WorkerId => "workerId",
        WorkerField::QueueUrl => "queueUrl",
        WorkerField::MaxConnections => "maxConnections",
        WorkerField::OrphanInterval => "orphanIntervalMs",
        WorkerField::DesiredStateInterval => "desiredStateIntervalMs",
        WorkerField::HandlerGrace => "handlerGraceMs",
        WorkerField::HintWait => "hintWaitMs",
        WorkerField::IndexLag => "indexLagMs",
        WorkerField::MetricsInterval => "metricsIntervalMs",
        WorkerField::MetricsNamespace => "metricsNamespace",
        WorkerField::Balance => "balance",
        WorkerField::ClockTolerance => "clockToleranceMs",
        WorkerField::WaitForStoreClock => "waitForStoreClock",
    }
}

/// Set by `lib/worker.js`, not by the caller: whether an SQS client was given.
const HINTS: &str = "hints";

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
    /// The options as core holds them.
    #[serde(skip)]
    pub options: WorkerSettings,
}

impl Settings {
    fn new(options: WorkerSettings, hints: bool) -> Self {
        Self {
            worker_id: options.worker_id.clone().unwrap_or_default(),
            max_connections: options.max_connections as u64,
            orphan_interval_ms: ms(options.orphan_interval),
            desired_state_interval_ms: ms(options.desired_state_interval),
            handler_grace_ms: ms(options.handler_grace),
            hint_wait_ms: ms(options.hint_wait),
            index_lag_ms: ms(options.index_lag),
            claim_concurrency: decide::CLAIM_CONCURRENCY,
            hint_claim_concurrency: decide::HINT_CLAIM_CONCURRENCY,
            poll_answer_margin_ms: ms(decide::POLL_ANSWER_MARGIN),
            hand_over_timeout_ms: ms(decide::HAND_OVER_TIMEOUT),
            metrics_interval_ms: ms(options.metrics_interval),
            hints,
            metrics_namespace: options.metrics_namespace.clone(),
            balance: options.balance,
            clock_tolerance_ms: options.clock_tolerance.map(ms),
            wait_for_store_clock: options.wait_for_store_clock,
            options,
        }
    }

    /// The engine's settings of this worker on a table of clock skew `skew_ms`.
    pub fn engine(&self, skew_ms: u64) -> leaselock::engine::Settings {
        self.options.engine_settings(self.worker_id.clone(), skew_ms)
    }
}

fn invalid(field: &str, msg: impl std::fmt::Display) -> Error {
    Error::invalid(field, msg)
}

/// Parses the worker's options (JSON, without `table`, `sqs` and `handler`; `hints` says
/// whether an SQS client was given) into core's settings and validates them there, naming the
/// offending option.
pub fn settings(json: &str) -> leaselock::Result<Settings> {
    let v: Value = serde_json::from_str(json).map_err(|e| invalid("options", e))?;
    let map = v.as_object().ok_or_else(|| invalid("options", "must be an object"))?;
    let known = |k: &str| k == HINTS || WorkerField::ALL.into_iter().any(|f| js_name(f) == k);
    if let Some(k) = map.keys().find(|k| !known(k)) {
        let known = WorkerField::ALL.map(js_name).join(", ");
        return Err(invalid("options", format!("{} is not an option (known: {known})", render::value(k))));
    }
    let hints = map.get(HINTS).and_then(Value::as_bool).unwrap_or(false);
    let given = |f: WorkerField| map.get(js_name(f)).filter(|v| !v.is_null());
    let shown = |v: &Value| render::value(&v.to_string());
    let whole = |f: WorkerField| -> leaselock::Result<Option<u64>> {
        let whole =
            |v: &Value| v.as_u64().ok_or_else(|| invalid(js_name(f), format!("{} is not a whole number", shown(v))));
        given(f).map(whole).transpose()
    };
    let millis = |f: WorkerField| Ok::<_, Error>(whole(f)?.map(Duration::from_millis));
    let flag = |f: WorkerField| -> leaselock::Result<Option<bool>> {
        let flag =
            |v: &Value| v.as_bool().ok_or_else(|| invalid(js_name(f), format!("{} is not true or false", shown(v))));
        given(f).map(flag).transpose()
    };
    let text = |f: WorkerField| -> leaselock::Result<Option<String>> {
        let text = |v: &Value| v.as_str().map(str::to_string).ok_or_else(|| invalid(js_name(f), "must be a string"));
        given(f).map(text).transpose()
    };
    let mut s = WorkerSettings::default();
    let worker_id = text(WorkerField::WorkerId)?;
    s.worker_id = Some(worker_id.ok_or_else(|| invalid(js_name(WorkerField::WorkerId), "must be a string"))?);
    s.queue_url = text(WorkerField::QueueUrl)?;
    match (&s.queue_url, hints) {
        (None, true) => return Err(invalid(js_name(WorkerField::QueueUrl), "required with sqs")),
        (Some(_), false) => return Err(invalid("sqs", "an SQSClient is required with queueUrl")),
        _ => {}
    }
    if let Some(n) = whole(WorkerField::MaxConnections)? {
        let name = js_name(WorkerField::MaxConnections);
        s.max_connections = usize::try_from(n).map_err(|_| invalid(name, format!("{n} is out of range")))?;
    }
    for (field, d) in [
        (WorkerField::OrphanInterval, &mut s.orphan_interval),
        (WorkerField::DesiredStateInterval, &mut s.desired_state_interval),
        (WorkerField::HandlerGrace, &mut s.handler_grace),
        (WorkerField::HintWait, &mut s.hint_wait),
        (WorkerField::IndexLag, &mut s.index_lag),
        (WorkerField::MetricsInterval, &mut s.metrics_interval),
    ] {
        if let Some(given) = millis(field)? {
            *d = given;
        }
    }
    s.clock_tolerance = millis(WorkerField::ClockTolerance)?;
    if let Some(ns) = text(WorkerField::MetricsNamespace)? {
        s.metrics_namespace = ns;
    }
    if let Some(on) = flag(WorkerField::Balance)? {
        s.balance = on;
    }
    if let Some(on) = flag(WorkerField::WaitForStoreClock)? {
        s.wait_for_store_clock = on;
    }
    s.validate(js_name)?;
    Ok(Settings::new(s, hints))
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
        assert!(err(r#"{"workerId":"w","hints":true,"queueUrl":"file:///etc/passwd"}"#).starts_with("invalid queueUrl"));
        assert!(err(r#"{"workerId":"w","maxConnections":100001}"#).contains("maxConnections"));
        assert!(err(r#"{"workerId":"w","orphanIntervalMs":1e15}"#).contains("orphanIntervalMs"));
        assert!(err(r#"{"workerId":"w","maxConection":3}"#).contains("maxConection"));
        let known = "known: workerId, queueUrl, maxConnections, orphanIntervalMs, desiredStateIntervalMs, \
            handlerGraceMs, hintWaitMs, indexLagMs, metricsIntervalMs, metricsNamespace, balance, clockToleranceMs, \
            waitForStoreClock)";
        assert!(err(r#"{"workerId":"w","hint":3}"#).ends_with(known), "{}", err(r#"{"workerId":"w","hint":3}"#));
        // Core's defaults, as core holds them.
        let defaults = WorkerSettings { worker_id: Some("w1".into()), ..WorkerSettings::default() };
        assert_eq!(settings(r#"{"workerId":"w1"}"#).unwrap().options, defaults);
        assert!(err(r#"{"workerId":"w","indexLagMs":2592000001}"#).contains("indexLagMs"));
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
