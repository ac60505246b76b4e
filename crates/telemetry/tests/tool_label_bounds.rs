//! Red team: one upstream MCP server must not be able to starve the others' metrics.
//!
//! An upstream server chooses its tools' names (up to 5,000 of them, renamed at will with
//! `list_changed`), and every registered name used to be a `tool` label value. A server listing
//! 2,500 tools and a script calling each once filled `codemode.calls` to the SDK's 2,000 series:
//! every later call of every other tool, `codemode` itself included, was only counted in the
//! `otel_metric_overflow` series, without tool, status or decision, until a restart.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;

use codemode_gate::{CallRequest, Gate, PolicySet, Registry};
use codemode_spec::{Exposure, Provenance, ToolSpec};
use codemode_telemetry::{TOOL_LABELS_PER_NAMESPACE, Telemetry};
use common::Echo;
use serde_json::json;

const HOSTILE: &str = "mcp__hostile";
const HOSTILE_TOOLS: usize = 3_000;
const OTHER_TOOL: &str = "mcp__other__lookup";

fn tool(name: &str, namespace: Option<&str>) -> Arc<Echo> {
    let mut spec = ToolSpec::new(name, "returns its arguments", json!({"type": "object"}));
    spec.namespace = namespace.map(str::to_string);
    spec.exposure = Exposure::Direct;
    Arc::new(Echo(spec))
}

fn gate(telemetry: &Telemetry) -> Gate {
    let registry = Registry::new();
    for i in 0..HOSTILE_TOOLS {
        registry
            .register(tool(&format!("{HOSTILE}__t{i}"), Some(HOSTILE)))
            .expect("a hostile tool registers");
    }
    for (name, namespace) in [
        ("codemode", None),
        ("read", None),
        (OTHER_TOOL, Some("mcp__other")),
    ] {
        registry
            .register(tool(name, namespace))
            .expect("a tool registers");
    }
    let policy = format!(
        "@id(\"all\") permit(principal, action, resource);\n\
         @id(\"no-lookup\") forbid(principal, action, resource == Tool::\"{OTHER_TOOL}\");"
    );
    Gate::builder()
        .registry(registry)
        .policy(PolicySet::parse("t.cedar", &policy).expect("policy"))
        .observer(telemetry.metrics().unwrap())
        .build()
        .expect("a gate")
}

/// The value of `label` in one Prometheus text line, if it has one.
fn label<'a>(line: &'a str, label: &str) -> Option<&'a str> {
    let start = line.find(&format!("{label}=\""))? + label.len() + 2;
    let len = line[start..].find('"')?;
    Some(&line[start..start + len])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_namespace_with_thousands_of_tools_does_not_starve_the_others() {
    let telemetry = common::metrics_only();
    let gate = gate(&telemetry);

    // The hostile server's script calls each of its tools once.
    for i in 0..HOSTILE_TOOLS {
        gate.call(CallRequest::new(
            format!("{HOSTILE}__t{i}"),
            json!({}),
            Provenance::model(format!("h{i}"), "s1"),
        ))
        .await
        .expect("a hostile tool runs");
    }
    // Then the tools everyone else relies on.
    for name in ["codemode", "read"] {
        gate.call(CallRequest::new(
            name,
            json!({}),
            Provenance::model(format!("own-{name}"), "s1"),
        ))
        .await
        .expect("a trusted tool runs");
    }
    let denied = gate
        .call(CallRequest::new(
            OTHER_TOOL,
            json!({}),
            Provenance::model("other", "s1"),
        ))
        .await;
    assert!(denied.is_err(), "the policy refuses {OTHER_TOOL}");

    let text = telemetry.prometheus_text().unwrap();
    let lines = |prefix: &str| -> Vec<&str> {
        text.lines()
            .filter(|l| l.starts_with(prefix))
            .collect::<Vec<_>>()
    };
    let shown = |ls: &[&str]| ls.iter().take(20).copied().collect::<Vec<_>>().join("\n");
    let calls = lines("codemode_calls_total{");
    let has = |ls: &[&str], labels: &[(&str, &str)]| {
        ls.iter()
            .any(|l| labels.iter().all(|(k, v)| label(l, k) == Some(v)))
    };

    let overflow: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("otel_metric_overflow"))
        .collect();
    assert!(
        overflow.is_empty(),
        "series overflowed the SDK's limit:\n{}",
        shown(&overflow)
    );
    for name in ["codemode", "read"] {
        assert!(
            has(
                &calls,
                &[("tool", name), ("status", "ok"), ("decision", "allow")]
            ),
            "`{name}` is not counted under its own name:\n{}",
            shown(&calls)
        );
        assert!(
            has(
                &lines("codemode_call_duration_milliseconds_count{"),
                &[("tool", name), ("status", "ok")]
            ),
            "`{name}` has no latency of its own"
        );
    }
    assert!(
        has(
            &calls,
            &[
                ("tool", OTHER_TOOL),
                ("status", "denied"),
                ("decision", "deny")
            ]
        ),
        "the other server's refused call is not counted under its own name:\n{}",
        shown(&calls)
    );
    let denials = lines("codemode_denials_total{");
    assert!(
        has(&denials, &[("tool", OTHER_TOOL), ("stage", "policy")]),
        "the other server's refusal is not counted by stage:\n{}",
        shown(&denials)
    );

    // The hostile namespace costs at most its share of label values, in every instrument.
    let hostile: BTreeSet<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| label(l, "tool"))
        .filter(|t| t.starts_with(HOSTILE))
        .collect();
    assert!(
        hostile.len() <= TOOL_LABELS_PER_NAMESPACE + 1,
        "{} tool label values for one namespace",
        hostile.len()
    );
    // And every one of its calls is still counted.
    let hostile_calls: u64 = calls
        .iter()
        .filter(|l| label(l, "tool").is_some_and(|t| t.starts_with(HOSTILE)))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(hostile_calls, HOSTILE_TOOLS as u64);
}
