//! The router: START/STOP requests from API Gateway (HTTP API, payload 2.0), from SQS, or by
//! direct invocation. It validates the request before touching the store, sets `desired_state`
//! idempotently, and sends a START hint.
//!
//! Decisions, per source:
//! - HTTP: 200 with the item, 400 `{"error", "field"}` for bad input, 404 for an unknown id or
//!   route, 405 for a known route with another method, 503 when the store is unavailable, 500
//!   when the deployment is wrong (the table does not exist, the role may not use it).
//! - SQS: a malformed record (or a STOP of an unknown id) can never succeed, so it is logged and
//!   dropped rather than retried into the dead-letter queue; a store failure is reported in
//!   `batchItemFailures` so SQS redelivers it (START and STOP are idempotent). On a FIFO queue the
//!   records after a failure are reported too, to keep their order. A command that fails because
//!   the deployment is wrong is reported too: it is valid, and succeeds once the deployment is
//!   fixed (or reaches the dead-letter queue).
//! - Direct: the item on success; an error whose type is `InvalidRequest`, `NotFound` or
//!   `Misconfigured` (all say "non-retryable") or `StoreUnavailable` (retryable).
//!
//! A START whose hint cannot be sent still succeeds (`hint_sent: false`): the desired state is
//! already written, and workers find unhinted work through the orphan index within seconds.
//!
//! Ids follow core's rule ([`leaselock::config::validate_id`]). Every value an error quotes, in
//! a response or a log line, goes through [`leaselock::render`]: an error stays a few hundred
//! bytes whatever the payload, and a value cannot break a log line or a terminal.

use aws_lambda_events::apigw::ApiGatewayV2httpRequest;
use aws_lambda_events::sqs::SqsEvent;
use base64::Engine as _;
use lambda_runtime::{Diagnostic, LambdaEvent};
use leaselock::config::{validate_id, validate_url};
use leaselock::{render, DesiredState, LeaseItem, LeaseStore};
use serde::Serialize;
use serde_json::{json, Map, Value};
use tracing::{info, warn};

use crate::hint_sender::{Hint, HintSender};

/// A START or STOP, validated: the id and url are known to be acceptable to the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Start { connection_id: String, url: String },
    Stop { connection_id: String },
}

/// Input refused before anything was written. `message` starts with the field's name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Invalid {
    pub field: &'static str,
    pub message: String,
}

impl Invalid {
    fn new(field: &'static str, what: impl std::fmt::Display) -> Self {
        Invalid { field, message: format!("{field}: {what}") }
    }

    fn from_core(field: &'static str, err: leaselock::Error) -> Self {
        match err {
            leaselock::Error::InvalidInput { message, .. } => Invalid::new(field, message),
            other => Invalid::new(field, other),
        }
    }
}

fn checked_id(id: &str) -> Result<String, Invalid> {
    validate_id("connection_id", id).map_err(|e| Invalid::from_core("connection_id", e))?;
    Ok(id.to_string())
}

fn checked_url(url: &str) -> Result<String, Invalid> {
    validate_url(url).map_err(|e| Invalid::from_core("url", e))?;
    Ok(url.to_string())
}

fn string_field<'a>(object: &'a Map<String, Value>, field: &'static str) -> Result<&'a str, Invalid> {
    match object.get(field) {
        None | Some(Value::Null) => Err(Invalid::new(field, "missing")),
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(Invalid::new(field, format_args!("must be a string, got {}", json_type(other)))),
    }
}

/// What a JSON value is, for an error that must not echo it.
fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A parser's error, which may quote the input, made safe to pass on.
fn parse_error(e: impl std::fmt::Display) -> String {
    render::text(&e.to_string())
}

impl Command {
    /// Reads `{"action": "START"|"STOP", "connection_id": ..., "url": ...}`.
    pub fn from_value(value: &Value) -> Result<Self, Invalid> {
        let object = value.as_object().ok_or_else(|| Invalid::new("body", "must be a JSON object"))?;
        let action = string_field(object, "action")?;
        let connection_id = checked_id(string_field(object, "connection_id")?)?;
        match action {
            "START" => Ok(Command::Start { connection_id, url: checked_url(string_field(object, "url")?)? }),
            "STOP" => Ok(Command::Stop { connection_id }),
            other => Err(Invalid::new(
                "action",
                format_args!("unknown action {}, expected START or STOP", render::value(other)),
            )),
        }
    }

    /// Reads a command from JSON text (an SQS message body).
    pub fn from_json(text: &str) -> Result<Self, Invalid> {
        let value: Value = serde_json::from_str(text)
            .map_err(|e| Invalid::new("body", format_args!("not valid JSON ({})", parse_error(e))))?;
        Self::from_value(&value)
    }

    pub fn connection_id(&self) -> &str {
        match self {
            Command::Start { connection_id, .. } | Command::Stop { connection_id } => connection_id,
        }
    }
}

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    #[error("invalid request (non-retryable): {0}")]
    Invalid(#[from] Invalid),
    #[error("connection {} not found (non-retryable)", render::value(id))]
    NotFound { id: String },
    #[error("store unavailable (retryable): {}", render::text(&.0.to_string()))]
    Store(leaselock::Error),
    /// The table does not exist or the role may not use it: no retry succeeds until the
    /// deployment is fixed.
    #[error("router misconfigured (non-retryable): {}", render::text(&.0.to_string()))]
    Misconfigured(leaselock::Error),
}

impl RouterError {
    fn from_store(err: leaselock::Error) -> Self {
        match err {
            leaselock::Error::NotFound { id } => RouterError::NotFound { id },
            leaselock::Error::InvalidInput { field, message } => {
                let field = if field == "url" { "url" } else { "connection_id" };
                RouterError::Invalid(Invalid::new(field, message))
            }
            e @ (leaselock::Error::TableNotFound { .. }
            | leaselock::Error::AccessDenied(_)
            | leaselock::Error::NotConfigured(_)) => RouterError::Misconfigured(e),
            other => RouterError::Store(other),
        }
    }

    /// Whether trying again can succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, RouterError::Store(_))
    }

    /// A stable name for the error (the direct invocation's `errorType`).
    pub fn kind(&self) -> &'static str {
        match self {
            RouterError::Invalid(_) => "InvalidRequest",
            RouterError::NotFound { .. } => "NotFound",
            RouterError::Store(_) => "StoreUnavailable",
            RouterError::Misconfigured(_) => "Misconfigured",
        }
    }
}

impl From<RouterError> for Diagnostic {
    fn from(err: RouterError) -> Self {
        Diagnostic { error_type: err.kind().to_string(), error_message: err.to_string() }
    }
}

/// A connection as the router reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Connection {
    pub connection_id: String,
    pub desired_state: Option<DesiredState>,
    pub url: Option<String>,
    pub owner: Option<String>,
    pub expires_at_ms: Option<u64>,
    pub last_seq: Option<u64>,
    pub fence: u64,
    /// Set for START: whether the hint reached the queue.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint_sent: Option<bool>,
}

impl From<LeaseItem> for Connection {
    fn from(item: LeaseItem) -> Self {
        Connection {
            connection_id: item.id,
            desired_state: item.desired_state,
            url: item.url,
            owner: item.owner,
            expires_at_ms: item.expires_at_ms,
            last_seq: item.last_seq,
            fence: item.fence,
            hint_sent: None,
        }
    }
}

/// Applies a validated command.
pub async fn execute<S: LeaseStore + ?Sized>(
    store: &S,
    hints: &dyn HintSender,
    command: &Command,
) -> Result<Connection, RouterError> {
    match command {
        Command::Start { connection_id, url } => {
            let item = store.start(connection_id, url).await.map_err(RouterError::from_store)?;
            let hint_sent = match hints.send(&Hint::new(connection_id.as_str())).await {
                Ok(()) => true,
                Err(e) => {
                    warn!(connection_id = %connection_id, error = %render::text(&e.to_string()), "START recorded but its hint was not sent");
                    false
                }
            };
            info!(connection_id = %connection_id, fence = item.fence, hint_sent, "started");
            Ok(Connection { hint_sent: Some(hint_sent), ..item.into() })
        }
        Command::Stop { connection_id } => {
            let item = store.stop(connection_id).await.map_err(RouterError::from_store)?;
            info!(connection_id = %connection_id, "stopped");
            Ok(item.into())
        }
    }
}

/// What a payload is, judged by its shape.
#[derive(Debug)]
pub enum Request {
    /// API Gateway HTTP API, payload format 2.0.
    Http(Box<Value>),
    /// An SQS batch.
    Sqs(Value),
    /// Direct invocation with a command.
    Direct(Value),
}

impl Request {
    pub fn classify(payload: Value) -> Self {
        // Any API Gateway event; one that is not payload format 2.0 gets a 400 saying so.
        if payload.get("requestContext").is_some() {
            Request::Http(Box::new(payload))
        } else if payload.get("Records").is_some_and(Value::is_array) {
            Request::Sqs(payload)
        } else {
            Request::Direct(payload)
        }
    }
}

/// The Lambda handler: dispatches on the payload's shape.
pub async fn handle<S: LeaseStore + ?Sized>(
    event: LambdaEvent<Value>,
    store: &S,
    hints: &dyn HintSender,
) -> Result<Value, RouterError> {
    match Request::classify(event.payload) {
        Request::Http(payload) => Ok(handle_http(*payload, store, hints).await.to_value()),
        Request::Sqs(payload) => handle_sqs(payload, store, hints).await,
        Request::Direct(payload) => {
            let command = Command::from_value(&payload).inspect_err(|e| warn!(error = %e, "refused"))?;
            let connection = execute(store, hints, &command).await?;
            Ok(serde_json::to_value(connection).expect("a connection serializes"))
        }
    }
}

/// An HTTP API response (payload format 2.0) with a JSON body.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpResponse {
    pub status: u16,
    pub body: Value,
    pub allow: Option<&'static str>,
}

impl HttpResponse {
    fn ok(body: impl Serialize) -> Self {
        HttpResponse { status: 200, body: serde_json::to_value(body).expect("serializes"), allow: None }
    }

    fn error(status: u16, error: impl std::fmt::Display, field: Option<&str>) -> Self {
        let mut body = json!({ "error": error.to_string() });
        if let Some(field) = field {
            body["field"] = json!(field);
        }
        HttpResponse { status, body, allow: None }
    }

    fn from_error(err: RouterError) -> Self {
        match err {
            RouterError::Invalid(invalid) => Self::error(400, &invalid.message, Some(invalid.field)),
            RouterError::NotFound { id } => {
                Self::error(404, format_args!("connection {} not found", render::value(&id)), None)
            }
            RouterError::Store(e) => {
                Self::error(503, format_args!("store unavailable, retry: {}", render::text(&e.to_string())), None)
            }
            RouterError::Misconfigured(e) => {
                Self::error(500, format_args!("router misconfigured: {}", render::text(&e.to_string())), None)
            }
        }
    }

    pub fn to_value(&self) -> Value {
        let mut headers = json!({ "content-type": "application/json" });
        if let Some(allow) = self.allow {
            headers["allow"] = json!(allow);
        }
        json!({
            "statusCode": self.status,
            "headers": headers,
            "body": self.body.to_string(),
            "isBase64Encoded": false,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Route {
    Start,
    Stop,
    Get,
    /// `POST /connections/{id}/{action}` with an action we do not know.
    Unknown(String),
}

impl Route {
    /// The route as a log line names it (an unknown action rendered, never raw).
    fn name(&self) -> String {
        match self {
            Route::Start => "start".into(),
            Route::Stop => "stop".into(),
            Route::Get => "get".into(),
            Route::Unknown(action) => format!("unknown action {}", render::value(action)),
        }
    }

    fn method(&self) -> &'static str {
        match self {
            Route::Get => "GET",
            Route::Start | Route::Stop | Route::Unknown(_) => "POST",
        }
    }
}

/// Finds the route and the raw id: from the route key and path parameters when API Gateway
/// matched one of our routes, else from the path's last segments (a `$default` route, a stage prefix).
fn route_of(req: &ApiGatewayV2httpRequest) -> Option<(Route, Option<String>)> {
    let route_key = req.route_key.as_deref().or(req.request_context.route_key.as_deref()).unwrap_or("$default");
    let from_key = match route_key.split_once(' ').map(|(_, path)| path) {
        Some("/connections/{id}/start") => Some(Route::Start),
        Some("/connections/{id}/stop") => Some(Route::Stop),
        Some("/connections/{id}") => Some(Route::Get),
        _ => None,
    };
    if let Some(route) = from_key {
        return Some((route, req.path_parameters.get("id").cloned()));
    }
    let path = req.raw_path.as_deref().or(req.request_context.http.path.as_deref()).unwrap_or("");
    let segments: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    match segments.as_slice() {
        [.., "connections", id, "start"] => Some((Route::Start, percent_decode(id))),
        [.., "connections", id, "stop"] => Some((Route::Stop, percent_decode(id))),
        [.., "connections", id, action] => {
            Some((Route::Unknown(percent_decode(action).unwrap_or_default()), percent_decode(id)))
        }
        [.., "connections", id] => Some((Route::Get, percent_decode(id))),
        _ => None,
    }
}

/// Decodes `%XX` escapes; `None` for a bad escape or bytes that are not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn request_body(req: &ApiGatewayV2httpRequest) -> Result<Option<String>, Invalid> {
    let Some(body) = req.body.as_deref().filter(|b| !b.trim().is_empty()) else { return Ok(None) };
    if !req.is_base64_encoded {
        return Ok(Some(body.to_string()));
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(body)
        .map_err(|e| Invalid::new("body", format_args!("not valid base64 ({})", parse_error(e))))?;
    String::from_utf8(bytes).map(Some).map_err(|_| Invalid::new("body", "not UTF-8"))
}

/// Reads the START body `{"url": "..."}` (a `connection_id` in it must match the path).
fn start_url(req: &ApiGatewayV2httpRequest, id: &str) -> Result<String, Invalid> {
    let body = request_body(req)?.ok_or_else(|| Invalid::new("body", r#"missing: expected {"url": "wss://..."}"#))?;
    let value: Value = serde_json::from_str(&body)
        .map_err(|e| Invalid::new("body", format_args!("not valid JSON ({})", parse_error(e))))?;
    let object = value.as_object().ok_or_else(|| Invalid::new("body", "must be a JSON object"))?;
    if let Some(other) = object.get("connection_id").filter(|v| !v.is_null()) {
        if other.as_str() != Some(id) {
            return Err(Invalid::new("connection_id", "the body's connection_id differs from the path's"));
        }
    }
    checked_url(string_field(object, "url")?)
}

/// Answers one HTTP request.
pub async fn handle_http<S: LeaseStore + ?Sized>(payload: Value, store: &S, hints: &dyn HintSender) -> HttpResponse {
    let req: ApiGatewayV2httpRequest = match serde_json::from_value(payload) {
        Ok(req) => req,
        Err(e) => {
            let message = format!("not an HTTP API request ({})", parse_error(e));
            warn!(error = %message, "refused");
            return HttpResponse::error(400, format_args!("event: {message}"), Some("event"));
        }
    };
    let method = req.request_context.http.method.as_str().to_ascii_uppercase();
    let Some((route, raw_id)) = route_of(&req) else {
        let path = render::value(req.raw_path.as_deref().unwrap_or_default());
        return HttpResponse::error(404, format_args!("no route for {} {path}", render::value(&method)), None);
    };
    if method != route.method() {
        let mut response = HttpResponse::error(405, format_args!("use {} here", route.method()), None);
        response.allow = Some(route.method());
        return response;
    }
    let result = async {
        let raw_id = raw_id.ok_or_else(|| Invalid::new("connection_id", "missing from the path or not valid UTF-8"))?;
        let id = checked_id(&raw_id)?;
        match &route {
            Route::Start => {
                let url = start_url(&req, &id)?;
                execute(store, hints, &Command::Start { connection_id: id, url }).await
            }
            Route::Stop => execute(store, hints, &Command::Stop { connection_id: id }).await,
            Route::Get => match store.get(&id).await.map_err(RouterError::from_store)? {
                Some(item) => Ok(Connection::from(item)),
                None => Err(RouterError::NotFound { id }),
            },
            Route::Unknown(action) => Err(Invalid::new(
                "action",
                format_args!("unknown action {}, expected start or stop", render::value(action)),
            )
            .into()),
        }
    }
    .await;
    match result {
        Ok(connection) => HttpResponse::ok(connection),
        Err(e) => {
            warn!(method = %render::value(&method), route = %route.name(), error = %e, "request failed");
            HttpResponse::from_error(e)
        }
    }
}

/// Processes an SQS batch; the response lists the records SQS should deliver again.
pub async fn handle_sqs<S: LeaseStore + ?Sized>(
    payload: Value,
    store: &S,
    hints: &dyn HintSender,
) -> Result<Value, RouterError> {
    let event: SqsEvent = serde_json::from_value(payload)
        .map_err(|e| {
            RouterError::Invalid(Invalid::new("Records", format_args!("not an SQS batch ({})", parse_error(e))))
        })
        .inspect_err(|e| warn!(error = %e, "refused"))?;
    let fifo = event.records.iter().any(|r| r.event_source_arn.as_deref().is_some_and(|arn| arn.ends_with(".fifo")));
    let mut failures: Vec<String> = Vec::new();
    for record in &event.records {
        let message_id = record.message_id.clone().unwrap_or_default();
        // Logged rendered: the id comes from the event.
        let logged_id = render::value(&message_id);
        if fifo && !failures.is_empty() {
            failures.push(message_id);
            continue;
        }
        let outcome = match Command::from_json(record.body.as_deref().unwrap_or("")) {
            Ok(command) => execute(store, hints, &command).await,
            Err(invalid) => Err(RouterError::Invalid(invalid)),
        };
        match outcome {
            Ok(_) => {}
            Err(e) if e.is_retryable() || matches!(e, RouterError::Misconfigured(_)) => {
                warn!(message_id = %logged_id, error = %e, "command failed, SQS will redeliver it");
                if message_id.is_empty() {
                    // Without an id the failure cannot be reported alone: fail the whole batch.
                    return Err(e);
                }
                failures.push(message_id);
            }
            Err(e) => warn!(message_id = %logged_id, error = %e, "dropping a command that cannot succeed"),
        }
    }
    let failures: Vec<Value> = failures.into_iter().map(|id| json!({ "itemIdentifier": id })).collect();
    Ok(json!({ "batchItemFailures": failures }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_name_the_bad_field() {
        let field = |v: Value| Command::from_value(&v).unwrap_err().field;
        assert_eq!(field(json!("START")), "body");
        assert_eq!(field(json!({"connection_id": "a"})), "action");
        assert_eq!(field(json!({"action": "RESTART", "connection_id": "a"})), "action");
        assert_eq!(field(json!({"action": "START", "url": "wss://x"})), "connection_id");
        assert_eq!(field(json!({"action": "START", "connection_id": 7, "url": "wss://x"})), "connection_id");
        assert_eq!(field(json!({"action": "START", "connection_id": "", "url": "wss://x"})), "connection_id");
        let long = "x".repeat(1025);
        assert_eq!(field(json!({"action": "STOP", "connection_id": long})), "connection_id");
        assert_eq!(field(json!({"action": "START", "connection_id": "a"})), "url");
        assert_eq!(field(json!({"action": "START", "connection_id": "a", "url": "https://x"})), "url");
        assert_eq!(Command::from_json("{not json").unwrap_err().field, "body");
        let ok = Command::from_value(&json!({"action": "START", "connection_id": "a", "url": "wss://x/1"})).unwrap();
        assert_eq!(ok, Command::Start { connection_id: "a".into(), url: "wss://x/1".into() });
        let message = Command::from_value(&json!({"action": "START", "connection_id": "a"})).unwrap_err().to_string();
        assert_eq!(message, "url: missing");
    }

    #[test]
    fn payload_shapes() {
        assert!(matches!(Request::classify(json!({"requestContext": {"http": {}}})), Request::Http(_)));
        assert!(matches!(Request::classify(json!({"Records": []})), Request::Sqs(_)));
        assert!(matches!(Request::classify(json!({"action": "STOP"})), Request::Direct(_)));
        assert!(matches!(Request::classify(json!({"Records": "x"})), Request::Direct(_)));
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("a%2Fb%20c").as_deref(), Some("a/b c"));
        assert_eq!(percent_decode("%E2%9C%93").as_deref(), Some("\u{2713}"));
        assert_eq!(percent_decode("%zz"), None);
        assert_eq!(percent_decode("%4"), None);
        assert_eq!(percent_decode("%FF"), None);
    }
}
