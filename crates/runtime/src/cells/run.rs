//! Starting, waiting on, terminating and rebuilding cells; answering approvals.

use std::sync::Arc;
use std::time::Duration;

use codemode_gate::{Admission, AuditLog, Principal};
use codemode_sandbox::Determinism;
use codemode_state::{
    Answer, ApprovalRecord, ApprovalState, CellStatus, CellUpdate, Decision, NewCell, StateError,
    StateStore, format_ms,
};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::{CellError, CellLink, CellReport, Cells, LiveCell, WaitOptions};
use crate::{Codemode, ScriptRequest, ScriptRun};

/// What a cell needs to be rebuilt exactly: the same ids (an approval is bound to the call's
/// provenance) and the same seed and start time (the same `Math.random()` and `Date.now()`).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct CellOptions {
    call_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    client: Option<String>,
    seed: u32,
    start_ms: f64,
    yield_after_ms: u64,
    #[serde(default)]
    scope: String,
    /// The journal line of the cell's `codemode` call: the replica that finishes the cell
    /// names it on the call's outcome line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    journal_id: Option<String>,
    /// Who the cell's session acted for when it started. A process that takes the cell over
    /// has not seen its client yet, so without this the cell's calls would be charged to that
    /// process's default principal, or to nobody, escaping `budgets.principal` and `.team`.
    /// Missing in cells started by a codemode that did not record it: those are not resumed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    acts_for: Option<ActsFor>,
}

/// The principal a cell acts for; `principal: None` when its session acted for nobody, which
/// differs from not knowing (the field missing).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ActsFor {
    principal: Option<Principal>,
}

/// How long `wait` with `terminate` waits for the script and its calls to stop.
const TERMINATE_WAIT: Duration = Duration::from_secs(15);

impl Codemode {
    /// The cells of this installation, when enabled.
    pub fn cells(&self) -> Option<&Cells> {
        self.inner.cells.as_ref()
    }

    fn cells_or_err(&self) -> Result<Cells, CellError> {
        self.cells().cloned().ok_or(CellError::Disabled)
    }

    /// Runs a script as a cell: returns when it ended, when it waits for a person, or after its
    /// yield time (the script's `yield_after_ms`, at most the configured one) with the output
    /// so far, while the script keeps running. The `codemode` call passes the gate first, as
    /// in [`Codemode::run_script`].
    pub async fn start_cell(&self, req: ScriptRequest) -> Result<CellReport, CellError> {
        let cells = self.cells_or_err()?;
        cells.ensure_background();
        let config = cells.config().clone();
        let cell_id = format!("cell_{}", uuid::Uuid::new_v4().simple());
        let (admission, source, call_id) = match self.admit_script(&req).await {
            Ok(admitted) => admitted,
            Err(run) => return Ok(refused(&cell_id, run)),
        };
        let parsed = match codemode_sandbox::parse_source(&source) {
            Ok(p) => p,
            Err(e) => {
                let run = ScriptRun::refused(cell_id.clone(), e.to_string());
                let run = self.finish_admission(admission, run).await;
                return Ok(refused(&cell_id, run));
            }
        };
        // Before anything is stored: a refused script leaves no cell behind.
        let acting_for = self.gate().principal_of(&req.session_id);
        let share_key = acting_for.as_ref().map_or("", |p| p.id.as_str());
        let Some(slot) = cells
            .inner
            .share
            .take(share_key, config.max_running_per_principal)
        else {
            let busy = CellError::PrincipalBusy {
                who: acting_for.as_ref().map_or_else(
                    || "this server's unnamed client".to_string(),
                    |p| format!("`{}`", p.id),
                ),
                limit: config.max_running_per_principal,
            };
            let run = ScriptRun::refused(cell_id.clone(), busy.to_string());
            let _ = self.finish_admission(admission, run).await;
            return Err(busy);
        };
        let yield_after = parsed
            .options
            .yield_after_ms
            .map(Duration::from_millis)
            .map_or(config.yield_after, |asked| asked.min(config.yield_after));
        let determinism = req.determinism.unwrap_or_else(|| Determinism {
            seed: (uuid::Uuid::new_v4().as_u128() & 0xffff_ffff) as u32,
            start_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as f64)
                .unwrap_or(0.0),
        });
        let options = CellOptions {
            call_id: call_id.clone(),
            client: req.client.clone(),
            seed: determinism.seed,
            start_ms: determinism.start_ms,
            yield_after_ms: yield_after.as_millis() as u64,
            scope: config.scope.clone(),
            journal_id: admission.journal_id().map(str::to_string),
            acts_for: Some(ActsFor {
                principal: self.gate().principal_of(&req.session_id),
            }),
        };
        let store = cells.store().clone();
        // The row's principal is who may continue the session on other replicas: the one the
        // session acts for, never the name its client gave itself.
        let principal = self.gate().principal_of(&req.session_id).map(|p| p.id);
        let created = async {
            // Refused once the session ended on any replica, and so is the cell, in the same
            // transaction as its insert: no cell outlives its session's end.
            store
                .open_session(&req.session_id, principal.as_deref())
                .await?;
            store
                .create_cell(NewCell {
                    id: cell_id.clone(),
                    session_id: req.session_id.clone(),
                    source_hash: crate::codemode_tool::script_facts(&source).sha256,
                    source: source.clone(),
                    options: serde_json::to_value(&options).unwrap_or(Value::Null),
                    owner: config.replica.clone(),
                    lease: config.lease,
                    max_live_per_session: Some(config.max_live_per_session),
                })
                .await
        }
        .await;
        if let Err(e) = created {
            let run = ScriptRun::refused(cell_id.clone(), e.to_string());
            let _ = self.finish_admission(admission, run).await;
            return Err(e.into());
        }
        let live = Arc::new(LiveCell::new(
            cell_id.clone(),
            req.session_id.clone(),
            tokio_util::sync::CancellationToken::new(),
        ));
        let link = match CellLink::new(live.clone(), store, config.replica.clone(), Vec::new()) {
            Ok(l) => Arc::new(l),
            Err(e) => return Err(CellError::Replay(e)),
        };
        let mut run_req = req.clone();
        run_req.abort = live.abort.clone();
        run_req.determinism = Some(determinism);
        cells.register(live.clone());
        tokio::spawn(drive(
            self.clone(),
            cells.clone(),
            run_req,
            source,
            call_id,
            ScriptCall::Admitted(Box::new(admission)),
            link,
            slot,
        ));
        // Until the first report the caller is waiting: cancelling its call (or shutting down,
        // or dropping this future) stops the script, as for a plain run. After that the cell
        // runs on its own.
        let mut unreported = Unreported(Some(live.clone()));
        tokio::select! {
            _ = live.settle(CellStatus::Running, yield_after) => {}
            _ = req.abort.cancelled() => {
                live.terminate();
                let _ = tokio::time::timeout(TERMINATE_WAIT, live.ended()).await;
            }
        }
        unreported.0 = None;
        Ok(CellReport::from_snapshot(&cell_id, live.take_report()))
    }

    /// New output of a cell of `session_id` and, once it ended, its result; or, with
    /// `terminate`, stops it (its calls in flight are cancelled) and reports how it ended.
    /// Waits until the cell ends, starts or stops waiting for a person, or the timeout.
    pub async fn wait_cell(
        &self,
        session_id: &str,
        cell_id: &str,
        opts: WaitOptions,
    ) -> Result<CellReport, CellError> {
        let cells = self.cells_or_err()?;
        let Some(live) = cells.live(cell_id) else {
            return wait_elsewhere(&cells, session_id, cell_id, opts).await;
        };
        if live.session_id != session_id {
            return Err(CellError::Unknown(cell_id.to_string()));
        }
        if live.collected() {
            return Err(CellError::Finished {
                id: cell_id.to_string(),
                status: live.status().as_str().into(),
            });
        }
        if opts.terminate {
            live.terminate();
            let _ = tokio::time::timeout(TERMINATE_WAIT, live.ended()).await;
        } else {
            let limit = opts.timeout.unwrap_or(cells.config().yield_after);
            live.settle(live.status(), limit).await;
        }
        Ok(CellReport::from_snapshot(cell_id, live.take_report()))
    }

    /// Takes over the cells nobody holds (their process stopped) and rebuilds each by replaying
    /// its log; each then goes on where it was (a call waiting for approval waits again, for
    /// the same approval). Returns the ids of the cells taken over.
    pub async fn resume_cells(&self) -> Result<Vec<String>, CellError> {
        let cells = self.cells_or_err()?;
        cells.ensure_background();
        let config = cells.config().clone();
        let store = cells.store().clone();
        let mut resumed = Vec::new();
        for cell in store.claimable_cells().await? {
            let scope = cell
                .options
                .get("scope")
                .and_then(Value::as_str)
                .unwrap_or("");
            if cells.live(&cell.id).is_some() || scope != config.scope {
                continue;
            }
            let claimed = match store
                .claim_cell(&cell.id, &config.replica, config.lease)
                .await
            {
                Ok(c) => c,
                Err(e) => {
                    tracing::info!(cell = %cell.id, "not taking the cell over: {e}");
                    continue;
                }
            };
            let fail = |message: String| {
                let store = store.clone();
                let replica = config.replica.clone();
                let id = claimed.id.clone();
                async move {
                    tracing::warn!(cell = %id, "{message}");
                    let _ = store
                        .update_cell(
                            &id,
                            &replica,
                            CellUpdate {
                                status: CellStatus::Failed,
                                approval_id: None,
                                result: Some(json!({ "text": message, "isError": true })),
                            },
                        )
                        .await;
                }
            };
            let options: CellOptions = match serde_json::from_value(claimed.options.clone()) {
                Ok(o) => o,
                Err(e) => {
                    fail(format!(
                        "cell {} cannot be rebuilt: its options cannot be read ({e})",
                        claimed.id
                    ))
                    .await;
                    continue;
                }
            };
            // Fail closed: a cell whose principal is unknown would charge its calls to nobody.
            let Some(acts_for) = options.acts_for.clone() else {
                let message = format!(
                    "cell {} cannot be taken over: the principal its session acted for was not recorded (the cell was started by an older codemode), so its calls could not be charged to that principal's budgets; run the script again",
                    claimed.id
                );
                // The script's call ends here: its journalled start gets its end line, so
                // `audit verify` does not list it as a call whose outcome is unknown.
                ResumedEnd {
                    call_id: &options.call_id,
                    journal_id: options.journal_id.as_deref(),
                    cell_id: &claimed.id,
                    session_id: &claimed.session_id,
                    client: options.client.as_deref(),
                    principal: None,
                    status: CellStatus::Failed,
                    is_error: true,
                    handed_over: false,
                    message: "the script was not taken over after the process that started it stopped: the principal its session acted for was not recorded; none of its calls ran again",
                }
                .write(&config.audit)
                .await;
                fail(message).await;
                continue;
            };
            let entries = store.read_replay(&claimed.id).await?;
            let live = Arc::new(LiveCell::new(
                claimed.id.clone(),
                claimed.session_id.clone(),
                tokio_util::sync::CancellationToken::new(),
            ));
            let link =
                match CellLink::new(live.clone(), store.clone(), config.replica.clone(), entries) {
                    Ok(l) => Arc::new(l),
                    Err(e) => {
                        fail(format!("cell {}: {e}", claimed.id)).await;
                        continue;
                    }
                };
            let mut req = ScriptRequest::new(claimed.source.clone(), claimed.session_id.clone());
            req.client = options.client.clone();
            req.parent_call_id = Some(options.call_id.clone());
            req.abort = live.abort.clone();
            req.determinism = Some(Determinism {
                seed: options.seed,
                start_ms: options.start_ms,
            });
            // Before any of its calls runs: they are charged to, and audited for, the principal
            // the session acted for when the cell started, not this process's default. Lent
            // only: the session's client may never reach this process, so the gate forgets it
            // when the cell ends.
            if let Some(principal) = acts_for.principal {
                self.gate().lend_principal(&claimed.session_id, principal);
            }
            let slot = {
                let acting_for = self.gate().principal_of(&claimed.session_id);
                cells
                    .inner
                    .share
                    .take_anyway(acting_for.as_ref().map_or("", |p| p.id.as_str()))
            };
            cells.register(live);
            tokio::spawn(drive(
                self.clone(),
                cells.clone(),
                req,
                claimed.source.clone(),
                options.call_id,
                ScriptCall::TakenOver {
                    journal_id: options.journal_id,
                },
                link,
                slot,
            ));
            resumed.push(claimed.id);
        }
        Ok(resumed)
    }

    /// Answers a pending approval from the library (channel `library`); see
    /// [`answer_approval`].
    pub async fn answer_approval(
        &self,
        approval_id: &str,
        decision: Decision,
        by: &str,
        channel: &str,
    ) -> Result<ApprovalRecord, CellError> {
        let cells = self.cells_or_err()?;
        Ok(answer_approval(
            cells.store().as_ref(),
            &cells.config().audit,
            approval_id,
            decision,
            by,
            channel,
            None,
        )
        .await?)
    }

    /// How many calls a live cell answered from its replay log (for tests and benchmarks).
    pub fn cell_replayed_calls(&self, cell_id: &str) -> Option<u64> {
        Some(
            self.cells()?
                .live(cell_id)?
                .replayed
                .load(std::sync::atomic::Ordering::Relaxed),
        )
    }
}

/// `wait` for a cell this process does not drive: another replica on the same store holds it
/// (the session moved here), or it ended in another process. Reads the cell from the store:
/// once it ended, its stored result; until then, waits (as `wait` does) for it to end, start
/// or stop waiting for a person, and reports its status and pending approvals. Its printed
/// output stays with the process that runs it (it comes with the result); stopping it is done
/// there too.
async fn wait_elsewhere(
    cells: &Cells,
    session_id: &str,
    cell_id: &str,
    opts: WaitOptions,
) -> Result<CellReport, CellError> {
    let store = cells.store();
    let limit = opts.timeout.unwrap_or(cells.config().yield_after);
    let deadline = tokio::time::Instant::now() + limit;
    let mut first_status = None;
    loop {
        let mut changed = store.watch(codemode_state::Topic::Cell(cell_id.to_string()));
        let cell = match store.get_cell(cell_id).await? {
            Some(c) if c.session_id == session_id => c,
            _ => return Err(CellError::Unknown(cell_id.to_string())),
        };
        if cell.status.is_terminal() {
            let Some(result) = &cell.result else {
                return Err(CellError::Finished {
                    id: cell.id,
                    status: cell.status.as_str().into(),
                });
            };
            let mut text = result
                .get("text")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            text.push_str(&format!(
                "\n[Cell {cell_id} has ended; this is the result the state store kept (its printed output and images stayed with the process that ran it, or were let go).]"
            ));
            return Ok(CellReport {
                cell: cell_id.to_string(),
                status: cell.status,
                text,
                is_error: result.get("isError").and_then(Value::as_bool) == Some(true),
                pending: Vec::new(),
                run: None,
                media: Vec::new(),
            });
        }
        let owner = cell.owner.clone().unwrap_or_else(|| "nobody yet".into());
        if opts.terminate {
            return Err(CellError::HeldElsewhere { id: cell.id, owner });
        }
        let first = *first_status.get_or_insert(cell.status);
        let now = tokio::time::Instant::now();
        if cell.status != first || now >= deadline {
            let pending = store
                .list_approvals(codemode_state::ApprovalQuery {
                    state: Some(ApprovalState::Pending),
                    cell_id: Some(cell.id.clone()),
                    session_id: None,
                })
                .await?;
            let snap = super::live::Snapshot {
                status: cell.status,
                new_output: Vec::new(),
                pending,
                run: None,
                first: false,
            };
            let mut report = CellReport::from_snapshot(cell_id, snap);
            report.text = format!(
                "[Cell {cell_id} runs in another codemode process ({owner}) on the same state store; its printed output comes with its result.]\n{}",
                report.text
            );
            return Ok(report);
        }
        // Changes arrive through the store's notifications; a slow poll covers a lost one.
        let nap = (deadline - now).min(Duration::from_secs(1));
        let _ = tokio::time::timeout(nap, changed.changed()).await;
    }
}

/// Terminates a cell whose first report never reached its caller (the caller went away).
struct Unreported(Option<Arc<LiveCell>>);

impl Drop for Unreported {
    fn drop(&mut self) {
        if let Some(cell) = self.0.take() {
            cell.terminate();
        }
    }
}

/// Who writes the outcome line of the cell's `codemode` call.
enum ScriptCall {
    /// This process admitted it: its admission does.
    Admitted(Box<Admission>),
    /// Another process admitted (and journalled) it and stopped: this one writes the line,
    /// naming that journal line.
    TakenOver { journal_id: Option<String> },
}

/// What the end line of a script's call says when the process stops running it and another
/// one carries the cell on.
const HANDED_OVER: &str = "this process stopped running the script and let go of its cell, for a codemode process on the same state store to carry on by replay (that one's end line names this call's journal line)";

/// Before the end of a cell's script call is written: a process that finds another holder
/// lets go (its line says the cell is carried on elsewhere, and the holder writes how it
/// ended); one that still holds the cell renews its lease, so nobody takes the cell over while
/// it writes the end.
async fn confirm_holder(store: &dyn StateStore, live: &LiveCell, replica: &str, lease: Duration) {
    match store.get_cell(&live.id).await {
        Ok(Some(c)) if c.owner.as_deref().is_some_and(|o| o != replica) => {
            live.lost_lease(format!(
                "cell {} is held by {}",
                live.id,
                c.owner.unwrap_or_default()
            ));
        }
        Ok(Some(c)) if !c.status.is_terminal() => {
            if let Err(e @ (StateError::CellHeld { .. } | StateError::NotCellOwner { .. })) =
                store.claim_cell(&live.id, replica, lease).await
            {
                live.lost_lease(e.to_string());
            }
        }
        _ => {}
    }
}

/// Runs the cell's script to its end and records how it ended.
#[allow(clippy::too_many_arguments)]
async fn drive(
    codemode: Codemode,
    cells: Cells,
    req: ScriptRequest,
    source: String,
    call_id: String,
    script: ScriptCall,
    link: Arc<CellLink>,
    slot: crate::principal_share::ShareSlot,
) {
    // Until the cell's last line is written it acts for its session's principal, even if the
    // session ends meanwhile; then the gate may forget the session.
    let _session = codemode.gate().hold_session(&req.session_id);
    let live = link.cell.clone();
    let cell_id = live.id.clone();
    let run = codemode
        .execute(
            &req,
            source,
            cell_id.clone(),
            call_id.clone(),
            Some(link.clone()),
        )
        .await;
    // The script is out of the pool: its worker is free for the principal's next one.
    drop(slot);
    let config = cells.config();
    let store = cells.store();
    if !live.handed_over() {
        confirm_holder(store.as_ref(), &live, &config.replica, config.lease).await;
    }
    let handed_over = live.handed_over();
    let (mut run, resumed) = match script {
        ScriptCall::Admitted(a) if handed_over => {
            a.hand_over(HANDED_OVER).await;
            (run, None)
        }
        ScriptCall::Admitted(a) => (codemode.finish_admission(*a, run).await, None),
        ScriptCall::TakenOver { journal_id } => (run, Some(journal_id)),
    };
    if live.is_abandoned() {
        cells.lock().remove(&cell_id);
        return;
    }
    let ended_elsewhere = live.ended_elsewhere();
    let status = if let Some(message) = &ended_elsewhere {
        run.text = message.clone();
        run.is_error = true;
        CellStatus::Terminated
    } else if let Some(message) = live.failure() {
        run.text = message;
        run.is_error = true;
        CellStatus::Failed
    } else if live.was_terminated() {
        CellStatus::Terminated
    } else if run.is_error {
        CellStatus::Failed
    } else {
        CellStatus::Finished
    };
    if let Some(journal_id) = resumed {
        let handed_on = handed_over.then_some(HANDED_OVER);
        ResumedEnd {
            call_id: &call_id,
            journal_id: journal_id.as_deref(),
            cell_id: &cell_id,
            session_id: &req.session_id,
            client: req.client.as_deref(),
            principal: codemode.gate().principal_of(&req.session_id).map(|p| p.id),
            status,
            is_error: run.is_error,
            handed_over,
            message: handed_on.unwrap_or("the script was taken over by replay after the process that started it stopped, and ended here"),
        }
        .write(&config.audit)
        .await;
    }
    // A cell ended elsewhere has its end in the store already, written by whoever ended it.
    if ended_elsewhere.is_none() {
        let written = store
            .update_cell(
                &cell_id,
                &config.replica,
                CellUpdate {
                    status,
                    approval_id: None,
                    result: Some(json!({ "text": run.text, "isError": run.is_error })),
                },
            )
            .await;
        if let Err(e) = written {
            tracing::warn!(cell = %cell_id, "could not record how the cell ended: {e}");
        }
    }
    // A call still waiting when the script ended will never run: its approval is void.
    if let Ok(left) = store
        .list_approvals(codemode_state::ApprovalQuery {
            state: Some(ApprovalState::Pending),
            cell_id: Some(cell_id.clone()),
            session_id: None,
        })
        .await
    {
        for a in left {
            let _ = answer_approval(
                store.as_ref(),
                &config.audit,
                &a.id,
                Decision::Deny,
                "codemode",
                "cell-ended",
                None,
            )
            .await;
        }
    }
    live.finish(status, run);
}

fn refused(cell: &str, run: ScriptRun) -> CellReport {
    CellReport {
        cell: cell.to_string(),
        status: CellStatus::Failed,
        text: run.text.clone(),
        is_error: true,
        pending: Vec::new(),
        media: Vec::new(),
        run: Some(run),
    }
}

/// Answers a pending approval and writes the audit line naming who answered and through what.
///
/// The answer is bound to the call by its hash: `shown_hash` is the hash of the call the person
/// was shown (`codemode approvals show` prints it); without it, the stored call's own hash is
/// used, which still binds the answer to that one call. Of two answers at once exactly one
/// wins; an expired, answered or unknown approval is an error saying so.
pub async fn answer_approval(
    store: &dyn StateStore,
    audit: &AuditLog,
    approval_id: &str,
    decision: Decision,
    by: &str,
    channel: &str,
    shown_hash: Option<&str>,
) -> Result<ApprovalRecord, StateError> {
    let current =
        store
            .get_approval(approval_id)
            .await?
            .ok_or_else(|| StateError::UnknownApproval {
                id: approval_id.to_string(),
            })?;
    if current.state == ApprovalState::Pending && current.expires_at_ms <= now_ms() {
        expire_in(store, audit).await;
    }
    // Who approves is on record before the approval counts: a log that cannot take the line
    // leaves the call unapproved. A denial lets nothing run, so it stands either way.
    let call_hash = shown_hash.unwrap_or(&current.call_hash);
    if let Err(e) = write_attempt(audit, &current, decision, by, channel, call_hash).await {
        if decision == Decision::Approve {
            return Err(StateError::ApprovalNotAudited {
                id: approval_id.to_string(),
                detail: e.to_string(),
            });
        }
        tracing::error!(approval = %approval_id, "a denial's audit line could not be written: {e}");
    }
    let answered = store
        .answer_approval(
            approval_id,
            Answer {
                decision,
                by: by.to_string(),
                channel: channel.to_string(),
                call_hash: call_hash.to_string(),
            },
        )
        .await?;
    write_audit(audit, &answered).await;
    Ok(answered)
}

/// The outcome line of a taken-over cell's script. The `codemode` call was admitted, and
/// journalled, by the process that stopped, which could not write how it ended; this closes
/// that call (same call id) on the replica that finished it, or that refused to take it over.
struct ResumedEnd<'a> {
    call_id: &'a str,
    journal_id: Option<&'a str>,
    cell_id: &'a str,
    session_id: &'a str,
    client: Option<&'a str>,
    principal: Option<String>,
    status: CellStatus,
    is_error: bool,
    /// This process let go of the cell too: the script goes on elsewhere.
    handed_over: bool,
    message: &'a str,
}

impl ResumedEnd<'_> {
    async fn write(self, audit: &AuditLog) {
        let mut line = Map::new();
        line.insert("time".into(), json!(format_ms(now_ms())));
        line.insert("event".into(), json!("taken_over_script_end"));
        line.insert(
            "provenance".into(),
            json!({"call_id": self.call_id, "session_id": self.session_id, "client": self.client}),
        );
        if let Some(principal) = self.principal {
            line.insert("principal".into(), json!(principal));
        }
        line.insert("tool".into(), json!(codemode_gate::CODEMODE_TOOL));
        if let Some(id) = self.journal_id {
            line.insert("journal_id".into(), json!(id));
        }
        line.insert("cell_id".into(), json!(self.cell_id));
        let status = match (self.handed_over, self.is_error) {
            (true, _) => "cancelled",
            (false, true) => "error",
            (false, false) => "ok",
        };
        line.insert("status".into(), json!(status));
        line.insert("cell_status".into(), json!(self.status.as_str()));
        line.insert("message".into(), json!(self.message));
        if let Err(e) = audit.append_async(line).await {
            tracing::error!(cell = %self.cell_id, "the taken-over script's audit line could not be written: {e}");
        }
    }
}

/// Expires every approval past its time; one audit line each.
pub(crate) async fn expire_due(cells: &Cells) {
    expire_in(cells.store().as_ref(), &cells.config().audit).await;
}

/// Expires due approvals in `store`, writing one audit line for each.
pub async fn expire_in(store: &dyn StateStore, audit: &AuditLog) -> Vec<ApprovalRecord> {
    match store.expire_approvals().await {
        Ok(expired) => {
            for a in &expired {
                write_audit(audit, a).await;
            }
            expired
        }
        Err(e) => {
            tracing::warn!("could not expire approvals: {e}");
            Vec::new()
        }
    }
}

/// The line of an answer about to be given: who, through what, and to which call. The line
/// of what it came to (`approval`, from [`write_audit`]) follows once the store took it or not.
async fn write_attempt(
    audit: &AuditLog,
    a: &ApprovalRecord,
    decision: Decision,
    by: &str,
    channel: &str,
    call_hash: &str,
) -> Result<(), codemode_gate::AuditError> {
    let decision = match decision {
        Decision::Approve => "approve",
        Decision::Deny => "deny",
    };
    let line = approval_line(
        now_ms(),
        "approval_answer",
        a,
        Answered {
            decision,
            by: Some(by),
            channel: Some(channel),
            call_hash,
        },
    );
    audit.append_async(line).await
}

/// One audit line for an answered or expired approval: to the file, or to the shared stream
/// (which only takes lines asynchronously) when the state is shared by replicas.
async fn write_audit(audit: &AuditLog, a: &ApprovalRecord) {
    let answer = Answered {
        decision: a.state.as_str(),
        by: a.answered_by.as_deref(),
        channel: a.answered_channel.as_deref(),
        call_hash: &a.call_hash,
    };
    let mut line = approval_line(
        a.answered_at_ms.unwrap_or_else(now_ms),
        "approval",
        a,
        answer,
    );
    line.insert("policy_ids".into(), json!(a.policy_ids));
    if let Err(e) = audit.append_async(line).await {
        tracing::error!(approval = %a.id, "the approval's audit line could not be written: {e}");
    }
}

/// What an approval line says of the answer (`by` and `channel` are null for an expiry).
struct Answered<'a> {
    decision: &'a str,
    by: Option<&'a str>,
    channel: Option<&'a str>,
    call_hash: &'a str,
}

/// The fields both approval lines have: the answer's and the call's.
fn approval_line(
    at_ms: i64,
    event: &str,
    a: &ApprovalRecord,
    Answered {
        decision,
        by,
        channel,
        call_hash,
    }: Answered<'_>,
) -> Map<String, Value> {
    let mut line = Map::new();
    line.insert("time".into(), json!(format_ms(at_ms)));
    line.insert("event".into(), json!(event));
    line.insert("approval_id".into(), json!(a.id));
    line.insert("decision".into(), json!(decision));
    line.insert("by".into(), json!(by));
    line.insert("channel".into(), json!(channel));
    line.insert("tool".into(), json!(a.tool));
    line.insert("call_hash".into(), json!(call_hash));
    line.insert("session_id".into(), json!(a.session_id));
    line.insert("cell_id".into(), json!(a.cell_id));
    line.insert(
        "call_id".into(),
        a.provenance.get("call_id").cloned().unwrap_or(Value::Null),
    );
    line
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
