//! A worker's options, their defaults and their limits, in one place: the tokio builder
//! ([`WorkerBuilder`](crate::worker::WorkerBuilder)), Node's `new Worker(...)` and Python's
//! `Worker(...)` each fill a [`WorkerSettings`] and check it with [`WorkerSettings::validate`],
//! which names a refused option as the caller spelled it.
//!
//! ```
//! use std::time::Duration;
//! use leaselock::worker::{WorkerField, WorkerSettings};
//! use leaselock::Error;
//!
//! let settings = WorkerSettings { orphan_interval: Duration::ZERO, ..WorkerSettings::default() };
//! let camel = |f: WorkerField| match f {
//!     WorkerField::OrphanInterval => "orphanIntervalMs",
//!     f => f.name(),
//! };
//! match settings.validate(camel) {
//!     Err(Error::InvalidInput { field, message }) => {
//!         assert_eq!((field.as_str(), message.as_str()), ("orphanIntervalMs", "must be greater than zero"));
//!     }
//!     other => panic!("{other:?}"),
//! }
//! assert_eq!(settings.validate(WorkerField::name).unwrap_err().to_string(), "invalid orphan_interval: must be greater than zero");
//! ```

use std::time::Duration;

use crate::config::{validate_duration, validate_id, validate_queue_url, validate_text};
use crate::engine::decide::{
    DEFAULT_DESIRED_STATE_INTERVAL, DEFAULT_HANDLER_GRACE, DEFAULT_HINT_WAIT, DEFAULT_INDEX_LAG,
    DEFAULT_MAX_CONNECTIONS, DEFAULT_METRICS_INTERVAL, DEFAULT_ORPHAN_INTERVAL, MAX_CONNECTIONS_LIMIT, MAX_HINT_WAIT,
};
use crate::{engine, Error, Result};

/// The longest metrics namespace, in bytes (CloudWatch's limit).
pub const MAX_METRICS_NAMESPACE_BYTES: usize = 255;

/// One option of a worker, for naming it in an error as the caller spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WorkerField {
    WorkerId,
    QueueUrl,
    MaxConnections,
    OrphanInterval,
    DesiredStateInterval,
    HandlerGrace,
    HintWait,
    IndexLag,
    MetricsInterval,
    MetricsNamespace,
    Balance,
    ClockTolerance,
    WaitForStoreClock,
}

impl WorkerField {
    /// Every option, in the order the bindings list them.
    pub const ALL: [WorkerField; 13] = [
        WorkerField::WorkerId,
        WorkerField::QueueUrl,
        WorkerField::MaxConnections,
        WorkerField::OrphanInterval,
        WorkerField::DesiredStateInterval,
        WorkerField::HandlerGrace,
        WorkerField::HintWait,
        WorkerField::IndexLag,
        WorkerField::MetricsInterval,
        WorkerField::MetricsNamespace,
        WorkerField::Balance,
        WorkerField::ClockTolerance,
        WorkerField::WaitForStoreClock,
    ];

    /// The option as the Rust builder names it: its method (`queue_url` for the url of
    /// [`hint_queue`](crate::worker::WorkerBuilder::hint_queue)).
    pub fn name(self) -> &'static str {
        match self {
            WorkerField::WorkerId => "worker_id",
            WorkerField::QueueUrl => "queue_url",
            WorkerField::MaxConnections => "max_connections",
            WorkerField::OrphanInterval => "orphan_interval",
            WorkerField::DesiredStateInterval => "desired_state_interval",
            WorkerField::HandlerGrace => "handler_grace",
            WorkerField::HintWait => "hint_wait",
            WorkerField::IndexLag => "index_lag",
            WorkerField::MetricsInterval => "metrics_interval",
            WorkerField::MetricsNamespace => "metrics_namespace",
            WorkerField::Balance => "balance",
            WorkerField::ClockTolerance => "clock_tolerance",
            WorkerField::WaitForStoreClock => "wait_for_store_clock",
        }
    }
}

/// Every option of a worker, [`Default`] the design's (see the builder's method of each).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerSettings {
    /// The owner name written into leases (`None`: host, pid and a random suffix).
    pub worker_id: Option<String>,
    /// The SQS queue of START hints (`None`: the orphan index alone finds work).
    pub queue_url: Option<String>,
    /// The most leases held at once (1 to [`MAX_CONNECTIONS_LIMIT`]).
    pub max_connections: usize,
    /// How often to query the orphan index (jittered ±20 %; more than zero).
    pub orphan_interval: Duration,
    /// How often to read the desired state of every held lease in one batch (more than zero).
    pub desired_state_interval: Duration,
    /// How long a cancelled handler may take to return before it is aborted.
    pub handler_grace: Duration,
    /// The long-poll wait of the hint queue (at most [`MAX_HINT_WAIT`]).
    pub hint_wait: Duration,
    /// Session mode: how far behind the table the owner index may be.
    pub index_lag: Duration,
    /// How often to write a metrics line (more than zero).
    pub metrics_interval: Duration,
    /// The CloudWatch namespace of the metrics (1 to [`MAX_METRICS_NAMESPACE_BYTES`] bytes).
    pub metrics_namespace: String,
    /// Session mode: claim at most a fair share of the fleet's work, hand the excess over.
    pub balance: bool,
    /// Claims wait until the store's clock is known within this (`None`: half the clock skew;
    /// more than zero).
    pub clock_tolerance: Option<Duration>,
    /// Whether claims wait for the store's clock at all.
    pub wait_for_store_clock: bool,
}

impl Default for WorkerSettings {
    fn default() -> Self {
        Self {
            worker_id: None,
            queue_url: None,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            orphan_interval: DEFAULT_ORPHAN_INTERVAL,
            desired_state_interval: DEFAULT_DESIRED_STATE_INTERVAL,
            handler_grace: DEFAULT_HANDLER_GRACE,
            hint_wait: DEFAULT_HINT_WAIT,
            index_lag: DEFAULT_INDEX_LAG,
            metrics_interval: DEFAULT_METRICS_INTERVAL,
            metrics_namespace: crate::metrics::NAMESPACE.to_string(),
            balance: true,
            clock_tolerance: None,
            wait_for_store_clock: true,
        }
    }
}

impl WorkerSettings {
    /// Checks every option against its limit: the first refused is an
    /// [`Error::InvalidInput`] whose field is `name` of it (the option as the caller spelled
    /// it: [`WorkerField::name`] for the Rust builder); a value the caller sent is quoted
    /// bounded and escaped ([`crate::render::value`]), never whole.
    pub fn validate(&self, name: impl Fn(WorkerField) -> &'static str) -> Result<()> {
        let invalid = |field: WorkerField, msg: String| Err(Error::invalid(name(field), msg));
        if let Some(id) = &self.worker_id {
            validate_id(name(WorkerField::WorkerId), id)?;
        }
        if let Some(url) = &self.queue_url {
            validate_queue_url(url).map_err(|e| match e {
                Error::InvalidInput { message, .. } => Error::invalid(name(WorkerField::QueueUrl), message),
                other => other,
            })?;
        }
        if !(1..=MAX_CONNECTIONS_LIMIT).contains(&self.max_connections) {
            return invalid(
                WorkerField::MaxConnections,
                format!("{} is out of range: 1 to {MAX_CONNECTIONS_LIMIT}", self.max_connections),
            );
        }
        let positive = |field: WorkerField, d: Duration| -> Result<()> {
            validate_duration(name(field), d)?;
            if d.is_zero() {
                return invalid(field, "must be greater than zero".into());
            }
            Ok(())
        };
        positive(WorkerField::OrphanInterval, self.orphan_interval)?;
        positive(WorkerField::DesiredStateInterval, self.desired_state_interval)?;
        validate_duration(name(WorkerField::HandlerGrace), self.handler_grace)?;
        if self.hint_wait > MAX_HINT_WAIT {
            return invalid(
                WorkerField::HintWait,
                format!("{} ms is too long: at most {} ms", self.hint_wait.as_millis(), MAX_HINT_WAIT.as_millis()),
            );
        }
        validate_duration(name(WorkerField::IndexLag), self.index_lag)?;
        positive(WorkerField::MetricsInterval, self.metrics_interval)?;
        validate_text(name(WorkerField::MetricsNamespace), &self.metrics_namespace, MAX_METRICS_NAMESPACE_BYTES)?;
        if self.metrics_namespace.is_empty() {
            return invalid(WorkerField::MetricsNamespace, "must not be empty".into());
        }
        if let Some(d) = self.clock_tolerance {
            positive(WorkerField::ClockTolerance, d)?;
        }
        Ok(())
    }

    /// The engine's settings of this worker as `worker_id` on a table of clock skew `skew_ms`
    /// (claims wait for the store's clock within the tolerance, half the skew by default, unless
    /// told not to); hints are received and sent when a queue is set.
    pub fn engine_settings(&self, worker_id: impl Into<String>, skew_ms: u64) -> engine::Settings {
        let ms = |d: Duration| d.as_millis() as u64;
        engine::Settings {
            worker_id: worker_id.into(),
            max_connections: self.max_connections,
            orphan_interval_ms: ms(self.orphan_interval),
            desired_state_interval_ms: ms(self.desired_state_interval),
            metrics_interval_ms: ms(self.metrics_interval),
            handler_grace_ms: ms(self.handler_grace),
            balance: self.balance,
            hints: self.queue_url.is_some(),
            hint_wait_ms: ms(self.hint_wait),
            index_lag_ms: ms(self.index_lag),
            clock_tolerance_ms: self.wait_for_store_clock.then(|| self.clock_tolerance.map_or(skew_ms / 2, ms)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(s: WorkerSettings) -> (String, String) {
        match s.validate(WorkerField::name) {
            Err(Error::InvalidInput { field, message }) => (field, message),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_defaults_are_the_designs_and_valid() {
        let s = WorkerSettings::default();
        s.validate(WorkerField::name).unwrap();
        let e = s.engine_settings("w1", 1_000);
        assert_eq!(e, engine::Settings { clock_tolerance_ms: Some(500), ..engine::Settings::new("w1", 700) });
        let off = WorkerSettings { wait_for_store_clock: false, ..WorkerSettings::default() };
        assert_eq!(off.engine_settings("w1", 1_000).clock_tolerance_ms, None);
        let set = WorkerSettings { clock_tolerance: Some(Duration::from_millis(80)), ..WorkerSettings::default() };
        assert_eq!(set.engine_settings("w1", 1_000).clock_tolerance_ms, Some(80));
    }

    #[test]
    fn each_limit_names_its_option() {
        let d = WorkerSettings::default;
        let huge = Duration::from_millis(u64::MAX);
        let cases = [
            (WorkerSettings { worker_id: Some(String::new()), ..d() }, "worker_id"),
            (WorkerSettings { queue_url: Some("file:///etc/passwd".into()), ..d() }, "queue_url"),
            (WorkerSettings { max_connections: 0, ..d() }, "max_connections"),
            (WorkerSettings { max_connections: MAX_CONNECTIONS_LIMIT + 1, ..d() }, "max_connections"),
            (WorkerSettings { orphan_interval: Duration::ZERO, ..d() }, "orphan_interval"),
            (WorkerSettings { desired_state_interval: huge, ..d() }, "desired_state_interval"),
            (WorkerSettings { handler_grace: huge, ..d() }, "handler_grace"),
            (WorkerSettings { hint_wait: Duration::from_secs(21), ..d() }, "hint_wait"),
            (WorkerSettings { index_lag: huge, ..d() }, "index_lag"),
            (WorkerSettings { metrics_interval: Duration::ZERO, ..d() }, "metrics_interval"),
            (WorkerSettings { metrics_namespace: String::new(), ..d() }, "metrics_namespace"),
            (WorkerSettings { metrics_namespace: "n".repeat(256), ..d() }, "metrics_namespace"),
            (WorkerSettings { clock_tolerance: Some(Duration::ZERO), ..d() }, "clock_tolerance"),
        ];
        for (settings, field) in cases {
            let (got, message) = refused(settings);
            assert_eq!(got, field, "{message}");
        }
        let (_, message) = refused(WorkerSettings { hint_wait: Duration::from_secs(21), ..d() });
        assert_eq!(message, "21000 ms is too long: at most 20000 ms");
        let (_, message) = refused(WorkerSettings { max_connections: 0, ..d() });
        assert_eq!(message, "0 is out of range: 1 to 100000");
        // Zero is allowed where it means "at once".
        WorkerSettings { handler_grace: Duration::ZERO, hint_wait: Duration::ZERO, index_lag: Duration::ZERO, ..d() }
            .validate(WorkerField::name)
            .unwrap();
    }

    #[test]
    fn a_hostile_value_is_named_as_the_caller_spells_it_and_quoted_bounded() {
        let url = format!("https://{}", "\u{1b}".repeat(900));
        let s = WorkerSettings { queue_url: Some(url), ..WorkerSettings::default() };
        let e = s.validate(|f| if f == WorkerField::QueueUrl { "queueUrl" } else { f.name() }).unwrap_err();
        let Error::InvalidInput { field, message } = e else { unreachable!() };
        assert_eq!(field, "queueUrl");
        assert!(message.len() < 500 && !message.chars().any(char::is_control), "{message}");
        let s = WorkerSettings { worker_id: Some("w\u{202e}".repeat(10_000)), ..WorkerSettings::default() };
        let (field, message) = refused(s);
        assert_eq!((field.as_str(), message.as_str()), ("worker_id", "too long: 40000 bytes, at most 1024 allowed"));
    }
}
