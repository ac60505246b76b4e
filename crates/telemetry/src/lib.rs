//! OpenTelemetry for codemode, off until asked for.
//!
//! - **Traces.** The gate opens a `tracing` span per call (target `codemode::call`), the child
//!   of its parent call's span as the provenance says (a script's calls under the `codemode`
//!   call). [`install`] puts a layer for them under the process's log output, and
//!   [`Telemetry::start`] connects it to an OTLP/HTTP exporter. Spans carry the tool, the
//!   decision, the policy ids, the status, the duration and the usage; never arguments or
//!   results, unless the operator turned on `telemetry.include_arguments`.
//! - **Metrics.** [`Metrics`] counts every call's outcome (calls, denials, latency, budget
//!   spend) as the gate's [`CallObserver`], with gauges for active sessions and upstream
//!   servers; exported over OTLP and as Prometheus text ([`Telemetry::prometheus_text`]) for
//!   `/metrics`.

mod metrics;

use std::sync::Arc;
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry, filter::Targets, reload};

pub use metrics::{
    Gauges, Metrics, MetricsSlot, NAMESPACED_TOOL_LABELS, OTHER_TOOL, TOOL_LABELS_PER_NAMESPACE,
    UNRESOLVED_TOOL, UpstreamState,
};

type OtelLayer = tracing_opentelemetry::OpenTelemetryLayer<Registry, SdkTracer>;

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("telemetry.otlp_endpoint `{endpoint}` cannot be used: {message}")]
    Endpoint { endpoint: String, message: String },
    #[error("the Prometheus exporter cannot start: {0}")]
    Prometheus(String),
    #[error("the tracing subscriber could not be switched: {0}")]
    Switch(String),
}

/// What to turn on (the `telemetry` settings).
#[derive(Debug, Clone)]
pub struct TelemetryConfig {
    /// Base URL of an OTLP/HTTP receiver (`http://collector:4318`); `/v1/traces` and
    /// `/v1/metrics` are appended.
    pub otlp_endpoint: Option<String>,
    /// Keep metrics for `/metrics`.
    pub metrics: bool,
    /// `service.name` of the exported resource.
    pub service_name: String,
    /// How often metrics are pushed over OTLP.
    pub metrics_interval: Duration,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            otlp_endpoint: None,
            metrics: false,
            service_name: "codemode".into(),
            metrics_interval: Duration::from_secs(10),
        }
    }
}

impl TelemetryConfig {
    pub fn is_on(&self) -> bool {
        self.otlp_endpoint.is_some() || self.metrics
    }
}

/// The switch [`install`] returns: the place where the OTLP layer goes once settings are read.
#[derive(Clone)]
pub struct TraceSwitch {
    handle: reload::Handle<Option<OtelLayer>, Registry>,
}

/// Installs the process's subscriber: log lines to stderr filtered by `log_filter` (as
/// before), and an empty slot for call spans that [`Telemetry::start`] fills. Call once, at
/// start.
pub fn install(log_filter: EnvFilter, ansi: bool) -> TraceSwitch {
    let (otel, handle) = reload::Layer::new(None::<OtelLayer>);
    let calls_only = Targets::new().with_target("codemode::call", tracing::Level::INFO);
    let log = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .with_filter(log_filter);
    let _ = tracing_subscriber::registry()
        .with(otel.with_filter(calls_only))
        .with(log)
        .try_init();
    TraceSwitch { handle }
}

/// Running telemetry: flush it with [`Telemetry::shutdown`] before the process exits.
pub struct Telemetry {
    tracer: Option<SdkTracerProvider>,
    meter: Option<SdkMeterProvider>,
    prometheus: Option<prometheus::Registry>,
    metrics: Option<Arc<Metrics>>,
    switch: Option<TraceSwitch>,
}

impl Telemetry {
    /// Nothing on.
    pub fn off() -> Self {
        Telemetry {
            tracer: None,
            meter: None,
            prometheus: None,
            metrics: None,
            switch: None,
        }
    }

    /// Starts what `config` asks for. Traces need the `switch` from [`install`].
    pub fn start(
        config: &TelemetryConfig,
        switch: Option<&TraceSwitch>,
    ) -> Result<Self, TelemetryError> {
        if !config.is_on() {
            return Ok(Telemetry::off());
        }
        let resource = Resource::builder()
            .with_service_name(config.service_name.clone())
            .build();
        let mut out = Telemetry::off();
        if let Some(base) = &config.otlp_endpoint {
            let bad = |message: String| TelemetryError::Endpoint {
                endpoint: base.clone(),
                message,
            };
            if !(base.starts_with("http://") || base.starts_with("https://")) {
                return Err(bad(
                    "it must start with http:// or https:// (OTLP over HTTP, port 4318 by default)"
                        .into(),
                ));
            }
            let base_trimmed = base.trim_end_matches('/');
            let spans = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_endpoint(format!("{base_trimmed}/v1/traces"))
                .with_timeout(Duration::from_secs(10))
                .build()
                .map_err(|e| bad(e.to_string()))?;
            let provider = SdkTracerProvider::builder()
                .with_batch_exporter(spans)
                .with_resource(resource.clone())
                .build();
            if let Some(switch) = switch {
                let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("codemode"));
                switch
                    .handle
                    .reload(Some(layer))
                    .map_err(|e| TelemetryError::Switch(e.to_string()))?;
                out.switch = Some(switch.clone());
            }
            out.tracer = Some(provider);
        }
        let mut meter = SdkMeterProvider::builder()
            .with_resource(resource)
            .with_view(metrics::series_limits);
        if config.metrics {
            let registry = prometheus::Registry::new();
            let exporter = opentelemetry_prometheus::exporter()
                .with_registry(registry.clone())
                .build()
                .map_err(|e| TelemetryError::Prometheus(e.to_string()))?;
            meter = meter.with_reader(exporter);
            out.prometheus = Some(registry);
        }
        if let Some(base) = &config.otlp_endpoint {
            let exporter = opentelemetry_otlp::MetricExporter::builder()
                .with_http()
                .with_endpoint(format!("{}/v1/metrics", base.trim_end_matches('/')))
                .with_timeout(Duration::from_secs(10))
                .build()
                .map_err(|e| TelemetryError::Endpoint {
                    endpoint: base.clone(),
                    message: e.to_string(),
                })?;
            meter = meter.with_reader(
                PeriodicReader::builder(exporter)
                    .with_interval(config.metrics_interval)
                    .build(),
            );
        }
        let meter = meter.build();
        out.metrics = Some(Arc::new(Metrics::new(&meter)));
        out.meter = Some(meter);
        Ok(out)
    }

    /// The gate's observer, when metrics are on.
    pub fn metrics(&self) -> Option<Arc<Metrics>> {
        self.metrics.clone()
    }

    /// Whether `/metrics` is served.
    pub fn serves_prometheus(&self) -> bool {
        self.prometheus.is_some()
    }

    /// The metrics in Prometheus text format (for `/metrics`).
    pub fn prometheus_text(&self) -> Option<String> {
        let registry = self.prometheus.as_ref()?;
        let mut out = Vec::new();
        let encoder = prometheus::TextEncoder::new();
        prometheus::Encoder::encode(&encoder, &registry.gather(), &mut out).ok()?;
        String::from_utf8(out).ok()
    }

    /// Exports what is buffered and stops, waiting at most [`SHUTDOWN_LIMIT`]. Blocks (the
    /// exporters are blocking HTTP clients): call it from a blocking thread in async code.
    pub fn shutdown(&self) {
        self.shutdown_within(SHUTDOWN_LIMIT);
    }

    /// As [`Telemetry::shutdown`], waiting at most `limit`; false when the exporters had not
    /// finished by then. A receiver that hangs holds each exporter up to its timeout in turn
    /// (half a minute in all), so they are flushed on a thread of their own and what they have
    /// not sent by then is given up: the process must stop when it is told to.
    pub fn shutdown_within(&self, limit: Duration) -> bool {
        let tracer = self.tracer.clone();
        let meter = self.meter.clone();
        let (done, finished) = std::sync::mpsc::channel();
        let flush = move || {
            flush_and_stop(tracer.as_ref(), meter.as_ref());
            let _ = done.send(());
        };
        let in_time = match std::thread::Builder::new()
            .name("telemetry-flush".into())
            .spawn(flush)
        {
            Ok(_) => finished.recv_timeout(limit).is_ok(),
            Err(e) => {
                tracing::warn!("no thread to flush telemetry on ({e}); it is not flushed");
                false
            }
        };
        // No more spans for exporters that are stopped or being given up.
        if let Some(switch) = &self.switch {
            let _ = switch.handle.reload(None);
        }
        if !in_time {
            tracing::warn!(
                "telemetry not sent within {} s of stopping is dropped; check that \
                 telemetry.otlp_endpoint answers",
                limit.as_secs()
            );
        }
        in_time
    }
}

/// How long [`Telemetry::shutdown`] waits for the exporters.
pub const SHUTDOWN_LIMIT: Duration = Duration::from_secs(5);

fn flush_and_stop(tracer: Option<&SdkTracerProvider>, meter: Option<&SdkMeterProvider>) {
    if let Some(t) = tracer {
        let _ = t.force_flush();
        if let Err(e) = t.shutdown() {
            tracing::warn!("stopping the trace exporter: {e}");
        }
    }
    if let Some(m) = meter {
        let _ = m.force_flush();
        let _ = m.shutdown();
    }
}
