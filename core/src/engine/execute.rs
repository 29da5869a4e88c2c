//! One executor of the engine's store requests ([`Op`]) against any [`LeaseStore`]: the tokio
//! worker runs it on the table, the fleet simulation and the fault explorer on the memory store
//! (which never waits, so `block_on` answers at once). Node maps the same requests onto the
//! protocol's machines.
//!
//! A renewal or a release of a held lease acts on the driver's holder of it (the tokio worker's
//! keeps rule 2 inside the request), so the driver runs those two; handed here they answer
//! [`Error::Lost`], as for a lease the driver has forgotten.

use super::{Answer, Op};
use crate::{Error, LeaseStore};

/// Runs `request` for the worker `owner` and answers it as the engine expects.
pub async fn execute(store: &dyn LeaseStore, owner: &str, request: Op) -> Answer {
    let answer = |r: crate::Result<Answer>| r.unwrap_or_else(Answer::Failed);
    match request {
        Op::Claim { id, session, listed } => {
            let claimed = match (session, listed) {
                (None, _) => store.acquire_started(&id, owner).await,
                (Some(session), None) => store.claim_in_session(&id, &session).await,
                (Some(session), Some(l)) => store.claim_listed_in_session(&l.item, l.epoch, &session).await,
            };
            answer(claimed.map(Answer::Lease))
        }
        Op::Renew { id, .. } | Op::Release { id } => Answer::Failed(Error::Lost { id }),
        Op::ReleaseLease { lease } => answer(store.release(&lease).await.map(|()| Answer::Done)),
        Op::Get { id } => answer(store.get(&id).await.map(Answer::Item)),
        Op::OrphansPage { cutoff_ms, page_size, first_shard } => {
            let page = match first_shard {
                Some(first) => store.orphans_page_from(cutoff_ms, page_size, first).await,
                None => store.orphans_page(cutoff_ms, page_size, None).await,
            };
            answer(page.map(|p| Answer::Orphans { full: p.next.is_some(), items: p.items }))
        }
        Op::Sessions => answer(store.sessions(u64::MAX).await.map(Answer::Sessions)),
        Op::OwnedBy { owner } => answer(store.owned_by(&owner).await.map(Answer::Owned)),
        Op::RetireSession { owner, epoch } => answer(store.retire_session(&owner, epoch).await.map(|_| Answer::Done)),
        Op::CreateSession { previous } => answer(store.create_session(owner, previous).await.map(Answer::Session)),
        Op::RenewSession { mut session, load, .. } => {
            answer(store.renew_session_reporting(&mut session, load).await.map(|()| Answer::Session(session)))
        }
        Op::EndSession { session, load } => {
            answer(store.end_session_reporting(&session, load).await.map(|()| Answer::Done))
        }
        Op::TakeOver { owner: dead, epoch, session, listed } => {
            answer(store.take_over_listed(&dead, epoch, listed, &session).await.map(Answer::TakenOver))
        }
        Op::DesiredStates { ids } => {
            answer(store.batch_desired_states(&ids).await.map(|s| Answer::DesiredStates(s.into_iter().collect())))
        }
    }
}
