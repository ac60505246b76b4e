//! The client against real MCP servers: the npm servers of the testbed and a misbehaving fixture.

mod common;

use std::sync::Arc;
use std::time::Duration;

use codemode_mcp::{ConnectOptions, McpConfig, McpHub, ServerState};
use codemode_spec::{
    ContentBlock, Exposure, Provenance, Tool, ToolCall, ToolError, ToolErrorKind, ToolOutput,
};
use common::find;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const TESTBED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testbed/node_modules");
const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/misbehaving-server.cjs"
);

fn everything() -> String {
    format!("{TESTBED}/@modelcontextprotocol/server-everything/dist/index.js")
}

fn fixture(extra: &[&str]) -> Value {
    let mut args = vec![json!(FIXTURE), json!(TESTBED)];
    args.extend(extra.iter().map(|a| json!(a)));
    json!({"command": "node", "args": args})
}

fn config(servers: Value) -> McpConfig {
    McpConfig::from_json(&json!({ "mcpServers": servers }), "test").unwrap()
}

async fn hub(servers: Value) -> McpHub {
    McpHub::connect(&config(servers), ConnectOptions::default()).await
}

/// A loopback port nothing listens on now.
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// Waits (up to 60 s: a loaded 2-core machine starts node slowly) until something listens on
/// `port`, and fails the test if nothing does.
async fn wait_listening(port: u16) {
    for _ in 0..600 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("nothing listens on port {port} after 60 s");
}

/// A hub whose calls time out far beyond any test's own limit: a call that waits for its
/// timeout fails the test instead of passing late.
async fn patient_hub(servers: Value) -> McpHub {
    let opts = ConnectOptions {
        call_timeout: Duration::from_secs(600),
        ..Default::default()
    };
    McpHub::connect(&config(servers), opts).await
}

fn call_with(args: Value, cancel: CancellationToken) -> ToolCall {
    ToolCall {
        args,
        provenance: Provenance::model("c1", "s1"),
        cancel,
    }
}

fn call(args: Value) -> ToolCall {
    call_with(args, CancellationToken::new())
}

fn text_of(v: &Value) -> String {
    v["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn everything_server_lists_and_echoes() {
    let hub = hub(json!({"everything": {"command": "node", "args": [everything()]}})).await;
    assert!(
        matches!(hub.status()[0].state, ServerState::Connected { tools } if tools >= 10),
        "{:?}",
        hub.status()
    );
    let echo = find(&hub, "mcp__everything__echo");
    assert_eq!(echo.spec().namespace.as_deref(), Some("mcp__everything"));
    assert_eq!(echo.spec().exposure, Exposure::Codemode);
    assert_eq!(echo.spec().input_schema.value()["type"], json!("object"));
    let out = echo.call(call(json!({"message": "hi"}))).await.unwrap();
    assert_eq!(text_of(&out.value), "Echo: hi");
    assert!(!out.is_error);
    // Names are sanitized: `get-sum` → `get_sum`.
    let sum = find(&hub, "mcp__everything__get_sum");
    let out = sum.call(call(json!({"a": 2, "b": 3}))).await.unwrap();
    assert!(text_of(&out.value).contains('5'), "{}", out.value);
    let ns = hub.namespaces();
    assert_eq!(ns[0].name, "mcp__everything");
    assert!(
        ns[0].instructions.is_some(),
        "server-everything sends instructions"
    );
    hub.shutdown().await;
}

#[tokio::test]
async fn images_reach_the_script_and_the_model() {
    let hub = hub(json!({"everything": {"command": "node", "args": [everything()]}})).await;
    let tool = find(&hub, "mcp__everything__get_tiny_image");
    let out = tool.call(call(json!({}))).await.unwrap();
    let image = out.value["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "image")
        .expect("an image block for the script");
    assert_eq!(image["mimeType"], json!("image/png"));
    assert!(image["data"].as_str().unwrap().len() > 100);
    let blocks = out.content.unwrap();
    assert!(
        blocks.iter().any(
            |b| matches!(b, ContentBlock::Image { mime_type, .. } if mime_type == "image/png")
        )
    );
    hub.shutdown().await;
}

#[tokio::test]
async fn annotations_pagination_and_structured_results() {
    let hub = hub(json!({"bad": fixture(&[])})).await;
    // The fixture lists 3 tools per page; all 16 must arrive.
    assert_eq!(hub.tools().len(), 16, "{:?}", hub.status());
    let echo = find(&hub, "mcp__bad__echo");
    assert_eq!(echo.spec().annotations.read_only_hint, Some(true));
    assert_eq!(echo.spec().annotations.open_world_hint, Some(false));
    let structured = find(&hub, "mcp__bad__structured");
    assert_eq!(
        structured.spec().output_schema.as_ref().unwrap().value()["properties"]["structuredContent"]
            ["required"],
        json!(["n"])
    );
    let out = structured.call(call(json!({}))).await.unwrap();
    assert_eq!(out.value["structuredContent"], json!({"n": 7}));
    assert_eq!(
        hub.namespaces()[0].instructions.as_deref(),
        Some("A server for tests.")
    );
    hub.shutdown().await;
}

#[tokio::test]
async fn is_error_results_resolve_with_is_error() {
    let hub = hub(json!({"bad": fixture(&[])})).await;
    let fail = find(&hub, "mcp__bad__fail");
    let out = fail.call(call(json!({"text": "bad"}))).await.unwrap();
    assert!(out.is_error);
    assert_eq!(out.value["isError"], json!(true));
    assert_eq!(text_of(&out.value), "bad");
    let out = fail.call(call(json!({}))).await.unwrap();
    assert_eq!(
        out.content.unwrap(),
        vec![ContentBlock::Text {
            text: "MCP tool bad/fail returned an error".into()
        }]
    );
    let err = fail.call(call(json!([1]))).await.unwrap_err();
    assert_eq!(err.kind, ToolErrorKind::InvalidArguments);
    hub.shutdown().await;
}

#[tokio::test]
async fn exposure_config_sets_the_spec_and_hides_tools() {
    let mut server = fixture(&[]);
    server["exposure"] = json!("deferred");
    server["toolExposure"] = json!({"echo": "direct", "hang": "hidden", "s*": "codemode"});
    let hub = hub(json!({ "bad": server })).await;
    assert_eq!(
        find(&hub, "mcp__bad__echo").spec().exposure,
        Exposure::Direct
    );
    assert_eq!(
        find(&hub, "mcp__bad__slow_progress").spec().exposure,
        Exposure::Codemode
    );
    assert_eq!(
        find(&hub, "mcp__bad__pid").spec().exposure,
        Exposure::Deferred
    );
    assert_eq!(
        find(&hub, "mcp__bad__hang").spec().exposure,
        Exposure::Hidden,
        "hidden tools are offered as hidden, so the gate refuses them by name"
    );
    hub.shutdown().await;
}

#[tokio::test]
async fn failures_to_start_are_recorded_per_server_never_fatal() {
    let hub = McpHub::connect(
        &config(json!({
            "ok": fixture(&[]),
            "exits": fixture(&["exit"]),
            "missing": {"command": "/nonexistent/codemode-test-binary"},
            "needs_var": {"command": "node", "args": [FIXTURE, TESTBED],
                          "env": {"X": "${CODEMODE_TEST_SURELY_UNSET_VAR}"}},
            "silent": {"command": "sleep", "args": ["30"]}
        })),
        ConnectOptions {
            connect_timeout: Duration::from_secs(5),
            ..Default::default()
        },
    )
    .await;
    let status = hub.status();
    let state = |n: &str| status.iter().find(|s| s.name == n).unwrap().state.clone();
    assert!(matches!(state("ok"), ServerState::Connected { .. }));
    let ServerState::Failed(reason) = state("exits") else {
        panic!()
    };
    assert!(
        reason.contains("refusing to start on purpose"),
        "stderr is in the reason: {reason}"
    );
    let ServerState::Failed(reason) = state("missing") else {
        panic!()
    };
    assert!(reason.contains("cannot start"), "{reason}");
    let ServerState::Failed(reason) = state("needs_var") else {
        panic!()
    };
    assert!(
        reason.contains("CODEMODE_TEST_SURELY_UNSET_VAR"),
        "{reason}"
    );
    let ServerState::Failed(reason) = state("silent") else {
        panic!()
    };
    assert!(reason.contains("within 5 s"), "{reason}");
    assert!(
        hub.tools()
            .iter()
            .all(|t| t.spec().namespace.as_deref() == Some("mcp__ok"))
    );
    hub.shutdown().await;
}

#[tokio::test]
async fn env_values_expand_variables() {
    // HOME is always set; the test does not write the environment (not thread-safe).
    let home = std::env::var("HOME").unwrap();
    let mut server = fixture(&[]);
    server["env"] = json!({"GREETING": "say ${HOME}"});
    let hub = hub(json!({ "bad": server })).await;
    let out = find(&hub, "mcp__bad__env")
        .call(call(json!({"name": "GREETING"})))
        .await
        .unwrap();
    assert_eq!(text_of(&out.value), format!("say {home}"));
    hub.shutdown().await;
}

#[tokio::test]
async fn a_call_that_never_answers_times_out_and_is_cancelled_upstream() {
    let hub = McpHub::connect(
        &config(json!({"bad": fixture(&[])})),
        ConnectOptions {
            call_timeout: Duration::from_millis(500),
            ..Default::default()
        },
    )
    .await;
    let err = find(&hub, "mcp__bad__hang")
        .call(call(json!({})))
        .await
        .unwrap_err();
    assert_eq!(err.kind, ToolErrorKind::Timeout, "{err}");
    assert!(err.message.contains("did not answer"), "{err}");
    let count = find(&hub, "mcp__bad__cancelled_count")
        .call(call(json!({})))
        .await
        .unwrap();
    assert_eq!(text_of(&count.value), "1", "the server was told to stop");
    hub.shutdown().await;
}

#[tokio::test]
async fn progress_notifications_extend_the_timeout() {
    let hub = McpHub::connect(
        &config(json!({"bad": fixture(&[])})),
        ConnectOptions {
            call_timeout: Duration::from_millis(1500),
            ..Default::default()
        },
    )
    .await;
    // 8 steps of 400 ms = 3.2 s in total, more than twice the timeout, but never 1.5 s silent.
    let out = find(&hub, "mcp__bad__slow_progress")
        .call(call(json!({"steps": 8, "interval": 400})))
        .await
        .unwrap();
    assert_eq!(text_of(&out.value), "done after 8 steps");
    hub.shutdown().await;
}

#[tokio::test]
async fn cancelling_a_call_cancels_the_request() {
    let hub = hub(json!({"bad": fixture(&[])})).await;
    let cancel = CancellationToken::new();
    let hang = find(&hub, "mcp__bad__hang");
    let pending = tokio::spawn(hang.call(call_with(json!({}), cancel.clone())));
    tokio::time::sleep(Duration::from_millis(300)).await;
    cancel.cancel();
    let err = tokio::time::timeout(Duration::from_secs(5), pending)
        .await
        .expect("cancel ends the call promptly")
        .unwrap()
        .unwrap_err();
    assert_eq!(err.kind, ToolErrorKind::Cancelled);
    let count = find(&hub, "mcp__bad__cancelled_count")
        .call(call(json!({})))
        .await
        .unwrap();
    assert_eq!(text_of(&count.value), "1");
    hub.shutdown().await;
}

#[tokio::test]
async fn a_server_that_dies_mid_call_is_restarted_by_the_next_call() {
    let hub = hub(json!({"bad": fixture(&[])})).await;
    let pid = find(&hub, "mcp__bad__pid");
    let first = text_of(&pid.call(call(json!({}))).await.unwrap().value);
    let err = find(&hub, "mcp__bad__die")
        .call(call(json!({})))
        .await
        .unwrap_err();
    assert!(err.message.contains("closed the connection"), "{err}");
    let second = text_of(&pid.call(call(json!({}))).await.unwrap().value);
    assert_ne!(first, second, "a new process answers");
    assert!(matches!(
        hub.status()[0].state,
        ServerState::Connected { .. }
    ));
    hub.shutdown().await;
}

#[tokio::test]
async fn malformed_output_is_skipped() {
    let hub = hub(json!({"bad": fixture(&[])})).await;
    let out = find(&hub, "mcp__bad__malformed")
        .call(call(json!({})))
        .await
        .unwrap();
    assert_eq!(text_of(&out.value), "answered after garbage");
    let out = find(&hub, "mcp__bad__echo")
        .call(call(json!({"text": "still fine"})))
        .await
        .unwrap();
    assert_eq!(text_of(&out.value), "Echo: still fine");
    hub.shutdown().await;
}

/// A server whose tool list never ends (every page names a next one) used to keep the host
/// listing and growing until it was killed. The listing stops at 5,000 tools, the server is
/// connected with those, and a second server beside it is unaffected.
#[tokio::test]
async fn a_tool_list_that_never_ends_is_cut_and_the_host_carries_on() {
    let hub = tokio::time::timeout(
        Duration::from_secs(120),
        hub(json!({"endless": fixture(&["endless"]), "fine": fixture(&[])})),
    )
    .await
    .expect("connecting ends");
    let status = hub.status();
    assert!(
        status
            .iter()
            .all(|s| matches!(s.state, ServerState::Connected { .. })),
        "{status:?}"
    );
    let tools = hub.tools();
    let endless = tools
        .iter()
        .filter(|t| t.spec().name.starts_with("mcp__endless__"))
        .count();
    assert_eq!(endless, 5_000);
    assert!(tools.iter().any(|t| t.spec().name == "mcp__endless__t4999"));
    let out = find(&hub, "mcp__fine__echo")
        .call(call(json!({"text": "beside"})))
        .await
        .unwrap();
    assert_eq!(text_of(&out.value), "Echo: beside");
    hub.shutdown().await;
}

#[tokio::test]
async fn a_ten_megabyte_result_arrives_whole() {
    let hub = hub(json!({"bad": fixture(&[])})).await;
    let out = find(&hub, "mcp__bad__big")
        .call(call(json!({})))
        .await
        .unwrap();
    assert_eq!(text_of(&out.value).len(), 10 * 1024 * 1024);
    hub.shutdown().await;
}

/// rmcp drops a line over its limit, or one too deep for serde_json, and the call used to wait
/// for its timeout. It fails at once with what was wrong, and the connection stays usable.
#[tokio::test]
async fn an_oversized_or_too_deep_response_fails_its_call_at_once() {
    let hub = patient_hub(json!({"bad": fixture(&[])})).await;
    let big = find(&hub, "mcp__bad__big");
    let started = std::time::Instant::now();
    let err = tokio::time::timeout(
        Duration::from_secs(60),
        big.call(call(json!({"bytes": 17 * 1024 * 1024}))),
    )
    .await
    .expect("the call fails without waiting for the timeout")
    .unwrap_err();
    assert_eq!(err.kind, ToolErrorKind::Failed, "{err:?}");
    assert!(
        err.message.contains("larger than 16 MiB"),
        "the limit is named: {}",
        err.message
    );
    assert!(err.message.contains("bad/big"), "{}", err.message);
    let deep = find(&hub, "mcp__bad__deep");
    let err = tokio::time::timeout(
        Duration::from_secs(60),
        deep.call(call(json!({"levels": 130}))),
    )
    .await
    .expect("the call fails without waiting for the timeout")
    .unwrap_err();
    assert!(
        err.message.contains("levels deep") && err.message.contains("127"),
        "{}",
        err.message
    );
    // Within the limits all is well, on the same connection.
    let pid = find(&hub, "mcp__bad__pid");
    let before = text_of(&pid.call(call(json!({}))).await.unwrap().value);
    let out = deep.call(call(json!({"levels": 100}))).await.unwrap();
    assert!(out.value["structuredContent"]["d"]["d"].is_object());
    let out = big.call(call(json!({"bytes": 1000}))).await.unwrap();
    assert_eq!(text_of(&out.value).len(), 1000);
    assert_eq!(
        text_of(&pid.call(call(json!({}))).await.unwrap().value),
        before
    );
    eprintln!("both refusals and the checks took {:?}", started.elapsed());
    hub.shutdown().await;
}

/// A line with a request's id that rmcp cannot read as a response (cut-off JSON, no `result`
/// or `error`, an `error` that is not an object, another JSON-RPC version) was dropped, and the
/// call waited for its timeout. It fails at once, saying what was wrong, and the connection
/// stays usable.
#[tokio::test]
async fn a_response_rmcp_cannot_read_fails_its_call_at_once() {
    let hub = patient_hub(json!({"bad": fixture(&[])})).await;
    let broken = find(&hub, "mcp__bad__broken_answer");
    for how in ["syntax", "envelope", "error", "version"] {
        let err = tokio::time::timeout(
            Duration::from_secs(30),
            broken.call(call(json!({"how": how}))),
        )
        .await
        .unwrap_or_else(|_| panic!("{how}: the call fails without waiting for the timeout"))
        .unwrap_err();
        assert_eq!(err.kind, ToolErrorKind::Failed, "{how}: {err:?}");
        assert!(
            err.message
                .contains("not a JSON-RPC response codemode can read"),
            "{how}: {}",
            err.message
        );
        assert!(err.message.contains("bad/broken_answer"), "{}", err.message);
    }
    let out = find(&hub, "mcp__bad__echo")
        .call(call(json!({"text": "after"})))
        .await
        .unwrap();
    assert_eq!(text_of(&out.value), "Echo: after");
    hub.shutdown().await;
}

/// A response past 16 MiB whose newline never came held its call until its timeout (ten
/// minutes here). It is refused once the bound is passed and its id is known.
#[tokio::test]
async fn an_oversized_response_without_its_newline_fails_its_call_at_once() {
    let hub = patient_hub(json!({"bad": fixture(&[])})).await;
    let err = tokio::time::timeout(
        Duration::from_secs(60),
        find(&hub, "mcp__bad__broken_answer").call(call(json!({"how": "unended"}))),
    )
    .await
    .expect("the call fails without waiting for the newline")
    .unwrap_err();
    assert_eq!(err.kind, ToolErrorKind::Failed, "{err:?}");
    assert!(
        err.message.contains("larger than 16 MiB"),
        "{}",
        err.message
    );
    hub.shutdown().await;
}

#[tokio::test]
async fn list_changed_refreshes_the_tools() {
    let hub = hub(json!({"bad": fixture(&[])})).await;
    let mut changed = hub.on_tools_changed();
    changed.mark_unchanged();
    assert!(
        hub.tools()
            .iter()
            .all(|t| t.spec().name != "mcp__bad__extra")
    );
    find(&hub, "mcp__bad__add_tool")
        .call(call(json!({})))
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), changed.changed())
        .await
        .expect("the hub reports the change")
        .unwrap();
    let out = find(&hub, "mcp__bad__extra")
        .call(call(json!({})))
        .await
        .unwrap();
    assert_eq!(text_of(&out.value), "extra works");
    hub.shutdown().await;
}

#[tokio::test]
async fn fifty_concurrent_calls() {
    let hub = hub(json!({"bad": fixture(&[])})).await;
    let echo = find(&hub, "mcp__bad__echo");
    let calls = (0..50).map(|i| echo.call(call(json!({"text": format!("n{i}")}))));
    let results = futures::future::join_all(calls).await;
    for (i, r) in results.into_iter().enumerate() {
        assert_eq!(text_of(&r.unwrap().value), format!("Echo: n{i}"));
    }
    hub.shutdown().await;
}

#[tokio::test]
async fn filesystem_and_memory_servers() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("note.txt"), "hello from a file").unwrap();
    let hub = hub(json!({
        "fs": {"command": "node", "args": [
            format!("{TESTBED}/@modelcontextprotocol/server-filesystem/dist/index.js"),
            dir.path().to_str().unwrap()]},
        "memory": {"command": "node",
                   "args": [format!("{TESTBED}/@modelcontextprotocol/server-memory/dist/index.js")],
                   "env": {"MEMORY_FILE_PATH": dir.path().join("mem.jsonl").to_str().unwrap()}}
    }))
    .await;
    let out = find(&hub, "mcp__fs__read_text_file")
        .call(call(json!({"path": dir.path().join("note.txt")})))
        .await
        .unwrap();
    assert_eq!(text_of(&out.value), "hello from a file");
    find(&hub, "mcp__memory__create_entities")
        .call(call(json!({"entities": [{"name": "note", "entityType": "file", "observations": ["says hello"]}]})))
        .await
        .unwrap();
    let graph = find(&hub, "mcp__memory__read_graph")
        .call(call(json!({})))
        .await
        .unwrap();
    assert!(
        graph.value.to_string().contains("says hello"),
        "{}",
        graph.value
    );
    hub.shutdown().await;
}

#[tokio::test]
async fn streamable_http_server_with_headers() {
    let port = free_port();
    let mut child = tokio::process::Command::new("node")
        .arg(everything())
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stderr(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    wait_listening(port).await;
    let hub = hub(json!({"web": {
        "url": format!("http://127.0.0.1:{port}/mcp"),
        "headers": {"Authorization": "Bearer ${HOME}"}
    }}))
    .await;
    assert!(
        matches!(hub.status()[0].state, ServerState::Connected { .. }),
        "{:?}",
        hub.status()
    );
    let out = find(&hub, "mcp__web__echo")
        .call(call(json!({"message": "over http"})))
        .await
        .unwrap();
    assert_eq!(text_of(&out.value), "Echo: over http");
    hub.shutdown().await;
    child.kill().await.unwrap();
}

/// The hostile HTTP fixture, and a patient hub connected to it as server `web`. The server
/// picks its own port and names it: no other process can take it between a test's choice and
/// the server's bind.
async fn hostile_http_hub() -> (tokio::process::Child, McpHub) {
    let mut child = tokio::process::Command::new("node")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/hostile-http-server.cjs"
        ))
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut first = String::new();
    let stdout = child.stdout.take().unwrap();
    tokio::time::timeout(
        Duration::from_secs(60),
        tokio::io::AsyncBufReadExt::read_line(&mut tokio::io::BufReader::new(stdout), &mut first),
    )
    .await
    .expect("the hostile server names its port within 60 s")
    .unwrap();
    let port: u16 = first.trim().parse().expect("a port number");
    let hub = patient_hub(json!({"web": {"url": format!("http://127.0.0.1:{port}/mcp")}})).await;
    (child, hub)
}

/// A burst on one session: refused answers (past the values bound, and unreadable ones for
/// another request) in parallel with ordinary calls. Each call gets its own outcome, the
/// ordinary ones their own text, and the session is the one it began as.
#[tokio::test]
async fn a_burst_of_refused_and_ordinary_http_answers_keeps_each_call_its_own() {
    let (mut child, hub) = hostile_http_hub().await;
    async fn outcome(
        tool: Arc<dyn Tool>,
        name: &'static str,
        text: String,
    ) -> (&'static str, String, Result<ToolOutput, ToolError>) {
        let out = tool.call(call(json!({"text": text.clone()}))).await;
        (name, text, out)
    }
    let mut calls = Vec::new();
    for i in 0..8 {
        for as_ in ["json", "sse"] {
            for name in ["wide", "surrogate", "echo"] {
                let tool = find(&hub, &format!("mcp__web__{name}_{as_}"));
                calls.push(outcome(tool, name, format!("{name} {as_} {i}")));
            }
        }
        let tool = find(&hub, "mcp__web__detour_sse");
        calls.push(outcome(tool, "detour", String::new()));
    }
    let outcomes = tokio::time::timeout(Duration::from_secs(120), futures::future::join_all(calls))
        .await
        .expect("no call waits for its timeout");
    for (name, text, out) in outcomes {
        match name {
            "echo" => assert_eq!(text_of(&out.unwrap().value), format!("Echo: {text}")),
            "detour" => assert_eq!(text_of(&out.unwrap().value), "Echo: detour"),
            "wide" => {
                let err = out.unwrap_err();
                assert!(
                    err.message.contains("more than 1048576 JSON values"),
                    "{}",
                    err.message
                );
            }
            _ => {
                let err = out.unwrap_err();
                assert!(
                    err.message
                        .contains("not a JSON-RPC response codemode can read"),
                    "{}",
                    err.message
                );
            }
        }
    }
    let count = find(&hub, "mcp__web__initialized_json")
        .call(call(json!({})))
        .await
        .unwrap();
    assert_eq!(text_of(&count.value), "Initialized: 1");
    hub.shutdown().await;
    child.kill().await.unwrap();
}

/// The HTTP transport's side of the stdio limits: a response over 16 MiB (ended or not), nested
/// past serde's limit, of more JSON values than codemode reads (15 MiB of `[0,0,…]`, which would
/// cost the host about a gigabyte to parse; also with its id padded out of reach, spelled with
/// escapes, or never ended), not JSON-RPC 2.0, without `result` or `error`, or an HTTP failure
/// whose error names no request, as a JSON body or as an SSE event, fails its call at once (not
/// at its timeout) with what was wrong, and the session goes on: the next call on it works, and
/// the server saw one `initialize`.
#[tokio::test]
async fn an_http_server_oversized_too_deep_or_unreadable_response_fails_its_call_at_once() {
    let (mut child, hub) = hostile_http_hub().await;
    assert!(
        matches!(hub.status()[0].state, ServerState::Connected { .. }),
        "{:?}",
        hub.status()
    );
    for as_ in ["json", "sse"] {
        for (what, says) in [
            ("big", "larger than 16 MiB"),
            ("endless", "larger than 16 MiB"),
            ("deep", "levels deep, more than the 127 levels"),
            ("wide", "more than 1048576 JSON values"),
            ("broken", "not a JSON-RPC response codemode can read"),
            ("version", "not a JSON-RPC response codemode can read"),
            ("padded", "more than 1048576 JSON values"),
            ("escaped", "more than 1048576 JSON values"),
            ("stalled", "more than 1048576 JSON values"),
            (
                "failed",
                "HTTP 500 Internal Server Error: upstream database is down",
            ),
            (
                "nameless",
                "an error that names no request: Parse error from server",
            ),
            ("surrogate", "not a JSON-RPC response codemode can read"),
        ] {
            let name = format!("mcp__web__{what}_{as_}");
            let started = std::time::Instant::now();
            let err = tokio::time::timeout(
                Duration::from_secs(30),
                find(&hub, &name).call(call(json!({}))),
            )
            .await
            .unwrap_or_else(|_| panic!("{name}: the call fails without waiting for its timeout"))
            .unwrap_err();
            assert!(started.elapsed() < Duration::from_secs(20), "{name}");
            assert_eq!(err.kind, ToolErrorKind::Failed, "{name}: {err:?}");
            assert!(err.message.contains(says), "{name}: {}", err.message);
            let echo = find(&hub, &format!("mcp__web__echo_{as_}"))
                .call(call(json!({"text": "after"})))
                .await
                .unwrap_or_else(|e| panic!("after {name}: {e:?}"));
            assert_eq!(text_of(&echo.value), "Echo: after");
        }
    }
    // An unreadable answer for another request, then this one's: the real answer arrives.
    let detour = tokio::time::timeout(
        Duration::from_secs(30),
        find(&hub, "mcp__web__detour_sse").call(call(json!({}))),
    )
    .await
    .expect("the real answer is read")
    .unwrap();
    assert_eq!(text_of(&detour.value), "Echo: detour");
    let count = find(&hub, "mcp__web__initialized_json")
        .call(call(json!({})))
        .await
        .unwrap();
    assert_eq!(
        text_of(&count.value),
        "Initialized: 1",
        "no refused answer cost the session"
    );
    hub.shutdown().await;
    child.kill().await.unwrap();
}

#[tokio::test]
async fn shutting_down_stops_what_a_stdio_server_started() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("child.pid");
    // Like `npx`: the server runs beside a child of its launcher.
    let launcher = format!(
        "sleep 300 & echo $! > {}; exec node {FIXTURE} {TESTBED}",
        pidfile.display()
    );
    let hub = hub(json!({"bad": {"command": "sh", "args": ["-c", launcher]}})).await;
    assert!(
        matches!(hub.status()[0].state, ServerState::Connected { .. }),
        "{:?}",
        hub.status()
    );
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let alive = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| !s.contains(") Z "))
            .unwrap_or(false)
    };
    assert!(
        alive(pid),
        "the launcher's child runs while the server does"
    );
    hub.shutdown().await;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while alive(pid) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!alive(pid), "the server's process group is stopped with it");
}

#[tokio::test]
async fn a_server_that_failed_to_start_is_tried_again_and_its_tools_arrive() {
    let dir = tempfile::tempdir().unwrap();
    let flag = dir.path().join("ready");
    let launcher = format!(
        "test -f {} || exit 3; exec node {FIXTURE} {TESTBED}",
        flag.display()
    );
    let hub = McpHub::connect(
        &config(json!({"late": {"command": "sh", "args": ["-c", launcher]}})),
        ConnectOptions {
            retry_after: Some(Duration::from_millis(200)),
            ..Default::default()
        },
    )
    .await;
    assert!(
        matches!(hub.status()[0].state, ServerState::Failed(_)),
        "{:?}",
        hub.status()
    );
    assert!(hub.tools().is_empty());
    let mut changes = hub.on_tools_changed();
    std::fs::write(&flag, "").unwrap();
    tokio::time::timeout(Duration::from_secs(10), changes.changed())
        .await
        .expect("the late server's tools are announced")
        .unwrap();
    assert!(
        matches!(hub.status()[0].state, ServerState::Connected { .. }),
        "{:?}",
        hub.status()
    );
    let echo = find(&hub, "mcp__late__echo");
    let out = echo.call(call(json!({"text": "back"}))).await.unwrap();
    assert!(text_of(&out.value).contains("back"), "{}", out.value);
    hub.shutdown().await;
}

/// Red-team finding: a token in a server's URL, or an environment value a failing server
/// printed, reached the codemode description and scripts through "not available" texts.
#[tokio::test]
async fn what_a_down_server_says_holds_none_of_its_secrets() {
    let port = free_port();
    let hub = hub(json!({
        "remote": {"url": format!("http://user1:MCPSECRET@127.0.0.1:{port}/mcp?key=QSECRET")},
        "local": {"command": "sh", "args": ["-c", "echo token is $T >&2; exit 3"],
                  "env": {"T": "tok_ARGSECRET"}}
    }))
    .await;
    let mut shown: Vec<String> = hub.unavailable().into_iter().map(|(_, t)| t).collect();
    shown.extend(hub.namespaces().into_iter().filter_map(|n| n.unavailable));
    shown.extend(hub.status().into_iter().map(|s| format!("{:?}", s.state)));
    assert!(shown.len() >= 4, "{shown:?}");
    let all = shown.join("\n");
    for secret in ["MCPSECRET", "QSECRET", "tok_ARGSECRET"] {
        assert!(!all.contains(secret), "{secret} is shown:\n{all}");
    }
    assert!(all.contains("token is [redacted]"), "{all}");
    hub.shutdown().await;
}
