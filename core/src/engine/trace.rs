//! Worker trace vectors: a run of the engine as data. Each step is a time and an input (an
//! event, or only the time passing) and the commands the engine must emit in answer, in order.
//! Every driver replays them against its own binding of the engine; `tests/conformance/worker/`
//! holds the vectors, and its `broken/` folder vectors that must fail.

use super::{Command, Engine, Event, Now, Settings};
use crate::{LeaseMode, TableConfig};

/// The lease timing a trace runs with (the rest of the table's config is the default).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Timing {
    /// `per-item` or `session`.
    pub mode: String,
    pub lease_ms: u64,
    pub renew_ms: u64,
    pub skew_ms: u64,
}

impl Timing {
    pub fn of(config: &TableConfig) -> Self {
        Self {
            mode: config.mode.as_str().to_string(),
            lease_ms: config.lease_ms(),
            renew_ms: config.renew_ms(),
            skew_ms: config.skew_ms(),
        }
    }

    pub fn config(&self) -> crate::Result<TableConfig> {
        let mode = LeaseMode::parse(&self.mode).ok_or_else(|| crate::Error::invalid("mode", &self.mode))?;
        let ms = std::time::Duration::from_millis;
        let mut config = TableConfig::new("leaselock")
            .lease_duration(ms(self.lease_ms))
            .renew_interval(ms(self.renew_ms))
            .clock_skew(ms(self.skew_ms));
        config.mode = mode;
        config.validated()
    }
}

/// One step: at `at`, `event` (or, without one, only the time) and what must come out.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Step {
    pub at: Now,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<Event>,
    pub expect: Vec<Command>,
}

/// A recorded run.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Trace {
    pub name: String,
    pub description: String,
    pub settings: Settings,
    pub timing: Timing,
    pub seed: u64,
    pub start: Now,
    /// What the engine emits as it is created.
    pub start_expect: Vec<Command>,
    pub steps: Vec<Step>,
}

/// Where a replay parted from its trace (step 0: the engine's creation, then 1-based).
pub type Mismatch = crate::trace_vector::Mismatch<Command>;

fn drain(engine: &mut Engine) -> Vec<Command> {
    std::iter::from_fn(|| engine.poll_command()).collect()
}

/// Replays `trace` on a new engine; the first step whose commands differ is the error.
pub fn replay(trace: &Trace) -> Result<(), Mismatch> {
    let config = trace.timing.config().map_err(|e| Mismatch { step: 0, expected: vec![], got: vec![] }.with(e))?;
    let mut engine = Engine::new(trace.settings.clone(), config, trace.seed, trace.start);
    let got = drain(&mut engine);
    if got != trace.start_expect {
        return Err(Mismatch { step: 0, expected: trace.start_expect.clone(), got });
    }
    for (i, step) in trace.steps.iter().enumerate() {
        match &step.event {
            Some(event) => engine.handle(clone_event(event), step.at),
            None => engine.handle_timeout(step.at),
        }
        let got = drain(&mut engine);
        if got != step.expect {
            return Err(Mismatch { step: i + 1, expected: step.expect.clone(), got });
        }
    }
    Ok(())
}

impl Mismatch {
    fn with(self, e: crate::Error) -> Self {
        tracing::warn!(error = %e, "trace timing refused");
        self
    }
}

/// Events hold errors, which do not clone: a round trip through JSON copies one.
pub fn clone_event(event: &Event) -> Event {
    serde_json::from_value(serde_json::to_value(event).expect("event to json")).expect("event from json")
}

/// Records a run as a [`Trace`] while driving the engine.
#[derive(Debug)]
pub struct Recorder {
    pub engine: Engine,
    trace: Trace,
}

impl Recorder {
    pub fn new(name: &str, description: &str, settings: Settings, config: TableConfig, seed: u64, start: Now) -> Self {
        let mut engine = Engine::new(settings.clone(), config.clone(), seed, start);
        let start_expect = drain(&mut engine);
        let trace = Trace {
            name: name.into(),
            description: description.into(),
            settings,
            timing: Timing::of(&config),
            seed,
            start,
            start_expect,
            steps: Vec::new(),
        };
        Self { engine, trace }
    }

    /// The commands emitted so far and not yet taken by [`Recorder::step`] (the creation's).
    pub fn start_commands(&self) -> Vec<Command> {
        self.trace.start_expect.clone()
    }

    /// Feeds `event` (or the time) at `at` and returns the commands it produced.
    pub fn step(&mut self, at: Now, event: Option<Event>) -> Vec<Command> {
        let copy = event.as_ref().map(clone_event);
        match event {
            Some(event) => self.engine.handle(event, at),
            None => self.engine.handle_timeout(at),
        }
        let expect = drain(&mut self.engine);
        self.trace.steps.push(Step { at, event: copy, expect: expect.clone() });
        expect
    }

    pub fn finish(self) -> Trace {
        self.trace
    }
}
