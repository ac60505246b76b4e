//! What the telemetry tests share: a tool that answers with its arguments, and a gate that
//! permits it and reports to the metrics.

use std::sync::Arc;

use codemode_gate::{CallObserver, Gate, PolicySet, Registry};
use codemode_spec::{
    CallFacts, Exposure, PreparedCall, Tool, ToolError, ToolOutput, ToolSpec, prepared,
};
use serde_json::{Value, json};

/// Answers every call with its arguments.
pub struct Echo(pub ToolSpec);

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

/// A gate with one direct tool, `echo`, that permits every call and reports to `observer`.
#[allow(dead_code)] // Not every test binary uses it.
pub fn echo_gate(observer: Arc<dyn CallObserver>) -> Gate {
    let registry = Registry::new();
    let mut spec = ToolSpec::new("echo", "returns its arguments", json!({"type": "object"}));
    spec.exposure = Exposure::Direct;
    registry
        .register(Arc::new(Echo(spec)))
        .expect("echo registers");
    Gate::builder()
        .registry(registry)
        .policy(
            PolicySet::parse("t.cedar", "permit(principal, action, resource);").expect("policy"),
        )
        .observer(observer)
        .build()
        .expect("a gate")
}

/// Telemetry with metrics on (Prometheus text, no OTLP export), as `/metrics` serves them.
#[allow(dead_code)] // Not every test binary uses it.
pub fn metrics_only() -> codemode_telemetry::Telemetry {
    codemode_telemetry::Telemetry::start(
        &codemode_telemetry::TelemetryConfig {
            metrics: true,
            ..codemode_telemetry::TelemetryConfig::default()
        },
        None,
    )
    .unwrap()
}
