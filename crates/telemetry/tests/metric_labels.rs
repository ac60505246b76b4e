//! Red team: the `tool` label of the call metrics must stay within the tools that exist.
//!
//! A call for a name that does not resolve is refused at the gate's first stage, and its outcome
//! names the tool that was asked for: whatever a client sent as `tools/call`'s `name` under
//! `codemode serve`. Used as a metric label, every made-up name became a series of its own in
//! `codemode.calls`, `codemode.denials` and the duration histogram (twenty-one lines per name in
//! the Prometheus text). A few thousand requests made `/metrics` megabytes long, full of the
//! caller's own text, and filled the SDK's 2,000 series per instrument: the calls of real tools
//! not counted before then were only counted in the `otel_metric_overflow` series, with no tool.

mod common;

use codemode_gate::CallRequest;
use codemode_spec::Provenance;
use codemode_telemetry::UNRESOLVED_TOOL;
use serde_json::json;

const MADE_UP: &str = "made-up-tool-name";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn made_up_tool_names_neither_become_labels_nor_crowd_out_real_tools() {
    let telemetry = common::metrics_only();
    let gate = common::echo_gate(telemetry.metrics().unwrap());

    // What a client can send as `tools/call` names, one request each: more names than the
    // SDK keeps series for.
    for i in 0..2_100 {
        let name = format!("{MADE_UP}-{i}-{}", "x".repeat(150));
        let refused = gate
            .call(CallRequest::new(
                name,
                json!({}),
                Provenance::model(format!("c{i}"), "s1"),
            ))
            .await;
        assert!(refused.is_err(), "a made-up name is refused");
    }
    gate.call(CallRequest::new(
        "echo",
        json!({"a": 1}),
        Provenance::model("real", "s1"),
    ))
    .await
    .expect("echo runs");

    let text = telemetry.prometheus_text().unwrap();
    let shown = |lines: &[&str]| {
        lines
            .iter()
            .take(20)
            .copied()
            .collect::<Vec<_>>()
            .join("\n")
    };
    let echo_counted = text.lines().any(|l| {
        l.starts_with("codemode_calls_total{")
            && l.contains("tool=\"echo\"")
            && l.contains("status=\"ok\"")
    });
    let calls: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("codemode_calls_total{"))
        .collect();
    assert!(
        echo_counted,
        "the real tool's call is not counted under its name:\n{}",
        shown(&calls)
    );
    let leaked: Vec<&str> = text.lines().filter(|l| l.contains(MADE_UP)).collect();
    assert!(
        leaked.is_empty(),
        "{} lines of /metrics carry names a caller made up, /metrics is {} bytes:\n{}",
        leaked.len(),
        text.len(),
        shown(&leaked)
    );
    let refused_counted = text.lines().any(|l| {
        l.starts_with("codemode_denials_total{")
            && l.contains("stage=\"resolve\"")
            && l.contains(&format!("tool=\"{UNRESOLVED_TOOL}\""))
            && l.ends_with(" 2100")
    });
    assert!(
        refused_counted,
        "the refused calls are counted together:\n{}",
        shown(
            &text
                .lines()
                .filter(|l| l.starts_with("codemode_denials_total{"))
                .collect::<Vec<_>>()
        )
    );
    assert!(
        text.len() < 64 * 1024,
        "/metrics grew to {} bytes for one real tool",
        text.len()
    );
}
