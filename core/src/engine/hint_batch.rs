//! Hints: the queue's long poll, a batch of hints and its claims, and how each is settled.

#[allow(unused_imports)]
use super::*;

#[derive(Debug)]
pub(super) struct HintBatch {
    pub(super) messages: Vec<HintMessage>,
    pub(super) outcomes: Vec<Option<Claim>>,
    pub(super) queue: VecDeque<usize>,
    pub(super) in_flight: usize,
    /// A refresh of the claim limit, and when it is given up.
    pub(super) refresh_until: Option<u64>,
    /// The limit was refreshed for this batch: hints that join it later are not counted again
    /// (the ended session whose hints they are was counted by the first refresh).
    pub(super) refreshed: bool,
    /// Session mode: the orphan round the hints started is waited for (the rounds planned
    /// when they arrived, and when the wait is given up), so the work of a session that has just
    /// ended is taken as listed, in takeovers sent together, not one claim per hint.
    pub(super) round_wait: Option<(u64, u64)>,
    /// How many ids the hints name that are not tracked here (work nobody holds, at least).
    pub(super) hinted: u64,
    /// Hints of work under a session that has ended ([`Hint::ended`]): each message's ended
    /// session (owner, epoch), by its index.
    pub(super) ended: HashMap<usize, (String, u64)>,
    /// Their items being read, and those read: the claims start together once every read is
    /// answered, so that those of one ended session go as one [`Op::TakeOver`].
    pub(super) reading: usize,
    pub(super) read: Vec<(usize, String, Option<Listed>)>,
}

/// The hint queue's long poll. While a batch's claims are in flight the next poll waits
/// [`HINT_POLL_OVERLAP_MS`] (a batch answered within it runs one poll at a time), then opens:
/// the hints of a hand-over that trickles in while the batch's claims wait on a slow table are
/// received at once, not after the whole batch.
#[derive(Debug)]
pub(super) enum HintPhase {
    Off,
    Idle { at_mono_ms: u64 },
    Receiving,
    Done,
}

impl Engine {
    pub(super) fn hints_received(&mut self, received: Result<Vec<HintMessage>, String>) {
        if !matches!(self.hints, HintPhase::Receiving) {
            return;
        }
        let next =
            |e: &Self, at_mono_ms: u64| if e.stopping { HintPhase::Done } else { HintPhase::Idle { at_mono_ms } };
        let messages = match received {
            Ok(messages) => {
                self.hint_failures = 0;
                messages
            }
            Err(error) => {
                self.hint_failures += 1;
                let delay = hint_retry_ms(self.hint_failures, self.unit());
                warn!(%error, retry_in_ms = delay, "hint receive failed");
                self.hints = next(self, self.now.mono_ms + delay);
                return;
            }
        };
        if messages.is_empty() {
            self.hints = next(self, self.now.mono_ms);
            return;
        }
        self.totals.hints_received += messages.len() as u64;
        debug!(received = messages.len(), below_limit = self.below_claim_limit(), "hints received");
        let hints: Vec<Hint> =
            messages.iter().filter_map(|m| m.body.as_deref().and_then(|b| Hint::from_json(b).ok())).collect();
        // Hints of a session that has ended name it: their work is read and taken over as
        // listed, and the claim limit raised from the last listing of the fleet, with no orphan
        // round and no read of the sessions (every worker a deploy's hints reach would read the
        // sessions' one partition value at once).
        let mut ended: BTreeMap<(String, u64), u64> = BTreeMap::new();
        for e in hints.iter().filter_map(|h| h.ended.as_ref()) {
            let held = ended.entry((e.owner.clone(), e.epoch)).or_default();
            *held = (*held).max(e.held);
        }
        let all_ended = self.session_mode() && hints.len() == messages.len() && hints.iter().all(|h| h.ended.is_some());
        // Other hints come in tens: one index query finds all the work they point at. At the
        // fair share, one read of the sessions first says whether the share has grown.
        let round_ahead = !matches!(self.poll, PollPhase::Claims(_));
        if !all_ended {
            self.poll_orphans_now();
        }
        let hinted = hints
            .into_iter()
            .map(|h| h.connection_id)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .filter(|id| !self.tracked.contains_key(id))
            .count() as u64;
        let mut batch = self.hint_batch.take().unwrap_or(HintBatch {
            hinted: 0,
            messages: Vec::new(),
            outcomes: Vec::new(),
            queue: VecDeque::new(),
            in_flight: 0,
            refresh_until: None,
            refreshed: false,
            round_wait: None,
            ended: HashMap::new(),
            reading: 0,
            read: Vec::new(),
        });
        // A session that ended hints its work once it is free: the round about to read the
        // fleet finds that session dead and takes its work as listed (no first write that the
        // session's sentinel refuses, and together: one [`Op::TakeOver`]).
        if self.session_mode() && round_ahead && !all_ended && !self.stopping && batch.round_wait.is_none() {
            batch.round_wait = Some((self.rounds_planned, self.now.mono_ms + HINT_ROUND_WAIT_MS));
        }
        batch.hinted += hinted;
        let first = batch.messages.len();
        batch.queue.extend(first..first + messages.len());
        batch.outcomes.resize(first + messages.len(), None);
        batch.messages.extend(messages);
        // A round about to read the fleet sets the limit anyway: no read of the sessions of
        // its own (every worker a deploy's hints reach reads them at once).
        if batch.round_wait.is_none() && !(all_ended && self.raise_limit_for_ended(&ended, batch.hinted)) {
            self.refresh_limit(&mut batch);
        }
        self.hint_batch = Some(batch);
        // The next poll opens once the batch is settled, or after the overlap if it is not.
        self.hints = next(self, self.now.mono_ms + HINT_POLL_OVERLAP_MS);
    }

    /// A batch at the claim limit reads the sessions once to set the limit again (its claims
    /// wait for the answer, at most one orphan interval); says whether it did.
    pub(super) fn refresh_limit(&mut self, batch: &mut HintBatch) -> bool {
        if self.below_claim_limit() || self.stopping || batch.refreshed {
            return false;
        }
        batch.refreshed = true;
        self.run(Op::Sessions, Pending::RefreshLimit);
        batch.refresh_until = Some(self.now.mono_ms + self.settings.orphan_interval_ms);
        true
    }

    /// Raises the claim limit for hints of the ended sessions `ended` (owner, epoch: what each
    /// held at its end) as a read of the sessions would now: the last listing with those
    /// sessions ended, their work nobody's (the others' loads as last read). Says whether it
    /// could (it has a listing to go by, or the limit does not apply).
    pub(super) fn raise_limit_for_ended(&mut self, ended: &BTreeMap<(String, u64), u64>, hinted: u64) -> bool {
        if !self.balanced() || self.stopping {
            return true;
        }
        if self.last_sessions.is_empty() {
            return false;
        }
        let mut sessions: Vec<SessionItem> =
            self.last_sessions.iter().filter(|s| !ended.contains_key(&(s.owner.clone(), s.epoch))).cloned().collect();
        for ((owner, epoch), held) in ended {
            let load = Some(SessionLoad { held: *held, max_connections: 0 });
            sessions.push(SessionItem { owner: owner.clone(), epoch: *epoch, expires_at_ms: 0, load });
        }
        let (pace, me) = (self.pace_ms(), self.load());
        let (own, now_ms) = (self.settings.worker_id.clone(), self.now.wall_ms);
        let limit = self.balancer.refreshed_limit(&sessions, &own, me, hinted, now_ms, &self.config, pace);
        self.claim_limit = self.claim_limit.max(limit as usize);
        true
    }

    /// Starts the read of a hinted item of the ended session `ended` that its takeover goes
    /// by, if a claim of it may start (its room is kept while it is read).
    fn read_ended(&mut self, id: &str, index: usize, ended: &crate::EndedSession) -> Result<(), Claim> {
        self.may_claim(id, Source::Hint)?;
        self.tracked.insert(id.to_string(), Tracked::Claiming);
        let (owner, epoch) = (ended.owner.clone(), ended.epoch);
        self.run(Op::Get { id: id.to_string() }, Pending::EndedRead { id: id.to_string(), index, owner, epoch });
        Ok(())
    }

    /// A hinted item of an ended session is read: as listed under that session when it still
    /// is, so its claim is the takeover; otherwise it is claimed as any hinted work.
    pub(super) fn ended_read(&mut self, id: String, index: usize, owner: String, epoch: u64, answer: Answer) {
        let listed = match answer {
            Answer::Item(Some(item)) if item.owner.as_deref() == Some(owner.as_str()) => Some(Listed { epoch, item }),
            Answer::Failed(e) => {
                debug!(connection_id = %id, error = %e, "reading hinted work failed; claiming it as it is");
                None
            }
            _ => None,
        };
        match &mut self.hint_batch {
            Some(batch) => {
                batch.reading -= 1;
                batch.read.push((index, id, listed));
            }
            None => {
                self.tracked.remove(&id);
            }
        }
    }

    /// Hints received and waiting for a claim.
    pub(super) fn hints_waiting(&self) -> usize {
        self.hint_batch.as_ref().map_or(0, |b| b.queue.len())
    }

    /// Room for hints not yet received: the free capacity less the hints waiting for a claim;
    /// none while claims wait for the store's clock (the hints are left to the others).
    pub(super) fn hint_room(&self) -> usize {
        if self.claims_paused().is_some() {
            return 0;
        }
        self.capacity().saturating_sub(self.hints_waiting())
    }

    pub(super) fn drive_hints(&mut self) {
        // Claims first: a batch they settle opens the next poll now.
        self.claim_hints();
        if let HintPhase::Idle { at_mono_ms } = self.hints {
            if self.stopping {
                self.hints = HintPhase::Done;
            } else if at_mono_ms <= self.now.mono_ms && self.hint_room() > 0 {
                // Only take hints while there is room: a full worker leaves them to the others.
                let max = hint_batch_size(self.room().saturating_sub(self.hints_waiting()).max(1)) as usize;
                self.commands.push_back(Command::ReceiveHints { max, wait_ms: self.settings.hint_wait_ms });
                self.hints = HintPhase::Receiving;
            }
        }
    }

    /// Claims the hinted work of the batch (a few at a time); settles the batch once every
    /// claim is answered.
    pub(super) fn claim_hints(&mut self) {
        let Some(mut batch) = self.hint_batch.take() else { return };
        if batch.refresh_until.is_some_and(|until| until > self.now.mono_ms) {
            self.hint_batch = Some(batch);
            return;
        }
        batch.refresh_until = None;
        if let Some((planned, until)) = batch.round_wait {
            if self.rounds_planned == planned && until > self.now.mono_ms && !self.stopping {
                self.hint_batch = Some(batch);
                return;
            }
            batch.round_wait = None;
            // The round was not in time to set the limit (its queries are slow, or it read
            // nothing new): the batch reads the sessions itself, as one with no round ahead does.
            if self.refresh_limit(&mut batch) {
                self.hint_batch = Some(batch);
                return;
            }
        }
        if batch.reading == 0 {
            // Every read answered: their claims go together (one takeover per ended session).
            for (i, id, listed) in std::mem::take(&mut batch.read) {
                if matches!(self.tracked.get(&id), Some(Tracked::Claiming)) {
                    self.tracked.remove(&id);
                }
                match self.try_claim(&id, Source::Hint, ClaimFrom::Hint(i), listed) {
                    Ok(()) => batch.in_flight += 1,
                    Err(outcome) => batch.outcomes[i] = Some(outcome),
                }
            }
        }
        while batch.in_flight + batch.reading < HINT_CLAIM_CONCURRENCY {
            if batch.queue.is_empty() || !self.take_claim_token(true) {
                break;
            }
            let Some(i) = batch.queue.pop_front() else { break };
            let outcome = match batch.messages[i].body.as_deref().map(Hint::from_json) {
                Some(Ok(Hint { connection_id, ended: Some(ended), .. })) if self.session_mode() => {
                    match self.read_ended(&connection_id, i, &ended) {
                        Ok(()) => {
                            batch.ended.insert(i, (ended.owner, ended.epoch));
                            batch.reading += 1;
                            continue;
                        }
                        Err(outcome) => outcome,
                    }
                }
                Some(Ok(hint)) => {
                    let source = if hint.stranded { Source::Stranded } else { Source::Hint };
                    match self.try_claim(&hint.connection_id, source, ClaimFrom::Hint(i), None) {
                        Ok(()) => {
                            batch.in_flight += 1;
                            continue;
                        }
                        Err(outcome) => outcome,
                    }
                }
                Some(Err(e)) => {
                    warn!(receipt = %batch.messages[i].receipt, error = %e, "unreadable hint dropped");
                    Claim::Failed
                }
                None => Claim::Failed,
            };
            batch.outcomes[i] = Some(outcome);
        }
        if batch.queue.is_empty() && batch.in_flight == 0 && batch.reading == 0 && batch.read.is_empty() {
            self.settle_hints(batch);
        } else {
            self.hint_batch = Some(batch);
        }
    }

    /// Deletes every handled hint (claimed or not: it was only a hint); a hint this worker had
    /// no room for is made visible again at once, for another worker; one it declined while its
    /// clock is not trusted one orphan interval later. One declined at the fair share (read
    /// again for the batch) is deleted too: the fleet's orphan and dead-session rounds find the
    /// work within an interval, and a hint deferred at the share came back to the next worker
    /// at its share, and the next, for as long as the queue kept it (each receipt a read of
    /// the sessions' partition value: in the simulation's steady state at 100,000 connections,
    /// about a third of those reads).
    pub(super) fn settle_hints(&mut self, batch: HintBatch) {
        let mut delete = Vec::new();
        let mut give_back = Vec::new();
        let mut defer = Vec::new();
        for (m, outcome) in batch.messages.into_iter().zip(batch.outcomes) {
            match outcome {
                Some(Claim::NoCapacity | Claim::Stopping) => give_back.push(m.receipt),
                // Another worker may take it meanwhile; the orphan index finds it otherwise.
                Some(Claim::ClockUntrusted) => defer.push(m.receipt),
                _ => delete.push(m.receipt),
            }
        }
        let defer_ms = self.settings.orphan_interval_ms;
        self.commands.push_back(Command::SettleHints { delete, give_back, defer, defer_ms });
        // The poll the batch held back opens now (one already open or failing keeps its time).
        if let HintPhase::Idle { at_mono_ms } = &mut self.hints {
            if !self.stopping && self.hint_failures == 0 {
                *at_mono_ms = (*at_mono_ms).min(self.now.mono_ms);
            }
        }
    }
}
