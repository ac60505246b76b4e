//! Memory of the HTTP gateway under many sessions (issue 13, item 8).
//!
//! `cargo run --release -p codemode-mcp --example session_memory [-- SESSIONS [IDLE_SECS]]`
//!
//! Starts the codemode MCP server over streamable HTTP in a child process (this same program,
//! so the clients' memory is not counted), then, twice: opens SESSIONS (1,000) sessions with
//! rmcp's client, each running one script that keeps a 1 KB `store()` value, and prints the
//! server's RSS with all of them live. Round 1 ends every session (`DELETE`, as a client that
//! closes does); round 2 abandons them, and the server forgets them after IDLE_SECS. Between
//! rounds, RSS should come back near where it started. RSS is the server process's; "tree"
//! adds its sandbox worker processes.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use codemode_gate::{Gate, PolicySet, Registry};
use codemode_mcp::{ElicitationApprover, HttpOptions, ServeOptions, serve_http};
use codemode_runtime::Codemode;
use futures::StreamExt;
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::StreamableHttpClientTransport;
use serde_json::json;

/// Sessions opened at once while building up a round.
const OPENING_AT_ONCE: usize = 32;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--server") {
        let idle = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(40);
        return server(Duration::from_secs(idle));
    }
    let sessions: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1000);
    let idle: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(40);
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(bench(sessions, idle))
}

/// The server side: codemode over HTTP on a free port, until stdin closes.
fn server(idle: Duration) -> Result<(), Box<dyn std::error::Error>> {
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async move {
        let policy = PolicySet::parse(
            "bench.cedar",
            r#"permit(principal, action == Action::"tool_call", resource);"#,
        )?;
        let gate = Gate::builder()
            .registry(Registry::new())
            .policy(policy)
            .build()?;
        let codemode = Codemode::builder().gate(gate).build()?;
        let http = HttpOptions {
            session_idle_timeout: idle,
            max_sessions: 100_000,
            // Every client here is this process, on one address.
            max_connections_per_peer: 0,
            ..HttpOptions::default()
        };
        let addr: SocketAddr = "127.0.0.1:0".parse()?;
        let server = serve_http(
            codemode,
            &[addr],
            http,
            ElicitationApprover::new(),
            ServeOptions::default(),
        )
        .await?;
        println!("http://{}/mcp", server.local_addr);
        // Ends when the benchmark closes our stdin (or dies).
        tokio::task::spawn_blocking(|| {
            let mut sink = String::new();
            while std::io::stdin().read_line(&mut sink).is_ok_and(|n| n > 0) {}
        })
        .await?;
        Ok(())
    })
}

struct ServerProcess(Child);

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

type Client = rmcp::service::RunningService<rmcp::RoleClient, ()>;

async fn open(url: &str, i: usize) -> Result<Client, String> {
    let client = ()
        .serve(StreamableHttpClientTransport::from_uri(url.to_string()))
        .await
        .map_err(|e| format!("session {i}: initialize failed: {e}"))?;
    let mut params = CallToolRequestParams::new("codemode");
    let code = format!("store('k', 'x'.repeat(1000) + {i}); return load('k').length");
    params.arguments = json!({ "code": code }).as_object().cloned();
    let result = client
        .peer()
        .call_tool(params)
        .await
        .map_err(|e| format!("session {i}: the script failed: {e}"))?;
    if result.is_error == Some(true) {
        return Err(format!(
            "session {i}: the script failed: {:?}",
            result.content
        ));
    }
    Ok(client)
}

async fn bench(sessions: usize, idle: u64) -> Result<(), Box<dyn std::error::Error>> {
    let mut child = Command::new(std::env::current_exe()?)
        .args(["--server", &idle.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut first = String::new();
    BufReader::new(child.stdout.take().ok_or("no stdout")?).read_line(&mut first)?;
    let url = first.trim().to_string();
    let pid = child.id();
    let _server = ServerProcess(child);

    // One session first, so that the pool's first worker and the lazy parts of the server are
    // counted as the baseline rather than as the sessions' cost.
    open(&url, 0).await?.cancel().await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    report("before", pid, None);

    for round in 1..=2 {
        let started = Instant::now();
        let clients: Vec<Client> = futures::stream::iter(0..sessions)
            .map(|i| {
                let url = url.clone();
                async move { open(&url, i).await }
            })
            .buffer_unordered(OPENING_AT_ONCE)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<Result<_, _>>()?;
        let opened = started.elapsed();
        report(
            &format!("round {round}: {} live sessions", clients.len()),
            pid,
            Some(opened),
        );
        if round == 1 {
            let ending = Instant::now();
            futures::stream::iter(clients)
                .for_each_concurrent(OPENING_AT_ONCE, |c| async move {
                    let _ = c.cancel().await;
                })
                .await;
            tokio::time::sleep(Duration::from_secs(3)).await;
            report("round 1: all ended (DELETE)", pid, Some(ending.elapsed()));
        } else {
            // Abandoned: the connections stay open until the server closes them as idle.
            let waiting = Instant::now();
            std::mem::forget(clients);
            tokio::time::sleep(Duration::from_secs(idle + idle / 4 + 3)).await;
            report(
                &format!("round 2: abandoned, after the {idle} s idle limit"),
                pid,
                Some(waiting.elapsed()),
            );
        }
    }
    Ok(())
}

fn report(what: &str, pid: u32, took: Option<Duration>) {
    let own = rss_kb(pid);
    let tree = tree_rss_kb(pid);
    let took = took
        .map(|d| format!(" ({:.1} s)", d.as_secs_f64()))
        .unwrap_or_default();
    println!(
        "{what:<48} server RSS {:>7.1} MB, tree {:>7.1} MB{took}",
        own as f64 / 1024.0,
        tree as f64 / 1024.0
    );
}

fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// The process and every descendant.
fn tree_rss_kb(pid: u32) -> u64 {
    let mut total = rss_kb(pid);
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return total;
    };
    for task in tasks.flatten() {
        let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        for child in children.split_whitespace().filter_map(|c| c.parse().ok()) {
            total += tree_rss_kb(child);
        }
    }
    total
}
