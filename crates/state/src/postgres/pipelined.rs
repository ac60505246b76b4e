//! The operations on every gated call (charging budgets, appending audit lines), in as few
//! round trips as their decisions allow.
//!
//! Charging a budget is one statement: a function (`codemode_reserve`,
//! `codemode_finish_hold`, see `schema/postgres_v1.sql`) that locks the ledgers, decides and
//! writes inside the server, so shared ledgers stay locked only while it runs. An audit
//! append needs the caller's closure between reading the head and writing the line, so it
//! pipelines: `BEGIN` and the head's lock in one round trip, the writes and `COMMIT` in the
//! next. If a write in that second batch fails, the `COMMIT` after it only ends the failed
//! transaction (PostgreSQL rolls it back), and the write's error is returned. A connection
//! left inside a transaction (the caller stopped waiting, or a round trip failed) is not
//! returned to the pool but closed, which rolls it back.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

use deadpool_postgres::{Client, Object};
use futures::future::{BoxFuture, join_all};
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use super::ops::{OpError, OpResult};
use crate::audit::{self, AuditHead, AuditLineFn, AuditRecord};
use crate::budget::{
    self, Amounts, BudgetRefusal, Counter, LedgerKey, LedgerSnapshot, Limits, Reservation,
    ReserveOutcome, ReserveRequest, SettleOutcome,
};
use crate::error::StateError;

const RESERVE: &str = "SELECT refused_key, refused_counter, used, reserved, lim
     FROM codemode_reserve($1, $2, $3, $4, $5, $6)";
const FINISH_HOLD: &str = "SELECT key, used, reserved FROM codemode_finish_hold($1, $2, $3, $4)";
const LOCK_LEDGER: &str = "SELECT codemode_lock_ledgers($1, $2)";
const READ_LEDGER: &str = "SELECT ARRAY[used_calls, used_model_calls, used_tokens, \
     used_cost_micro_usd, used_bytes], ARRAY[reserved_calls, reserved_model_calls, \
     reserved_tokens, reserved_cost_micro_usd, reserved_bytes] FROM budget_ledgers WHERE key = $1";

const HEAD_ROW: &str = "INSERT INTO audit_heads (stream, seq, hash) VALUES ($1, 0, '') ON CONFLICT (stream) DO NOTHING";
const LOCK_HEAD: &str = "SELECT seq, hash FROM audit_heads WHERE stream = $1 FOR UPDATE";
const INSERT_LINE: &str = "INSERT INTO audit_lines (stream, seq, prev, hash, line, at_ms) VALUES ($1, $2, $3, $4, $5, $6)";
const MOVE_HEAD: &str = "UPDATE audit_heads SET seq = $2, hash = $3 WHERE stream = $1";

/// A pooled connection that may be inside a transaction; see the module docs for drops.
struct TxConn {
    client: Option<Client>,
    in_tx: AtomicBool,
}

impl Drop for TxConn {
    fn drop(&mut self) {
        if self.in_tx.load(Ordering::Relaxed)
            && let Some(c) = self.client.take()
        {
            // Detached from the pool and dropped: the connection closes, the server rolls back.
            drop(Object::take(c));
        }
    }
}

type Write<'a> = BoxFuture<'a, Result<(), tokio_postgres::Error>>;

impl TxConn {
    fn new(client: Client) -> Self {
        TxConn {
            client: Some(client),
            in_tx: AtomicBool::new(false),
        }
    }

    fn c(&self) -> &Client {
        // Only `drop` takes the client out.
        self.client
            .as_ref()
            .expect("the client is there until drop")
    }

    /// From here until COMMIT or ROLLBACK returns, a drop closes the connection.
    fn entering_tx(&self) {
        self.in_tx.store(true, Ordering::Relaxed);
    }

    fn left_tx(&self) {
        self.in_tx.store(false, Ordering::Relaxed);
    }

    async fn rollback(&self) -> OpResult<()> {
        self.c().batch_execute("ROLLBACK").await?;
        self.left_tx();
        Ok(())
    }

    /// Sends `writes` then `COMMIT` in one round trip; fails with the first write's error.
    async fn commit_with(&self, writes: Vec<Write<'_>>) -> OpResult<()> {
        let mut all = writes;
        all.push(Box::pin(self.c().batch_execute("COMMIT")));
        let mut results = join_all(all).await;
        let commit = results.pop().unwrap_or(Ok(()));
        // Whatever the writes did, a COMMIT that returned ended the transaction.
        if commit.is_ok() {
            self.left_tx();
        }
        for r in results {
            r?;
        }
        Ok(commit?)
    }
}

fn col<'r, T: tokio_postgres::types::FromSql<'r>>(row: &'r Row, i: usize) -> OpResult<T> {
    row.try_get(i).map_err(|e| {
        OpError::State(StateError::Corrupt {
            location: String::new(),
            detail: format!("column {i} does not have the expected type: {e}"),
        })
    })
}

fn amounts_of(v: Vec<i64>) -> OpResult<Amounts> {
    let arr: [i64; 5] = v.try_into().map_err(|v: Vec<i64>| {
        OpError::State(StateError::Corrupt {
            location: String::new(),
            detail: format!("a ledger has {} counters instead of 5", v.len()),
        })
    })?;
    Ok(Amounts::from_i64s(arr))
}

/// The functions' own errors (`CM001`, `CM002`) as what they mean.
fn function_error(e: tokio_postgres::Error, reservation: &str) -> OpError {
    match e.as_db_error().map(|d| d.code().code()) {
        Some("CM001") => OpError::MissingLedgers,
        Some("CM002") => OpError::State(StateError::UnknownReservation {
            id: reservation.to_string(),
        }),
        _ => OpError::Pg(e),
    }
}

fn limit_i64(l: Option<u64>) -> i64 {
    l.map_or(-1, |l| i64::try_from(l).unwrap_or(i64::MAX))
}

pub(crate) async fn reserve(
    client: Client,
    req: &ReserveRequest,
    id: String,
    now: i64,
) -> OpResult<ReserveOutcome> {
    let stmt = client.prepare_cached(RESERVE).await?;
    let sorted = req.sorted();
    let keys: Vec<String> = sorted.iter().map(|(k, _, _)| k.clone()).collect();
    let limits: Vec<i64> = sorted
        .iter()
        .flat_map(|(_, _, l)| Counter::ALL.map(|c| limit_i64(l.get(c))))
        .collect();
    let amounts: Vec<i64> = req.amounts.to_i64s().to_vec();
    let expires_at_ms = now.saturating_add(budget::hold_ms(req.hold_for));
    let rows = client
        .query(
            &stmt,
            &[&id, &keys, &limits, &amounts, &now, &expires_at_ms],
        )
        .await
        .map_err(|e| function_error(e, &id))?;
    let Some(r) = rows.first() else {
        return Ok(ReserveOutcome::Granted(Reservation {
            id,
            ledgers: req.ledgers.clone(),
            amounts: req.amounts,
            expires_at_ms,
        }));
    };
    let key: String = col(r, 0)?;
    let counter: i32 = col(r, 1)?;
    let (ledger, _) = sorted
        .iter()
        .find(|(k, _, _)| *k == key)
        .map(|(_, k, l)| (*k, *l))
        .ok_or_else(|| {
            OpError::State(StateError::Backend {
                location: String::new(),
                detail: format!("the refusal names ledger `{key}`, which was not asked for"),
            })
        })?;
    let counter = usize::try_from(counter - 1)
        .ok()
        .and_then(|i| Counter::ALL.get(i).copied())
        .ok_or_else(|| corrupt_counter(counter))?;
    let u64_of = |x: i64| u64::try_from(x).unwrap_or(0);
    Ok(ReserveOutcome::Refused(BudgetRefusal {
        ledger: ledger.clone(),
        counter,
        used: u64_of(col(r, 2)?),
        reserved: u64_of(col(r, 3)?),
        limit: u64_of(col(r, 4)?),
        amount: req.amounts.get(counter),
    }))
}

fn corrupt_counter(c: i32) -> OpError {
    OpError::State(StateError::Backend {
        location: String::new(),
        detail: format!("the refusal names counter {c}, which does not exist"),
    })
}

/// Settles (`actual` is `Some`) or releases a reservation.
pub(crate) async fn finish_hold(
    client: Client,
    r: &Reservation,
    actual: Option<&Amounts>,
    now: i64,
) -> OpResult<Option<SettleOutcome>> {
    let stmt = client.prepare_cached(FINISH_HOLD).await?;
    let keys = r.sorted_keys();
    let actual_arr: Option<Vec<i64>> = actual.map(|a| a.to_i64s().to_vec());
    let rows = client
        .query(&stmt, &[&r.id, &keys, &actual_arr, &now])
        .await
        .map_err(|e| function_error(e, &r.id))?;
    if actual.is_none() {
        return Ok(None);
    }
    let mut by_key = BTreeMap::new();
    for row in &rows {
        let key: String = col(row, 0)?;
        by_key.insert(key, (amounts_of(col(row, 1)?)?, amounts_of(col(row, 2)?)?));
    }
    let mut sorted: Vec<(String, &LedgerKey, &Limits)> =
        r.ledgers.iter().map(|(k, l)| (k.encode(), k, l)).collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let mut ledgers = Vec::new();
    let mut overruns = Vec::new();
    for (k, key, limits) in sorted {
        let (used, reserved) = by_key.get(&k).copied().unwrap_or_default();
        overruns.extend(budget::overruns(key, &used, limits));
        ledgers.push(LedgerSnapshot {
            key: key.clone(),
            used,
            reserved,
        });
    }
    Ok(Some(SettleOutcome { ledgers, overruns }))
}

/// Locks the ledger (giving back holds that ran out), reads it and commits, in one round trip.
pub(crate) async fn get_ledger(
    client: Client,
    key: &LedgerKey,
    now: i64,
) -> OpResult<LedgerSnapshot> {
    let conn = TxConn::new(client);
    let c = conn.c();
    let (lock, read) = (
        c.prepare_cached(LOCK_LEDGER).await?,
        c.prepare_cached(READ_LEDGER).await?,
    );
    let k = vec![key.encode()];
    conn.entering_tx();
    let lock_params: [&(dyn ToSql + Sync); 2] = [&k, &now];
    let read_params: [&(dyn ToSql + Sync); 1] = [&k[0]];
    let (begin, locked, row, commit) = tokio::join!(
        c.batch_execute("BEGIN"),
        c.query(&lock, &lock_params),
        c.query_opt(&read, &read_params),
        c.batch_execute("COMMIT"),
    );
    let commit = commit.map_err(OpError::Pg);
    if commit.is_ok() {
        conn.left_tx();
    }
    begin?;
    locked.map_err(|e| function_error(e, ""))?;
    let row = row?;
    commit?;
    let row = row.ok_or(OpError::MissingLedgers)?;
    Ok(LedgerSnapshot {
        key: key.clone(),
        used: amounts_of(col(&row, 0)?)?,
        reserved: amounts_of(col(&row, 1)?)?,
    })
}

pub(crate) async fn append_audit(
    client: Client,
    stream: &str,
    make: AuditLineFn,
    now: i64,
) -> OpResult<AuditRecord> {
    let conn = TxConn::new(client);
    let c = conn.c();
    let (head_row, lock_head, insert, move_head) = (
        c.prepare_cached(HEAD_ROW).await?,
        c.prepare_cached(LOCK_HEAD).await?,
        c.prepare_cached(INSERT_LINE).await?,
        c.prepare_cached(MOVE_HEAD).await?,
    );
    conn.entering_tx();
    let c = conn.c();
    // The head row is the lock every append to the stream takes; it is created empty first.
    let stream_param: [&(dyn ToSql + Sync); 1] = [&stream];
    let (begin, created, head) = tokio::join!(
        c.batch_execute("BEGIN"),
        c.execute(&head_row, &stream_param),
        c.query_opt(&lock_head, &stream_param),
    );
    begin?;
    created?;
    let head = match head? {
        Some(r) => {
            let hash: String = col(&r, 1)?;
            AuditHead {
                seq: u64::try_from(col::<i64>(&r, 0)?).unwrap_or(0),
                hash: (!hash.is_empty()).then_some(hash),
            }
        }
        None => AuditHead::default(),
    };
    let rec = match audit::make_line(stream, &head, make, now) {
        Ok(rec) => rec,
        Err(e) => {
            conn.rollback().await?;
            return Err(e.into());
        }
    };
    let seq = i64::try_from(rec.seq).unwrap_or(i64::MAX);
    let prev = rec.prev.as_deref().unwrap_or("");
    let c = conn.c();
    let line_params: [&(dyn ToSql + Sync); 6] = [&stream, &seq, &prev, &rec.hash, &rec.line, &now];
    let head_params: [&(dyn ToSql + Sync); 3] = [&stream, &seq, &rec.hash];
    let writes: Vec<Write<'_>> = vec![
        Box::pin(async { c.execute(&insert, &line_params).await.map(|_| ()) }),
        Box::pin(async { c.execute(&move_head, &head_params).await.map(|_| ()) }),
    ];
    conn.commit_with(writes).await?;
    Ok(rec)
}
