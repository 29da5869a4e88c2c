//! This worker's session (session mode): opened, renewed (reporting the load), lost and ended.

#[allow(unused_imports)]
use super::*;

#[derive(Debug)]
pub(super) enum SessionPhase {
    /// Per-item mode.
    Off,
    Closed {
        retry_at_mono_ms: u64,
        failures: u32,
        previous: Option<u64>,
    },
    Opening {
        previous: Option<u64>,
        failures: u32,
    },
    Live {
        session: Session,
        renewing: bool,
    },
    Ending,
    Ended,
}

impl Engine {
    pub(super) fn session_created(&mut self, answer: Answer) {
        let SessionPhase::Opening { previous, failures } = self.session else { return };
        match answer {
            Answer::Session(session) => {
                info!(worker_id = %self.settings.worker_id, epoch = session.epoch, "session opened");
                self.cover_all(&session);
                self.session = SessionPhase::Live { session, renewing: false };
                // Work of an earlier epoch of ours is claimed back like a dead session's, listed
                // until the index has caught up with the writes of the earlier epochs.
                self.reclaim_own = true;
                self.reclaim_own_until_mono_ms = self.now.mono_ms.saturating_add(self.settings.index_lag_ms);
                self.poll_orphans_now();
            }
            Answer::Failed(e) => {
                // Our own session of an earlier run that still lives by rule 1 is waited out.
                let unit = self.unit();
                let wait = session_retry_ms(&e, failures, self.now.wall_ms, &self.config, unit);
                warn!(worker_id = %self.settings.worker_id, error = %e, wait_ms = wait, "session not opened");
                self.session = SessionPhase::Closed {
                    retry_at_mono_ms: self.now.mono_ms + wait,
                    failures: failures + 1,
                    previous,
                };
            }
            other => {
                warn!(answer = ?other, "unexpected answer to a session");
                self.session =
                    SessionPhase::Closed { retry_at_mono_ms: self.now.mono_ms, failures: failures + 1, previous };
            }
        }
    }

    pub(super) fn session_renewed(&mut self, round: u64, sent_mono_ms: u64, answer: Answer) {
        let SessionPhase::Live { session, renewing: true } = &self.session else { return };
        let epoch = session.epoch;
        match answer {
            Answer::Session(renewed) if !renewed.is_past_deadline(self.now.mono_ms) => {
                if self.session_renew_latency_ms.len() < MAX_LATENCY_SAMPLES {
                    self.session_renew_latency_ms.push(self.now.mono_ms.saturating_sub(sent_mono_ms));
                }
                self.cover_all(&renewed);
                self.session = SessionPhase::Live { session: renewed, renewing: false };
                self.start_hand_overs(round);
            }
            other => {
                let error = match other {
                    Answer::Failed(e) => e.to_string(),
                    _ => "past its deadline".to_string(),
                };
                warn!(worker_id = %self.settings.worker_id, epoch, %error, "session lost");
                self.lose_session(epoch);
            }
        }
    }

    pub(super) fn drive_session(&mut self) {
        let now = self.now.mono_ms;
        match &self.session {
            SessionPhase::Closed { retry_at_mono_ms, failures, previous } => {
                if self.stopping {
                    if self.tracked.is_empty() {
                        self.session = SessionPhase::Ended;
                    }
                    return;
                }
                if *retry_at_mono_ms <= now {
                    let (failures, previous) = (*failures, *previous);
                    self.run(Op::CreateSession { previous }, Pending::CreateSession);
                    self.session = SessionPhase::Opening { previous, failures };
                }
            }
            SessionPhase::Live { session, renewing } => {
                let session = session.clone();
                if now >= session.deadline_mono_ms {
                    warn!(worker_id = %self.settings.worker_id, epoch = session.epoch, "session past its deadline");
                    self.lose_session(session.epoch);
                    return;
                }
                if *renewing {
                    return;
                }
                if self.stopping && self.tracked.is_empty() {
                    // One write frees everything still held, then the work is hinted.
                    let load = SessionLoad {
                        held: self.held_at_shutdown.len() as u64,
                        max_connections: self.settings.max_connections as u64,
                    };
                    let (epoch, held) = (session.epoch, load.held);
                    self.run(Op::EndSession { session, load }, Pending::EndSession { epoch, held });
                    self.session = SessionPhase::Ending;
                    return;
                }
                let report = self.report_due_at().is_some_and(|at| at <= now);
                if now >= session_wake_at(&session, &self.config) || self.renew_session_now || report {
                    self.renew_session_now = false;
                    (self.reported_tracked, self.report_sent_mono_ms) = (self.tracked.len(), now);
                    // The round first: a pick made after the load was read waits for the next renewal.
                    let round = self.hand_over_rounds;
                    let load = self.load();
                    let until_mono_ms = session.deadline_mono_ms;
                    self.run(
                        Op::RenewSession { session, load, until_mono_ms },
                        Pending::RenewSession { round, sent_mono_ms: now },
                    );
                    if let SessionPhase::Live { renewing, .. } = &mut self.session {
                        *renewing = true;
                    }
                }
            }
            _ => {}
        }
    }
}
