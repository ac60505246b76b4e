//! A script's call results count against what the script may hold from when the tool returns
//! them, not only once they reach the sandbox. Red team: a script started 1,000 calls to an MCP
//! tool answering 1 MiB each and computed meanwhile; the results waited on their way (for the
//! audit line, for the sandbox's thread to take them) uncounted, and the host reached 2.7 GB
//! against a 256 MiB heap limit, with no answer dropped.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use codemode_gate::{AfterDecision, AuditLog, Gate, Hook, HookEvent, PolicySet, Registry};
use codemode_runtime::{Codemode, ScriptRequest};
use codemode_spec::{
    BoxFuture, CallFacts, Exposure, PreparedCall, Tool, ToolError, ToolOutput, ToolSpec, prepared,
};
use futures::FutureExt;
use serde_json::{Value, json};

const CALLS: usize = 48;

/// Answers 2 MiB of text.
struct Big(ToolSpec);

impl Tool for Big {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }
    fn prepare(&self, _args: Value) -> Result<Box<dyn PreparedCall>, ToolError> {
        Ok(prepared(CallFacts::default(), |_| {
            async { Ok(ToolOutput::value(json!("x".repeat(2 << 20)))) }.boxed()
        }))
    }
}

/// Holds every result until the test lets them go: results on their way, as a slow hook, a
/// slow audit log or a busy sandbox thread would hold them.
struct Holding {
    entered: AtomicUsize,
    release: tokio::sync::Semaphore,
}

impl Hook for Holding {
    fn after<'a>(
        &'a self,
        _ev: &'a HookEvent,
        _out: &'a ToolOutput,
    ) -> BoxFuture<'a, AfterDecision> {
        async move {
            self.entered.fetch_add(1, Ordering::SeqCst);
            let _ = self.release.acquire().await.map(|p| p.forget());
            AfterDecision::Keep
        }
        .boxed()
    }
}

fn audit_lines(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .filter(|l: &Value| l["tool"] == "big")
        .collect()
}

fn dropped_on_record(line: &Value) -> bool {
    line["status"] == "error"
        && line["message"]
            .as_str()
            .is_some_and(|e| e.starts_with("The call ran, but its answer"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_held_on_their_way_are_bounded_and_the_rest_dropped_on_record() {
    let registry = Registry::new();
    let mut spec = ToolSpec::new("big", "2 MiB of text", json!({"type": "object"}));
    spec.exposure = Exposure::Codemode;
    registry.register(Arc::new(Big(spec))).unwrap();
    let holding = Arc::new(Holding {
        entered: AtomicUsize::new(0),
        release: tokio::sync::Semaphore::new(0),
    });
    let audit = tempfile::NamedTempFile::new().unwrap().into_temp_path();
    let gate = Gate::builder()
        .registry(registry)
        .policy(PolicySet::parse("p.cedar", common::PERMIT_ALL).unwrap())
        .hook(holding.clone())
        .audit(AuditLog::open_with_key(&audit, common::test_key()).unwrap())
        .build()
        .unwrap();
    let mut sandbox = codemode_sandbox::SandboxConfig::default();
    // Answers may wait up to 64 MiB for this script (the least, whatever its heap).
    sandbox.defaults.heap_bytes = 32 << 20;
    let codemode = Codemode::builder()
        .gate(gate)
        .sandbox_config(sandbox)
        .build()
        .unwrap();
    let code = format!(
        r#"
const settled = await Promise.all(Array.from({{ length: {CALLS} }}, () => tools.big({{}}).then(
  (v) => (v.length === 2097152 ? "ok" : "short"),
  (e) => (e.message.startsWith("The call ran, but its answer") ? "dropped" : e.message),
)));
const seen = {{}};
for (const r of settled) seen[r] = (seen[r] || 0) + 1;
return seen;"#
    );
    let run = tokio::spawn(async move { codemode.run_script(ScriptRequest::new(code, "s")).await });
    // Every call has either reached the holding hook or been dropped on record.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let held = holding.entered.load(Ordering::SeqCst);
        let dropped = audit_lines(&audit)
            .iter()
            .filter(|l| dropped_on_record(l))
            .count();
        if held + dropped == CALLS {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{held} results held and {dropped} dropped of {CALLS}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let held = holding.entered.load(Ordering::SeqCst);
    // Fewer than the gate's 64 hooks at once, so hooks do not bound them.
    assert!(
        held <= 32,
        "{held} results of 2 MiB held on their way, past 64 MiB"
    );
    holding.release.add_permits(CALLS);
    let run = run.await.unwrap();
    assert!(!run.is_error, "{}", run.text);
    let seen = run
        .result
        .as_ref()
        .and_then(|r| r.value.clone())
        .unwrap_or_default();
    let count = |k: &str| seen.get(k).and_then(Value::as_u64).unwrap_or(0) as usize;
    assert_eq!(count("ok"), held, "{seen}");
    assert_eq!(count("dropped"), CALLS - held, "{seen}");
    // Every call ran and has its one outcome line.
    let outcomes = audit_lines(&audit);
    assert_eq!(outcomes.len(), CALLS);
    assert_eq!(
        outcomes.iter().filter(|l| dropped_on_record(l)).count(),
        CALLS - held
    );
}
