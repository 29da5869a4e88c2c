//! Holder trace vectors: a run of the holder machine ([`super::Holder`]) as data. The setup, the
//! lease as claimed, the seed and the start time, then steps: a monotonic time, an input (a
//! renewal's answer, a cover, a session event, a cancellation; without one, only the time
//! passing) and the outputs the machine must emit in answer, in order, with whether the holder
//! may act after them. `tests/conformance/holder/` holds the vectors (its `broken/` folder
//! vectors that must fail); the Rust test and the Node runner replay them alike.

use serde_json::Value;

use super::{Holder, Input, Output, Setup};
use crate::trace_vector::Run;
use crate::Lease;

/// One step: at `at` (monotonic ms), `input` (or, without one, only the time), what must come
/// out, and whether the holder may act at `at` afterwards.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Step {
    pub at: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    pub expect: Vec<Value>,
    pub may_act: bool,
}

/// A recorded held lease.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Trace {
    pub name: String,
    pub description: String,
    pub setup: Setup,
    pub lease: Lease,
    pub seed: u64,
    pub start_mono_ms: u64,
    /// What the machine emits as it is created.
    pub start_expect: Vec<Value>,
    pub steps: Vec<Step>,
}

/// Where a replay parted from its trace (step 0: the machine's creation, then 1-based).
pub type Mismatch = crate::trace_vector::Mismatch<Value>;

impl crate::trace_vector::Machine for Holder {
    type Input = Input;
    type Output = Output;
    fn handle(&mut self, input: Input, now_mono_ms: u64) {
        Holder::handle(self, input, now_mono_ms)
    }
    fn handle_timeout(&mut self, now_mono_ms: u64) {
        Holder::handle_timeout(self, now_mono_ms)
    }
    fn poll_output(&mut self) -> Option<Output> {
        Holder::poll_output(self)
    }
}

impl crate::trace_vector::Step<Holder> for Step {
    fn at(&self) -> u64 {
        self.at
    }
    fn input(&self) -> Option<&Value> {
        self.input.as_ref()
    }
    fn expect(&self) -> &[Value] {
        &self.expect
    }
    fn took(machine: &Holder, at: u64, input: Option<Value>, expect: Vec<Value>) -> Self {
        Step { at, input, expect, may_act: machine.may_act(at) }
    }
    /// Its outputs, then `{"may_act": ...}`.
    fn shown(&self) -> Vec<Value> {
        let mut shown = self.expect.clone();
        shown.push(serde_json::json!({ "may_act": self.may_act }));
        shown
    }
}

/// Replays `trace` on a new machine; the first step whose outputs (or `may_act`) differ is the
/// error.
pub fn replay(trace: &Trace) -> Result<(), Mismatch> {
    let machine = Holder::new(trace.setup.clone(), &trace.lease, trace.seed, trace.start_mono_ms);
    crate::trace_vector::replay(machine, &trace.start_expect, &trace.steps)
}

/// Records a held lease as a [`Trace`] while driving its machine.
#[derive(Debug)]
pub struct Recorder {
    run: Run<Holder, Step>,
    /// The trace but its run.
    trace: Trace,
}

impl Recorder {
    pub fn new(name: &str, description: &str, setup: Setup, lease: Lease, seed: u64, start_mono_ms: u64) -> Self {
        let run = Run::new(Holder::new(setup.clone(), &lease, seed, start_mono_ms));
        let trace = Trace {
            name: name.into(),
            description: description.into(),
            setup,
            lease,
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

    pub fn machine(&self) -> &Holder {
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
