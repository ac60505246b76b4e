//! What cells cost, on a real SQLite state file, in one run:
//! - a plain `run_script` against `start_cell` for the same short script (the cell's own cost:
//!   its row, the `codemode` call, replay-log writes for each call);
//! - one yield/wait round trip: `start_cell` returning `running` after its yield time (minus
//!   that time), and `wait_cell` with a zero timeout on a running cell;
//! - resuming a cell by replay of 1,000 recorded calls: from `resume_cells` until the rebuilt
//!   cell waits again for the approval it waited for before, against running those 1,000
//!   calls live the first time.
//!
//! `cargo run --release -p codemode-runtime --example cell_costs`

use std::sync::Arc;
use std::time::{Duration, Instant};

use codemode_gate::{AuditLog, Gate, PolicySet, Registry};
use codemode_runtime::{Cells, CellsConfig, Codemode, ScriptRequest, WaitOptions};
use codemode_spec::{CallFacts, PreparedCall, Tool, ToolError, ToolOutput, ToolSpec, prepared};
use codemode_state::{CellStatus, StateStore};
use futures::FutureExt;
use serde_json::{Value, json};

struct Echo(ToolSpec);

impl Tool for Echo {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }
    fn prepare(&self, args: Value) -> Result<Box<dyn PreparedCall>, ToolError> {
        Ok(prepared(CallFacts::default(), move |_| {
            async move {
                if let Some(ms) = args.get("sleep_ms").and_then(Value::as_u64) {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                }
                Ok(ToolOutput::value(args))
            }
            .boxed()
        }))
    }
}

const POLICY: &str = r#"
@id("echo") permit (principal, action == Action::"tool_call", resource == Tool::"echo");
@id("ask") @ask("bench") permit (principal, action == Action::"tool_call", resource == Tool::"danger");
"#;

async fn installation(store: Arc<dyn StateStore>, lease: Duration) -> Codemode {
    let registry = Registry::new();
    for name in ["echo", "danger"] {
        registry
            .register(Arc::new(Echo(ToolSpec::new(
                name,
                "echo",
                json!({"type": "object"}),
            ))))
            .unwrap();
    }
    let mut config = CellsConfig::new(store);
    config.pause_approvals = true;
    config.lease = lease;
    config.yield_after = Duration::from_secs(60);
    config.max_live_per_session = 1_000;
    config.audit = AuditLog::disabled();
    let cells = Cells::new(config);
    let gate = Gate::builder()
        .registry(registry)
        .policy(PolicySet::parse("bench.cedar", POLICY).unwrap())
        .approver(cells.approver(None))
        .build()
        .unwrap();
    Codemode::builder().gate(gate).cells(cells).build().unwrap()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

#[tokio::main]
async fn main() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("state.db").display());
    let store = codemode_state::open(&url, Default::default())
        .await
        .unwrap();
    let lease = Duration::from_millis(300);
    let codemode = installation(store.clone(), lease).await;
    let rounds = 30;

    let quick = "await tools.echo({ a: 1 }); return 1";
    let (mut plain, mut cell) = (Vec::new(), Vec::new());
    for i in 0..rounds {
        let t = Instant::now();
        let run = codemode
            .run_script(ScriptRequest::new(quick, format!("p{i}")))
            .await;
        assert!(!run.is_error, "{}", run.text);
        plain.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        let r = codemode
            .start_cell(ScriptRequest::new(quick, format!("c{i}")))
            .await
            .unwrap();
        assert_eq!(r.status, CellStatus::Finished, "{}", r.text);
        cell.push(t.elapsed().as_secs_f64() * 1e3);
    }
    println!(
        "short script (1 call): run_script {:.2} ms, start_cell {:.2} ms (median of {rounds})",
        median(plain),
        median(cell)
    );

    let yield_ms = 20.0;
    let slow = "// @options: {\"yield_after_ms\": 20}\ntext('x'); await tools.echo({ sleep_ms: 400 }); return 1";
    let (mut to_yield, mut waits) = (Vec::new(), Vec::new());
    for i in 0..rounds {
        let session = format!("y{i}");
        let t = Instant::now();
        let r = codemode
            .start_cell(ScriptRequest::new(slow, session.clone()))
            .await
            .unwrap();
        assert_eq!(r.status, CellStatus::Running, "{}", r.text);
        to_yield.push(t.elapsed().as_secs_f64() * 1e3 - yield_ms);
        let t = Instant::now();
        let w = codemode
            .wait_cell(
                &session,
                &r.cell,
                WaitOptions {
                    timeout: Some(Duration::ZERO),
                    terminate: false,
                },
            )
            .await
            .unwrap();
        waits.push(t.elapsed().as_secs_f64() * 1e3);
        assert_eq!(w.status, CellStatus::Running);
        let done = codemode
            .wait_cell(&session, &r.cell, WaitOptions::default())
            .await
            .unwrap();
        assert_eq!(done.status, CellStatus::Finished, "{}", done.text);
    }
    println!(
        "yield/wait round trip: start_cell to `running` {:.2} ms beyond its {yield_ms} ms yield, wait_cell (timeout 0) {:.3} ms (medians of {rounds})",
        median(to_yield),
        median(waits)
    );

    let calls = 1_000;
    let long = format!(
        "for (let i = 0; i < {calls}; i++) await tools.echo({{ i }});\nawait tools.danger({{}});\nreturn 'done';"
    );
    let t = Instant::now();
    let r = codemode
        .start_cell(ScriptRequest::new(long, "replay"))
        .await
        .unwrap();
    let first = t.elapsed();
    assert_eq!(r.status, CellStatus::WaitingForApproval, "{}", r.text);
    codemode.cells().unwrap().abandon();
    tokio::time::sleep(lease + Duration::from_millis(200)).await;
    let second = installation(store.clone(), lease).await;
    let t = Instant::now();
    let resumed = second.resume_cells().await.unwrap();
    assert_eq!(resumed, vec![r.cell.clone()]);
    let w = second
        .wait_cell(
            "replay",
            &r.cell,
            WaitOptions {
                timeout: Some(Duration::from_secs(120)),
                terminate: false,
            },
        )
        .await
        .unwrap();
    let rebuilt = t.elapsed();
    assert_eq!(w.status, CellStatus::WaitingForApproval, "{}", w.text);
    assert_eq!(second.cell_replayed_calls(&r.cell), Some(calls));
    println!(
        "{calls} calls: first run (live, logged) {:.1} ms; resume by replay {:.1} ms ({:.1} µs a call)",
        first.as_secs_f64() * 1e3,
        rebuilt.as_secs_f64() * 1e3,
        rebuilt.as_secs_f64() * 1e6 / calls as f64
    );
}
