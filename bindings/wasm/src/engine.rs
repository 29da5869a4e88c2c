//! The worker engine for JavaScript (`leaselock::engine`): `lib/worker.js` is its driver.
//!
//! Commands come out as plain objects (`nextCommand`), answers and events go in as typed
//! values; nothing crosses as JSON text on the driver's path. The store operations the engine
//! asks for run here, on the protocol, stepped by `lib/drive.js` with the user's
//! `DynamoDBClient` (`operation`, then `finish` feeds the answer back): only the held copies of
//! per-item leases (`renew`, `release`) are the driver's, because the handler's checkpoints
//! take turns with them on the `Lease` it was given.
//!
//! The trace runner (`tests/worker_traces.test.mjs`) replays the trace vectors through the JSON
//! methods (`with_timing`, `handle`, `poll_command`, `snapshot`): the vectors are JSON.

use std::collections::HashMap;

use leaselock::engine::trace::Timing;
use leaselock::engine::{self, Answer, Command, Engine, Event, HandlerEnd, HintMessage, Now, OpId, Settings, Totals};
use leaselock::protocol::{
    Acquire, BatchDesiredStates, ClaimInSession, CreateSession, EndSession, Get, Input, Operation, OrphansPage,
    OwnedBy, Release, RenewSession, RetireSession, Sessions, Step, TakeOverListed,
};
use leaselock::worker::decide::CancelReason;
use leaselock::{Error, Lease, LeaseMode, TableConfig};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use wasm_bindgen::prelude::*;

use crate::lease::JsLease;
use crate::protocol::{answer_for_failure, send_json, Failure};
use crate::{logs, parse, text, throw, worker, Table};

fn now(wall_ms: f64, mono_ms: f64) -> Now {
    Now { wall_ms: wall_ms.max(0.0) as u64, mono_ms: mono_ms.max(0.0) as u64 }
}

/// Values out as JavaScript objects: `null` for `None`, objects (not `Map`s) for maps.
fn to_js(v: &impl Serialize) -> JsValue {
    v.serialize(&serde_wasm_bindgen::Serializer::json_compatible()).expect("plain data converts")
}

fn from_js<T: serde::de::DeserializeOwned>(what: &str, v: JsValue) -> Result<T, JsValue> {
    serde_wasm_bindgen::from_value(v).map_err(|e| throw(&Error::invalid(what, e)))
}

/// A command as the JavaScript driver takes it (see `Command`); leases in their JavaScript
/// shape, times in ms on the driver's clocks.
#[derive(Serialize)]
#[serde(tag = "command", rename_all = "camelCase", rename_all_fields = "camelCase")]
enum JsCommand {
    /// A store operation: `renew` and `release` name the held copy of `id` (the driver runs
    /// them on its `Lease`); every other kind runs through `operation(op)`. `until`: the
    /// deadline (monotonic ms) past which the request is given up (`renew`, `renewSession`).
    Run {
        op: OpId,
        kind: &'static str,
        id: Option<String>,
        until: Option<u64>,
    },
    StartHandler {
        lease: JsLease,
    },
    CancelHandler {
        id: String,
        reason: CancelReason,
    },
    AbortHandler {
        id: String,
    },
    SetDeadline {
        id: String,
        deadline: u64,
    },
    Forget {
        id: String,
    },
    ReceiveHints {
        max: usize,
        wait_ms: u64,
    },
    SettleHints {
        delete: Vec<String>,
        give_back: Vec<String>,
        defer: Vec<String>,
        defer_ms: u64,
    },
    SendHint {
        id: String,
        /// The message body ([`Command::hint_body`]).
        body: String,
    },
    EmitMetrics,
    Finished,
}

/// One hint message as the driver received it.
#[derive(Deserialize)]
struct JsHint {
    receipt: String,
    body: Option<String>,
}

/// A store operation running on the protocol; its end is kept as the engine's answer.
trait Running {
    /// The step as `lib/drive.js` reads it; `{"done":null}` once the answer is kept.
    fn step(&mut self, input: Input) -> String;
    fn take(&mut self) -> Option<Answer>;
}

struct Answering<O: Operation> {
    op: O,
    into: fn(O::Output) -> Answer,
    answer: Option<Answer>,
}

const DONE: &str = r#"{"done":null}"#;

impl<O: Operation> Running for Answering<O> {
    fn step(&mut self, input: Input) -> String {
        match self.op.next(input) {
            Step::Send { request, attempt_timeout_ms } => send_json(&request, attempt_timeout_ms),
            Step::Sleep { ms } => format!(r#"{{"sleep":{ms}}}"#),
            Step::Done(output) => {
                self.answer = Some((self.into)(output));
                DONE.into()
            }
            Step::Fail(e) => {
                self.answer = Some(Answer::Failed(e));
                DONE.into()
            }
        }
    }

    fn take(&mut self) -> Option<Answer> {
        self.answer.take()
    }
}

/// An operation that could not be built (bad input): answered at its first step.
struct Refused(Option<Error>);

impl Running for Refused {
    fn step(&mut self, _: Input) -> String {
        DONE.into()
    }

    fn take(&mut self) -> Option<Answer> {
        self.0.take().map(Answer::Failed)
    }
}

fn running<O: Operation + 'static>(op: leaselock::Result<O>, into: fn(O::Output) -> Answer) -> Box<dyn Running> {
    match op {
        Ok(op) => Box::new(Answering { op, into, answer: None }),
        Err(e) => Box::new(Refused(Some(e))),
    }
}

/// The protocol operation that runs `request` for worker `owner`, as the tokio driver runs it
/// against its store (`leaselock::worker`).
fn operation(request: engine::Op, config: &TableConfig, owner: &str) -> Box<dyn Running> {
    use engine::Op;
    match request {
        Op::Claim { id, session: None, .. } => running(Acquire::started(config, &id, owner), Answer::Lease),
        Op::Claim { id, session: Some(session), listed: None } => {
            running(ClaimInSession::new(config, &id, &session), Answer::Lease)
        }
        Op::Claim { session: Some(session), listed: Some(l), .. } => {
            running(ClaimInSession::takeover(config, &l.item, l.epoch, &session), Answer::Lease)
        }
        Op::TakeOver { owner: dead, epoch, session, listed } => {
            running(TakeOverListed::new(config, &dead, epoch, listed, &session), Answer::TakenOver)
        }
        Op::ReleaseLease { lease } => running(Ok(Release::new(config, &lease)), |()| Answer::Done),
        Op::Get { id } => running(Get::new(config, &id), Answer::Item),
        Op::OrphansPage { cutoff_ms, page_size, first_shard } => {
            let page = match first_shard {
                Some(first) => OrphansPage::starting_at(config, cutoff_ms, page_size, first),
                None => OrphansPage::new(config, cutoff_ms, page_size, None),
            };
            running(Ok(page), |p| Answer::Orphans { full: p.next.is_some(), items: p.items })
        }
        Op::Sessions => running(Ok(Sessions::new(config, u64::MAX)), Answer::Sessions),
        Op::OwnedBy { owner } => running(OwnedBy::new(config, &owner), Answer::Owned),
        Op::RetireSession { owner, epoch } => running(RetireSession::new(config, &owner, epoch), |_| Answer::Done),
        Op::CreateSession { previous } => running(CreateSession::new(config, owner, previous), Answer::Session),
        Op::RenewSession { session, load, .. } => {
            running(Ok(RenewSession::new(config, &session).reporting(load)), Answer::Session)
        }
        Op::EndSession { session, load } => {
            running(Ok(EndSession::new(config, &session).reporting(load)), |()| Answer::Done)
        }
        Op::DesiredStates { ids } => {
            running(BatchDesiredStates::new(config, &ids), |states| Answer::DesiredStates(states.into_iter().collect()))
        }
        // The held copies are the driver's (see the module docs).
        Op::Renew { id, .. } | Op::Release { id } => Box::new(Refused(Some(Error::Lost { id }))),
    }
}

fn input(now_ms: f64, mono_ms: f64, random: f64) -> Input {
    Input::new(now_ms as u64, mono_ms as u64, random)
}

/// One worker's engine (see `leaselock::engine`).
#[wasm_bindgen]
pub struct WorkerEngine {
    engine: Engine,
    /// Store operations asked for and not answered yet, by op id.
    requests: HashMap<OpId, engine::Op>,
    running: HashMap<OpId, Box<dyn Running>>,
    /// The totals of the previous metrics line.
    reported: Totals,
    namespace: String,
    /// The validated `new Worker(...)` settings (none for a trace's engine).
    settings: Option<worker::Settings>,
    logs: Vec<logs::Record>,
}

impl WorkerEngine {
    fn start(config: TableConfig, settings: Settings, seed: f64, at: Now) -> Self {
        WorkerEngine {
            engine: Engine::new(settings, config, seed as u64, at),
            requests: HashMap::new(),
            running: HashMap::new(),
            reported: Totals::default(),
            namespace: leaselock::metrics::NAMESPACE.to_string(),
            settings: None,
            logs: Vec::new(),
        }
    }

    /// Runs `f` on the engine, keeping what it logs for `takeLogs` (a worker's engine only).
    fn with_logs(&mut self, f: impl FnOnce(&mut Engine)) {
        if self.settings.is_none() {
            f(&mut self.engine);
            return;
        }
        let engine = &mut self.engine;
        let ((), logs) = logs::capture(|| f(engine));
        self.logs.extend(logs);
    }

    fn answer(&mut self, op: OpId, answer: Answer, at: Now) {
        self.requests.remove(&op);
        self.running.remove(&op);
        self.with_logs(|e| e.handle(Event::Answer { op, answer }, at));
    }
}

#[wasm_bindgen]
impl WorkerEngine {
    /// The engine of a `new Worker(...)` on `table`: `options_json` are its options (without
    /// `table`, `sqs`, `handler`, `logger`, `metrics`; `hints` says whether an SQS client was
    /// given), validated, each failure naming its option.
    #[wasm_bindgen(js_name = forWorker)]
    pub fn for_worker(
        table: &Table,
        options_json: &str,
        seed: f64,
        wall_ms: f64,
        mono_ms: f64,
    ) -> Result<WorkerEngine, JsValue> {
        logs::install();
        let s = worker::settings(options_json).map_err(|e| throw(&e))?;
        let settings = s.engine(table.config.skew_ms());
        let (engine, logs) =
            logs::capture(|| Engine::new(settings, table.config.clone(), seed as u64, now(wall_ms, mono_ms)));
        let engine = WorkerEngine {
            engine,
            requests: HashMap::new(),
            running: HashMap::new(),
            reported: Totals::default(),
            namespace: s.metrics_namespace.clone(),
            settings: Some(s),
            logs,
        };
        Ok(engine)
    }

    /// A trace's engine: `timing_json` (`{mode, lease_ms, renew_ms, skew_ms}`) and
    /// `settings_json` (the engine's settings) as a trace vector holds them.
    pub fn with_timing(
        timing_json: &str,
        settings_json: &str,
        seed: f64,
        wall_ms: f64,
        mono_ms: f64,
    ) -> Result<WorkerEngine, JsValue> {
        let timing: Timing = parse("timing", timing_json)?;
        let config = timing.config().map_err(|e| throw(&e))?;
        let settings: Settings = parse("settings", settings_json)?;
        Ok(WorkerEngine::start(config, settings, seed, now(wall_ms, mono_ms)))
    }

    /// The worker's settings with the defaults filled in (camelCase), as validated.
    #[wasm_bindgen(getter)]
    pub fn settings(&self) -> JsValue {
        self.settings.as_ref().map_or(JsValue::UNDEFINED, to_js)
    }

    /// A trace's event (JSON, the engine's own shape).
    pub fn handle(&mut self, event_json: &str, wall_ms: f64, mono_ms: f64) -> Result<(), JsValue> {
        let event: Event = parse("event", event_json)?;
        self.engine.handle(event, now(wall_ms, mono_ms));
        Ok(())
    }

    /// A trace's next command as JSON (the engine's own shape), or `undefined`.
    pub fn poll_command(&mut self) -> Option<String> {
        self.engine.poll_command().map(text)
    }

    /// A trace's snapshot as JSON (the engine's own shape).
    pub fn snapshot(&self) -> String {
        text(self.engine.snapshot())
    }

    /// Time has passed: whatever was due by now happens.
    #[wasm_bindgen(js_name = handleTimeout)]
    pub fn handle_timeout(&mut self, wall_ms: f64, mono_ms: f64) {
        self.with_logs(|e| e.handle_timeout(now(wall_ms, mono_ms)));
    }

    /// When `handleTimeout` is due next (monotonic ms), or `undefined`.
    #[wasm_bindgen(js_name = pollTimeout)]
    pub fn poll_timeout(&self) -> Option<f64> {
        self.engine.poll_timeout().map(|t| t as f64)
    }

    /// The next command as an object (`{ command: "run", op, kind, id, until }`, ...), or
    /// `undefined` when there is none.
    #[wasm_bindgen(js_name = nextCommand)]
    pub fn next_command(&mut self) -> JsValue {
        let Some(command) = self.engine.poll_command() else { return JsValue::UNDEFINED };
        let command = match command {
            Command::Run { op, request } => {
                let (kind, id, until) = match &request {
                    engine::Op::Renew { id, until_mono_ms } => ("renew", Some(id.clone()), Some(*until_mono_ms)),
                    engine::Op::Release { id } => ("release", Some(id.clone()), None),
                    engine::Op::RenewSession { until_mono_ms, .. } => ("renewSession", None, Some(*until_mono_ms)),
                    engine::Op::Claim { id, .. } => ("claim", Some(id.clone()), None),
                    other => (kind_of(other), None, None),
                };
                self.requests.insert(op, request);
                JsCommand::Run { op, kind, id, until }
            }
            Command::StartHandler { lease } => JsCommand::StartHandler { lease: lease.into() },
            Command::CancelHandler { id, reason } => JsCommand::CancelHandler { id, reason },
            Command::AbortHandler { id } => JsCommand::AbortHandler { id },
            Command::SetDeadline { id, deadline_mono_ms } => JsCommand::SetDeadline { id, deadline: deadline_mono_ms },
            Command::Forget { id } => JsCommand::Forget { id },
            Command::ReceiveHints { max, wait_ms } => JsCommand::ReceiveHints { max, wait_ms },
            Command::SettleHints { delete, give_back, defer, defer_ms } => {
                JsCommand::SettleHints { delete, give_back, defer, defer_ms }
            }
            Command::SendHint { id, ended } => {
                let body = Command::hint_body(&id, ended.as_ref());
                JsCommand::SendHint { id, body }
            }
            Command::EmitMetrics => JsCommand::EmitMetrics,
            Command::Finished => JsCommand::Finished,
        };
        to_js(&command)
    }

    /// Starts the store operation `op` (a `run` command's) on the protocol. Step it as
    /// `lib/drive.js` steps an operation, through `resume`, `answered` and `failed` with the
    /// same op id, until it is done; then `finish(op)` feeds the answer to the engine.
    pub fn operation(&mut self, op: f64) {
        let op = op as OpId;
        let Some(request) = self.requests.remove(&op) else { return };
        let owner = self.engine.settings().worker_id.clone();
        let running = operation(request, self.engine.config(), &owner);
        self.running.insert(op, running);
    }

    /// The first step of `op`, and the step after a `sleep`.
    pub fn resume(&mut self, op: f64, now_ms: f64, mono_ms: f64, random: f64) -> String {
        let op = op as OpId;
        match self.running.get_mut(&op) {
            Some(r) => r.step(input(now_ms, mono_ms, random)),
            None => DONE.into(),
        }
    }

    /// The step of `op` after its request succeeded with `output_json` (the SDK's output).
    pub fn answered(&mut self, op: f64, now_ms: f64, mono_ms: f64, random: f64, output_json: &str) -> String {
        let op = op as OpId;
        let answer = match serde_json::from_str(output_json) {
            Ok(output) => leaselock::protocol::Answer::Ok(output),
            Err(e) => leaselock::protocol::Answer::Ambiguous(format!("unreadable output: {e}")),
        };
        match self.running.get_mut(&op) {
            Some(r) => r.step(input(now_ms, mono_ms, random).with(answer)),
            None => DONE.into(),
        }
    }

    /// The step of `op` after its request failed; `failure_json` describes how (`lib/io.js`).
    pub fn failed(&mut self, op: f64, now_ms: f64, mono_ms: f64, random: f64, failure_json: &str) -> String {
        let op = op as OpId;
        let answer = match serde_json::from_str::<Failure>(failure_json) {
            Ok(f) => answer_for_failure(f),
            Err(e) => leaselock::protocol::Answer::Other(format!("unreadable failure: {e}")),
        };
        match self.running.get_mut(&op) {
            Some(r) => r.step(input(now_ms, mono_ms, random).with(answer)),
            None => DONE.into(),
        }
    }

    /// `op` has run to its end: its answer goes to the engine.
    pub fn finish(&mut self, op: f64, wall_ms: f64, mono_ms: f64) {
        let op = op as OpId;
        let answer = self.running.get_mut(&op).and_then(|r| r.take());
        let answer = answer.unwrap_or_else(|| Answer::Failed(Error::Store("the operation did not finish".into())));
        self.answer(op, answer, now(wall_ms, mono_ms));
    }

    /// `op` was given up at its deadline (rule 2): the lease (or the session) is lost.
    #[wasm_bindgen(js_name = pastDeadline)]
    pub fn past_deadline(&mut self, op: f64, id: String, wall_ms: f64, mono_ms: f64) {
        let op = op as OpId;
        self.answer(op, Answer::Failed(Error::Lost { id }), now(wall_ms, mono_ms));
    }

    /// The held copy's renewal answered with the lease as renewed (`lease`: `LeaseData`).
    #[wasm_bindgen(js_name = renewed)]
    pub fn renewed(&mut self, op: f64, lease: JsValue, wall_ms: f64, mono_ms: f64) -> Result<(), JsValue> {
        let op = op as OpId;
        let lease: JsLease = from_js("lease", lease)?;
        self.answer(op, Answer::Lease(Lease::from(lease)), now(wall_ms, mono_ms));
        Ok(())
    }

    /// The held copy's release is done.
    pub fn released(&mut self, op: f64, wall_ms: f64, mono_ms: f64) {
        let op = op as OpId;
        self.answer(op, Answer::Done, now(wall_ms, mono_ms));
    }

    /// The held copy's operation failed with `error_json` (a lease error, `lib/errors.js`).
    #[wasm_bindgen(js_name = failedWith)]
    pub fn failed_with(&mut self, op: f64, error_json: &str, wall_ms: f64, mono_ms: f64) -> Result<(), JsValue> {
        let op = op as OpId;
        let error = crate::error::from_json(&parse::<Value>("error", error_json)?);
        self.answer(op, Answer::Failed(error), now(wall_ms, mono_ms));
        Ok(())
    }

    /// A receive of the hint queue brought `messages` (`[{ receipt, body }]`).
    pub fn hints(&mut self, messages: JsValue, wall_ms: f64, mono_ms: f64) -> Result<(), JsValue> {
        let messages: Vec<JsHint> = from_js("messages", messages)?;
        let received = Ok(messages.into_iter().map(|m| HintMessage { receipt: m.receipt, body: m.body }).collect());
        self.with_logs(|e| e.handle(Event::Hints { received }, now(wall_ms, mono_ms)));
        Ok(())
    }

    /// A receive of the hint queue failed with `error`.
    #[wasm_bindgen(js_name = hintsFailed)]
    pub fn hints_failed(&mut self, error: String, wall_ms: f64, mono_ms: f64) {
        self.with_logs(|e| e.handle(Event::Hints { received: Err(error) }, now(wall_ms, mono_ms)));
    }

    /// The handler of `id` ended: `end` is `returned`, `failed` or `aborted`; `reason` the
    /// CancelReason its signal aborted with, if it did.
    #[wasm_bindgen(js_name = handlerEnded)]
    pub fn handler_ended(
        &mut self,
        id: String,
        end: &str,
        reason: Option<String>,
        wall_ms: f64,
        mono_ms: f64,
    ) -> Result<(), JsValue> {
        let end = match end {
            "returned" => HandlerEnd::Returned,
            "failed" => HandlerEnd::Failed,
            "aborted" => HandlerEnd::Aborted,
            other => return Err(throw(&Error::invalid("end", format!("{other:?} is not a handler's end")))),
        };
        let reason = worker::reason(reason.as_deref());
        self.with_logs(|e| e.handle(Event::HandlerEnded { id, end, reason }, now(wall_ms, mono_ms)));
        Ok(())
    }

    /// The store's clock as measured now (the table's `StoreClock`): claims wait until it is
    /// known within the worker's tolerance.
    #[wasm_bindgen(js_name = storeClock)]
    pub fn store_clock(&mut self, offset_ms: f64, uncertainty_ms: f64, wall_ms: f64, mono_ms: f64) {
        let event = Event::StoreClock { offset_ms: offset_ms as i64, uncertainty_ms: uncertainty_ms.max(0.0) as u64 };
        self.with_logs(|e| e.handle(event, now(wall_ms, mono_ms)));
    }

    /// Stop taking work, cancel every handler, release everything.
    pub fn shutdown(&mut self, wall_ms: f64, mono_ms: f64) {
        self.with_logs(|e| e.handle(Event::Shutdown, now(wall_ms, mono_ms)));
    }

    /// The EMF line of an `emitMetrics` command (what the Rust worker writes), at wall `now_ms`.
    #[wasm_bindgen(js_name = metricsLine)]
    pub fn metrics_line(&mut self, now_ms: f64) -> String {
        let metrics = self.engine.take_metrics();
        let before = std::mem::replace(&mut self.reported, metrics.totals);
        let session_mode = self.engine.config().mode == LeaseMode::Session;
        metrics.emf_line(&self.namespace, &self.engine.settings().worker_id, &before, session_mode, now_ms as u64)
    }

    /// Counters since start and the ids held now (sorted), as `Worker.snapshot()` gives them.
    pub fn view(&self) -> JsValue {
        let s = self.engine.snapshot();
        let mut v = json!({
            "workerId": s.worker_id,
            "maxConnections": s.max_connections,
            "held": s.held,
            "acquired": s.acquired,
            "acquireConflicts": s.acquire_conflicts,
            "acquireErrors": s.acquire_errors,
            "leasesLost": s.leases_lost,
            "released": s.released,
            "handedOver": s.handed_over,
            "handlerErrors": s.handler_errors,
            "orphanPolls": s.orphan_polls,
            "hintsReceived": s.hints_received,
        });
        if self.engine.config().mode == LeaseMode::Session {
            v["sessionEpoch"] = json!(s.session_epoch);
            v["sessionTakeovers"] = json!(s.session_takeovers);
            v["takeoverTransactions"] = json!(s.takeover_transactions);
            v["claimLimit"] = json!(s.claim_limit);
        }
        v["stopping"] = json!(s.stopping);
        v["clockOffsetMs"] = json!(s.clock_offset_ms);
        v["clockUncertaintyMs"] = json!(s.clock_uncertainty_ms);
        v["claimsPaused"] = json!(s.claims_paused);
        to_js(&v)
    }

    /// What the engine logged since the last call: `[{ level, message, fields }]`.
    #[wasm_bindgen(js_name = takeLogs)]
    pub fn take_logs(&mut self) -> JsValue {
        to_js(&std::mem::take(&mut self.logs))
    }
}

fn kind_of(request: &engine::Op) -> &'static str {
    use engine::Op;
    match request {
        Op::Claim { .. } => "claim",
        Op::Renew { .. } => "renew",
        Op::Release { .. } => "release",
        Op::ReleaseLease { .. } => "releaseLease",
        Op::Get { .. } => "get",
        Op::OrphansPage { .. } => "orphansPage",
        Op::Sessions => "sessions",
        Op::OwnedBy { .. } => "ownedBy",
        Op::RetireSession { .. } => "retireSession",
        Op::CreateSession { .. } => "createSession",
        Op::RenewSession { .. } => "renewSession",
        Op::EndSession { .. } => "endSession",
        Op::DesiredStates { .. } => "desiredStates",
        Op::TakeOver { .. } => "takeOver",
    }
}
