//! The operations on every gated call (charging budgets, appending audit lines), in two round
//! trips each instead of one per statement.
//!
//! A budget decision needs the locked rows before it can write, so it cannot be one
//! statement without moving the rules into SQL. Instead the statements are pipelined: the
//! first round trip sends `BEGIN`, the locking `SELECT … FOR UPDATE` and what else can go
//! before the decision; the second sends every write and `COMMIT`. The server still runs them
//! one after another in one transaction, so the locking is exactly that of the plain version,
//! and rows stay locked for one round trip rather than several.
//!
//! If a write in the second batch fails, the `COMMIT` after it only ends the failed
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
    self, Amounts, LedgerKey, LedgerSnapshot, Reservation, ReserveOutcome, ReserveRequest,
    SettleOutcome,
};
use crate::error::StateError;

const LOCK: &str = "SELECT key, used_calls, used_model_calls, used_tokens, used_cost_micro_usd, \
     used_bytes, reserved_calls, reserved_model_calls, reserved_tokens, reserved_cost_micro_usd, \
     reserved_bytes FROM budget_ledgers WHERE key = ANY($1) ORDER BY key FOR UPDATE";

const EXPIRE: &str = "UPDATE budget_holds SET expired = 1
     WHERE ledger = ANY($1) AND expired = 0 AND expires_at_ms <= $2
     RETURNING ledger, calls, model_calls, tokens, cost_micro_usd, bytes";

const TAKE_HOLD: &str = "DELETE FROM budget_holds WHERE id = $1
     RETURNING ledger, expired, calls, model_calls, tokens, cost_micro_usd, bytes";

const WRITE_LEDGER: &str = "UPDATE budget_ledgers SET used_calls = $2, used_model_calls = $3, \
     used_tokens = $4, used_cost_micro_usd = $5, used_bytes = $6, reserved_calls = $7, \
     reserved_model_calls = $8, reserved_tokens = $9, reserved_cost_micro_usd = $10, \
     reserved_bytes = $11 WHERE key = $1";

const INSERT_HOLDS: &str = "INSERT INTO budget_holds
     (id, ledger, calls, model_calls, tokens, cost_micro_usd, bytes, expires_at_ms)
     SELECT $1, k, $3, $4, $5, $6, $7, $8 FROM unnest($2::text[]) AS t(k)";

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

    async fn rollback(&self) -> OpResult<()> {
        self.c().batch_execute("ROLLBACK").await?;
        self.in_tx.store(false, Ordering::Relaxed);
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
            self.in_tx.store(false, Ordering::Relaxed);
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

fn amounts_at(r: &Row, start: usize) -> OpResult<Amounts> {
    let mut v = [0i64; 5];
    for (i, x) in v.iter_mut().enumerate() {
        *x = col(r, start + i)?;
    }
    Ok(Amounts::from_i64s(v))
}

/// The ledgers as locked, with expired holds given back; and whether any expired.
struct Locked {
    ledgers: BTreeMap<String, (Amounts, Amounts)>,
    expired_any: bool,
    /// For settle/release: the taken hold's rows, ledger → amounts still held.
    hold: BTreeMap<String, Option<Amounts>>,
}

/// Round trip 1: `BEGIN`, lock the ledgers in key order, expire their holds that ran out,
/// and (for settle and release) take the hold's rows.
async fn lock(conn: &TxConn, keys: &[String], now: i64, hold_id: Option<&str>) -> OpResult<Locked> {
    let c = conn.c();
    let lock = c.prepare_cached(LOCK).await?;
    let expire = c.prepare_cached(EXPIRE).await?;
    let take = match hold_id {
        Some(_) => Some(c.prepare_cached(TAKE_HOLD).await?),
        None => None,
    };
    conn.entering_tx();
    let c = conn.c();
    let id = hold_id.unwrap_or_default();
    let lock_params: [&(dyn ToSql + Sync); 1] = [&keys];
    let expire_params: [&(dyn ToSql + Sync); 2] = [&keys, &now];
    let take_params: [&(dyn ToSql + Sync); 1] = [&id];
    let (begin, locked, expired, taken) = tokio::join!(
        c.batch_execute("BEGIN"),
        c.query(&lock, &lock_params),
        c.query(&expire, &expire_params),
        async {
            match &take {
                Some(t) => c.query(t, &take_params).await,
                None => Ok(Vec::new()),
            }
        }
    );
    begin?;
    let (locked, expired, taken) = (locked?, expired?, taken?);
    let mut ledgers = BTreeMap::new();
    for r in &locked {
        ledgers.insert(col::<String>(r, 0)?, (amounts_at(r, 1)?, amounts_at(r, 6)?));
    }
    if ledgers.len() < keys.len() {
        conn.rollback().await?;
        return Err(OpError::MissingLedgers);
    }
    for r in &expired {
        let key: String = col(r, 0)?;
        if let Some((_, reserved)) = ledgers.get_mut(&key) {
            *reserved = reserved.minus(&amounts_at(r, 1)?);
        }
    }
    let mut hold = BTreeMap::new();
    for r in &taken {
        let expired_flag: i64 = col(r, 1)?;
        let held = if expired_flag == 0 {
            Some(amounts_at(r, 2)?)
        } else {
            None
        };
        hold.insert(col::<String>(r, 0)?, held);
    }
    Ok(Locked {
        ledgers,
        expired_any: !expired.is_empty(),
        hold,
    })
}

/// The statements writing ledgers' new values.
fn ledger_writes<'a>(
    c: &'a Client,
    stmt: &'a tokio_postgres::Statement,
    values: &'a [(String, [i64; 5], [i64; 5])],
) -> Vec<Write<'a>> {
    values
        .iter()
        .map(|(k, u, h)| {
            let params: [&(dyn ToSql + Sync); 11] = [
                k, &u[0], &u[1], &u[2], &u[3], &u[4], &h[0], &h[1], &h[2], &h[3], &h[4],
            ];
            let fut = async move { c.execute(stmt, &params).await.map(|_| ()) };
            Box::pin(fut) as Write<'a>
        })
        .collect()
}

pub(crate) async fn reserve(
    client: Client,
    req: &ReserveRequest,
    id: String,
    now: i64,
) -> OpResult<ReserveOutcome> {
    let conn = TxConn::new(client);
    let write = conn.c().prepare_cached(WRITE_LEDGER).await?;
    let insert = conn.c().prepare_cached(INSERT_HOLDS).await?;
    let sorted = req.sorted();
    let keys: Vec<String> = sorted.iter().map(|(k, _, _)| k.clone()).collect();
    let locked = lock(&conn, &keys, now, None).await?;
    for (k, key, limits) in &sorted {
        let (used, reserved) = locked.ledgers.get(k).copied().unwrap_or_default();
        if let Err(refusal) = budget::check_room(key, &used, &reserved, limits, &req.amounts) {
            if locked.expired_any {
                // Keep the expiries: write the corrected ledgers.
                let values: Vec<_> = locked
                    .ledgers
                    .iter()
                    .map(|(k, (u, h))| (k.clone(), u.to_i64s(), h.to_i64s()))
                    .collect();
                let c = conn.c();
                conn.commit_with(ledger_writes(c, &write, &values)).await?;
            } else {
                conn.rollback().await?;
            }
            return Ok(ReserveOutcome::Refused(refusal));
        }
    }
    let values: Vec<_> = locked
        .ledgers
        .iter()
        .map(|(k, (u, h))| (k.clone(), u.to_i64s(), h.plus(&req.amounts).to_i64s()))
        .collect();
    let expires_at_ms = now.saturating_add(budget::hold_ms(req.hold_for));
    let a = req.amounts.to_i64s();
    let hold_params: [&(dyn ToSql + Sync); 8] = [
        &id,
        &keys,
        &a[0],
        &a[1],
        &a[2],
        &a[3],
        &a[4],
        &expires_at_ms,
    ];
    let c = conn.c();
    let mut writes = ledger_writes(c, &write, &values);
    writes.push(Box::pin(async {
        c.execute(&insert, &hold_params).await.map(|_| ())
    }));
    conn.commit_with(writes).await?;
    Ok(ReserveOutcome::Granted(Reservation {
        id,
        ledgers: req.ledgers.clone(),
        amounts: req.amounts,
        expires_at_ms,
    }))
}

/// Settles (`actual` is `Some`) or releases a reservation.
pub(crate) async fn finish_hold(
    client: Client,
    r: &Reservation,
    actual: Option<&Amounts>,
    now: i64,
) -> OpResult<Option<SettleOutcome>> {
    let conn = TxConn::new(client);
    let write = conn.c().prepare_cached(WRITE_LEDGER).await?;
    let keys = r.sorted_keys();
    let locked = lock(&conn, &keys, now, Some(&r.id)).await?;
    if locked.hold.is_empty() {
        conn.rollback().await?;
        return Err(StateError::UnknownReservation { id: r.id.clone() }.into());
    }
    let mut sorted: Vec<(String, &LedgerKey, &budget::Limits)> =
        r.ledgers.iter().map(|(k, l)| (k.encode(), k, l)).collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let mut snapshots = Vec::new();
    let mut overruns = Vec::new();
    let mut values = Vec::new();
    for (k, key, limits) in sorted {
        let (mut used, mut reserved) = locked.ledgers.get(&k).copied().unwrap_or_default();
        if let Some(Some(held)) = locked.hold.get(&k) {
            reserved = reserved.minus(held);
        }
        if let Some(actual) = actual {
            used = used.plus(actual);
            overruns.extend(budget::overruns(key, &used, limits));
        }
        values.push((k, used.to_i64s(), reserved.to_i64s()));
        snapshots.push(LedgerSnapshot {
            key: key.clone(),
            used,
            reserved,
        });
    }
    // Ledgers whose holds expired but that this reservation does not name (none in
    // practice: the lock covers exactly its ledgers) need no write.
    let c = conn.c();
    conn.commit_with(ledger_writes(c, &write, &values)).await?;
    Ok(actual.map(|_| SettleOutcome {
        ledgers: snapshots,
        overruns,
    }))
}

pub(crate) async fn get_ledger(
    client: Client,
    key: &LedgerKey,
    now: i64,
) -> OpResult<LedgerSnapshot> {
    let conn = TxConn::new(client);
    let write = conn.c().prepare_cached(WRITE_LEDGER).await?;
    let k = key.encode();
    let locked = lock(&conn, std::slice::from_ref(&k), now, None).await?;
    let (used, reserved) = locked.ledgers.get(&k).copied().unwrap_or_default();
    if locked.expired_any {
        let values = vec![(k, used.to_i64s(), reserved.to_i64s())];
        let c = conn.c();
        conn.commit_with(ledger_writes(c, &write, &values)).await?;
    } else {
        conn.rollback().await?;
    }
    Ok(LedgerSnapshot {
        key: key.clone(),
        used,
        reserved,
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
