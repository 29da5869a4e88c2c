//! Shutdown: every handler cancelled, reads in flight dropped, and the end once nothing is
//! held, the hints are settled and the session has ended.

#[allow(unused_imports)]
use super::*;

impl Engine {
    pub(super) fn shutdown(&mut self) {
        if self.stopping {
            return;
        }
        self.stopping = true;
        self.held_at_shutdown = self.held_ids();
        info!(worker_id = %self.settings.worker_id, held = self.held_at_shutdown.len(), "shutting down");
        for id in self.held_at_shutdown.clone() {
            self.cancel(&id, CancelReason::Shutdown);
        }
        // Reads in flight are not waited for.
        if matches!(self.poll, PollPhase::Page | PollPhase::Fleet(_)) {
            self.poll = PollPhase::Idle { at_mono_ms: u64::MAX };
        }
        self.pending.retain(|_, p| {
            !matches!(
                p,
                Pending::Page
                    | Pending::Fleet
                    | Pending::Owned { .. }
                    | Pending::DesiredStates
                    | Pending::Settle { .. }
            )
        });
        if let HintPhase::Idle { .. } = self.hints {
            self.hints = HintPhase::Done;
        }
    }

    pub(super) fn drive_shutdown(&mut self) {
        if !self.stopping || self.finished {
            return;
        }
        let hints_done = matches!(self.hints, HintPhase::Off | HintPhase::Done) && self.hint_batch.is_none();
        let session_done = matches!(self.session, SessionPhase::Off | SessionPhase::Ended);
        let poll_done = !matches!(self.poll, PollPhase::Claims(_));
        // Writes still in flight (releases, give-backs) are waited for by the driver.
        if self.tracked.is_empty() && hints_done && session_done && poll_done {
            self.commands.push_back(Command::EmitMetrics);
            self.finished = true;
            info!(worker_id = %self.settings.worker_id, released = self.totals.released, "worker stopped");
            self.commands.push_back(Command::Finished);
        }
    }
}
