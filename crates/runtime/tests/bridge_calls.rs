//! How the host bridge runs a gated call: its first poll on the thread that read it, inside the
//! embedder's runtime, and the rest (if any) on that runtime. Attacks on the shortcut: a tool
//! that spawns a task which outlives the call (it must land on the embedder's runtime, which
//! keeps running after the script, not on the sandbox's thread, which stops polling), a tool that
//! waits on a timer (its first poll is pending, the rest runs elsewhere), a denied call (decided
//! at once), and a burst of both kinds: every call still passes the gate and is in the audit log.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use codemode_gate::{AuditLog, Gate, PolicySet, Registry};
use codemode_runtime::{Codemode, ScriptRequest};
use codemode_spec::{
    CallFacts, CallKind, Exposure, PreparedCall, Tool, ToolError, ToolOutput, ToolSpec, prepared,
};
use common::*;
use futures::FutureExt;
use serde_json::{Value, json};

/// Spawns a task that counts after 50 ms, long after the call returned, and answers at once.
struct Spawner {
    spec: ToolSpec,
    done: Arc<AtomicUsize>,
}

impl Tool for Spawner {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }
    fn prepare(&self, _args: Value) -> Result<Box<dyn PreparedCall>, ToolError> {
        let done = self.done.clone();
        Ok(prepared(CallFacts::default(), move |_| {
            async move {
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    done.fetch_add(1, Ordering::SeqCst);
                });
                Ok(ToolOutput::value(json!({ "spawned": true })))
            }
            .boxed()
        }))
    }
}

/// Answers after a timer: its first poll is pending.
struct Timer(ToolSpec);

impl Tool for Timer {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }
    fn prepare(&self, args: Value) -> Result<Box<dyn PreparedCall>, ToolError> {
        Ok(prepared(CallFacts::default(), move |_| {
            async move {
                tokio::time::sleep(Duration::from_millis(5)).await;
                Ok(ToolOutput::value(args))
            }
            .boxed()
        }))
    }
}

fn spec(name: &str) -> ToolSpec {
    let mut spec = ToolSpec::new(name, format!("Test tool {name}"), json!({"type": "object"}));
    spec.kind = CallKind::Tool;
    spec.exposure = Exposure::Codemode;
    spec
}

const POLICY: &str = "@id(\"everything\")\npermit (principal, action, resource);\n@id(\"no-forbidden\")\nforbid (principal, action == Action::\"tool_call\", resource == Tool::\"forbidden\");\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_finished_at_once_and_calls_that_wait_both_pass_the_gate_and_keep_their_tasks() {
    let done = Arc::new(AtomicUsize::new(0));
    let registry = Registry::new();
    registry
        .register(Arc::new(Spawner {
            spec: spec("spawner"),
            done: done.clone(),
        }))
        .unwrap();
    registry.register(Arc::new(Timer(spec("timer")))).unwrap();
    registry
        .register(Echo::tool("echo", CallKind::Tool, Exposure::Codemode))
        .unwrap();
    registry
        .register(Echo::tool("forbidden", CallKind::Tool, Exposure::Codemode))
        .unwrap();
    let audit = tempfile::NamedTempFile::new().unwrap().into_temp_path();
    let gate = Gate::builder()
        .registry(registry)
        .policy(PolicySet::parse("test.cedar", POLICY).unwrap())
        .audit(AuditLog::open_with_key(&audit, test_key()).unwrap())
        .build()
        .unwrap();
    let codemode = Codemode::builder().gate(gate).build().unwrap();
    let run = codemode
        .run_script(ScriptRequest::new(
            r#"let s = 0;
            for (let i = 0; i < 50; i++) s += (await tools.echo({ i })).i;
            const spawned = await tools.spawner({});
            const timed = await tools.timer({ t: 1 });
            const burst = await Promise.all([1, 2, 3].map((i) => tools.timer({ t: i })));
            let denied = null;
            try { await tools.forbidden({}); } catch (e) { denied = e.message; }
            return { s, spawned: spawned.spawned, timed: timed.t, burst: burst.map((b) => b.t), denied: denied !== null }"#,
            "s1",
        ))
        .await;
    assert!(!run.is_error, "{}", run.text);
    assert!(
        run.text
            .contains(r#"{"s":1225,"spawned":true,"timed":1,"burst":[1,2,3],"denied":true}"#),
        "{}",
        run.text
    );
    // The task the tool spawned runs on after the script: it was not left on the sandbox's
    // thread, which stops polling between scripts.
    let mut waited = 0;
    while done.load(Ordering::SeqCst) == 0 && waited < 200 {
        tokio::time::sleep(Duration::from_millis(25)).await;
        waited += 1;
    }
    assert_eq!(done.load(Ordering::SeqCst), 1, "the spawned task never ran");
    // Every call is in the audit log: 50 echoes, the spawner, 4 timers, the denial, the script.
    let lines: Vec<Value> = std::fs::read_to_string(&audit)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let count = |tool: &str| lines.iter().filter(|l| l["tool"] == tool).count();
    assert_eq!(count("echo"), 50, "{lines:?}");
    assert_eq!(count("spawner"), 1);
    assert_eq!(count("timer"), 4);
    assert_eq!(count("forbidden"), 1);
    assert_eq!(count("codemode"), 1);
    assert_eq!(lines.len(), 57);
}
