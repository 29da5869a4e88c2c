//! [`leaselock::Error`] as the JSON the JavaScript side turns into an `Error` subclass (in
//! `lib/errors.js`, the one place that does), and back.

use leaselock::Error;
use serde_json::{json, Value};

use crate::config::js_field;

/// `{ kind, message, ...fields }` with the fields of the variant, camelCase; the message on one
/// line and bounded ([`leaselock::render::message`], as Python's are).
pub fn to_json(e: &Error) -> Value {
    let mut value = unbounded(e);
    if let Some(Value::String(message)) = value.get_mut("message") {
        if let std::borrow::Cow::Owned(bounded) = leaselock::render::message(message) {
            *message = bounded;
        }
    }
    value
}

fn unbounded(e: &Error) -> Value {
    let message = e.to_string();
    let kind = e.kind();
    match e {
        Error::Held { owner, expires_at_ms } => {
            json!({ "kind": kind, "message": message, "owner": owner, "expiresAtMs": expires_at_ms })
        }
        Error::Lost { id } | Error::NotFound { id } | Error::Stopped { id } => {
            json!({ "kind": kind, "message": message, "id": id })
        }
        Error::SeqNotIncreasing { id, last_seq, seq } => {
            json!({ "kind": kind, "message": message, "id": id, "lastSeq": last_seq, "seq": seq })
        }
        Error::InvalidInput { field, message: detail } => {
            let field = js_field(field);
            json!({ "kind": kind, "message": format!("invalid {field}: {detail}"), "field": field })
        }
        Error::Timeout { outcome_unknown } => {
            json!({ "kind": kind, "message": message, "outcomeUnknown": outcome_unknown })
        }
        Error::TableNotFound { table } => json!({ "kind": kind, "message": message, "table": table }),
        Error::Throttled
        | Error::Unreachable(_)
        | Error::AccessDenied(_)
        | Error::NotConfigured(_)
        | Error::Script(_)
        | Error::Store(_) => {
            json!({ "kind": kind, "message": message })
        }
    }
}

/// The error a JSON value from [`to_json`] stands for (the worker passes a renewal's error back
/// to the decisions).
pub fn from_json(v: &Value) -> Error {
    let str_of = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
    let num_of = |k: &str| v.get(k).and_then(Value::as_u64).unwrap_or_default();
    match v.get("kind").and_then(Value::as_str).unwrap_or_default() {
        "Held" => Error::Held { owner: str_of("owner"), expires_at_ms: num_of("expiresAtMs") },
        "Lost" => Error::Lost { id: str_of("id") },
        "NotFound" => Error::NotFound { id: str_of("id") },
        "Stopped" => Error::Stopped { id: str_of("id") },
        "SeqNotIncreasing" => {
            Error::SeqNotIncreasing { id: str_of("id"), last_seq: num_of("lastSeq"), seq: num_of("seq") }
        }
        "Throttled" => Error::Throttled,
        "Timeout" => {
            Error::Timeout { outcome_unknown: v.get("outcomeUnknown").and_then(Value::as_bool).unwrap_or(true) }
        }
        "Unreachable" => Error::Unreachable(str_of("message")),
        "AccessDenied" => Error::AccessDenied(str_of("message")),
        "NotConfigured" => Error::NotConfigured(str_of("message")),
        "TableNotFound" => Error::TableNotFound { table: str_of("table") },
        "InvalidInput" => {
            let (field, message) = (str_of("field"), str_of("message"));
            let detail = message.strip_prefix(&format!("invalid {field}: ")).unwrap_or(&message).to_string();
            Error::invalid(field, detail)
        }
        _ => Error::Store(str_of("message")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_is_one_line_and_bounded_whatever_it_carries() {
        let huge = Error::Store(format!("ValidationException: {}\nsecond line", "x".repeat(5_000_000)));
        let message = to_json(&huge)["message"].as_str().unwrap().to_string();
        assert!(message.len() <= leaselock::render::MESSAGE_BYTES, "{} bytes", message.len());
        assert!(message.starts_with("store error: ValidationException: xxx"), "{message}");
        assert!(!message.contains('\n') && message.ends_with(" bytes)"), "{message}");
        let short = to_json(&Error::Lost { id: "s1".into() });
        assert_eq!(short["message"], Error::Lost { id: "s1".into() }.to_string());
    }

    #[test]
    fn fields_survive_the_round_trip() {
        let held = to_json(&Error::Held { owner: "w1".into(), expires_at_ms: 42 });
        assert_eq!(
            (held["kind"].as_str(), held["owner"].as_str(), held["expiresAtMs"].as_u64()),
            (Some("Held"), Some("w1"), Some(42))
        );
        assert!(matches!(from_json(&held), Error::Held { expires_at_ms: 42, .. }));
        let lost = to_json(&Error::Lost { id: "a".into() });
        assert!(matches!(from_json(&lost), Error::Lost { id } if id == "a"));
    }

    #[test]
    fn invalid_input_names_the_javascript_field() {
        let e = to_json(&Error::invalid("lease_duration", "2s must be greater than 2 x clock_skew (1s)"));
        assert_eq!(e["field"], "leaseMs");
        assert_eq!(e["message"], "invalid leaseMs: 2s must be greater than 2 x clock_skew (1s)");
        assert_eq!(to_json(&Error::invalid("id", "must not be empty"))["field"], "id");
        assert_eq!(to_json(&Error::invalid("attributes.fence", "x"))["field"], "attributeNames.fence");
        let back = from_json(&to_json(&Error::invalid("id", "must not be empty")));
        assert!(
            matches!(back, Error::InvalidInput { field, message } if field == "id" && message == "must not be empty")
        );
    }
}
