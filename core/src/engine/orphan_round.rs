//! The orphan round: the orphan page, the fleet's sessions, the dead sessions' listings, the
//! balance (claim limit and hand-over), and the round's claims, paced by the index's partitions.

#[allow(unused_imports)]
use super::*;

#[derive(Debug, Default)]
pub(super) struct OrphanRound {
    pub(super) page: Vec<LeaseItem>,
    pub(super) full: bool,
    /// The session listing, once read (None: not read, or the read failed).
    pub(super) peers: Option<Vec<PeerSession>>,
    pub(super) dead_sessions: Vec<SessionItem>,
    pub(super) owned_waiting: usize,
    pub(super) owned_failed: bool,
    pub(super) dead: Vec<DeadSession>,
    /// Claims to start, in order.
    pub(super) queue: VecDeque<(String, Source)>,
    pub(super) in_flight: usize,
    pub(super) wake_in_ms: u64,
    pub(super) own_wanted: usize,
    pub(super) own_claimed: usize,
    pub(super) takeovers: BTreeMap<String, usize>,
    /// The dead session (owner, epoch) each queued dead id is claimed from.
    pub(super) dead_owner: HashMap<String, (String, u64)>,
    /// Each dead id as it was listed under its dead session.
    pub(super) dead_listed: HashMap<String, Listed>,
    /// When the first live peer session, renewed no more, could be taken over (monotonic ms).
    pub(super) peer_dies_at_mono_ms: Option<u64>,
    /// The owners of the live sessions, this worker's among them.
    pub(super) live_owners: Vec<String>,
    /// The live sessions' loads as listed (this worker's as it last reported it): every
    /// survivor reading the same listing assigns a dead session's work alike.
    pub(super) live_loads: Vec<(String, Option<SessionLoad>)>,
    /// When the dead sessions' work (and ours of earlier epochs, with `listed_own`) was listed.
    pub(super) listed_at: Option<Now>,
    pub(super) listed_own: bool,
    /// The takeovers of the wave in flight: taken, and refused by their items' conditions.
    pub(super) wave_taken: usize,
    pub(super) wave_refused: usize,
}

#[derive(Debug)]
pub(super) enum PollPhase {
    Idle { at_mono_ms: u64 },
    Page,
    Fleet(OrphanRound),
    Claims(OrphanRound),
}

impl Engine {
    pub(super) fn pace_ms(&self) -> u64 {
        balance_pace_ms(self.config.renew_ms(), self.settings.orphan_interval_ms)
    }

    pub(super) fn start_poll(&mut self) {
        // A claim whose answer was lost may still have landed: read it again.
        for id in std::mem::take(&mut self.unsettled) {
            match self.tracked.get(&id) {
                None => {
                    self.run(Op::Get { id: id.clone() }, Pending::Settle { id });
                }
                // Read once the claim in flight is answered.
                Some(Tracked::Claiming) => {
                    self.unsettled.insert(id);
                }
                Some(_) => {}
            }
        }
        let interval = self.settings.orphan_interval_ms;
        let capacity = self.capacity();
        // Session mode polls even when full: the poll also decides the balance.
        if capacity == 0 && !self.session_mode() {
            let wait = jittered_ms(interval, self.unit());
            self.poll = PollPhase::Idle { at_mono_ms: self.now.mono_ms + wait };
            return;
        }
        let cutoff_ms = orphan_query_cutoff(self.now.wall_ms, &self.config, interval);
        // With balance every orphan counts as the fleet's work, not only those that fit here.
        let page_size = if self.balanced() { self.settings.max_connections } else { capacity.max(1) };
        // A sharded index is read first from a shard this worker holds least of (ties at
        // random): workers that poll at one moment (a fleet started at once) claim from
        // different shards, and each worker's work spreads over the shards (with the claims of
        // one poll limited per shard, [`decide::claims_per_shard`]).
        let shards = self.config.orphan_shards.max(1);
        let first_shard = (shards > 1).then(|| self.least_held_shard(shards));
        self.poll_first_shard = first_shard.unwrap_or(0);
        self.run(Op::OrphansPage { cutoff_ms, page_size, first_shard }, Pending::Page);
        self.poll = PollPhase::Page;
    }

    /// The orphan shard of which this worker tracks the fewest connections, at random among
    /// those tied.
    pub(super) fn least_held_shard(&mut self, shards: u32) -> u32 {
        let mut held = vec![0usize; shards as usize];
        for id in self.tracked.keys() {
            held[crate::config::orphan_shard_of(id, shards) as usize] += 1;
        }
        let least = held.iter().copied().min().unwrap_or(0);
        let ties: Vec<u32> = (0..shards).filter(|k| held[*k as usize] == least).collect();
        let pick = (self.unit() * ties.len() as f64) as usize;
        ties[pick.min(ties.len() - 1)]
    }

    pub(super) fn poll_failed(&mut self, e: &Error) {
        warn!(error = %e, "orphan query failed");
        self.rounds_planned += 1;
        self.orphan_failures += 1;
        let wait = orphan_retry_ms(self.orphan_failures, self.settings.orphan_interval_ms, self.unit());
        self.poll = PollPhase::Idle { at_mono_ms: self.now.mono_ms + wait };
    }

    pub(super) fn page_answered(&mut self, answer: Answer) {
        if !matches!(self.poll, PollPhase::Page) {
            return;
        }
        let (items, full) = match answer {
            Answer::Orphans { items, full } => (items, full),
            Answer::Failed(e) => return self.poll_failed(&e),
            other => return self.poll_failed(&Error::Store(format!("unexpected answer {other:?}"))),
        };
        self.totals.orphan_polls += 1;
        let round = OrphanRound { page: items, full, ..OrphanRound::default() };
        if self.session_mode() && self.live_session().is_some() {
            self.run(Op::Sessions, Pending::Fleet);
            self.poll = PollPhase::Fleet(round);
        } else {
            self.plan_round(round);
        }
    }

    pub(super) fn fleet_answered(&mut self, answer: Answer) {
        if !matches!(self.poll, PollPhase::Fleet(_)) {
            return;
        }
        let PollPhase::Fleet(mut round) = std::mem::replace(&mut self.poll, PollPhase::Page) else { return };
        let sessions = match answer {
            Answer::Sessions(sessions) => sessions,
            other => {
                // A failed read of the fleet leaves the limit as it was; the orphans are still claimed.
                warn!(answer = ?other, "reading the sessions failed");
                return self.plan_round(round);
            }
        };
        self.taken_from.retain(|(owner, epoch), _| sessions.iter().any(|s| &s.owner == owner && s.epoch == *epoch));
        // A peer that stops renewing is dead once its expiry is past the skew: the next poll
        // then, not up to a whole interval later. A live peer renews long before; the next
        // poll reads its new expiry, so this wake never comes for it.
        let (wall, mono, skew) = (self.now.wall_ms, self.now.mono_ms, self.config.skew_ms());
        round.peer_dies_at_mono_ms = sessions
            .iter()
            .filter(|s| s.owner != self.settings.worker_id && s.expires_at_ms > 0)
            .map(|s| s.expires_at_ms.saturating_add(skew + 1))
            .filter(|at| *at > wall)
            .min()
            .map(|at| mono + (at - wall));
        self.last_sessions = sessions.clone();
        let owners: Vec<(String, u64, u64, Option<SessionLoad>)> =
            sessions.iter().map(|s| (s.owner.clone(), s.epoch, s.expires_at_ms, s.load)).collect();
        let (peers, dead) =
            self.balancer.read(sessions, &self.settings.worker_id, self.now.wall_ms, self.now.mono_ms, &self.config);
        self.fleet_size = peers.len() + 1;
        round.peers = Some(peers);
        let me = &self.settings.worker_id;
        let is_dead = |owner: &String, epoch: u64| dead.iter().any(|d| &d.owner == owner && d.epoch == epoch);
        round.live_loads = owners
            .into_iter()
            .filter(|(owner, epoch, expires, _)| *expires > 0 && !is_dead(owner, *epoch))
            .map(|(owner, _, _, load)| (owner, load))
            .collect();
        round.live_owners = round
            .live_loads
            .iter()
            .map(|(owner, _)| owner.clone())
            .filter(|owner| owner != me)
            .chain(std::iter::once(me.clone()))
            .collect();
        let ended: Vec<(String, u64)> =
            dead.iter().filter(|s| s.expires_at_ms == 0).map(|s| (s.owner.clone(), s.epoch)).collect();
        self.ended_seen.retain(|key, _| ended.contains(key));
        for key in ended {
            self.ended_seen.entry(key).or_insert(mono);
        }
        let reclaim_own = std::mem::take(&mut self.reclaim_own);
        round.listed_at = Some(self.now);
        round.listed_own = reclaim_own;
        for (owner, epoch) in dead_session_owners(&dead, &self.settings.worker_id, reclaim_own) {
            self.run(Op::OwnedBy { owner: owner.clone() }, Pending::Owned { owner, epoch });
            round.owned_waiting += 1;
        }
        round.dead_sessions = dead;
        if round.owned_waiting == 0 {
            self.plan_round(round);
        } else {
            self.poll = PollPhase::Fleet(round);
        }
    }

    pub(super) fn owned_answered(&mut self, owner: String, epoch: Option<u64>, answer: Answer) {
        let PollPhase::Fleet(round) = &mut self.poll else { return };
        round.owned_waiting -= 1;
        match answer {
            Answer::Owned(items) => {
                let listed = items.len();
                let mut ids = Vec::new();
                for item in items.into_iter().filter(|i| !self.tracked.contains_key(&i.id)) {
                    ids.push(item.id.clone());
                    if let Some(epoch) = epoch {
                        round.dead_listed.insert(item.id.clone(), Listed { epoch, item });
                    }
                }
                round.dead.push(DeadSession { owner, epoch, listed, ids });
            }
            other => {
                warn!(answer = ?other, "reading a dead session's work failed");
                round.owned_failed = true;
            }
        }
        if round.owned_waiting == 0 {
            let PollPhase::Fleet(mut round) = std::mem::replace(&mut self.poll, PollPhase::Page) else { return };
            if round.owned_failed {
                // As one failed read of the fleet: no balance, no dead sessions this time (our
                // own earlier work is looked for again next time).
                if round.dead.iter().any(|d| d.epoch.is_none()) || round.dead_sessions.is_empty() {
                    self.reclaim_own = true;
                }
                round.peers = None;
                round.dead.clear();
            }
            // Keep the owners' order stable.
            round.dead.sort_by(|a, b| (a.epoch.is_none(), &a.owner).cmp(&(b.epoch.is_none(), &b.owner)));
            self.plan_round(round);
        }
    }

    /// The page (and the fleet) are read: balance, then queue the claims.
    pub(super) fn plan_round(&mut self, mut round: OrphanRound) {
        self.rounds_planned += 1;
        if self.stopping {
            self.poll = PollPhase::Idle { at_mono_ms: u64::MAX };
            return;
        }
        self.orphan_failures = 0;
        let own = self.settings.worker_id.clone();
        if let (Some(peers), true) = (round.peers.as_ref(), self.balanced()) {
            let tracked = &self.tracked;
            let (now_ms, config) = (self.now.wall_ms, &self.config);
            let (unowned, in_flight) = orphan_counts(&round.page, now_ms, config, &own, |id| tracked.contains_key(id));
            let unowned = unowned.max(self.estimate_unowned(&round));
            let taken = |d: &DeadSession| {
                d.epoch.and_then(|e| self.taken_from.get(&(d.owner.clone(), e))).copied().unwrap_or(0)
            };
            let dead_work: u64 = round.dead.iter().map(|d| dead_work(d, &round.dead_sessions, taken(d))).sum();
            let peers = peers.clone();
            self.balance(&peers, unowned + dead_work, in_flight);
        }
        if !self.session_mode() {
            // Per-item mode lists no fleet: the workers claiming are at least as many as can
            // hold the work nobody holds (see `fleet_size`).
            let max = self.settings.max_connections.max(1) as u64;
            self.fleet_size = self.estimate_unowned(&round).div_ceil(max).max(1) as usize;
        }
        let capacity = if self.balanced() { self.capacity() } else { self.room() };
        let poll = OrphanPoll {
            items: &round.page,
            page_was_full: round.full,
            now_ms: self.now.wall_ms,
            capacity,
            interval_ms: self.settings.orphan_interval_ms,
            unit: self.unit(),
            per_shard: decide::claims_per_shard(
                self.settings.max_connections,
                self.config.orphan_shards,
                self.balanced(),
            ),
        };
        let tracked = &self.tracked;
        let plan = plan_orphans(&poll, &self.config, |id| tracked.contains_key(id));
        round.wake_in_ms = plan.wake_in_ms;
        let mut claim = plan.claim;
        if self.balanced() {
            // Claimers racing over one list in one order would mostly collide.
            self.shuffle(&mut claim);
        }
        round.queue.extend(claim.into_iter().map(|id| (id, Source::Orphan)));
        if self.session_mode() {
            let assigned = if self.balanced() {
                let me = &self.settings.worker_id;
                let others: Vec<&String> =
                    round.dead.iter().filter(|d| d.epoch.is_some()).flat_map(|d| &d.ids).collect();
                takeover_assignment(me, &round.live_loads, &others)
            } else {
                None
            };
            for dead in std::mem::take(&mut round.dead) {
                if dead.listed == 0 {
                    // Nothing listed: retired only once the listing was sent late enough for
                    // the owner index to list all the session held (see `listing_is_whole`).
                    if let Some(epoch) = dead.epoch.filter(|e| self.listing_is_whole(&round, &dead.owner, *e)) {
                        self.run(Op::RetireSession { owner: dead.owner.clone(), epoch }, Pending::Retire);
                    }
                    continue;
                }
                let own_work = dead.epoch.is_none();
                let source = if own_work { Source::ReclaimOwn } else { Source::DeadSession };
                let mut ids = dead.ids;
                if self.balanced() {
                    self.shuffle(&mut ids);
                    // The survivors take different connections (rendezvous ranking), so their
                    // takeovers seldom race for one.
                    let me = &self.settings.worker_id;
                    let mine = |id: &String| assigned.as_ref().map(|a| a.contains(id.as_str()));
                    ids.sort_by_cached_key(|id| claim_rank(&round.live_owners, me, id, mine(id)));
                }
                if own_work {
                    round.own_wanted += ids.len();
                } else if let Some(epoch) = dead.epoch {
                    for id in &ids {
                        round.dead_owner.insert(id.clone(), (dead.owner.clone(), epoch));
                    }
                }
                round.queue.extend(ids.into_iter().map(|id| (id, source)));
            }
        }
        self.poll = PollPhase::Claims(round);
    }

    /// Whether the round's listing of the dead session `(owner, epoch)` was sent at least
    /// `index_lag_ms` after the session's last write, so that an owner index lagging less than
    /// that lists every connection the session held: its silence is then an answer. A session
    /// that died holds nothing claimed after its expiry (the listed one: a listing that lags
    /// shows an older expiry, never a later one); an ended one nothing claimed after its end,
    /// which came before this worker first read it as ended.
    pub(super) fn listing_is_whole(&self, round: &OrphanRound, owner: &str, epoch: u64) -> bool {
        let Some(at) = round.listed_at else { return false };
        let lag = self.settings.index_lag_ms;
        match round.dead_sessions.iter().find(|s| s.owner == owner && s.epoch == epoch) {
            Some(s) if s.expires_at_ms > 0 => {
                at.wall_ms >= s.expires_at_ms.saturating_add(self.config.skew_ms()).saturating_add(lag)
            }
            Some(_) => self
                .ended_seen
                .get(&(owner.to_string(), epoch))
                .is_some_and(|seen| at.mono_ms >= seen.saturating_add(lag)),
            None => false,
        }
    }

    pub(super) fn shuffle(&mut self, ids: &mut [String]) {
        for i in (1..ids.len()).rev() {
            let j = (self.unit() * (i + 1) as f64) as usize;
            ids.swap(i, j.min(i));
        }
    }

    /// Sets the claim limit from the fleet's load and, paced, hands a few connections over when
    /// this worker is above its share while another is short of its own.
    pub(super) fn balance(&mut self, peers: &[PeerSession], unowned: u64, in_flight: u64) {
        let pace = self.pace_ms();
        let view = FleetView { me: self.load(), peers, unowned, in_flight };
        let window = pace.saturating_add(self.settings.index_lag_ms);
        let step = self.balancer.step(&view, self.now.mono_ms, pace, window);
        self.claim_limit = step.claim_limit as usize;
        let (Some(share), count) = (step.share, step.hand_over) else { return };
        if count > 0 && !self.stopping {
            let n = self.hand_over(count as usize);
            info!(
                worker_id = %self.settings.worker_id, handing_over = n, share = share.mine, work = share.work,
                sessions = peers.len() + 1, "above the fair share: handing over"
            );
        }
    }

    /// Starts the round's claims that fit, at most [`CLAIM_CONCURRENCY`] in flight; a claim
    /// lost to another worker frees its room for the next.
    pub(super) fn drive_poll_claims(&mut self) {
        if !matches!(self.poll, PollPhase::Claims(_)) {
            return;
        }
        let PollPhase::Claims(mut round) = std::mem::replace(&mut self.poll, PollPhase::Page) else { return };
        let mut wave = false;
        while round.in_flight < CLAIM_CONCURRENCY && !self.stopping {
            let Some((id, source)) = round.queue.front().cloned() else { break };
            // Takeovers go in waves, sent together once nothing is in flight: a driver sends
            // those of one dead session as one transaction (one check of its session item for
            // all of them, a partition value every survivor's takeovers would share).
            if source == Source::DeadSession && round.in_flight > 0 && !wave {
                break;
            }
            if source != Source::ReclaimOwn && self.room() == 0 {
                if round.in_flight > 0 {
                    break; // one in flight may fail and free room
                }
                // No room: what is left of others' work waits for the next poll.
                round.queue.retain(|(_, s)| *s == Source::ReclaimOwn);
                continue;
            }
            if !self.take_claim_token(source != Source::Orphan) {
                break;
            }
            round.queue.pop_front();
            let listed = if source == Source::DeadSession { round.dead_listed.remove(&id) } else { None };
            match self.try_claim(&id, source, ClaimFrom::Poll, listed) {
                Ok(()) => {
                    round.in_flight += 1;
                    wave |= source == Source::DeadSession;
                }
                Err(Claim::Stopping) => round.queue.clear(),
                Err(_) => {}
            }
        }
        if self.stopping {
            round.queue.clear();
        }
        if round.queue.is_empty() && round.in_flight == 0 {
            self.end_round(round);
        } else {
            self.poll = PollPhase::Claims(round);
        }
    }

    pub(super) fn end_round(&mut self, round: OrphanRound) {
        let early = round.listed_at.is_some_and(|at| at.mono_ms < self.reclaim_own_until_mono_ms);
        if round.own_claimed < round.own_wanted || (round.listed_own && early) {
            // Some of our earlier work is still listed under us, or the index may not list all
            // of it yet: look again at the next poll.
            self.reclaim_own = true;
        }
        for (owner, claimed) in &round.takeovers {
            info!(owner = %owner, claimed, "took over a dead session's work");
        }
        let mut wake = self.now.mono_ms + round.wake_in_ms;
        if round.wake_in_ms == 0 && self.balanced() {
            // More orphans wait, but each round lists every session again (one partition value
            // of the index, read by the whole fleet): at most one round every half interval.
            let listed = round.listed_at.map_or(self.now.mono_ms, |at| at.mono_ms);
            wake = wake.max(listed + self.settings.orphan_interval_ms / 2);
        }
        let next = wake.min(round.peer_dies_at_mono_ms.unwrap_or(u64::MAX));
        let at = if self.poll_again { self.now.mono_ms } else { next };
        self.poll_again = false;
        self.poll = PollPhase::Idle { at_mono_ms: at };
    }

    pub(super) fn claim_done(&mut self, id: &str, source: Source, from: ClaimFrom, outcome: Claim) {
        if outcome == Claim::Conflict {
            // Refused by the item's condition: nothing reached the index.
            match source {
                Source::Orphan => self.claim_tokens += 1.0,
                _ => self.spread_tokens += 1.0,
            }
        }
        match from {
            ClaimFrom::Poll => {
                let PollPhase::Claims(round) = &mut self.poll else { return };
                round.in_flight -= 1;
                if source == Source::DeadSession {
                    round.wave_taken += usize::from(outcome == Claim::Claimed);
                    round.wave_refused += usize::from(outcome == Claim::Conflict);
                    if round.in_flight == 0 {
                        if decide::takeover_wave_was_lost(round.wave_taken, round.wave_refused) {
                            // Every takeover of the wave was refused: the survivors are taking
                            // the dead session's work faster than this list ages. Going on
                            // down it would mostly collide with them (each refusal a write to
                            // the item, each wave a check of the one dead session's item); what
                            // is still unclaimed is listed again at the next round.
                            round.queue.retain(|(_, s)| *s != Source::DeadSession);
                        }
                        (round.wave_taken, round.wave_refused) = (0, 0);
                    }
                }
                if outcome == Claim::Claimed {
                    match source {
                        Source::ReclaimOwn => {
                            round.own_claimed += 1;
                            self.totals.session_takeovers += 1;
                        }
                        Source::DeadSession => self.totals.session_takeovers += 1,
                        _ => {}
                    }
                    if let Some(dead) = round.dead_owner.get(id).filter(|_| source == Source::DeadSession) {
                        *round.takeovers.entry(dead.0.clone()).or_default() += 1;
                        *self.taken_from.entry(dead.clone()).or_default() += 1;
                    }
                }
            }
            ClaimFrom::Hint(i) => {
                if let Some(batch) = &mut self.hint_batch {
                    batch.in_flight -= 1;
                    if let Some(ended) = batch.ended.get(&i).filter(|_| outcome == Claim::Claimed) {
                        // Taken over from a session that ended: its last report counts it no more.
                        *self.taken_from.entry(ended.clone()).or_default() += 1;
                        self.totals.session_takeovers += 1;
                    }
                    if let Some(slot) = batch.outcomes.get_mut(i) {
                        *slot = Some(outcome);
                    }
                }
            }
        }
    }

    /// The work nobody holds in the whole index, from one page (its shards stand for the
    /// rest), and how the page's orphans spread over the shards (`seen_whole`, when the page
    /// held them all). Per-item mode sizes its crowd of claimers by it (a cold start of 100,000
    /// on workers of 700: 143; a crash's or a deploy's few hundred orphans: one worker, claiming
    /// at a shard's budget). A full page inside one shard counts every shard at a page: a lower
    /// bound where a shard holds several pages of work (shards enough that one holds about a
    /// worker's share keep it near the truth: 128 for 100,000 on workers of 700).
    fn estimate_unowned(&mut self, round: &OrphanRound) -> u64 {
        let (now_ms, config, tracked) = (self.now.wall_ms, &self.config, &self.tracked);
        let counts = |i: &LeaseItem| decide::counts_as_unowned(i, now_ms, config, |id| tracked.contains_key(id));
        let shards = config.orphan_shards;
        let unowned = unowned_estimate(&round.page, round.full, self.poll_first_shard, shards, counts);
        let orphans: Vec<&LeaseItem> = round.page.iter().filter(|i| counts(i)).collect();
        self.seen_whole = if round.full { None } else { decide::shard_spread(&orphans, shards) };
        unowned
    }

    /// Claims are paced by the orphan index's partitions (session mode with balance, and
    /// per-item mode): takes one claim's token, or says when the next is there. Claims from an
    /// orphan page come from one shard at a time
    /// ([`decide::claim_rate_per_s`] for this fleet's size); `spread`: claims of work spread
    /// over every shard (a dead session's, hinted work), whose index writes every shard shares
    /// ([`decide::spread_claim_rate_per_s`]: a worker hands a deploy's or a crash's work on at
    /// the fleet's pace, not at a one-shard crowd's).
    pub(super) fn take_claim_token(&mut self, spread: bool) -> bool {
        if self.session_mode() && !self.balanced() {
            return true;
        }
        let (rate, tokens, at) = if spread {
            let rate = decide::spread_claim_rate_per_s(self.config.orphan_shards, self.fleet_size);
            (rate, &mut self.spread_tokens, &mut self.spread_tokens_at_mono_ms)
        } else {
            let rate = decide::claim_rate_per_s(self.config.orphan_shards, self.fleet_size, self.seen_whole);
            (rate, &mut self.claim_tokens, &mut self.claim_tokens_at_mono_ms)
        };
        let now = self.now.mono_ms;
        let elapsed_s = now.saturating_sub(*at) as f64 / 1_000.0;
        let burst = rate.max(CLAIM_CONCURRENCY as f64);
        *tokens = (*tokens + elapsed_s * rate).min(burst);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            return true;
        }
        let wait_ms = ((1.0 - *tokens) / rate * 1_000.0).ceil() as u64;
        self.claims_paced_until = Some(now + wait_ms.max(1));
        false
    }

    /// With balance: when the session should renew early to report a load that has moved by
    /// [`decide::report_change`] since its last report (claims of a cold start or a burst of new
    /// work), at most every [`decide::REPORT_MIN_GAP_MS`]: peers count this worker's load
    /// from its last report, and one renew interval behind they would undercount the fleet's
    /// work and stop below their shares.
    pub(super) fn report_due_at(&self) -> Option<u64> {
        // Only a live session with no renewal in flight can send a report: a report due while
        // the session is closed (or being renewed) would ask to be woken now again and again.
        if !self.balanced() || self.stopping || !matches!(self.session, SessionPhase::Live { renewing: false, .. }) {
            return None;
        }
        let moved = self.tracked.len().abs_diff(self.reported_tracked);
        (moved >= decide::report_change(self.settings.max_connections))
            .then_some(self.report_sent_mono_ms + decide::REPORT_MIN_GAP_MS)
    }

    /// Wakes the orphan poll now (hints arrived, a new epoch began).
    pub(super) fn poll_orphans_now(&mut self) {
        match &mut self.poll {
            PollPhase::Idle { at_mono_ms } => *at_mono_ms = (*at_mono_ms).min(self.now.mono_ms),
            _ => self.poll_again = true,
        }
    }
}
