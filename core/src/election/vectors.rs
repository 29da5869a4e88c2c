//! Elector trace vectors: a run of the election machine ([`super::machine::Elector`]) as data.
//! The call's setup, the seed and the start time, then steps: a monotonic time, an input (an
//! answer, the action's return, an abort; without one, only the time passing) and the outputs
//! the machine must emit in answer, in order. `tests/conformance/elector/` holds the vectors (its
//! `broken/` folder vectors that must fail); the Rust test and the Node runner replay them alike.

use serde_json::Value;

use super::machine::{Elector, Input, Output, Setup};

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

fn drain(machine: &mut Elector) -> Vec<Value> {
    std::iter::from_fn(|| machine.poll_output()).map(|o| json(&o)).collect()
}

fn json(output: &Output) -> Value {
    serde_json::to_value(output).expect("outputs are plain data")
}

/// Replays `trace` on a new machine; the first step whose outputs differ is the error.
pub fn replay(trace: &Trace) -> Result<(), Mismatch> {
    let mut machine = Elector::new(trace.setup.clone(), trace.seed, trace.start_mono_ms);
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
        let got = drain(&mut machine);
        if got != step.expect {
            return Err(Mismatch { step: i + 1, expected: step.expect.clone(), got });
        }
    }
    Ok(())
}

/// Records a call as a [`Trace`] while driving its machine.
#[derive(Debug)]
pub struct Recorder {
    machine: Elector,
    trace: Trace,
}

impl Recorder {
    pub fn new(name: &str, description: &str, setup: Setup, seed: u64, start_mono_ms: u64) -> Self {
        let mut machine = Elector::new(setup.clone(), seed, start_mono_ms);
        let start_expect = drain(&mut machine);
        let trace = Trace {
            name: name.into(),
            description: description.into(),
            setup,
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

    pub fn machine(&self) -> &Elector {
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
        self.trace.steps.push(Step { at, input: recorded, expect });
        self.last()
    }

    pub fn finish(self) -> Trace {
        self.trace
    }
}
