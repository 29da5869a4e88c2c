//! One error type for every lease operation, in the words of what happened to the lease.

/// What went wrong with a lease operation.
#[derive(Debug, thiserror::Error)]
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
    /// Bad input, refused before anything was written; the message names the field.
    #[error("invalid input: {0}")]
    InvalidInput(String),
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
            Error::InvalidInput(_) => "InvalidInput",
            Error::Store(_) => "Store",
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
