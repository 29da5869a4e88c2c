//! What each operation in flight was for, and its answer handed to the room that handles it.

#[allow(unused_imports)]
use super::*;

/// What an operation in flight was for.
#[derive(Debug)]
pub(super) enum Pending {
    Claim {
        id: String,
        source: Source,
        session_epoch: Option<u64>,
        from: ClaimFrom,
    },
    Renew {
        id: String,
    },
    Release {
        id: String,
    },
    GiveBack,
    Settle {
        id: String,
    },
    Page,
    Fleet,
    Owned {
        owner: String,
        epoch: Option<u64>,
    },
    Retire,
    CreateSession,
    RenewSession {
        round: u64,
        sent_mono_ms: u64,
    },
    EndSession {
        epoch: u64,
        held: u64,
    },
    /// The item of a hint whose session has ended, read before its takeover (the hint batch's
    /// message `index`; the ended session `(owner, epoch)`).
    EndedRead {
        id: String,
        index: usize,
        owner: String,
        epoch: u64,
    },
    DesiredStates,
    RefreshLimit,
    /// An [`Op::TakeOver`]: the claims it carries (each pending on its own) and their requests.
    TakeOver {
        claims: Vec<(OpId, Op)>,
    },
}

impl Engine {
    pub(super) fn answered(&mut self, op: OpId, pending: Pending, answer: Answer) {
        match pending {
            Pending::TakeOver { claims } => self.taken_over(claims, answer),
            Pending::Claim { id, source, session_epoch, from } => {
                let outcome = self.claim_answered(id.clone(), source, session_epoch, answer);
                self.claim_done(&id, source, from, outcome);
            }
            Pending::Renew { id } => self.renewed(op, &id, answer),
            Pending::Release { id } => {
                let reason = match self.tracked.get(&id) {
                    Some(Tracked::Held(h)) => h.reason,
                    _ => None,
                };
                match answer {
                    Answer::Done => {
                        self.totals.released += 1;
                        info!(connection_id = %id, reason = ?reason, "released");
                        if reason == Some(CancelReason::HandOver) {
                            self.totals.handed_over += 1;
                        }
                        let hinted = matches!(reason, Some(CancelReason::Shutdown | CancelReason::HandOver));
                        if hinted && self.settings.hints {
                            self.commands.push_back(Command::SendHint { id: id.clone(), ended: None });
                        }
                    }
                    Answer::Failed(Error::Lost { .. }) => {
                        debug!(connection_id = %id, "already taken over; nothing to release")
                    }
                    Answer::Failed(e) if self.release_again(&id) => {
                        warn!(connection_id = %id, error = %e, "release failed; sent again shortly");
                        return;
                    }
                    Answer::Failed(e) => {
                        warn!(connection_id = %id, error = %e, "release failed; the lease will expire")
                    }
                    other => warn!(connection_id = %id, answer = ?other, "unexpected answer to a release"),
                }
                self.forget(&id);
            }
            Pending::GiveBack => {
                if let Answer::Failed(e) = answer {
                    warn!(error = %e, "release of non-running work failed");
                }
            }
            Pending::Settle { id } => self.settle_answered(id, answer),
            Pending::Page => self.page_answered(answer),
            Pending::Fleet => self.fleet_answered(answer),
            Pending::Owned { owner, epoch } => self.owned_answered(owner, epoch, answer),
            Pending::Retire => {
                if let Answer::Failed(e) = answer {
                    debug!(error = %e, "retiring a dead session failed");
                }
            }
            Pending::CreateSession => self.session_created(answer),
            Pending::RenewSession { round, sent_mono_ms } => self.session_renewed(round, sent_mono_ms, answer),
            Pending::EndSession { epoch, held } => {
                // Hints of work under a session that has ended say so: the receivers take it
                // over as they read it, with no read of the fleet's sessions.
                let ended = match answer {
                    Answer::Done => {
                        info!(worker_id = %self.settings.worker_id, "session ended");
                        Some(crate::EndedSession { owner: self.settings.worker_id.clone(), epoch, held })
                    }
                    Answer::Failed(e) => {
                        warn!(worker_id = %self.settings.worker_id, error = %e, "session end failed; it will expire");
                        None
                    }
                    _ => None,
                };
                if self.settings.hints {
                    for id in std::mem::take(&mut self.held_at_shutdown) {
                        self.commands.push_back(Command::SendHint { id, ended: ended.clone() });
                    }
                }
                self.session = SessionPhase::Ended;
            }
            Pending::EndedRead { id, index, owner, epoch } => self.ended_read(id, index, owner, epoch, answer),
            Pending::DesiredStates => {
                self.desired_in_flight = false;
                match answer {
                    Answer::DesiredStates(states) => {
                        let states: HashMap<_, _> = states.into_iter().collect();
                        for id in stopped_ids(&states) {
                            if self.cancel(&id, CancelReason::Stopped) {
                                info!(connection_id = %id, "stopped");
                            }
                        }
                    }
                    Answer::Failed(e) => warn!(error = %e, "desired-state check failed"),
                    _ => {}
                }
            }
            Pending::RefreshLimit => {
                if let Answer::Sessions(sessions) = answer {
                    let pace = self.pace_ms();
                    let me = self.load();
                    let hinted = self.hint_batch.as_ref().map_or(0, |batch| batch.hinted);
                    let limit = self.balancer.refreshed_limit(
                        &sessions,
                        &self.settings.worker_id,
                        me,
                        hinted,
                        self.now.wall_ms,
                        &self.config,
                        pace,
                    );
                    self.claim_limit = self.claim_limit.max(limit as usize);
                    self.last_sessions = sessions;
                }
                if let Some(batch) = &mut self.hint_batch {
                    batch.refresh_until = None;
                }
            }
        }
    }
}
