//! The SQS hint: "this work may need an owner". Only a hint; the lease decides ownership, so a
//! lost, repeated or stale hint costs at most one conditional write.

use crate::error::{Error, Result};

/// The body of a hint message, exactly `{"connection_id":"..."}`.
///
/// ```
/// use leaselock::Hint;
///
/// let hint = Hint::new("stream-1");
/// assert_eq!(hint.to_json(), r#"{"connection_id":"stream-1"}"#);
/// assert_eq!(Hint::from_json(&hint.to_json()).unwrap(), hint);
/// assert!(Hint::from_json(r#"{"id":"x"}"#).is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Hint {
    pub connection_id: String,
}

impl Hint {
    pub fn new(connection_id: impl Into<String>) -> Self {
        Self { connection_id: connection_id.into() }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a struct of one string always serializes")
    }

    /// Parses a message body; unknown fields are ignored, an empty or oversized id is refused.
    pub fn from_json(body: &str) -> Result<Self> {
        let hint: Hint =
            serde_json::from_str(body).map_err(|e| Error::invalid("hint body", crate::render::text(&e.to_string())))?;
        crate::config::validate_id("connection_id", &hint.connection_id)?;
        Ok(hint)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_format_is_the_routers() {
        assert_eq!(Hint::new("a\"b").to_json(), r#"{"connection_id":"a\"b"}"#);
        let parsed = Hint::from_json(r#"{"connection_id":"s1","sent_at":3}"#).unwrap();
        assert_eq!(parsed.connection_id, "s1");
    }

    #[test]
    fn bad_bodies_name_the_problem() {
        assert!(Hint::from_json("not json").unwrap_err().to_string().contains("hint body"));
        assert!(Hint::from_json(r#"{"connection_id":""}"#).unwrap_err().to_string().contains("connection_id"));
        assert!(Hint::from_json(r#"{"connection_id":7}"#).is_err());
    }
}
