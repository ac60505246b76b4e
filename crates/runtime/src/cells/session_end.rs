//! A session that ended for good ends its cells on every process sharing the state store.
//!
//! The process that ends the session (its client's `DELETE`, its idle expiry) stops the cells
//! it runs itself, and marks every other live cell of the session `terminated` in the store,
//! with the reason. The store is the only channel: a process running one of those cells is
//! refused its next write to the cell (the log line every call writes before it runs, so no
//! call starts after the end), and learns why when its next lease renewal or log line is
//! refused; it then stops the script and cancels its calls in flight.

use codemode_state::{
    ApprovalQuery, ApprovalState, CellRecord, CellStatus, Decision, StateStore, format_ms,
};
use serde_json::{Map, Value, json};

use super::Cells;

/// The `reason` of the audit line written for each cell a session's end stopped.
const SESSION_ENDED: &str = "session_ended";

impl Cells {
    /// Ends every live cell of `session_id`, wherever it runs, because the session ended for
    /// good; `why` says how (it goes into each cell's result and audit line). Cells this
    /// process runs are terminated here; the others are ended in the store (see the module
    /// docs), and their pending approvals denied. One audit line per cell says it stopped and
    /// why. Returns how many cells it ended.
    pub async fn end_session_everywhere(&self, session_id: &str, why: &str) -> usize {
        let config = self.config();
        let message = format!(
            "The cell was stopped because its session ended ({why}); its calls in flight were cancelled and none of its calls runs any more."
        );
        let here = self.terminate_session_cells(session_id);
        for id in &here {
            self.audit_stop(id, session_id, Some(&config.replica), &message, None)
                .await;
        }
        let result = json!({ "text": message, "isError": true, "reason": SESSION_ENDED });
        let elsewhere = match self
            .store()
            .end_session_cells(session_id, &config.replica, result)
            .await
        {
            Ok(ended) => ended,
            Err(e) => {
                tracing::error!(session = %session_id, "could not end the session's cells held by other processes: {e}");
                Vec::new()
            }
        };
        for cell in &elsewhere {
            self.audit_stop(
                &cell.id,
                session_id,
                cell.owner.as_deref(),
                &message,
                unheld_script_call(cell),
            )
            .await;
            self.deny_pending(&cell.id).await;
        }
        here.len() + elsewhere.len()
    }

    /// One audit line: cell `id` of `session_id`, run by `holder`, stopped because its session
    /// ended. `script` names the cell's `codemode` call when no live process will write that
    /// call's own end line (its holder is gone).
    async fn audit_stop(
        &self,
        id: &str,
        session_id: &str,
        holder: Option<&str>,
        message: &str,
        script: Option<UnheldScript>,
    ) {
        let mut line = Map::new();
        line.insert("time".into(), json!(format_ms(now_ms())));
        line.insert("event".into(), json!("cell_stopped"));
        line.insert("reason".into(), json!(SESSION_ENDED));
        line.insert("cell_id".into(), json!(id));
        line.insert("session_id".into(), json!(session_id));
        line.insert("holder".into(), json!(holder));
        line.insert("stopped_by".into(), json!(self.config().replica));
        line.insert("message".into(), json!(message));
        if let Some(script) = script {
            // Closes the journalled `codemode` call that nobody else will: `audit verify`
            // pairs the journal's start with this line.
            line.insert("tool".into(), json!(codemode_gate::CODEMODE_TOOL));
            line.insert(
                "provenance".into(),
                json!({"call_id": script.call_id, "session_id": session_id}),
            );
            if let Some(journal_id) = script.journal_id {
                line.insert("journal_id".into(), json!(journal_id));
            }
            line.insert("status".into(), json!("error"));
            line.insert("cell_status".into(), json!(CellStatus::Terminated.as_str()));
        }
        if let Err(e) = self.config().audit.append_async(line).await {
            tracing::error!(cell = %id, "the audit line of a cell stopped with its session could not be written: {e}");
        }
    }

    /// Denies the approvals a stopped cell's calls waited for: those calls never run, and
    /// nobody should be asked about them any more.
    async fn deny_pending(&self, cell_id: &str) {
        let pending = self
            .store()
            .list_approvals(ApprovalQuery {
                state: Some(ApprovalState::Pending),
                cell_id: Some(cell_id.to_string()),
                session_id: None,
            })
            .await;
        let pending = match pending {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(cell = %cell_id, "could not list the stopped cell's approvals: {e}");
                return;
            }
        };
        for a in pending {
            let _ = super::answer_approval(
                self.store().as_ref(),
                &self.config().audit,
                &a.id,
                Decision::Deny,
                "codemode",
                "session-ended",
                None,
            )
            .await;
        }
    }
}

/// The cell's `codemode` call, for a cell whose holder's lease had lapsed (or that had none):
/// no process will finish that call.
struct UnheldScript {
    call_id: Value,
    journal_id: Option<String>,
}

fn unheld_script_call(cell: &CellRecord) -> Option<UnheldScript> {
    let held = cell.owner.is_some() && cell.lease_until_ms > now_ms();
    if held {
        return None;
    }
    Some(UnheldScript {
        call_id: cell.options.get("call_id").cloned().unwrap_or(Value::Null),
        journal_id: cell
            .options
            .get("journal_id")
            .and_then(Value::as_str)
            .map(str::to_string),
    })
}

/// Why another process ended cell `id` with its session, when it did: the text it recorded
/// with the end. For a process whose write to the cell was refused because the cell is over.
pub(crate) async fn ended_elsewhere(store: &dyn StateStore, id: &str) -> Option<String> {
    let cell = store.get_cell(id).await.ok()??;
    let result = cell
        .result
        .filter(|r| r.get("reason") == Some(&json!(SESSION_ENDED)))?;
    result
        .get("text")
        .and_then(Value::as_str)
        .map(str::to_string)
}

fn now_ms() -> i64 {
    codemode_state::Clock::system().now_ms()
}
