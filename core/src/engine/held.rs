//! Held leases: each one's keeper and handler (its cancellation, the grace before an abort,
//! the release when it ends), hand-overs, a session's cover and loss, renewals' answers, and the
//! wakes that say when a lease needs looking at.

#[allow(unused_imports)]
use super::*;

/// One held lease.
#[derive(Debug)]
pub(super) struct HeldEntry {
    pub(super) keeper: Keeper,
    /// The keeper still runs (not lost, not past its deadline, handler not ended).
    pub(super) keeping: bool,
    /// A renewal in flight and when it was sent.
    pub(super) renewing: Option<(OpId, u64)>,
    pub(super) session_epoch: Option<u64>,
    pub(super) fence: u64,
    pub(super) claim_order: u64,
    /// The hand-over round it was picked in (0: not picked).
    pub(super) handing_over: u64,
    pub(super) reason: Option<CancelReason>,
    /// When an ignored cancellation aborts the handler.
    pub(super) abort_at: Option<u64>,
    /// The handler has ended: the lease is being released (or left to the session's end).
    pub(super) ended: bool,
    /// Session mode: a release that failed is sent again then (monotonic ms), and how many
    /// failed. Work held under a live session never expires: given up, it would stay ours with
    /// no handler until the session ends.
    pub(super) release_again_at: Option<u64>,
    pub(super) release_failures: u32,
}

#[derive(Debug)]
pub(super) enum Tracked {
    Claiming,
    Held(Box<HeldEntry>),
}

impl Engine {
    /// Fires the handler's token (the first reason wins) and starts its grace period.
    pub(super) fn cancel(&mut self, id: &str, reason: CancelReason) -> bool {
        let grace = self.settings.handler_grace_ms;
        let now = self.now.mono_ms;
        let Some(Tracked::Held(h)) = self.tracked.get_mut(id) else { return false };
        if h.reason.is_some() || h.ended {
            return false;
        }
        self.dirty.insert(id.to_string());
        h.reason = Some(reason);
        if matches!(reason, CancelReason::Lost | CancelReason::Deadline) {
            h.keeping = false;
        }
        h.abort_at = Some(now + grace);
        self.commands.push_back(Command::CancelHandler { id: id.to_string(), reason });
        true
    }

    pub(super) fn handler_ended(&mut self, id: &str, end: HandlerEnd, seen: Option<CancelReason>) {
        let session_mode = self.session_mode();
        let Some(Tracked::Held(h)) = self.tracked.get_mut(id) else { return };
        if h.ended {
            return;
        }
        h.ended = true;
        h.keeping = false;
        h.abort_at = None;
        // The driver's token is the authority: a checkpoint may have found the lease lost.
        let reason = h.reason.or(seen);
        h.reason = reason;
        match end {
            HandlerEnd::Returned => debug!(connection_id = %id, reason = ?reason, "handler returned"),
            HandlerEnd::Failed => {
                self.totals.handler_errors += 1;
                debug!(connection_id = %id, "handler failed");
            }
            HandlerEnd::Panicked => {
                self.totals.handler_panics += 1;
                debug!(connection_id = %id, "handler panicked");
            }
            HandlerEnd::Aborted => {
                warn!(connection_id = %id, grace_ms = self.settings.handler_grace_ms, "handler ignored cancellation; aborted")
            }
        }
        if counts_as_lost(reason) {
            self.totals.leases_lost += 1;
            warn!(connection_id = %id, reason = ?reason, "lease lost");
        }
        // Session mode: at shutdown one session write frees everything (after every handler ended).
        if releases_after_handler(reason, session_mode) {
            self.run(Op::Release { id: id.to_string() }, Pending::Release { id: id.to_string() });
        } else {
            self.forget(id);
        }
    }

    /// Session mode: whether the failed release of `id` is sent again (after a pause that grows
    /// with each failure, at most one renew interval). It is while the work is held under the
    /// live session and the worker is not stopping (the session's end then frees it); per-item
    /// work expires by itself.
    pub(super) fn release_again(&mut self, id: &str) -> bool {
        let live = self.live_session().map(|s| s.epoch);
        let (now, renew_ms, stopping) = (self.now.mono_ms, self.config.renew_ms(), self.stopping);
        let Some(Tracked::Held(h)) = self.tracked.get_mut(id) else { return false };
        if stopping || live.is_none() || h.session_epoch != live {
            return false;
        }
        let pause = (250u64 << h.release_failures.min(8)).min(renew_ms);
        h.release_failures += 1;
        h.release_again_at = Some(now + pause);
        self.dirty.insert(id.to_string());
        true
    }

    pub(super) fn forget(&mut self, id: &str) {
        if self.tracked.remove(id).is_some() {
            self.commands.push_back(Command::Forget { id: id.to_string() });
        }
    }

    /// A renewed (or new) session: every connection held under it acts until its new deadline.
    pub(super) fn cover_all(&mut self, session: &Session) {
        let mut moved = Vec::new();
        for (id, t) in self.tracked.iter_mut() {
            if let Tracked::Held(h) = t {
                if moves_with_session(h.session_epoch, h.reason, session) && !h.ended {
                    h.keeper.cover(session.deadline_mono_ms);
                    moved.push(id.clone());
                }
            }
        }
        for id in moved {
            self.commands.push_back(Command::SetDeadline { id, deadline_mono_ms: session.deadline_mono_ms });
        }
    }

    /// Rule 2 on the session: its deadline passed or it was lost: every handler stops.
    pub(super) fn lose_session(&mut self, epoch: u64) {
        let ids: Vec<String> = self.held_ids();
        for id in ids {
            self.cancel(&id, CancelReason::Deadline);
        }
        self.session = SessionPhase::Closed { retry_at_mono_ms: self.now.mono_ms, failures: 0, previous: Some(epoch) };
    }

    pub(super) fn held_ids(&self) -> Vec<String> {
        self.tracked.iter().filter(|(_, t)| matches!(t, Tracked::Held(_))).map(|(id, _)| id.clone()).collect()
    }

    /// Picks `count` held connections to hand over and asks for a session renewal at once: it
    /// reports them as no longer held; once it has landed their handlers are cancelled with
    /// `HandOver` and each is released and hinted.
    pub(super) fn hand_over(&mut self, count: usize) -> usize {
        let candidates: Vec<(String, u64, u64)> = self
            .tracked
            .iter()
            .filter_map(|(id, t)| match t {
                Tracked::Held(h) if h.reason.is_none() && h.handing_over == 0 && !h.ended => {
                    Some((id.clone(), h.fence, h.claim_order))
                }
                _ => None,
            })
            .collect();
        let picks = decide::hand_over_picks(&candidates, count);
        self.hand_over_rounds += 1;
        let round = self.hand_over_rounds;
        for id in &picks {
            if let Some(Tracked::Held(h)) = self.tracked.get_mut(id) {
                h.handing_over = round;
            }
        }
        if !picks.is_empty() {
            self.renew_session_now = true;
        }
        picks.len()
    }

    /// A session renewal that read `round` has reported the picks up to it as gone.
    pub(super) fn start_hand_overs(&mut self, round: u64) {
        let picked: Vec<String> = self
            .tracked
            .iter()
            .filter_map(|(id, t)| match t {
                Tracked::Held(h) if h.handing_over != 0 && h.handing_over <= round => Some(id.clone()),
                _ => None,
            })
            .collect();
        for id in picked {
            self.cancel(&id, CancelReason::HandOver);
        }
    }

    pub(super) fn renewed(&mut self, op: OpId, id: &str, answer: Answer) {
        let unit = self.unit();
        let now = self.now.mono_ms;
        let config = self.config.clone();
        let Some(Tracked::Held(h)) = self.tracked.get_mut(id) else { return };
        if h.renewing.map(|(o, _)| o) != Some(op) {
            return;
        }
        self.dirty.insert(id.to_string());
        let sent = h.renewing.take().map_or(now, |(_, sent)| sent);
        if !h.keeping {
            return;
        }
        let stop = match &answer {
            Answer::Lease(lease) => {
                if self.renew_latency_ms.len() < MAX_LATENCY_SAMPLES {
                    self.renew_latency_ms.push(now.saturating_sub(sent));
                }
                h.keeper.renewed(Ok(Renewal::of(lease, &config)), now, unit)
            }
            Answer::Failed(e) => {
                debug!(connection_id = %id, error = %e, "renewal failed");
                h.keeper.renewed(Err(e), now, unit)
            }
            other => {
                warn!(connection_id = %id, answer = ?other, "unexpected answer to a renewal");
                h.keeper.renewed(Err(&Error::Store("unexpected answer".into())), now, unit)
            }
        };
        match stop {
            Some(CancelReason::Stopped) if self.cancel(id, CancelReason::Stopped) => {
                info!(connection_id = %id, "stopped (seen on renewal)");
            }
            Some(CancelReason::Stopped) => {}
            Some(reason) => {
                self.cancel(id, reason);
                if let Some(Tracked::Held(h)) = self.tracked.get_mut(id) {
                    h.keeping = false;
                }
            }
            None => {}
        }
    }

    /// A new entry in `wakes` for every lease changed in this step.
    pub(super) fn schedule_dirty(&mut self) {
        let now = self.now.mono_ms;
        for id in std::mem::take(&mut self.dirty) {
            let Some(Tracked::Held(h)) = self.tracked.get(&id) else { continue };
            let mut at =
                h.abort_at.filter(|_| !h.ended).unwrap_or(u64::MAX).min(h.release_again_at.unwrap_or(u64::MAX));
            if h.keeping {
                at = at.min(match (h.renewing, h.keeper.poll(now)) {
                    (Some(_), _) => h.keeper.deadline_mono_ms(),
                    (None, Wake::SleepUntil(t)) => t,
                    (None, _) => now,
                });
            }
            if at != u64::MAX && !self.finished {
                self.wakes.push(std::cmp::Reverse((at, id)));
            }
        }
    }
}
