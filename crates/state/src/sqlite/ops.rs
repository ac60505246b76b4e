//! The SQLite operations, each run on the store's connection thread inside one transaction.
//!
//! Write transactions begin `IMMEDIATE`: they take SQLite's write lock before reading, so a
//! read-then-decide-then-write inside one is never interleaved with another writer, in this
//! process or another one on the same file (the busy timeout makes the second writer wait).

use std::collections::BTreeMap;

use rusqlite::{Connection, OptionalExtension, Row, Transaction, TransactionBehavior, params};
use serde_json::Value;

use crate::approval::{self, Answer, ApprovalQuery, ApprovalRecord, ApprovalState, NewApproval};
use crate::audit::{self, AuditHead, AuditLineFn, AuditRecord};
use crate::budget::{
    self, Amounts, LedgerKey, LedgerSnapshot, Reservation, ReserveOutcome, ReserveRequest,
    SettleOutcome,
};
use crate::cell::{self, CellRecord, CellStatus, CellUpdate, NewCell, ReplayEntry};
use crate::error::StateError;
use crate::session::{SessionRecord, StoreChange};
use crate::validate::json_text;

/// An operation's failure: a rule of the store, or SQLite itself (mapped to a [`StateError`]
/// naming the file by the caller).
pub(crate) enum OpError {
    State(StateError),
    Sqlite(rusqlite::Error),
}

impl From<StateError> for OpError {
    fn from(e: StateError) -> Self {
        OpError::State(e)
    }
}

impl From<rusqlite::Error> for OpError {
    fn from(e: rusqlite::Error) -> Self {
        OpError::Sqlite(e)
    }
}

pub(crate) type OpResult<T> = Result<T, OpError>;

/// Statements are prepared once per connection and kept (parsing SQL costs as much as
/// running these small statements).
fn exec(conn: &Connection, sql: &str, p: impl rusqlite::Params) -> rusqlite::Result<usize> {
    conn.prepare_cached(sql)?.execute(p)
}

fn row<T>(
    conn: &Connection,
    sql: &str,
    p: impl rusqlite::Params,
    f: impl FnOnce(&Row<'_>) -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    conn.prepare_cached(sql)?.query_row(p, f)
}

fn write_tx(conn: &mut Connection) -> rusqlite::Result<Transaction<'_>> {
    conn.transaction_with_behavior(TransactionBehavior::Immediate)
}

/// Stored JSON that no longer parses is damage, not bad input.
fn json(text: &str) -> OpResult<Value> {
    serde_json::from_str(text).map_err(|e| {
        OpError::State(StateError::Corrupt {
            location: String::new(),
            detail: format!("a stored JSON value does not parse: {e}"),
        })
    })
}

fn corrupt(detail: String) -> OpError {
    OpError::State(StateError::Corrupt {
        location: String::new(),
        detail,
    })
}

// --- sessions -----------------------------------------------------------------------------

fn session_row(r: &Row<'_>) -> rusqlite::Result<SessionRecord> {
    Ok(SessionRecord {
        id: r.get(0)?,
        principal: r.get(1)?,
        created_at_ms: r.get(2)?,
        last_seen_ms: r.get(3)?,
    })
}

const SESSION_COLS: &str = "id, principal, created_at_ms, last_seen_ms";

pub(crate) fn open_session(
    conn: &mut Connection,
    id: &str,
    principal: Option<&str>,
    now: i64,
) -> OpResult<SessionRecord> {
    let tx = write_tx(conn)?;
    // An ended session's row is left as it is: it is not begun again.
    exec(
        &tx,
        "INSERT INTO sessions (id, principal, created_at_ms, last_seen_ms) VALUES (?1, ?2, ?3, ?3)
         ON CONFLICT (id) DO UPDATE SET last_seen_ms = max(last_seen_ms, excluded.last_seen_ms)
          WHERE ended_at_ms IS NULL",
        params![id, principal, now],
    )?;
    let s = live_session(&tx, id)?.ok_or_else(|| crate::session::ended(id))?;
    tx.commit()?;
    Ok(s)
}

pub(crate) fn touch_session(conn: &mut Connection, id: &str, now: i64) -> OpResult<SessionRecord> {
    let tx = write_tx(conn)?;
    exec(
        &tx,
        "UPDATE sessions SET last_seen_ms = max(last_seen_ms, ?2)
          WHERE id = ?1 AND ended_at_ms IS NULL",
        params![id, now],
    )?;
    let s = live_session(&tx, id)?.ok_or_else(|| crate::session::ended(id))?;
    tx.commit()?;
    Ok(s)
}

fn live_session(conn: &Connection, id: &str) -> OpResult<Option<SessionRecord>> {
    Ok(row(
        conn,
        &format!("SELECT {SESSION_COLS} FROM sessions WHERE id = ?1 AND ended_at_ms IS NULL"),
        [id],
        session_row,
    )
    .optional()?)
}

pub(crate) fn get_session(conn: &mut Connection, id: &str) -> OpResult<Option<SessionRecord>> {
    live_session(conn, id)
}

pub(crate) fn delete_session(conn: &mut Connection, id: &str) -> OpResult<bool> {
    let tx = write_tx(conn)?;
    // The mark of an ended session stays (see `end_session_cells`).
    let a = exec(
        &tx,
        "DELETE FROM sessions WHERE id = ?1 AND ended_at_ms IS NULL",
        [id],
    )?;
    let b = exec(&tx, "DELETE FROM session_store WHERE session_id = ?1", [id])?;
    tx.commit()?;
    Ok(a + b > 0)
}

pub(crate) fn load_store(
    conn: &mut Connection,
    session: &str,
) -> OpResult<BTreeMap<String, Value>> {
    let mut stmt =
        conn.prepare_cached("SELECT key, value FROM session_store WHERE session_id = ?1")?;
    let rows = stmt.query_map([session], |r| {
        Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
    })?;
    let mut out = BTreeMap::new();
    for row in rows {
        let (k, v) = row?;
        out.insert(k, json(&v)?);
    }
    Ok(out)
}

pub(crate) fn apply_store(
    conn: &mut Connection,
    session: &str,
    changes: &[StoreChange],
) -> OpResult<()> {
    let tx = write_tx(conn)?;
    for c in changes {
        match c {
            StoreChange::Set { key, value } => {
                exec(
                    &tx,
                    "INSERT INTO session_store (session_id, key, value) VALUES (?1, ?2, ?3)
                     ON CONFLICT (session_id, key) DO UPDATE SET value = excluded.value",
                    params![session, key, json_text(value)],
                )?;
            }
            StoreChange::Delete { key } => {
                exec(
                    &tx,
                    "DELETE FROM session_store WHERE session_id = ?1 AND key = ?2",
                    params![session, key],
                )?;
            }
        }
    }
    // The write lock (an immediate transaction) makes this total the one that commits.
    let total: i64 = tx.query_row(
        "SELECT COALESCE(SUM(length(key) + length(value)), 0) FROM session_store WHERE session_id = ?1",
        params![session],
        |r| r.get(0),
    )?;
    if total > crate::session::MAX_STORE_TOTAL_CHARS as i64 {
        return Err(crate::session::store_full(session, total as usize).into());
    }
    tx.commit()?;
    Ok(())
}

// --- cells --------------------------------------------------------------------------------

const CELL_COLS: &str = "id, session_id, source, source_hash, options, status, approval_id, \
                         result, owner, lease_until_ms, created_at_ms, updated_at_ms";

struct CellRow {
    id: String,
    session_id: String,
    source: String,
    source_hash: String,
    options: String,
    status: String,
    approval_id: Option<String>,
    result: Option<String>,
    owner: Option<String>,
    lease_until_ms: i64,
    created_at_ms: i64,
    updated_at_ms: i64,
}

fn cell_row(r: &Row<'_>) -> rusqlite::Result<CellRow> {
    Ok(CellRow {
        id: r.get(0)?,
        session_id: r.get(1)?,
        source: r.get(2)?,
        source_hash: r.get(3)?,
        options: r.get(4)?,
        status: r.get(5)?,
        approval_id: r.get(6)?,
        result: r.get(7)?,
        owner: r.get(8)?,
        lease_until_ms: r.get(9)?,
        created_at_ms: r.get(10)?,
        updated_at_ms: r.get(11)?,
    })
}

impl CellRow {
    fn into_record(self) -> OpResult<CellRecord> {
        let status = CellStatus::parse(&self.status).ok_or_else(|| {
            corrupt(format!(
                "cell `{}` has unknown status `{}`",
                self.id, self.status
            ))
        })?;
        Ok(CellRecord {
            options: json(&self.options)?,
            result: self.result.as_deref().map(json).transpose()?,
            id: self.id,
            session_id: self.session_id,
            source: self.source,
            source_hash: self.source_hash,
            status,
            approval_id: self.approval_id,
            owner: self.owner,
            lease_until_ms: self.lease_until_ms,
            created_at_ms: self.created_at_ms,
            updated_at_ms: self.updated_at_ms,
        })
    }
}

fn read_cell(conn: &Connection, id: &str) -> OpResult<Option<CellRecord>> {
    row(
        conn,
        &format!("SELECT {CELL_COLS} FROM cells WHERE id = ?1"),
        [id],
        cell_row,
    )
    .optional()?
    .map(CellRow::into_record)
    .transpose()
}

fn read_cells(conn: &Connection, sql: &str, p: impl rusqlite::Params) -> OpResult<Vec<CellRecord>> {
    let mut stmt = conn.prepare_cached(sql)?;
    let rows = stmt.query_map(p, cell_row)?;
    let mut out = Vec::new();
    for r in rows {
        out.push(r?.into_record()?);
    }
    Ok(out)
}

fn write_cell(conn: &Connection, c: &CellRecord) -> OpResult<()> {
    exec(
        conn,
        "UPDATE cells SET status = ?2, approval_id = ?3, result = ?4, owner = ?5,
                lease_until_ms = ?6, updated_at_ms = ?7 WHERE id = ?1",
        params![
            c.id,
            c.status.as_str(),
            c.approval_id,
            c.result.as_ref().map(json_text),
            c.owner,
            c.lease_until_ms,
            c.updated_at_ms
        ],
    )?;
    Ok(())
}

pub(crate) fn create_cell(conn: &mut Connection, new: NewCell, now: i64) -> OpResult<CellRecord> {
    let tx = write_tx(conn)?;
    let exists: bool = row(
        &tx,
        "SELECT EXISTS (SELECT 1 FROM cells WHERE id = ?1)",
        [&new.id],
        |r| r.get(0),
    )?;
    if exists {
        return Err(StateError::Duplicate {
            what: "cell",
            id: new.id,
        }
        .into());
    }
    // In the write transaction, serialized with `end_session_cells`: a cell is created before
    // its session's end (and ended by it) or refused after.
    let ended: bool = row(
        &tx,
        "SELECT EXISTS (SELECT 1 FROM sessions WHERE id = ?1 AND ended_at_ms IS NOT NULL)",
        [&new.session_id],
        |r| r.get(0),
    )?;
    if ended {
        return Err(crate::session::ended(&new.session_id).into());
    }
    if let Some(limit) = new.max_live_per_session {
        let live: i64 = row(
            &tx,
            "SELECT count(*) FROM cells WHERE session_id = ?1
               AND status NOT IN ('finished', 'failed', 'terminated')",
            [&new.session_id],
            |r| r.get(0),
        )?;
        if live >= i64::from(limit) {
            return Err(StateError::CellLimit {
                session: new.session_id,
                limit,
            }
            .into());
        }
    }
    let record = CellRecord {
        id: new.id,
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
    exec(
        &tx,
        &format!(
            "INSERT INTO cells ({CELL_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, NULL, NULL, ?7, ?8, ?9, ?9)"
        ),
        params![
            record.id,
            record.session_id,
            record.source,
            record.source_hash,
            json_text(&record.options),
            record.status.as_str(),
            record.owner,
            record.lease_until_ms,
            now
        ],
    )?;
    tx.commit()?;
    Ok(record)
}

pub(crate) fn get_cell(conn: &mut Connection, id: &str) -> OpResult<Option<CellRecord>> {
    read_cell(conn, id)
}

pub(crate) fn list_cells(conn: &mut Connection, session: &str) -> OpResult<Vec<CellRecord>> {
    read_cells(
        conn,
        &format!("SELECT {CELL_COLS} FROM cells WHERE session_id = ?1 ORDER BY created_at_ms, id"),
        [session],
    )
}

pub(crate) fn prune_ended(conn: &mut Connection, before_ms: i64) -> OpResult<u64> {
    let tx = write_tx(conn)?;
    let cells = tx.execute(
        "DELETE FROM cells WHERE status IN ('finished', 'failed', 'terminated') AND updated_at_ms < ?1",
        [before_ms],
    )?;
    let approvals = tx.execute(
        "DELETE FROM approvals WHERE state <> 'pending' AND COALESCE(answered_at_ms, created_at_ms) < ?1",
        [before_ms],
    )?;
    tx.commit()?;
    Ok((cells + approvals) as u64)
}

pub(crate) fn claim_cell(
    conn: &mut Connection,
    id: &str,
    replica: &str,
    lease_ms: i64,
    now: i64,
) -> OpResult<CellRecord> {
    let tx = write_tx(conn)?;
    let mut c =
        read_cell(&tx, id)?.ok_or_else(|| StateError::UnknownCell { id: id.to_string() })?;
    cell::check_claim(&c, replica, now)?;
    c.owner = Some(replica.to_string());
    c.lease_until_ms = now.saturating_add(lease_ms);
    c.updated_at_ms = now;
    write_cell(&tx, &c)?;
    tx.commit()?;
    Ok(c)
}

pub(crate) fn update_cell(
    conn: &mut Connection,
    id: &str,
    replica: &str,
    update: &CellUpdate,
    now: i64,
) -> OpResult<CellRecord> {
    let tx = write_tx(conn)?;
    let mut c =
        read_cell(&tx, id)?.ok_or_else(|| StateError::UnknownCell { id: id.to_string() })?;
    cell::check_holder(&c, replica)?;
    cell::apply_update(&mut c, update, now);
    write_cell(&tx, &c)?;
    if update.status.is_terminal() {
        exec(&tx, "DELETE FROM cell_replay WHERE cell_id = ?1", [id])?;
    }
    tx.commit()?;
    Ok(c)
}

pub(crate) fn claimable_cells(conn: &mut Connection, now: i64) -> OpResult<Vec<CellRecord>> {
    read_cells(
        conn,
        &format!(
            "SELECT {CELL_COLS} FROM cells
              WHERE status NOT IN ('finished', 'failed', 'terminated')
                AND (owner IS NULL OR lease_until_ms <= ?1)
              ORDER BY created_at_ms, id"
        ),
        [now],
    )
}

pub(crate) fn end_session_cells(
    conn: &mut Connection,
    session: &str,
    except: &str,
    result: &Value,
    now: i64,
) -> OpResult<Vec<CellRecord>> {
    let tx = write_tx(conn)?;
    mark_session_ended(&tx, session, now)?;
    let live = read_cells(
        &tx,
        &format!(
            "SELECT {CELL_COLS} FROM cells
              WHERE session_id = ?1
                AND status NOT IN ('finished', 'failed', 'terminated')
                AND (owner IS NULL OR owner <> ?2)
              ORDER BY created_at_ms, id"
        ),
        params![session, except],
    )?;
    let end = cell::session_end(result);
    for c in &live {
        let mut ended = c.clone();
        cell::apply_update(&mut ended, &end, now);
        write_cell(&tx, &ended)?;
        exec(&tx, "DELETE FROM cell_replay WHERE cell_id = ?1", [&c.id])?;
    }
    tx.commit()?;
    Ok(live)
}

/// Marks `session` ended (its row kept, created if it had none, so that no replica begins it
/// again), and prunes the marks older than [`crate::ENDED_SESSION_KEPT`].
fn mark_session_ended(tx: &Connection, session: &str, now: i64) -> OpResult<()> {
    exec(
        tx,
        "DELETE FROM sessions WHERE ended_at_ms < ?1",
        [now.saturating_sub(budget::hold_ms(crate::ENDED_SESSION_KEPT))],
    )?;
    exec(
        tx,
        "INSERT INTO sessions (id, principal, created_at_ms, last_seen_ms, ended_at_ms)
         VALUES (?1, NULL, ?2, ?2, ?2)
         ON CONFLICT (id) DO UPDATE SET ended_at_ms = coalesce(ended_at_ms, excluded.ended_at_ms)",
        params![session, now],
    )?;
    Ok(())
}

pub(crate) fn delete_cell(conn: &mut Connection, id: &str) -> OpResult<bool> {
    let tx = write_tx(conn)?;
    exec(&tx, "DELETE FROM cell_replay WHERE cell_id = ?1", [id])?;
    let n = exec(&tx, "DELETE FROM cells WHERE id = ?1", [id])?;
    tx.commit()?;
    Ok(n > 0)
}

pub(crate) fn append_replay(
    conn: &mut Connection,
    cell_id: &str,
    replica: &str,
    entries: &[ReplayEntry],
) -> OpResult<()> {
    let tx = write_tx(conn)?;
    let c = read_cell(&tx, cell_id)?.ok_or_else(|| StateError::UnknownCell {
        id: cell_id.to_string(),
    })?;
    cell::check_holder(&c, replica)?;
    let last: i64 = row(
        &tx,
        "SELECT coalesce(max(step), 0) FROM cell_replay WHERE cell_id = ?1",
        [cell_id],
        |r| r.get(0),
    )?;
    cell::check_steps(cell_id, u64::try_from(last).unwrap_or(0), entries)?;
    {
        let mut stmt = tx
            .prepare_cached("INSERT INTO cell_replay (cell_id, step, entry) VALUES (?1, ?2, ?3)")?;
        for e in entries {
            stmt.execute(params![
                cell_id,
                i64::try_from(e.step).unwrap_or(i64::MAX),
                json_text(&e.entry)
            ])?;
        }
    }
    tx.commit()?;
    Ok(())
}

pub(crate) fn read_replay(conn: &mut Connection, cell_id: &str) -> OpResult<Vec<ReplayEntry>> {
    let mut stmt = conn
        .prepare_cached("SELECT step, entry FROM cell_replay WHERE cell_id = ?1 ORDER BY step")?;
    let rows = stmt.query_map([cell_id], |r| {
        Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (step, entry) = row?;
        out.push(ReplayEntry {
            step: u64::try_from(step).unwrap_or(0),
            entry: json(&entry)?,
        });
    }
    Ok(out)
}

// --- approvals ----------------------------------------------------------------------------

const APPROVAL_COLS: &str = "id, cell_id, session_id, tool, arguments, provenance, policy_ids, \
     reason, call_hash, created_at_ms, expires_at_ms, state, answered_by, answered_channel, \
     answered_at_ms, paths";

struct ApprovalRow {
    id: String,
    cell_id: Option<String>,
    session_id: String,
    tool: String,
    arguments: String,
    provenance: String,
    policy_ids: String,
    reason: String,
    call_hash: String,
    created_at_ms: i64,
    expires_at_ms: i64,
    state: String,
    answered_by: Option<String>,
    answered_channel: Option<String>,
    answered_at_ms: Option<i64>,
    paths: String,
}

fn approval_row(r: &Row<'_>) -> rusqlite::Result<ApprovalRow> {
    Ok(ApprovalRow {
        id: r.get(0)?,
        cell_id: r.get(1)?,
        session_id: r.get(2)?,
        tool: r.get(3)?,
        arguments: r.get(4)?,
        provenance: r.get(5)?,
        policy_ids: r.get(6)?,
        reason: r.get(7)?,
        call_hash: r.get(8)?,
        created_at_ms: r.get(9)?,
        expires_at_ms: r.get(10)?,
        state: r.get(11)?,
        answered_by: r.get(12)?,
        answered_channel: r.get(13)?,
        answered_at_ms: r.get(14)?,
        paths: r.get(15)?,
    })
}

impl ApprovalRow {
    fn into_record(self) -> OpResult<ApprovalRecord> {
        let state = ApprovalState::parse(&self.state).ok_or_else(|| {
            corrupt(format!(
                "approval `{}` has unknown state `{}`",
                self.id, self.state
            ))
        })?;
        let policy_ids: Vec<String> = serde_json::from_value(json(&self.policy_ids)?)
            .map_err(|e| corrupt(format!("approval `{}` policy ids: {e}", self.id)))?;
        let paths: Vec<String> = serde_json::from_value(json(&self.paths)?)
            .map_err(|e| corrupt(format!("approval `{}` paths: {e}", self.id)))?;
        Ok(ApprovalRecord {
            paths,
            arguments: json(&self.arguments)?,
            provenance: json(&self.provenance)?,
            policy_ids,
            state,
            id: self.id,
            cell_id: self.cell_id,
            session_id: self.session_id,
            tool: self.tool,
            reason: self.reason,
            call_hash: self.call_hash,
            created_at_ms: self.created_at_ms,
            expires_at_ms: self.expires_at_ms,
            answered_by: self.answered_by,
            answered_channel: self.answered_channel,
            answered_at_ms: self.answered_at_ms,
        })
    }
}

fn read_approval(conn: &Connection, id: &str) -> OpResult<Option<ApprovalRecord>> {
    row(
        conn,
        &format!("SELECT {APPROVAL_COLS} FROM approvals WHERE id = ?1"),
        [id],
        approval_row,
    )
    .optional()?
    .map(ApprovalRow::into_record)
    .transpose()
}

fn write_answer(conn: &Connection, a: &ApprovalRecord) -> OpResult<()> {
    exec(conn,
        "UPDATE approvals SET state = ?2, answered_by = ?3, answered_channel = ?4, answered_at_ms = ?5
          WHERE id = ?1 AND state = 'pending'",
        params![a.id, a.state.as_str(), a.answered_by, a.answered_channel, a.answered_at_ms],
    )?;
    Ok(())
}

pub(crate) fn create_approval(
    conn: &mut Connection,
    new: NewApproval,
    id: String,
    now: i64,
) -> OpResult<ApprovalRecord> {
    let a = new.into_record(id, now);
    let tx = write_tx(conn)?;
    exec(
        &tx,
        &format!(
            "INSERT INTO approvals ({APPROVAL_COLS})
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, NULL, NULL, NULL, ?13)"
        ),
        params![
            a.id,
            a.cell_id,
            a.session_id,
            a.tool,
            json_text(&a.arguments),
            json_text(&a.provenance),
            json_text(&Value::from(a.policy_ids.clone())),
            a.reason,
            a.call_hash,
            a.created_at_ms,
            a.expires_at_ms,
            a.state.as_str(),
            json_text(&Value::from(a.paths.clone()))
        ],
    )?;
    tx.commit()?;
    Ok(a)
}

pub(crate) fn get_approval(conn: &mut Connection, id: &str) -> OpResult<Option<ApprovalRecord>> {
    read_approval(conn, id)
}

pub(crate) fn list_approvals(
    conn: &mut Connection,
    q: &ApprovalQuery,
) -> OpResult<Vec<ApprovalRecord>> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {APPROVAL_COLS} FROM approvals
          WHERE (?1 IS NULL OR state = ?1) AND (?2 IS NULL OR session_id = ?2)
            AND (?3 IS NULL OR cell_id = ?3)
          ORDER BY created_at_ms, id"
    ))?;
    let rows = stmt.query_map(
        params![q.state.map(|s| s.as_str()), q.session_id, q.cell_id],
        approval_row,
    )?;
    let mut out = Vec::new();
    for r in rows {
        out.push(r?.into_record()?);
    }
    Ok(out)
}

pub(crate) fn answer_approval(
    conn: &mut Connection,
    id: &str,
    answer: &Answer,
    now: i64,
) -> OpResult<ApprovalRecord> {
    let tx = write_tx(conn)?;
    let current = read_approval(&tx, id)?
        .ok_or_else(|| StateError::UnknownApproval { id: id.to_string() })?;
    let answered = approval::apply_answer(current, answer, now)?;
    write_answer(&tx, &answered)?;
    tx.commit()?;
    Ok(answered)
}

pub(crate) fn expire_approvals(conn: &mut Connection, now: i64) -> OpResult<Vec<ApprovalRecord>> {
    let tx = write_tx(conn)?;
    let due: Vec<ApprovalRecord> = {
        let mut stmt = tx.prepare_cached(&format!(
            "SELECT {APPROVAL_COLS} FROM approvals WHERE state = 'pending' AND expires_at_ms <= ?1
              ORDER BY created_at_ms, id"
        ))?;
        let rows = stmt.query_map([now], approval_row)?;
        let mut v = Vec::new();
        for r in rows {
            v.push(r?.into_record()?);
        }
        v
    };
    let mut out = Vec::with_capacity(due.len());
    for a in due {
        let a = approval::expire(a, now);
        write_answer(&tx, &a)?;
        out.push(a);
    }
    tx.commit()?;
    Ok(out)
}

// --- budgets ------------------------------------------------------------------------------

fn amounts_at(r: &Row<'_>, start: usize) -> rusqlite::Result<Amounts> {
    let mut v = [0i64; 5];
    for (i, x) in v.iter_mut().enumerate() {
        *x = r.get(start + i)?;
    }
    Ok(Amounts::from_i64s(v))
}

/// Creates the ledger row if needed and returns (used, reserved).
fn ledger_row(tx: &Transaction<'_>, key: &str) -> OpResult<(Amounts, Amounts)> {
    exec(
        tx,
        "INSERT INTO budget_ledgers (key) VALUES (?1) ON CONFLICT (key) DO NOTHING",
        [key],
    )?;
    Ok(row(tx,
        "SELECT used_calls, used_model_calls, used_tokens, used_cost_micro_usd, used_bytes,
                reserved_calls, reserved_model_calls, reserved_tokens, reserved_cost_micro_usd, reserved_bytes
           FROM budget_ledgers WHERE key = ?1",
        [key],
        |r| Ok((amounts_at(r, 0)?, amounts_at(r, 5)?)),
    )?)
}

fn write_ledger(
    tx: &Transaction<'_>,
    key: &str,
    used: &Amounts,
    reserved: &Amounts,
) -> OpResult<()> {
    let u = used.to_i64s();
    let h = reserved.to_i64s();
    exec(
        tx,
        "UPDATE budget_ledgers SET used_calls = ?2, used_model_calls = ?3, used_tokens = ?4,
                used_cost_micro_usd = ?5, used_bytes = ?6, reserved_calls = ?7,
                reserved_model_calls = ?8, reserved_tokens = ?9, reserved_cost_micro_usd = ?10,
                reserved_bytes = ?11
          WHERE key = ?1",
        params![
            key, u[0], u[1], u[2], u[3], u[4], h[0], h[1], h[2], h[3], h[4]
        ],
    )?;
    Ok(())
}

/// Gives back to `key` the amounts of its holds that ran out.
fn expire_holds(tx: &Transaction<'_>, key: &str, now: i64) -> OpResult<()> {
    let expired: Vec<Amounts> = {
        let mut stmt = tx.prepare_cached(
            "UPDATE budget_holds SET expired = 1
              WHERE ledger = ?1 AND expired = 0 AND expires_at_ms <= ?2
              RETURNING calls, model_calls, tokens, cost_micro_usd, bytes",
        )?;
        let rows = stmt.query_map(params![key, now], |r| amounts_at(r, 0))?;
        rows.collect::<rusqlite::Result<_>>()?
    };
    if !expired.is_empty() {
        let (used, mut reserved) = ledger_row(tx, key)?;
        for a in &expired {
            reserved = reserved.minus(a);
        }
        write_ledger(tx, key, &used, &reserved)?;
    }
    Ok(())
}

pub(crate) fn reserve(
    conn: &mut Connection,
    req: &ReserveRequest,
    id: String,
    now: i64,
) -> OpResult<ReserveOutcome> {
    let tx = write_tx(conn)?;
    let sorted = req.sorted();
    let mut rows = Vec::with_capacity(sorted.len());
    for (k, key, limits) in &sorted {
        expire_holds(&tx, k, now)?;
        let (used, reserved) = ledger_row(&tx, k)?;
        if let Err(refusal) = budget::check_room(key, &used, &reserved, limits, &req.amounts) {
            // Commit the expiries; nothing else was written.
            tx.commit()?;
            return Ok(ReserveOutcome::Refused(refusal));
        }
        rows.push((k, used, reserved));
    }
    let expires_at_ms = now.saturating_add(budget::hold_ms(req.hold_for));
    let a = req.amounts.to_i64s();
    for (k, used, reserved) in rows {
        write_ledger(&tx, k, &used, &reserved.plus(&req.amounts))?;
        exec(&tx,
            "INSERT INTO budget_holds (id, ledger, calls, model_calls, tokens, cost_micro_usd, bytes, expires_at_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![id, k, a[0], a[1], a[2], a[3], a[4], expires_at_ms],
        )?;
    }
    tx.commit()?;
    Ok(ReserveOutcome::Granted(Reservation {
        id,
        ledgers: req.ledgers.clone(),
        amounts: req.amounts,
        expires_at_ms,
        reserved_at_ms: crate::clock::Clock::system().now_ms(),
        lease: None,
    }))
}

/// Removes the hold's rows; returns, per ledger, the amounts still held (not expired).
fn take_hold(tx: &Transaction<'_>, r: &Reservation) -> OpResult<BTreeMap<String, Option<Amounts>>> {
    let mut stmt = tx.prepare_cached(
        "DELETE FROM budget_holds WHERE id = ?1
         RETURNING ledger, expired, calls, model_calls, tokens, cost_micro_usd, bytes",
    )?;
    let rows = stmt.query_map([&r.id], |row| {
        let expired: i64 = row.get(1)?;
        Ok((
            row.get::<_, String>(0)?,
            (expired == 0).then(|| amounts_at(row, 2)).transpose()?,
        ))
    })?;
    let held: BTreeMap<String, Option<Amounts>> = rows.collect::<rusqlite::Result<_>>()?;
    if held.is_empty() {
        return Err(StateError::UnknownReservation { id: r.id.clone() }.into());
    }
    Ok(held)
}

pub(crate) fn settle(
    conn: &mut Connection,
    r: &Reservation,
    actual: &Amounts,
) -> OpResult<SettleOutcome> {
    let tx = write_tx(conn)?;
    let held = take_hold(&tx, r)?;
    let mut sorted: Vec<_> = r.ledgers.iter().map(|(k, l)| (k.encode(), k, l)).collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let mut ledgers = Vec::new();
    let mut overruns = Vec::new();
    for (k, key, limits) in sorted {
        let (used, mut reserved) = ledger_row(&tx, &k)?;
        if let Some(Some(a)) = held.get(&k) {
            reserved = reserved.minus(a);
        }
        let used = used.plus(actual);
        write_ledger(&tx, &k, &used, &reserved)?;
        overruns.extend(budget::overruns(key, &used, limits));
        ledgers.push(LedgerSnapshot {
            key: key.clone(),
            used,
            reserved,
        });
    }
    tx.commit()?;
    Ok(SettleOutcome { ledgers, overruns })
}

pub(crate) fn extend_hold(
    conn: &mut Connection,
    id: &str,
    now: i64,
    hold_for: std::time::Duration,
) -> OpResult<()> {
    let tx = write_tx(conn)?;
    // A hold past its time is expired whether or not a reserve has marked it yet.
    let changed = tx.execute(
        "UPDATE budget_holds SET expires_at_ms = ?2
          WHERE id = ?1 AND expired = 0 AND expires_at_ms > ?3",
        params![id, now.saturating_add(budget::hold_ms(hold_for)), now],
    )?;
    tx.commit()?;
    if changed == 0 {
        return Err(StateError::UnknownReservation { id: id.to_string() }.into());
    }
    Ok(())
}

pub(crate) fn release(conn: &mut Connection, r: &Reservation) -> OpResult<()> {
    let tx = write_tx(conn)?;
    let held = take_hold(&tx, r)?;
    for (k, amounts) in held {
        if let Some(a) = amounts {
            let (used, reserved) = ledger_row(&tx, &k)?;
            write_ledger(&tx, &k, &used, &reserved.minus(&a))?;
        }
    }
    tx.commit()?;
    Ok(())
}

pub(crate) fn get_ledger(
    conn: &mut Connection,
    key: &LedgerKey,
    now: i64,
) -> OpResult<LedgerSnapshot> {
    let k = key.encode();
    let tx = write_tx(conn)?;
    expire_holds(&tx, &k, now)?;
    let (used, reserved) = ledger_row(&tx, &k)?;
    tx.commit()?;
    Ok(LedgerSnapshot {
        key: key.clone(),
        used,
        reserved,
    })
}

// --- audit --------------------------------------------------------------------------------

fn head(conn: &Connection, stream: &str) -> OpResult<AuditHead> {
    Ok(row(
        conn,
        "SELECT seq, hash FROM audit_heads WHERE stream = ?1",
        [stream],
        |r| {
            Ok(AuditHead {
                seq: u64::try_from(r.get::<_, i64>(0)?).unwrap_or(0),
                hash: Some(r.get(1)?),
            })
        },
    )
    .optional()?
    .unwrap_or_default())
}

pub(crate) fn append_audit(
    conn: &mut Connection,
    stream: &str,
    make: AuditLineFn,
    now: i64,
) -> OpResult<AuditRecord> {
    let tx = write_tx(conn)?;
    let head = head(&tx, stream)?;
    let rec = audit::make_line(stream, &head, &make, now)?;
    let seq = i64::try_from(rec.seq).unwrap_or(i64::MAX);
    exec(
        &tx,
        "INSERT INTO audit_lines (stream, seq, prev, hash, line, at_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![
            stream,
            seq,
            rec.prev.as_deref().unwrap_or(""),
            rec.hash,
            rec.line,
            now
        ],
    )?;
    exec(
        &tx,
        "INSERT INTO audit_heads (stream, seq, hash) VALUES (?1, ?2, ?3)
         ON CONFLICT (stream) DO UPDATE SET seq = excluded.seq, hash = excluded.hash",
        params![stream, seq, rec.hash],
    )?;
    tx.commit()?;
    Ok(rec)
}

/// [`append_audit`] with this one commit waiting for the disk (`synchronous = FULL`), the
/// connection's setting restored after it whatever happened.
pub(crate) fn append_audit_synced(
    conn: &mut Connection,
    stream: &str,
    make: AuditLineFn,
    now: i64,
) -> OpResult<AuditRecord> {
    conn.pragma_update(None, "synchronous", "FULL")?;
    let appended = append_audit(conn, stream, make, now);
    let restored = conn.pragma_update(None, "synchronous", "NORMAL");
    let rec = appended?;
    restored?;
    Ok(rec)
}

pub(crate) fn read_audit(
    conn: &mut Connection,
    stream: &str,
    after: u64,
    limit: usize,
) -> OpResult<Vec<AuditRecord>> {
    let mut stmt = conn.prepare_cached(
        "SELECT seq, prev, hash, line, at_ms FROM audit_lines
          WHERE stream = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
    )?;
    let rows = stmt.query_map(
        params![
            stream,
            i64::try_from(after).unwrap_or(i64::MAX),
            i64::try_from(limit).unwrap_or(i64::MAX)
        ],
        |r| {
            let prev: String = r.get(1)?;
            Ok(AuditRecord {
                stream: stream.to_string(),
                seq: u64::try_from(r.get::<_, i64>(0)?).unwrap_or(0),
                prev: (!prev.is_empty()).then_some(prev),
                hash: r.get(2)?,
                line: r.get(3)?,
                at_ms: r.get(4)?,
            })
        },
    )?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

pub(crate) fn audit_head(conn: &mut Connection, stream: &str) -> OpResult<AuditHead> {
    head(conn, stream)
}

pub(crate) fn audit_streams(conn: &mut Connection) -> OpResult<Vec<String>> {
    let mut stmt = conn.prepare_cached("SELECT stream FROM audit_heads ORDER BY stream")?;
    let rows = stmt.query_map([], |r| r.get(0))?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}
