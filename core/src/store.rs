//! The store interface every backend implements with the same semantics.

use std::collections::HashMap;

use crate::{Clock, DesiredState, Lease, LeaseItem, Result, Session, SessionItem, SessionLoad, TableConfig};

/// `Send + Sync` on native targets; nothing on wasm, where JavaScript promises are not `Send`.
#[cfg(not(target_arch = "wasm32"))]
pub trait MaybeSendSync: Send + Sync {}
#[cfg(not(target_arch = "wasm32"))]
impl<T: Send + Sync + ?Sized> MaybeSendSync for T {}
#[cfg(target_arch = "wasm32")]
pub trait MaybeSendSync {}
#[cfg(target_arch = "wasm32")]
impl<T: ?Sized> MaybeSendSync for T {}

/// Where to resume an orphan listing.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OrphanCursor {
    /// The stored key (with the prefix) of the last item returned.
    pub key: String,
    pub expires_at_ms: u64,
    /// The orphan shard of that item (0 without sharding; see [`crate::TableConfig::orphan_shards`]).
    #[serde(default)]
    pub shard: u32,
}

/// One page of orphans, oldest expiry first.
#[derive(Debug, Clone, Default)]
pub struct OrphanPage {
    pub items: Vec<LeaseItem>,
    pub next: Option<OrphanCursor>,
}

/// Where a sweep for stranded work goes on: the stored key (with the prefix) of the last item a
/// call evaluated.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SweepCursor {
    pub key: String,
}

/// What one call of a sweep for stranded work found (see [`LeaseStore::stranded_page`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StrandedPage {
    /// The stranded connections' ids, sorted.
    pub ids: Vec<String>,
    /// Items the call read (the sweep's cost follows it, whatever was kept).
    pub scanned: u64,
    /// Where the next call goes on; `None` once the whole table was read.
    pub next: Option<SweepCursor>,
}

/// Lease operations over one table. Ids are given without the key prefix.
#[cfg_attr(not(target_arch = "wasm32"), async_trait::async_trait)]
#[cfg_attr(target_arch = "wasm32", async_trait::async_trait(?Send))]
pub trait LeaseStore: MaybeSendSync {
    fn config(&self) -> &TableConfig;
    fn clock(&self) -> &dyn Clock;

    /// Whether leases on this store can be exclusive, asked once before a process claims (a
    /// worker's start, an elector's, a held lease's first claim). A DynamoDB table must be
    /// single-Region or a global table in multi-Region strong consistency (see
    /// [`crate::protocol::CheckTable`]): it is described once per table object and the answer
    /// kept. Other stores have nothing to check.
    async fn check_table(&self) -> Result<()> {
        Ok(())
    }

    /// Measures the store's clock until it is known within `within_ms` (a few cheap requests,
    /// each sent to narrow it most; at most a few seconds), for a process about to claim. A
    /// store whose clock is the process's own has nothing to measure.
    async fn measure_clock(&self, within_ms: u64) {
        let _ = within_ms;
    }

    /// Sets `desired_state = STARTED` and the url; owner, fence and last_seq are untouched.
    async fn start(&self, id: &str, url: &str) -> Result<LeaseItem>;
    /// Sets `desired_state = STOPPED` (and the cleanup TTL). `NotFound` if the id has no item.
    async fn stop(&self, id: &str) -> Result<LeaseItem>;
    /// Claims the lease if nobody holds it; `Held` names the holder, `Stopped` refuses stopped work.
    async fn acquire(&self, id: &str, owner: &str) -> Result<Lease>;
    /// The fleet's claim: like [`LeaseStore::acquire`], but only of an item that exists and whose
    /// desired state is STARTED. `NotFound` when the id has no item or no desired state,
    /// `Stopped` when it is STOPPED; nothing is written then (a hint with a typo creates nothing).
    ///
    /// The default reads first and then claims; the stores make it one conditional write.
    async fn acquire_started(&self, id: &str, owner: &str) -> Result<Lease> {
        match self.get(id).await? {
            None => Err(crate::Error::NotFound { id: id.to_string() }),
            Some(item) => match item.desired_state {
                None => Err(crate::Error::NotFound { id: id.to_string() }),
                Some(DesiredState::Stopped) => Err(crate::Error::Stopped { id: id.to_string() }),
                Some(DesiredState::Started) => self.acquire(id, owner).await,
            },
        }
    }
    /// Extends the lease; `Lost` if it is no longer ours or our deadline has passed.
    async fn renew(&self, lease: &mut Lease) -> Result<()>;
    /// Gives the lease up at once (expiry 0); `Lost` if it was no longer ours.
    async fn release(&self, lease: &Lease) -> Result<()>;
    /// Records the last processed sequence number; it only moves forward.
    async fn checkpoint(&self, lease: &mut Lease, seq: u64) -> Result<()>;
    /// A strongly consistent read.
    async fn get(&self, id: &str) -> Result<Option<LeaseItem>>;
    /// The desired state of every id (`None` for ids without an item or without a state).
    async fn batch_desired_states(&self, ids: &[String]) -> Result<HashMap<String, Option<DesiredState>>>;
    /// STARTED items whose expiry is below `cutoff_ms`, oldest first, `page_size` at a time.
    async fn orphans_page(&self, cutoff_ms: u64, page_size: usize, after: Option<OrphanCursor>) -> Result<OrphanPage>;
    /// The first page of [`LeaseStore::orphans_page`], reading orphan shard `first_shard`
    /// (modulo [`crate::TableConfig::orphan_shards`]) first instead of the one the cutoff picks,
    /// then the others in turn: workers polling at one moment spread their claims over the
    /// shards. One page: a cursor from it goes on as `orphans_page` would. A store without it
    /// starts where the cutoff says.
    async fn orphans_page_from(&self, cutoff_ms: u64, page_size: usize, first_shard: u32) -> Result<OrphanPage> {
        let _ = first_shard;
        self.orphans_page(cutoff_ms, page_size, None).await
    }
    /// Items whose lease `owner` holds now.
    async fn owned_by(&self, owner: &str) -> Result<Vec<LeaseItem>>;
    /// Every item under the key prefix (operators' listings).
    async fn items(&self) -> Result<Vec<LeaseItem>>;

    /// Session mode: a new epoch of `owner`'s session. `Held` while a session of `owner` lives
    /// by rule 1, unless it is the epoch `previous` this worker held and stopped acting for.
    async fn create_session(&self, owner: &str, previous: Option<u64>) -> Result<Session> {
        let _ = (owner, previous);
        Err(unsupported())
    }
    /// Extends the session; `Lost` once it is not this epoch any more or the deadline passed.
    async fn renew_session(&self, session: &mut Session) -> Result<()> {
        let _ = session;
        Err(unsupported())
    }
    /// [`LeaseStore::renew_session`] that also records `load` on the session item, in the same
    /// write, for the fleet's balance. A store without it renews without reporting.
    async fn renew_session_reporting(&self, session: &mut Session, load: SessionLoad) -> Result<()> {
        let _ = load;
        self.renew_session(session).await
    }
    /// Ends the session (expiry 0): every connection held under it is free for the fleet.
    async fn end_session(&self, session: &Session) -> Result<()> {
        let _ = session;
        Err(unsupported())
    }
    /// [`LeaseStore::end_session`] that also records `load`, what the end frees, on the session
    /// item in the same write. A store without it ends without reporting.
    async fn end_session_reporting(&self, session: &Session, load: SessionLoad) -> Result<()> {
        let _ = load;
        self.end_session(session).await
    }
    /// Takes a dead session without connections out of the session listing; `false` when it
    /// was not dead (renewed, or a new epoch).
    async fn retire_session(&self, owner: &str, epoch: u64) -> Result<bool> {
        let _ = (owner, epoch);
        Err(unsupported())
    }
    /// Session mode's claim of STARTED work: unowned work, or the work of a dead session (one
    /// transaction checking that session). `Held` while the holder's session lives.
    async fn claim_in_session(&self, id: &str, session: &Session) -> Result<Lease> {
        let _ = (id, session);
        Err(unsupported())
    }
    /// [`LeaseStore::claim_in_session`] of work read under the dead session `epoch` of
    /// `listed.owner` (the owner index's answer): a store whose claim would first try the work as
    /// unowned sends the takeover at once. Same outcomes as `claim_in_session`.
    async fn claim_listed_in_session(&self, listed: &LeaseItem, epoch: u64, session: &Session) -> Result<Lease> {
        let _ = epoch;
        self.claim_in_session(&listed.id, session).await
    }
    /// Several connections listed under the dead session `epoch` of `owner`, taken over at once
    /// ([`crate::protocol::TakeOverListed`]: one transaction for all of them): per listed item,
    /// the lease, or `None` where the item is left to [`LeaseStore::claim_listed_in_session`].
    /// A store without it leaves them all.
    async fn take_over_listed(
        &self,
        owner: &str,
        epoch: u64,
        listed: Vec<LeaseItem>,
        session: &Session,
    ) -> Result<Vec<Option<Lease>>> {
        let _ = (owner, epoch, session);
        Ok(vec![None; listed.len()])
    }
    /// Session items whose expiry is below `below_ms` (a claim cutoff: the dead ones; `u64::MAX`:
    /// all), oldest first.
    async fn sessions(&self, below_ms: u64) -> Result<Vec<SessionItem>> {
        let _ = below_ms;
        Err(unsupported())
    }

    /// Session mode's backstop, which never reads an index: the STARTED connections held under
    /// a session (the held sentinel, an owner and an epoch) whose owner's session item is gone,
    /// is of another epoch, or is dead by rule 1 for longer than `grace_ms` (expiry below
    /// `now - clock_skew - grace_ms`). Work the survivors never list (the owner index lagged past
    /// their wait, and the session was retired) is found here; a hint for it lets any worker
    /// take it over. One part of a consistent read of the whole table: from `after` (the start
    /// when `None`), at most `max_items` items read (`u64::MAX`: to the end).
    async fn stranded_page(&self, grace_ms: u64, after: Option<SweepCursor>, max_items: u64) -> Result<StrandedPage> {
        let _ = (grace_ms, after, max_items);
        Err(unsupported())
    }

    /// [`LeaseStore::stranded_page`] over the whole table: every stranded id, sorted.
    async fn stranded(&self, grace_ms: u64) -> Result<Vec<String>> {
        let mut ids = Vec::new();
        let mut after = None;
        loop {
            let page = self.stranded_page(grace_ms, after, u64::MAX).await?;
            ids.extend(page.ids);
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        ids.sort();
        ids.dedup();
        Ok(ids)
    }

    /// All orphans below `cutoff_ms`, up to `limit`, across pages.
    async fn orphans(&self, cutoff_ms: u64, limit: Option<usize>) -> Result<Vec<LeaseItem>> {
        let mut out = Vec::new();
        let mut after = None;
        loop {
            let want = limit.map(|l| l - out.len()).unwrap_or(usize::MAX).min(1000);
            let page = self.orphans_page(cutoff_ms, want, after).await?;
            out.extend(page.items);
            match page.next {
                Some(next) if limit.is_none_or(|l| out.len() < l) => after = Some(next),
                _ => break,
            }
        }
        if let Some(l) = limit {
            out.truncate(l);
        }
        Ok(out)
    }
}

fn unsupported() -> crate::Error {
    crate::Error::Store("this store has no session mode".into())
}

/// Validates a batch of ids and drops repeats, keeping the first order.
pub(crate) fn unique_ids(ids: &[String]) -> Result<Vec<&str>> {
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        crate::config::validate_id("id", id)?;
        if seen.insert(id.as_str()) {
            out.push(id.as_str());
        }
    }
    Ok(out)
}
