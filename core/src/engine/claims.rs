//! Claims: whether one may start (capacity, the claim limit, the store's clock), its answer,
//! and the re-read of a claim whose answer was lost.

#[allow(unused_imports)]
use super::*;

/// Who waits for a claim's outcome.
#[derive(Debug, Clone, Copy)]
pub(super) enum ClaimFrom {
    Poll,
    Hint(usize),
}

impl Engine {
    /// Why claims wait now, if they do: rule 1 compares expiries with this worker's clock, so
    /// it claims only on a clock known to be the store's within the tolerance.
    pub(super) fn claims_paused(&self) -> Option<String> {
        let tolerance = self.settings.clock_tolerance_ms?;
        match self.clock {
            None => Some("the store's clock is not measured yet".to_string()),
            Some(c) if c.uncertainty_ms > tolerance => Some(format!(
                "the store's clock is known within {} ms, not within the tolerance of {tolerance} ms",
                c.uncertainty_ms
            )),
            Some(_) => None,
        }
    }

    pub(super) fn store_clock_measured(&mut self, reading: ClockReading) {
        let (was_paused, before) = (self.claims_paused(), self.clock.replace(reading));
        let (offset_ms, uncertainty_ms) = (reading.offset_ms, reading.uncertainty_ms);
        match (was_paused, self.claims_paused()) {
            (Some(_), None) => info!(offset_ms, uncertainty_ms, "the store's clock is measured: claims resume"),
            (None, Some(why)) => warn!(offset_ms, uncertainty_ms, "claims wait: {why}"),
            _ => {}
        }
        // A large offset is reported (and alarmed on), not acted on: leases run on the store's clock.
        let large = |c: Option<ClockReading>| c.is_some_and(|c| c.offset_ms.unsigned_abs() > self.config.skew_ms() / 2);
        if large(Some(reading)) && !large(before) {
            warn!(
                offset_ms,
                uncertainty_ms,
                "this host's clock is off the store's by more than half the clock skew; leases run on the store's"
            );
        }
    }

    // ---- claims ----

    /// Starts a claim of `id` if it may: capacity, not ours already, within the claim limit.
    pub(super) fn try_claim(
        &mut self,
        id: &str,
        source: Source,
        from: ClaimFrom,
        listed: Option<Listed>,
    ) -> Result<(), Claim> {
        let session = self.may_claim(id, source)?;
        let session_epoch = session.as_ref().map(|s| s.epoch);
        self.tracked.insert(id.to_string(), Tracked::Claiming);
        self.run(
            Op::Claim { id: id.to_string(), listed: listed.filter(|_| session.is_some()), session },
            Pending::Claim { id: id.to_string(), source, session_epoch, from },
        );
        Ok(())
    }

    /// Whether a claim of `id` may start now, and under which session.
    pub(super) fn may_claim(&self, id: &str, source: Source) -> Result<Option<Session>, Claim> {
        if self.capacity() == 0 {
            return Err(Claim::NoCapacity);
        }
        if self.stopping {
            return Err(Claim::Stopping);
        }
        if self.tracked.contains_key(id) {
            return Err(Claim::AlreadyOurs);
        }
        if self.claims_paused().is_some() {
            return Err(Claim::ClockUntrusted);
        }
        let limited = self.balanced() && !matches!(source, Source::ReclaimOwn | Source::Stranded);
        if limited && self.tracked.len() >= self.claim_limit {
            return Err(Claim::AtLimit);
        }
        match (self.session_mode(), self.live_session()) {
            (false, _) => Ok(None),
            (true, Some(s)) => Ok(Some(s.clone())),
            (true, None) => Err(Claim::Failed),
        }
    }

    pub(super) fn claim_answered(
        &mut self,
        id: String,
        source: Source,
        session_epoch: Option<u64>,
        answer: Answer,
    ) -> Claim {
        self.tracked.remove(&id);
        let lease = match answer {
            Answer::Lease(lease) if is_fleet_work(&lease) => lease,
            Answer::Lease(lease) => {
                debug!(connection_id = %id, desired_state = ?lease.desired_state, "not running work, giving it back");
                self.run(Op::ReleaseLease { lease }, Pending::GiveBack);
                self.totals.acquire_conflicts += 1;
                return Claim::Conflict;
            }
            Answer::Failed(e) => {
                // A timeout may have landed; and work found held by this very worker, not tracked
                // here, is an earlier claim that landed unseen (its answer lost, its re-read made
                // while this claim was in flight): both are read again and given back.
                let own = matches!(&e, Error::Held { owner, .. } if *owner == self.settings.worker_id);
                if own || matches!(e, Error::Timeout { outcome_unknown: true }) {
                    self.unsettled.insert(id.clone());
                }
                return match claim_failure(&e) {
                    ClaimFailure::Conflict => {
                        debug!(connection_id = %id, source = source.as_str(), reason = %e, "claim conflict");
                        self.totals.acquire_conflicts += 1;
                        Claim::Conflict
                    }
                    ClaimFailure::Error => {
                        warn!(connection_id = %id, source = source.as_str(), error = %e, "claim failed");
                        self.totals.acquire_errors += 1;
                        Claim::Failed
                    }
                };
            }
            other => {
                warn!(connection_id = %id, answer = ?other, "unexpected answer to a claim");
                self.totals.acquire_errors += 1;
                return Claim::Failed;
            }
        };
        let upkeep = if self.session_mode() { Upkeep::Watch } else { Upkeep::Renew };
        let mut keeper = Keeper::new(&lease, upkeep, &self.config);
        if upkeep == Upkeep::Renew {
            // The phase comes from the connection and its fence, not the random source: the
            // same claim renews at the same point whoever replays it.
            let phase = crate::config::mixed_hash(id.bytes().chain(lease.fence.to_le_bytes())) as f64 / u64::MAX as f64;
            keeper.spread_first_renewal(self.now.mono_ms, phase);
        }
        let fence = lease.fence;
        let order = self.claims;
        self.claims += 1;
        // Session cover reaches claims in flight: a renewal that landed while the claim's answer
        // was on its way moves this claim's deadline too.
        let epoch_now = self.live_session().map(|s| s.epoch);
        let outlived = self.session_mode() && claim_outlived_session(session_epoch, epoch_now);
        let cover = self
            .live_session()
            .filter(|s| !outlived && moves_with_session(session_epoch, None, s))
            .map(|s| s.deadline_mono_ms)
            .filter(|d| *d > lease.deadline_mono_ms);
        // Rule 2: a claim whose answer comes after its deadline (the worker was paused while it
        // was on its way) starts no handler. It is given back (fenced: refused if another worker
        // has claimed it since), and the work is claimed again as any orphan is.
        if cover.unwrap_or(lease.deadline_mono_ms) <= self.now.mono_ms {
            warn!(connection_id = %id, fence, source = source.as_str(), "claimed past its deadline: giving it back");
            self.totals.leases_lost += 1;
            self.run(Op::ReleaseLease { lease }, Pending::GiveBack);
            return Claim::Failed;
        }
        if let Some(deadline) = cover {
            keeper.cover(deadline);
        }
        let entry = HeldEntry {
            keeper,
            keeping: true,
            renewing: None,
            session_epoch,
            fence,
            claim_order: order,
            handing_over: 0,
            reason: None,
            abort_at: None,
            ended: false,
            release_again_at: None,
            release_failures: 0,
        };
        self.tracked.insert(id.clone(), Tracked::Held(Box::new(entry)));
        self.dirty.insert(id.clone());
        self.totals.acquired += 1;
        info!(connection_id = %id, fence, source = source.as_str(), worker_id = %self.settings.worker_id, "claimed");
        self.commands.push_back(Command::StartHandler { lease });
        if let Some(deadline) = cover {
            self.commands.push_back(Command::SetDeadline { id: id.clone(), deadline_mono_ms: deadline });
        }
        if self.stopping {
            self.cancel(&id, CancelReason::Shutdown);
        }
        if outlived {
            // The session was lost (or a new epoch began) while the claim was in flight.
            self.cancel(&id, CancelReason::Deadline);
        }
        Claim::Claimed
    }

    pub(super) fn settle_answered(&mut self, id: String, answer: Answer) {
        match answer {
            Answer::Item(Some(item)) => {
                let ours = item.owner.as_deref() == Some(self.settings.worker_id.as_str());
                if ours && matches!(self.tracked.get(&id), Some(Tracked::Claiming)) {
                    // A claim of it is in flight: read it again once that one is answered.
                    self.unsettled.insert(id);
                    return;
                }
                if !ours || item.expires_at_ms == Some(0) || self.tracked.contains_key(&id) {
                    return;
                }
                let lease = Lease::from_item(item, &self.settings.worker_id, self.now.mono_ms, &self.config);
                info!(connection_id = %id, fence = lease.fence, "a claim whose answer was lost had landed: releasing");
                self.run(Op::ReleaseLease { lease }, Pending::GiveBack);
            }
            Answer::Item(None) => {}
            _ => {
                debug!(connection_id = %id, "re-read of an unknown claim failed, trying again");
                self.unsettled.insert(id);
            }
        }
    }
}
