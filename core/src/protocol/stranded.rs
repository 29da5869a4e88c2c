//! `stranded`: session mode's consistent backstop. Survivors find a dead session's work through
//! the owner index, which lags; work it never lists before the session is retired stays held
//! under a dead, unlisted session for good. This sweep finds such work without any index: a
//! strongly consistent Scan of the base table, page by page, then consistent reads of the
//! owners' session items, and decides which connections a takeover would take now.

use std::collections::{BTreeMap, HashMap};

use super::reads::{BatchGet, Reads};
use super::request::{Output, Request, Scan};
use super::session::number;
use super::value::{is_own, n, s, AttributeValue, Item};
use super::{Input, Operation, Step};
use crate::config::SESSION_PREFIX;
use crate::lease::{claim_cutoff, HELD_UNDER_SESSION_MS};
use crate::store::{StrandedPage, SweepCursor};
use crate::{DesiredState, TableConfig};

/// A session item as read: its epoch, and whether it was dead beyond the grace when read.
#[derive(Debug, Clone, Copy)]
struct SessionRead {
    epoch: u64,
    dead: bool,
}

/// `stranded_page`: one part of the sweep (see [`crate::LeaseStore::stranded_page`]).
///
/// Reads up to `max_items` items from the cursor with consistent Scans (`Limit` the items left;
/// a projection of the six attributes it decides from; a filter that answers only connections
/// holding the sentinel and session items, which trims the answer but not the read units: a
/// Scan costs its items' size, about one read unit per 4 KB consistently read). It keeps, per
/// owner, the ids of held connections whose session it has not read live under their epoch
/// (connections of a session read live are dropped at once), so what it holds is bounded by one
/// call's items. At the end it reads the session items of the owners left, consistently (a
/// BatchGetItem of `session/{owner}`), and gives the connections whose session is gone, of
/// another epoch, or dead beyond the grace (expiry below `now - clock_skew - grace_ms`, `now`
/// when the session was read): what [`super::ClaimInSession`]'s takeover would take.
#[derive(Debug, Clone)]
pub struct Stranded {
    config: TableConfig,
    grace_ms: u64,
    /// Items this call may still read.
    left: u64,
    scan: Scan,
    scanned: u64,
    /// Sessions read live in this call: owner to epoch.
    live: HashMap<String, u64>,
    /// Held connections not yet ruled out: owner to (id, epoch).
    held: BTreeMap<String, Vec<(String, u64)>>,
    next: Option<SweepCursor>,
    /// The reads of the session items of the owners left, and what they found.
    sessions: Option<(BatchGet, HashMap<String, SessionRead>)>,
    reads: Reads,
}

impl Stranded {
    /// The part of the sweep from `after` (the table's start when `None`), reading at most
    /// `max_items` items (at least one; `u64::MAX`: to the end of the table).
    pub fn new(config: &TableConfig, grace_ms: u64, after: Option<SweepCursor>, max_items: u64) -> Self {
        let a = &config.attributes;
        let names = BTreeMap::from([
            ("#pk".to_string(), a.id.clone()),
            ("#owner".to_string(), a.owner.clone()),
            ("#epoch".to_string(), a.session_epoch.clone()),
            ("#exp".to_string(), a.expires_at_ms.clone()),
            ("#ds".to_string(), a.desired_state.clone()),
            ("#fence".to_string(), a.fence.clone()),
        ]);
        let mut values = Item::from([
            (":sessions".to_string(), s(config.key(SESSION_PREFIX))),
            (":held".to_string(), n(HELD_UNDER_SESSION_MS)),
        ]);
        let mut held = "#exp = :held AND attribute_exists(#owner) AND attribute_exists(#epoch)".to_string();
        // Other applications may share the table under other prefixes.
        if !config.key_prefix.is_empty() {
            held.push_str(" AND begins_with(#pk, :prefix)");
            values.insert(":prefix".into(), s(&config.key_prefix));
        }
        let max_items = max_items.max(1);
        let scan = Scan {
            table_name: config.table_name.clone(),
            consistent_read: Some(true),
            limit: None,
            projection_expression: Some("#pk, #owner, #epoch, #exp, #ds, #fence".into()),
            filter_expression: Some(format!("begins_with(#pk, :sessions) OR ({held})")),
            expression_attribute_names: names,
            expression_attribute_values: values,
            exclusive_start_key: after.map(|c| Item::from([(a.id.clone(), s(c.key))])),
        };
        let first = Self::page(scan.clone(), max_items);
        Self {
            config: config.clone(),
            grace_ms,
            left: max_items,
            scan,
            scanned: 0,
            live: HashMap::new(),
            held: BTreeMap::new(),
            next: None,
            sessions: None,
            reads: Reads::new(config, first),
        }
    }

    /// The Scan of the next page, reading at most `left` items.
    fn page(scan: Scan, left: u64) -> Request {
        Request::Scan(Scan { limit: u32::try_from(left).ok().filter(|&l| l < i32::MAX as u32), ..scan })
    }

    /// Whether a session read at `now_ms` with expiry `exp` was dead beyond the grace.
    fn dead(&self, exp: u64, now_ms: u64) -> bool {
        exp < claim_cutoff(now_ms, &self.config).saturating_sub(self.grace_ms)
    }

    /// Takes in one page of the Scan.
    fn take_page(&mut self, out: &Output, now_ms: u64) {
        let a = &self.config.attributes;
        let items = out.items.as_deref().unwrap_or_default();
        self.scanned += out.scanned_count.unwrap_or(items.len() as u64);
        for attrs in items.iter().filter(|attrs| is_own(&self.config, attrs)) {
            let Some(key) = attrs.get(&a.id).and_then(AttributeValue::as_s) else { continue };
            let id = self.config.id_of(key);
            let exp = number(attrs, &a.expires_at_ms);
            if let Some(owner) = self.config.session_owner(id) {
                let Some(epoch) = number(attrs, &a.fence) else { continue };
                if !self.dead(exp.unwrap_or(0), now_ms) {
                    // A live session's work is not stranded: drop what was kept of it.
                    if let Some(kept) = self.held.get_mut(owner) {
                        kept.retain(|(_, e)| *e != epoch);
                        if kept.is_empty() {
                            self.held.remove(owner);
                        }
                    }
                    self.live.insert(owner.to_string(), epoch);
                }
                continue;
            }
            let started = attrs
                .get(&a.desired_state)
                .and_then(AttributeValue::as_s)
                .and_then(|v| self.config.parse_desired_state(v))
                == Some(DesiredState::Started);
            let owner = attrs.get(&a.owner).and_then(AttributeValue::as_s);
            let epoch = number(attrs, &a.session_epoch);
            let (Some(owner), Some(epoch), true, Some(HELD_UNDER_SESSION_MS)) = (owner, epoch, started, exp) else {
                continue;
            };
            if self.live.get(owner) == Some(&epoch) {
                continue;
            }
            self.held.entry(owner.to_string()).or_default().push((id.to_string(), epoch));
        }
        self.left = self.left.saturating_sub(out.scanned_count.unwrap_or(items.len() as u64));
        let last = out.last_evaluated_key.as_ref().filter(|k| !k.is_empty());
        self.next = last.and_then(|k| k.get(&a.id)?.as_s()).map(|key| SweepCursor { key: key.to_string() });
    }

    /// Takes in the session items one BatchGetItem answer found.
    fn take_sessions(&mut self, now_ms: u64) {
        let Some((batch, _)) = self.sessions.as_mut() else { return };
        let found = std::mem::take(&mut batch.found);
        let read: Vec<(String, SessionRead)> = found
            .into_iter()
            .filter_map(|item| {
                let owner = self.config.session_owner(&item.id)?.to_string();
                Some((
                    owner,
                    SessionRead { epoch: item.fence, dead: self.dead(item.expires_at_ms.unwrap_or(0), now_ms) },
                ))
            })
            .collect();
        if let Some((_, sessions)) = self.sessions.as_mut() {
            sessions.extend(read);
        }
    }

    fn result(&mut self) -> StrandedPage {
        let read = self.sessions.take().map(|(_, read)| read).unwrap_or_default();
        let mut ids: Vec<String> = std::mem::take(&mut self.held)
            .into_iter()
            .flat_map(|(owner, kept)| {
                let session = read.get(&owner).copied();
                kept.into_iter().filter(move |(_, epoch)| session.is_none_or(|s| s.epoch != *epoch || s.dead))
            })
            .map(|(id, _)| id)
            .collect();
        ids.sort();
        ids.dedup();
        StrandedPage { ids, scanned: self.scanned, next: self.next.take() }
    }
}

impl Operation for Stranded {
    type Output = StrandedPage;
    fn next(&mut self, mut input: Input) -> Step<StrandedPage> {
        let out = match self.reads.step(&mut input) {
            Ok(out) => out,
            Err(step) => return step,
        };
        if let Some((batch, _)) = self.sessions.as_mut() {
            let request = batch.take(out);
            self.take_sessions(input.now_ms);
            return match request {
                Some(request) => self.reads.then(&input, request),
                None => Step::Done(self.result()),
            };
        }
        self.take_page(&out, input.now_ms);
        if self.next.is_some() && self.left > 0 {
            let scan = Scan {
                exclusive_start_key: self
                    .next
                    .as_ref()
                    .map(|c| Item::from([(self.config.attributes.id.clone(), s(&c.key))])),
                ..self.scan.clone()
            };
            return self.reads.then(&input, Self::page(scan, self.left));
        }
        // Read as far as this call goes: the sessions of the owners left, read now.
        let owners: Vec<String> = self.held.keys().map(|owner| self.config.session_id(owner)).collect();
        let ids: Vec<&str> = owners.iter().map(String::as_str).collect();
        let a = &self.config.attributes;
        let mut batch = BatchGet::new(
            &self.config,
            &ids,
            Some((
                "#pk, #exp, #fence",
                &[("#pk", a.id.as_str()), ("#exp", a.expires_at_ms.as_str()), ("#fence", a.fence.as_str())],
            )),
        );
        let Some(first) = batch.first() else { return Step::Done(self.result()) };
        self.sessions = Some((batch, HashMap::new()));
        self.reads.then(&input, first)
    }
}
