//! `codemode-bench`: times the shared workloads on the codemode sandbox, the same way the
//! reference runner (`/work/shared/bench/anchor/run.mjs`) times them on pi-codemode, and prints
//! one comparable JSON line per workload.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use codemode_sandbox::{
    ErrorKind, Host, HostCall, HostError, Sandbox, SandboxConfig, Script, ScriptError,
};
use futures::FutureExt;
use futures::future::LocalBoxFuture;
use serde::Deserialize;
use serde_json::{Value, json};

#[derive(Deserialize)]
struct Workloads {
    workloads: Vec<Workload>,
}

#[derive(Deserialize)]
struct Workload {
    name: String,
    runs: usize,
    code: String,
    expect: Value,
}

/// `echo` resolves to its arguments; `rows` to the 20,000 rows described in workloads.json.
/// Like the reference runner's tool, `rows` hands out data it already holds: here as JSON text,
/// through the sandbox's `call_json` fast path.
struct BenchHost {
    rows_json: Arc<str>,
}

impl Host for BenchHost {
    fn call(&self, call: HostCall) -> LocalBoxFuture<'static, Result<Value, HostError>> {
        let r = match call.name.as_str() {
            "echo" => Ok(call.args),
            "rows" => {
                serde_json::from_str(&self.rows_json).map_err(|e| HostError::new(e.to_string()))
            }
            other => Err(HostError::new(format!("unknown tool {other}"))),
        };
        async move { r }.boxed_local()
    }

    fn call_json(&self, call: HostCall) -> LocalBoxFuture<'static, Result<String, HostError>> {
        let r = match call.name.as_str() {
            "rows" => Ok(self.rows_json.to_string()),
            "echo" => Ok(call.args.to_string()),
            other => Err(HostError::new(format!("unknown tool {other}"))),
        };
        async move { r }.boxed_local()
    }
}

fn rows() -> Value {
    Value::Array(
        (0..20000u64)
            .map(|i| {
                json!({
                    "id": i,
                    "name": format!("item-{i}"),
                    "tags": ["a", "b", if i % 7 == 0 { "seven" } else { "other" }],
                    "score": (i * 37) % 101,
                })
            })
            .collect(),
    )
}

/// Peak resident set size of this process (VmHWM), in MiB.
fn peak_rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

fn default_workloads() -> PathBuf {
    // crates/bench -> the workspace root -> ../shared/bench/workloads.json
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/bench/workloads.json")
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let mut path = default_workloads();
    let mut wanted = Vec::new();
    while let Some(a) = args.next() {
        if a == "--workloads" {
            path = PathBuf::from(args.next().context("--workloads needs a file")?);
        } else if let Some(p) = a.strip_prefix("--workloads=") {
            path = PathBuf::from(p);
        } else {
            wanted.push(a);
        }
    }
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading workloads from {}", path.display()))?;
    let spec: Workloads = serde_json::from_str(&text).context("parsing the workloads file")?;

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let defaults = codemode_sandbox::Limits {
        timeout_ms: 120_000,
        cpu_ms: 120_000,
        ..Default::default()
    };
    let config = SandboxConfig {
        defaults,
        ..Default::default()
    };
    let sandbox = Sandbox::new(config)?;
    let rows_json: Arc<str> = serde_json::to_string(&rows())?.into();
    let host: Arc<dyn Host> = Arc::new(BenchHost { rows_json });
    let tools = [
        ("echo", "Return the arguments"),
        ("rows", "Return 20,000 rows"),
    ];

    rt.block_on(async {
        for w in &spec.workloads {
            if !wanted.is_empty() && !wanted.contains(&w.name) {
                continue;
            }
            let script = || Script::new(w.code.clone(), host.clone()).with_tools(tools);
            let _ = sandbox.run(script()).await; // warm-up
            let mut times = Vec::with_capacity(w.runs);
            for _ in 0..w.runs {
                let t0 = Instant::now();
                let r = sandbox.run(script()).await;
                times.push(t0.elapsed().as_secs_f64() * 1000.0);
                if !r.ok {
                    let e = r
                        .error
                        .unwrap_or_else(|| ScriptError::new(ErrorKind::Sandbox, "no error given"));
                    bail!("{}: {:?}: {}", w.name, e.kind, e.message);
                }
                if !w.expect.is_null() && r.value.as_ref() != Some(&w.expect) {
                    bail!("{}: got {:?}, expected {}", w.name, r.value, w.expect);
                }
            }
            if times.is_empty() {
                continue;
            }
            times.sort_by(|a, b| a.total_cmp(b));
            let line = json!({
                "impl": "codemode",
                "workload": w.name,
                "runs": w.runs,
                "median_ms": round3(times[times.len() / 2]),
                "min_ms": round3(times[0]),
                "max_ms": round3(times[times.len() - 1]),
                "peak_rss_mb": (peak_rss_mb() * 10.0).round() / 10.0,
            });
            println!("{line}");
        }
        Ok(())
    })
}
