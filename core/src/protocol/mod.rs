//! The lease protocol without I/O: for every lease operation, the DynamoDB request(s) to send and
//! what each answer means. Every driver runs the same decisions: the Rust [`crate::LeaseTable`]
//! over `aws-sdk-dynamodb`, and a JavaScript driver over `@aws-sdk/client-dynamodb` through wasm.
//!
//! # Running an operation
//!
//! Build the operation (`Acquire::new(&config, id, owner)`, [`Renew::new`], ...; input is
//! validated there), then call [`Operation::next`] with an [`Input`] until it returns
//! [`Step::Done`] or [`Step::Fail`]:
//!
//! - [`Step::Send`]: send `request` (at most `attempt_timeout_ms` for the attempt, and no retry of
//!   your own: the protocol retries), then call `next` with the [`Answer`];
//! - [`Step::Sleep`]: wait `ms`, then call `next` with no answer;
//! - a consistent re-read after an ambiguous write is a `Send` of a `GetItem` with
//!   `ConsistentRead`: the driver need not tell it apart.
//!
//! Every [`Input`] carries the driver's clocks (wall ms for expiries, monotonic ms for deadlines)
//! and one uniform random draw in `[0, 1)` for the backoff jitter, so the decisions are plain
//! functions of their inputs. Requests are the DynamoDB API's JSON (see [`request`]); a failed
//! request becomes an [`Answer`] kind (a service error's code can be classified by
//! [`Answer::from_service_error`]).
//!
//! ```
//! use leaselock::protocol::{s, Acquire, Answer, Input, Operation, Output, Request, Step};
//! use leaselock::{Error, TableConfig};
//!
//! let config = TableConfig::new("leases");
//! let now = 1_700_000_000_000;
//! let mut claim = Acquire::new(&config, "stream-1", "worker-a").unwrap();
//! let Step::Send { request: Request::UpdateItem(update), attempt_timeout_ms } = claim.next(Input::new(now, 0, 0.5))
//! else { panic!("a claim starts with an UpdateItem") };
//! assert_eq!(attempt_timeout_ms, 2_000);
//! assert_eq!(update.table_name, "leases");
//!
//! // The driver sends it; say the condition failed because worker-b holds the lease.
//! let mut old = update.key.clone();
//! old.insert("lease_owner".into(), s("worker-b"));
//! old.insert("lease_expires_at_ms".into(), leaselock::protocol::n(now + 15_000));
//! let answer = Answer::ConditionFailed { item: Some(old) };
//! match claim.next(Input::new(now, 3, 0.5).with(answer)) {
//!     Step::Fail(Error::Held { owner, .. }) => assert_eq!(owner, "worker-b"),
//!     other => panic!("{other:?}"),
//! }
//!
//! // Another claim, which lands: the answer is the new item (`ReturnValues: ALL_NEW`).
//! let mut claim = Acquire::new(&config, "stream-2", "worker-a").unwrap();
//! let Step::Send { request: Request::UpdateItem(update), .. } = claim.next(Input::new(now, 10, 0.5)) else { panic!() };
//! let mut new = update.key.clone();
//! new.insert("lease_owner".into(), s("worker-a"));
//! new.insert("fence".into(), leaselock::protocol::n(1));
//! new.insert("lease_expires_at_ms".into(), leaselock::protocol::n(now + 20_000));
//! let answer = Answer::Ok(Output { attributes: Some(new), ..Output::default() });
//! let Step::Done(lease) = claim.next(Input::new(now, 12, 0.5).with(answer)) else { panic!() };
//! assert_eq!((lease.fence, lease.deadline_mono_ms), (1, 10 + 20_000 - 1_000));
//! ```

mod check_table;
pub mod election;
mod fenced_write;
mod ops;
mod reads;
pub mod request;
mod session;
mod stranded;
mod table;
pub mod value;

use serde::{Deserialize, Serialize};

pub use check_table::{eventual_global_table, replication_verdict, CheckTable, TableReplication};
pub use election::{ListCandidates, RegisterCandidate, WithdrawCandidate};
pub use fenced_write::{checkpoint_update, lease_condition, FencedWrite, MAX_FENCED_WRITES};
pub use ops::{Acquire, Checkpoint, Release, Renew, Start, Stop};
pub(crate) use reads::BatchGet;
pub use reads::{BatchDesiredStates, CountByState, Get, Items, OrphansPage, OwnedBy, Sessions, BATCH_GET_MAX};
pub use request::{CancellationReason, Output, Request};
pub use session::{
    epoch_of, ClaimInSession, CreateSession, EndSession, RenewSession, RetireSession, TakeOverListed, TAKE_OVER_MAX,
};
pub use stranded::Stranded;
pub use table::{orphan_index, owner_index, table_definition, CreateTable, CREATE_TABLE_WAIT_MS};
pub use value::{item_from_attrs, key, n, s, AttributeValue, Item};

use crate::lease::{backoff_ms, retry_fits};
use crate::Error;

/// How long one request attempt of a lease operation (acquire, renew, release, checkpoint, fenced
/// writes) may take before it counts as ambiguous.
pub const LEASE_ATTEMPT_TIMEOUT_MS: u64 = 2_000;

/// One lease operation as a step function. See the module docs for how a driver runs it.
pub trait Operation {
    type Output;
    /// The next step, given the clocks, a random draw and the answer to the last `Send` (none on
    /// the first call and after a `Sleep`).
    fn next(&mut self, input: Input) -> Step<Self::Output>;
}

/// What the driver tells the operation at each step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Input {
    /// Wall clock, epoch ms (expiries are written in it).
    pub now_ms: u64,
    /// Monotonic ms from any origin (deadlines and budgets are measured on it).
    pub mono_ms: u64,
    /// A uniform draw in `[0, 1)` for backoff jitter.
    pub random: f64,
    /// The answer to the request of the last `Send`; none on the first call and after a `Sleep`.
    pub answer: Option<Answer>,
}

impl Input {
    pub fn new(now_ms: u64, mono_ms: u64, random: f64) -> Self {
        Self { now_ms, mono_ms, random, answer: None }
    }

    pub fn with(mut self, answer: Answer) -> Self {
        self.answer = Some(answer);
        self
    }
}

/// What a sent request came back with.
#[allow(clippy::large_enum_variant)] // moved once per request; boxing would only burden drivers
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Answer {
    /// It succeeded; its output.
    Ok(Output),
    /// `ConditionalCheckFailedException`, with the old item (`ALL_OLD`) when there was one.
    ConditionFailed { item: Option<Item> },
    /// `TransactionCanceledException` and its `CancellationReasons`.
    TransactionCanceled { reasons: Vec<CancellationReason> },
    /// Throttling: nothing was applied.
    Throttled(String),
    /// Another writer is changing the item right now (a transaction; on a multi-Region strong
    /// consistency global table, a write in another Region): nothing was applied. Contention,
    /// retried as throttling is, never a lost lease.
    Conflict(String),
    /// A timeout, a cut connection or a 5xx: a write may or may not have been applied.
    Ambiguous(String),
    /// The request could not be sent (connection refused, DNS, TLS): nothing was applied.
    Unreachable(String),
    /// The credentials may not do this.
    AccessDenied(String),
    /// The client lacks what it needs to send anything (credentials, a region): nothing was sent.
    NotConfigured(String),
    /// `ResourceNotFoundException`: the table (or index) does not exist.
    ResourceNotFound(String),
    /// `ResourceInUseException` (a table being created already exists).
    ResourceInUse(String),
    /// Anything else (validation errors, ...): reported as a store error.
    Other(String),
}

/// Error codes that mean "throttled, nothing applied, back off".
pub const THROTTLING_CODES: &[&str] =
    &["ProvisionedThroughputExceededException", "RequestLimitExceeded", "ThrottlingException", "Throttling"];

/// Error codes that mean "another writer is on this item now, nothing applied, back off":
/// a transaction in progress on it, or (multi-Region strong consistency) a write to it in
/// another Region, which DynamoDB answers with HTTP 400 `ReplicatedWriteConflictException`.
pub const CONFLICT_CODES: &[&str] = &["TransactionConflictException", "ReplicatedWriteConflictException"];

/// Error codes that mean the credentials are refused.
pub const ACCESS_DENIED_CODES: &[&str] = &[
    "AccessDeniedException",
    "UnrecognizedClientException",
    "InvalidSignatureException",
    "ExpiredTokenException",
    "MissingAuthenticationTokenException",
];

impl Answer {
    /// The answer kind of a service error other than a failed condition or a cancelled
    /// transaction, from its code (e.g. the JavaScript SDK's `err.name`), message and HTTP status.
    pub fn from_service_error(code: &str, message: &str, status: u16) -> Answer {
        let text = format!("{code}: {message}");
        if THROTTLING_CODES.contains(&code) {
            Answer::Throttled(text)
        } else if CONFLICT_CODES.contains(&code) {
            Answer::Conflict(text)
        } else if ACCESS_DENIED_CODES.contains(&code) {
            Answer::AccessDenied(text)
        } else if code == "ResourceNotFoundException" {
            Answer::ResourceNotFound(text)
        } else if code == "ResourceInUseException" {
            Answer::ResourceInUse(text)
        } else if code == "TransactionInProgressException" || (500..600).contains(&status) {
            // In progress under the same token, or a server failure: it may be (or become) applied.
            Answer::Ambiguous(text)
        } else {
            Answer::Other(text)
        }
    }
}

/// What the driver does next.
#[derive(Debug)]
pub enum Step<T> {
    /// Send `request`, giving the attempt at most `attempt_timeout_ms`; then call `next` with its answer.
    Send { request: Request, attempt_timeout_ms: u64 },
    /// Wait, then call `next` without an answer.
    Sleep { ms: u64 },
    /// The operation succeeded.
    Done(T),
    /// The operation failed.
    Fail(Error),
}

/// Why the last attempt did not get through, reported when the budget runs out.
#[derive(Debug, Clone)]
pub(crate) enum Cause {
    Throttled,
    /// Another writer held the item (a transaction, another Region's write): reported as
    /// throttling when the budget runs out, so a renewal still ends `Lost` only at its deadline.
    Conflict,
    Timeout,
    Unreachable(String),
    /// The condition failed but the item read back did not explain it (it changed in between).
    Contention,
}

/// One operation's retry budget: retries back off with full jitter and must end before `until`.
#[derive(Debug, Clone)]
pub(crate) struct Budget {
    budget_ms: u64,
    attempt_timeout_ms: u64,
    /// Attempts end by the budget's end (operations holding no lease).
    cap_attempts: bool,
    until: Option<u64>,
    attempt: u32,
    /// A write attempt was ambiguous: a timeout at the end says the outcome is unknown.
    pub(crate) maybe_applied: bool,
}

impl Budget {
    /// A lease operation's budget: `budget_ms`, 2 s attempts.
    pub(crate) fn lease(budget_ms: u64) -> Self {
        Self {
            budget_ms,
            attempt_timeout_ms: LEASE_ATTEMPT_TIMEOUT_MS,
            cap_attempts: false,
            until: None,
            attempt: 0,
            maybe_applied: false,
        }
    }

    /// A budget ending at a fixed monotonic time (a lease's deadline).
    pub(crate) fn until(deadline_mono_ms: u64) -> Self {
        Self { until: Some(deadline_mono_ms), ..Self::lease(0) }
    }

    /// The budget of an operation that holds no lease (`operation_budget` and its attempt timeout).
    pub(crate) fn operation(config: &crate::TableConfig) -> Self {
        Self {
            budget_ms: config.operation_budget.as_millis() as u64,
            attempt_timeout_ms: config.operation_attempt_timeout.as_millis() as u64,
            cap_attempts: true,
            ..Self::lease(0)
        }
    }

    /// Starts the clock at the first send (no-op afterwards).
    pub(crate) fn begin(&mut self, mono_ms: u64) {
        self.until.get_or_insert(mono_ms + self.budget_ms);
    }

    /// A fresh budget for the next page of a paginated read.
    pub(crate) fn restart(&mut self, mono_ms: u64) {
        self.until = Some(mono_ms + self.budget_ms);
        self.attempt = 0;
    }

    /// A `Send` of `request`, the attempt bounded as configured.
    pub(crate) fn send<T>(&mut self, mono_ms: u64, request: Request) -> Step<T> {
        self.begin(mono_ms);
        let mut timeout = self.attempt_timeout_ms;
        if self.cap_attempts {
            let left = self.until.unwrap_or(u64::MAX).saturating_sub(mono_ms);
            timeout = timeout.min(left).max(1);
        }
        Step::Send { request, attempt_timeout_ms: timeout }
    }

    /// A jittered pause before the next attempt, or, when it would not end before the budget
    /// does, the failure `cause` stands for.
    pub(crate) fn pause<T>(&mut self, input: &Input, cause: Cause) -> Step<T> {
        let delay = backoff_ms(self.attempt, 25, 1_000, input.random);
        let until = self.until.unwrap_or(input.mono_ms);
        if !retry_fits(input.mono_ms, delay + self.least_attempt_ms(), until) {
            return Step::Fail(self.exhausted(cause));
        }
        tracing::debug!(attempt = self.attempt, delay_ms = delay, cause = ?cause, "retrying");
        self.attempt += 1;
        Step::Sleep { ms: delay }
    }

    /// The least time a capped attempt is started with: an attempt cut to a few milliseconds by
    /// the budget's end would turn a throttling answer into a timeout whose outcome is unknown.
    fn least_attempt_ms(&self) -> u64 {
        if self.cap_attempts {
            (self.budget_ms / 5).max(100).min(self.attempt_timeout_ms)
        } else {
            0
        }
    }

    fn exhausted(&self, cause: Cause) -> Error {
        match cause {
            Cause::Throttled | Cause::Conflict => Error::Throttled,
            Cause::Timeout => Error::Timeout { outcome_unknown: self.maybe_applied },
            Cause::Unreachable(m) => Error::Unreachable(m),
            Cause::Contention => Error::Store("the item changed under every attempt".into()),
        }
    }
}

/// The step for an answer the operation never asks for (a condition failure of a write without
/// a condition, a transaction answer to a single write).
pub(crate) fn unexpected<T>() -> Step<T> {
    Step::Fail(crate::Error::Store("unexpected answer".into()))
}

/// What an answer means before the operation looks at it.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Triage {
    Ok(Output),
    Condition(Option<Item>),
    Canceled(Vec<CancellationReason>),
    /// Nothing was applied; retry within the budget.
    Retry(Cause),
    /// It may have been applied.
    Ambiguous,
    Fail(Error),
}

pub(crate) fn triage(answer: Answer, table: &str) -> Triage {
    match answer {
        Answer::Ok(out) => Triage::Ok(out),
        Answer::ConditionFailed { item } => Triage::Condition(item),
        Answer::TransactionCanceled { reasons } => Triage::Canceled(reasons),
        Answer::Throttled(m) => {
            tracing::debug!(%m, "throttled");
            Triage::Retry(Cause::Throttled)
        }
        Answer::Conflict(m) => {
            tracing::debug!(%m, "write conflict");
            Triage::Retry(Cause::Conflict)
        }
        Answer::Unreachable(m) => Triage::Retry(Cause::Unreachable(m)),
        Answer::Ambiguous(m) => {
            tracing::debug!(%m, "no answer or a server error");
            Triage::Ambiguous
        }
        Answer::AccessDenied(m) => Triage::Fail(Error::AccessDenied(m)),
        Answer::NotConfigured(m) => Triage::Fail(Error::NotConfigured(m)),
        Answer::ResourceNotFound(_) => Triage::Fail(Error::TableNotFound { table: table.to_string() }),
        Answer::ResourceInUse(m) | Answer::Other(m) => Triage::Fail(Error::Store(m)),
    }
}

/// A read's answer: an output, or the step to take (retry a failure, or fail). Reads are
/// idempotent, so an ambiguous read is simply retried.
#[allow(clippy::result_large_err)]
pub(crate) fn read_answer<T>(
    budget: &mut Budget,
    input: &Input,
    answer: Answer,
    table: &str,
) -> Result<Output, Step<T>> {
    match triage(answer, table) {
        Triage::Ok(out) => Ok(out),
        Triage::Retry(cause) => Err(budget.pause(input, cause)),
        Triage::Ambiguous => Err(budget.pause(input, Cause::Timeout)),
        Triage::Fail(e) => Err(Step::Fail(e)),
        Triage::Condition(_) | Triage::Canceled(_) => {
            Err(Step::Fail(Error::Store("a read cannot fail a condition".into())))
        }
    }
}

#[cfg(test)]
mod tests;
