//! Cells and paused approvals through the library, on a real SQLite state file: yield, wait,
//! terminate, budgets across waits, approve/deny/expire, two answers at once, take-over by
//! replay with a counting tool, and a script that behaves differently on replay.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use codemode_gate::{AuditKey, AuditLog, BudgetLimits, Budgets, Gate, PolicySet, Registry};
use codemode_runtime::{CellError, Cells, CellsConfig, Codemode, ScriptRequest, WaitOptions};
use codemode_spec::{CallFacts, PreparedCall, Tool, ToolError, ToolOutput, ToolSpec, prepared};
use codemode_state::{ApprovalQuery, CellStatus, Decision, StateError, StateStore};
use futures::FutureExt;
use serde_json::{Value, json};

/// Counts its real runs; sleeps `ms` (cooperatively cancelled) when asked.
struct Counted {
    spec: ToolSpec,
    runs: Arc<AtomicU64>,
    cancelled: Arc<AtomicU64>,
}

impl Tool for Counted {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }
    fn prepare(&self, args: Value) -> Result<Box<dyn PreparedCall>, ToolError> {
        let runs = self.runs.clone();
        let cancelled = self.cancelled.clone();
        Ok(prepared(CallFacts::default(), move |ctx| {
            async move {
                let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                let ms = args.get("ms").and_then(Value::as_u64).unwrap_or(0);
                if ms > 0 {
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(ms)) => {}
                        _ = ctx.cancel.cancelled() => {
                            cancelled.fetch_add(1, Ordering::SeqCst);
                            return Err(ToolError::cancelled());
                        }
                    }
                }
                Ok(ToolOutput::value(json!({ "n": n, "args": args })))
            }
            .boxed()
        }))
    }
}

const POLICY: &str = r#"
@id("counted-runs")
permit (principal, action == Action::"tool_call", resource == Tool::"counted");
@id("danger-needs-a-person")
@ask("danger changes things")
permit (principal, action == Action::"tool_call", resource == Tool::"danger");
"#;

struct World {
    codemode: Codemode,
    runs: Arc<AtomicU64>,
    danger_runs: Arc<AtomicU64>,
    cancelled: Arc<AtomicU64>,
    store: Arc<dyn StateStore>,
    audit: std::path::PathBuf,
}

struct Setup {
    pause: bool,
    expiry: Duration,
    lease: Duration,
    budgets: Budgets,
    max_live: u32,
    /// The scripts' `cpu_ms` when set.
    cpu_ms: Option<u64>,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            pause: true,
            expiry: Duration::from_secs(600),
            lease: Duration::from_secs(15),
            budgets: Budgets::default(),
            max_live: 8,
            cpu_ms: None,
        }
    }
}

fn counted(name: &str, runs: &Arc<AtomicU64>, cancelled: &Arc<AtomicU64>) -> Arc<dyn Tool> {
    Arc::new(Counted {
        spec: ToolSpec::new(name, "counts", json!({"type": "object"})),
        runs: runs.clone(),
        cancelled: cancelled.clone(),
    })
}

async fn world(dir: &std::path::Path, setup: Setup) -> World {
    let store = codemode_state::open(
        &format!("sqlite://{}", dir.join("state.db").display()),
        Default::default(),
    )
    .await
    .unwrap();
    let runs = Arc::new(AtomicU64::new(0));
    let danger_runs = Arc::new(AtomicU64::new(0));
    let cancelled = Arc::new(AtomicU64::new(0));
    let registry = Registry::new();
    registry
        .register(counted("counted", &runs, &cancelled))
        .unwrap();
    registry
        .register(counted("danger", &danger_runs, &cancelled))
        .unwrap();
    let audit_path = dir.join("audit.jsonl");
    let audit = AuditLog::open_with_key(&audit_path, AuditKey::from_bytes([7; 32])).unwrap();
    let mut config = CellsConfig::new(store.clone());
    config.pause_approvals = setup.pause;
    config.approval_expiry = setup.expiry;
    config.lease = setup.lease;
    config.max_live_per_session = setup.max_live;
    config.yield_after = Duration::from_secs(30);
    config.audit = audit.clone();
    let cells = Cells::new(config);
    let gate = Gate::builder()
        .registry(registry)
        .policy(PolicySet::parse("cells.cedar", POLICY).unwrap())
        .approver(cells.approver(None))
        .budgets(setup.budgets)
        .audit(audit)
        .build()
        .unwrap();
    let mut builder = Codemode::builder().gate(gate).cells(cells);
    if let Some(cpu_ms) = setup.cpu_ms {
        let mut sandbox = codemode_sandbox::SandboxConfig::default();
        sandbox.defaults.cpu_ms = cpu_ms;
        builder = builder.sandbox_config(sandbox);
    }
    let codemode = builder.build().unwrap();
    World {
        codemode,
        runs,
        danger_runs,
        cancelled,
        store,
        audit: audit_path,
    }
}

fn req(code: &str, session: &str) -> ScriptRequest {
    ScriptRequest::new(code, session)
}

fn wait_for(ms: u64) -> WaitOptions {
    WaitOptions {
        timeout: Some(Duration::from_millis(ms)),
        terminate: false,
    }
}

/// Waits until the cell ends, collecting every report's text.
async fn finish(w: &World, session: &str, cell: &str) -> (codemode_runtime::CellReport, String) {
    let mut all = String::new();
    for _ in 0..200 {
        let r = w
            .codemode
            .wait_cell(session, cell, wait_for(2_000))
            .await
            .unwrap();
        all.push_str(&r.text);
        if r.status.is_terminal() {
            return (r, all);
        }
    }
    panic!("cell {cell} did not end");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_run_yields_its_output_so_far_and_wait_returns_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let w = world(dir.path(), Setup::default()).await;
    let code = r#"// @options: {"yield_after_ms": 300}
text("first");
await tools.counted({ ms: 1500 });
text("second");
await tools.counted({ ms: 1500 });
return "done";"#;
    let first = w.codemode.start_cell(req(code, "s1")).await.unwrap();
    assert_eq!(first.status, CellStatus::Running, "{}", first.text);
    assert!(first.text.contains("first"), "{}", first.text);
    assert!(!first.text.contains("second"), "{}", first.text);
    assert!(first.text.contains(&first.cell), "{}", first.text);
    assert_eq!(first.structured()["status"], "running");
    let (last, all) = finish(&w, "s1", &first.cell).await;
    assert_eq!(last.status, CellStatus::Finished, "{all}");
    assert!(all.contains("second"), "{all}");
    assert!(last.text.contains("done"), "{}", last.text);
    assert!(
        !last.text.contains("first"),
        "output already reported is not repeated: {}",
        last.text
    );
    assert_eq!(w.runs.load(Ordering::SeqCst), 2);
    // The result was returned: waiting again is an error, as is another session's or an
    // unknown cell.
    let again = w.codemode.wait_cell("s1", &first.cell, wait_for(10)).await;
    assert!(
        matches!(again, Err(CellError::Finished { .. })),
        "{again:?}"
    );
    let stored = w.store.get_cell(&first.cell).await.unwrap().unwrap();
    assert_eq!(stored.status, CellStatus::Finished);
    assert!(w.store.read_replay(&first.cell).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_refuses_unknown_and_other_sessions_cells() {
    let dir = tempfile::tempdir().unwrap();
    let w = world(dir.path(), Setup::default()).await;
    let code = "// @options: {\"yield_after_ms\": 50}\nawait tools.counted({ms: 3000}); return 1";
    let r = w.codemode.start_cell(req(code, "owner")).await.unwrap();
    assert_eq!(r.status, CellStatus::Running);
    let other = w
        .codemode
        .wait_cell("intruder", &r.cell, wait_for(10))
        .await;
    let message = other.unwrap_err().to_string();
    assert!(message.contains("no cell"), "{message}");
    let unknown = w
        .codemode
        .wait_cell("owner", "cell_nope", wait_for(10))
        .await;
    assert!(matches!(unknown, Err(CellError::Unknown(_))), "{unknown:?}");
    // The intruder's attempt to terminate did nothing either.
    let terminate = WaitOptions {
        timeout: None,
        terminate: true,
    };
    assert!(
        w.codemode
            .wait_cell("intruder", &r.cell, terminate.clone())
            .await
            .is_err()
    );
    let done = w
        .codemode
        .wait_cell("owner", &r.cell, wait_for(10_000))
        .await
        .unwrap();
    assert_eq!(done.status, CellStatus::Finished, "{}", done.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminate_stops_the_script_and_cancels_its_calls() {
    let dir = tempfile::tempdir().unwrap();
    let w = world(dir.path(), Setup::default()).await;
    let code = "// @options: {\"yield_after_ms\": 200}\ntext('going');\nawait Promise.all([tools.counted({ms: 60000}), tools.counted({ms: 60000})]);\ntext('never');";
    let r = w.codemode.start_cell(req(code, "s")).await.unwrap();
    assert_eq!(r.status, CellStatus::Running);
    let stopped = w
        .codemode
        .wait_cell(
            "s",
            &r.cell,
            WaitOptions {
                timeout: None,
                terminate: true,
            },
        )
        .await
        .unwrap();
    assert_eq!(stopped.status, CellStatus::Terminated, "{}", stopped.text);
    assert!(!stopped.text.contains("never"));
    assert_eq!(
        w.cancelled.load(Ordering::SeqCst),
        2,
        "both calls in flight were cancelled"
    );
    let stored = w.store.get_cell(&r.cell).await.unwrap().unwrap();
    assert_eq!(stored.status, CellStatus::Terminated);
}

/// Red-team finding: a request that started a cell a few milliseconds after its client ended
/// the session (HTTP `DELETE`) ran on after the session was gone. A cell of an ended session is
/// terminated as soon as it is registered, and its other cells at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cells_of_a_session_its_client_ended_are_terminated_even_when_they_start_after() {
    let dir = tempfile::tempdir().unwrap();
    let w = world(dir.path(), Setup::default()).await;
    let code =
        "// @options: {\"yield_after_ms\": 200}\nawait tools.counted({ms: 60000});\ntext('never');";
    let before = w.codemode.start_cell(req(code, "gone")).await.unwrap();
    assert_eq!(before.status, CellStatus::Running);
    let cells = w.codemode.cells().unwrap();
    assert_eq!(cells.terminate_session("gone"), 1);
    // The racing request: its cell registers after the session ended.
    let after = w.codemode.start_cell(req(code, "gone")).await.unwrap();
    for report in [before, after] {
        // A cell that ended before its first answer reports its end at once.
        let end = match report.status {
            CellStatus::Running => w
                .codemode
                .wait_cell("gone", &report.cell, wait_for(30_000))
                .await
                .unwrap(),
            _ => report,
        };
        assert_eq!(end.status, CellStatus::Terminated, "{}", end.text);
        assert!(!end.text.contains("never"));
    }
    // Another session is not affected.
    let other = w.codemode.start_cell(req(code, "kept")).await.unwrap();
    assert_eq!(other.status, CellStatus::Running);
}

/// A session ended in one process (its client's `DELETE` or its expiry, answered there) ends
/// its cells in every process on the store: a looping cell run by another process stops at its
/// next call, a paused one is denied and never runs, and a cell whose holder is gone is closed
/// with its script call named. Another session's cell runs on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_ended_in_one_process_ends_its_cells_in_another() {
    let dir = tempfile::tempdir().unwrap();
    let runner = world(dir.path(), Setup::default()).await;
    let ender = world(dir.path(), Setup::default()).await;
    let looping =
        "// @options: {\"yield_after_ms\": 200}\nwhile (true) await tools.counted({ms: 20});";
    let paused = "// @options: {\"yield_after_ms\": 200}\nawait tools.danger({});";
    let cell = runner.codemode.start_cell(req(looping, "s")).await.unwrap();
    assert_eq!(cell.status, CellStatus::Running, "{}", cell.text);
    let waiting = runner.codemode.start_cell(req(paused, "s")).await.unwrap();
    assert_eq!(waiting.status, CellStatus::WaitingForApproval);
    let long = "// @options: {\"yield_after_ms\": 200}\nawait tools.counted({ms: 60000});";
    let kept = runner.codemode.start_cell(req(long, "kept")).await.unwrap();
    // A cell whose holder died without a word.
    ender
        .store
        .create_cell(codemode_state::NewCell {
            id: "cell_orphan".into(),
            session_id: "s".into(),
            source: paused.into(),
            source_hash: "h".into(),
            options: json!({"call_id": "codemode_9", "journal_id": "j-orphan"}),
            owner: "a-dead-process".into(),
            lease: Duration::from_millis(1),
            max_live_per_session: None,
        })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;

    let ender_cells = ender.codemode.cells().unwrap();
    let ended = ender_cells
        .end_session_everywhere("s", "its client ended it")
        .await;
    assert_eq!(ended, 3);
    // No call of the looping cell starts any more: it stops at its next one.
    let (end, _) = finish(&runner, "s", &cell.cell).await;
    assert_eq!(end.status, CellStatus::Terminated, "{}", end.text);
    assert!(end.text.contains("its session ended"), "{}", end.text);
    let runs = runner.runs.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(runner.runs.load(Ordering::SeqCst) <= runs + 1);
    let (end, _) = finish(&runner, "s", &waiting.cell).await;
    assert_eq!(end.status, CellStatus::Terminated, "{}", end.text);
    assert_eq!(runner.danger_runs.load(Ordering::SeqCst), 0);
    let approval = runner
        .store
        .get_approval(&waiting.pending[0].approval_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(approval.answered_channel.as_deref(), Some("session-ended"));
    let other = runner
        .codemode
        .wait_cell("kept", &kept.cell, wait_for(0))
        .await
        .unwrap();
    assert_eq!(other.status, CellStatus::Running, "{}", other.text);

    let stopped: Vec<Value> = audit_lines(&runner.audit)
        .into_iter()
        .filter(|l| l["event"] == "cell_stopped")
        .collect();
    assert_eq!(stopped.len(), 3, "{stopped:?}");
    let runner_name = &runner.codemode.cells().unwrap().config().replica;
    for l in &stopped {
        assert_eq!(l["session_id"], "s");
        assert_eq!(l["reason"], "session_ended");
        assert_eq!(l["stopped_by"], ender_cells.config().replica.as_str());
        if l["cell_id"] == "cell_orphan" {
            // Nobody else will end its script call: this line does, for `audit verify`.
            assert_eq!(l["journal_id"], "j-orphan", "{l}");
            assert_eq!(l["provenance"]["call_id"], "codemode_9", "{l}");
        } else {
            assert_eq!(l["holder"], runner_name.as_str(), "{l}");
            assert!(l.get("journal_id").is_none(), "{l}");
        }
    }
}

/// Budgets that let a script make three calls.
fn three_calls_per_script() -> Budgets {
    Budgets {
        script: BudgetLimits {
            max_calls: Some(3),
            ..BudgetLimits::default()
        },
        ..Budgets::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_script_budget_holds_across_yields() {
    let dir = tempfile::tempdir().unwrap();
    let setup = Setup {
        budgets: three_calls_per_script(),
        ..Setup::default()
    };
    let w = world(dir.path(), setup).await;
    let code = r#"// @options: {"yield_after_ms": 100}
const seen = [];
for (let i = 0; i < 6; i++) {
  try { await tools.counted({ ms: 300 }); seen.push("ok"); } catch (e) { seen.push(e.stage); }
}
return seen;"#;
    let r = w.codemode.start_cell(req(code, "s")).await.unwrap();
    assert_eq!(r.status, CellStatus::Running);
    let (last, _) = finish(&w, "s", &r.cell).await;
    let value = &last.structured()["value"];
    assert_eq!(
        value,
        &json!(["ok", "ok", "ok", "budget", "budget", "budget"]),
        "{}",
        last.text
    );
    assert_eq!(w.runs.load(Ordering::SeqCst), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_has_a_bounded_number_of_live_cells() {
    let dir = tempfile::tempdir().unwrap();
    let w = world(
        dir.path(),
        Setup {
            max_live: 2,
            ..Setup::default()
        },
    )
    .await;
    let code = "// @options: {\"yield_after_ms\": 20}\nawait tools.counted({ms: 5000})";
    let a = w.codemode.start_cell(req(code, "s")).await.unwrap();
    let _b = w.codemode.start_cell(req(code, "s")).await.unwrap();
    let third = w.codemode.start_cell(req(code, "s")).await;
    let message = third.unwrap_err().to_string();
    assert!(message.contains("already has 2 live cells"), "{message}");
    // Another session is not affected.
    assert!(w.codemode.start_cell(req(code, "t")).await.is_ok());
    let stop = WaitOptions {
        timeout: None,
        terminate: true,
    };
    w.codemode.wait_cell("s", &a.cell, stop).await.unwrap();
    assert!(
        w.codemode.start_cell(req(code, "s")).await.is_ok(),
        "room again after one ended"
    );
}

fn audit_lines(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_call_waits_for_approval_and_runs_once_approved() {
    let dir = tempfile::tempdir().unwrap();
    let w = world(dir.path(), Setup::default()).await;
    let code = r#"await tools.counted({});
const r = await tools.danger({ path: "/etc/motd", mode: 420 });
text("danger ran " + r.n);
return r.n;"#;
    let r = w.codemode.start_cell(req(code, "s")).await.unwrap();
    assert_eq!(r.status, CellStatus::WaitingForApproval, "{}", r.text);
    let pending = &r.pending[0];
    assert_eq!(pending.tool, "danger");
    assert_eq!(
        pending.arguments,
        json!({ "path": "/etc/motd", "mode": 420 })
    );
    assert_eq!(
        pending.policy_ids,
        vec!["danger-needs-a-person".to_string()]
    );
    assert!(r.text.contains(&pending.approval_id), "{}", r.text);
    assert_eq!(w.danger_runs.load(Ordering::SeqCst), 0);
    let stored = w.store.get_cell(&r.cell).await.unwrap().unwrap();
    assert_eq!(stored.status, CellStatus::WaitingForApproval);
    assert_eq!(
        stored.approval_id.as_deref(),
        Some(pending.approval_id.as_str())
    );

    w.codemode
        .answer_approval(&pending.approval_id, Decision::Approve, "alice", "library")
        .await
        .unwrap();
    let (last, _) = finish(&w, "s", &r.cell).await;
    assert_eq!(last.status, CellStatus::Finished, "{}", last.text);
    assert!(last.text.contains("danger ran 1"), "{}", last.text);
    assert_eq!(w.danger_runs.load(Ordering::SeqCst), 1);
    // Answering again is refused, naming who answered.
    let again = w
        .codemode
        .answer_approval(&pending.approval_id, Decision::Deny, "mallory", "library")
        .await;
    let message = again.unwrap_err().to_string();
    assert!(
        message.contains("already answered") && message.contains("alice"),
        "{message}"
    );
    let unknown = w
        .codemode
        .answer_approval("ap_nope", Decision::Approve, "x", "library")
        .await;
    assert!(unknown.unwrap_err().to_string().contains("no approval"));
    let lines = audit_lines(&w.audit);
    let answer = lines
        .iter()
        .find(|l| l["event"] == "approval")
        .expect("an audit line for the answer");
    assert_eq!(answer["decision"], "approved");
    assert_eq!(answer["by"], "alice");
    assert_eq!(answer["channel"], "library");
    assert_eq!(answer["tool"], "danger");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_or_expired_approval_is_a_refusal_the_script_sees() {
    let dir = tempfile::tempdir().unwrap();
    let w = world(
        dir.path(),
        Setup {
            expiry: Duration::from_millis(1500),
            ..Setup::default()
        },
    )
    .await;
    let code = r#"try { await tools.danger({ n: 1 }); return "ran"; } catch (e) { return e.stage + ": " + e.message; }"#;
    let denied = w.codemode.start_cell(req(code, "s")).await.unwrap();
    let id = denied.pending[0].approval_id.clone();
    w.codemode
        .answer_approval(&id, Decision::Deny, "bob", "library")
        .await
        .unwrap();
    let (last, _) = finish(&w, "s", &denied.cell).await;
    assert!(
        last.text.contains("approval: `danger` was not approved"),
        "{}",
        last.text
    );

    let expiring = w.codemode.start_cell(req(code, "s")).await.unwrap();
    assert_eq!(expiring.status, CellStatus::WaitingForApproval);
    let id = expiring.pending[0].approval_id.clone();
    let (last, _) = finish(&w, "s", &expiring.cell).await;
    assert!(last.text.contains("expired"), "{}", last.text);
    let late = w
        .codemode
        .answer_approval(&id, Decision::Approve, "carol", "library")
        .await;
    let message = late.unwrap_err().to_string();
    assert!(
        message.contains("expired") || message.contains("already answered"),
        "{message}"
    );
    assert_eq!(w.danger_runs.load(Ordering::SeqCst), 0);
    let lines = audit_lines(&w.audit);
    let expired: Vec<&Value> = lines
        .iter()
        .filter(|l| l["event"] == "approval" && l["decision"] == "expired")
        .collect();
    assert_eq!(expired.len(), 1, "one audit line per expiry: {lines:?}");
    assert_eq!(expired[0]["channel"], "expiry");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_two_answers_at_once_exactly_one_wins() {
    let dir = tempfile::tempdir().unwrap();
    let w = world(dir.path(), Setup::default()).await;
    let r = w
        .codemode
        .start_cell(req("return (await tools.danger({})).n", "s"))
        .await
        .unwrap();
    let id = r.pending[0].approval_id.clone();
    let (a, b) = tokio::join!(
        w.codemode
            .answer_approval(&id, Decision::Approve, "alice", "library"),
        w.codemode
            .answer_approval(&id, Decision::Deny, "bob", "library"),
    );
    assert!(a.is_ok() != b.is_ok(), "{a:?} {b:?}");
    let (last, _) = finish(&w, "s", &r.cell).await;
    let ran = w.danger_runs.load(Ordering::SeqCst);
    assert_eq!(ran, u64::from(a.is_ok()), "{}", last.text);
    // An approval answered with the hash of another call is refused.
    let r2 = w
        .codemode
        .start_cell(req("return (await tools.danger({x: 2})).n", "s"))
        .await
        .unwrap();
    let id2 = r2.pending[0].approval_id.clone();
    let other_hash = codemode_state::call_hash("danger", &json!({"x": 3}), &json!({}));
    let forged = codemode_runtime::cells::answer_approval(
        w.store.as_ref(),
        &AuditLog::disabled(),
        &id2,
        Decision::Approve,
        "mallory",
        "cli",
        Some(&other_hash),
    )
    .await;
    assert!(
        matches!(forged, Err(StateError::ApprovalMismatch { .. })),
        "{forged:?}"
    );
    let terminate = WaitOptions {
        timeout: None,
        terminate: true,
    };
    w.codemode
        .wait_cell("s", &r2.cell, terminate)
        .await
        .unwrap();
    let left = w
        .store
        .list_approvals(ApprovalQuery::pending())
        .await
        .unwrap();
    assert!(
        left.is_empty(),
        "a terminated cell leaves no pending approval: {left:?}"
    );
}

/// Starts `code` as a cell of session "s", which must wait for an approval: the report and the
/// approval's id.
async fn waiting_for_approval(w: &World, code: &str) -> (codemode_runtime::CellReport, String) {
    let r = w.codemode.start_cell(req(code, "s")).await.unwrap();
    assert_eq!(r.status, CellStatus::WaitingForApproval, "{}", r.text);
    let approval = r.pending[0].approval_id.clone();
    (r, approval)
}

/// Found by a red team: an answer was written to the store first and audited after, and a line
/// that could not be written was only logged, so an approval could count with nobody on record
/// as having given it. Now the answer's line comes first: a log that cannot take it leaves the
/// call unapproved (a denial still stands: it lets nothing run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_that_cannot_be_audited_is_not_given() {
    let dir = tempfile::tempdir().unwrap();
    let w = world(dir.path(), Setup::default()).await;
    let (r, approval) = waiting_for_approval(&w, "await tools.danger({}); return 'ran';").await;
    // A log of its own for the answering side (as `codemode approvals` opens one), whose head
    // no longer matches: every append fails.
    let log = dir.path().join("answers.jsonl");
    let answers = AuditLog::open_with_key(&log, AuditKey::from_bytes([9; 32])).unwrap();
    answers
        .append_async(serde_json::Map::from_iter([(
            "event".into(),
            json!("first"),
        )]))
        .await
        .unwrap();
    std::fs::write(dir.path().join("answers.jsonl.head"), "not a head").unwrap();
    let err = codemode_runtime::cells::answer_approval(
        w.store.as_ref(),
        &answers,
        &approval,
        Decision::Approve,
        "mallory",
        "cli",
        None,
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, StateError::ApprovalNotAudited { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("audit log"), "{err}");
    let stored = w.store.get_approval(&approval).await.unwrap().unwrap();
    assert_eq!(stored.state, codemode_state::ApprovalState::Pending);
    assert_eq!(w.danger_runs.load(Ordering::SeqCst), 0);
    // A denial goes through.
    let denied = codemode_runtime::cells::answer_approval(
        w.store.as_ref(),
        &answers,
        &approval,
        Decision::Deny,
        "alice",
        "cli",
        None,
    )
    .await
    .unwrap();
    assert_eq!(denied.state, codemode_state::ApprovalState::Denied);
    let (last, all) = finish(&w, "s", &r.cell).await;
    assert!(!all.contains("ran"), "{all}");
    assert_eq!(w.danger_runs.load(Ordering::SeqCst), 0, "{:?}", last.status);
}

/// An answer's line names who gave it, before the line of what it came to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_is_on_record_before_it_counts() {
    let dir = tempfile::tempdir().unwrap();
    let w = world(dir.path(), Setup::default()).await;
    let (r, approval) = waiting_for_approval(&w, "await tools.danger({}); return 'ran';").await;
    w.codemode
        .answer_approval(&approval, Decision::Approve, "alice", "library")
        .await
        .unwrap();
    let (last, all) = finish(&w, "s", &r.cell).await;
    assert_eq!(last.status, CellStatus::Finished, "{all}");
    let lines = audit_lines(&w.audit);
    let at = |event: &str| {
        lines
            .iter()
            .position(|l| l["event"] == event && l["approval_id"] == approval.as_str())
            .unwrap_or_else(|| panic!("no {event} line: {lines:?}"))
    };
    assert!(at("approval_answer") < at("approval"));
    let attempt = &lines[at("approval_answer")];
    assert_eq!(attempt["by"], "alice");
    assert_eq!(attempt["decision"], "approve");
    assert_eq!(attempt["channel"], "library");
}

/// The first process stops holding its cells (nothing is recorded about their end), `approval`
/// is answered while nobody holds the cell, and once the lease ran out a second world (a new
/// process on the same store, set up as `setup` says) is started, to take the cell over.
async fn approved_while_abandoned(
    first: &World,
    approval: &str,
    dir: &std::path::Path,
    setup: Setup,
) -> World {
    let lease = setup.lease;
    first.codemode.cells().unwrap().abandon();
    codemode_runtime::cells::answer_approval(
        first.store.as_ref(),
        &AuditLog::disabled(),
        approval,
        Decision::Approve,
        "alice",
        "cli",
        None,
    )
    .await
    .unwrap();
    tokio::time::sleep(lease + Duration::from_millis(300)).await;
    world(dir, setup).await
}

/// Starts `code` in session "s" of a first process, where it must wait for an approval; the
/// process stops, the approval is answered yes, and a second process (set up by `setup`) takes
/// the cell over and finishes it. Returns the second process and the cell's last report.
async fn finished_after_takeover(
    dir: &std::path::Path,
    code: &str,
    setup: impl Fn() -> Setup,
) -> (World, codemode_runtime::CellReport) {
    let first = world(dir, setup()).await;
    let r = first.codemode.start_cell(req(code, "s")).await.unwrap();
    assert_eq!(r.status, CellStatus::WaitingForApproval, "{}", r.text);
    let approval = r.pending[0].approval_id.clone();
    let second = approved_while_abandoned(&first, &approval, dir, setup()).await;
    assert_eq!(
        second.codemode.resume_cells().await.unwrap(),
        vec![r.cell.clone()]
    );
    let (last, all) = finish(&second, "s", &r.cell).await;
    assert_eq!(last.status, CellStatus::Finished, "{all}");
    (second, last)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_taken_over_by_another_process_replays_its_calls_and_runs_none_twice() {
    let dir = tempfile::tempdir().unwrap();
    let lease = Duration::from_millis(600);
    let first = world(
        dir.path(),
        Setup {
            lease,
            ..Setup::default()
        },
    )
    .await;
    let code = r#"const a = await tools.counted({ step: 1 });
const b = await tools.counted({ step: 2, random: Math.random() });
text("before " + a.n + b.n);
const d = await tools.danger({ after: b.n });
text("after " + d.n);
return [a.n, b.n, d.n];"#;
    let r = first.codemode.start_cell(req(code, "s")).await.unwrap();
    assert_eq!(r.status, CellStatus::WaitingForApproval, "{}", r.text);
    let approval = r.pending[0].approval_id.clone();
    assert_eq!(first.runs.load(Ordering::SeqCst), 2);
    // The first process dies, the approval is answered while nobody holds the cell, and a
    // second process takes the cell over.
    let second = approved_while_abandoned(
        &first,
        &approval,
        dir.path(),
        Setup {
            lease,
            ..Setup::default()
        },
    )
    .await;
    let resumed = second.codemode.resume_cells().await.unwrap();
    assert_eq!(resumed, vec![r.cell.clone()]);
    let (last, all) = finish(&second, "s", &r.cell).await;
    assert_eq!(last.status, CellStatus::Finished, "{all}");
    assert_eq!(
        last.structured()["value"],
        json!([1, 2, 1]),
        "{}",
        last.text
    );
    assert_eq!(
        second.runs.load(Ordering::SeqCst),
        0,
        "no recorded call ran again"
    );
    assert_eq!(second.danger_runs.load(Ordering::SeqCst), 1);
    assert_eq!(first.danger_runs.load(Ordering::SeqCst), 0);
    // The script's own call: the process that let go of it says so (not as a failure), and
    // the one that finished it says how it ended; both name its one journal line.
    let ends: Vec<Value> = audit_lines(&second.audit)
        .into_iter()
        .filter(|l| l["tool"] == "codemode" && l.get("status").is_some())
        .collect();
    assert_eq!(ends.len(), 2, "{ends:#?}");
    assert_eq!(ends[0]["status"], "cancelled", "{ends:#?}");
    assert!(
        ends[0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("carry on by replay")),
        "{ends:#?}"
    );
    assert_eq!(ends[1]["event"], "taken_over_script_end", "{ends:#?}");
    assert_eq!(ends[1]["status"], "ok", "{ends:#?}");
    assert_eq!(ends[0]["journal_id"], ends[1]["journal_id"], "{ends:#?}");
}

/// Red team: a rebuilt cell checked each logged call only when the script reached it again. A
/// script that went another way after a takeover (here a stored value changed meanwhile) and
/// ended before its logged calls did was reported finished, as if a call that ran never had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuilt_cell_that_skips_a_logged_call_fails() {
    let dir = tempfile::tempdir().unwrap();
    let lease = Duration::from_millis(600);
    let setup = || Setup {
        lease,
        ..Setup::default()
    };
    let first = world(dir.path(), setup()).await;
    let code = r#"await tools.counted({ step: 1 });
if (!load("skip")) {
  await tools.counted({ step: 2 });
  await tools.danger({});
}
store("done", true);
return "done";"#;
    let r = first.codemode.start_cell(req(code, "s")).await.unwrap();
    assert_eq!(r.status, CellStatus::WaitingForApproval, "{}", r.text);
    assert_eq!(first.runs.load(Ordering::SeqCst), 2);
    // While nobody holds the cell, the value its branch reads changes.
    first
        .store
        .apply_store(
            "s",
            &[codemode_state::StoreChange::Set {
                key: "skip".into(),
                value: json!(true),
            }],
        )
        .await
        .unwrap();
    let approval = r.pending[0].approval_id.clone();
    let second = approved_while_abandoned(&first, &approval, dir.path(), setup()).await;
    assert_eq!(
        second.codemode.resume_cells().await.unwrap(),
        vec![r.cell.clone()]
    );
    let (last, all) = finish(&second, "s", &r.cell).await;
    assert_eq!(last.status, CellStatus::Failed, "{all}");
    assert!(
        last.text.contains("ended without making call 2 again") && last.text.contains("counted"),
        "{}",
        last.text
    );
    assert_eq!(second.runs.load(Ordering::SeqCst), 0);
    assert_eq!(second.danger_runs.load(Ordering::SeqCst), 0);
    let stored = second.store.load_store("s").await.unwrap();
    assert!(
        !stored.contains_key("done"),
        "its store() writes were kept: {stored:?}"
    );
}

/// A script's budget holds across a takeover: the calls the new process answers from the log
/// count as they did where they ran, so the rebuilt script cannot make its budget's worth of
/// calls again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_script_budget_holds_across_a_takeover() {
    let dir = tempfile::tempdir().unwrap();
    let lease = Duration::from_millis(600);
    let setup = || Setup {
        lease,
        budgets: three_calls_per_script(),
        ..Setup::default()
    };
    let code = r#"await tools.counted({ step: 1 });
await tools.counted({ step: 2 });
await tools.danger({});
// A burst at once, past the budget the replayed calls already used.
return await Promise.all([3, 4, 5].map((step) =>
  tools.counted({ step }).then(() => "ok", (e) => e.stage)));"#;
    let (second, last) = finished_after_takeover(dir.path(), code, setup).await;
    assert_eq!(
        last.structured()["value"],
        json!(["budget", "budget", "budget"]),
        "two replayed calls and the approved one use the budget of 3: {}",
        last.text
    );
    assert_eq!(second.runs.load(Ordering::SeqCst), 0);
    assert_eq!(second.danger_runs.load(Ordering::SeqCst), 1);
}

/// A rebuilt cell used to start a fresh `timeout_ms` for the rest of its script, so a cell
/// whose process was restarted while it waited for a person ran about one more timeout per
/// restart. Its log now carries the script's running time: here 2.5 s of a 4 s timeout were
/// spent before the takeover, so the 2.5 s call after it passes the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deadline_holds_across_a_takeover() {
    let dir = tempfile::tempdir().unwrap();
    let lease = Duration::from_millis(600);
    let setup = || Setup {
        lease,
        ..Setup::default()
    };
    let code = r#"// @options: {"timeout_ms": 4000}
await tools.counted({ step: 1, ms: 2500 });
await tools.danger({});
await tools.counted({ step: 2, ms: 2500 });
return "finished";"#;
    let first = world(dir.path(), setup()).await;
    let r = first.codemode.start_cell(req(code, "s")).await.unwrap();
    let r = if r.status == CellStatus::Running {
        first
            .codemode
            .wait_cell("s", &r.cell, wait_for(10_000))
            .await
            .unwrap()
    } else {
        r
    };
    assert_eq!(r.status, CellStatus::WaitingForApproval, "{}", r.text);
    let approval = r.pending[0].approval_id.clone();
    let second = approved_while_abandoned(&first, &approval, dir.path(), setup()).await;
    assert_eq!(
        second.codemode.resume_cells().await.unwrap(),
        vec![r.cell.clone()]
    );
    let started = std::time::Instant::now();
    let (last, all) = finish(&second, "s", &r.cell).await;
    assert_eq!(last.status, CellStatus::Failed, "{all}");
    assert!(all.contains("4000 ms"), "{all}");
    assert!(!all.contains("finished"), "{all}");
    // The approved call ran once; the last call was cut at the deadline, not let run out.
    assert_eq!(second.danger_runs.load(Ordering::SeqCst), 1);
    assert_eq!(second.cancelled.load(Ordering::SeqCst), 1, "{all}");
    assert!(
        started.elapsed() < Duration::from_millis(2_400),
        "the rebuilt cell ran {:?}",
        started.elapsed()
    );
}

/// A rebuilt cell re-runs its script's code up to its last logged call, and that CPU time counts
/// against `cpu_ms` again: a script cannot get a fresh CPU budget by being taken over. The loop's
/// length is found with the CPU limit itself (not a clock), so a loaded machine does not move
/// it: `work` iterations use most of `cpu` ms, so twice that passes `cpu * 3 / 2` while once
/// does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cpu_budget_holds_across_a_takeover() {
    let dir = tempfile::tempdir().unwrap();
    let cpu = 600;
    let setup = |cpu_ms| Setup {
        lease: Duration::from_millis(600),
        cpu_ms: Some(cpu_ms),
        ..Setup::default()
    };
    std::fs::create_dir(dir.path().join("calibrate")).unwrap();
    let calibrating = world(&dir.path().join("calibrate"), setup(cpu)).await;
    let spin =
        |n: u64| format!("{{ let x = 0; for (let i = 0; i < {n}; i++) {{ x = (x + i) % 7; }} }}");
    let fits = |n: u64| {
        let code = format!("{}\nreturn 1;", spin(n));
        let codemode = calibrating.codemode.clone();
        async move {
            let run = codemode.run_script(req(&code, "calibrate")).await;
            if run.is_error {
                assert!(run.text.contains("CPU budget"), "{}", run.text);
            }
            !run.is_error
        }
    };
    let mut low = 10_000;
    while fits(low * 2).await {
        low *= 2;
    }
    let mut high = low * 2;
    for _ in 0..4 {
        let mid = (low + high) / 2;
        if fits(mid).await {
            low = mid;
        } else {
            high = mid;
        }
    }
    let work = low;
    let code = format!(
        "{}\nawait tools.danger({{}});\n{}\nreturn \"finished\";",
        spin(work),
        spin(work)
    );
    let first = world(dir.path(), setup(cpu * 3 / 2)).await;
    let r = first.codemode.start_cell(req(&code, "s")).await.unwrap();
    let r = if r.status == CellStatus::Running {
        first
            .codemode
            .wait_cell("s", &r.cell, wait_for(20_000))
            .await
            .unwrap()
    } else {
        r
    };
    assert_eq!(r.status, CellStatus::WaitingForApproval, "{}", r.text);
    let approval = r.pending[0].approval_id.clone();
    let second = approved_while_abandoned(&first, &approval, dir.path(), setup(cpu * 3 / 2)).await;
    assert_eq!(
        second.codemode.resume_cells().await.unwrap(),
        vec![r.cell.clone()]
    );
    let (last, all) = finish(&second, "s", &r.cell).await;
    assert_eq!(last.status, CellStatus::Failed, "{all}");
    assert!(all.contains("CPU budget"), "{all}");
    assert!(!all.contains("finished"), "{all}");
    assert_eq!(second.danger_runs.load(Ordering::SeqCst), 1);
}

/// Starts `code` as a cell of session "s" that waits for an approval, abandons it, sets the
/// store's "mode" to "b" behind it, and lets a second process take it over and finish it.
async fn replayed_after_the_store_changed(
    dir: &std::path::Path,
    code: &str,
) -> (
    World,
    codemode_runtime::CellReport,
    codemode_runtime::CellReport,
) {
    let lease = Duration::from_millis(400);
    let setup = || Setup {
        lease,
        ..Setup::default()
    };
    let first = world(dir, setup()).await;
    let r = first.codemode.start_cell(req(code, "s")).await.unwrap();
    assert_eq!(r.status, CellStatus::WaitingForApproval, "{}", r.text);
    first.codemode.cells().unwrap().abandon();
    first
        .store
        .apply_store(
            "s",
            &[codemode_state::StoreChange::Set {
                key: "mode".into(),
                value: json!("b"),
            }],
        )
        .await
        .unwrap();
    tokio::time::sleep(lease + Duration::from_millis(300)).await;
    let second = world(dir, setup()).await;
    second.codemode.resume_cells().await.unwrap();
    let (last, _) = finish(&second, "s", &r.cell).await;
    (second, last, r)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_that_differs_on_replay_fails_naming_the_step() {
    // The script depends on the store, which changes between the run and its replay.
    let code = r#"const mode = load("mode") ?? "a";
await tools.counted({ mode });
await tools.danger({});
return mode;"#;
    let dir = tempfile::tempdir().unwrap();
    let (second, last, r) = replayed_after_the_store_changed(dir.path(), code).await;
    assert_eq!(last.status, CellStatus::Failed);
    assert!(last.text.contains("diverged at step 1"), "{}", last.text);
    assert!(
        last.text.contains(r#"{"mode":"b"}"#) && last.text.contains(r#"{"mode":"a"}"#),
        "{}",
        last.text
    );
    assert_eq!(second.runs.load(Ordering::SeqCst), 0);
    let stored = second.store.get_cell(&r.cell).await.unwrap().unwrap();
    assert_eq!(stored.status, CellStatus::Failed);
}

/// A red team's script catches the divergence error and goes on calling tools at once: the
/// cell was failed, and nothing past the divergence may run for real.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_that_catches_its_divergence_runs_no_further_call() {
    let code = r#"const mode = load("mode") ?? "a";
let caught = null;
try { await tools.counted({ mode }); } catch (e) { caught = String(e); }
if (caught !== null) {
  for (let i = 0; i < 50; i++) {
    try { await tools.counted({ after: i }); } catch (e) {}
    Promise.resolve().then(() => tools.counted({ queued: i }).catch(() => {}));
  }
}
await tools.danger({});
return mode;"#;
    let dir = tempfile::tempdir().unwrap();
    let (second, last, _) = replayed_after_the_store_changed(dir.path(), code).await;
    assert_eq!(last.status, CellStatus::Failed, "{}", last.text);
    assert!(last.text.contains("diverged at step 1"), "{}", last.text);
    assert_eq!(
        second.runs.load(Ordering::SeqCst) + second.danger_runs.load(Ordering::SeqCst),
        0,
        "a call after the divergence ran"
    );
    // The log is shared: its one `counted` that ran is the first process's step 1.
    let ran_lines = audit_lines(&second.audit)
        .into_iter()
        .filter(|l| l["tool"] == "counted" && l["status"] == "ok")
        .count();
    assert_eq!(ran_lines, 1);
}

/// A call whose result crossed `max_bytes` ran, and its bytes were counted, though the script
/// got a budget error instead of the result. Rebuilt elsewhere, the script must find its bytes
/// spent still: its next call is refused as it would have been where the cell started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_withheld_by_the_budget_still_counts_after_a_takeover() {
    let dir = tempfile::tempdir().unwrap();
    let lease = Duration::from_millis(600);
    let setup = || Setup {
        lease,
        budgets: Budgets {
            script: BudgetLimits {
                max_bytes: Some(100),
                ..BudgetLimits::default()
            },
            ..Budgets::default()
        },
        ..Setup::default()
    };
    let first = world(dir.path(), setup()).await;
    // The first result (its arguments echoed, over 200 bytes) crosses the budget; the script
    // then works long enough for its process to stop under it, and calls again.
    let code = r#"// @options: {"yield_after_ms": 200}
const big = await tools.counted({ pad: "x".repeat(200) }).then(() => "ok", (e) => e.stage);
let x = 0;
for (let i = 0; i < 2e8; i++) x += i;
const next = await tools.counted({}).then(() => "ran", (e) => e.stage);
return [big, next];"#;
    let r = first.codemode.start_cell(req(code, "s")).await.unwrap();
    assert_eq!(r.status, CellStatus::Running, "{}", r.text);
    assert_eq!(first.runs.load(Ordering::SeqCst), 1);
    first.codemode.cells().unwrap().abandon();
    tokio::time::sleep(lease + Duration::from_millis(300)).await;

    let second = world(dir.path(), setup()).await;
    assert_eq!(
        second.codemode.resume_cells().await.unwrap(),
        vec![r.cell.clone()]
    );
    let (last, all) = finish(&second, "s", &r.cell).await;
    assert_eq!(last.status, CellStatus::Finished, "{all}");
    assert_eq!(
        last.structured()["value"],
        json!(["budget", "budget"]),
        "the withheld result's bytes count in the rebuilt script: {}",
        last.text
    );
    assert_eq!(second.runs.load(Ordering::SeqCst), 0, "nothing ran again");
}

/// The replay log keeps large arguments by their digest only: a script that makes refused
/// calls with a megabyte each in a loop must not make the shared store hold them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_arguments_are_logged_by_digest_and_still_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let first = world(
        dir.path(),
        Setup {
            pause: false,
            ..Setup::default()
        },
    )
    .await;
    // It keeps working after its calls, so that its log is read while the cell lives.
    let code = r#"// @options: {"yield_after_ms": 200}
const s = "x".repeat(1e6);
let refused = 0;
for (let i = 0; i < 20; i++) await tools.danger({ s, i }).catch(() => refused++);
text("refused " + refused);
let x = 0;
for (let i = 0; i < 2e8; i++) x += i;
return refused;"#;
    let r = first.codemode.start_cell(req(code, "s")).await.unwrap();
    let mut said = r.text.clone();
    for _ in 0..30 {
        if said.contains("refused 20") {
            break;
        }
        let more = first
            .codemode
            .wait_cell("s", &r.cell, wait_for(1_000))
            .await;
        said.push_str(&more.unwrap().text);
    }
    assert!(said.contains("refused 20"), "{said}");
    let logged: usize = first
        .store
        .read_replay(&r.cell)
        .await
        .unwrap()
        .iter()
        .map(|e| e.entry.to_string().len())
        .sum();
    assert!(
        logged > 0 && logged < 100_000,
        "20 refused calls of 1 MB each left {logged} bytes in the replay log"
    );
    let stop = WaitOptions {
        timeout: Some(Duration::from_secs(10)),
        terminate: true,
    };
    first.codemode.wait_cell("s", &r.cell, stop).await.unwrap();

    // A call with large arguments is still recognised when the cell is rebuilt.
    let lease = Duration::from_millis(600);
    let setup = || Setup {
        lease,
        ..Setup::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let code = r#"const s = "y".repeat(200000);
const a = await tools.counted({ s });
const d = await tools.danger({});
return [a.n, d.n];"#;
    let (second, last) = finished_after_takeover(dir.path(), code, setup).await;
    assert_eq!(last.structured()["value"], json!([1, 1]), "{}", last.text);
    assert_eq!(
        second.runs.load(Ordering::SeqCst),
        0,
        "replayed, not run again"
    );
}

/// Red team: a client that starts cells and never reads their results kept each one's whole
/// output in memory for an hour (30 MB a script that printed 15 MB), so memory grew with every
/// cell. A session keeps at most 16 unread ended cells in memory; the others are let go, and
/// `wait` still gets their result from the state store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ended_cells_nobody_reads_are_let_go_past_a_few_per_session() {
    let dir = tempfile::tempdir().unwrap();
    let w = world(
        dir.path(),
        Setup {
            max_live: 64,
            ..Setup::default()
        },
    )
    .await;
    let mut ids = Vec::new();
    for i in 0..24 {
        let code = format!(
            "// @options: {{\"yield_after_ms\": 20}}\nawait tools.counted({{ ms: 300 }});\ntext('x'.repeat(100000));\nreturn {i};"
        );
        let r = w.codemode.start_cell(req(&code, "s")).await.unwrap();
        assert_eq!(r.status, CellStatus::Running, "{}", r.text);
        ids.push(r.cell);
    }
    let cells = w.codemode.cells().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let ended = futures::future::join_all(ids.iter().map(|id| w.store.get_cell(id))).await;
        let all_ended = ended
            .iter()
            .all(|c| matches!(c, Ok(Some(c)) if c.status.is_terminal()));
        let held = ids.iter().filter(|id| cells.holds(id)).count();
        if all_ended && held <= 16 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{held} of 24 ended cells still held"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The first ones were let go; their result is still there.
    assert!(!cells.holds(&ids[0]));
    let report = w
        .codemode
        .wait_cell("s", &ids[0], wait_for(1_000))
        .await
        .unwrap();
    assert_eq!(report.status, CellStatus::Finished, "{}", report.text);
    assert!(report.text.contains("state store kept"), "{}", report.text);
    // The newest are still held, output and all.
    let last = w
        .codemode
        .wait_cell("s", &ids[23], wait_for(1_000))
        .await
        .unwrap();
    assert_eq!(last.status, CellStatus::Finished);
    assert!(last.structured()["value"] == 23, "{}", last.text);
}

const WRITE_ASKS: &str = r#"
@id("write-needs-a-person")
@ask("write changes files")
permit (principal, action == Action::"tool_call", resource == Tool::"write");
"#;

/// A process whose only tool is the real `write`, working in `project`, asking a person before
/// each write and pausing when nobody can answer; its cells' leases last `lease`.
async fn writing_world(dir: &std::path::Path, project: &std::path::Path, lease: Duration) -> World {
    let store = codemode_state::open(
        &format!("sqlite://{}", dir.join("state.db").display()),
        Default::default(),
    )
    .await
    .unwrap();
    let registry = Registry::new();
    for tool in codemode_tools::builtin_tools(&codemode_tools::ToolsConfig::new(project)) {
        if tool.spec().name == "write" {
            registry.register(tool).unwrap();
        }
    }
    let audit_path = dir.join("audit.jsonl");
    let audit = AuditLog::open_with_key(&audit_path, AuditKey::from_bytes([7; 32])).unwrap();
    let mut config = CellsConfig::new(store.clone());
    config.pause_approvals = true;
    config.approval_expiry = Duration::from_secs(600);
    config.lease = lease;
    config.yield_after = Duration::from_secs(30);
    config.audit = audit.clone();
    let cells = Cells::new(config);
    let gate = Gate::builder()
        .registry(registry)
        .policy(PolicySet::parse("write.cedar", WRITE_ASKS).unwrap())
        .approver(cells.approver(None))
        .workspace(project)
        .audit(audit)
        .build()
        .unwrap();
    let codemode = Codemode::builder().gate(gate).cells(cells).build().unwrap();
    World {
        codemode,
        runs: Arc::new(AtomicU64::new(0)),
        danger_runs: Arc::new(AtomicU64::new(0)),
        cancelled: Arc::new(AtomicU64::new(0)),
        store,
        audit: audit_path,
    }
}

/// `dir/project` with `notes` a link to `dir/outside`; returns (project, outside), resolved.
fn project_with_a_link_out(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = dir.canonicalize().unwrap();
    let (project, outside) = (dir.join("project"), dir.join("outside"));
    std::fs::create_dir_all(&project).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, project.join("notes")).unwrap();
    (project, outside)
}

const WRITE_NOTES: &str = r#"await tools.write({ path: "notes/x.txt", content: "from the script" });
return "written";"#;

/// Red team: `ln -s /outside project/notes`, a paused `write {path: "notes/x.txt"}`, and
/// `approvals show` printed only the arguments; approved, the file landed in /outside. The
/// stored approval holds where the call really lands, and its hash is bound to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_paused_through_a_link_stores_the_resolved_path_outside_the_project() {
    let dir = tempfile::tempdir().unwrap();
    let (project, outside) = project_with_a_link_out(dir.path());
    let w = writing_world(dir.path(), &project, Duration::from_secs(15)).await;
    let r = w.codemode.start_cell(req(WRITE_NOTES, "s")).await.unwrap();
    assert_eq!(r.status, CellStatus::WaitingForApproval, "{}", r.text);
    let id = r.pending[0].approval_id.clone();
    let stored = w.store.get_approval(&id).await.unwrap().unwrap();
    let landing = outside.join("x.txt").display().to_string();
    assert_eq!(stored.arguments["path"], "notes/x.txt");
    assert!(
        stored.paths.contains(&landing),
        "the approval must say the write lands at {landing}: {:?}",
        stored.paths
    );
    assert!(
        stored
            .paths
            .iter()
            .all(|p| !p.starts_with(&*project.display().to_string())),
        "{:?}",
        stored.paths
    );
    assert_eq!(
        stored.call_hash,
        codemode_state::call_hash_with_paths(
            &stored.tool,
            &stored.arguments,
            &stored.provenance,
            &stored.paths
        )
    );
    assert!(
        !outside.join("x.txt").exists(),
        "nothing is written before the answer"
    );
    // Approved for that place, it writes there (the person was shown it).
    w.codemode
        .answer_approval(&id, Decision::Approve, "alice", "library")
        .await
        .unwrap();
    let (last, all) = finish(&w, "s", &r.cell).await;
    assert_eq!(last.status, CellStatus::Finished, "{all}");
    assert_eq!(
        std::fs::read_to_string(outside.join("x.txt")).unwrap(),
        "from the script"
    );
}

/// Red team: the approval was bound only to the tool, arguments and provenance. Approved while
/// `notes` led to `outside`, the link was turned to `elsewhere` before another process took the
/// cell over and prepared the write again: the old approval matched and the file landed in
/// `elsewhere`, a place nobody approved. Now the call asks again, showing the new place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_does_not_carry_over_to_a_link_retargeted_before_a_takeover() {
    let dir = tempfile::tempdir().unwrap();
    let (project, outside) = project_with_a_link_out(dir.path());
    let elsewhere = outside.parent().unwrap().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let lease = Duration::from_millis(600);
    let first = writing_world(dir.path(), &project, lease).await;
    let r = first
        .codemode
        .start_cell(req(WRITE_NOTES, "s"))
        .await
        .unwrap();
    assert_eq!(r.status, CellStatus::WaitingForApproval, "{}", r.text);
    let approved = r.pending[0].approval_id.clone();

    // The first process lets go; the approval is given for `outside/x.txt`, as shown.
    first.codemode.cells().unwrap().abandon();
    codemode_runtime::cells::answer_approval(
        first.store.as_ref(),
        &AuditLog::disabled(),
        &approved,
        Decision::Approve,
        "alice",
        "cli",
        None,
    )
    .await
    .unwrap();
    // Then the link is turned elsewhere, and a second process takes the cell over.
    std::fs::remove_file(project.join("notes")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, project.join("notes")).unwrap();
    tokio::time::sleep(lease + Duration::from_millis(300)).await;
    let second = writing_world(dir.path(), &project, lease).await;
    assert_eq!(
        second.codemode.resume_cells().await.unwrap(),
        vec![r.cell.clone()]
    );
    let again = second
        .codemode
        .wait_cell("s", &r.cell, wait_for(2_000))
        .await
        .unwrap();
    assert_eq!(
        again.status,
        CellStatus::WaitingForApproval,
        "the old approval must not let the write through a retargeted link: {}",
        again.text
    );
    let asked = &again.pending[0];
    assert_ne!(asked.approval_id, approved, "a new approval is asked for");
    let new = second
        .store
        .get_approval(&asked.approval_id)
        .await
        .unwrap()
        .unwrap();
    let new_landing = elsewhere.join("x.txt").display().to_string();
    assert!(new.paths.contains(&new_landing), "{:?}", new.paths);
    assert!(
        !elsewhere.join("x.txt").exists(),
        "nothing written to the new target"
    );
    assert!(!outside.join("x.txt").exists(), "nor to the old one");

    // Denied, the script sees a refusal and still nothing is written.
    second
        .codemode
        .answer_approval(&asked.approval_id, Decision::Deny, "alice", "library")
        .await
        .unwrap();
    let (last, all) = finish(&second, "s", &r.cell).await;
    assert!(last.status.is_terminal(), "{all}");
    assert!(
        !all.contains("written") || all.contains("not approved"),
        "{all}"
    );
    assert!(!elsewhere.join("x.txt").exists());
    assert!(!outside.join("x.txt").exists());
}
