//! One error type for every lease operation, in the words of what happened to the lease.

/// What went wrong with a lease operation. As JSON (the engine's trace vectors) it is an object
/// with its [`Error::kind`] under `kind` and the variant's fields or message under `detail`.
#[derive(Debug, Clone, thiserror::Error, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", content = "detail")]
pub enum Error {
    /// Someone else holds an unexpired lease (read from the failed write itself, no extra read).
    #[error("held by {owner} until {expires_at_ms} ms")]
    Held { owner: String, expires_at_ms: u64 },
    /// The lease is no longer ours: taken over, released, or past our local deadline.
    #[error("lease on {id} lost")]
    Lost { id: String },
    /// The id has no item.
    #[error("{id} not found")]
    NotFound { id: String },
    /// The work's desired state is STOPPED; it must not be claimed.
    #[error("{id} is stopped")]
    Stopped { id: String },
    /// A checkpoint must move forward.
    #[error("checkpoint {seq} on {id} refused: last_seq is already {last_seq}")]
    SeqNotIncreasing { id: String, last_seq: u64, seq: u64 },
    /// DynamoDB kept throttling until the retry budget ran out.
    #[error("throttled by the store")]
    Throttled,
    /// Every attempt timed out or failed on the server side until the budget ran out.
    #[error("the store did not answer in time{}", if *outcome_unknown { " (the write may have been applied)" } else { "" })]
    Timeout { outcome_unknown: bool },
    /// The store could not be reached (connection refused, DNS, TLS).
    #[error("the store is unreachable: {0}")]
    Unreachable(String),
    /// The credentials may not do this.
    #[error("access denied: {0}")]
    AccessDenied(String),
    /// The AWS client cannot send anything: no credentials or no region (the message names which).
    #[error("AWS SDK not configured: {0}")]
    NotConfigured(String),
    /// The table does not exist (or not in this region / account).
    #[error("table {table} does not exist (run `leaselock table create`)")]
    TableNotFound { table: String },
    /// The store refused a server-side script (Redis: a Lua error, NOSCRIPT, a busy script).
    #[error("script refused by the store: {0}")]
    Script(String),
    /// Bad input, refused before anything was written. A rejected value quoted in `message` is
    /// rendered with [`crate::render::value`] (bounded and escaped).
    #[error("invalid {field}: {message}")]
    InvalidInput { field: String, message: String },
    /// Any other store failure.
    #[error("store error: {0}")]
    Store(String),
}

impl Error {
    /// A short stable name for the variant (used by tests, metrics and the bindings).
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Held { .. } => "Held",
            Error::Lost { .. } => "Lost",
            Error::NotFound { .. } => "NotFound",
            Error::Stopped { .. } => "Stopped",
            Error::SeqNotIncreasing { .. } => "SeqNotIncreasing",
            Error::Throttled => "Throttled",
            Error::Timeout { .. } => "Timeout",
            Error::Unreachable(_) => "Unreachable",
            Error::AccessDenied(_) => "AccessDenied",
            Error::NotConfigured(_) => "NotConfigured",
            Error::TableNotFound { .. } => "TableNotFound",
            Error::Script(_) => "Script",
            Error::InvalidInput { .. } => "InvalidInput",
            Error::Store(_) => "Store",
        }
    }
}

/// The most an error's detail says, in bytes: what it quotes of a value the caller passed may
/// be megabytes long, and an error message is read by a person and copied into logs.
pub const MAX_DETAIL_BYTES: usize = 800;

impl Error {
    /// Bad input in `field`, refused before anything was written. The message is cut to
    /// [`MAX_DETAIL_BYTES`] (and says how long it was).
    pub fn invalid(field: impl Into<String>, message: impl std::fmt::Display) -> Self {
        let message = message.to_string();
        Error::InvalidInput {
            field: field.into(),
            message: crate::render::cut(&message, MAX_DETAIL_BYTES).into_owned(),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_invalid_input_message_quotes_at_most_its_bound() {
        let e = Error::invalid("candidate", format!("invalid type: string \"{}\"", "é".repeat(2_500_000)));
        let Error::InvalidInput { field, message } = &e else { unreachable!() };
        assert_eq!(field, "candidate");
        assert!(message.len() <= MAX_DETAIL_BYTES, "{} bytes", message.len());
        assert!(
            message.starts_with("invalid type: string \"éé") && message.ends_with("... (5000023 bytes)"),
            "{message}"
        );
        let short = Error::invalid("id", "must not be empty");
        assert!(matches!(short, Error::InvalidInput { message, .. } if message == "must not be empty"));
    }
}
