//! Upstream servers that abuse the protocol rather than their tools' texts: notification storms,
//! listings they never answer, requests to the client, oversized progress. The fixture speaks
//! raw JSON-RPC (see `fixtures/protocol-server.cjs`).

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use codemode_mcp::{ConnectOptions, McpConfig, McpHub, route_progress};
use codemode_spec::{Provenance, Tool, ToolCall};
use common::{CapturedLog, assert_all_connected, find};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/protocol-server.cjs"
);

fn server() -> Value {
    json!({"command": "node", "args": [FIXTURE]})
}

/// A hub whose calls time out far beyond any test's own limit, so nothing here passes by a
/// timeout firing.
async fn hub(servers: Value) -> McpHub {
    let config = McpConfig::from_json(&json!({ "mcpServers": servers }), "test").unwrap();
    let opts = ConnectOptions {
        call_timeout: Duration::from_secs(600),
        ..Default::default()
    };
    let hub = McpHub::connect(&config, opts).await;
    assert_all_connected(&hub);
    hub
}

async fn run_as(tool: &Arc<dyn Tool>, args: Value, provenance: Provenance) -> String {
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tool.call(ToolCall {
            args,
            provenance,
            cancel: CancellationToken::new(),
        }),
    )
    .await
    .expect("the call answers within 60 s")
    .unwrap();
    out.value["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

async fn run(hub: &McpHub, name: &str, args: Value) -> String {
    run_as(&find(hub, name), args, Provenance::model("c1", "s1")).await
}

/// Waits (up to `secs`) until the hub offers the tool `name`.
async fn appears(hub: &McpHub, name: &str, secs: u64) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    while std::time::Instant::now() < deadline {
        if hub.tools().iter().any(|t| t.spec().name == name) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// Red-team finding: one refresher re-listed every server's tools in turn, so a server that
/// announced a change and then never answered `tools/list` held up every other server's
/// changes for good (the tools a server added never reached the gate).
#[tokio::test]
async fn a_server_that_never_answers_its_relisting_holds_up_no_other_server() {
    let hub = hub(json!({"stuck": server(), "fine": server()})).await;
    assert_eq!(
        run(&hub, "mcp__stuck__stall_listing", json!({})).await,
        "stalled"
    );
    // The refresher has asked the stuck server again (and waits for it) once it counted two.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while run(&hub, "mcp__stuck__list_count", json!({})).await != "2" {
        assert!(
            std::time::Instant::now() < deadline,
            "the stuck server was never asked to list again"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(run(&hub, "mcp__fine__add_tool", json!({})).await, "added");
    assert!(
        appears(&hub, "mcp__fine__extra", 20).await,
        "the other server's new tool never arrived"
    );
    assert_eq!(
        run(&hub, "mcp__fine__extra", json!({})).await,
        "extra works"
    );
    hub.shutdown().await;
}

/// Red-team finding: every `notifications/tools/list_changed` queued one more full re-listing,
/// so a server could make the host list its tools tens of thousands of times (and announce
/// each changed list to the model). A burst is one re-listing, or a few.
#[tokio::test]
async fn a_storm_of_list_changed_notifications_costs_a_few_listings() {
    let hub = hub(json!({"loud": server()})).await;
    assert_eq!(
        run(&hub, "mcp__loud__storm", json!({"count": 20000})).await,
        "sent 20000"
    );
    assert_eq!(run(&hub, "mcp__loud__add_tool", json!({})).await, "added");
    assert!(
        appears(&hub, "mcp__loud__extra", 60).await,
        "the change after the storm never arrived"
    );
    // Once the last change is seen, whatever was still queued has had time to run.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let listings: u64 = run(&hub, "mcp__loud__list_count", json!({}))
        .await
        .parse()
        .unwrap();
    assert!(
        listings <= 100,
        "20,000 notifications made the host list the tools {listings} times"
    );
    hub.shutdown().await;
}

/// Sampling would spend the user's model credentials outside the gate, elicitation would put
/// a server's question to the person, roots would name the workspace. codemode offers none of
/// them, and says so in an error rather than an answer a server could read as the person's.
#[tokio::test]
async fn requests_a_server_sends_the_client_are_refused_with_errors_that_say_why() {
    let hub = hub(json!({"nosy": server()})).await;
    let answers: Value = serde_json::from_str(&run(&hub, "mcp__nosy__ask", json!({})).await)
        .expect("the fixture answers with JSON");
    for what in ["sampling", "elicitation", "roots"] {
        let answer = &answers[what];
        assert!(
            answer.get("result").is_none(),
            "{what} was answered: {answer}"
        );
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("codemode"),
            "{what}: the error does not say who refused: {answer}"
        );
    }
    hub.shutdown().await;
}

/// Forwards the progress of one call of `tool` and returns the lines that reached the sink.
async fn forwarded_progress(hub: &McpHub, tool: &str, args: Value) -> Vec<String> {
    let route = format!("codemode_protocol_{tool}");
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = lines.clone();
    let _route = route_progress(
        &route,
        Arc::new(move |line| seen.lock().unwrap().push(line)),
    );
    let mut provenance = Provenance::model("c2", "s1");
    provenance.parent_call_id = Some(route);
    run_as(&find(hub, tool), args, provenance).await;
    lines.lock().unwrap().clone()
}

/// Red-team finding: every progress notification of an upstream was forwarded to the client of
/// `codemode serve`, through an unbounded queue: a server could flood the client, and fill the
/// host's memory while the client read slowly.
#[tokio::test]
async fn a_flood_of_upstream_progress_reaches_the_client_thinned() {
    let hub = hub(json!({"loud": server()})).await;
    let lines = forwarded_progress(
        &hub,
        "mcp__loud__loud_progress",
        json!({"count": 20000, "bytes": 10}),
    )
    .await;
    assert!(!lines.is_empty(), "the progress was forwarded");
    assert!(
        lines.len() <= 100,
        "20,000 notifications sent in one burst became {} progress lines",
        lines.len()
    );
    hub.shutdown().await;
}

/// Red-team finding: an upstream's progress message went whole (up to 16 MiB a notification)
/// to the client of `codemode serve`, as often as the server sent one.
#[tokio::test]
async fn an_upstream_progress_message_reaches_the_client_cut_short() {
    let hub = hub(json!({"loud": server()})).await;
    let lines = forwarded_progress(
        &hub,
        "mcp__loud__loud_progress",
        json!({"bytes": 1_000_000}),
    )
    .await;
    assert!(!lines.is_empty(), "the progress was forwarded");
    for line in &lines {
        assert!(
            line.len() <= 4096,
            "a progress line of {} bytes was forwarded",
            line.len()
        );
        assert!(
            line.starts_with("mcp__loud__loud_progress: ppp"),
            "{}",
            &line[..60.min(line.len())]
        );
    }
    hub.shutdown().await;
}

/// Red-team finding: a stdio server that exited while something it started still held its
/// stdout open (a helper, a daemon, `cmd &` in a launcher) was never seen to stop: the call
/// it was answering and every later call waited for their timeouts, and the server was never
/// started again.
#[tokio::test]
async fn a_server_that_exits_while_its_child_holds_stdout_is_seen_to_stop() {
    let launcher = format!("sleep 300 & exec node {FIXTURE}");
    let hub = hub(json!({"leaky": {"command": "sh", "args": ["-c", launcher]}})).await;
    let first = run(&hub, "mcp__leaky__pid", json!({})).await;
    let exit = find(&hub, "mcp__leaky__exit");
    let err = tokio::time::timeout(
        Duration::from_secs(30),
        exit.call(ToolCall {
            args: json!({}),
            provenance: Provenance::model("c3", "s1"),
            cancel: CancellationToken::new(),
        }),
    )
    .await
    .expect("the call fails when the server exits, not at its timeout")
    .unwrap_err();
    assert!(err.message.contains("closed the connection"), "{err}");
    let second = run(&hub, "mcp__leaky__pid", json!({})).await;
    assert_ne!(first, second, "a new process answers");
    hub.shutdown().await;
}

/// The process's resident memory, from `/proc/self/status`.
fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .expect("a VmRSS line");
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .expect("VmRSS in kB");
    kib * 1024
}

/// Red-team finding: rmcp answers every request a server sends (a `ping`) and keeps each answer
/// in memory until it can be written; a server that sent requests and never read its stdin
/// made the host hold every answer, as much memory as the server cared to send. A server that
/// stops reading is broken: it is closed, and the next call starts it again.
#[tokio::test]
async fn a_server_that_floods_requests_and_never_reads_the_answers_is_restarted_not_hoarded() {
    let hub = hub(json!({"deaf": server()})).await;
    let first_pid = run(&hub, "mcp__deaf__pid", json!({})).await;
    let before = resident_bytes();
    // 3,000 answers of 100 KB each: 300 MB held if nothing bounds them.
    let flood = tokio::time::timeout(
        Duration::from_secs(300),
        find(&hub, "mcp__deaf__deaf_flood").call(ToolCall {
            args: json!({"count": 3000, "idBytes": 100_000}),
            provenance: Provenance::model("c3", "s1"),
            cancel: CancellationToken::new(),
        }),
    )
    .await
    .expect("the flood call ends within 300 s");
    let grown = resident_bytes().saturating_sub(before);
    assert!(
        grown < 200 * 1024 * 1024,
        "the host grew by {} MB holding answers for a server that reads none (the call: {:?})",
        grown / (1024 * 1024),
        flood.map(|o| o.value)
    );
    let error = flood.expect_err("a server that reads nothing cannot be answered");
    assert!(
        error.message.contains("stopped reading"),
        "the error does not say what the server did: {}",
        error.message
    );
    // The broken server is replaced: a later call reaches a new process.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let pid = tokio::time::timeout(
            Duration::from_secs(60),
            find(&hub, "mcp__deaf__pid").call(ToolCall {
                args: json!({}),
                provenance: Provenance::model("c4", "s1"),
                cancel: CancellationToken::new(),
            }),
        )
        .await
        .expect("the call answers within 60 s");
        if let Ok(out) = pid {
            let pid = out.value["content"][0]["text"].as_str().unwrap_or_default();
            assert_ne!(pid, first_pid, "the deaf server was never restarted");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the server never came back: {pid:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    hub.shutdown().await;
}

/// Red-team finding: a server's `notifications/message` went to the host's log whole (up to
/// 16 MiB a line) and at error level, as often as the server sent one: a server could fill the
/// log, or the disk under it. What is logged is cut per message and limited per second, and
/// says how much was left out.
#[tokio::test]
async fn a_flood_of_huge_server_log_messages_is_cut_and_thinned_in_the_host_log() {
    let log = CapturedLog::default();
    let _default = log.install();
    let hub = hub(json!({"loud": server()})).await;
    // Messages of 1 MB: each is cut. Then 2,000 small ones: far more than 20 a second however
    // slowly a loaded machine reads them, so some are dropped.
    for (count, bytes) in [(5, 1_000_000), (2_000, 100)] {
        assert_eq!(
            run(
                &hub,
                "mcp__loud__loud_log",
                json!({"count": count, "bytes": bytes})
            )
            .await,
            "logged"
        );
    }
    // The next message comes after the burst's second: it reports what was dropped.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        run(
            &hub,
            "mcp__loud__loud_log",
            json!({"count": 1, "bytes": 10})
        )
        .await,
        "logged"
    );
    let text = log.text();
    assert!(
        text.len() < 1024 * 1024,
        "2,006 server log messages wrote {} MB to the host's log",
        text.len() / (1024 * 1024)
    );
    assert!(text.contains("bytes cut"), "a cut message does not say so");
    assert!(
        text.contains("dropped"),
        "the log does not say that messages were dropped"
    );
    hub.shutdown().await;
}

/// Red team: each request a server made of the client (sampling, elicitation, roots), refused,
/// was one warning in the host's log, unthrottled: 96,803 lines in 3 s from one server. They
/// are limited per second as the server's log messages are, and the log says how many it left
/// out.
#[tokio::test]
async fn a_flood_of_refused_server_requests_is_thinned_in_the_host_log() {
    let log = CapturedLog::default();
    let _default = log.install();
    let hub = hub(json!({"asker": server()})).await;
    assert_eq!(
        run(&hub, "mcp__asker__ask_flood", json!({"count": 2000})).await,
        "asked"
    );
    // A request after the burst's second reports what was left out.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        run(&hub, "mcp__asker__ask_flood", json!({"count": 1})).await,
        "asked"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let text = log.text();
    let logged = text.matches("MCP server request refused").count();
    assert!(
        (1..=100).contains(&logged),
        "2,001 refused requests wrote {logged} lines to the host's log"
    );
    assert!(
        text.contains("not logged"),
        "the log does not say what it left out"
    );
    hub.shutdown().await;
}

/// Red-team finding: each progress notification restarted a call's timeout and nothing else
/// ended it, so a server that reported progress forever held a call (and a direct model call,
/// which has no script deadline) open for good. A call ends after 10 times its server's
/// timeout however much progress it reports, with an error naming that limit.
#[tokio::test]
async fn a_call_kept_alive_by_endless_progress_ends_at_its_total_limit() {
    let config =
        McpConfig::from_json(&json!({ "mcpServers": {"busy": server()} }), "test").unwrap();
    let opts = ConnectOptions {
        call_timeout: Duration::from_secs(1),
        ..Default::default()
    };
    let hub = McpHub::connect(&config, opts).await;
    let started = std::time::Instant::now();
    let outcome = tokio::time::timeout(
        Duration::from_secs(120),
        find(&hub, "mcp__busy__endless").call(ToolCall {
            args: json!({"everyMs": 200}),
            provenance: Provenance::model("c5", "s1"),
            cancel: CancellationToken::new(),
        }),
    )
    .await
    .expect("a call that reports progress forever still ends (here after 10 s)");
    let error = outcome.expect_err("the server never answers");
    assert!(
        started.elapsed() >= Duration::from_secs(9),
        "the call ended before its total limit: {}",
        error.message
    );
    assert!(
        error.message.contains("10 s in all"),
        "the error does not name the total limit: {}",
        error.message
    );
    hub.shutdown().await;
}
