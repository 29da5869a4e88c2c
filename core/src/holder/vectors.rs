//! Holder trace vectors: a run of the holder machine ([`super::Holder`]) as data. The setup, the
//! lease as claimed, the seed and the start time, then steps: a monotonic time, an input (a
//! renewal's answer, a cover, a session event, a cancellation; without one, only the time
//! passing) and the outputs the machine must emit in answer, in order, with whether the holder
//! may act after them. `tests/conformance/holder/` holds the vectors (its `broken/` folder
//! vectors that must fail); the Rust test and the Node runner replay them alike.

use serde_json::Value;

use super::{Holder, Input, Output, Setup};
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

fn drain(machine: &mut Holder) -> Vec<Value> {
    std::iter::from_fn(|| machine.poll_output()).map(|o| json(&o)).collect()
}

fn json(output: &Output) -> Value {
    serde_json::to_value(output).expect("outputs are plain data")
}

/// What a step must show: its outputs, then `{"may_act": ...}`.
fn shown(mut outputs: Vec<Value>, may_act: bool) -> Vec<Value> {
    outputs.push(serde_json::json!({ "may_act": may_act }));
    outputs
}

/// Replays `trace` on a new machine; the first step whose outputs (or `may_act`) differ is the
/// error.
pub fn replay(trace: &Trace) -> Result<(), Mismatch> {
    let mut machine = Holder::new(trace.setup.clone(), &trace.lease, trace.seed, trace.start_mono_ms);
    let got = drain(&mut machine);
    if got != trace.start_expect {
        return Err(Mismatch { step: 0, expected: trace.start_expect.clone(), got });
    }
    for (i, step) in trace.steps.iter().enumerate() {
        match &step.input {
            Some(input) => match serde_json::from_value::<Input>(input.clone()) {
                Ok(input) => machine.handle(input, step.at),
                Err(e) => {
                    let got = vec![Value::String(format!("unreadable input: {e}"))];
                    return Err(Mismatch { step: i + 1, expected: step.expect.clone(), got });
                }
            },
            None => machine.handle_timeout(step.at),
        }
        let got = shown(drain(&mut machine), machine.may_act(step.at));
        let expected = shown(step.expect.clone(), step.may_act);
        if got != expected {
            return Err(Mismatch { step: i + 1, expected, got });
        }
    }
    Ok(())
}

/// Records a held lease as a [`Trace`] while driving its machine.
#[derive(Debug)]
pub struct Recorder {
    machine: Holder,
    trace: Trace,
}

impl Recorder {
    pub fn new(name: &str, description: &str, setup: Setup, lease: Lease, seed: u64, start_mono_ms: u64) -> Self {
        let mut machine = Holder::new(setup.clone(), &lease, seed, start_mono_ms);
        let start_expect = drain(&mut machine);
        let trace = Trace {
            name: name.into(),
            description: description.into(),
            setup,
            lease,
            seed,
            start_mono_ms,
            start_expect,
            steps: Vec::new(),
        };
        Self { machine, trace }
    }

    /// What the machine emitted so far: at its creation, or in the last step.
    pub fn last(&self) -> &[Value] {
        self.trace.steps.last().map_or(&self.trace.start_expect, |s| &s.expect)
    }

    pub fn machine(&self) -> &Holder {
        &self.machine
    }

    /// `input` at `at` (`None`: the time only); returns what came out.
    pub fn step(&mut self, at: u64, input: Option<Input>) -> &[Value] {
        let recorded = input.as_ref().map(|i| serde_json::to_value(i).expect("inputs are plain data"));
        match input {
            Some(input) => self.machine.handle(input, at),
            None => self.machine.handle_timeout(at),
        }
        let expect = drain(&mut self.machine);
        let may_act = self.machine.may_act(at);
        self.trace.steps.push(Step { at, input: recorded, expect, may_act });
        self.last()
    }

    pub fn finish(self) -> Trace {
        self.trace
    }
}
