//! The PostgreSQL operations, each inside one transaction on a pooled connection.
//!
//! Under the default `READ COMMITTED` isolation, every decision is made on rows locked with
//! `SELECT … FOR UPDATE` (ledgers, an approval, a cell), so a concurrent
//! writer on any replica waits for the lock and then sees the committed result: there is no
//! read-then-write race and nothing to retry. Several rows are always locked in key order,
//! so two transactions cannot deadlock.

use std::collections::BTreeMap;

use deadpool_postgres::GenericClient;
use serde_json::Value;
use tokio_postgres::Row;
use tokio_postgres::types::{FromSql, ToSql};

use crate::approval::{self, Answer, ApprovalQuery, ApprovalRecord, ApprovalState, NewApproval};
use crate::audit::{AuditHead, AuditRecord};
use crate::budget;
use crate::cell::{self, CellRecord, CellStatus, CellUpdate, NewCell, ReplayEntry};
use crate::error::StateError;
use crate::session::{SessionRecord, StoreChange};
use crate::validate::json_text;
use crate::watch::Topic;

pub(crate) enum OpError {
    State(StateError),
    Pg(tokio_postgres::Error),
    /// A ledger row was not there to lock (see [`create_ledgers`]); create it and retry.
    MissingLedgers,
}

impl From<StateError> for OpError {
    fn from(e: StateError) -> Self {
        OpError::State(e)
    }
}

impl From<tokio_postgres::Error> for OpError {
    fn from(e: tokio_postgres::Error) -> Self {
        OpError::Pg(e)
    }
}

pub(crate) type OpResult<T> = Result<T, OpError>;
type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

fn corrupt(detail: String) -> OpError {
    OpError::State(StateError::Corrupt {
        location: String::new(),
        detail,
    })
}

fn col<'r, T: FromSql<'r>>(row: &'r Row, i: usize) -> OpResult<T> {
    row.try_get(i)
        .map_err(|e| corrupt(format!("column {i} does not have the expected type: {e}")))
}

fn json(text: &str) -> OpResult<Value> {
    serde_json::from_str(text)
        .map_err(|e| corrupt(format!("a stored JSON value does not parse: {e}")))
}

async fn query(tx: &impl GenericClient, sql: &str, p: Params<'_>) -> OpResult<Vec<Row>> {
    let stmt = tx.prepare_cached(sql).await?;
    Ok(tx.query(&stmt, p).await?)
}

async fn query_opt(tx: &impl GenericClient, sql: &str, p: Params<'_>) -> OpResult<Option<Row>> {
    let stmt = tx.prepare_cached(sql).await?;
    Ok(tx.query_opt(&stmt, p).await?)
}

async fn execute(tx: &impl GenericClient, sql: &str, p: Params<'_>) -> OpResult<u64> {
    let stmt = tx.prepare_cached(sql).await?;
    Ok(tx.execute(&stmt, p).await?)
}

/// Tells every replica (through `LISTEN`) once the transaction commits.
pub(crate) async fn notify(tx: &impl GenericClient, channel: &str, topic: &Topic) -> OpResult<()> {
    query(tx, "SELECT pg_notify($1, $2)", &[&channel, &topic.encode()]).await?;
    Ok(())
}

fn u64_of(x: i64) -> u64 {
    u64::try_from(x).unwrap_or(0)
}

fn i64_of(x: u64) -> i64 {
    i64::try_from(x).unwrap_or(i64::MAX)
}

// --- sessions -----------------------------------------------------------------------------

const SESSION_COLS: &str = "id, principal, created_at_ms, last_seen_ms";

fn session_row(r: &Row) -> OpResult<SessionRecord> {
    Ok(SessionRecord {
        id: col(r, 0)?,
        principal: col(r, 1)?,
        created_at_ms: col(r, 2)?,
        last_seen_ms: col(r, 3)?,
    })
}

pub(crate) async fn open_session(
    tx: &impl GenericClient,
    id: &str,
    principal: Option<&str>,
    now: i64,
) -> OpResult<SessionRecord> {
    // An ended session's row is left as it is (and none returned): it is not begun again.
    let row = query_opt(
        tx,
        &format!(
            "INSERT INTO sessions (id, principal, created_at_ms, last_seen_ms) VALUES ($1, $2, $3, $3)
             ON CONFLICT (id) DO UPDATE SET last_seen_ms = greatest(sessions.last_seen_ms, excluded.last_seen_ms)
              WHERE sessions.ended_at_ms IS NULL
             RETURNING {SESSION_COLS}"
        ),
        &[&id, &principal, &now],
    )
    .await?
    .ok_or_else(|| crate::session::ended(id))?;
    session_row(&row)
}

pub(crate) async fn touch_session(
    tx: &impl GenericClient,
    id: &str,
    now: i64,
) -> OpResult<SessionRecord> {
    // Waits for a delete of the row under way, then finds nothing: a touch never revives.
    let row = query_opt(
        tx,
        &format!(
            "UPDATE sessions SET last_seen_ms = greatest(last_seen_ms, $2)
              WHERE id = $1 AND ended_at_ms IS NULL
             RETURNING {SESSION_COLS}"
        ),
        &[&id, &now],
    )
    .await?
    .ok_or_else(|| crate::session::ended(id))?;
    session_row(&row)
}

pub(crate) async fn get_session(
    tx: &impl GenericClient,
    id: &str,
) -> OpResult<Option<SessionRecord>> {
    query_opt(
        tx,
        &format!("SELECT {SESSION_COLS} FROM sessions WHERE id = $1 AND ended_at_ms IS NULL"),
        &[&id],
    )
    .await?
    .as_ref()
    .map(session_row)
    .transpose()
}

pub(crate) async fn delete_session(tx: &impl GenericClient, id: &str) -> OpResult<bool> {
    // The mark of an ended session stays (see `end_session_cells`).
    let a = execute(
        tx,
        "DELETE FROM sessions WHERE id = $1 AND ended_at_ms IS NULL",
        &[&id],
    )
    .await?;
    let b = execute(
        tx,
        "DELETE FROM session_store WHERE session_id = $1",
        &[&id],
    )
    .await?;
    Ok(a + b > 0)
}

/// Serializes, per session, the creation of its cells with its end (and, among themselves,
/// the count of its live cells): after it, each statement sees what the other committed.
async fn lock_session_cells(tx: &impl GenericClient, session: &str) -> OpResult<()> {
    query(
        tx,
        "SELECT pg_advisory_xact_lock(hashtextextended('codemode cells ' || $1, 0))",
        &[&session],
    )
    .await?;
    Ok(())
}

pub(crate) async fn load_store(
    tx: &impl GenericClient,
    session: &str,
) -> OpResult<BTreeMap<String, Value>> {
    let rows = query(
        tx,
        "SELECT key, value FROM session_store WHERE session_id = $1",
        &[&session],
    )
    .await?;
    let mut out = BTreeMap::new();
    for r in &rows {
        let key: String = col(r, 0)?;
        let value: String = col(r, 1)?;
        out.insert(key, json(&value)?);
    }
    Ok(out)
}

pub(crate) async fn apply_store(
    tx: &impl GenericClient,
    session: &str,
    changes: &[StoreChange],
) -> OpResult<()> {
    // One writer per session at a time, across replicas: two scripts of a session that each
    // fit could otherwise commit together past the limit, each checking without the other.
    execute(
        tx,
        "SELECT pg_advisory_xact_lock(hashtextextended('codemode_session_store:' || $1, 0))",
        &[&session],
    )
    .await?;
    for c in changes {
        match c {
            StoreChange::Set { key, value } => {
                execute(
                    tx,
                    "INSERT INTO session_store (session_id, key, value) VALUES ($1, $2, $3)
                     ON CONFLICT (session_id, key) DO UPDATE SET value = excluded.value",
                    &[&session, key, &json_text(value)],
                )
                .await?;
            }
            StoreChange::Delete { key } => {
                execute(
                    tx,
                    "DELETE FROM session_store WHERE session_id = $1 AND key = $2",
                    &[&session, key],
                )
                .await?;
            }
        }
    }
    let row = tx
        .query_one(
            "SELECT COALESCE(SUM(char_length(key) + char_length(value)), 0)::bigint FROM session_store WHERE session_id = $1",
            &[&session],
        )
        .await?;
    let total: i64 = col(&row, 0)?;
    if total > crate::session::MAX_STORE_TOTAL_CHARS as i64 {
        return Err(crate::session::store_full(session, total as usize).into());
    }
    Ok(())
}

// --- cells --------------------------------------------------------------------------------

const CELL_COLS: &str = "id, session_id, source, source_hash, options, status, approval_id, \
                         result, owner, lease_until_ms, created_at_ms, updated_at_ms";

fn cell_row(r: &Row) -> OpResult<CellRecord> {
    let id: String = col(r, 0)?;
    let status: String = col(r, 5)?;
    let options: String = col(r, 4)?;
    let result: Option<String> = col(r, 7)?;
    Ok(CellRecord {
        status: CellStatus::parse(&status)
            .ok_or_else(|| corrupt(format!("cell `{id}` has unknown status `{status}`")))?,
        options: json(&options)?,
        result: result.as_deref().map(json).transpose()?,
        session_id: col(r, 1)?,
        source: col(r, 2)?,
        source_hash: col(r, 3)?,
        approval_id: col(r, 6)?,
        owner: col(r, 8)?,
        lease_until_ms: col(r, 9)?,
        created_at_ms: col(r, 10)?,
        updated_at_ms: col(r, 11)?,
        id,
    })
}

async fn lock_cell(tx: &impl GenericClient, id: &str) -> OpResult<CellRecord> {
    let row = query_opt(
        tx,
        &format!("SELECT {CELL_COLS} FROM cells WHERE id = $1 FOR UPDATE"),
        &[&id],
    )
    .await?;
    match row {
        Some(r) => cell_row(&r),
        None => Err(StateError::UnknownCell { id: id.to_string() }.into()),
    }
}

async fn write_cell(tx: &impl GenericClient, c: &CellRecord) -> OpResult<()> {
    execute(
        tx,
        "UPDATE cells SET status = $2, approval_id = $3, result = $4, owner = $5,
                lease_until_ms = $6, updated_at_ms = $7 WHERE id = $1",
        &[
            &c.id,
            &c.status.as_str(),
            &c.approval_id,
            &c.result.as_ref().map(json_text),
            &c.owner,
            &c.lease_until_ms,
            &c.updated_at_ms,
        ],
    )
    .await?;
    Ok(())
}

pub(crate) async fn create_cell(
    tx: &impl GenericClient,
    new: NewCell,
    now: i64,
) -> OpResult<CellRecord> {
    // A cell is created before its session's end (which then ends it) or refused after it;
    // and two replicas cannot both pass the count of live cells.
    lock_session_cells(tx, &new.session_id).await?;
    let ended = query_opt(
        tx,
        "SELECT 1 FROM sessions WHERE id = $1 AND ended_at_ms IS NOT NULL",
        &[&new.session_id],
    )
    .await?;
    if ended.is_some() {
        return Err(crate::session::ended(&new.session_id).into());
    }
    if let Some(limit) = new.max_live_per_session {
        let rows = query(
            tx,
            "SELECT count(*) FROM cells WHERE session_id = $1
               AND status NOT IN ('finished', 'failed', 'terminated')",
            &[&new.session_id],
        )
        .await?;
        let live: i64 = rows.first().map(|r| col(r, 0)).transpose()?.unwrap_or(0);
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
    let inserted = execute(
        tx,
        &format!(
            "INSERT INTO cells ({CELL_COLS}) VALUES ($1, $2, $3, $4, $5, $6, NULL, NULL, $7, $8, $9, $9)
             ON CONFLICT (id) DO NOTHING"
        ),
        &[
            &record.id,
            &record.session_id,
            &record.source,
            &record.source_hash,
            &json_text(&record.options),
            &record.status.as_str(),
            &record.owner,
            &record.lease_until_ms,
            &now,
        ],
    )
    .await?;
    if inserted == 0 {
        return Err(StateError::Duplicate {
            what: "cell",
            id: record.id,
        }
        .into());
    }
    Ok(record)
}

pub(crate) async fn get_cell(tx: &impl GenericClient, id: &str) -> OpResult<Option<CellRecord>> {
    query_opt(
        tx,
        &format!("SELECT {CELL_COLS} FROM cells WHERE id = $1"),
        &[&id],
    )
    .await?
    .as_ref()
    .map(cell_row)
    .transpose()
}

pub(crate) async fn list_cells(
    tx: &impl GenericClient,
    session: &str,
) -> OpResult<Vec<CellRecord>> {
    let rows = query(
        tx,
        &format!("SELECT {CELL_COLS} FROM cells WHERE session_id = $1 ORDER BY created_at_ms, id"),
        &[&session],
    )
    .await?;
    rows.iter().map(cell_row).collect()
}

pub(crate) async fn claim_cell(
    tx: &impl GenericClient,
    id: &str,
    replica: &str,
    lease_ms: i64,
    now: i64,
) -> OpResult<CellRecord> {
    let mut c = lock_cell(tx, id).await?;
    cell::check_claim(&c, replica, now)?;
    c.owner = Some(replica.to_string());
    c.lease_until_ms = now.saturating_add(lease_ms);
    c.updated_at_ms = now;
    write_cell(tx, &c).await?;
    Ok(c)
}

pub(crate) async fn update_cell(
    tx: &impl GenericClient,
    id: &str,
    replica: &str,
    update: &CellUpdate,
    now: i64,
) -> OpResult<CellRecord> {
    let mut c = lock_cell(tx, id).await?;
    cell::check_holder(&c, replica)?;
    cell::apply_update(&mut c, update, now);
    write_cell(tx, &c).await?;
    if update.status.is_terminal() {
        execute(tx, "DELETE FROM cell_replay WHERE cell_id = $1", &[&id]).await?;
    }
    Ok(c)
}

pub(crate) async fn claimable_cells(
    tx: &impl GenericClient,
    now: i64,
) -> OpResult<Vec<CellRecord>> {
    let rows = query(
        tx,
        &format!(
            "SELECT {CELL_COLS} FROM cells
              WHERE status NOT IN ('finished', 'failed', 'terminated')
                AND (owner IS NULL OR lease_until_ms <= $1)
              ORDER BY created_at_ms, id"
        ),
        &[&now],
    )
    .await?;
    rows.iter().map(cell_row).collect()
}

pub(crate) async fn end_session_cells(
    tx: &impl GenericClient,
    session: &str,
    except: &str,
    result: &Value,
    now: i64,
) -> OpResult<Vec<CellRecord>> {
    lock_session_cells(tx, session).await?;
    // Marked ended (its row kept) so that no replica begins it again; old marks pruned.
    execute(
        tx,
        "DELETE FROM sessions WHERE ended_at_ms < $1",
        &[&now.saturating_sub(crate::budget::hold_ms(crate::ENDED_SESSION_KEPT))],
    )
    .await?;
    execute(
        tx,
        "INSERT INTO sessions (id, principal, created_at_ms, last_seen_ms, ended_at_ms)
         VALUES ($1, NULL, $2, $2, $2)
         ON CONFLICT (id) DO UPDATE SET ended_at_ms = coalesce(sessions.ended_at_ms, excluded.ended_at_ms)",
        &[&session, &now],
    )
    .await?;
    // Locked as their holders' writes lock them: a holder's log line commits before this
    // (and its call runs) or is refused after it.
    let rows = query(
        tx,
        &format!(
            "SELECT {CELL_COLS} FROM cells
              WHERE session_id = $1
                AND status NOT IN ('finished', 'failed', 'terminated')
                AND owner IS DISTINCT FROM $2
              ORDER BY created_at_ms, id
              FOR UPDATE"
        ),
        &[&session, &except],
    )
    .await?;
    let live = rows.iter().map(cell_row).collect::<OpResult<Vec<_>>>()?;
    let end = cell::session_end(result);
    for c in &live {
        let mut ended = c.clone();
        cell::apply_update(&mut ended, &end, now);
        write_cell(tx, &ended).await?;
        execute(tx, "DELETE FROM cell_replay WHERE cell_id = $1", &[&c.id]).await?;
    }
    Ok(live)
}

pub(crate) async fn delete_cell(tx: &impl GenericClient, id: &str) -> OpResult<bool> {
    execute(tx, "DELETE FROM cell_replay WHERE cell_id = $1", &[&id]).await?;
    Ok(execute(tx, "DELETE FROM cells WHERE id = $1", &[&id]).await? > 0)
}

pub(crate) async fn append_replay(
    tx: &impl GenericClient,
    cell_id: &str,
    replica: &str,
    entries: &[ReplayEntry],
) -> OpResult<()> {
    // Holding the cell's row lock serializes appends to its log.
    let c = lock_cell(tx, cell_id).await?;
    cell::check_holder(&c, replica)?;
    let rows = query(
        tx,
        "SELECT coalesce(max(step), 0) FROM cell_replay WHERE cell_id = $1",
        &[&cell_id],
    )
    .await?;
    let last: i64 = rows.first().map(|r| col(r, 0)).transpose()?.unwrap_or(0);
    cell::check_steps(cell_id, u64_of(last), entries)?;
    if entries.is_empty() {
        return Ok(());
    }
    let steps: Vec<i64> = entries.iter().map(|e| i64_of(e.step)).collect();
    let texts: Vec<String> = entries.iter().map(|e| json_text(&e.entry)).collect();
    execute(
        tx,
        "INSERT INTO cell_replay (cell_id, step, entry)
         SELECT $1, s, e FROM unnest($2::bigint[], $3::text[]) AS t(s, e)",
        &[&cell_id, &steps, &texts],
    )
    .await?;
    Ok(())
}

pub(crate) async fn read_replay(
    tx: &impl GenericClient,
    cell_id: &str,
) -> OpResult<Vec<ReplayEntry>> {
    let rows = query(
        tx,
        "SELECT step, entry FROM cell_replay WHERE cell_id = $1 ORDER BY step",
        &[&cell_id],
    )
    .await?;
    rows.iter()
        .map(|r| {
            let entry: String = col(r, 1)?;
            Ok(ReplayEntry {
                step: u64_of(col(r, 0)?),
                entry: json(&entry)?,
            })
        })
        .collect()
}

// --- approvals ----------------------------------------------------------------------------

const APPROVAL_COLS: &str = "id, cell_id, session_id, tool, arguments, provenance, policy_ids, \
     reason, call_hash, created_at_ms, expires_at_ms, state, answered_by, answered_channel, \
     answered_at_ms, paths";

fn approval_row(r: &Row) -> OpResult<ApprovalRecord> {
    let id: String = col(r, 0)?;
    let state: String = col(r, 11)?;
    let arguments: String = col(r, 4)?;
    let provenance: String = col(r, 5)?;
    let policy_ids: String = col(r, 6)?;
    let paths: String = col(r, 15)?;
    Ok(ApprovalRecord {
        paths: serde_json::from_value(json(&paths)?)
            .map_err(|e| corrupt(format!("approval `{id}` paths: {e}")))?,
        state: ApprovalState::parse(&state)
            .ok_or_else(|| corrupt(format!("approval `{id}` has unknown state `{state}`")))?,
        arguments: json(&arguments)?,
        provenance: json(&provenance)?,
        policy_ids: serde_json::from_value(json(&policy_ids)?)
            .map_err(|e| corrupt(format!("approval `{id}` policy ids: {e}")))?,
        cell_id: col(r, 1)?,
        session_id: col(r, 2)?,
        tool: col(r, 3)?,
        reason: col(r, 7)?,
        call_hash: col(r, 8)?,
        created_at_ms: col(r, 9)?,
        expires_at_ms: col(r, 10)?,
        answered_by: col(r, 12)?,
        answered_channel: col(r, 13)?,
        answered_at_ms: col(r, 14)?,
        id,
    })
}

async fn write_answer(tx: &impl GenericClient, a: &ApprovalRecord) -> OpResult<()> {
    execute(
        tx,
        "UPDATE approvals SET state = $2, answered_by = $3, answered_channel = $4, answered_at_ms = $5
          WHERE id = $1 AND state = 'pending'",
        &[&a.id, &a.state.as_str(), &a.answered_by, &a.answered_channel, &a.answered_at_ms],
    )
    .await?;
    Ok(())
}

pub(crate) async fn create_approval(
    tx: &impl GenericClient,
    new: NewApproval,
    id: String,
    now: i64,
) -> OpResult<ApprovalRecord> {
    let a = new.into_record(id, now);
    execute(
        tx,
        &format!(
            "INSERT INTO approvals ({APPROVAL_COLS})
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, NULL, NULL, NULL, $13)"
        ),
        &[
            &a.id,
            &a.cell_id,
            &a.session_id,
            &a.tool,
            &json_text(&a.arguments),
            &json_text(&a.provenance),
            &json_text(&Value::from(a.policy_ids.clone())),
            &a.reason,
            &a.call_hash,
            &a.created_at_ms,
            &a.expires_at_ms,
            &a.state.as_str(),
            &json_text(&Value::from(a.paths.clone())),
        ],
    )
    .await?;
    Ok(a)
}

pub(crate) async fn get_approval(
    tx: &impl GenericClient,
    id: &str,
) -> OpResult<Option<ApprovalRecord>> {
    query_opt(
        tx,
        &format!("SELECT {APPROVAL_COLS} FROM approvals WHERE id = $1"),
        &[&id],
    )
    .await?
    .as_ref()
    .map(approval_row)
    .transpose()
}

pub(crate) async fn list_approvals(
    tx: &impl GenericClient,
    q: &ApprovalQuery,
) -> OpResult<Vec<ApprovalRecord>> {
    let state = q.state.map(|s| s.as_str());
    let rows = query(
        tx,
        &format!(
            "SELECT {APPROVAL_COLS} FROM approvals
              WHERE ($1::text IS NULL OR state = $1) AND ($2::text IS NULL OR session_id = $2)
                AND ($3::text IS NULL OR cell_id = $3)
              ORDER BY created_at_ms, id"
        ),
        &[&state, &q.session_id, &q.cell_id],
    )
    .await?;
    rows.iter().map(approval_row).collect()
}

pub(crate) async fn answer_approval(
    tx: &impl GenericClient,
    id: &str,
    answer: &Answer,
    now: i64,
) -> OpResult<ApprovalRecord> {
    let row = query_opt(
        tx,
        &format!("SELECT {APPROVAL_COLS} FROM approvals WHERE id = $1 FOR UPDATE"),
        &[&id],
    )
    .await?;
    let current = match row {
        Some(r) => approval_row(&r)?,
        None => return Err(StateError::UnknownApproval { id: id.to_string() }.into()),
    };
    let answered = approval::apply_answer(current, answer, now)?;
    write_answer(tx, &answered).await?;
    Ok(answered)
}

pub(crate) async fn expire_approvals(
    tx: &impl GenericClient,
    now: i64,
) -> OpResult<Vec<ApprovalRecord>> {
    // SKIP LOCKED: an approval being answered right now is left to that answer.
    let rows = query(
        tx,
        &format!(
            "SELECT {APPROVAL_COLS} FROM approvals WHERE state = 'pending' AND expires_at_ms <= $1
              ORDER BY created_at_ms, id FOR UPDATE SKIP LOCKED"
        ),
        &[&now],
    )
    .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in &rows {
        let a = approval::expire(approval_row(r)?, now);
        write_answer(tx, &a).await?;
        out.push(a);
    }
    Ok(out)
}

// --- budgets ------------------------------------------------------------------------------

/// Creates missing ledger rows, in a statement of its own that commits at once (call it
/// outside any transaction): inserting inside the transaction that then locks rows could
/// deadlock with another transaction inserting the same new key.
pub(crate) async fn create_ledgers(c: &impl GenericClient, keys: &[String]) -> OpResult<()> {
    execute(
        c,
        "INSERT INTO budget_ledgers (key) SELECT k FROM unnest($1::text[]) AS t(k) ORDER BY k
         ON CONFLICT (key) DO NOTHING",
        &[&keys],
    )
    .await?;
    Ok(())
}

// --- audit --------------------------------------------------------------------------------

pub(crate) async fn read_audit(
    tx: &impl GenericClient,
    stream: &str,
    after: u64,
    limit: usize,
) -> OpResult<Vec<AuditRecord>> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = query(
        tx,
        "SELECT seq, prev, hash, line, at_ms FROM audit_lines
          WHERE stream = $1 AND seq > $2 ORDER BY seq LIMIT $3",
        &[&stream, &i64_of(after), &limit],
    )
    .await?;
    rows.iter()
        .map(|r| {
            let prev: String = col(r, 1)?;
            Ok(AuditRecord {
                stream: stream.to_string(),
                seq: u64_of(col(r, 0)?),
                prev: (!prev.is_empty()).then_some(prev),
                hash: col(r, 2)?,
                line: col(r, 3)?,
                at_ms: col(r, 4)?,
            })
        })
        .collect()
}

pub(crate) async fn audit_head(tx: &impl GenericClient, stream: &str) -> OpResult<AuditHead> {
    let row = query_opt(
        tx,
        "SELECT seq, hash FROM audit_heads WHERE stream = $1",
        &[&stream],
    )
    .await?;
    Ok(match row {
        Some(r) => {
            let hash: String = col(&r, 1)?;
            AuditHead {
                seq: u64_of(col(&r, 0)?),
                hash: (!hash.is_empty()).then_some(hash),
            }
        }
        None => AuditHead::default(),
    })
}

pub(crate) async fn audit_streams(tx: &impl GenericClient) -> OpResult<Vec<String>> {
    let rows = query(
        tx,
        "SELECT stream FROM audit_heads WHERE seq > 0 ORDER BY stream",
        &[],
    )
    .await?;
    rows.iter().map(|r| col(r, 0)).collect()
}
