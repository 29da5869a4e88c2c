//! Elector trace vectors: a run of the election machine ([`super::machine::Elector`]) as data.
//! The call's setup, the seed and the start time, then steps: a monotonic time, an input (an
//! answer, the action's return, an abort; without one, only the time passing) and the outputs
//! the machine must emit in answer, in order. `tests/conformance/elector/` holds the vectors (its
//! `broken/` folder vectors that must fail); the Rust test and the Node runner replay them alike.

use serde_json::Value;

use super::machine::{Elector, Input, Output, Setup};
use crate::trace_vector::Run;

/// One step: at `at` (monotonic ms), `input` (or, without one, only the time) and what must
/// come out.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Step {
    pub at: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    pub expect: Vec<Value>,
}

/// A recorded call.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Trace {
    pub name: String,
    pub description: String,
    pub setup: Setup,
    pub seed: u64,
    pub start_mono_ms: u64,
    /// What the machine emits as it is created.
    pub start_expect: Vec<Value>,
    pub steps: Vec<Step>,
}

/// Where a replay parted from its trace (step 0: the machine's creation, then 1-based).
pub type Mismatch = crate::trace_vector::Mismatch<Value>;

impl crate::trace_vector::Machine for Elector {
    type Input = Input;
    type Output = Output;
    fn handle(&mut self, input: Input, now_mono_ms: u64) {
        Elector::handle(self, input, now_mono_ms)
    }
    fn handle_timeout(&mut self, now_mono_ms: u64) {
        Elector::handle_timeout(self, now_mono_ms)
    }
    fn poll_output(&mut self) -> Option<Output> {
        Elector::poll_output(self)
    }
}

impl crate::trace_vector::Step<Elector> for Step {
    fn at(&self) -> u64 {
        self.at
    }
    fn input(&self) -> Option<&Value> {
        self.input.as_ref()
    }
    fn expect(&self) -> &[Value] {
        &self.expect
    }
    fn took(_: &Elector, at: u64, input: Option<Value>, expect: Vec<Value>) -> Self {
        Step { at, input, expect }
    }
}

/// Replays `trace` on a new machine; the first step whose outputs differ is the error.
pub fn replay(trace: &Trace) -> Result<(), Mismatch> {
    let machine = Elector::new(trace.setup.clone(), trace.seed, trace.start_mono_ms);
    crate::trace_vector::replay(machine, &trace.start_expect, &trace.steps)
}

/// Records a call as a [`Trace`] while driving its machine.
#[derive(Debug)]
pub struct Recorder {
    run: Run<Elector, Step>,
    /// The trace but its run.
    trace: Trace,
}

impl Recorder {
    pub fn new(name: &str, description: &str, setup: Setup, seed: u64, start_mono_ms: u64) -> Self {
        let run = Run::new(Elector::new(setup.clone(), seed, start_mono_ms));
        let trace = Trace {
            name: name.into(),
            description: description.into(),
            setup,
            seed,
            start_mono_ms,
            start_expect: Vec::new(),
            steps: Vec::new(),
        };
        Self { run, trace }
    }

    /// What the machine emitted so far: at its creation, or in the last step.
    pub fn last(&self) -> &[Value] {
        self.run.last()
    }

    pub fn machine(&self) -> &Elector {
        self.run.machine()
    }

    /// `input` at `at` (`None`: the time only); returns what came out.
    pub fn step(&mut self, at: u64, input: Option<Input>) -> &[Value] {
        self.run.step(at, input)
    }

    pub fn finish(self) -> Trace {
        let (start_expect, steps) = self.run.finish();
        Trace { start_expect, steps, ..self.trace }
    }
}
