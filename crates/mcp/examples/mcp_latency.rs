//! Latency of MCP tool calls: straight through the client vs from a codemode script.
//!
//! `cargo run --release -p codemode-mcp --example mcp_latency`
//! Uses the testbed's server-everything (`echo`) over stdio.

use std::sync::Arc;
use std::time::{Duration, Instant};

use codemode_gate::{Gate, PolicySet, Registry};
use codemode_mcp::{ConnectOptions, McpConfig, McpHub};
use codemode_runtime::{Codemode, ScriptRequest};
use codemode_spec::{Provenance, Tool, ToolCall};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const TESTBED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testbed/node_modules");
const N: usize = 200;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let config = McpConfig::from_json(
        &json!({"mcpServers": {"everything": {"command": "node",
            "args": [format!("{TESTBED}/@modelcontextprotocol/server-everything/dist/index.js")]}}}),
        "bench",
    )?;
    let hub = McpHub::connect(&config, ConnectOptions::default()).await;
    let registry = Registry::new();
    for tool in hub.tools() {
        registry.register(tool)?;
    }
    let echo: Arc<dyn Tool> = hub
        .tools()
        .into_iter()
        .find(|t| t.spec().name == "mcp__everything__echo")
        .ok_or("server-everything did not connect")?;
    let policy = PolicySet::parse(
        "bench.cedar",
        r#"permit(principal, action == Action::"tool_call", resource);"#,
    )?;
    let gate = Gate::builder().registry(registry).policy(policy).build()?;
    let codemode = Codemode::builder().gate(gate).build()?;

    let direct = |i: usize| {
        echo.call(ToolCall {
            args: json!({"message": format!("m{i}")}),
            provenance: Provenance::model(format!("c{i}"), "bench"),
            cancel: CancellationToken::new(),
        })
    };
    for i in 0..20 {
        direct(i).await?;
    }
    let mut samples = Vec::with_capacity(N);
    for i in 0..N {
        let t = Instant::now();
        direct(i).await?;
        samples.push(t.elapsed());
    }
    samples.sort();
    let direct_median = samples[N / 2];

    let run = |code: String| {
        let codemode = codemode.clone();
        async move {
            let t = Instant::now();
            let run = codemode.run_script(ScriptRequest::new(code, "bench")).await;
            (t.elapsed(), run.is_error, run.text)
        }
    };
    run("return 1".into()).await; // warm-up
    let (empty, ..) = run("return 1".into()).await;
    let seq = format!(
        "for (let i = 0; i < {N}; i++) await tools.mcp__everything__echo({{message: 'm' + i}}); return 1"
    );
    run(seq.clone()).await; // warm-up
    let (seq_total, err, text) = run(seq).await;
    if err {
        return Err(format!("script failed: {text}").into());
    }
    let per_call_script = (seq_total.saturating_sub(empty)) / N as u32;

    let par = "await Promise.all(Array.from({length: 100}, (_, i) => tools.mcp__everything__echo({message: 'p' + i}))); return 1".to_string();
    let (par_total, err, text) = run(par).await;
    if err {
        return Err(format!("script failed: {text}").into());
    }
    let t = Instant::now();
    for i in 0..100 {
        direct(i).await?;
    }
    let seq100 = t.elapsed();

    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "direct client call, median of {N}:            {:.3} ms",
        ms(direct_median)
    );
    println!(
        "from a script, per call ({N} sequential):    {:.3} ms",
        ms(per_call_script)
    );
    println!(
        "script overhead per call vs direct:          {:.3} ms",
        ms(per_call_script) - ms(direct_median)
    );
    println!(
        "empty script run:                            {:.3} ms",
        ms(empty)
    );
    println!(
        "100 parallel calls from one script:          {:.1} ms",
        ms(par_total)
    );
    println!(
        "100 sequential direct calls:                 {:.1} ms",
        ms(seq100)
    );
    hub.shutdown().await;
    Ok(())
}
