//! The SQS hint: "this work may need an owner". Only a hint; the lease decides ownership, so a
//! lost, repeated or stale hint costs at most one conditional write.

use crate::error::{Error, Result};

/// The body of a hint message, exactly `{"connection_id":"..."}`; `{"connection_id":"...",
/// "stranded":true}` for work found held under a session that is gone, retired or of an older
/// epoch ([`Hint::stranded`]).
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
    /// The work is held under a session nobody lists any more (the sweep found it): a worker
    /// takes it whatever its fair share, since no orphan query or dead-session listing counts
    /// it. Balance hands it on later if that worker is above its share.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stranded: bool,
    /// The work was held under this session, which its owner ended before hinting it (a
    /// graceful shutdown): the receiver reads the item and takes it over as listed, the hints
    /// of one batch in one transaction, with no read of the fleet's sessions to find the
    /// session dead. An older reader ignores it and claims the work as any hinted work.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<EndedSession>,
}

/// The session a hint's work was held under, ended by its owner ([`Hint::ended`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct EndedSession {
    pub owner: String,
    pub epoch: u64,
    /// The connections it held when it ended (its last report): the work it freed, which the
    /// receivers count in the fleet's work at once, whatever their last listing says.
    pub held: u64,
}

impl Hint {
    pub fn new(connection_id: impl Into<String>) -> Self {
        Self { connection_id: connection_id.into(), stranded: false, ended: None }
    }

    /// A hint for work held under the session `epoch` of `owner`, which that owner has ended.
    pub fn of_ended_session(connection_id: impl Into<String>, ended: Option<EndedSession>) -> Self {
        Self { connection_id: connection_id.into(), stranded: false, ended }
    }

    /// A hint for stranded work ([`LeaseStore::stranded`](crate::LeaseStore::stranded)).
    pub fn stranded(connection_id: impl Into<String>) -> Self {
        Self { connection_id: connection_id.into(), stranded: true, ended: None }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a struct of one string always serializes")
    }

    /// Parses a message body; unknown fields are ignored, an empty or oversized id is refused.
    pub fn from_json(body: &str) -> Result<Self> {
        let hint: Hint =
            serde_json::from_str(body).map_err(|e| Error::invalid("hint body", crate::render::text(&e.to_string())))?;
        crate::config::validate_id("connection_id", &hint.connection_id)?;
        if let Some(ended) = &hint.ended {
            crate::config::validate_id("ended.owner", &ended.owner)?;
        }
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
    fn a_stranded_hint_says_so_and_an_older_reader_sees_a_hint() {
        let body = Hint::stranded("s1").to_json();
        assert_eq!(body, r#"{"connection_id":"s1","stranded":true}"#);
        assert!(Hint::from_json(&body).unwrap().stranded);
        assert!(!Hint::from_json(r#"{"connection_id":"s1"}"#).unwrap().stranded);
    }

    #[test]
    fn a_hint_of_an_ended_session_names_it_and_an_older_reader_sees_a_hint() {
        let ended = EndedSession { owner: "w1".into(), epoch: 3, held: 700 };
        let body = Hint::of_ended_session("s1", Some(ended.clone())).to_json();
        assert_eq!(body, r#"{"connection_id":"s1","ended":{"owner":"w1","epoch":3,"held":700}}"#);
        assert_eq!(Hint::from_json(&body).unwrap().ended, Some(ended));
        assert_eq!(Hint::of_ended_session("s1", None).to_json(), Hint::new("s1").to_json());
        let bad = r#"{"connection_id":"s1","ended":{"owner":"","epoch":3,"held":1}}"#;
        assert!(Hint::from_json(bad).unwrap_err().to_string().contains("ended.owner"));
    }

    #[test]
    fn bad_bodies_name_the_problem() {
        assert!(Hint::from_json("not json").unwrap_err().to_string().contains("hint body"));
        assert!(Hint::from_json(r#"{"connection_id":""}"#).unwrap_err().to_string().contains("connection_id"));
        assert!(Hint::from_json(r#"{"connection_id":7}"#).is_err());
    }
}
