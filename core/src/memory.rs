//! An in-memory store with exactly the DynamoDB store's semantics and an injectable clock, for
//! tests, simulations and the wasm build.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::ops::Bound;
use std::sync::{Arc, Mutex};

use crate::config::{orphan_shard_of, validate_id, validate_url};
use crate::lease::{claim_cutoff, deadline, expiry_for, holds, holds_unreleased, HELD_UNDER_SESSION_MS};
use crate::store::{unique_ids, OrphanCursor, OrphanPage, StrandedPage, SweepCursor};
use crate::{
    Clock, DesiredState, Error, Lease, LeaseItem, LeaseStore, Result, Session, SessionItem, SessionLoad, TableConfig,
};

/// See the module docs. Clones and [`MemoryStore::with_clock`] handles share one table.
#[derive(Debug, Clone)]
pub struct MemoryStore {
    config: TableConfig,
    clock: Arc<dyn Clock>,
    items: Arc<Mutex<Table>>,
    sessions: Arc<Mutex<SessionState>>,
}

/// The items by stored key (listed in key order), and the two secondary indexes kept beside them as DynamoDB keeps its
/// GSIs: every write goes through [`Table::update`], which takes the item's old entries out of
/// the indexes and puts its new ones in, so a query reads only the entries it returns
/// (O(log n + page)) instead of scanning the items.
#[derive(Debug, Default)]
struct Table {
    items: HashMap<String, LeaseItem>,
    /// The orphan index (sparse on `desired_state`): STARTED items by (orphan shard, expiry,
    /// key), a missing expiry counted as 0; the shard is 0 unless the table is sharded.
    orphans: BTreeSet<(u32, u64, String)>,
    /// How many orphan shards (`TableConfig::orphan_shards`).
    shards: u32,
    /// The owner index (sparse on `lease_owner`): (owner, key).
    owners: BTreeSet<(String, String)>,
    /// With [`MemoryStore::set_index_lag_ms`]: the orphan index (the session listing with it)
    /// and the owner index lag behind the items, each by its own time, as DynamoDB's global
    /// secondary indexes do.
    orphan_lag: Option<Lagged>,
    owner_lag: Option<Lagged>,
}

/// The store's two indexes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Index {
    /// The sparse orphan index on `desired_state` (and the session listing, its session partition).
    Orphan,
    /// The owner index on `lease_owner`.
    Owner,
}

/// Indexes that answer as they were `ms` ago: a write reaches them `ms` after it was applied
/// to the item. Until then a query finds the item where it was, with its old values; a new item
/// is not there yet, a deleted one still is.
#[derive(Debug, Default)]
struct Lagged {
    ms: u64,
    /// The items as the indexes see them (what a query returns).
    seen: HashMap<String, LeaseItem>,
    /// Writes not yet in the indexes, in order: (when they reach them, key, the item after).
    pending: VecDeque<(u64, String, Option<LeaseItem>)>,
}

impl Table {
    fn get(&self, key: &str) -> Option<&LeaseItem> {
        self.items.get(key)
    }

    fn orphan_entry(&self, key: &str, item: &LeaseItem) -> Option<(u32, u64, String)> {
        (item.desired_state == Some(DesiredState::Started))
            .then(|| (orphan_shard_of(&item.id, self.shards), item.expires_at_ms.unwrap_or(0), key.to_string()))
    }

    fn owner_entry(key: &str, item: &LeaseItem) -> Option<(String, String)> {
        item.owner.as_ref().map(|owner| (owner.clone(), key.to_string()))
    }

    /// Runs `f` on the item at `key` (`None`: there is none; left `None`: there is none after),
    /// keeping the indexes in step with what it leaves (at once, or as each lags after `now_ms`).
    fn update<T>(&mut self, key: &str, now_ms: u64, f: impl FnOnce(&mut Option<LeaseItem>) -> T) -> T {
        let mut slot = self.items.remove(key);
        let before = slot.clone();
        let out = f(&mut slot);
        for index in [Index::Orphan, Index::Owner] {
            match self.lag_mut(index) {
                Some(lag) => lag.pending.push_back((now_ms.saturating_add(lag.ms), key.to_string(), slot.clone())),
                None => self.reindex(index, key, before.as_ref(), slot.as_ref()),
            }
        }
        if let Some(item) = slot {
            self.items.insert(key.to_string(), item);
        }
        out
    }

    fn lag_mut(&mut self, index: Index) -> Option<&mut Lagged> {
        match index {
            Index::Orphan => self.orphan_lag.as_mut(),
            Index::Owner => self.owner_lag.as_mut(),
        }
    }

    /// Moves the entry of `key` in `index` from what `before` gives to what `after` gives.
    fn reindex(&mut self, index: Index, key: &str, before: Option<&LeaseItem>, after: Option<&LeaseItem>) {
        match index {
            Index::Orphan => {
                let was = before.and_then(|i| self.orphan_entry(key, i));
                let is = after.and_then(|i| self.orphan_entry(key, i));
                if was != is {
                    was.map(|e| self.orphans.remove(&e));
                    is.map(|e| self.orphans.insert(e));
                }
            }
            Index::Owner => {
                let was = before.and_then(|i| Self::owner_entry(key, i));
                let is = after.and_then(|i| Self::owner_entry(key, i));
                if was != is {
                    was.map(|e| self.owners.remove(&e));
                    is.map(|e| self.owners.insert(e));
                }
            }
        }
    }

    /// Lets the writes made `lag` ms before `now_ms` reach the lagging indexes.
    fn catch_up(&mut self, now_ms: u64) {
        for index in [Index::Orphan, Index::Owner] {
            while let Some(lag) = self.lag_mut(index) {
                if lag.pending.front().is_none_or(|(at, ..)| *at > now_ms) {
                    break;
                }
                let Some((_, key, after)) = lag.pending.pop_front() else { break };
                let before = lag.seen.remove(&key);
                if let Some(item) = &after {
                    lag.seen.insert(key.clone(), item.clone());
                }
                self.reindex(index, &key, before.as_ref(), after.as_ref());
            }
        }
    }

    /// The item at `key` as `index` sees it.
    fn indexed(&self, index: Index, key: &str) -> Option<&LeaseItem> {
        let lag = match index {
            Index::Orphan => &self.orphan_lag,
            Index::Owner => &self.owner_lag,
        };
        match lag {
            Some(lag) => lag.seen.get(key),
            None => self.items.get(key),
        }
    }

    fn set_lag(&mut self, index: Index, ms: u64) {
        if ms == 0 {
            // Up to date, and kept so.
            if let Some(mut lag) = match index {
                Index::Orphan => self.orphan_lag.take(),
                Index::Owner => self.owner_lag.take(),
            } {
                for (_, key, after) in lag.pending.drain(..) {
                    let before = lag.seen.remove(&key);
                    if let Some(item) = &after {
                        lag.seen.insert(key.clone(), item.clone());
                    }
                    self.reindex(index, &key, before.as_ref(), after.as_ref());
                }
            }
        } else if let Some(lag) = self.lag_mut(index) {
            lag.ms = ms;
        } else {
            let lag = Lagged { ms, seen: self.items.clone(), pending: VecDeque::new() };
            match index {
                Index::Orphan => self.orphan_lag = Some(lag),
                Index::Owner => self.owner_lag = Some(lag),
            }
        }
    }
}

/// What session mode keeps beside the items: the session epoch each held connection records,
/// and which session items are listed (in the session partition).
#[derive(Debug, Default)]
struct SessionState {
    epochs: BTreeMap<String, u64>,
    listed: BTreeSet<String>,
    /// What each session item reported at its last renewal that reported.
    loads: BTreeMap<String, SessionLoad>,
}

impl MemoryStore {
    pub fn new(config: TableConfig, clock: Arc<dyn Clock>) -> Result<Self> {
        config.validate()?;
        let table = Table { shards: config.orphan_shards, ..Table::default() };
        Ok(Self { config, clock, items: Arc::new(Mutex::new(table)), sessions: Arc::default() })
    }

    /// Makes both indexes answer as they were `ms` ago ([`MemoryStore::set_lag_of`]).
    pub fn set_index_lag_ms(&self, ms: u64) {
        self.set_lag_of(Index::Orphan, ms);
        self.set_lag_of(Index::Owner, ms);
    }

    /// Makes `index` answer as it was `ms` ago, on the store's clock, as DynamoDB's global
    /// secondary indexes may: a write reaches it `ms` after it was applied. Until then a query
    /// finds the item where it was, with its old values; a new item is not there yet, a deleted
    /// one still is. Item reads stay consistent. 0 (the default) brings it up to date and keeps
    /// it so. Applies to every handle on these items.
    pub fn set_lag_of(&self, index: Index, ms: u64) {
        self.items.lock().expect("memory store poisoned").set_lag(index, ms);
    }

    /// Another handle on the same items, seeing time through `clock` (a worker with its own clock).
    pub fn with_clock(&self, clock: Arc<dyn Clock>) -> Self {
        Self { clock, ..self.clone() }
    }

    fn with_item<T>(&self, id: &str, f: impl FnOnce(&mut Option<LeaseItem>) -> Result<T>) -> Result<T> {
        let key = self.config.key(id);
        self.items.lock().expect("memory store poisoned").update(&key, self.clock.now_ms(), f)
    }

    /// A claim; `started_only` refuses ids without an item or a desired state (creating nothing).
    fn claim(&self, id: &str, owner: &str, started_only: bool) -> Result<Lease> {
        validate_id("id", id)?;
        validate_id("owner", owner)?;
        let now = self.clock.now_ms();
        let sent = self.clock.monotonic_ms();
        let cutoff = claim_cutoff(now, &self.config);
        self.with_item(id, |slot| {
            let not_found = || Error::NotFound { id: id.to_string() };
            if started_only && slot.as_ref().is_none_or(|i| i.desired_state.is_none()) {
                if let Some(exp) = slot.as_ref().and_then(|i| i.expires_at_ms).filter(|&exp| exp >= cutoff) {
                    let owner = slot.as_ref().and_then(|i| i.owner.clone()).unwrap_or_default();
                    return Err(Error::Held { owner, expires_at_ms: exp });
                }
                return Err(not_found());
            }
            let item = slot.get_or_insert_with(|| LeaseItem { id: id.to_string(), ..Default::default() });
            if item.desired_state == Some(DesiredState::Stopped) {
                return Err(Error::Stopped { id: id.to_string() });
            }
            if let Some(exp) = item.expires_at_ms.filter(|&exp| exp >= cutoff) {
                let owner = item.owner.clone().unwrap_or_default();
                return Err(Error::Held { owner, expires_at_ms: exp });
            }
            item.owner = Some(owner.to_string());
            item.expires_at_ms = Some(expiry_for(now, &self.config));
            item.fence += 1;
            Ok(Lease::from_item(item.clone(), owner, sent, &self.config))
        })
    }

    fn session_lost(&self, owner: &str) -> Error {
        Error::Lost { id: self.config.session_id(owner) }
    }

    fn end_session_with(&self, session: &Session, load: Option<SessionLoad>) -> Result<()> {
        let key = self.config.key(&self.config.session_id(&session.owner));
        let mut items = self.items.lock().expect("memory store poisoned");
        items.update(&key, self.clock.now_ms(), |slot| match slot {
            Some(item) if item.fence == session.epoch => {
                item.expires_at_ms = Some(0);
                if let Some(load) = load {
                    self.sessions.lock().expect("memory store poisoned").loads.insert(key.clone(), load);
                }
                Ok(())
            }
            _ => Err(self.session_lost(&session.owner)),
        })
    }

    fn renew_session_with(&self, session: &mut Session, load: Option<SessionLoad>) -> Result<()> {
        let now = self.clock.now_ms();
        let sent = self.clock.monotonic_ms();
        if session.is_past_deadline(sent) {
            return Err(self.session_lost(&session.owner));
        }
        let key = self.config.key(&self.config.session_id(&session.owner));
        let mut items = self.items.lock().expect("memory store poisoned");
        items.update(&key, self.clock.now_ms(), |slot| match slot {
            Some(item) if item.fence == session.epoch && item.expires_at_ms != Some(0) => {
                item.expires_at_ms = Some(expiry_for(now, &self.config));
                if let Some(load) = load {
                    self.sessions.lock().expect("memory store poisoned").loads.insert(key.clone(), load);
                }
                session.expires_at_ms = expiry_for(now, &self.config);
                session.deadline_mono_ms = deadline(sent, &self.config);
                Ok(())
            }
            _ => Err(self.session_lost(&session.owner)),
        })
    }

    /// The session item of `owner` and whether it is listed; `None` when there is none.
    fn session_item(&self, items: &Table, owner: &str) -> Option<LeaseItem> {
        items.get(&self.config.key(&self.config.session_id(owner))).cloned()
    }

    fn lost(lease: &Lease) -> Error {
        Error::Lost { id: lease.id.clone() }
    }

    /// One page of orphans below `cutoff_ms`, from shard `start` round all of them (or from
    /// the cursor's shard, `start` being where the listing began).
    fn orphan_listing(
        &self,
        cutoff_ms: u64,
        page_size: usize,
        after: Option<OrphanCursor>,
        start: u32,
    ) -> Result<OrphanPage> {
        let mut table = self.items.lock().expect("memory store poisoned");
        table.catch_up(self.clock.now_ms());
        let page_size = page_size.max(1);
        // The index holds every STARTED item by (shard, expiry, key); the orphans of a shard are
        // those expired before the cutoff (`is_orphan` applies the skew to "now"; here it is
        // already a cutoff). Shards are read in turn: from `start`, round all of them; a cursor
        // goes on in its shard.
        let shards = table.shards.max(1);
        let first = after.as_ref().map_or(start, |c| c.shard.min(shards - 1));
        let left = shards - (first + shards - start) % shards;
        let mut found = (0..left).map(|i| (first + i) % shards).flat_map(|shard| {
            let end = (shard, cutoff_ms, String::new());
            let to = Bound::Excluded(end.clone());
            let from = match &after {
                Some(c) if shard == first => {
                    if (c.expires_at_ms, c.key.as_str()) >= (cutoff_ms, "") {
                        // Past the cutoff: nothing more in this shard.
                        return table.orphans.range((Bound::Included(end), to));
                    }
                    Bound::Excluded((shard, c.expires_at_ms, c.key.clone()))
                }
                _ => Bound::Included((shard, 0, String::new())),
            };
            table.orphans.range((from, to))
        });
        let mut own = found.by_ref().filter(|(_, _, k)| k.starts_with(&self.config.key_prefix));
        let page: Vec<&(u32, u64, String)> = own.by_ref().take(page_size).collect();
        let more = own.next().is_some();
        let next = page.last().filter(|_| more).map(|(shard, exp, k)| OrphanCursor {
            key: k.clone(),
            expires_at_ms: *exp,
            shard: *shard,
        });
        let items = page.into_iter().filter_map(|(_, _, k)| table.indexed(Index::Orphan, k).cloned()).collect();
        Ok(OrphanPage { items, next })
    }
}

#[cfg_attr(not(target_arch = "wasm32"), async_trait::async_trait)]
#[cfg_attr(target_arch = "wasm32", async_trait::async_trait(?Send))]
impl LeaseStore for MemoryStore {
    fn config(&self) -> &TableConfig {
        &self.config
    }

    fn clock(&self) -> &dyn Clock {
        &*self.clock
    }

    async fn start(&self, id: &str, url: &str) -> Result<LeaseItem> {
        validate_id("id", id)?;
        validate_url(url)?;
        self.with_item(id, |slot| {
            let item = slot.get_or_insert_with(|| LeaseItem { id: id.to_string(), ..Default::default() });
            item.desired_state = Some(DesiredState::Started);
            item.url = Some(url.to_string());
            item.expires_at_ms.get_or_insert(0);
            item.ttl = None;
            Ok(item.clone())
        })
    }

    async fn stop(&self, id: &str) -> Result<LeaseItem> {
        validate_id("id", id)?;
        let ttl = self.clock.now_ms() / 1000 + self.config.stopped_retention.as_secs();
        self.with_item(id, |slot| {
            let item = slot.as_mut().ok_or_else(|| Error::NotFound { id: id.to_string() })?;
            item.desired_state = Some(DesiredState::Stopped);
            item.ttl = Some(ttl);
            Ok(item.clone())
        })
    }

    async fn acquire(&self, id: &str, owner: &str) -> Result<Lease> {
        self.claim(id, owner, false)
    }

    async fn acquire_started(&self, id: &str, owner: &str) -> Result<Lease> {
        self.claim(id, owner, true)
    }

    async fn renew(&self, lease: &mut Lease) -> Result<()> {
        let now = self.clock.now_ms();
        let sent = self.clock.monotonic_ms();
        if lease.is_past_deadline(sent) {
            return Err(Self::lost(lease));
        }
        let config = self.config.clone();
        let renewed = self.with_item(&lease.id, |slot| {
            if !holds_unreleased(slot, lease) {
                return Err(Self::lost(lease));
            }
            let item = slot.as_mut().expect("held item exists");
            item.expires_at_ms = Some(expiry_for(now, &config));
            Ok(item.clone())
        })?;
        *lease = Lease::from_item(renewed, &lease.owner, sent, &self.config);
        Ok(())
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.with_item(&lease.id, |slot| {
            if !holds(slot, lease) {
                return Err(Self::lost(lease));
            }
            slot.as_mut().expect("held item exists").expires_at_ms = Some(0);
            Ok(())
        })
    }

    async fn checkpoint(&self, lease: &mut Lease, seq: u64) -> Result<()> {
        if lease.is_past_deadline(self.clock.monotonic_ms()) {
            return Err(Self::lost(lease));
        }
        self.with_item(&lease.id, |slot| {
            if !holds_unreleased(slot, lease) {
                return Err(Self::lost(lease));
            }
            let item = slot.as_mut().expect("held item exists");
            if let Some(last_seq) = item.last_seq.filter(|&last| last >= seq) {
                return Err(Error::SeqNotIncreasing { id: lease.id.clone(), last_seq, seq });
            }
            item.last_seq = Some(seq);
            Ok(())
        })?;
        lease.last_seq = Some(seq);
        Ok(())
    }

    async fn get(&self, id: &str) -> Result<Option<LeaseItem>> {
        validate_id("id", id)?;
        let items = self.items.lock().expect("memory store poisoned");
        Ok(items.get(&self.config.key(id)).cloned())
    }

    async fn batch_desired_states(&self, ids: &[String]) -> Result<HashMap<String, Option<DesiredState>>> {
        let ids = unique_ids(ids)?;
        let items = self.items.lock().expect("memory store poisoned");
        Ok(ids
            .into_iter()
            .map(|id| (id.to_string(), items.get(&self.config.key(id)).and_then(|i| i.desired_state)))
            .collect())
    }

    async fn orphans_page(&self, cutoff_ms: u64, page_size: usize, after: Option<OrphanCursor>) -> Result<OrphanPage> {
        self.orphan_listing(cutoff_ms, page_size, after, self.config.first_orphan_shard(cutoff_ms))
    }

    async fn orphans_page_from(&self, cutoff_ms: u64, page_size: usize, first_shard: u32) -> Result<OrphanPage> {
        self.orphan_listing(cutoff_ms, page_size, None, first_shard % self.config.orphan_shards.max(1))
    }

    async fn owned_by(&self, owner: &str) -> Result<Vec<LeaseItem>> {
        let now = self.clock.now_ms();
        let mut table = self.items.lock().expect("memory store poisoned");
        table.catch_up(now);
        let from = (owner.to_string(), String::new());
        Ok(table
            .owners
            .range(from..)
            .take_while(|(o, _)| o == owner)
            .filter(|(_, k)| k.starts_with(&self.config.key_prefix))
            .filter_map(|(_, k)| table.indexed(Index::Owner, k))
            .filter(|i| i.holder_at(now) == Some(owner))
            .cloned()
            .collect())
    }

    async fn items(&self) -> Result<Vec<LeaseItem>> {
        let table = self.items.lock().expect("memory store poisoned");
        let mut found: Vec<(&String, &LeaseItem)> =
            table.items.iter().filter(|(k, _)| k.starts_with(&self.config.key_prefix)).collect();
        found.sort_unstable_by(|a, b| a.0.cmp(b.0));
        Ok(found.into_iter().map(|(_, i)| i.clone()).collect())
    }

    async fn create_session(&self, owner: &str, previous: Option<u64>) -> Result<Session> {
        validate_id("owner", owner)?;
        let now = self.clock.now_ms();
        let sent = self.clock.monotonic_ms();
        let id = self.config.session_id(owner);
        let key = self.config.key(&id);
        let mut items = self.items.lock().expect("memory store poisoned");
        let epoch = items.update(&key, self.clock.now_ms(), |slot| {
            let item = slot.get_or_insert_with(|| LeaseItem { id, ..Default::default() });
            // Rule 1 on the session, or our own epoch that we stopped acting for.
            let alive = item.expires_at_ms.is_some_and(|exp| exp >= claim_cutoff(now, &self.config));
            if alive && previous != Some(item.fence) {
                return Err(Error::Held { owner: owner.to_string(), expires_at_ms: item.expires_at_ms.unwrap_or(0) });
            }
            item.fence += 1;
            item.expires_at_ms = Some(expiry_for(now, &self.config));
            Ok(item.fence)
        })?;
        self.sessions.lock().expect("memory store poisoned").listed.insert(key);
        Ok(Session {
            owner: owner.to_string(),
            epoch,
            expires_at_ms: expiry_for(now, &self.config),
            deadline_mono_ms: deadline(sent, &self.config),
        })
    }

    async fn renew_session(&self, session: &mut Session) -> Result<()> {
        self.renew_session_with(session, None)
    }

    async fn renew_session_reporting(&self, session: &mut Session, load: SessionLoad) -> Result<()> {
        self.renew_session_with(session, Some(load))
    }

    async fn end_session(&self, session: &Session) -> Result<()> {
        self.end_session_with(session, None)
    }

    async fn end_session_reporting(&self, session: &Session, load: SessionLoad) -> Result<()> {
        self.end_session_with(session, Some(load))
    }

    async fn retire_session(&self, owner: &str, epoch: u64) -> Result<bool> {
        validate_id("owner", owner)?;
        let cutoff = claim_cutoff(self.clock.now_ms(), &self.config);
        let key = self.config.key(&self.config.session_id(owner));
        let items = self.items.lock().expect("memory store poisoned");
        let dead = items.get(&key).is_some_and(|i| i.fence == epoch && i.expires_at_ms.is_some_and(|e| e < cutoff));
        if dead {
            self.sessions.lock().expect("memory store poisoned").listed.remove(&key);
        }
        Ok(dead)
    }

    async fn claim_in_session(&self, id: &str, session: &Session) -> Result<Lease> {
        validate_id("id", id)?;
        if session.is_past_deadline(self.clock.monotonic_ms()) {
            return Err(self.session_lost(&session.owner));
        }
        let cutoff = claim_cutoff(self.clock.now_ms(), &self.config);
        let key = self.config.key(id);
        let mut items = self.items.lock().expect("memory store poisoned");
        let mut state = self.sessions.lock().expect("memory store poisoned");
        let current = items.get(&key).cloned().ok_or_else(|| Error::NotFound { id: id.to_string() })?;
        match current.desired_state {
            None => return Err(Error::NotFound { id: id.to_string() }),
            Some(DesiredState::Stopped) => return Err(Error::Stopped { id: id.to_string() }),
            Some(DesiredState::Started) => {}
        }
        let exp = current.expires_at_ms.unwrap_or(0);
        if exp >= cutoff {
            let holder = current.owner.clone().unwrap_or_default();
            let epoch = state.epochs.get(&key).copied();
            let Some(epoch) = epoch.filter(|_| exp == HELD_UNDER_SESSION_MS && current.owner.is_some()) else {
                return Err(Error::Held { owner: holder, expires_at_ms: exp });
            };
            if holder == session.owner && epoch == session.epoch {
                return Err(Error::Held { owner: holder, expires_at_ms: session.expires_at_ms });
            }
            // Held under a session: takeable once that session is dead, gone, or another epoch.
            if let Some(s) = self.session_item(&items, &holder) {
                if s.fence == epoch && s.expires_at_ms.is_some_and(|e| e >= cutoff) {
                    return Err(Error::Held { owner: holder, expires_at_ms: s.expires_at_ms.unwrap_or(0) });
                }
            }
        }
        let claimed = items.update(&key, self.clock.now_ms(), |slot| {
            let item = slot.as_mut().expect("item read above");
            item.owner = Some(session.owner.clone());
            item.expires_at_ms = Some(HELD_UNDER_SESSION_MS);
            item.fence += 1;
            item.clone()
        });
        state.epochs.insert(key, session.epoch);
        let mut lease = Lease::from_item(claimed, &session.owner, 0, &self.config);
        session.cover(&mut lease);
        Ok(lease)
    }

    /// The transaction's outcome as DynamoDB gives it: the connections still as listed (held
    /// under the dead session `epoch` of `owner`, at the listed fence) are taken; one that
    /// changed is left; a session that lives leaves them all.
    async fn take_over_listed(
        &self,
        owner: &str,
        epoch: u64,
        listed: Vec<LeaseItem>,
        session: &Session,
    ) -> Result<Vec<Option<Lease>>> {
        validate_id("owner", owner)?;
        if listed.is_empty() || listed.len() > crate::protocol::TAKE_OVER_MAX {
            return Err(Error::InvalidInput {
                field: "listed".into(),
                message: format!("1 to {} connections, not {}", crate::protocol::TAKE_OVER_MAX, listed.len()),
            });
        }
        let still_listed: Vec<bool> = {
            let items = self.items.lock().expect("memory store poisoned");
            let state = self.sessions.lock().expect("memory store poisoned");
            let cutoff = claim_cutoff(self.clock.now_ms(), &self.config);
            let lives = self
                .session_item(&items, owner)
                .is_some_and(|s| s.fence == epoch && s.expires_at_ms.is_some_and(|e| e >= cutoff));
            listed
                .iter()
                .map(|l| {
                    let key = self.config.key(&l.id);
                    !lives
                        && items.get(&key).is_some_and(|now| {
                            now.owner.as_deref() == Some(owner)
                                && now.fence == l.fence
                                && now.expires_at_ms == Some(HELD_UNDER_SESSION_MS)
                                && now.desired_state == Some(DesiredState::Started)
                        })
                        && state.epochs.get(&key) == Some(&epoch)
                })
                .collect()
        };
        let mut taken = Vec::with_capacity(listed.len());
        for (item, still) in listed.iter().zip(still_listed) {
            taken.push(if still { self.claim_in_session(&item.id, session).await.ok() } else { None });
        }
        Ok(taken)
    }

    async fn sessions(&self, below_ms: u64) -> Result<Vec<SessionItem>> {
        let mut items = self.items.lock().expect("memory store poisoned");
        items.catch_up(self.clock.now_ms());
        let state = self.sessions.lock().expect("memory store poisoned");
        // The session partition of the orphan index: the items as the index sees them (a
        // retirement leaves it at once here, where DynamoDB's index would still list it a while).
        let mut found: Vec<SessionItem> = state
            .listed
            .iter()
            .filter(|k| k.starts_with(&self.config.key_prefix))
            .filter_map(|k| Some((k, items.indexed(Index::Orphan, k)?)))
            .filter(|(_, i)| i.expires_at_ms.unwrap_or(0) < below_ms)
            .filter_map(|(k, i)| {
                Some(SessionItem {
                    owner: self.config.session_owner(&i.id)?.to_string(),
                    epoch: i.fence,
                    expires_at_ms: i.expires_at_ms.unwrap_or(0),
                    load: state.loads.get(k).copied(),
                })
            })
            .collect();
        found.sort_by(|a, b| (a.expires_at_ms, &a.owner).cmp(&(b.expires_at_ms, &b.owner)));
        Ok(found)
    }

    async fn stranded_page(&self, grace_ms: u64, after: Option<SweepCursor>, max_items: u64) -> Result<StrandedPage> {
        let dead_below = claim_cutoff(self.clock.now_ms(), &self.config).saturating_sub(grace_ms);
        let table = self.items.lock().expect("memory store poisoned");
        let state = self.sessions.lock().expect("memory store poisoned");
        // The items themselves in key order from the cursor, never an index.
        let mut keys: Vec<&String> =
            table.items.keys().filter(|k| after.as_ref().is_none_or(|c| k.as_str() > c.key.as_str())).collect();
        keys.sort_unstable();
        let budget = usize::try_from(max_items.max(1)).unwrap_or(usize::MAX);
        let next = (keys.len() > budget).then(|| SweepCursor { key: keys[budget - 1].clone() });
        keys.truncate(budget);
        let mut ids: Vec<String> = keys
            .iter()
            .filter(|k| k.starts_with(&self.config.key_prefix))
            .filter_map(|k| Some((table.items.get(*k)?, state.epochs.get(*k)?)))
            .filter(|(item, _)| {
                item.desired_state == Some(DesiredState::Started) && item.expires_at_ms == Some(HELD_UNDER_SESSION_MS)
            })
            .filter_map(|(item, &epoch)| {
                // Held under a session: stranded once that session is gone, of another epoch, or
                // dead beyond the grace.
                let stranded = match self.session_item(&table, item.owner.as_deref()?) {
                    None => true,
                    Some(session) => session.fence != epoch || session.expires_at_ms.unwrap_or(0) < dead_below,
                };
                stranded.then(|| item.id.clone())
            })
            .collect();
        ids.sort();
        Ok(StrandedPage { ids, scanned: keys.len() as u64, next })
    }
}
