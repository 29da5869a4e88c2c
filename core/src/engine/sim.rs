//! A fleet of engines on one [`MemoryStore`], driven on a [`ManualClock`]: deterministic, no
//! tokio, no threads. Each worker's commands run against the store at once and their answers
//! arrive after a latency; handlers return a moment after their token fires; hints go through
//! an in-memory queue. Used by the engine's tests and the fleet simulation in `make bench`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::future::Future;
use std::sync::Arc;

use super::{Answer, Command, Engine, Event, HandlerEnd, HintMessage, Now, Op, Settings};
use crate::engine::decide::CancelReason;
use crate::{orphan_shard_of, Clock, Error, Lease, LeaseStore, ManualClock, MemoryStore, TableConfig};

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
/// own partition, and on the index partitions it moves through.
#[derive(Debug, Default)]
pub struct Partitions {
    /// (place, partition value) → (second, units in it).
    current: HashMap<(&'static str, String), (u64, f64)>,
    /// place → (peak units in one second of one partition value, that value).
    pub peak: BTreeMap<&'static str, (f64, String)>,
    /// place → units in all.
    pub total: BTreeMap<&'static str, f64>,
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
    copies: HashMap<String, Lease>,
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
}

impl Default for Behaviour {
    fn default() -> Self {
        Self { latency_ms: 5, claim_answer_delay_ms: 0, handler_stop_ms: 10, stubborn: Vec::new() }
    }
}

/// The fleet; see the module docs.
#[derive(Debug)]
pub struct Sim {
    pub clock: Arc<ManualClock>,
    pub store: Arc<MemoryStore>,
    pub nodes: Vec<Node>,
    pub behaviour: Behaviour,
    /// Events waiting to be delivered: (time, order) → (worker, event).
    queue: BTreeMap<(u64, u64), (usize, Event)>,
    order: u64,
    /// The hint queue: visible messages, and those received and not settled, by receipt.
    hints: VecDeque<String>,
    hints_in_flight: HashMap<String, String>,
    /// Hints made visible again later: (visible at, body).
    hints_deferred: Vec<(u64, String)>,
    receipts: u64,
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
            hints: VecDeque::new(),
            hints_in_flight: HashMap::new(),
            hints_deferred: Vec::new(),
            receipts: 0,
            holders: HashMap::new(),
            held_once: 0,
            log: Vec::new(),
            keep_log: true,
            ops: BTreeMap::new(),
            inputs: Vec::new(),
            record_inputs: false,
            partitions: Partitions::default(),
            account: false,
        }
    }

    pub fn now(&self) -> Now {
        Now { wall_ms: self.clock.now_ms(), mono_ms: self.clock.monotonic_ms() }
    }

    /// Adds a worker; returns its index.
    pub fn spawn(&mut self, settings: Settings, seed: u64) -> usize {
        let engine = Engine::new(settings, self.store.config().clone(), seed, self.now());
        self.nodes.push(Node { engine, copies: HashMap::new(), running: HashMap::new(), alive: true, finished: false });
        let i = self.nodes.len() - 1;
        self.drain(i);
        i
    }

    /// The worker dies at once: nothing of it runs any more, nothing is released.
    pub fn crash(&mut self, worker: usize) {
        self.nodes[worker].alive = false;
        self.queue.retain(|_, (w, _)| *w != worker);
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
        self.hints.push_back(body);
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
        self.queue.insert((self.clock.monotonic_ms() + after_ms, self.order), (worker, event));
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
                let (worker, event) = entry.remove();
                self.deliver(worker, event);
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
            self.execute(worker, command);
        }
    }

    fn execute(&mut self, worker: usize, command: Command) {
        let b = self.behaviour.clone();
        match command {
            Command::Run { op, request } => {
                let delay = if matches!(request, Op::Claim { .. }) { b.claim_answer_delay_ms } else { 0 };
                // A session claim's condition reads the session item of the work's owner.
                let owner_before = match (&request, self.account) {
                    (Op::Claim { id, session: Some(_), .. }, true) => {
                        block_on(self.store.get(id)).ok().flatten().and_then(|i| i.owner)
                    }
                    _ => None,
                };
                let billed = self.account.then(|| (request.clone(), owner_before));
                let answer = self.answer(worker, request);
                if let Some((request, owner_before)) = billed {
                    self.bill(worker, &request, &answer, owner_before.as_deref());
                }
                self.later(worker, b.latency_ms + delay, Event::Answer { op, answer });
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
                let now = self.clock.monotonic_ms();
                let (due, later): (Vec<_>, Vec<_>) = self.hints_deferred.drain(..).partition(|(at, _)| *at <= now);
                self.hints_deferred = later;
                self.hints.extend(due.into_iter().map(|(_, body)| body));
                let mut received = Vec::new();
                while received.len() < max {
                    let Some(body) = self.hints.pop_front() else { break };
                    self.receipts += 1;
                    let receipt = format!("r{}", self.receipts);
                    self.hints_in_flight.insert(receipt.clone(), body.clone());
                    received.push(HintMessage { receipt, body: Some(body) });
                }
                let after = if received.is_empty() { wait_ms } else { b.latency_ms };
                self.later(worker, after, Event::Hints { received: Ok(received) });
            }
            Command::SettleHints { delete, give_back, defer, defer_ms } => {
                let at = self.clock.monotonic_ms() + defer_ms;
                for r in defer {
                    if let Some(body) = self.hints_in_flight.remove(&r) {
                        self.hints_deferred.push((at, body));
                    }
                }
                for r in delete {
                    self.hints_in_flight.remove(&r);
                }
                for r in give_back {
                    if let Some(body) = self.hints_in_flight.remove(&r) {
                        self.hints.push_back(body);
                    }
                }
            }
            Command::SendHint { id } => self.send_hint(&id),
            Command::EmitMetrics => {
                self.nodes[worker].engine.take_metrics();
            }
            Command::Finished => self.nodes[worker].finished = true,
        }
    }

    /// Bills `request` (answered with `answer`) to the partitions it touches.
    fn bill(&mut self, worker: usize, request: &Op, answer: &Answer, owner_before: Option<&str>) {
        let now = self.clock.now_ms();
        let config = self.store.config();
        let sessions = config.session_partition.clone();
        let started = |id: &str| config.started_value(id);
        let shards = config.orphan_shards.max(1);
        let partitions = config.started_partitions();
        let me = self.nodes[worker].engine.settings().worker_id.clone();
        let p = &mut self.partitions;
        let ok = !matches!(answer, Answer::Failed(_));
        let read_units = |items: usize| (items as f64 * 300.0 / 4096.0).ceil().max(1.0) / 2.0;
        match request {
            Op::Claim { id, session, .. } => {
                let tx = if session.is_some() { 2.0 } else { 1.0 };
                if !ok {
                    p.add(TABLE, id, tx, now);
                    return;
                }
                p.add(TABLE, id, tx, now);
                // The expiry (the index's sort key) moves: a delete and a put.
                p.add(ORPHAN_INDEX, &started(id), 2.0 * tx, now);
                p.add(OWNER_INDEX, &me, tx, now);
                if let Some(previous) = owner_before.filter(|_| session.is_some()) {
                    // The condition check reads the previous owner's session item (a
                    // transaction's read: 2 units).
                    p.add(SESSION_ITEMS, previous, tx, now);
                }
            }
            Op::Renew { id, .. } => {
                p.add(TABLE, id, 1.0, now);
                if ok {
                    p.add(ORPHAN_INDEX, &started(id), 2.0, now);
                }
            }
            Op::Release { id } => {
                p.add(TABLE, id, 1.0, now);
                if ok {
                    p.add(ORPHAN_INDEX, &started(id), 2.0, now);
                }
            }
            Op::ReleaseLease { lease } => {
                p.add(TABLE, &lease.id, 1.0, now);
                if ok {
                    p.add(ORPHAN_INDEX, &started(&lease.id), 2.0, now);
                }
            }
            Op::CreateSession { .. } | Op::RenewSession { .. } | Op::EndSession { .. } => {
                p.add(SESSION_ITEMS, &me, 1.0, now);
                if ok {
                    p.add(ORPHAN_INDEX, &sessions, 2.0, now);
                }
            }
            Op::RetireSession { owner, .. } => {
                p.add(SESSION_ITEMS, owner, 1.0, now);
                if ok {
                    p.add(ORPHAN_INDEX, &sessions, 1.0, now);
                }
            }
            Op::OrphansPage { cutoff_ms, .. } => {
                // One Query per shard read: shard after shard (from the one the cutoff picks)
                // until the page is full (then up to the shard of its last item), every shard
                // when it is not.
                let (items, full) = match answer {
                    Answer::Orphans { items, full } => (&items[..], *full),
                    _ => (&[][..], false),
                };
                let mut found = vec![0usize; shards as usize];
                for item in items {
                    found[orphan_shard_of(&item.id, shards) as usize] += 1;
                }
                let first = config.first_orphan_shard(*cutoff_ms);
                let read = match items.last() {
                    Some(last) if full => (orphan_shard_of(&last.id, shards) + shards - first) % shards + 1,
                    _ => shards,
                };
                for k in (0..read).map(|i| ((first + i) % shards) as usize) {
                    p.add(ORPHAN_INDEX_READS, &partitions[k], read_units(found[k]), now);
                }
            }
            Op::Sessions => {
                let n = match answer {
                    Answer::Sessions(items) => items.len(),
                    _ => 0,
                };
                p.add(ORPHAN_INDEX_READS, &sessions, read_units(n), now);
            }
            Op::OwnedBy { owner } => {
                let n = match answer {
                    Answer::Owned(items) => items.len(),
                    _ => 0,
                };
                p.add(OWNER_INDEX_READS, owner, read_units(n), now);
            }
            Op::Get { .. } | Op::DesiredStates { .. } => {}
        }
    }

    fn answer(&mut self, worker: usize, request: Op) -> Answer {
        let store = self.store.clone();
        let owner = self.nodes[worker].engine.settings().worker_id.clone();
        let kind = match &request {
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
        };
        *self.ops.entry(kind).or_default() += 1;
        let failed = Answer::Failed;
        let node = &mut self.nodes[worker];
        match request {
            Op::Claim { id, session: None, .. } => {
                block_on(store.acquire_started(&id, &owner)).map_or_else(failed, Answer::Lease)
            }
            Op::Claim { session: Some(s), listed: Some(l), .. } => {
                block_on(store.claim_listed_in_session(&l.item, l.epoch, &s)).map_or_else(failed, Answer::Lease)
            }
            Op::Claim { id, session: Some(s), .. } => {
                block_on(store.claim_in_session(&id, &s)).map_or_else(failed, Answer::Lease)
            }
            Op::Renew { id, .. } => match node.copies.get(&id).cloned() {
                Some(mut lease) => match block_on(store.renew(&mut lease)) {
                    Ok(()) => {
                        node.copies.insert(id, lease.clone());
                        Answer::Lease(lease)
                    }
                    Err(e) => Answer::Failed(e),
                },
                None => Answer::Failed(Error::Lost { id }),
            },
            Op::Release { id } => match node.copies.get(&id) {
                Some(lease) => block_on(store.release(lease)).map_or_else(failed, |()| Answer::Done),
                None => Answer::Failed(Error::Lost { id }),
            },
            Op::ReleaseLease { lease } => block_on(store.release(&lease)).map_or_else(failed, |()| Answer::Done),
            Op::Get { id } => block_on(store.get(&id)).map_or_else(failed, Answer::Item),
            Op::OrphansPage { cutoff_ms, page_size } => {
                match block_on(store.orphans_page(cutoff_ms, page_size, None)) {
                    Ok(page) => Answer::Orphans { full: page.next.is_some(), items: page.items },
                    Err(e) => Answer::Failed(e),
                }
            }
            Op::Sessions => block_on(store.sessions(u64::MAX)).map_or_else(failed, Answer::Sessions),
            Op::OwnedBy { owner } => block_on(store.owned_by(&owner)).map_or_else(failed, Answer::Owned),
            Op::RetireSession { owner, epoch } => {
                block_on(store.retire_session(&owner, epoch)).map_or_else(failed, |_| Answer::Done)
            }
            Op::CreateSession { previous } => {
                block_on(store.create_session(&owner, previous)).map_or_else(failed, Answer::Session)
            }
            Op::RenewSession { mut session, load, .. } => {
                match block_on(store.renew_session_reporting(&mut session, load)) {
                    Ok(()) => Answer::Session(session),
                    Err(e) => Answer::Failed(e),
                }
            }
            Op::EndSession { session, load } => {
                block_on(store.end_session_reporting(&session, load)).map_or_else(failed, |()| Answer::Done)
            }
            Op::DesiredStates { ids } => match block_on(store.batch_desired_states(&ids)) {
                Ok(states) => Answer::DesiredStates(states.into_iter().collect()),
                Err(e) => Answer::Failed(e),
            },
        }
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
        self.hints.len() + self.hints_deferred.len()
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
