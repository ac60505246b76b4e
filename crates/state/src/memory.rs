//! The in-memory backend: everything under one mutex, for tests and single-process embedders.
//! Nothing survives the process. Each method takes the lock once, so each is atomic.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::Value;

use crate::approval::{self, Answer, ApprovalQuery, ApprovalRecord, ApprovalState, NewApproval};
use crate::audit::{self, AuditHead, AuditLineFn, AuditRecord, Durability};
use crate::budget::{
    self, Amounts, LedgerKey, LedgerSnapshot, Reservation, ReserveOutcome, ReserveRequest,
    SettleOutcome,
};
use crate::cell::{self, CellRecord, CellStatus, CellUpdate, NewCell, ReplayEntry};
use crate::clock::Clock;
use crate::error::{Result, StateError};
use crate::session::{self, SessionRecord, StoreChange};
use crate::store::StateStore;
use crate::validate::check_id;
use crate::watch::{Notifier, Topic, Watch};

#[derive(Default)]
struct Ledger {
    used: Amounts,
    reserved: Amounts,
}

struct Hold {
    ledgers: Vec<String>,
    amounts: Amounts,
    expires_at_ms: i64,
    /// The hold ran out and its amounts went back to the ledgers.
    expired: bool,
}

#[derive(Default)]
struct Inner {
    sessions: HashMap<String, SessionRecord>,
    /// Sessions ended for good, and when: never begun again while kept.
    ended_sessions: HashMap<String, i64>,
    stores: HashMap<String, BTreeMap<String, Value>>,
    cells: HashMap<String, CellRecord>,
    replay: HashMap<String, Vec<ReplayEntry>>,
    approvals: HashMap<String, ApprovalRecord>,
    ledgers: HashMap<String, Ledger>,
    holds: HashMap<String, Hold>,
    audit: HashMap<String, Vec<AuditRecord>>,
    /// How each stream's lines were asked to be written, in order (memory has no disk).
    durability: HashMap<String, Vec<Durability>>,
}

pub struct MemoryStore {
    inner: Mutex<Inner>,
    clock: Clock,
    notifier: Notifier,
}

impl MemoryStore {
    pub fn new(clock: Clock) -> Self {
        MemoryStore {
            inner: Mutex::new(Inner::default()),
            clock,
            notifier: Notifier::new(None),
        }
    }

    // A poisoned lock means a panic in a caller's audit closure; every method leaves the maps
    // consistent before anything that could panic, so go on.
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The [`Durability`] each line of `stream` was appended with, in the stream's order: for
    /// tests of what callers ask of a store that has a disk.
    pub fn durability_of(&self, stream: &str) -> Vec<Durability> {
        self.lock()
            .durability
            .get(stream)
            .cloned()
            .unwrap_or_default()
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new(Clock::system())
    }
}

fn ready<'a, T: Send + 'a>(v: Result<T>) -> BoxFuture<'a, Result<T>> {
    Box::pin(std::future::ready(v))
}

impl Inner {
    /// Gives back the amounts of holds on `keys` that ran out.
    fn expire_holds(&mut self, keys: &[String], now_ms: i64) {
        for hold in self.holds.values_mut() {
            if hold.expired
                || hold.expires_at_ms > now_ms
                || !hold.ledgers.iter().any(|l| keys.contains(l))
            {
                continue;
            }
            hold.expired = true;
            for l in &hold.ledgers {
                let ledger = self.ledgers.entry(l.clone()).or_default();
                ledger.reserved = ledger.reserved.minus(&hold.amounts);
            }
        }
    }

    fn snapshot(&self, key: &LedgerKey) -> LedgerSnapshot {
        let l = self.ledgers.get(&key.encode());
        LedgerSnapshot {
            key: key.clone(),
            used: l.map(|l| l.used).unwrap_or_default(),
            reserved: l.map(|l| l.reserved).unwrap_or_default(),
        }
    }
}

impl StateStore for MemoryStore {
    fn describe(&self) -> String {
        "memory:".to_string()
    }

    fn ping(&self) -> BoxFuture<'_, Result<()>> {
        ready(Ok(()))
    }

    fn watch(&self, topic: Topic) -> Watch {
        self.notifier.watch(topic)
    }

    fn open_session<'a>(
        &'a self,
        id: &'a str,
        principal: Option<&'a str>,
    ) -> BoxFuture<'a, Result<SessionRecord>> {
        let r = (|| {
            check_id("session id", id)?;
            let now = self.clock.now_ms();
            let mut inner = self.lock();
            if inner.ended_sessions.contains_key(id) {
                return Err(session::ended(id));
            }
            let s = inner
                .sessions
                .entry(id.to_string())
                .or_insert_with(|| SessionRecord {
                    id: id.to_string(),
                    principal: principal.map(str::to_string),
                    created_at_ms: now,
                    last_seen_ms: now,
                });
            s.last_seen_ms = s.last_seen_ms.max(now);
            Ok(s.clone())
        })();
        ready(r)
    }

    fn touch_session<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<SessionRecord>> {
        let r = (|| {
            check_id("session id", id)?;
            let now = self.clock.now_ms();
            let mut inner = self.lock();
            let s = inner
                .sessions
                .get_mut(id)
                .ok_or_else(|| session::ended(id))?;
            s.last_seen_ms = s.last_seen_ms.max(now);
            Ok(s.clone())
        })();
        ready(r)
    }

    fn get_session<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<SessionRecord>>> {
        ready(Ok(self.lock().sessions.get(id).cloned()))
    }

    fn delete_session<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool>> {
        let mut inner = self.lock();
        let existed = inner.sessions.remove(id).is_some();
        let had_store = inner.stores.remove(id).is_some();
        ready(Ok(existed || had_store))
    }

    fn load_store<'a>(
        &'a self,
        session: &'a str,
    ) -> BoxFuture<'a, Result<BTreeMap<String, Value>>> {
        ready(Ok(self
            .lock()
            .stores
            .get(session)
            .cloned()
            .unwrap_or_default()))
    }

    fn apply_store<'a>(
        &'a self,
        session: &'a str,
        changes: &'a [StoreChange],
    ) -> BoxFuture<'a, Result<()>> {
        let r = session::validate_changes(session, changes).and_then(|()| {
            let mut inner = self.lock();
            // On a copy: a batch that would overfill the session changes nothing.
            let mut store = inner.stores.get(session).cloned().unwrap_or_default();
            for c in changes {
                match c {
                    StoreChange::Set { key, value } => {
                        store.insert(key.clone(), value.clone());
                    }
                    StoreChange::Delete { key } => {
                        store.remove(key);
                    }
                }
            }
            let total: usize = store
                .iter()
                .map(|(k, v)| session::entry_chars(k, &crate::validate::json_text(v)))
                .sum();
            if total > session::MAX_STORE_TOTAL_CHARS {
                return Err(session::store_full(session, total));
            }
            inner.stores.insert(session.to_string(), store);
            Ok(())
        });
        ready(r)
    }

    fn create_cell(&self, new: NewCell) -> BoxFuture<'_, Result<CellRecord>> {
        let r = (|| {
            new.validate()?;
            let now = self.clock.now_ms();
            let mut inner = self.lock();
            if inner.cells.contains_key(&new.id) {
                return Err(StateError::Duplicate {
                    what: "cell",
                    id: new.id,
                });
            }
            if inner.ended_sessions.contains_key(&new.session_id) {
                return Err(session::ended(&new.session_id));
            }
            if let Some(limit) = new.max_live_per_session {
                let live = inner
                    .cells
                    .values()
                    .filter(|c| c.session_id == new.session_id && !c.status.is_terminal())
                    .count();
                if live >= limit as usize {
                    return Err(StateError::CellLimit {
                        session: new.session_id,
                        limit,
                    });
                }
            }
            let record = CellRecord {
                id: new.id.clone(),
                session_id: new.session_id,
                source: new.source,
                source_hash: new.source_hash,
                options: new.options,
                status: CellStatus::Running,
                approval_id: None,
                result: None,
                owner: Some(new.owner),
                lease_until_ms: now.saturating_add(budget::hold_ms(new.lease)),
                created_at_ms: now,
                updated_at_ms: now,
            };
            inner.cells.insert(new.id, record.clone());
            Ok(record)
        })();
        if let Ok(c) = &r {
            self.notifier.notify(Topic::Cell(c.id.clone()));
        }
        ready(r)
    }

    fn get_cell<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<CellRecord>>> {
        ready(Ok(self.lock().cells.get(id).cloned()))
    }

    fn list_cells<'a>(&'a self, session: &'a str) -> BoxFuture<'a, Result<Vec<CellRecord>>> {
        let mut v: Vec<CellRecord> = self
            .lock()
            .cells
            .values()
            .filter(|c| c.session_id == session)
            .cloned()
            .collect();
        v.sort_by(|a, b| (a.created_at_ms, &a.id).cmp(&(b.created_at_ms, &b.id)));
        ready(Ok(v))
    }

    fn claim_cell<'a>(
        &'a self,
        id: &'a str,
        replica: &'a str,
        lease: Duration,
    ) -> BoxFuture<'a, Result<CellRecord>> {
        let r = (|| {
            check_id("replica id", replica)?;
            let now = self.clock.now_ms();
            let mut inner = self.lock();
            let c = inner
                .cells
                .get_mut(id)
                .ok_or_else(|| StateError::UnknownCell { id: id.to_string() })?;
            cell::check_claim(c, replica, now)?;
            c.owner = Some(replica.to_string());
            c.lease_until_ms = now.saturating_add(budget::hold_ms(lease));
            c.updated_at_ms = now;
            Ok(c.clone())
        })();
        if r.is_ok() {
            self.notifier.notify(Topic::Cell(id.to_string()));
        }
        ready(r)
    }

    fn update_cell<'a>(
        &'a self,
        id: &'a str,
        replica: &'a str,
        update: CellUpdate,
    ) -> BoxFuture<'a, Result<CellRecord>> {
        let r = (|| {
            update.validate()?;
            let now = self.clock.now_ms();
            let mut inner = self.lock();
            let c = inner
                .cells
                .get_mut(id)
                .ok_or_else(|| StateError::UnknownCell { id: id.to_string() })?;
            cell::check_holder(c, replica)?;
            cell::apply_update(c, &update, now);
            let out = c.clone();
            if update.status.is_terminal() {
                inner.replay.remove(id);
            }
            Ok(out)
        })();
        if r.is_ok() {
            self.notifier.notify(Topic::Cell(id.to_string()));
        }
        ready(r)
    }

    fn claimable_cells(&self) -> BoxFuture<'_, Result<Vec<CellRecord>>> {
        let now = self.clock.now_ms();
        let mut v: Vec<CellRecord> = self
            .lock()
            .cells
            .values()
            .filter(|c| !c.status.is_terminal() && (c.owner.is_none() || c.lease_until_ms <= now))
            .cloned()
            .collect();
        v.sort_by(|a, b| (a.created_at_ms, &a.id).cmp(&(b.created_at_ms, &b.id)));
        ready(Ok(v))
    }

    fn end_session_cells<'a>(
        &'a self,
        session: &'a str,
        except: &'a str,
        result: Value,
    ) -> BoxFuture<'a, Result<Vec<CellRecord>>> {
        if let Err(e) = check_id("session id", session) {
            return ready(Err(e));
        }
        let now = self.clock.now_ms();
        let end = cell::session_end(&result);
        let mut inner = self.lock();
        let kept_since = now.saturating_sub(budget::hold_ms(session::ENDED_SESSION_KEPT));
        inner.ended_sessions.retain(|_, at| *at >= kept_since);
        inner.ended_sessions.insert(session.to_string(), now);
        inner.sessions.remove(session);
        let mut ended: Vec<CellRecord> = Vec::new();
        for c in inner.cells.values_mut() {
            if cell::ends_with_session(c, session, except) {
                ended.push(c.clone());
                cell::apply_update(c, &end, now);
            }
        }
        for c in &ended {
            inner.replay.remove(&c.id);
        }
        drop(inner);
        ended.sort_by(|a, b| (a.created_at_ms, &a.id).cmp(&(b.created_at_ms, &b.id)));
        for c in &ended {
            self.notifier.notify(Topic::Cell(c.id.clone()));
        }
        ready(Ok(ended))
    }

    fn delete_cell<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool>> {
        let mut inner = self.lock();
        inner.replay.remove(id);
        let existed = inner.cells.remove(id).is_some();
        drop(inner);
        if existed {
            self.notifier.notify(Topic::Cell(id.to_string()));
        }
        ready(Ok(existed))
    }

    fn prune_ended(&self, before_ms: i64) -> BoxFuture<'_, Result<u64>> {
        let mut inner = self.lock();
        let cells = inner.cells.len();
        inner
            .cells
            .retain(|_, c| !(c.status.is_terminal() && c.updated_at_ms < before_ms));
        let approvals = inner.approvals.len();
        inner.approvals.retain(|_, a| {
            a.state == crate::ApprovalState::Pending
                || a.answered_at_ms.unwrap_or(a.created_at_ms) >= before_ms
        });
        let gone = (cells - inner.cells.len()) + (approvals - inner.approvals.len());
        ready(Ok(gone as u64))
    }

    fn append_replay<'a>(
        &'a self,
        cell_id: &'a str,
        replica: &'a str,
        entries: &'a [ReplayEntry],
    ) -> BoxFuture<'a, Result<()>> {
        let r = (|| {
            let mut inner = self.lock();
            let c = inner
                .cells
                .get(cell_id)
                .ok_or_else(|| StateError::UnknownCell {
                    id: cell_id.to_string(),
                })?;
            cell::check_holder(c, replica)?;
            let log = inner.replay.entry(cell_id.to_string()).or_default();
            let last = log.last().map_or(0, |e| e.step);
            cell::check_steps(cell_id, last, entries)?;
            log.extend_from_slice(entries);
            Ok(())
        })();
        ready(r)
    }

    fn read_replay<'a>(&'a self, cell_id: &'a str) -> BoxFuture<'a, Result<Vec<ReplayEntry>>> {
        ready(Ok(self
            .lock()
            .replay
            .get(cell_id)
            .cloned()
            .unwrap_or_default()))
    }

    fn create_approval(&self, new: NewApproval) -> BoxFuture<'_, Result<ApprovalRecord>> {
        let r = new.validate().map(|()| {
            let id = uuid::Uuid::new_v4().simple().to_string();
            let record = new.into_record(id.clone(), self.clock.now_ms());
            self.lock().approvals.insert(id, record.clone());
            record
        });
        if let Ok(a) = &r {
            self.notifier.notify(Topic::Approval(a.id.clone()));
        }
        ready(r)
    }

    fn get_approval<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<ApprovalRecord>>> {
        ready(Ok(self.lock().approvals.get(id).cloned()))
    }

    fn list_approvals(&self, query: ApprovalQuery) -> BoxFuture<'_, Result<Vec<ApprovalRecord>>> {
        let mut v: Vec<ApprovalRecord> = self
            .lock()
            .approvals
            .values()
            .filter(|a| query.matches(a))
            .cloned()
            .collect();
        v.sort_by(|a, b| (a.created_at_ms, &a.id).cmp(&(b.created_at_ms, &b.id)));
        ready(Ok(v))
    }

    fn answer_approval<'a>(
        &'a self,
        id: &'a str,
        answer: Answer,
    ) -> BoxFuture<'a, Result<ApprovalRecord>> {
        let r = (|| {
            answer.validate()?;
            let now = self.clock.now_ms();
            let mut inner = self.lock();
            let current = inner
                .approvals
                .get(id)
                .cloned()
                .ok_or_else(|| StateError::UnknownApproval { id: id.to_string() })?;
            let answered = approval::apply_answer(current, &answer, now)?;
            inner.approvals.insert(id.to_string(), answered.clone());
            Ok(answered)
        })();
        if r.is_ok() {
            self.notifier.notify(Topic::Approval(id.to_string()));
        }
        ready(r)
    }

    fn expire_approvals(&self) -> BoxFuture<'_, Result<Vec<ApprovalRecord>>> {
        let now = self.clock.now_ms();
        let mut expired = Vec::new();
        {
            let mut inner = self.lock();
            for a in inner.approvals.values_mut() {
                if a.state == ApprovalState::Pending && a.expires_at_ms <= now {
                    *a = approval::expire(a.clone(), now);
                    expired.push(a.clone());
                }
            }
        }
        expired.sort_by(|a, b| (a.created_at_ms, &a.id).cmp(&(b.created_at_ms, &b.id)));
        for a in &expired {
            self.notifier.notify(Topic::Approval(a.id.clone()));
        }
        ready(Ok(expired))
    }

    fn reserve(&self, request: ReserveRequest) -> BoxFuture<'_, Result<ReserveOutcome>> {
        let r = (|| {
            request.validate()?;
            let now = self.clock.now_ms();
            let sorted = request.sorted();
            let keys: Vec<String> = sorted.iter().map(|(k, _, _)| k.clone()).collect();
            let mut inner = self.lock();
            inner.expire_holds(&keys, now);
            for (k, key, limits) in &sorted {
                let l = inner.ledgers.entry(k.clone()).or_default();
                if let Err(refusal) =
                    budget::check_room(key, &l.used, &l.reserved, limits, &request.amounts)
                {
                    return Ok(ReserveOutcome::Refused(refusal));
                }
            }
            for k in &keys {
                let l = inner.ledgers.entry(k.clone()).or_default();
                l.reserved = l.reserved.plus(&request.amounts);
            }
            let id = uuid::Uuid::new_v4().simple().to_string();
            let expires_at_ms = now.saturating_add(budget::hold_ms(request.hold_for));
            inner.holds.insert(
                id.clone(),
                Hold {
                    ledgers: keys,
                    amounts: request.amounts,
                    expires_at_ms,
                    expired: false,
                },
            );
            Ok(ReserveOutcome::Granted(Reservation {
                id,
                ledgers: request.ledgers,
                amounts: request.amounts,
                expires_at_ms,
                reserved_at_ms: crate::clock::Clock::system().now_ms(),
                lease: None,
            }))
        })();
        ready(r)
    }

    fn settle<'a>(
        &'a self,
        reservation: &'a Reservation,
        actual: Amounts,
    ) -> BoxFuture<'a, Result<SettleOutcome>> {
        let r = (|| {
            actual.validate("settled amounts")?;
            let mut inner = self.lock();
            let hold = inner.holds.remove(&reservation.id).ok_or_else(|| {
                StateError::UnknownReservation {
                    id: reservation.id.clone(),
                }
            })?;
            let mut ledgers = Vec::new();
            let mut overruns = Vec::new();
            let mut sorted: Vec<_> = reservation.ledgers.iter().collect();
            sorted.sort_by_key(|(k, _)| k.encode());
            for (key, limits) in sorted {
                let l = inner.ledgers.entry(key.encode()).or_default();
                if !hold.expired {
                    l.reserved = l.reserved.minus(&hold.amounts);
                }
                l.used = l.used.plus(&actual);
                overruns.extend(budget::overruns(key, &l.used, limits));
                ledgers.push(LedgerSnapshot {
                    key: key.clone(),
                    used: l.used,
                    reserved: l.reserved,
                });
            }
            Ok(SettleOutcome { ledgers, overruns })
        })();
        ready(r)
    }

    fn release<'a>(&'a self, reservation: &'a Reservation) -> BoxFuture<'a, Result<()>> {
        let r = (|| {
            let mut inner = self.lock();
            let hold = inner.holds.remove(&reservation.id).ok_or_else(|| {
                StateError::UnknownReservation {
                    id: reservation.id.clone(),
                }
            })?;
            if !hold.expired {
                for k in &hold.ledgers {
                    let l = inner.ledgers.entry(k.clone()).or_default();
                    l.reserved = l.reserved.minus(&hold.amounts);
                }
            }
            Ok(())
        })();
        ready(r)
    }

    fn extend_hold<'a>(
        &'a self,
        reservation: &'a Reservation,
        hold_for: std::time::Duration,
    ) -> BoxFuture<'a, Result<()>> {
        let now = self.clock.now_ms();
        let mut inner = self.lock();
        let r = match inner.holds.get_mut(&reservation.id) {
            Some(h) if !h.expired && h.expires_at_ms > now => {
                h.expires_at_ms = now.saturating_add(budget::hold_ms(hold_for));
                Ok(())
            }
            _ => Err(StateError::UnknownReservation {
                id: reservation.id.clone(),
            }),
        };
        ready(r)
    }

    fn get_ledger<'a>(&'a self, key: &'a LedgerKey) -> BoxFuture<'a, Result<LedgerSnapshot>> {
        let r = key.validate().map(|()| {
            let now = self.clock.now_ms();
            let mut inner = self.lock();
            inner.expire_holds(&[key.encode()], now);
            inner.snapshot(key)
        });
        ready(r)
    }

    fn append_audit<'a>(
        &'a self,
        stream: &'a str,
        make: AuditLineFn,
    ) -> BoxFuture<'a, Result<AuditRecord>> {
        self.append_audit_with(stream, make, Durability::Now)
    }

    fn append_audit_with<'a>(
        &'a self,
        stream: &'a str,
        make: AuditLineFn,
        durability: Durability,
    ) -> BoxFuture<'a, Result<AuditRecord>> {
        let r = (|| {
            audit::validate_stream(stream)?;
            let now = self.clock.now_ms();
            let mut inner = self.lock();
            let head = inner
                .audit
                .get(stream)
                .and_then(|lines| lines.last())
                .map_or_else(AuditHead::default, |l| AuditHead {
                    seq: l.seq,
                    hash: Some(l.hash.clone()),
                });
            let record = audit::make_line(stream, &head, &make, now)?;
            let lines = inner.audit.entry(stream.to_string()).or_default();
            lines.push(record.clone());
            let asked = inner.durability.entry(stream.to_string()).or_default();
            asked.push(durability);
            Ok(record)
        })();
        ready(r)
    }

    fn read_audit<'a>(
        &'a self,
        stream: &'a str,
        after_seq: u64,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<AuditRecord>>> {
        let inner = self.lock();
        let v = inner
            .audit
            .get(stream)
            .map(|lines| {
                lines
                    .iter()
                    .filter(|l| l.seq > after_seq)
                    .take(limit)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        ready(Ok(v))
    }

    fn audit_head<'a>(&'a self, stream: &'a str) -> BoxFuture<'a, Result<AuditHead>> {
        let inner = self.lock();
        let head = inner
            .audit
            .get(stream)
            .and_then(|lines| lines.last())
            .map_or_else(AuditHead::default, |l| AuditHead {
                seq: l.seq,
                hash: Some(l.hash.clone()),
            });
        ready(Ok(head))
    }

    fn audit_streams(&self) -> BoxFuture<'_, Result<Vec<String>>> {
        let mut v: Vec<String> = self.lock().audit.keys().cloned().collect();
        v.sort();
        ready(Ok(v))
    }
}
