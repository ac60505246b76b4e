//! An approver that pauses a cell's call when nobody can answer now.

use std::sync::Arc;
use std::time::Duration;

use codemode_gate::{ApprovalAnswer, ApprovalRequest, Approver};
use codemode_spec::BoxFuture;
use codemode_state::{
    ApprovalQuery, ApprovalRecord, ApprovalState, CellStatus, CellUpdate, NewApproval, Topic,
    call_hash_with_paths,
};
use serde_json::Value;

use super::{Cells, LiveCell};

/// Asks the inner approver (a terminal, an MCP client) first. When it could not ask anyone
/// (`Unasked`), pausing is on and the call comes from a cell's script, the call waits: a
/// pending approval bound to the call's hash (over its resolved paths too) is stored, the
/// cell's status becomes `waiting_for_approval`, and the answer may come from any process
/// sharing the state store.
/// The gate holds the script's deadline still meanwhile. An approval that expires is a denial.
///
/// A rebuilt cell reaching the same call again finds the approval it stored before (same
/// cell, same call hash) instead of asking anew, so an answer given while no process held
/// the cell still counts, exactly once.
pub struct PausingApprover {
    cells: Cells,
    inner: Option<Arc<dyn Approver>>,
}

impl PausingApprover {
    pub fn new(cells: Cells, inner: Option<Arc<dyn Approver>>) -> Self {
        PausingApprover { cells, inner }
    }

    async fn decide(&self, req: &ApprovalRequest) -> ApprovalAnswer {
        let asked = match &self.inner {
            Some(inner) => inner.approve(req).await,
            None => ApprovalAnswer::Unasked("nobody is available to approve calls here"),
        };
        let ApprovalAnswer::Unasked(why) = asked else {
            return asked;
        };
        if !self.cells.config().pause_approvals {
            return asked;
        }
        let Some(cell) = req
            .provenance
            .script_id
            .as_deref()
            .and_then(|id| self.cells.live(id))
        else {
            // Only a cell can wait: a plain run has nobody to report its status to.
            return ApprovalAnswer::Unasked(why);
        };
        match self.pause(req, &cell).await {
            Ok(answer) => answer,
            Err(e) => {
                tracing::error!(cell = %cell.id, "could not pause the call for approval: {e}");
                ApprovalAnswer::Unasked("the approval could not be stored for later")
            }
        }
    }

    async fn pause(
        &self,
        req: &ApprovalRequest,
        cell: &Arc<LiveCell>,
    ) -> Result<ApprovalAnswer, codemode_state::StateError> {
        let store = self.cells.store().clone();
        let config = self.cells.config();
        let provenance = serde_json::to_value(&req.provenance).unwrap_or(Value::Null);
        // The resolved paths count as part of the call: a rebuilt cell re-prepares it, and if a
        // link was retargeted meanwhile the same arguments reach another place, which the
        // earlier approval was not given for, so it must not match.
        let hash = call_hash_with_paths(&req.tool_name, &req.args, &provenance, &req.paths);
        let earlier = store
            .list_approvals(ApprovalQuery {
                cell_id: Some(cell.id.clone()),
                ..ApprovalQuery::default()
            })
            .await?
            .into_iter()
            .find(|a| a.call_hash == hash);
        let approval = match earlier {
            Some(a) => a,
            None => {
                store
                    .create_approval(NewApproval {
                        cell_id: Some(cell.id.clone()),
                        session_id: req.provenance.session_id.clone(),
                        tool: req.tool_name.clone(),
                        arguments: req.args.clone(),
                        provenance,
                        paths: req.paths.clone(),
                        policy_ids: req.policy_ids.clone(),
                        reason: req.reason.clone(),
                        expires_in: config.approval_expiry,
                    })
                    .await?
            }
        };
        if approval.state == ApprovalState::Pending {
            // The store first, then the live cell: a report of `waiting_for_approval` (which
            // the live cell triggers) is then never ahead of what another process reads.
            let _ = store
                .update_cell(
                    &cell.id,
                    &config.replica,
                    CellUpdate {
                        status: CellStatus::WaitingForApproval,
                        approval_id: Some(approval.id.clone()),
                        result: None,
                    },
                )
                .await;
            cell.add_pending(approval.clone());
        }
        // Removes the approval from the cell's waiting list however this ends (a cancelled
        // call drops this future mid-wait).
        let _waiting = Waiting {
            cell: cell.clone(),
            approval: approval.id.clone(),
            cells: self.cells.clone(),
        };
        let answered = wait_for_answer(&self.cells, &approval, &hash).await?;
        Ok(match answered.state {
            ApprovalState::Approved => ApprovalAnswer::Yes,
            ApprovalState::Denied => ApprovalAnswer::No,
            _ => ApprovalAnswer::Unasked(
                "nobody answered before the approval expired, which counts as a denial",
            ),
        })
    }
}

impl Approver for PausingApprover {
    fn approve<'a>(&'a self, req: &'a ApprovalRequest) -> BoxFuture<'a, ApprovalAnswer> {
        Box::pin(self.decide(req))
    }
}

/// Waits until the approval is answered or expired. Expires it when due (writing the audit
/// line). An answer counts only for the call it was given for: the hash is checked again.
async fn wait_for_answer(
    cells: &Cells,
    approval: &ApprovalRecord,
    hash: &str,
) -> Result<ApprovalRecord, codemode_state::StateError> {
    let store = cells.store();
    loop {
        let mut watch = store.watch(Topic::Approval(approval.id.clone()));
        let now = store.get_approval(&approval.id).await?.ok_or_else(|| {
            codemode_state::StateError::UnknownApproval {
                id: approval.id.clone(),
            }
        })?;
        if now.call_hash != hash {
            // Never happens unless the row was changed behind the store's back: refuse.
            return Ok(ApprovalRecord {
                state: ApprovalState::Denied,
                ..now
            });
        }
        if now.state != ApprovalState::Pending {
            return Ok(now);
        }
        let left = now.expires_at_ms - chrono_now_ms();
        if left <= 0 {
            super::run::expire_due(cells).await;
        }
        let nap = Duration::from_millis(left.clamp(50, 1000) as u64);
        let _ = tokio::time::timeout(nap, watch.changed()).await;
    }
}

fn chrono_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

struct Waiting {
    cell: Arc<LiveCell>,
    approval: String,
    cells: Cells,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if self.cell.remove_pending(&self.approval) > 0 || self.cell.is_done() {
            return;
        }
        // Back to running in the store too; best effort (the next status change rewrites it).
        let store = self.cells.store().clone();
        let replica = self.cells.config().replica.clone();
        let id = self.cell.id.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = store
                    .update_cell(
                        &id,
                        &replica,
                        CellUpdate {
                            status: CellStatus::Running,
                            approval_id: None,
                            result: None,
                        },
                    )
                    .await;
            });
        }
    }
}
