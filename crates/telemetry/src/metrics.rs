//! Call metrics, fed by the gate's outcome of every call.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use codemode_gate::{CallObserver, CallOutcome, Status};
use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Histogram, Meter, MeterProvider as _};
use opentelemetry_sdk::metrics::{Instrument, SdkMeterProvider, Stream};

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

/// The instruments. Attributes are bounded sets, never arguments: the `tool` label as
/// [`ToolLabels`] bounds it (not every registered name: an upstream server names its own tools),
/// statuses, decisions, stages. Each instrument's series limit is raised to what those sets can
/// make ([`series_limits`]), so no series ever lands in the SDK's overflow series.
pub struct Metrics {
    tool_labels: ToolLabels,
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
            tool_labels: ToolLabels::new(LabelLimits::DEFAULT),
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
        let tool = KeyValue::new("tool", self.tool_labels.label(o));
        let status = KeyValue::new("status", o.status.as_str());
        // Attributes in key order: the SDK keeps one copy of a series' attributes instead of
        // two (as given and sorted).
        self.calls.add(
            1,
            &[
                KeyValue::new("decision", decision_label(&o.decision)),
                status.clone(),
                tool.clone(),
            ],
        );
        if o.status == Status::Denied {
            let stage = o.stage.map(|s| s.as_str()).unwrap_or("none");
            self.denials
                .add(1, &[KeyValue::new("stage", stage), tool.clone()]);
        }
        self.duration
            .record(o.duration_ms as f64, &[status, tool.clone()]);
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

/// Most `tool` label values one namespace (one upstream MCP server, `models`) gets: its first
/// this many distinct tools called keep their names, the rest are counted together as
/// `<namespace>__(other)`. So one server, however many tools it lists or however often it
/// renames them, costs at most this many + 1 label values and cannot crowd out the others.
pub const TOOL_LABELS_PER_NAMESPACE: usize = 50;

/// Most own-name `tool` label values of namespaced tools, all namespaces together; past it,
/// every namespace's new tools are counted as `<namespace>__(other)`.
pub const NAMESPACED_TOOL_LABELS: usize = 1_000;

/// The label of tools counted together when no `<namespace>__(other)` label is left.
pub const OTHER_TOOL: &str = "(other)";

/// How many label values each source of `tool` labels may use ([`ToolLabels`]).
#[derive(Debug, Clone, Copy)]
struct LabelLimits {
    /// Own names per namespace.
    per_namespace: usize,
    /// Own names of namespaced tools, in all.
    namespaced: usize,
    /// Namespaces with a `<namespace>__(other)` label; past it, [`OTHER_TOOL`]. Namespaces are
    /// the operator's (one per configured MCP server, `models`), so this is a backstop.
    other_namespaces: usize,
    /// Own names of tools without a namespace (built-ins, `codemode`, the embedding program's):
    /// codemode's code registers them, never an upstream, so this too is a backstop.
    unnamespaced: usize,
}

impl LabelLimits {
    const DEFAULT: LabelLimits = LabelLimits {
        per_namespace: TOOL_LABELS_PER_NAMESPACE,
        namespaced: NAMESPACED_TOOL_LABELS,
        other_namespaces: 64,
        unnamespaced: 64,
    };

    /// Every `tool` label value there can be: the above, [`OTHER_TOOL`] and
    /// [`UNRESOLVED_TOOL`].
    const fn values(self) -> usize {
        self.namespaced + self.other_namespaces + self.unnamespaced + 2
    }
}

/// The values the `status` label takes ([`Status`]).
const STATUSES: usize = 4;
/// The values the `decision` label takes ([`decision_label`]).
const DECISIONS: [&str; 6] = ["none", "allow", "ask", "always", "deny", "other"];
/// The values the `stage` label of `codemode.denials` takes: every `Stage`, and `none`.
const STAGES: usize = 11;

/// The gate's decision as a label: one of [`DECISIONS`], `other` for a word it does not know.
fn decision_label(decision: &str) -> &'static str {
    DECISIONS
        .iter()
        .find(|d| **d == decision)
        .copied()
        .unwrap_or("other")
}

/// The `tool` label of each call: a value from a bounded set, chosen so that no upstream can
/// use up the others' values.
///
/// - A call whose name did not resolve is [`UNRESOLVED_TOOL`]: a caller's made-up name is never
///   a label.
/// - A tool without a namespace (the built-ins, `codemode`) keeps its name.
/// - A namespaced tool (`mcp__<server>__…`, `models.…`) keeps its name while its namespace has
///   fewer than [`TOOL_LABELS_PER_NAMESPACE`] own-name labels in use and all namespaces together
///   fewer than [`NAMESPACED_TOOL_LABELS`]; past either, it is counted as
///   `<namespace>__(other)` (a name no MCP tool can have: their names are sanitized to
///   `[A-Za-z0-9_]`).
///
/// The choice is made at a name's first call and kept: names that keep their own are
/// remembered (at most the limits above), and a name sent to `__(other)` stays there because
/// the counts that sent it never go down. The SDK's series never expire either, so this is
/// what `/metrics` shows until a restart.
struct ToolLabels {
    limits: LabelLimits,
    chosen: Mutex<Chosen>,
}

#[derive(Default)]
struct Chosen {
    /// Names that keep their own label.
    own: HashMap<String, Arc<str>>,
    /// Own-name labels in use per namespace.
    per_namespace: HashMap<String, usize>,
    namespaced: usize,
    unnamespaced: usize,
    /// `<namespace>__(other)` labels.
    others: HashMap<String, Arc<str>>,
}

impl ToolLabels {
    fn new(limits: LabelLimits) -> Self {
        ToolLabels {
            limits,
            chosen: Mutex::new(Chosen::default()),
        }
    }

    fn label(&self, o: &CallOutcome) -> Arc<str> {
        if o.kind.is_none() {
            return Arc::from(UNRESOLVED_TOOL);
        }
        self.choose(&o.tool, o.namespace.as_deref())
    }

    fn choose(&self, tool: &str, namespace: Option<&str>) -> Arc<str> {
        let limits = self.limits;
        let mut c = self.chosen.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(label) = c.own.get(tool) {
            return label.clone();
        }
        let keeps_own = match namespace {
            None => c.unnamespaced < limits.unnamespaced,
            Some(ns) => {
                c.namespaced < limits.namespaced
                    && c.per_namespace.get(ns).copied().unwrap_or(0) < limits.per_namespace
            }
        };
        if keeps_own {
            match namespace {
                None => c.unnamespaced += 1,
                Some(ns) => {
                    c.namespaced += 1;
                    *c.per_namespace.entry(ns.to_string()).or_default() += 1;
                }
            }
            let label: Arc<str> = Arc::from(tool);
            c.own.insert(tool.to_string(), label.clone());
            return label;
        }
        let Some(ns) = namespace else {
            return Arc::from(OTHER_TOOL);
        };
        if let Some(label) = c.others.get(ns) {
            return label.clone();
        }
        if c.others.len() >= limits.other_namespaces {
            return Arc::from(OTHER_TOOL);
        }
        let label: Arc<str> = Arc::from(format!("{ns}__{OTHER_TOOL}"));
        c.others.insert(ns.to_string(), label.clone());
        label
    }
}

/// The series limit of each instrument: every combination of its labels' values, so that the
/// SDK never counts a call in its `otel_metric_overflow` series (its default, 2,000 series per
/// instrument, is fewer than 1,000 tools × statuses × decisions). With the default limits,
/// 1,130 tool values make at most 27,120 `codemode.calls` series, 12,430 `codemode.denials`,
/// 4,520 `codemode.call.duration` and 1,130 of each budget counter. The cost: the SDK sizes
/// each instrument's table for its limit when it is created, about 2 MB in all per reader
/// (Prometheus and OTLP each keep their own) where the default limits took 0.8 MB; a series
/// used costs a few hundred bytes more (its attributes, its sum or buckets), about 10 MB per
/// reader if every combination were reached.
pub(crate) fn series_limits(i: &Instrument) -> Option<Stream> {
    if i.scope().name() != "codemode" {
        return None;
    }
    let tools = LabelLimits::DEFAULT.values();
    let limit = match i.name() {
        "codemode.calls" => tools * STATUSES * DECISIONS.len(),
        "codemode.denials" => tools * STAGES,
        "codemode.call.duration" => tools * STATUSES,
        "codemode.budget.tokens" | "codemode.budget.cost" | "codemode.budget.bytes" => tools,
        _ => return None,
    };
    Stream::builder().with_cardinality_limit(limit).build().ok()
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

#[cfg(test)]
mod tests {
    use codemode_gate::Stage;

    use super::*;

    fn small() -> ToolLabels {
        ToolLabels::new(LabelLimits {
            per_namespace: 2,
            namespaced: 3,
            other_namespaces: 2,
            unnamespaced: 2,
        })
    }

    #[test]
    fn a_namespace_keeps_its_first_names_and_counts_the_rest_together() {
        let l = small();
        assert_eq!(&*l.choose("mcp__a__x", Some("mcp__a")), "mcp__a__x");
        assert_eq!(&*l.choose("mcp__a__y", Some("mcp__a")), "mcp__a__y");
        assert_eq!(&*l.choose("mcp__a__z", Some("mcp__a")), "mcp__a__(other)");
        // Another namespace still gets its own, up to the total.
        assert_eq!(&*l.choose("mcp__b__x", Some("mcp__b")), "mcp__b__x");
        assert_eq!(&*l.choose("mcp__b__y", Some("mcp__b")), "mcp__b__(other)");
        // Past the namespaces with an `__(other)` label of their own: `(other)`.
        assert_eq!(&*l.choose("mcp__c__x", Some("mcp__c")), OTHER_TOOL);
    }

    #[test]
    fn a_name_keeps_the_label_it_got_first() {
        let l = small();
        l.choose("mcp__a__x", Some("mcp__a"));
        l.choose("mcp__a__y", Some("mcp__a"));
        for _ in 0..3 {
            assert_eq!(&*l.choose("mcp__a__x", Some("mcp__a")), "mcp__a__x");
            assert_eq!(&*l.choose("mcp__a__z", Some("mcp__a")), "mcp__a__(other)");
        }
    }

    #[test]
    fn tools_without_a_namespace_do_not_count_against_namespaces() {
        let l = small();
        for t in ["mcp__a__x", "mcp__a__y", "mcp__b__x", "mcp__b__y"] {
            l.choose(t, Some(&t[..6]));
        }
        assert_eq!(&*l.choose("codemode", None), "codemode");
        assert_eq!(&*l.choose("read", None), "read");
        assert_eq!(&*l.choose("write", None), OTHER_TOOL);
        assert_eq!(&*l.choose("codemode", None), "codemode");
    }

    #[test]
    fn the_series_limits_count_every_label_value() {
        // A new variant fails to compile here: count it in the limits above.
        let status = |s: Status| match s {
            Status::Ok | Status::Error | Status::Denied | Status::Cancelled => 1,
        };
        let stage = |s: Stage| match s {
            Stage::Resolve
            | Stage::Validate
            | Stage::Facts
            | Stage::Protected
            | Stage::Policy
            | Stage::Hook
            | Stage::Approval
            | Stage::Budget
            | Stage::Execute
            | Stage::AfterHook => 1,
        };
        let _ = (status, stage);
        assert_eq!(STATUSES, 4);
        assert_eq!(STAGES, 10 + 1, "every stage and `none`");
        assert_eq!(decision_label("always"), "always");
        assert_eq!(decision_label("something new"), "other");
        let values = LabelLimits::DEFAULT.values();
        assert_eq!(values, 1_130);
        assert!(values * STATUSES * DECISIONS.len() > 2_000);
    }
}
