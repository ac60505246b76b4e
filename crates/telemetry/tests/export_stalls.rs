//! Red team: an OTLP receiver that never answers (a collector that is hung, or whose host
//! drops packets) must hold up neither gated calls nor the process's stop.
//!
//! The calls were fine: spans and metrics leave through bounded queues on their own threads.
//! But `Telemetry::shutdown`, which `codemode serve` runs last before it exits, waited for
//! each exporter in turn (a flush and a stop of the traces, a flush and a stop of the metrics,
//! each up to its 5 to 10 s timeout): about 33 s after every signal, longer than the 30 s an
//! orchestrator gives a container before it kills it.

mod common;

use std::time::{Duration, Instant};

use codemode_gate::CallRequest;
use codemode_spec::Provenance;
use codemode_telemetry::{Telemetry, TelemetryConfig};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_never_answers_holds_up_neither_calls_nor_shutdown() {
    // Accepts connections, reads nothing, answers nothing.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let switch = codemode_telemetry::install(tracing_subscriber::EnvFilter::new("warn"), false);
    let telemetry = Telemetry::start(
        &TelemetryConfig {
            otlp_endpoint: Some(format!("http://{addr}")),
            metrics: true,
            metrics_interval: Duration::from_millis(100),
            ..TelemetryConfig::default()
        },
        Some(&switch),
    )
    .unwrap();
    let gate = common::echo_gate(telemetry.metrics().unwrap());
    for i in 0..2_000 {
        let started = Instant::now();
        gate.call(CallRequest::new(
            "echo",
            json!({"i": i}),
            Provenance::model(format!("c{i}"), "s1"),
        ))
        .await
        .unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "call {i} took {:?} while the receiver hangs",
            started.elapsed()
        );
    }
    let started = Instant::now();
    tokio::task::spawn_blocking(move || telemetry.shutdown())
        .await
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "stopping telemetry took {:?} while the receiver hangs",
        started.elapsed()
    );
}
