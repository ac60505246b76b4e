//! A cell whose principal is not known (recorded by a codemode that did not keep it) is not
//! taken over: run by replay in a process its client has not reached, its calls would be
//! charged to nobody. It fails, saying why, and none of its calls runs.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use codemode_gate::{AuditKey, AuditLog, Gate, PolicySet, Principal, Registry};
use codemode_runtime::{Cells, CellsConfig, Codemode, ScriptRequest};
use codemode_spec::{CallFacts, PreparedCall, Tool, ToolError, ToolOutput, ToolSpec, prepared};
use codemode_state::{CellStatus, NewCell, StateStore};
use common::Slow;
use futures::FutureExt;
use serde_json::{Value, json};

struct Counted {
    spec: ToolSpec,
    runs: Arc<AtomicU64>,
}

impl Tool for Counted {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }
    fn prepare(&self, _args: Value) -> Result<Box<dyn PreparedCall>, ToolError> {
        let runs = self.runs.clone();
        Ok(prepared(CallFacts::default(), move |_| {
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok(ToolOutput::value(json!({})))
            }
            .boxed()
        }))
    }
}

/// Cells `(id, session)` whose holder is gone (its lease already ran out), with their options
/// as their starter wrote them: `acts_for` as recorded, or missing as an older codemode left it.
async fn orphans(store: &Arc<dyn StateStore>, cells: &[(&str, &str)], acts_for: Option<Value>) {
    for (id, session) in cells {
        let mut options = json!({"call_id": format!("c-{id}"), "journal_id": format!("j-{id}"),
            "seed": 1, "start_ms": 0.0, "yield_after_ms": 1000});
        if let Some(acts_for) = &acts_for {
            options["acts_for"] = acts_for.clone();
        }
        store
            .create_cell(NewCell {
                id: id.to_string(),
                session_id: session.to_string(),
                source: "await tools.counted({}); return 1".into(),
                source_hash: "0".repeat(64),
                options,
                owner: "dead-replica".into(),
                lease: Duration::ZERO,
                max_live_per_session: None,
            })
            .await
            .unwrap();
    }
}

/// A process on `store` that may take cells over: the `counted` tool permitted, its audit log
/// at `log`. Returns it and how often `counted` ran.
fn taker(store: &Arc<dyn StateStore>, log: &std::path::Path) -> (Codemode, Arc<AtomicU64>) {
    let runs = Arc::new(AtomicU64::new(0));
    let registry = Registry::new();
    registry
        .register(Arc::new(Counted {
            spec: ToolSpec::new("counted", "counts", json!({"type": "object"})),
            runs: runs.clone(),
        }))
        .unwrap();
    let audit = AuditLog::open_with_key(log, AuditKey::from_bytes([7; 32])).unwrap();
    let mut config = CellsConfig::new(store.clone());
    config.audit = audit.clone();
    let policy =
        r#"permit (principal, action == Action::"tool_call", resource == Tool::"counted");"#;
    let gate = Gate::builder()
        .registry(registry)
        .policy(PolicySet::parse("p.cedar", policy).unwrap())
        .audit(audit)
        .build()
        .unwrap();
    let codemode = Codemode::builder()
        .gate(gate)
        .cells(Cells::new(config))
        .build()
        .unwrap();
    (codemode, runs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_without_a_recorded_principal_fails_closed_when_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::sqlite_store(dir.path()).await;
    orphans(&store, &[("cell_old", "s")], None).await;
    let log = dir.path().join("audit.jsonl");
    let (codemode, runs) = taker(&store, &log);

    let resumed = codemode.resume_cells().await.unwrap();
    assert!(resumed.is_empty(), "{resumed:?}");
    let cell = store.get_cell("cell_old").await.unwrap().unwrap();
    assert_eq!(cell.status, CellStatus::Failed);
    let text = cell.result.as_ref().unwrap()["text"].as_str().unwrap();
    assert!(
        text.contains("principal its session acted for was not recorded"),
        "{text}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);

    // The script's call, journalled as `j1` when it started, gets its end line here.
    let lines: Vec<Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let ends: Vec<&Value> = lines
        .iter()
        .filter(|l| l["event"] == "taken_over_script_end")
        .collect();
    assert_eq!(ends.len(), 1, "{lines:?}");
    let end = ends[0];
    assert_eq!(end["journal_id"], "j-cell_old");
    assert_eq!(end["cell_id"], "cell_old");
    assert_eq!(end["status"], "error");
    assert_eq!(end["cell_status"], "failed");
    assert!(
        end["message"]
            .as_str()
            .unwrap()
            .contains("principal its session acted for was not recorded"),
        "{end}"
    );
}

/// The session row a cell makes when its session has none names the principal the session acts
/// for, never the name its MCP client gave itself: replicas check who may continue a session
/// by that row, and a client may call itself anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cells_session_row_names_its_principal_not_its_clients_name() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::sqlite_store(dir.path()).await;
    let cells = Cells::new(CellsConfig::new(store.clone()));
    let gate = Gate::builder()
        .registry(Registry::new())
        .policy(PolicySet::parse("p.cedar", "").unwrap())
        .build()
        .unwrap();
    gate.set_principal(
        "alices-session",
        Principal {
            id: "alice".into(),
            team: None,
        },
    );
    let codemode = Codemode::builder().gate(gate).cells(cells).build().unwrap();
    for (session, client) in [("alices-session", "bob"), ("nobodys-session", "alice")] {
        let mut req = ScriptRequest::new("return 1", session);
        req.client = Some(client.into());
        let report = codemode.start_cell(req).await.unwrap();
        assert!(!report.is_error, "{}", report.text);
    }
    let row = |id: &'static str| {
        let store = store.clone();
        async move { store.get_session(id).await.unwrap().map(|r| r.principal) }
    };
    assert_eq!(row("alices-session").await, Some(Some("alice".into())));
    assert_eq!(row("nobodys-session").await, Some(None));
}

/// A cell still running when its session ended (and the gate was told to forget the session)
/// goes on acting for the session's principal, never for the process's default one; once it
/// ends, the gate keeps nothing of the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_finishing_after_its_session_ended_acts_for_its_principal_then_is_forgotten() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::sqlite_store(dir.path()).await;
    let started = Arc::new(tokio::sync::Semaphore::new(0));
    let release = Arc::new(tokio::sync::Semaphore::new(0));
    let runs = Arc::new(AtomicU64::new(0));
    let registry = Registry::new();
    registry
        .register(Arc::new(Slow {
            spec: ToolSpec::new("slow", "waits", json!({"type": "object"})),
            started: started.clone(),
            release: release.clone(),
        }))
        .unwrap();
    registry
        .register(Arc::new(Counted {
            spec: ToolSpec::new("counted", "counts", json!({"type": "object"})),
            runs: runs.clone(),
        }))
        .unwrap();
    let log = dir.path().join("audit.jsonl");
    let audit = AuditLog::open_with_key(&log, AuditKey::from_bytes([7; 32])).unwrap();
    let mut config = CellsConfig::new(store.clone());
    config.audit = audit.clone();
    let policy = r#"permit (principal, action == Action::"tool_call", resource == Tool::"counted");
permit (principal, action == Action::"tool_call", resource == Tool::"slow");"#;
    let gate = Gate::builder()
        .registry(registry)
        .policy(PolicySet::parse("p.cedar", policy).unwrap())
        .principal(Some(Principal {
            id: "shared-default".into(),
            team: None,
        }))
        .audit(audit)
        .build()
        .unwrap();
    gate.set_principal(
        "s",
        Principal {
            id: "alice".into(),
            team: None,
        },
    );
    let codemode = Codemode::builder()
        .gate(gate.clone())
        .cells(Cells::new(config))
        .build()
        .unwrap();
    let code = r#"// @options: {"yield_after_ms": 200}
await tools.slow({});
await tools.counted({});
return 1;"#;
    let first = codemode
        .start_cell(ScriptRequest::new(code, "s"))
        .await
        .unwrap();
    assert_eq!(first.status, CellStatus::Running, "{}", first.text);
    tokio::time::timeout(Duration::from_secs(10), started.acquire())
        .await
        .expect("the slow call starts within 10 s")
        .unwrap()
        .forget();

    // The session ends while the cell is still finishing.
    gate.forget_session("s");
    release.add_permits(1);
    let last = common::ended_cell(&codemode, "s", &first.cell).await;
    assert_eq!(last.status, CellStatus::Finished, "{}", last.text);
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    let lines: Vec<Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let counted = lines.iter().find(|l| l["tool"] == "counted").unwrap();
    assert_eq!(counted["principal"], "alice", "{counted}");

    // Once the cell is over, nothing of the ended session stays (checked for up to 10 s: the
    // cell's driver lets go just after its result is handed over).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while gate.remembered_sessions() > 0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(gate.remembered_sessions(), 0);
}

/// A cell taken over from a stopped process acts for the principal it recorded; once it ends,
/// this process keeps nothing of its session. That session's client may never come here, so a
/// principal kept for it would stay for the life of the process, one per cell taken over. A
/// session this process already served keeps what it has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_over_cell_acts_for_its_recorded_principal_and_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let store = common::sqlite_store(dir.path()).await;
    let cells = [("cell_a", "sa"), ("cell_b", "sb"), ("cell_k", "known")];
    orphans(&store, &cells, Some(json!({"principal": {"id": "alice"}}))).await;
    let log = dir.path().join("audit.jsonl");
    let (codemode, runs) = taker(&store, &log);
    let gate = codemode.gate().clone();
    let alice = Principal {
        id: "alice".into(),
        team: None,
    };
    gate.set_principal("known", alice.clone());

    let mut resumed = codemode.resume_cells().await.unwrap();
    resumed.sort();
    assert_eq!(resumed, ["cell_a", "cell_b", "cell_k"]);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    for id in ["cell_a", "cell_b", "cell_k"] {
        loop {
            let cell = store.get_cell(id).await.unwrap().unwrap();
            if cell.status.is_terminal() {
                assert_eq!(cell.status, CellStatus::Finished, "{cell:?}");
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{id} did not end");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    let lines: Vec<Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let counted: Vec<&Value> = lines.iter().filter(|l| l["tool"] == "counted").collect();
    assert_eq!(counted.len(), 3, "{lines:?}");
    assert!(
        counted.iter().all(|l| l["principal"] == "alice"),
        "{counted:?}"
    );

    // The drivers let go just after the results are stored.
    while gate.remembered_sessions() > 1 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        gate.remembered_sessions(),
        1,
        "only the session served here is remembered"
    );
    assert_eq!(gate.principal_of("known"), Some(alice));
    assert_eq!(gate.principal_of("sa"), None);
}
