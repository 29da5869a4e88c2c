//! A fleet of engines on one [`MemoryStore`], driven on a [`ManualClock`]: deterministic, no
//! tokio, no threads. Each worker's commands run against the store at once and their answers
//! arrive after a latency; handlers return a moment after their token fires; hints go through
//! an in-memory queue. Used by the engine's tests and the fleet simulation in `make bench`.
//!
//! With [`Sim::account`] on it bills capacity units to partition values as DynamoDB does
//! ([`Partitions`]); with [`Behaviour::throttle`] too it throttles as DynamoDB does: 1,000 write
//! and 3,000 read units per second per partition value on the table and on each index, no burst
//! ([`partition_limit`]), a table write refused when an index it feeds cannot take its entry.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::future::Future;
use std::sync::Arc;

use super::{Answer, Command, Engine, Event, HandlerEnd, HintMessage, Now, Op, Settings};
use crate::engine::decide::CancelReason;
use crate::{orphan_shard_of, Clock, Error, Lease, LeaseStore, ManualClock, MemoryStore, TableConfig};

/// The simulated hint queue (SQS as the workers use it): visible messages, those received and not
/// settled (by receipt), and those made visible again later. The simulation and the fault
/// explorer share it.
#[derive(Debug, Default)]
pub(crate) struct HintQueue {
    visible: VecDeque<String>,
    in_flight: BTreeMap<String, String>,
    /// (visible at, body).
    deferred: Vec<(u64, String)>,
    receipts: u64,
}

impl HintQueue {
    pub(crate) fn push(&mut self, body: String) {
        self.visible.push_back(body);
    }

    pub(crate) fn any_visible(&self) -> bool {
        !self.visible.is_empty()
    }

    /// Messages not received: visible, or deferred.
    pub(crate) fn waiting(&self) -> usize {
        self.visible.len() + self.deferred.len()
    }

    /// Messages deferred until `now` or before become visible, after those visible already.
    pub(crate) fn surface(&mut self, now: u64) {
        let (due, later): (Vec<_>, Vec<_>) = self.deferred.drain(..).partition(|(at, _)| *at <= now);
        self.deferred = later;
        self.visible.extend(due.into_iter().map(|(_, body)| body));
    }

    /// Takes up to `max` visible messages at `now`, each under a new receipt.
    pub(crate) fn receive(&mut self, max: usize, now: u64) -> Vec<HintMessage> {
        self.surface(now);
        let mut received = Vec::new();
        while received.len() < max {
            let Some(body) = self.visible.pop_front() else { break };
            self.receipts += 1;
            let receipt = format!("r{}", self.receipts);
            self.in_flight.insert(receipt.clone(), body.clone());
            received.push(HintMessage { receipt, body: Some(body) });
        }
        received
    }

    /// Settles received messages: deleted, made visible again at `defer_until`, or given back
    /// at once (at the end of the queue).
    pub(crate) fn settle(&mut self, delete: Vec<String>, give_back: Vec<String>, defer: Vec<String>, defer_until: u64) {
        for r in defer {
            if let Some(body) = self.in_flight.remove(&r) {
                self.deferred.push((defer_until, body));
            }
        }
        for r in delete {
            self.in_flight.remove(&r);
        }
        for r in give_back {
            if let Some(body) = self.in_flight.remove(&r) {
                self.visible.push_back(body);
            }
        }
    }
}

/// Runs one engine request against the memory store with [`super::execute`]; a renewal or a
/// release acts on the driver's copy of the lease (`copies`, which a renewal brings up to date),
/// and a lease the driver no longer has answers `Lost`. The simulation and the fault explorer
/// share it.
pub(crate) fn execute_on(
    store: &MemoryStore,
    owner: &str,
    copies: &mut BTreeMap<String, Lease>,
    request: Op,
) -> Answer {
    match request {
        Op::Renew { id, .. } => match copies.get(&id).cloned() {
            Some(mut lease) => match block_on(store.renew(&mut lease)) {
                Ok(()) => {
                    copies.insert(id, lease.clone());
                    Answer::Lease(lease)
                }
                Err(e) => Answer::Failed(e),
            },
            None => Answer::Failed(Error::Lost { id }),
        },
        Op::Release { id } => match copies.get(&id) {
            Some(lease) => block_on(store.release(lease)).map_or_else(Answer::Failed, |()| Answer::Done),
            None => Answer::Failed(Error::Lost { id }),
        },
        request => block_on(super::execute(store, owner, request)),
    }
}

/// Runs a memory-store future to its end: the memory store never waits on anything.
pub fn block_on<T>(future: impl Future<Output = T>) -> T {
    let mut future = std::pin::pin!(future);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    for _ in 0..1_000 {
        if let std::task::Poll::Ready(v) = future.as_mut().poll(&mut cx) {
            return v;
        }
    }
    panic!("a memory-store future did not complete");
}

/// Capacity units per partition key value per second, as DynamoDB bills them (items here are
/// well under 1 KB: one write unit per item written, an index entry whose key changes is a
/// delete and a put, a transaction's writes count twice, a failed conditional write one unit;
/// reads 4 KB per unit, halved when eventually consistent). Each write lands on the table item's
/// own partition, and on the index partitions it moves through. Reads of work items by key (a
/// `GetItem` of a hinted item, the batched desired-state checks) are not billed: each reads one
/// item's own partition value, a unit or less, never near a limit.
#[derive(Debug, Default)]
pub struct Partitions {
    /// (place, partition value) → (second, units in it).
    current: HashMap<(&'static str, String), (u64, f64)>,
    /// place → (peak units in one second of one partition value, that value).
    pub peak: BTreeMap<&'static str, (f64, String)>,
    /// place → units in all.
    pub total: BTreeMap<&'static str, f64>,
    /// With [`Behaviour::throttle`]: requests answered throttled, by the place that refused them.
    pub throttled: BTreeMap<&'static str, u64>,
    /// Write and read units per second per partition value, if not DynamoDB's
    /// ([`partition_limit`]): a fleet scaled down is throttled at limits scaled down alike.
    pub limits: Option<(f64, f64)>,
}

/// What one partition value serves per second at `place` (DynamoDB's per-partition limits).
/// No burst: DynamoDB's burst capacity never lifts a partition past these, so a second's budget
/// is all a partition value has, and unused capacity is not carried over.
pub fn partition_limit(place: &str) -> f64 {
    limit_at(place, DYNAMODB_LIMITS)
}

/// DynamoDB's write and read units per second per partition value.
pub const DYNAMODB_LIMITS: (f64, f64) = (1_000.0, 3_000.0);

/// The write or the read limit of `limits`, whichever `place` takes.
fn limit_at(place: &str, (write, read): (f64, f64)) -> f64 {
    if place == ORPHAN_INDEX_READS || place == OWNER_INDEX_READS {
        read
    } else {
        write
    }
}

/// Where units land.
pub const TABLE: &str = "table (work items)";
pub const SESSION_ITEMS: &str = "table (session items)";
pub const ORPHAN_INDEX: &str = "orphan index";
pub const OWNER_INDEX: &str = "owner index";
/// Reads, by place.
pub const ORPHAN_INDEX_READS: &str = "orphan index (reads)";
pub const OWNER_INDEX_READS: &str = "owner index (reads)";

impl Partitions {
    pub fn add(&mut self, place: &'static str, partition: &str, units: f64, now_ms: u64) {
        let second = now_ms / 1_000;
        let slot = self.current.entry((place, partition.to_string())).or_insert((second, 0.0));
        if slot.0 != second {
            *slot = (second, 0.0);
        }
        slot.1 += units;
        let peak = self.peak.entry(place).or_insert((0.0, String::new()));
        if slot.1 > peak.0 {
            *peak = (slot.1, partition.to_string());
        }
        *self.total.entry(place).or_default() += units;
    }

    /// Units billed to `partition` at `place` in the second of `now_ms`.
    pub fn in_second(&self, place: &'static str, partition: &str, now_ms: u64) -> f64 {
        match self.current.get(&(place, partition.to_string())) {
            Some((second, units)) if *second == now_ms / 1_000 => *units,
            _ => 0.0,
        }
    }

    /// The first of `charges` its partition's budget for this second cannot take.
    fn refusal(&self, charges: &[(&'static str, String, f64)], now_ms: u64) -> Option<&'static str> {
        charges
            .iter()
            .find(|(place, partition, units)| self.in_second(place, partition, now_ms) + units > self.limit(place))
            .map(|(place, ..)| *place)
    }

    /// What one partition value serves per second at `place` here.
    pub fn limit(&self, place: &str) -> f64 {
        limit_at(place, self.limits.unwrap_or(DYNAMODB_LIMITS))
    }

    /// Forgets the peaks (a new phase of a run).
    pub fn reset_peaks(&mut self) {
        self.peak.clear();
    }
}

/// One command as a worker emitted it.
#[derive(Debug, Clone, PartialEq)]
pub struct Emitted {
    pub at_mono_ms: u64,
    pub worker: usize,
    pub command: Command,
}

/// A simulated worker.
#[derive(Debug)]
pub struct Node {
    pub engine: Engine,
    /// The driver's copies of the held leases.
    copies: BTreeMap<String, Lease>,
    /// Handlers running, and whether each ignores its cancellation.
    running: HashMap<String, bool>,
    pub alive: bool,
    pub finished: bool,
}

/// Faults and timing of the simulated store and handlers.
#[derive(Debug, Clone)]
pub struct Behaviour {
    /// How long every answer takes.
    pub latency_ms: u64,
    /// Claims land at once but their answers take this much longer.
    pub claim_answer_delay_ms: u64,
    /// How long a handler takes to return once cancelled.
    pub handler_stop_ms: u64,
    /// Handlers of these ids ignore their cancellation.
    pub stubborn: Vec<String>,
    /// Partitions throttle as DynamoDB's do (with [`Sim::account`] on): a request whose units
    /// would take any partition value it touches (the table's or an index's) past
    /// [`partition_limit`] in this second is answered `ProvisionedThroughputExceededException`
    /// and not applied; the driver retries it with the protocol's backoff until the operation's
    /// budget ends, then the engine gets the protocol's failure (`Throttled`, `Lost` for renewals).
    pub throttle: bool,
    /// The next this many releases of held work fail (`Throttled`, nothing applied), as a
    /// release whose retries a throttled partition outlasted does.
    pub failing_releases: u32,
}

impl Default for Behaviour {
    fn default() -> Self {
        Self {
            latency_ms: 5,
            claim_answer_delay_ms: 0,
            handler_stop_ms: 10,
            stubborn: Vec::new(),
            throttle: false,
            failing_releases: 0,
        }
    }
}

/// Something due at a time: an event for a worker, or a throttled request sent again.
#[derive(Debug)]
enum Due {
    Event(Event),
    Retry(Retry),
    Batch(Batch),
    /// A long poll of the hint queue that nothing answered ends.
    PollEnd(u64),
}

/// An [`Op::TakeOver`]: claims of work listed under one dead session, sent together as one
/// transaction ([`LeaseStore::take_over_listed`], one condition check of the dead session for
/// all of them), throttled and billed as one.
#[derive(Debug)]
struct Batch {
    op: u64,
    request: Op,
    attempt: u32,
    until_mono_ms: u64,
}

/// A throttled request the driver sends again.
#[derive(Debug)]
struct Retry {
    op: u64,
    request: Op,
    attempt: u32,
    /// The operation's budget ends here (monotonic).
    until_mono_ms: u64,
}

/// The fleet; see the module docs.
#[derive(Debug)]
pub struct Sim {
    pub clock: Arc<ManualClock>,
    pub store: Arc<MemoryStore>,
    pub nodes: Vec<Node>,
    pub behaviour: Behaviour,
    /// Events waiting to be delivered and requests to send again: (time, order) → (worker, what).
    queue: BTreeMap<(u64, u64), (usize, Due)>,
    order: u64,
    hints: HintQueue,
    /// Long polls of the hint queue waiting for a message (as SQS answers one as soon as a
    /// message arrives): token → (worker, most messages it takes).
    long_polls: BTreeMap<u64, (usize, usize)>,
    /// Long polls to be answered one latency after a message arrived.
    answering: std::collections::BTreeSet<u64>,
    /// How many live workers run a handler for each id.
    holders: HashMap<String, u32>,
    /// How many ids run on exactly one live worker (kept with `holders`).
    held_once: usize,
    /// Every command emitted, in order.
    pub log: Vec<Emitted>,
    pub keep_log: bool,
    /// Store operations run, by kind.
    pub ops: BTreeMap<&'static str, u64>,
    /// With `record_inputs`: every input each worker handled, in order (for trace vectors).
    pub inputs: Vec<(usize, Now, Option<Event>)>,
    pub record_inputs: bool,
    /// Capacity units per partition value, with [`Sim::account`] on.
    pub partitions: Partitions,
    pub account: bool,
    /// Requests answered throttled, by kind (with [`Behaviour::throttle`]).
    pub throttled: BTreeMap<&'static str, u64>,
    /// The backoff's jitter (deterministic).
    jitter: u64,
}

impl Sim {
    pub fn new(config: TableConfig, wall_start_ms: u64) -> Self {
        let clock = Arc::new(ManualClock::new(wall_start_ms));
        let store = Arc::new(MemoryStore::new(config, clock.clone()).expect("config"));
        Self {
            clock,
            store,
            nodes: Vec::new(),
            behaviour: Behaviour::default(),
            queue: BTreeMap::new(),
            order: 0,
            hints: HintQueue::default(),
            long_polls: BTreeMap::new(),
            answering: Default::default(),
            holders: HashMap::new(),
            held_once: 0,
            log: Vec::new(),
            keep_log: true,
            ops: BTreeMap::new(),
            inputs: Vec::new(),
            record_inputs: false,
            partitions: Partitions::default(),
            account: false,
            throttled: BTreeMap::new(),
            jitter: wall_start_ms | 1,
        }
    }

    pub fn now(&self) -> Now {
        Now { wall_ms: self.clock.now_ms(), mono_ms: self.clock.monotonic_ms() }
    }

    /// Adds a worker; returns its index.
    pub fn spawn(&mut self, settings: Settings, seed: u64) -> usize {
        let engine = Engine::new(settings, self.store.config().clone(), seed, self.now());
        self.nodes.push(Node {
            engine,
            copies: BTreeMap::new(),
            running: HashMap::new(),
            alive: true,
            finished: false,
        });
        let i = self.nodes.len() - 1;
        self.drain(i);
        i
    }

    /// The worker dies at once: nothing of it runs any more, nothing is released.
    pub fn crash(&mut self, worker: usize) {
        self.nodes[worker].alive = false;
        self.queue.retain(|_, (w, _)| *w != worker);
        self.long_polls.retain(|_, (w, _)| *w != worker);
        for id in std::mem::take(&mut self.nodes[worker].running).into_keys() {
            self.unhold(&id);
        }
    }

    pub fn shutdown(&mut self, worker: usize) {
        self.deliver(worker, Event::Shutdown);
    }

    /// The worker's driver measured the store's clock.
    pub fn measure_store_clock(&mut self, worker: usize, offset_ms: i64, uncertainty_ms: u64) {
        self.deliver(worker, Event::StoreClock { offset_ms, uncertainty_ms });
    }

    /// Puts a hint for `id` on the queue.
    pub fn send_hint(&mut self, id: &str) {
        self.hints_push(crate::Hint::new(id).to_json());
    }

    /// Puts a hint message with `body` on the queue.
    pub fn hints_push(&mut self, body: String) {
        self.hints.push(body);
        self.answer_long_polls();
    }

    /// Messages are visible: the oldest long poll waiting is answered one latency later with
    /// what is visible then (a burst of messages comes in one answer).
    fn answer_long_polls(&mut self) {
        if !self.hints.any_visible() {
            return;
        }
        let nodes = &self.nodes;
        self.long_polls.retain(|_, (w, _)| nodes[*w].alive && !nodes[*w].finished);
        let Some((&token, &(worker, _))) = self.long_polls.iter().find(|(t, _)| !self.answering.contains(*t)) else {
            return;
        };
        self.answering.insert(token);
        let at = self.clock.monotonic_ms() + self.behaviour.latency_ms;
        self.queue.insert((at, token), (worker, Due::PollEnd(token)));
    }

    /// Takes up to `max` visible messages (those deferred until now first become visible).
    fn receive(&mut self, max: usize) -> Vec<HintMessage> {
        let now = self.clock.monotonic_ms();
        self.hints.receive(max, now)
    }

    fn deliver(&mut self, worker: usize, event: Event) {
        let now = self.now();
        if self.nodes[worker].alive && !self.nodes[worker].finished {
            if self.record_inputs {
                self.inputs.push((worker, now, Some(super::trace::clone_event(&event))));
            }
            self.nodes[worker].engine.handle(event, now);
            self.drain(worker);
        }
    }

    fn later(&mut self, worker: usize, after_ms: u64, event: Event) {
        self.order += 1;
        self.queue.insert((self.clock.monotonic_ms() + after_ms, self.order), (worker, Due::Event(event)));
    }

    /// Runs until the monotonic clock reaches `until_mono_ms`.
    pub fn run_until(&mut self, until_mono_ms: u64) {
        loop {
            let now = self.clock.monotonic_ms();
            let next_event = self.queue.keys().next().map(|k| k.0);
            let next_timer =
                self.nodes.iter().filter(|n| n.alive && !n.finished).filter_map(|n| n.engine.poll_timeout()).min();
            let next = match (next_event, next_timer) {
                (Some(a), Some(b)) => a.min(b),
                (a, b) => a.or(b).unwrap_or(u64::MAX),
            }
            .max(now);
            if next > until_mono_ms {
                self.clock.advance(until_mono_ms.saturating_sub(now));
                return;
            }
            self.clock.advance(next - now);
            while let Some(entry) = self.queue.first_entry() {
                if entry.key().0 > next {
                    break;
                }
                match entry.remove() {
                    (worker, Due::Event(event)) => self.deliver(worker, event),
                    (worker, Due::Retry(retry)) => {
                        if self.nodes[worker].alive {
                            self.run_op(worker, retry);
                        }
                    }
                    (worker, Due::Batch(batch)) => {
                        if self.nodes[worker].alive {
                            self.run_batch(worker, batch);
                        }
                    }
                    (worker, Due::PollEnd(token)) => {
                        self.answering.remove(&token);
                        let open = self.nodes[worker].alive && !self.nodes[worker].finished;
                        if let Some((_, max)) = self.long_polls.remove(&token).filter(|_| open) {
                            let received = self.receive(max);
                            self.deliver(worker, Event::Hints { received: Ok(received) });
                        }
                        self.answer_long_polls();
                    }
                }
            }
            for i in 0..self.nodes.len() {
                let node = &self.nodes[i];
                if node.alive && !node.finished && node.engine.poll_timeout().is_some_and(|t| t <= next) {
                    let now = self.now();
                    if self.record_inputs {
                        self.inputs.push((i, now, None));
                    }
                    self.nodes[i].engine.handle_timeout(now);
                    self.drain(i);
                }
            }
        }
    }

    /// Runs until `done` holds (checked after every step) or `until_mono_ms`; returns whether it held.
    pub fn run_while(&mut self, until_mono_ms: u64, step_ms: u64, mut done: impl FnMut(&Sim) -> bool) -> bool {
        while self.clock.monotonic_ms() < until_mono_ms {
            if done(self) {
                return true;
            }
            let to = (self.clock.monotonic_ms() + step_ms).min(until_mono_ms);
            self.run_until(to);
        }
        done(self)
    }

    fn drain(&mut self, worker: usize) {
        while let Some(command) = self.nodes[worker].engine.poll_command() {
            if self.keep_log {
                self.log.push(Emitted { at_mono_ms: self.clock.monotonic_ms(), worker, command: command.clone() });
            }
            match command {
                Command::Run { op, request: request @ Op::TakeOver { .. } } => {
                    let until_mono_ms = self.budget_end(&request);
                    self.run_batch(worker, Batch { op, request, attempt: 0, until_mono_ms });
                }
                command => self.execute(worker, command),
            }
        }
    }

    /// Sends a takeover transaction, throttled as a whole (sent again after the protocol's
    /// backoff while the budget allows, else failed `Throttled`) and billed as its claims
    /// would be, with one condition check of the dead session for all of them.
    fn run_batch(&mut self, worker: usize, batch: Batch) {
        let b = self.behaviour.clone();
        let Op::TakeOver { epoch, session, listed, .. } = &batch.request else { return };
        let claims: Vec<Op> = listed
            .iter()
            .map(|item| Op::Claim {
                id: item.id.clone(),
                session: Some(session.clone()),
                listed: Some(super::Listed { epoch: *epoch, item: item.clone() }),
            })
            .collect();
        let owners: Vec<Option<String>> = listed.iter().map(|item| self.session_holder(&item.id)).collect();
        // One condition check of the dead session for the whole transaction.
        let charges = |sim: &Self, answers: Option<&[Answer]>| {
            let mut all: Vec<(&'static str, String, f64)> = Vec::new();
            for (i, request) in claims.iter().enumerate() {
                let answer = answers.map(|a| &a[i]);
                for c in sim.charges(worker, request, answer, owners[i].as_deref()) {
                    let repeat = c.0 == SESSION_ITEMS && all.iter().any(|a| a.0 == SESSION_ITEMS && a.1 == c.1);
                    if !repeat {
                        all.push(c);
                    }
                }
            }
            all
        };
        let now = self.clock.now_ms();
        if self.account && b.throttle {
            let mut merged: BTreeMap<(&'static str, String), f64> = BTreeMap::new();
            for (place, partition, units) in charges(self, None) {
                *merged.entry((place, partition)).or_default() += units;
            }
            let merged: Vec<_> =
                merged.into_iter().map(|((place, partition), units)| (place, partition, units)).collect();
            if let Some(place) = self.partitions.refusal(&merged, now) {
                *self.partitions.throttled.entry(place).or_default() += 1;
                *self.throttled.entry("take_over").or_default() += 1;
                let pause = self.backoff(batch.attempt);
                let mono = self.clock.monotonic_ms();
                if crate::lease::retry_fits(mono + b.latency_ms, pause, batch.until_mono_ms) {
                    self.order += 1;
                    let next = Batch { attempt: batch.attempt + 1, ..batch };
                    self.queue.insert((mono + b.latency_ms + pause, self.order), (worker, Due::Batch(next)));
                } else {
                    let answer = Answer::Failed(Error::Throttled);
                    self.later(worker, b.latency_ms, Event::Answer { op: batch.op, answer });
                }
                return;
            }
        }
        let answer = self.answer(worker, batch.request.clone());
        if self.account {
            let each: Vec<Answer> = match &answer {
                Answer::TakenOver(taken) => taken
                    .iter()
                    .map(|t| match t {
                        Some(lease) => Answer::Lease(lease.clone()),
                        None => Answer::Failed(Error::Store("left by the takeover".into())),
                    })
                    .collect(),
                _ => claims.iter().map(|_| Answer::Failed(Error::Store("takeover failed".into()))).collect(),
            };
            for (place, partition, units) in charges(self, Some(&each)) {
                self.partitions.add(place, &partition, units, now);
            }
        }
        self.later(worker, b.latency_ms + b.claim_answer_delay_ms, Event::Answer { op: batch.op, answer });
    }

    /// With accounting on: the owner `id` is held by under a session (its item carries the held
    /// sentinel), whose session item a takeover's condition reads.
    fn session_holder(&self, id: &str) -> Option<String> {
        if !self.account {
            return None;
        }
        let item = block_on(self.store.get(id)).ok().flatten()?;
        item.owner.filter(|_| item.expires_at_ms == Some(crate::lease::HELD_UNDER_SESSION_MS))
    }

    /// The protocol's backoff before attempt `attempt + 1`, with the simulation's jitter.
    fn backoff(&mut self, attempt: u32) -> u64 {
        self.jitter = self.jitter.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        let unit = (self.jitter >> 11) as f64 / (1u64 << 53) as f64;
        crate::lease::backoff_ms(attempt, 25, 1_000, unit)
    }

    fn execute(&mut self, worker: usize, command: Command) {
        let b = self.behaviour.clone();
        match command {
            Command::Run { op, request } => {
                let until_mono_ms = self.budget_end(&request);
                self.run_op(worker, Retry { op, request, attempt: 0, until_mono_ms });
            }
            Command::StartHandler { lease } => {
                let stubborn = b.stubborn.contains(&lease.id);
                let node = &mut self.nodes[worker];
                if node.running.insert(lease.id.clone(), stubborn).is_none() {
                    let n = self.holders.entry(lease.id.clone()).or_default();
                    *n += 1;
                    match *n {
                        1 => self.held_once += 1,
                        2 => self.held_once -= 1,
                        _ => {}
                    }
                }
                node.copies.insert(lease.id.clone(), lease);
            }
            Command::CancelHandler { id, reason } => {
                if self.nodes[worker].running.get(&id) == Some(&false) {
                    let end = Event::HandlerEnded { id, end: HandlerEnd::Returned, reason: Some(reason) };
                    self.later(worker, b.handler_stop_ms, end);
                }
            }
            Command::AbortHandler { id } => {
                if self.nodes[worker].running.remove(&id).is_some() {
                    self.unhold(&id);
                    self.later(worker, 0, Event::HandlerEnded { id, end: HandlerEnd::Aborted, reason: None });
                }
            }
            Command::SetDeadline { id, deadline_mono_ms } => {
                if let Some(copy) = self.nodes[worker].copies.get_mut(&id) {
                    copy.deadline_mono_ms = copy.deadline_mono_ms.max(deadline_mono_ms);
                }
            }
            Command::Forget { id } => {
                let node = &mut self.nodes[worker];
                node.copies.remove(&id);
                if node.running.remove(&id).is_some() {
                    self.unhold(&id);
                }
            }
            Command::ReceiveHints { max, wait_ms } => {
                let received = self.receive(max);
                if received.is_empty() {
                    // A long poll: answered when a message arrives, or empty after the wait.
                    self.order += 1;
                    let token = self.order;
                    self.long_polls.insert(token, (worker, max));
                    self.queue.insert((self.clock.monotonic_ms() + wait_ms, token), (worker, Due::PollEnd(token)));
                } else {
                    self.later(worker, b.latency_ms, Event::Hints { received: Ok(received) });
                }
            }
            Command::SettleHints { delete, give_back, defer, defer_ms } => {
                self.hints.settle(delete, give_back, defer, self.clock.monotonic_ms() + defer_ms);
                self.answer_long_polls();
            }
            Command::SendHint { id, ended } => self.hints_push(Command::hint_body(&id, ended.as_ref())),
            Command::EmitMetrics => {
                self.nodes[worker].engine.take_metrics();
            }
            Command::Finished => self.nodes[worker].finished = true,
        }
    }

    /// Where the driver's budget for `request` ends: a renewal's deadline, a lease operation's
    /// renew interval, `operation_budget` for the rest (as the protocol's `Budget`s do).
    fn budget_end(&self, request: &Op) -> u64 {
        let now = self.clock.monotonic_ms();
        let config = self.store.config();
        match request {
            Op::Renew { until_mono_ms, .. } | Op::RenewSession { until_mono_ms, .. } => *until_mono_ms,
            Op::Claim { .. }
            | Op::TakeOver { .. }
            | Op::Release { .. }
            | Op::ReleaseLease { .. }
            | Op::CreateSession { .. }
            | Op::EndSession { .. } => now + config.renew_ms(),
            _ => now + config.operation_budget.as_millis() as u64,
        }
    }

    /// Sends `retry.request` to the store: answered at once, or, throttled, sent again after the
    /// protocol's backoff while the budget allows, else failed as the protocol fails it.
    fn run_op(&mut self, worker: usize, retry: Retry) {
        let b = self.behaviour.clone();
        let Retry { op, request, attempt, until_mono_ms } = retry;
        let delay = if matches!(request, Op::Claim { .. }) { b.claim_answer_delay_ms } else { 0 };
        // A session claim of work held under another session is a takeover: a transaction whose
        // condition reads the session item of the work's owner (unowned work: one UpdateItem).
        let owner_before = match &request {
            Op::Claim { id, session: Some(_), .. } => self.session_holder(id),
            _ => None,
        };
        let now = self.clock.now_ms();
        let throttle = self.account && b.throttle;
        // Reads change nothing: answered first, their units are known before they are admitted.
        let read = matches!(request, Op::OrphansPage { .. } | Op::Sessions | Op::OwnedBy { .. });
        let early = (throttle && read).then(|| self.answer(worker, request.clone()));
        if throttle {
            let charges = self.charges(worker, &request, early.as_ref(), owner_before.as_deref());
            if let Some(place) = self.partitions.refusal(&charges, now) {
                *self.partitions.throttled.entry(place).or_default() += 1;
                *self.throttled.entry(op_kind(&request)).or_default() += 1;
                let pause = self.backoff(attempt);
                let mono = self.clock.monotonic_ms();
                if crate::lease::retry_fits(mono + b.latency_ms, pause, until_mono_ms) {
                    self.order += 1;
                    let next = Retry { op, request, attempt: attempt + 1, until_mono_ms };
                    self.queue.insert((mono + b.latency_ms + pause, self.order), (worker, Due::Retry(next)));
                } else {
                    let error = match &request {
                        Op::Renew { id, .. } => Error::Lost { id: id.clone() },
                        Op::RenewSession { session, .. } => {
                            Error::Lost { id: self.store.config().session_id(&session.owner) }
                        }
                        _ => Error::Throttled,
                    };
                    self.later(worker, b.latency_ms, Event::Answer { op, answer: Answer::Failed(error) });
                }
                return;
            }
        }
        let billed = self.account.then(|| (request.clone(), owner_before));
        let answer = match early {
            Some(answer) => answer,
            None => self.answer(worker, request),
        };
        if let Some((request, owner_before)) = billed {
            self.bill(worker, &request, &answer, owner_before.as_deref());
        }
        self.later(worker, b.latency_ms + delay, Event::Answer { op, answer });
    }

    /// Bills `request` (answered with `answer`) to the partitions it touches.
    fn bill(&mut self, worker: usize, request: &Op, answer: &Answer, owner_before: Option<&str>) {
        let now = self.clock.now_ms();
        for (place, partition, units) in self.charges(worker, request, Some(answer), owner_before) {
            self.partitions.add(place, &partition, units, now);
        }
    }

    /// The units `request` costs at each partition value it touches, answered with `answer`
    /// (none yet: as if its writes succeed).
    fn charges(
        &self,
        worker: usize,
        request: &Op,
        answer: Option<&Answer>,
        owner_before: Option<&str>,
    ) -> Vec<(&'static str, String, f64)> {
        let config = self.store.config();
        let sessions = config.session_partition.clone();
        let started = |id: &str| config.started_value(id);
        let shards = config.orphan_shards.max(1);
        let partitions = config.started_partitions();
        let me = self.nodes[worker].engine.settings().worker_id.clone();
        let mut p = Charges(Vec::new());
        let p = &mut p;
        let ok = !matches!(answer, Some(Answer::Failed(_)));
        let read_units = |items: usize| (items as f64 * 300.0 / 4096.0).ceil().max(1.0) / 2.0;
        // The owner index projects keys only: an entry is its owner and the item's key (about
        // 100 bytes with the names); the items themselves are read from the table after it.
        let key_read_units = |items: usize| (items as f64 * 100.0 / 4096.0).ceil().max(1.0) / 2.0;
        match request {
            Op::Claim { id, session, listed } => {
                // A transaction's writes count twice; a takeover not sent as listed is first
                // refused as an UpdateItem (one unit).
                let previous = owner_before.or_else(|| listed.as_ref().and_then(|l| l.item.owner.as_deref()));
                let takeover = session.is_some() && previous.is_some();
                let tx = if takeover { 2.0 } else { 1.0 };
                if takeover && listed.is_none() {
                    p.add(TABLE, id, 1.0);
                }
                p.add(TABLE, id, tx);
                if !ok {
                    return std::mem::take(&mut p.0);
                }
                // The expiry (the index's sort key) moves: a delete and a put. A takeover keeps
                // the held sentinel: the entry is rewritten in place (owner, fence), one write.
                p.add(ORPHAN_INDEX, &started(id), if takeover { tx } else { 2.0 * tx });
                p.add(OWNER_INDEX, &me, tx);
                if let Some(previous) = previous.filter(|_| takeover) {
                    // The condition check reads the previous owner's session item (a
                    // transaction's read: 2 units).
                    p.add(SESSION_ITEMS, previous, tx);
                }
            }
            Op::Renew { id, .. } => {
                p.add(TABLE, id, 1.0);
                if ok {
                    p.add(ORPHAN_INDEX, &started(id), 2.0);
                }
            }
            Op::Release { id } => {
                p.add(TABLE, id, 1.0);
                if ok {
                    p.add(ORPHAN_INDEX, &started(id), 2.0);
                }
            }
            Op::ReleaseLease { lease } => {
                p.add(TABLE, &lease.id, 1.0);
                if ok {
                    p.add(ORPHAN_INDEX, &started(&lease.id), 2.0);
                }
            }
            Op::CreateSession { .. } | Op::RenewSession { .. } | Op::EndSession { .. } => {
                p.add(SESSION_ITEMS, &me, 1.0);
                if ok {
                    p.add(ORPHAN_INDEX, &sessions, 2.0);
                }
            }
            Op::RetireSession { owner, .. } => {
                p.add(SESSION_ITEMS, owner, 1.0);
                if ok {
                    p.add(ORPHAN_INDEX, &sessions, 1.0);
                }
            }
            Op::OrphansPage { cutoff_ms, first_shard, .. } => {
                // One Query per shard read: shard after shard (from the one the cutoff picks)
                // until the page is full (then up to the shard of its last item), every shard
                // when it is not.
                let (items, full) = match answer {
                    Some(Answer::Orphans { items, full }) => (&items[..], *full),
                    _ => (&[][..], false),
                };
                let mut found = vec![0usize; shards as usize];
                for item in items {
                    found[orphan_shard_of(&item.id, shards) as usize] += 1;
                }
                let first = first_shard.map_or_else(|| config.first_orphan_shard(*cutoff_ms), |f| f % shards);
                let read = match items.last() {
                    Some(last) if full => (orphan_shard_of(&last.id, shards) + shards - first) % shards + 1,
                    _ => shards,
                };
                for k in (0..read).map(|i| ((first + i) % shards) as usize) {
                    p.add(ORPHAN_INDEX_READS, &partitions[k], read_units(found[k]));
                }
            }
            Op::Sessions => {
                let n = match answer {
                    Some(Answer::Sessions(items)) => items.len(),
                    _ => 0,
                };
                p.add(ORPHAN_INDEX_READS, &sessions, read_units(n));
            }
            Op::OwnedBy { owner } => {
                let n = match answer {
                    Some(Answer::Owned(items)) => items.len(),
                    _ => 0,
                };
                p.add(OWNER_INDEX_READS, owner, key_read_units(n));
            }
            // Billed as its claims (see `run_batch`).
            Op::Get { .. } | Op::DesiredStates { .. } | Op::TakeOver { .. } => {}
        }
        std::mem::take(&mut p.0)
    }

    fn answer(&mut self, worker: usize, request: Op) -> Answer {
        *self.ops.entry(op_kind(&request)).or_default() += 1;
        if matches!(request, Op::Release { .. }) && self.behaviour.failing_releases > 0 {
            self.behaviour.failing_releases -= 1;
            return Answer::Failed(Error::Throttled);
        }
        let owner = self.nodes[worker].engine.settings().worker_id.clone();
        execute_on(&self.store, &owner, &mut self.nodes[worker].copies, request)
    }

    /// Ids whose item names `worker` as its owner now (per-item: unexpired; session: held
    /// under a session).
    pub fn holder_of(&self, id: &str) -> Option<String> {
        let item = block_on(self.store.get(id)).ok().flatten()?;
        let now = self.clock.now_ms();
        item.holder_at(now).map(str::to_string)
    }

    /// The live workers whose handler for `id` runs now.
    pub fn running_on(&self, id: &str) -> Vec<usize> {
        (0..self.nodes.len()).filter(|&i| self.nodes[i].alive && self.nodes[i].running.contains_key(id)).collect()
    }

    /// Hint messages waiting on the queue (visible).
    pub fn hints_waiting(&self) -> usize {
        self.hints.waiting()
    }

    /// Whether every one of `ids` (distinct) runs on exactly one live worker.
    pub fn all_held_once(&self, ids: &[String]) -> bool {
        // Fewer ids held once than asked for: no need to look at each (a large fleet asks
        // this every step while it is still settling).
        ids.len() <= self.held_once && ids.iter().all(|id| self.runs_once(id))
    }

    /// How many ids run on exactly one live worker now.
    pub fn held_once_count(&self) -> usize {
        self.held_once
    }

    /// Whether `id` runs on exactly one live worker.
    pub fn runs_once(&self, id: &str) -> bool {
        self.holders.get(id) == Some(&1)
    }

    /// The ids that run on `worker` and on no other live worker, sorted.
    pub fn held_only_by(&self, worker: usize) -> Vec<String> {
        let node = &self.nodes[worker];
        let mut ids: Vec<String> = node.running.keys().filter(|id| node.alive && self.runs_once(id)).cloned().collect();
        ids.sort();
        ids
    }

    fn unhold(&mut self, id: &str) {
        if let Some(n) = self.holders.get_mut(id) {
            *n -= 1;
            match *n {
                0 => {
                    self.held_once -= 1;
                    self.holders.remove(id);
                }
                1 => self.held_once += 1,
                _ => {}
            }
        }
    }

    /// How many handlers run on `worker` now.
    pub fn running(&self, worker: usize) -> usize {
        self.nodes[worker].running.len()
    }

    /// The cancellations of handlers with `reason` so far, as (time, worker, id).
    pub fn cancels(&self, reason: CancelReason) -> Vec<(u64, usize, String)> {
        self.log
            .iter()
            .filter_map(|e| match &e.command {
                Command::CancelHandler { id, reason: r } if *r == reason => Some((e.at_mono_ms, e.worker, id.clone())),
                _ => None,
            })
            .collect()
    }
}

/// The kind of `request`, as [`Sim::ops`] counts it.
fn op_kind(request: &Op) -> &'static str {
    match request {
        Op::Claim { .. } => "claim",
        Op::Renew { .. } => "renew",
        Op::Release { .. } | Op::ReleaseLease { .. } => "release",
        Op::Get { .. } => "get",
        Op::OrphansPage { .. } => "orphans",
        Op::Sessions => "sessions",
        Op::OwnedBy { .. } => "owned_by",
        Op::RetireSession { .. } => "retire_session",
        Op::CreateSession { .. } => "create_session",
        Op::RenewSession { .. } => "renew_session",
        Op::EndSession { .. } => "end_session",
        Op::DesiredStates { .. } => "desired_states",
        Op::TakeOver { .. } => "take_over",
    }
}

/// Units to bill, in order.
struct Charges(Vec<(&'static str, String, f64)>);

impl Charges {
    fn add(&mut self, place: &'static str, partition: &str, units: f64) {
        self.0.push((place, partition.to_string(), units));
    }
}
