//! What the gate costs per call, with and without the keyed audit log, in one run:
//! `cargo run --release -p codemode-gate --example gate_overhead`. With the log, a tool that
//! can change something costs a journal line and an outcome line; a read-only one, the outcome
//! line only.

use std::sync::Arc;
use std::time::Instant;

use codemode_gate::{AuditKey, AuditLog, CallRequest, Gate, PolicySet, Registry};
use codemode_spec::{
    CallFacts, Origin, PreparedCall, Provenance, Tool, ToolError, ToolOutput, ToolSpec, prepared,
};
use serde_json::{Value, json};

struct Echo(ToolSpec);

impl Tool for Echo {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }
    fn prepare(&self, args: Value) -> Result<Box<dyn PreparedCall>, ToolError> {
        Ok(prepared(CallFacts::default(), move |_| {
            Box::pin(async move { Ok(ToolOutput::value(args)) })
        }))
    }
}

const CALLS: usize = 5000;

async fn per_call_us(gate: &Gate) -> f64 {
    per_call_us_of(gate, "echo").await
}

async fn per_call_us_of(gate: &Gate, tool: &str) -> f64 {
    let started = Instant::now();
    for i in 0..CALLS {
        let mut p = Provenance::model(format!("c{i}"), "bench");
        p.origin = Origin::Script;
        p.script_id = Some("bench".into());
        gate.call(CallRequest::new(tool, json!({"i": i}), p))
            .await
            .expect("the call is permitted");
    }
    started.elapsed().as_secs_f64() * 1e6 / CALLS as f64
}

fn gate(audit: AuditLog) -> Gate {
    let registry = Registry::new();
    let _ = registry.register(Arc::new(Echo(ToolSpec::new("echo", "", json!({})))));
    let mut read_only = ToolSpec::new("echo_ro", "", json!({}));
    read_only.annotations.read_only_hint = Some(true);
    let _ = registry.register(Arc::new(Echo(read_only)));
    Gate::builder()
        .registry(registry)
        .policy(PolicySet::parse("p", "permit(principal, action, resource);").expect("valid"))
        .audit(audit)
        .build()
        .expect("the gate builds")
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let key = AuditKey::from_bytes([1; 32]);
    let plain = gate(AuditLog::disabled());
    let logged = gate(AuditLog::open_with_key(dir.path().join("audit.jsonl"), key).expect("log"));
    per_call_us(&plain).await; // warm up
    let without = per_call_us(&plain).await;
    let with = per_call_us(&logged).await;
    let read_only = per_call_us_of(&logged, "echo_ro").await;
    println!(
        "gate call without audit: {without:.1} µs; with the keyed, locked audit log: {with:.1} µs ({:.1}x; journal and outcome line), read-only {read_only:.1} µs ({:.1}x; outcome line only)",
        with / without,
        read_only / without
    );
}
