//! Call metrics, fed by the gate's outcome of every call.

use std::sync::{Arc, Mutex};

use codemode_gate::{CallObserver, CallOutcome, Status};
use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Histogram, Meter, MeterProvider as _};
use opentelemetry_sdk::metrics::SdkMeterProvider;

/// How an upstream MCP server is doing, for the `codemode.upstream.up` gauge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamState {
    pub server: String,
    /// 1 connected, 0 starting or retrying.
    pub up: bool,
}

type Source<T> = Arc<Mutex<Option<Box<dyn Fn() -> T + Send + Sync>>>>;

/// Where the gauges read from; set by the front end (`serve`) once it has sessions and
/// upstream servers.
#[derive(Clone, Default)]
pub struct Gauges {
    sessions: Source<u64>,
    upstreams: Source<Vec<UpstreamState>>,
}

impl Gauges {
    pub fn sessions(&self, f: impl Fn() -> u64 + Send + Sync + 'static) {
        *self.sessions.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(f));
    }

    pub fn upstreams(&self, f: impl Fn() -> Vec<UpstreamState> + Send + Sync + 'static) {
        *self.upstreams.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(f));
    }
}

/// The `tool` label of a call whose name did not resolve to a registered tool (its span's name
/// too).
pub use codemode_gate::UNRESOLVED_TOOL;

/// The instruments. Attributes are bounded sets (tool names of the registry, statuses,
/// stages), never arguments.
pub struct Metrics {
    calls: Counter<u64>,
    denials: Counter<u64>,
    duration: Histogram<f64>,
    tokens: Counter<u64>,
    cost: Counter<f64>,
    bytes: Counter<u64>,
    pub gauges: Gauges,
}

impl Metrics {
    pub(crate) fn new(provider: &SdkMeterProvider) -> Self {
        let meter: Meter = provider.meter("codemode");
        let gauges = Gauges::default();
        let sessions = gauges.sessions.clone();
        meter
            .u64_observable_gauge("codemode.sessions.active")
            .with_description("Client sessions this replica holds")
            .with_callback(move |o| {
                if let Some(f) = sessions.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
                    o.observe(f(), &[]);
                }
            })
            .build();
        let upstreams = gauges.upstreams.clone();
        meter
            .u64_observable_gauge("codemode.upstream.up")
            .with_description(
                "1 when the upstream MCP server is connected, 0 while it starts or is retried",
            )
            .with_callback(move |o| {
                if let Some(f) = upstreams.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
                    for s in f() {
                        o.observe(u64::from(s.up), &[KeyValue::new("server", s.server)]);
                    }
                }
            })
            .build();
        Metrics {
            calls: meter
                .u64_counter("codemode.calls")
                .with_description("Calls that reached the gate, by tool, status and decision")
                .build(),
            denials: meter
                .u64_counter("codemode.denials")
                .with_description("Calls the gate refused, by tool and the stage that refused")
                .build(),
            duration: meter
                .f64_histogram("codemode.call.duration")
                .with_unit("ms")
                .with_description("Time from admission to outcome")
                .with_boundaries(vec![
                    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0,
                    2500.0, 5000.0, 10000.0, 30000.0, 60000.0,
                ])
                .build(),
            tokens: meter
                .u64_counter("codemode.budget.tokens")
                .with_description("Model tokens spent")
                .build(),
            cost: meter
                .f64_counter("codemode.budget.cost")
                .with_unit("USD")
                .with_description("Model cost spent")
                .build(),
            bytes: meter
                .u64_counter("codemode.budget.bytes")
                .with_unit("By")
                .with_description("Bytes of results returned to callers")
                .build(),
            gauges,
        }
    }
}

impl CallObserver for Metrics {
    fn finished(&self, o: &CallOutcome) {
        let tool = KeyValue::new("tool", tool_label(o));
        let status = KeyValue::new("status", o.status.as_str());
        self.calls.add(
            1,
            &[
                tool.clone(),
                status.clone(),
                KeyValue::new("decision", o.decision.clone()),
            ],
        );
        if o.status == Status::Denied {
            let stage = o.stage.map(|s| s.as_str()).unwrap_or("none");
            self.denials
                .add(1, &[tool.clone(), KeyValue::new("stage", stage)]);
        }
        self.duration
            .record(o.duration_ms as f64, &[tool.clone(), status]);
        if let Some(u) = &o.usage {
            self.tokens
                .add(u.total_tokens(), std::slice::from_ref(&tool));
            if u.cost_usd.is_finite() && u.cost_usd > 0.0 {
                self.cost.add(u.cost_usd, std::slice::from_ref(&tool));
            }
        }
        if o.bytes > 0 {
            self.bytes.add(o.bytes, &[tool]);
        }
    }
}

/// The call's tool, when the gate found it in the registry. A name that did not resolve is
/// whatever the caller asked for (a client's `tools/call` name): as a label, every made-up name
/// would be a series of its own, and enough of them would fill the SDK's series limit and push
/// real tools into its overflow series.
fn tool_label(o: &CallOutcome) -> String {
    match o.kind {
        Some(_) => o.tool.clone(),
        None => UNRESOLVED_TOOL.to_string(),
    }
}

/// An observer the gate can be built with before the settings say whether metrics are on;
/// [`MetricsSlot::fill`] connects it once they are.
#[derive(Clone, Default)]
pub struct MetricsSlot(Arc<std::sync::OnceLock<Arc<Metrics>>>);

impl MetricsSlot {
    pub fn fill(&self, metrics: Arc<Metrics>) {
        let _ = self.0.set(metrics);
    }
}

impl CallObserver for MetricsSlot {
    fn finished(&self, outcome: &CallOutcome) {
        if let Some(m) = self.0.get() {
            m.finished(outcome);
        }
    }
}
