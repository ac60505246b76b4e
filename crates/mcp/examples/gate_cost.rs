//! The gate's own cost per call: `Gate::call` on a tool that answers at once, so nothing but
//! the gate (resolve, validate, prepare, policy, outcome, and with `audit` the keyed audit log)
//! is timed. A profiling aid for the MCP benchmark (issue 13).
//!
//! `cargo run --release -p codemode-mcp --example gate_cost [-- CALLS [audit]]`

use std::sync::Arc;
use std::time::Instant;

use codemode_gate::{AuditKey, AuditLog, CallRequest, Gate, PolicySet, Registry};
use codemode_spec::{
    CallFacts, Origin, PreparedCall, Provenance, Tool, ToolError, ToolOutput, ToolSpec, prepared,
};
use serde_json::{Value, json};

const NAME: &str = "mcp__everything__echo";

/// Answers every call with what server-everything's `echo` would return.
struct AtOnce(ToolSpec);

impl Tool for AtOnce {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }

    fn prepare(&self, _args: Value) -> Result<Box<dyn PreparedCall>, ToolError> {
        Ok(prepared(CallFacts::default(), |_| {
            Box::pin(async {
                Ok(ToolOutput {
                    value: json!({"content": [{"type": "text", "text": "Echo: hi"}]}),
                    ..Default::default()
                })
            })
        }))
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let n: usize = match args.next() {
        Some(s) => s
            .parse()
            .map_err(|_| format!("not a count of calls: {s:?}"))?,
        None => 20_000,
    };
    let audit = args.next().as_deref() == Some("audit");
    let mut spec = ToolSpec::new(
        NAME,
        "echo",
        json!({"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}),
    );
    spec.namespace = Some("mcp__everything".into());
    let registry = Registry::new();
    registry.register(Arc::new(AtOnce(spec)))?;
    let policy = PolicySet::parse(
        "bench.cedar",
        r#"permit(principal, action == Action::"tool_call", resource);"#,
    )?;
    let mut builder = Gate::builder().registry(registry).policy(policy);
    let dir = tempfile::tempdir()?;
    if audit {
        let log = AuditLog::open_with_key(dir.path().join("audit.jsonl"), AuditKey::generate()?)?;
        builder = builder.audit(log);
    }
    let gate = builder.build()?;
    let start = Instant::now();
    for i in 0..n {
        let provenance = Provenance {
            origin: Origin::Script,
            depth: 1,
            script_id: Some("bench".into()),
            seq: Some(i as u64 + 1),
            ..Provenance::model(format!("bench/{i}"), "bench")
        };
        let message = json!({"message": format!("m{i}")});
        gate.call(CallRequest::new(NAME, message, provenance))
            .await?;
    }
    let per_call = start.elapsed().as_secs_f64() * 1e6 / n as f64;
    let with = if audit { "with" } else { "without" };
    println!("{per_call:.1} µs per gated call ({with} an audit log, {n} calls)");
    Ok(())
}
