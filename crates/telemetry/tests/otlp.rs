//! Traces and metrics checked where they arrive: a real OTLP/HTTP receiver in the test decodes
//! the protobuf exports, so what is asserted is what a collector would get.

mod common;

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use codemode_gate::{CallRequest, Gate, PolicySet, Registry};
use codemode_spec::{Exposure, Origin, Provenance, ToolOutput, ToolSpec};
use codemode_telemetry::{Telemetry, TelemetryConfig, UpstreamState};
use common::Echo;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::json;

#[derive(Default)]
struct Received {
    spans: Vec<Span>,
    metric_names: Vec<String>,
}

async fn traces(State(r): State<Arc<Mutex<Received>>>, body: Bytes) -> &'static str {
    let req = ExportTraceServiceRequest::decode(body).expect("an OTLP trace export");
    let mut r = r.lock().unwrap();
    for rs in req.resource_spans {
        for ss in rs.scope_spans {
            r.spans.extend(ss.spans);
        }
    }
    ""
}

async fn metrics(State(r): State<Arc<Mutex<Received>>>, body: Bytes) -> &'static str {
    let req = ExportMetricsServiceRequest::decode(body).expect("an OTLP metrics export");
    let mut r = r.lock().unwrap();
    for rm in req.resource_metrics {
        for sm in rm.scope_metrics {
            r.metric_names
                .extend(sm.metrics.into_iter().map(|m| m.name));
        }
    }
    ""
}

fn attr<'a>(span: &'a Span, key: &str) -> Option<&'a any_value::Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v: &AnyValue| v.value.as_ref())
}

fn text(span: &Span, key: &str) -> String {
    match attr(span, key) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        other => format!("{other:?}"),
    }
}

fn spec(name: &str, exposure: Exposure) -> ToolSpec {
    let mut s = ToolSpec::new(name, "test", json!({"type": "object"}));
    s.exposure = exposure;
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_and_its_nested_calls_arrive_as_parent_and_children_without_arguments() {
    let received = Arc::new(Mutex::new(Received::default()));
    let app = axum::Router::new()
        .route("/v1/traces", post(traces))
        .route("/v1/metrics", post(metrics))
        .with_state(received.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });

    let switch = codemode_telemetry::install(tracing_subscriber_filter(), false);
    let telemetry = Telemetry::start(
        &TelemetryConfig {
            otlp_endpoint: Some(format!("http://{addr}")),
            metrics: true,
            ..TelemetryConfig::default()
        },
        Some(&switch),
    )
    .unwrap();
    let metrics = telemetry.metrics().unwrap();
    metrics.gauges.sessions(|| 3);
    metrics.gauges.upstreams(|| {
        vec![UpstreamState {
            server: "everything".into(),
            up: true,
        }]
    });

    let registry = Registry::new();
    registry
        .register(Arc::new(Echo(spec("outer", Exposure::Direct))))
        .unwrap();
    registry
        .register(Arc::new(Echo(spec("echo", Exposure::Codemode))))
        .unwrap();
    registry
        .register(Arc::new(Echo(spec("bad", Exposure::Codemode))))
        .unwrap();
    let policy = PolicySet::parse(
        "t.cedar",
        "@id(\"all\") permit(principal, action, resource);\n@id(\"no-bad\") forbid(principal, action, resource == Tool::\"bad\");",
    )
    .unwrap();
    let gate = Gate::builder()
        .registry(registry)
        .policy(policy)
        .observer(metrics)
        .build()
        .unwrap();

    let outer = gate
        .admit(CallRequest::new(
            "outer",
            json!({"secret": "hunter2-outer"}),
            Provenance::model("outer-1", "s1"),
        ))
        .await
        .unwrap();
    let nested = |name: &str, n: u64| {
        let mut p = Provenance::model(format!("outer-1/{n}"), "s1");
        p.parent_call_id = Some("outer-1".into());
        p.origin = Origin::Script;
        p.depth = 1;
        p.script_id = Some("script-1".into());
        CallRequest::new(name, json!({"secret": "hunter2-nested"}), p)
    };
    // Nested calls on other tasks, as a script's calls are: the parent comes from provenance.
    let g = gate.clone();
    let a = tokio::spawn(async move { g.call(nested("echo", 1)).await });
    let g = gate.clone();
    let b = tokio::spawn(async move { g.call(nested("bad", 2)).await });
    // A name that resolves to no tool: a client may send any text as a call's name.
    let g = gate.clone();
    let c = tokio::spawn(async move { g.call(nested("made-up-name-17", 3)).await });
    a.await.unwrap().unwrap();
    assert!(b.await.unwrap().is_err());
    assert!(c.await.unwrap().is_err());
    outer
        .finish(Ok(ToolOutput::value(json!("done"))))
        .await
        .unwrap();

    let prom = telemetry.prometheus_text().unwrap();
    assert!(prom.contains("codemode_calls_total"), "{prom}");
    assert!(prom.contains("codemode_denials_total"), "{prom}");
    assert!(prom.contains("codemode_sessions_active"), "{prom}");
    assert!(!prom.contains("hunter2"), "{prom}");
    tokio::task::spawn_blocking(move || telemetry.shutdown())
        .await
        .unwrap();

    let r = received.lock().unwrap();
    let by_name = |n: &str| {
        r.spans.iter().find(|s| s.name == n).unwrap_or_else(|| {
            panic!(
                "no span `{n}` among {:?}",
                r.spans.iter().map(|s| &s.name).collect::<Vec<_>>()
            )
        })
    };
    let (outer, echo, bad) = (by_name("outer"), by_name("echo"), by_name("bad"));
    for child in [echo, bad] {
        assert_eq!(
            child.parent_span_id, outer.span_id,
            "{} is the outer call's child",
            child.name
        );
        assert_eq!(child.trace_id, outer.trace_id);
    }
    assert_eq!(text(echo, "codemode.decision"), "allow");
    assert_eq!(text(echo, "codemode.status"), "ok");
    assert_eq!(text(bad, "codemode.decision"), "deny");
    assert_eq!(text(bad, "codemode.status"), "denied");
    assert_eq!(text(bad, "codemode.policy_ids"), "no-bad");
    assert_eq!(text(bad, "codemode.stage"), "policy");
    assert!(attr(echo, "codemode.duration_ms").is_some());
    assert_eq!(text(outer, "codemode.call_id"), "outer-1");
    // Span names stay a small set (trace backends index them): the caller's text is not one.
    let unresolved = by_name(codemode_telemetry::UNRESOLVED_TOOL);
    assert_eq!(text(unresolved, "codemode.stage"), "resolve");
    assert!(
        r.spans.iter().all(|s| !s.name.contains("made-up")),
        "{:?}",
        r.spans.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    for s in &r.spans {
        for kv in &s.attributes {
            let shown = format!("{:?}", kv.value);
            assert!(
                !shown.contains("hunter2"),
                "arguments leaked into span {}: {shown}",
                s.name
            );
        }
    }
    for m in [
        "codemode.calls",
        "codemode.denials",
        "codemode.call.duration",
        "codemode.upstream.up",
    ] {
        assert!(
            r.metric_names.iter().any(|n| n == m),
            "{m} not exported: {:?}",
            r.metric_names
        );
    }
}

fn tracing_subscriber_filter() -> tracing_subscriber::EnvFilter {
    tracing_subscriber::EnvFilter::new("warn")
}
