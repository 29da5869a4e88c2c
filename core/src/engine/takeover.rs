//! Dead-session takeover: which survivor takes which of a dead session's connections
//! (rendezvous ranking, the assignment over the survivors' rooms), and the claims of one dead
//! session started together, sent as one transaction ([`Op::TakeOver`]).

#[allow(unused_imports)]
use super::*;

/// A dead session (or an older epoch of ours, `epoch` `None`) and its connections not tracked here.
#[derive(Debug)]
pub(super) struct DeadSession {
    pub(super) owner: String,
    pub(super) epoch: Option<u64>,
    pub(super) listed: usize,
    pub(super) ids: Vec<String>,
}

/// Where a dead session's connection `id` stands in the claims of worker `me`, by rendezvous
/// hashing over the live workers `owners` (every worker reading the same sessions ranks alike):
/// first the connections `me` weighs highest for, heaviest first; then those another worker
/// weighs highest for, lightest first. That worker starts from the other end of the same list,
/// so two survivors meet on a connection only when both go past their own.
/// With `assigned` (from [`takeover_assignment`]), the connections assigned to `me` come first
/// instead of those it weighs highest for.
pub(super) fn claim_rank(owners: &[String], me: &str, id: &str, assigned: Option<bool>) -> (bool, u64) {
    match (owners.iter().max_by_key(|o| (rendezvous_weight(o, id), *o)), assigned) {
        (_, Some(true)) => (false, u64::MAX - rendezvous_weight(me, id)),
        (Some(winner), None) if winner == me => (false, u64::MAX - rendezvous_weight(me, id)),
        (Some(winner), _) => (true, rendezvous_weight(winner, id)),
        (None, _) => (true, 0),
    }
}

pub(super) fn rendezvous_weight(owner: &str, id: &str) -> u64 {
    crate::config::mixed_hash(owner.bytes().chain([0]).chain(id.bytes()))
}

/// Which of the dead sessions' connections `ids` worker `me` takes: each, in an order fixed by
/// its id, goes to the live worker rendezvous hashing weighs highest for it among those with
/// room left below the fair level of the listed loads. Every survivor reading the same listing
/// assigns alike, so a crash's work is taken in one round: ranked by weight alone, a survivor's
/// picks past its room were left to the next round's listing, round after round. `None` when a
/// live session has not reported its load (the plain ranking then).
pub(super) fn takeover_assignment(
    me: &str,
    loads: &[(String, Option<SessionLoad>)],
    ids: &[&String],
) -> Option<std::collections::HashSet<String>> {
    let loads: Vec<(&String, SessionLoad)> = loads.iter().map(|(o, l)| l.map(|l| (o, l))).collect::<Option<_>>()?;
    if !loads.iter().any(|(o, _)| o.as_str() == me) {
        return None;
    }
    let caps: Vec<u64> = loads.iter().map(|(_, l)| l.max_connections).collect();
    let work = loads.iter().map(|(_, l)| l.held).sum::<u64>() + ids.len() as u64;
    let level = decide::fair_level(work, &caps);
    let mut room: Vec<u64> = loads.iter().map(|(_, l)| l.max_connections.min(level).saturating_sub(l.held)).collect();
    let mut order: Vec<&String> = ids.to_vec();
    order.sort_by_cached_key(|id| (crate::config::mixed_hash(id.bytes()), *id));
    order.dedup();
    let mut mine = std::collections::HashSet::new();
    for id in order {
        let pick =
            (0..loads.len()).filter(|k| room[*k] > 0).max_by_key(|k| (rendezvous_weight(loads[*k].0, id), loads[*k].0));
        let Some(k) = pick else { break };
        room[k] -= 1;
        if loads[k].0.as_str() == me {
            mine.insert(id.clone());
        }
    }
    Some(mine)
}

/// The work a dead session leaves to the fleet, in balance terms: what its owner last reported
/// less what this worker has claimed of it, and never less than what is still listed under it.
/// A peer that claimed some of it reports them only at its next renewal; counting only what is
/// still listed would shrink the fleet's work until then, and the survivors' shares with it.
/// `taken` is how many of it this worker has claimed so far (they count in its own load).
pub(super) fn dead_work(dead: &DeadSession, sessions: &[SessionItem], taken: u64) -> u64 {
    let unclaimed = dead.ids.len() as u64;
    let claiming = (dead.listed - dead.ids.len()) as u64;
    let reported = dead
        .epoch
        .and_then(|epoch| sessions.iter().find(|s| s.owner == dead.owner && s.epoch == epoch))
        .and_then(|s| s.load)
        .map_or(0, |l| l.held.saturating_sub(claiming + taken));
    unclaimed.max(reported)
}

impl Engine {
    /// Sends the takeovers started in this step: those of one dead session (and one session
    /// of ours) as [`Op::TakeOver`]s of up to [`crate::protocol::TAKE_OVER_MAX`] (one check of
    /// the dead session's item for all of them, a partition value every survivor's takeovers
    /// share); a lone one as its claim.
    pub(super) fn send_takeovers(&mut self) {
        // By (dead owner, its epoch, our epoch): our session and the claims.
        type Claims = (Session, Vec<(OpId, Op)>);
        let mut groups: BTreeMap<(String, u64, u64), Claims> = BTreeMap::new();
        for (op, request) in std::mem::take(&mut self.takeovers) {
            let Op::Claim { session: Some(s), listed: Some(l), .. } = &request else { continue };
            let key = (l.item.owner.clone().unwrap_or_default(), l.epoch, s.epoch);
            groups.entry(key).or_insert_with(|| (s.clone(), Vec::new())).1.push((op, request));
        }
        for ((owner, epoch, _), (session, claims)) in groups {
            for chunk in claims.chunks(crate::protocol::TAKE_OVER_MAX) {
                if let [(op, request)] = chunk {
                    self.commands.push_back(Command::Run { op: *op, request: request.clone() });
                    continue;
                }
                let listed = chunk
                    .iter()
                    .filter_map(|(_, r)| match r {
                        Op::Claim { listed: Some(l), .. } => Some(l.item.clone()),
                        _ => None,
                    })
                    .collect();
                let request = Op::TakeOver { owner: owner.clone(), epoch, session: session.clone(), listed };
                self.run(request, Pending::TakeOver { claims: chunk.to_vec() });
            }
        }
    }

    /// A takeover transaction's answer: each connection taken is its claim's answer; each it
    /// left (changed since the listing: the item decides) is claimed on its own. A transaction
    /// that failed (throttled or unanswered past its budget) fails each of its claims alike.
    pub(super) fn taken_over(&mut self, claims: Vec<(OpId, Op)>, answer: Answer) {
        let taken = match answer {
            Answer::TakenOver(taken) if taken.len() == claims.len() => {
                self.totals.takeover_transactions += 1;
                taken
            }
            Answer::Failed(e) => {
                debug!(error = %e, connections = claims.len(), "takeover transaction failed");
                for (op, _) in claims {
                    if let Some(pending) = self.pending.remove(&op) {
                        self.answered(op, pending, Answer::Failed(e.clone()));
                    }
                }
                return;
            }
            other => {
                warn!(answer = ?other, "unexpected answer to a takeover; claiming each connection on its own");
                vec![None; claims.len()]
            }
        };
        for ((op, request), lease) in claims.into_iter().zip(taken) {
            match lease {
                Some(lease) => {
                    if let Some(pending) = self.pending.remove(&op) {
                        self.answered(op, pending, Answer::Lease(lease));
                    }
                }
                None => self.commands.push_back(Command::Run { op, request }),
            }
        }
    }
}
