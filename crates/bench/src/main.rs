//! `codemode-bench`: times the shared workloads on the codemode sandbox, the same way the
//! reference runner (`/work/shared/bench/anchor/run.mjs`) times them on pi-codemode, and prints
//! one comparable JSON line per workload.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use codemode_sandbox::{
    ErrorKind, Host, HostCall, HostError, Isolation, Sandbox, SandboxConfig, Script, ScriptError,
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
        // A slow tool, for the CPU the pool uses while a call waits (not in the shared workloads).
        if call.name == "sleep" {
            let ms = call.args.get("ms").and_then(Value::as_u64).unwrap_or(0);
            return async move {
                tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
                Ok(ms.to_string())
            }
            .boxed_local();
        }
        let r = match call.name.as_str() {
            "rows" => Ok(self.rows_json.to_string()),
            "echo" => serde_json::to_string(&call.args).map_err(|e| HostError::new(e.to_string())),
            other => Err(HostError::new(format!("unknown tool {other}"))),
        };
        async move { r }.boxed_local()
    }
}

/// The 20,000 rows as JSON text, written directly: building them as a `serde_json::Value` first
/// would put about 10 MB of short-lived allocations into the host's peak RSS, which the
/// reference runner does not pay for.
fn rows_json() -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(1_400_000);
    out.push('[');
    for i in 0..20000u64 {
        if i > 0 {
            out.push(',');
        }
        let tag = if i % 7 == 0 { "seven" } else { "other" };
        let score = (i * 37) % 101;
        let _ = write!(
            out,
            r#"{{"id":{i},"name":"item-{i}","tags":["a","b","{tag}"],"score":{score}}}"#
        );
    }
    out.push(']');
    out
}

/// A `kB` field of /proc/PID/status, in MiB.
fn status_mb(pid: &str, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

/// Peak resident set size (VmHWM) of this process plus that of each live worker process, in
/// MiB. Workers share the binary's pages with the host, so the sum overstates the tree a little.
fn peak_rss_mb(sandbox: &Sandbox) -> f64 {
    let workers: f64 = sandbox
        .worker_pids()
        .iter()
        .map(|p| status_mb(&p.to_string(), "VmHWM:"))
        .sum();
    status_mb("self", "VmHWM:") + workers
}

/// Proportional set size of a process (its share of shared pages), in MiB.
fn pss_mb(pid: i32) -> f64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("Pss:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

/// CPU time this process (all its threads) has used, in ms.
fn self_cpu_ms() -> f64 {
    // SAFETY: getrusage writes the struct we hand it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let ms = |t: libc::timeval| t.tv_sec as f64 * 1000.0 + t.tv_usec as f64 / 1000.0;
    ms(ru.ru_utime) + ms(ru.ru_stime)
}

/// CPU time of a single-threaded process (a worker), in ms, from the scheduler's own count.
fn worker_cpu_ms(pid: i32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
        .map(|ns| ns / 1e6)
        .unwrap_or(0.0)
}

/// CPU time of this process and of each live worker, in ms.
fn tree_cpu_ms(sandbox: &Sandbox) -> f64 {
    self_cpu_ms()
        + sandbox
            .worker_pids()
            .iter()
            .map(|p| worker_cpu_ms(*p))
            .sum::<f64>()
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
    let mut isolation = Isolation::Process;
    while let Some(a) = args.next() {
        if a == "--workloads" {
            path = PathBuf::from(args.next().context("--workloads needs a file")?);
        } else if let Some(p) = a.strip_prefix("--workloads=") {
            path = PathBuf::from(p);
        } else if a == "--isolation" || a.starts_with("--isolation=") {
            let v = match a.strip_prefix("--isolation=") {
                Some(v) => v.to_string(),
                None => args.next().context("--isolation needs process or thread")?,
            };
            isolation = match v.as_str() {
                "process" => Isolation::Process,
                "thread" => Isolation::Thread,
                other => bail!("--isolation takes process or thread, not {other}"),
            };
        } else {
            wanted.push(a);
        }
    }
    let label = match isolation {
        Isolation::Process => "codemode-process",
        Isolation::Thread => "codemode-thread",
    };
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading workloads from {}", path.display()))?;
    let spec: Workloads = serde_json::from_str(&text).context("parsing the workloads file")?;

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let defaults = codemode_sandbox::Limits {
        timeout_ms: 120_000,
        cpu_ms: 120_000,
        ..Default::default()
    };
    let config = SandboxConfig {
        defaults,
        isolation,
        warm: 4,
        ..Default::default()
    };
    let sandbox = Sandbox::new(config)?;
    let rows_json: Arc<str> = rows_json().into();
    let host: Arc<dyn Host> = Arc::new(BenchHost { rows_json });
    let tools = [
        ("echo", "Return the arguments"),
        ("rows", "Return 20,000 rows"),
    ];
    let want = |name: &str| wanted.is_empty() || wanted.iter().any(|w| w == name);

    rt.block_on(async {
        let check = |name: &str, w: &Workload, r: codemode_sandbox::ScriptResult| -> Result<()> {
            if !r.ok {
                let e = r
                    .error
                    .unwrap_or_else(|| ScriptError::new(ErrorKind::Sandbox, "no error given"));
                bail!("{name}: {:?}: {}", e.kind, e.message);
            }
            if !w.expect.is_null() && r.value.as_ref() != Some(&w.expect) {
                bail!("{name}: got {:?}, expected {}", r.value, w.expect);
            }
            Ok(())
        };
        for w in &spec.workloads {
            if !want(&w.name) {
                continue;
            }
            let script = || Script::new(w.code.clone(), host.clone()).with_tools(tools);
            let _ = sandbox.run(script()).await; // warm-up
            let mut times = Vec::with_capacity(w.runs);
            let cpu_before = tree_cpu_ms(&sandbox);
            for _ in 0..w.runs {
                let t0 = Instant::now();
                let r = sandbox.run(script()).await;
                times.push(t0.elapsed().as_secs_f64() * 1000.0);
                check(&w.name, w, r)?;
            }
            if times.is_empty() {
                continue;
            }
            // Workers that were replaced during the runs take their CPU time with them, so this
            // is a lower bound; the pool keeps its workers for these workloads.
            let cpu_per_run = (tree_cpu_ms(&sandbox) - cpu_before).max(0.0) / w.runs as f64;
            let in_order: Vec<f64> = times.iter().map(|t| (t * 10.0).round() / 10.0).collect();
            times.sort_by(|a, b| a.total_cmp(b));
            let line = json!({
                "impl": label,
                "workload": w.name,
                "runs": w.runs,
                "cpu_ms_per_run": round3(cpu_per_run),
                "median_ms": round3(times[times.len() / 2]),
                "min_ms": round3(times[0]),
                "max_ms": round3(times[times.len() - 1]),
                "peak_rss_mb": (peak_rss_mb(&sandbox) * 10.0).round() / 10.0,
                "host_peak_rss_mb": (status_mb("self", "VmHWM:") * 10.0).round() / 10.0,
                "times_ms": in_order,
                "worker_peak_rss_mb": sandbox.worker_pids().iter()
                    .map(|p| (status_mb(&p.to_string(), "VmHWM:") * 10.0).round() / 10.0)
                    .collect::<Vec<_>>(),
            });
            println!("{line}");
        }
        // Our own workloads: each shared workload as 1 and as 8 scripts at once (throughput and
        // p99 latency), then the memory of an idle pooled worker.
        if want("concurrent") {
            for w in &spec.workloads {
                for n in [1usize, 8] {
                    let rounds = (w.runs / 2).max(3);
                    let mut latencies = Vec::new();
                    let t0 = Instant::now();
                    for _ in 0..rounds {
                        let batch = (0..n).map(|_| {
                            let fut = sandbox
                                .run(Script::new(w.code.clone(), host.clone()).with_tools(tools));
                            async move {
                                let t = Instant::now();
                                let r = fut.await;
                                (t.elapsed().as_secs_f64() * 1000.0, r)
                            }
                        });
                        for (ms, r) in futures::future::join_all(batch).await {
                            check(&w.name, w, r)?;
                            latencies.push(ms);
                        }
                    }
                    let secs = t0.elapsed().as_secs_f64();
                    latencies.sort_by(|a, b| a.total_cmp(b));
                    let p99 = latencies
                        [((latencies.len() as f64 * 0.99).ceil() as usize).saturating_sub(1)];
                    println!(
                        "{}",
                        json!({
                            "impl": label,
                            "workload": format!("{}_x{n}", w.name),
                            "concurrent": n,
                            "scripts": latencies.len(),
                            "scripts_per_s": round3(latencies.len() as f64 / secs),
                            "median_ms": round3(latencies[latencies.len() / 2]),
                            "p99_ms": round3(p99),
                            "peak_rss_mb": (peak_rss_mb(&sandbox) * 10.0).round() / 10.0,
                        })
                    );
                }
            }
        }
        if want("idle_worker") && isolation == Isolation::Process {
            let idle = Sandbox::new(SandboxConfig {
                warm: 1,
                ..Default::default()
            })?;
            let _ = idle.run(Script::new("return 1", host.clone())).await;
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            let pids = idle.worker_pids();
            let rss: f64 = pids
                .iter()
                .map(|p| status_mb(&p.to_string(), "VmRSS:"))
                .sum::<f64>()
                / pids.len().max(1) as f64;
            let pss: f64 = pids.iter().map(|p| pss_mb(*p)).sum::<f64>() / pids.len().max(1) as f64;
            // The same worker after a script that held the 20,000 rows: a reset keeps up to
            // 16 MiB of the pages it touched, zeroed, for the next script.
            let large = "const rows = await tools.rows({}); return rows.length";
            let _ = idle.run(Script::new(large, host.clone()).with_tools(tools)).await;
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            let after: f64 = idle
                .worker_pids()
                .iter()
                .map(|p| status_mb(&p.to_string(), "VmRSS:"))
                .sum::<f64>()
                / pids.len().max(1) as f64;
            println!(
                "{}",
                json!({ "impl": label, "workload": "idle_worker_memory", "workers": pids.len(),
                        "rss_mb": round3(rss), "pss_mb": round3(pss),
                        "rss_after_large_mb": round3(after) })
            );
        }
        if want("idle_cpu") {
            // CPU the host and its pooled workers use while no script runs, shortly after a
            // burst of sequential calls (when any spinning would show).
            let w = spec.workloads.iter().find(|w| w.name == "seq_calls_1000");
            if let Some(w) = w {
                let _ = sandbox
                    .run(Script::new(w.code.clone(), host.clone()).with_tools(tools))
                    .await;
            }
            // Past the worker's reset of its VM, which follows each script.
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            let before = tree_cpu_ms(&sandbox);
            let t0 = Instant::now();
            tokio::time::sleep(std::time::Duration::from_secs(2)).await;
            let secs = t0.elapsed().as_secs_f64();
            let idle = (tree_cpu_ms(&sandbox) - before) / secs;
            // The same while a script waits 2 s on a slow call.
            let before = tree_cpu_ms(&sandbox);
            let t0 = Instant::now();
            let r = sandbox
                .run(
                    Script::new("return await tools.sleep({ ms: 2000 })", host.clone())
                        .with_tools([("sleep", "Answer after ms milliseconds")]),
                )
                .await;
            let secs = t0.elapsed().as_secs_f64();
            if !r.ok {
                bail!("the slow call failed: {:?}", r.error);
            }
            let waiting = (tree_cpu_ms(&sandbox) - before) / secs;
            println!(
                "{}",
                json!({ "impl": label, "workload": "idle_cpu", "workers": sandbox.worker_pids().len(),
                        "cpu_ms_per_s": round3(idle), "waiting_cpu_ms_per_s": round3(waiting) })
            );
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_the_ones_workloads_json_describes() {
        let rows: Vec<Value> = serde_json::from_str(&rows_json()).unwrap();
        assert_eq!(rows.len(), 20000);
        for i in [0u64, 1, 7, 19999] {
            let tag = if i % 7 == 0 { "seven" } else { "other" };
            assert_eq!(
                rows[i as usize],
                json!({ "id": i, "name": format!("item-{i}"), "tags": ["a", "b", tag], "score": (i * 37) % 101 })
            );
        }
    }
}
