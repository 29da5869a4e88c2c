//! The lease protocol's operations for JavaScript: one [`Op`] per call, stepped by
//! `lib/drive.js`. A step is JSON text:
//!
//! - `{"send": "UpdateItem", "timeoutMs": 2000, "request": {"UpdateItem": {...}}}`: send
//!   `request[send]` as the SDK command's input, once, within `timeoutMs`; then call
//!   [`Op::answer`] with the output or [`Op::failed`] with what the failure was;
//! - `{"sleep": ms}`: wait, then call [`Op::resume`];
//! - `{"done": value}` / `{"fail": error}`: the end.

use std::collections::HashMap;

use leaselock::lease::claim_cutoff;
use leaselock::protocol::{Answer, CancellationReason, Input, Item, Operation, OrphansPage, Output, Request, Step};
use leaselock::store::OrphanPage;
use leaselock::{DesiredState, Lease, LeaseItem, TableConfig};
use serde::Deserialize;
use serde_json::{json, Value};
use wasm_bindgen::prelude::*;

use crate::error;
use crate::lease::{JsItem, JsLease};

/// An operation's result as JavaScript sees it.
pub trait IntoJs: Sized {
    fn into_js(self) -> Value;

    /// The `{"done": value}` step's text.
    fn done_json(self) -> String {
        json!({ "done": self.into_js() }).to_string()
    }
}

impl IntoJs for () {
    fn into_js(self) -> Value {
        Value::Null
    }
}

impl IntoJs for Lease {
    fn into_js(self) -> Value {
        json!(JsLease::from(self))
    }

    /// Serialized straight from the struct (every renewal ends here): no `Value` tree.
    fn done_json(self) -> String {
        format!(r#"{{"done":{}}}"#, serde_json::to_string(&JsLease::from(self)).expect("plain data serializes"))
    }
}

impl IntoJs for LeaseItem {
    fn into_js(self) -> Value {
        json!(JsItem::from(self))
    }
}

impl IntoJs for Option<LeaseItem> {
    fn into_js(self) -> Value {
        self.map_or(Value::Null, IntoJs::into_js)
    }
}

impl IntoJs for Vec<LeaseItem> {
    fn into_js(self) -> Value {
        Value::Array(self.into_iter().map(IntoJs::into_js).collect())
    }
}

impl IntoJs for HashMap<String, Option<DesiredState>> {
    fn into_js(self) -> Value {
        json!(self)
    }
}

impl IntoJs for leaselock::protocol::TableReplication {
    fn into_js(self) -> Value {
        json!(self)
    }
}

impl IntoJs for OrphanPage {
    fn into_js(self) -> Value {
        json!({ "items": self.items.into_js(), "next": self.next })
    }
}

/// `orphans`: every orphan below the cutoff (claimable now, by default), oldest first, across
/// pages of `page_size`, at most `limit` (what `LeaseStore::orphans` does over pages).
pub struct Orphans {
    config: TableConfig,
    cutoff_ms: Option<u64>,
    limit: Option<usize>,
    page_size: usize,
    found: Vec<LeaseItem>,
    page: Option<OrphansPage>,
}

impl Orphans {
    pub fn new(config: &TableConfig, cutoff_ms: Option<u64>, limit: Option<usize>, page_size: usize) -> Self {
        Self { config: config.clone(), cutoff_ms, limit, page_size: page_size.max(1), found: Vec::new(), page: None }
    }

    fn want(&self) -> usize {
        self.limit.map_or(usize::MAX, |l| l - self.found.len()).min(self.page_size)
    }
}

impl Operation for Orphans {
    type Output = Vec<LeaseItem>;
    fn next(&mut self, input: Input) -> Step<Vec<LeaseItem>> {
        let fresh = Input::new(input.now_ms, input.mono_ms, input.random);
        let cutoff = *self.cutoff_ms.get_or_insert_with(|| claim_cutoff(input.now_ms, &self.config));
        if self.page.is_none() {
            self.page = Some(OrphansPage::new(&self.config, cutoff, self.want(), None));
        }
        let step = self.page.as_mut().expect("a page is being read").next(input);
        match step {
            Step::Done(page) => {
                self.found.extend(page.items);
                match page.next {
                    Some(after) if self.limit.is_none_or(|l| self.found.len() < l) => {
                        self.page = Some(OrphansPage::new(&self.config, cutoff, self.want(), Some(after)));
                        self.next(fresh)
                    }
                    _ => {
                        if let Some(l) = self.limit {
                            self.found.truncate(l);
                        }
                        Step::Done(std::mem::take(&mut self.found))
                    }
                }
            }
            Step::Send { request, attempt_timeout_ms } => Step::Send { request, attempt_timeout_ms },
            Step::Sleep { ms } => Step::Sleep { ms },
            Step::Fail(e) => Step::Fail(e),
        }
    }
}

/// The step as JSON text (see the module docs).
fn step_json<T: IntoJs>(step: Step<T>) -> String {
    match step {
        Step::Send { request, attempt_timeout_ms } => send_json(&request, attempt_timeout_ms),
        Step::Sleep { ms } => format!(r#"{{"sleep":{ms}}}"#),
        Step::Done(value) => value.done_json(),
        Step::Fail(e) => json!({ "fail": error::to_json(&e) }).to_string(),
    }
}

/// A `send` step's text (see the module docs).
pub fn send_json(request: &Request, attempt_timeout_ms: u64) -> String {
    format!(
        r#"{{"send":"{}","timeoutMs":{attempt_timeout_ms},"request":{}}}"#,
        request.operation(),
        serde_json::to_string(request).expect("requests serialize")
    )
}

/// What JavaScript saw of a failed request (`lib/io.js` `describe`).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Failure {
    pub name: String,
    pub message: String,
    pub status: Option<u16>,
    pub code: Option<String>,
    pub item: Option<Item>,
    pub reasons: Option<Vec<CancellationReason>>,
    #[serde(default)]
    pub timed_out: bool,
}

/// Node's error codes for a request that never reached the server.
const NOT_SENT: &[&str] = &["ECONNREFUSED", "ENOTFOUND", "EAI_AGAIN", "EHOSTUNREACH", "ENETUNREACH"];
/// Node's error codes and the SDK's error names for a request that may have reached it.
const CUT_OFF: &[&str] =
    &["ECONNRESET", "EPIPE", "ETIMEDOUT", "ECONNABORTED", "TimeoutError", "RequestTimeout", "AbortError"];

/// The protocol's answer kind for a failed request of the AWS SDK for JavaScript v3.
pub fn answer_for_failure(f: Failure) -> Answer {
    let text = || format!("{}: {}", f.name, f.message);
    if f.timed_out {
        return Answer::Ambiguous(format!("no answer in time ({})", text()));
    }
    match f.name.as_str() {
        "ConditionalCheckFailedException" => return Answer::ConditionFailed { item: f.item },
        "TransactionCanceledException" => {
            return Answer::TransactionCanceled { reasons: f.reasons.unwrap_or_default() };
        }
        _ => {}
    }
    if let Some(missing) = missing_setup(&f) {
        return Answer::NotConfigured(missing);
    }
    match f.status {
        // A success the SDK could not read: the write was applied, the answer is lost.
        Some(status @ 200..=299) => Answer::Ambiguous(format!("unreadable answer (HTTP {status}): {}", text())),
        Some(status) if status > 0 => Answer::from_service_error(&f.name, &f.message, status),
        _ => {
            let code = f.code.as_deref().unwrap_or_default();
            if NOT_SENT.contains(&code) || code.starts_with("ERR_TLS") || code.contains("CERT") {
                Answer::Unreachable(text())
            } else if CUT_OFF.contains(&code) || CUT_OFF.contains(&f.name.as_str()) {
                Answer::Ambiguous(text())
            } else {
                Answer::Other(text())
            }
        }
    }
}

/// What the SDK lacks to build a request, named for the user, when that is why it failed: the
/// credential chain found nothing (`CredentialsProviderError`), or no region was configured
/// (the SDK's plain `Error: Region is missing`). Nothing was sent.
fn missing_setup(f: &Failure) -> Option<String> {
    if f.status.is_some_and(|s| s > 0) {
        return None;
    }
    if f.name == "CredentialsProviderError" {
        return Some(format!(
            "no credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, or run with a role, \
             or give the DynamoDBClient credentials); the SDK said: {}",
            f.message
        ));
    }
    if f.message == "Region is missing" {
        return Some("no region (set AWS_REGION, or give the DynamoDBClient a region)".into());
    }
    None
}

/// One running operation.
trait Stepper {
    fn step(&mut self, input: Input) -> String;
}

impl<O: Operation> Stepper for O
where
    O::Output: IntoJs,
{
    fn step(&mut self, input: Input) -> String {
        step_json(self.next(input))
    }
}

/// A lease operation in progress (see the module docs).
#[wasm_bindgen]
pub struct Op {
    inner: Box<dyn Stepper>,
}

impl Op {
    pub fn new<O>(op: O) -> Op
    where
        O: Operation + 'static,
        O::Output: IntoJs,
    {
        Op { inner: Box::new(op) }
    }
}

fn input(now_ms: f64, mono_ms: f64, random: f64) -> Input {
    Input::new(now_ms as u64, mono_ms as u64, random)
}

#[wasm_bindgen]
impl Op {
    /// The first step, and the step after a `sleep`.
    pub fn resume(&mut self, now_ms: f64, mono_ms: f64, random: f64) -> String {
        self.inner.step(input(now_ms, mono_ms, random))
    }

    /// The step after the request succeeded with `output_json` (the SDK's output object).
    pub fn answer(&mut self, now_ms: f64, mono_ms: f64, random: f64, output_json: &str) -> String {
        let answer = match serde_json::from_str::<Output>(output_json) {
            Ok(output) => Answer::Ok(output),
            Err(e) => Answer::Ambiguous(format!("unreadable output: {e}")),
        };
        self.inner.step(input(now_ms, mono_ms, random).with(answer))
    }

    /// The step after the request failed; `failure_json` describes how.
    pub fn failed(&mut self, now_ms: f64, mono_ms: f64, random: f64, failure_json: &str) -> String {
        let answer = match serde_json::from_str::<Failure>(failure_json) {
            Ok(f) => answer_for_failure(f),
            Err(e) => Answer::Other(format!("unreadable failure: {e}")),
        };
        self.inner.step(input(now_ms, mono_ms, random).with(answer))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(name: &str, status: Option<u16>, code: Option<&str>) -> Failure {
        Failure {
            name: name.into(),
            message: "m".into(),
            status,
            code: code.map(str::to_string),
            item: None,
            reasons: None,
            timed_out: false,
        }
    }

    #[test]
    fn sdk_failures_become_answer_kinds() {
        let kind = |f| match answer_for_failure(f) {
            Answer::Ok(_) => "Ok",
            Answer::ConditionFailed { .. } => "ConditionFailed",
            Answer::TransactionCanceled { .. } => "TransactionCanceled",
            Answer::Throttled(_) => "Throttled",
            Answer::Conflict(_) => "Conflict",
            Answer::Ambiguous(_) => "Ambiguous",
            Answer::Unreachable(_) => "Unreachable",
            Answer::AccessDenied(_) => "AccessDenied",
            Answer::NotConfigured(_) => "NotConfigured",
            Answer::ResourceNotFound(_) => "ResourceNotFound",
            Answer::ResourceInUse(_) => "ResourceInUse",
            Answer::Other(_) => "Other",
        };
        assert_eq!(kind(failure("ConditionalCheckFailedException", Some(400), None)), "ConditionFailed");
        assert_eq!(kind(failure("ProvisionedThroughputExceededException", Some(400), None)), "Throttled");
        // A multi-Region strong consistency table's answer to a write another Region is making.
        assert_eq!(kind(failure("ReplicatedWriteConflictException", Some(400), None)), "Conflict");
        assert_eq!(kind(failure("InternalServerError", Some(500), None)), "Ambiguous");
        assert_eq!(kind(failure("ResourceNotFoundException", Some(400), None)), "ResourceNotFound");
        assert_eq!(kind(failure("Error", None, Some("ECONNREFUSED"))), "Unreachable");
        assert_eq!(kind(failure("Error", None, Some("ECONNRESET"))), "Ambiguous");
        assert_eq!(kind(failure("TimeoutError", None, None)), "Ambiguous");
        assert_eq!(kind(failure("SyntaxError", Some(200), None)), "Ambiguous");
        assert_eq!(kind(failure("CredentialsProviderError", None, None)), "NotConfigured");
        assert_eq!(
            kind(Failure { message: "Region is missing".into(), ..failure("Error", None, None) }),
            "NotConfigured"
        );
        assert_eq!(kind(failure("SomeOtherError", None, None)), "Other");
        assert_eq!(kind(Failure { timed_out: true, ..failure("AbortError", None, None) }), "Ambiguous");
    }

    #[test]
    fn a_failed_condition_keeps_the_old_item() {
        let f: Failure = serde_json::from_str(
            r#"{"name":"ConditionalCheckFailedException","message":"m","status":400,"code":null,
                "item":{"lease_owner":{"S":"w"}},"reasons":null,"timedOut":false}"#,
        )
        .unwrap();
        match answer_for_failure(f) {
            Answer::ConditionFailed { item: Some(item) } => assert!(item.contains_key("lease_owner")),
            other => panic!("{other:?}"),
        }
    }
}
