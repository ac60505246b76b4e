//! Latency of MCP tool calls made from a codemode script, against the same calls made directly
//! (issue 13, "Performance").
//!
//! `cargo run --release -p codemode-mcp --example mcp_latency [-- --json] [-- N]`
//!
//! One stdio connection to the testbed's server-everything; every case makes N (1,000) `echo`
//! calls after 50 warm-up calls:
//! - `rust-direct`: codemode's own MCP client (`McpHub`, rmcp), no gate, no script;
//! - `rust-gate`: the same calls through `Gate::call` (policy, validation, outcome), no script;
//! - `script`: one script making them (process isolation, the default), through the gate;
//! - `script-audit`: the same with the gate writing its keyed audit log (as `codemode serve`
//!   does), one line per call.
//!
//! Sequential calls are timed one by one by the caller (`performance.now()` in the script,
//! `Instant` in Rust), like the SDK clients in `crates/mcp/bench/`, so medians compare like for
//! like; `mean` is the loop's total / N. Parallel cases start all N calls at once and report the
//! total (for scripts, measured inside the script; `outside_ms` is the whole run as the embedder
//! sees it). `scripts/bench-mcp` runs this alongside the Python and TypeScript SDKs.

use std::sync::Arc;
use std::time::Instant;

use codemode_gate::{AuditKey, AuditLog, CallRequest, Gate, PolicySet, Registry};
use codemode_mcp::{ConnectOptions, McpConfig, McpHub};
use codemode_runtime::{Codemode, ScriptRequest};
use codemode_spec::{Origin, Provenance, Tool, ToolCall};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const TESTBED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testbed/node_modules");
const WARMUP: usize = 50;
const ECHO: &str = "mcp__everything__echo";

type Error = Box<dyn std::error::Error>;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let mut json_lines = false;
    let mut n = 1000;
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--json" => json_lines = true,
            other => match other.parse() {
                Ok(count) if count > 0 => n = count,
                _ => {
                    return Err(
                        format!("expected --json or a count of calls, got {other:?}").into(),
                    );
                }
            },
        }
    }
    let config = McpConfig::from_json(
        &json!({"mcpServers": {"everything": {"command": "node",
            "args": [format!("{TESTBED}/@modelcontextprotocol/server-everything/dist/index.js")]}}}),
        "bench",
    )?;
    let hub = McpHub::connect(&config, ConnectOptions::default()).await;
    let echo: Arc<dyn Tool> = hub
        .tools()
        .into_iter()
        .find(|t| t.spec().name == ECHO)
        .ok_or("server-everything did not connect (run `npm ci --prefix testbed`?)")?;
    let audit_dir = tempfile::tempdir()?;
    let audit =
        AuditLog::open_with_key(audit_dir.path().join("audit.jsonl"), AuditKey::generate()?)?;
    let plain = gate(&hub, None)?;
    let audited = gate(&hub, Some(audit))?;
    let script = Codemode::builder().gate(plain.clone()).build()?;
    let script_audit = Codemode::builder().gate(audited).build()?;

    let mut lines = Vec::new();
    let direct = |i: usize| {
        echo.call(ToolCall {
            args: json!({"message": format!("m{i}")}),
            provenance: Provenance::model(format!("d{i}"), "bench"),
            cancel: CancellationToken::new(),
        })
    };
    for i in 0..WARMUP {
        direct(i).await?;
    }
    let mut samples = Vec::with_capacity(n);
    let start = Instant::now();
    for i in 0..n {
        let t = Instant::now();
        direct(i).await?;
        samples.push(t.elapsed().as_secs_f64() * 1e3);
    }
    lines.push(summary("rust-direct", samples, ms(start)));

    // Stamped as a script's call would be (the gate refuses undeclared tools to the model).
    let gated = |i: usize| {
        let provenance = Provenance {
            origin: Origin::Script,
            depth: 1,
            script_id: Some("bench".into()),
            seq: Some(i as u64 + 1),
            ..Provenance::model(format!("bench/{i}"), "bench")
        };
        plain.call(CallRequest::new(
            ECHO,
            json!({"message": format!("g{i}")}),
            provenance,
        ))
    };
    for i in 0..WARMUP {
        gated(i).await?;
    }
    let mut samples = Vec::with_capacity(n);
    let start = Instant::now();
    for i in 0..n {
        let t = Instant::now();
        gated(i).await?;
        samples.push(t.elapsed().as_secs_f64() * 1e3);
    }
    lines.push(summary("rust-gate", samples, ms(start)));

    for (name, codemode) in [("script", &script), ("script-audit", &script_audit)] {
        run(codemode, &sequential_script(WARMUP)).await?;
        let (value, outside) = run(codemode, &sequential_script(n)).await?;
        let mut line = script_summary(name, n, &value)?;
        line["outside_ms"] = json!(outside);
        lines.push(line);
    }

    let start = Instant::now();
    futures::future::try_join_all((0..n).map(direct)).await?;
    let total = ms(start);
    lines.push(parallel("rust-direct", n, total));
    for (name, codemode) in [("script", &script), ("script-audit", &script_audit)] {
        let (value, outside) = run(codemode, &parallel_script(n)).await?;
        let mut line = script_summary(name, n, &value)?;
        line["outside_ms"] = json!(outside);
        lines.push(line);
    }
    let (_, empty) = run(&script, "return 1").await?;

    if json_lines {
        for line in &lines {
            println!("{line}");
        }
    } else {
        println!(
            "{n} echo calls to server-everything over stdio, after {WARMUP} warm-up calls (ms)"
        );
        println!(
            "{:<13} {:<11} {:>8} {:>8} {:>8} {:>9} {:>9}",
            "client", "mode", "median", "mean", "p99", "total", "outside"
        );
        let cell = |v: &Value, k: &str| {
            v[k].as_f64()
                .map_or_else(|| "-".to_string(), |x| format!("{x:.3}"))
        };
        for l in &lines {
            println!(
                "{:<13} {:<11} {:>8} {:>8} {:>8} {:>9} {:>9}",
                l["client"].as_str().unwrap_or(""),
                l["mode"].as_str().unwrap_or(""),
                cell(l, "median_ms"),
                cell(l, "mean_ms"),
                cell(l, "p99_ms"),
                cell(l, "total_ms"),
                cell(l, "outside_ms"),
            );
        }
        println!("an empty script run: {empty:.3} ms");
    }
    hub.shutdown().await;
    Ok(())
}

/// A gate that permits every call, with the hub's tools registered.
fn gate(hub: &McpHub, audit: Option<AuditLog>) -> Result<Gate, Error> {
    let registry = Registry::new();
    for tool in hub.tools() {
        registry.register(tool)?;
    }
    let policy = PolicySet::parse(
        "bench.cedar",
        r#"permit(principal, action == Action::"tool_call", resource);"#,
    )?;
    let mut builder = Gate::builder().registry(registry).policy(policy);
    if let Some(audit) = audit {
        builder = builder.audit(audit);
    }
    Ok(builder.build()?)
}

/// N sequential calls, each timed inside the script; returns the sorted times and the total.
fn sequential_script(n: usize) -> String {
    format!(
        "const t = []; const start = performance.now();
         for (let i = 0; i < {n}; i++) {{
           const s = performance.now();
           await tools.{ECHO}({{message: 'm' + i}});
           t.push(performance.now() - s);
         }}
         const total = performance.now() - start;
         t.sort((a, b) => a - b);
         return {{samples: t, total}};"
    )
}

/// N calls started at once; returns the total.
fn parallel_script(n: usize) -> String {
    format!(
        "const start = performance.now();
         await Promise.all(Array.from({{length: {n}}}, (_, i) => tools.{ECHO}({{message: 'p' + i}})));
         return {{total: performance.now() - start}};"
    )
}

/// Runs a script and returns its value and the run's wall time as the embedder saw it.
async fn run(codemode: &Codemode, code: &str) -> Result<(Value, f64), Error> {
    let start = Instant::now();
    let run = codemode
        .run_script(ScriptRequest::new(code.to_string(), "bench"))
        .await;
    let outside = ms(start);
    if run.is_error {
        return Err(format!("script failed: {}", run.text).into());
    }
    let value = run.result.and_then(|r| r.value).unwrap_or(Value::Null);
    Ok((value, outside))
}

/// The figures a script returned: per-call samples and total (sequential) or the total alone.
fn script_summary(client: &str, n: usize, value: &Value) -> Result<Value, Error> {
    let total = value["total"]
        .as_f64()
        .ok_or("the script returned no total")?;
    match value["samples"].as_array() {
        Some(samples) => {
            let samples: Vec<f64> = samples.iter().filter_map(Value::as_f64).collect();
            if samples.len() != n {
                return Err(format!("the script timed {} calls, not {n}", samples.len()).into());
            }
            Ok(summary(client, samples, total))
        }
        None => Ok(parallel(client, n, total)),
    }
}

fn parallel(client: &str, n: usize, total: f64) -> Value {
    json!({"client": client, "mode": "parallel", "n": n,
        "mean_ms": total / n as f64, "total_ms": total})
}

/// Median, mean (the loop's total / N), p99 and total of sequential calls (at least one), in ms.
fn summary(client: &str, mut samples: Vec<f64>, total: f64) -> Value {
    samples.sort_by(f64::total_cmp);
    let n = samples.len();
    let median = if n % 2 == 1 {
        samples[n / 2]
    } else {
        (samples[n / 2 - 1] + samples[n / 2]) / 2.0
    };
    json!({
        "client": client, "mode": "sequential", "n": samples.len(),
        "median_ms": median, "mean_ms": total / n as f64,
        "p99_ms": samples[((n * 99) / 100).min(n - 1)], "total_ms": total,
    })
}

fn ms(start: Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1e3
}
