//! Cells: script runs that outlive a turn. A cell is held by one replica at a time through a
//! lease, so that whichever replica is alive can pick up a cell whose holder died; every write
//! to a cell names the replica making it, and a replica that lost its lease is refused
//! (fencing), so two replicas never both drive one cell.
//!
//! The replay log of a live cell records its calls and their results in order: a restarted
//! server rebuilds the cell by replaying it without running any tool twice. It is dropped when
//! the cell ends, since it exists only to rebuild a live cell.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Result, StateError};
use crate::validate::{check_id, check_text};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CellStatus {
    Running,
    WaitingForApproval,
    Finished,
    Failed,
    Terminated,
}

impl CellStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            CellStatus::Running => "running",
            CellStatus::WaitingForApproval => "waiting_for_approval",
            CellStatus::Finished => "finished",
            CellStatus::Failed => "failed",
            CellStatus::Terminated => "terminated",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "running" => CellStatus::Running,
            "waiting_for_approval" => CellStatus::WaitingForApproval,
            "finished" => CellStatus::Finished,
            "failed" => CellStatus::Failed,
            "terminated" => CellStatus::Terminated,
            _ => return None,
        })
    }

    /// Finished, failed and terminated cells never change again.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            CellStatus::Finished | CellStatus::Failed | CellStatus::Terminated
        )
    }
}

/// A cell to create, held at once by `owner`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewCell {
    pub id: String,
    pub session_id: String,
    pub source: String,
    pub source_hash: String,
    /// The run's options (limits, yield time), as the runtime records them.
    pub options: Value,
    pub owner: String,
    pub lease: Duration,
    /// Refuse the cell when the session already has this many live (not terminal) cells;
    /// checked in the same transaction as the insert.
    pub max_live_per_session: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellRecord {
    pub id: String,
    pub session_id: String,
    pub source: String,
    pub source_hash: String,
    pub options: Value,
    pub status: CellStatus,
    /// The approval the cell waits for, while `status` is `waiting_for_approval`.
    pub approval_id: Option<String>,
    /// The run's result, once terminal.
    pub result: Option<Value>,
    /// The replica holding the cell; `None` once it ended.
    pub owner: Option<String>,
    pub lease_until_ms: i64,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
}

/// A status change written by the cell's holder.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellUpdate {
    pub status: CellStatus,
    pub approval_id: Option<String>,
    pub result: Option<Value>,
}

/// One step of a cell's replay log (a call and its result, as the runtime encodes them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplayEntry {
    /// 1 for the first step; each append continues where the log ends.
    pub step: u64,
    pub entry: Value,
}

impl NewCell {
    pub(crate) fn validate(&self) -> Result<()> {
        check_id("cell id", &self.id)?;
        check_id("session id", &self.session_id)?;
        check_id("replica id", &self.owner)?;
        check_text("cell source", &self.source)?;
        check_text("cell source hash", &self.source_hash)
    }
}

impl CellUpdate {
    pub(crate) fn validate(&self) -> Result<()> {
        if let Some(a) = &self.approval_id {
            check_id("approval id", a)?;
        }
        match (self.status, &self.approval_id) {
            (CellStatus::WaitingForApproval, None) => Err(StateError::invalid(
                "cell update",
                "a cell waiting for approval must name the approval it waits for",
            )),
            (s, Some(_)) if s != CellStatus::WaitingForApproval => Err(StateError::invalid(
                "cell update",
                "only a cell waiting for approval names an approval",
            )),
            _ => Ok(()),
        }
    }
}

/// May `replica` take or renew the cell now?
pub(crate) fn check_claim(cell: &CellRecord, replica: &str, now_ms: i64) -> Result<()> {
    if cell.status.is_terminal() {
        return Err(StateError::CellFinished {
            id: cell.id.clone(),
            status: cell.status.as_str().to_string(),
        });
    }
    match &cell.owner {
        Some(owner) if owner != replica && cell.lease_until_ms > now_ms => {
            Err(StateError::CellHeld {
                id: cell.id.clone(),
                owner: owner.clone(),
                until_ms: cell.lease_until_ms,
            })
        }
        _ => Ok(()),
    }
}

/// May `replica` write to the cell? Only its current holder may, even after its lease ran out
/// as long as nobody took the cell over.
pub(crate) fn check_holder(cell: &CellRecord, replica: &str) -> Result<()> {
    if cell.status.is_terminal() {
        return Err(StateError::CellFinished {
            id: cell.id.clone(),
            status: cell.status.as_str().to_string(),
        });
    }
    if cell.owner.as_deref() != Some(replica) {
        return Err(StateError::NotCellOwner {
            id: cell.id.clone(),
            replica: replica.to_string(),
            owner: cell.owner.clone(),
        });
    }
    Ok(())
}

/// Steps must continue the log exactly: `entries[0].step == last + 1`, then consecutive.
pub(crate) fn check_steps(cell: &str, last: u64, entries: &[ReplayEntry]) -> Result<()> {
    for (expected, e) in (last + 1..).zip(entries) {
        if e.step != expected {
            return Err(StateError::ReplayOutOfOrder {
                cell: cell.to_string(),
                expected,
                got: e.step,
            });
        }
    }
    Ok(())
}

/// What [`crate::StateStore::end_session_cells`] writes to each cell it ends.
pub(crate) fn session_end(result: &Value) -> CellUpdate {
    CellUpdate {
        status: CellStatus::Terminated,
        approval_id: None,
        result: Some(result.clone()),
    }
}

/// Whether [`crate::StateStore::end_session_cells`] ends `cell`.
pub(crate) fn ends_with_session(cell: &CellRecord, session: &str, except: &str) -> bool {
    cell.session_id == session
        && !cell.status.is_terminal()
        && cell.owner.as_deref() != Some(except)
}

/// What a cell looks like after an update by its holder.
pub(crate) fn apply_update(cell: &mut CellRecord, update: &CellUpdate, now_ms: i64) {
    cell.status = update.status;
    cell.approval_id = update.approval_id.clone();
    cell.result = update.result.clone();
    if update.status.is_terminal() {
        cell.owner = None;
        cell.lease_until_ms = 0;
    }
    cell.updated_at_ms = now_ms;
}
