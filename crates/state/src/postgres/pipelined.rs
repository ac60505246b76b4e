//! The budget operations on every gated call, one round trip each, and the pipelined
//! transaction the other round-trip-saving code shares.
//!
//! Charging a budget is one statement: a function (`codemode_reserve`,
//! `codemode_finish_hold`, see `schema/postgres_v1.sql` and `postgres_v2.sql`) that locks the
//! ledgers, decides and writes inside the server, so shared ledgers stay locked only while it
//! runs. A reservation commits without waiting for the disk (see [`reserve`]), and so does a
//! settle that the call's durable audit line follows. A connection left inside a pipelined
//! transaction (the caller stopped waiting, or a round trip failed) is not returned to the
//! pool but closed, which rolls it back.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

use deadpool_postgres::{Client, Object};
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use super::ops::{OpError, OpResult};
use crate::budget::{
    self, Amounts, BudgetRefusal, Counter, LedgerKey, LedgerSnapshot, Limits, Reservation,
    ReserveOutcome, ReserveRequest, SettleOutcome,
};
use crate::error::StateError;

const RESERVE: &str = "SELECT refused_key, refused_counter, used, reserved, lim
     FROM codemode_reserve($1, $2, $3, $4, $5, $6, false)";
const FINISH_HOLD: &str =
    "SELECT key, used, reserved FROM codemode_finish_hold($1, $2, $3, $4, $5, $6)";
const LOCK_LEDGER: &str = "SELECT codemode_lock_ledgers($1, $2)";
const READ_LEDGER: &str = "SELECT ARRAY[used_calls, used_model_calls, used_tokens, \
     used_cost_micro_usd, used_bytes], ARRAY[reserved_calls, reserved_model_calls, \
     reserved_tokens, reserved_cost_micro_usd, reserved_bytes] FROM budget_ledgers WHERE key = $1";

/// A pooled connection that may be inside a transaction; see the module docs for drops.
pub(crate) struct TxConn {
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

impl TxConn {
    pub(crate) fn new(client: Client) -> Self {
        TxConn {
            client: Some(client),
            in_tx: AtomicBool::new(false),
        }
    }

    pub(crate) fn c(&self) -> &Client {
        // Only `drop` takes the client out.
        self.client
            .as_ref()
            .expect("the client is there until drop")
    }

    /// From here until COMMIT or ROLLBACK returns, a drop closes the connection.
    pub(crate) fn entering_tx(&self) {
        self.in_tx.store(true, Ordering::Relaxed);
    }

    fn left_tx(&self) {
        self.in_tx.store(false, Ordering::Relaxed);
    }

    pub(crate) async fn rollback(&self) -> OpResult<()> {
        self.c().batch_execute("ROLLBACK").await?;
        self.left_tx();
        Ok(())
    }

    /// Sends `COMMIT`; pipelined after a transaction's last statements, it costs no round trip
    /// of its own.
    pub(crate) async fn commit(&self) -> Result<(), tokio_postgres::Error> {
        self.c().batch_execute("COMMIT").await?;
        self.left_tx();
        Ok(())
    }
}

pub(super) fn col<'r, T: tokio_postgres::types::FromSql<'r>>(
    row: &'r Row,
    i: usize,
) -> OpResult<T> {
    row.try_get(i).map_err(|e| {
        OpError::State(StateError::Corrupt {
            location: String::new(),
            detail: format!("column {i} does not have the expected type: {e}"),
        })
    })
}

pub(super) fn amounts_of(v: Vec<i64>) -> OpResult<Amounts> {
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

/// Holds the amounts, in one statement whose commit does not wait for the disk flush.
///
/// Other replicas see the hold as soon as it commits, flushed or not, so the budget is exact
/// across replicas. What this gives up: if the PostgreSQL server crashes (not a replica: the
/// server) within the moment before its write-ahead log reaches the disk (`wal_writer_delay`,
/// 200 ms by default, at most three times that; any durable commit flushes it sooner), the
/// hold of a call in flight is lost; the budget briefly counts that call as not reserved, and
/// its settle, finding no hold and a server started since the reservation, charges what the
/// call spent all the same. The call's settle and its audit line are durable as before.
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
            reserved_at_ms: crate::clock::Clock::system().now_ms(),
            lease: None,
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

/// Settles (`actual` is `Some`) or releases a reservation. Not `durable`: the commit does
/// not wait for the disk, for a caller whose next write is a durable commit on this database
/// (the call's audit line), which flushes this one with it, since the log is flushed in order.
pub(crate) async fn finish_hold(
    client: Client,
    r: &Reservation,
    actual: Option<&Amounts>,
    now: i64,
    durable: bool,
) -> OpResult<Option<SettleOutcome>> {
    let stmt = client.prepare_cached(FINISH_HOLD).await?;
    let keys = r.sorted_keys();
    let actual_arr: Option<Vec<i64>> = actual.map(|a| a.to_i64s().to_vec());
    // How long ago the reservation was made (0 when unknown: only a restart in the last second
    // then counts as having lost it).
    let age_ms = if r.reserved_at_ms > 0 {
        crate::clock::Clock::system()
            .now_ms()
            .saturating_sub(r.reserved_at_ms)
            .max(0)
    } else {
        0
    };
    let rows = client
        .query(&stmt, &[&r.id, &keys, &actual_arr, &now, &age_ms, &durable])
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
