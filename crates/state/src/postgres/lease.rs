//! Budget leases: a store holds part of a ledger's remaining calls and charges calls against
//! it in memory, so a gated call costs no statement for its budget (schema version 3, see
//! `schema/postgres_v3.sql` for the rules the database keeps).
//!
//! Per ledger, a store keeps what its lease holds in the database (`held`), what calls granted
//! from it and not yet ended hold (`in_flight`), and what ended calls spent and the database
//! has not been told yet (`spent`). A call is granted locally while `held - in_flight - spent`
//! has room on every ledger with a limit on calls or model calls; otherwise one statement
//! (`codemode_lease_take`) reports the spending, folds the lease down to what calls in flight
//! hold and takes a new lease of 1/`divisor` of what remains, or, near the limit, reserves
//! this call alone as without leases. A background task reports spending and renews busy
//! leases every `report_every`, and returns idle ones after `idle`.
//!
//! Every lease statement is one transaction whose commit waits for the disk: a lease lost in a
//! server crash would let its calls run twice. When a lease statement fails, its outcome is
//! unknown, so the store drops the lease from memory (a new generation) without using it
//! again: if the database kept it, it expires and is counted as spent (never granted twice).

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use deadpool_postgres::{Client, Pool};

use super::ops::{OpError, OpResult};
use super::pipelined::{amounts_of, col};
use crate::budget::{
    self, Amounts, BudgetRefusal, Counter, LeaseTicket, Overrun, Reservation, ReserveRequest,
};
use crate::error::{Result, StateError};

/// How a PostgreSQL store leases budget ([`crate::PostgresOptions::budget_leases`]).
#[derive(Debug, Clone)]
pub struct LeaseOptions {
    /// A lease is what remains of a ledger's limit divided by this.
    pub divisor: u64,
    /// Leases smaller than this many calls (times a call's amount) are not taken: near the
    /// limit every call is reserved on its own, so the last calls of a budget are not stuck
    /// in another replica's lease.
    pub min_calls: u64,
    /// A lease not renewed for this long expires, and what it held is counted as spent.
    pub lease_for: Duration,
    /// A lease unused for this long is returned (its unused part freed for other replicas).
    pub idle: Duration,
    /// How often a busy lease's spending is reported and the lease renewed.
    pub report_every: Duration,
}

impl Default for LeaseOptions {
    fn default() -> Self {
        LeaseOptions {
            divisor: 16,
            min_calls: 2,
            lease_for: Duration::from_secs(30),
            idle: Duration::from_millis(250),
            report_every: Duration::from_secs(1),
        }
    }
}

const TAKE: &str = "SELECT kind, key, lease_id, held, state, refused_counter, used, reserved, lim
     FROM codemode_lease_take($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)";
const SYNC: &str = "SELECT key, state, used FROM codemode_lease_sync($1, $2, $3, $4, $5, $6, $7)";

/// The counters a lease holds: calls and model calls, the amounts known before a call runs.
fn counts(a: &Amounts) -> Amounts {
    Amounts {
        calls: a.calls,
        model_calls: a.model_calls,
        ..Amounts::default()
    }
}

const LEASED: [Counter; 2] = [Counter::Calls, Counter::ModelCalls];

#[derive(Debug, Default)]
struct Entry {
    lease_id: Option<String>,
    generation: u64,
    held: Amounts,
    in_flight: Amounts,
    spent: Amounts,
    last_used_ms: i64,
    last_report_ms: i64,
    expires_at_ms: i64,
    /// Until then, calls on this ledger are reserved on their own (it was too near its limit
    /// to lease), in parallel rather than one take statement at a time.
    per_call_until_ms: i64,
}

impl Entry {
    fn room(&self, c: Counter) -> u64 {
        self.held
            .get(c)
            .saturating_sub(self.in_flight.get(c))
            .saturating_sub(self.spent.get(c))
    }

    fn is_idle_and_empty(&self, now: i64) -> bool {
        self.per_call_until_ms <= now
            && self.lease_id.is_none()
            && self.in_flight == Amounts::default()
            && self.spent == Amounts::default()
    }
}

#[derive(Default)]
struct State {
    entries: HashMap<String, Entry>,
    /// Reservations granted from leases and not yet settled or released.
    holds: HashSet<String>,
    /// Ledgers a lease statement is under way for (see [`Leases::claim`]).
    busy: HashSet<String>,
}

pub(crate) struct Leases {
    pub(crate) owner: String,
    opts: LeaseOptions,
    state: Mutex<State>,
    /// Wakes those waiting for a ledger's lease statement to end. One statement at a time
    /// per ledger: each sends absolute amounts computed from this store's memory, so two at
    /// once on one ledger could undo each other; statements on other ledgers go on meanwhile.
    freed: tokio::sync::Notify,
    generations: AtomicU64,
}

/// What a take statement needs from memory, for the keys of one request.
pub(crate) struct TakeSnapshot {
    ids: Vec<String>,
    new_ids: Vec<String>,
    spent: Vec<i64>,
    keep: Vec<i64>,
}

/// What the database did with a request that found no room in the leases.
pub(crate) enum Taken {
    /// New leases are in memory: grant from them.
    Leased,
    /// Reserved on its own (near a limit): settle it as a plain reservation.
    Held,
    Refused(BudgetRefusal),
}

/// Which entries a [`Leases::report`] covers.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Due {
    /// Those whose report or renewal is due, and idle ones (returned).
    Timer,
    /// Every entry, returned (shutdown).
    ReturnAll,
}

fn lock(m: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn ms(d: Duration) -> i64 {
    budget::hold_ms(d)
}

impl Leases {
    pub(crate) fn new(opts: LeaseOptions) -> Self {
        Leases {
            owner: uuid::Uuid::new_v4().simple().to_string(),
            opts,
            state: Mutex::new(State::default()),
            freed: tokio::sync::Notify::new(),
            generations: AtomicU64::new(1),
        }
    }

    fn next_generation(&self) -> u64 {
        self.generations.fetch_add(1, Ordering::Relaxed)
    }

    /// The background task's period.
    pub(crate) fn tick(&self) -> Duration {
        (self.opts.idle / 2).clamp(Duration::from_millis(10), Duration::from_millis(500))
    }

    /// Whether leases can serve this request: every limit is on calls or model calls (the
    /// others are known only after a call ran), and each such limit counts this call.
    pub(crate) fn eligible(&self, req: &ReserveRequest, now: i64) -> bool {
        let per_call = {
            let st = lock(&self.state);
            req.ledgers.iter().any(|(k, _)| {
                st.entries
                    .get(&k.encode())
                    .is_some_and(|e| e.per_call_until_ms > now)
            })
        };
        !per_call
            && self.opts.divisor > 0
            && req.ledgers.iter().all(|(_, l)| {
                l.tokens.is_none()
                    && l.cost_micro_usd.is_none()
                    && l.bytes.is_none()
                    && LEASED
                        .iter()
                        .all(|&c| l.get(c).is_none() || req.amounts.get(c) > 0)
            })
    }

    /// Grants the call from this store's leases if every ledger with a limit has room.
    pub(crate) fn try_grant(&self, req: &ReserveRequest, now: i64) -> Option<Reservation> {
        let sorted = req.sorted();
        let took = counts(&req.amounts);
        let mut st = lock(&self.state);
        for (k, _, limits) in &sorted {
            let limited: Vec<Counter> = LEASED
                .into_iter()
                .filter(|&c| limits.get(c).is_some())
                .collect();
            if limited.is_empty() {
                continue;
            }
            let e = st.entries.get(k)?;
            e.lease_id.as_ref()?;
            if limited.iter().any(|&c| e.room(c) < took.get(c)) {
                return None;
            }
        }
        let mut generations = Vec::with_capacity(sorted.len());
        for (k, _, _) in &sorted {
            let e = st.entries.entry(k.clone()).or_insert_with(|| Entry {
                generation: self.next_generation(),
                ..Entry::default()
            });
            e.in_flight = e.in_flight.plus(&took);
            e.last_used_ms = now;
            generations.push(e.generation);
        }
        let id = uuid::Uuid::new_v4().simple().to_string();
        st.holds.insert(id.clone());
        Some(Reservation {
            id,
            ledgers: req.ledgers.clone(),
            amounts: req.amounts,
            expires_at_ms: now.saturating_add(ms(req.hold_for)),
            reserved_at_ms: now,
            lease: Some(LeaseTicket {
                owner: self.owner.clone(),
                generations,
            }),
        })
    }

    /// Ends a call granted from a lease: `actual` is what it spent (`None`: it did not run).
    /// Returns the keys whose limited counters it spent beyond what it held, which must be
    /// reported now to find overruns.
    pub(crate) fn finish_local(
        &self,
        r: &Reservation,
        ticket: &LeaseTicket,
        actual: Option<&Amounts>,
        now: i64,
    ) -> Result<Vec<String>> {
        let mut st = lock(&self.state);
        if !st.holds.remove(&r.id) {
            return Err(StateError::UnknownReservation { id: r.id.clone() });
        }
        let took = counts(&r.amounts);
        let mut sorted: Vec<_> = r.ledgers.iter().map(|(k, l)| (k.encode(), l)).collect();
        sorted.sort_by(|a, b| a.0.cmp(&b.0));
        let mut beyond = Vec::new();
        for ((k, limits), generation) in sorted.into_iter().zip(&ticket.generations) {
            let e = st.entries.entry(k.clone()).or_insert_with(|| Entry {
                generation: self.next_generation(),
                ..Entry::default()
            });
            e.last_used_ms = now;
            if e.generation == *generation {
                e.in_flight = e.in_flight.minus(&took);
                if let Some(a) = actual {
                    e.spent = e.spent.plus(a);
                }
            } else if let Some(a) = actual {
                // The lease it came from ran out or was dropped: what it held was counted as
                // spent, so only spending beyond it is charged.
                e.spent = e.spent.plus(&a.minus(&took));
            }
            if let Some(a) = actual
                && LEASED
                    .iter()
                    .any(|&c| limits.get(c).is_some() && a.get(c) > took.get(c))
            {
                beyond.push(k);
            }
        }
        Ok(beyond)
    }

    /// Takes what a take statement on `keys` reports from memory; until it returns, the
    /// leases on them have no room (their unused part is being given back).
    pub(crate) fn snapshot(&self, keys: &[String]) -> TakeSnapshot {
        let mut st = lock(&self.state);
        let mut snap = TakeSnapshot {
            ids: Vec::new(),
            new_ids: Vec::new(),
            spent: Vec::new(),
            keep: Vec::new(),
        };
        for k in keys {
            let e = st.entries.entry(k.clone()).or_insert_with(|| Entry {
                generation: self.next_generation(),
                ..Entry::default()
            });
            snap.ids.push(e.lease_id.clone().unwrap_or_default());
            snap.new_ids.push(uuid::Uuid::new_v4().simple().to_string());
            snap.spent.extend(e.spent.to_i64s());
            let keep = if e.lease_id.is_some() {
                counts(&e.in_flight)
            } else {
                Amounts::default()
            };
            snap.keep.extend(keep.to_i64s());
            e.spent = Amounts::default();
            e.held = keep;
        }
        snap
    }

    /// After a lease statement failed (its outcome unknown): never use these leases again.
    /// Calls in flight on them end as calls of a lost lease.
    pub(crate) fn abandon(&self, keys: &[String]) {
        let mut st = lock(&self.state);
        for k in keys {
            // Calls on a ledger without a lease held nothing that could be lost.
            if let Some(e) = st.entries.get_mut(k).filter(|e| e.lease_id.is_some()) {
                e.generation = self.next_generation();
                e.lease_id = None;
                e.held = Amounts::default();
                e.in_flight = Amounts::default();
            }
        }
    }

    /// Records a lease row the database returned.
    fn apply(&self, st: &mut State, key: &str, id: Option<String>, held: Amounts, state: &str) {
        let e = st.entries.entry(key.to_string()).or_insert_with(|| Entry {
            generation: self.next_generation(),
            ..Entry::default()
        });
        if state == "expired" {
            e.generation = self.next_generation();
            e.in_flight = Amounts::default();
        }
        e.lease_id = id;
        e.held = held;
    }

    /// The take statement for `req`'s ledgers (`keys`, sorted), on `client`.
    pub(crate) async fn take(
        &self,
        client: Client,
        req: &ReserveRequest,
        snap: &TakeSnapshot,
        hold_id: &str,
        now: i64,
    ) -> OpResult<(Taken, Option<Reservation>)> {
        let stmt = client.prepare_cached(TAKE).await?;
        let sorted = req.sorted();
        let keys: Vec<String> = sorted.iter().map(|(k, _, _)| k.clone()).collect();
        let limits: Vec<i64> = sorted
            .iter()
            .flat_map(|(_, _, l)| {
                Counter::ALL.map(|c| {
                    l.get(c)
                        .map_or(-1, |x| i64::try_from(x).unwrap_or(i64::MAX))
                })
            })
            .collect();
        let amounts = req.amounts.to_i64s().to_vec();
        let divisor = i64::try_from(self.opts.divisor).unwrap_or(i64::MAX);
        let min = i64::try_from(self.opts.min_calls).unwrap_or(i64::MAX);
        let lease_expires = now.saturating_add(ms(self.opts.lease_for));
        let hold_expires = now.saturating_add(ms(req.hold_for));
        let rows = client
            .query(
                &stmt,
                &[
                    &self.owner,
                    &keys,
                    &limits,
                    &amounts,
                    &now,
                    &snap.ids,
                    &snap.new_ids,
                    &snap.spent,
                    &snap.keep,
                    &divisor,
                    &min,
                    &lease_expires,
                    &hold_id,
                    &hold_expires,
                ],
            )
            .await
            .map_err(|e| match e.as_db_error().map(|d| d.code().code()) {
                Some("CM001") => OpError::MissingLedgers,
                _ => OpError::Pg(e),
            })?;
        let mut taken = Taken::Leased;
        let mut st = lock(&self.state);
        for row in &rows {
            let kind: String = col(row, 0)?;
            match kind.as_str() {
                "lease" => {
                    let key: String = col(row, 1)?;
                    let id: Option<String> = col(row, 2)?;
                    let held = amounts_of(col(row, 3)?)?;
                    let state: String = col(row, 4)?;
                    self.apply(&mut st, &key, id, held, &state);
                    if let Some(e) = st.entries.get_mut(&key) {
                        e.expires_at_ms = lease_expires;
                        e.last_report_ms = now;
                    }
                }
                "hold" => taken = Taken::Held,
                "refused" => {
                    let key: String = col(row, 1)?;
                    let counter: i32 = col(row, 5)?;
                    let ledger = sorted
                        .iter()
                        .find(|(k, _, _)| *k == key)
                        .map(|(_, k, _)| (*k).clone())
                        .ok_or_else(|| {
                            backend(format!(
                                "the refusal names ledger `{key}`, which was not asked for"
                            ))
                        })?;
                    let counter = usize::try_from(counter - 1)
                        .ok()
                        .and_then(|i| Counter::ALL.get(i).copied())
                        .ok_or_else(|| backend(format!("the refusal names counter {counter}")))?;
                    let u = |i| col::<i64>(row, i).map(|x| u64::try_from(x).unwrap_or(0));
                    taken = Taken::Refused(BudgetRefusal {
                        ledger,
                        counter,
                        used: u(6)?,
                        reserved: u(7)?,
                        limit: u(8)?,
                        amount: req.amounts.get(counter),
                    });
                }
                other => return Err(backend(format!("a lease statement returned `{other}`"))),
            }
        }
        if !matches!(taken, Taken::Leased) {
            let until = now.saturating_add(ms(self.opts.report_every));
            for k in &keys {
                if let Some(e) = st.entries.get_mut(k) {
                    e.per_call_until_ms = until;
                }
            }
        }
        let held = matches!(taken, Taken::Held).then(|| Reservation {
            id: hold_id.to_string(),
            ledgers: req.ledgers.clone(),
            amounts: req.amounts,
            expires_at_ms: hold_expires,
            reserved_at_ms: crate::clock::Clock::system().now_ms(),
            lease: None,
        });
        Ok((taken, held))
    }

    /// Whether a call granted from this store's leases is still held (not settled or released).
    pub(crate) fn holds(&self, id: &str) -> bool {
        lock(&self.state).holds.contains(id)
    }

    /// Reports spending and renews or returns leases (`due`), or only those of `only`; one
    /// statement for all of them. Returns each reported key's used counters afterwards.
    pub(crate) async fn report(
        &self,
        pool: &Pool,
        due: Due,
        only: Option<&[String]>,
        now: i64,
    ) -> std::result::Result<Vec<(String, Amounts)>, String> {
        let claim = match (due, only) {
            (_, Some(only)) => self.claim(only).await,
            (Due::ReturnAll, None) => {
                let all: Vec<String> = lock(&self.state).entries.keys().cloned().collect();
                self.claim(&all).await
            }
            // The timer skips ledgers a statement is under way for; it comes back soon.
            (Due::Timer, None) => self.claim_free(),
        };
        let explicit = only.is_some();
        let claimed: HashSet<&String> = claim.keys.iter().collect();
        let mut keys = Vec::new();
        let mut ids = Vec::new();
        let mut spent = Vec::new();
        let mut held = Vec::new();
        {
            let mut st = lock(&self.state);
            let idle_ms = ms(self.opts.idle);
            let every_ms = ms(self.opts.report_every);
            let half_ms = ms(self.opts.lease_for) / 2;
            let mut picked: Vec<&String> = st
                .entries
                .iter()
                .filter(|(k, e)| {
                    claimed.contains(k)
                        && (explicit
                            || (!e.is_idle_and_empty(now)
                                && (due == Due::ReturnAll
                                    || now - e.last_used_ms >= idle_ms
                                    || now - e.last_report_ms >= every_ms
                                    || (e.lease_id.is_some() && e.expires_at_ms - now <= half_ms))))
                })
                .map(|(k, _)| k)
                .collect();
            picked.sort();
            let picked: Vec<String> = picked.into_iter().cloned().collect();
            for k in picked {
                let Some(e) = st.entries.get_mut(&k) else {
                    continue;
                };
                let returning = due == Due::ReturnAll || now - e.last_used_ms >= idle_ms;
                let target = if e.lease_id.is_none() {
                    Amounts::default()
                } else if returning {
                    counts(&e.in_flight)
                } else {
                    counts(&e.held.minus(&counts(&e.spent)))
                };
                keys.push(k.clone());
                ids.push(e.lease_id.clone().unwrap_or_default());
                spent.extend(e.spent.to_i64s());
                held.extend(target.to_i64s());
                e.spent = Amounts::default();
                e.held = target;
                e.last_report_ms = now;
            }
            // Entries with nothing held, in flight or to report are forgotten.
            let reported: HashSet<&String> = keys.iter().collect();
            st.entries
                .retain(|k, e| reported.contains(k) || st_busy_or_live(&claimed, k, e, now));
        }
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let expires = now.saturating_add(ms(self.opts.lease_for));
        let out = async {
            let client = pool.get().await.map_err(|e| e.to_string())?;
            let stmt = client
                .prepare_cached(SYNC)
                .await
                .map_err(|e| e.to_string())?;
            client
                .query(
                    &stmt,
                    &[&self.owner, &keys, &ids, &spent, &held, &now, &expires],
                )
                .await
                .map_err(|e| e.to_string())
        }
        .await;
        let rows = match out {
            Ok(rows) => rows,
            Err(e) => {
                self.abandon(&keys);
                return Err(e);
            }
        };
        let mut used = Vec::new();
        let mut st = lock(&self.state);
        for row in &rows {
            let parsed = (|| -> OpResult<(String, String, Amounts)> {
                Ok((col(row, 0)?, col(row, 1)?, amounts_of(col(row, 2)?)?))
            })();
            let Ok((key, state, u)) = parsed else {
                continue;
            };
            if let Some(e) = st.entries.get_mut(&key) {
                match state.as_str() {
                    "expired" => {
                        e.generation = self.next_generation();
                        e.lease_id = None;
                        e.held = Amounts::default();
                        e.in_flight = Amounts::default();
                    }
                    "gone" => {
                        e.lease_id = None;
                        e.held = Amounts::default();
                    }
                    "live" => e.expires_at_ms = expires,
                    _ => {}
                }
            }
            used.push((key, u));
        }
        st.entries
            .retain(|k, e| st_busy_or_live(&claimed, k, e, now));
        Ok(used)
    }

    /// Charges `actual` to every ledger of `r` directly (a reservation another store leased).
    pub(crate) async fn charge_directly(
        &self,
        pool: &Pool,
        r: &Reservation,
        actual: &Amounts,
        now: i64,
    ) -> std::result::Result<Vec<(String, Amounts)>, String> {
        let keys = r.sorted_keys();
        let ids = vec![String::new(); keys.len()];
        let spent: Vec<i64> = keys.iter().flat_map(|_| actual.to_i64s()).collect();
        let held = vec![0i64; keys.len() * 5];
        let client = pool.get().await.map_err(|e| e.to_string())?;
        let stmt = client
            .prepare_cached(SYNC)
            .await
            .map_err(|e| e.to_string())?;
        let rows = client
            .query(
                &stmt,
                &[&self.owner, &keys, &ids, &spent, &held, &now, &now],
            )
            .await
            .map_err(|e| e.to_string())?;
        rows.iter()
            .map(|row| Ok((col(row, 0)?, amounts_of(col(row, 2)?)?)))
            .collect::<OpResult<Vec<_>>>()
            .map_err(|_| "a lease statement returned rows of the wrong shape".to_string())
    }

    /// Waits until no lease statement is under way on any of `keys`, then marks them busy
    /// until the returned claim is dropped.
    pub(crate) async fn claim(&self, keys: &[String]) -> Claim<'_> {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            {
                let mut st = lock(&self.state);
                if keys.iter().all(|k| !st.busy.contains(k)) {
                    st.busy.extend(keys.iter().cloned());
                    return Claim {
                        leases: self,
                        keys: keys.to_vec(),
                    };
                }
            }
            freed.await;
        }
    }

    /// Claims every ledger in memory that no statement is under way for.
    fn claim_free(&self) -> Claim<'_> {
        let mut st = lock(&self.state);
        let free: Vec<String> = st
            .entries
            .keys()
            .filter(|k| !st.busy.contains(*k))
            .cloned()
            .collect();
        st.busy.extend(free.iter().cloned());
        Claim {
            leases: self,
            keys: free,
        }
    }
}

/// Ledgers this task runs a lease statement for; released on drop (also when cancelled).
pub(crate) struct Claim<'a> {
    leases: &'a Leases,
    keys: Vec<String>,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        let mut st = lock(&self.leases.state);
        for k in &self.keys {
            st.busy.remove(k);
        }
        drop(st);
        self.leases.freed.notify_waiters();
    }
}

/// Whether an entry is kept in memory: something is held, in flight or unreported, or another
/// task runs a statement for it.
fn st_busy_or_live(claimed: &HashSet<&String>, k: &String, e: &Entry, now: i64) -> bool {
    !claimed.contains(k) || !e.is_idle_and_empty(now)
}

/// Overruns of `r`'s ledgers given their used counters after a report.
pub(crate) fn overruns_of(r: &Reservation, used: &[(String, Amounts)]) -> Vec<Overrun> {
    let mut sorted: Vec<_> = r.ledgers.iter().map(|(k, l)| (k.encode(), k, l)).collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    sorted
        .into_iter()
        .flat_map(|(k, key, limits)| {
            used.iter()
                .find(|(x, _)| *x == k)
                .map(|(_, u)| budget::overruns(key, u, limits))
                .unwrap_or_default()
        })
        .collect()
}

fn backend(detail: String) -> OpError {
    OpError::State(StateError::Backend {
        location: String::new(),
        detail,
    })
}
