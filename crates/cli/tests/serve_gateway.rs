//! `codemode serve` as a gateway people run all day, driven by the official MCP SDK client in
//! Node against the real npm servers and the misbehaving fixture server (issue 13).

use crate::common;
use common::testbed;

use std::process::Command;

use serde_json::{Value, json};

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../mcp/tests/fixtures/misbehaving-server.cjs"
);
const CLIENT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/gateway-client.cjs"
);

/// Every MCP tool may run; other tools need nothing here.
const PERMIT_MCP: &str = "@id(\"mcp-servers\")\npermit (principal, action == Action::\"tool_call\", resource)\nwhen { resource.namespace like \"mcp__*\" };\n";

/// The default policy this issue asks for: read-only tools run, other MCP tools ask.
const ASK_MCP: &str = r#"
@id("read-only-tools")
permit (principal, action == Action::"tool_call", resource) when { resource.read_only };
@id("ask-mcp-tools")
@ask("this MCP tool is not marked read-only")
permit (principal, action == Action::"tool_call", resource)
when { resource.namespace like "mcp__*" && !resource.read_only };
"#;

struct Serve {
    config: tempfile::TempDir,
    args: Vec<String>,
}

/// `codemode serve` over stdio with these servers and this policy; `extra` are more flags.
fn serve(servers: Value, policy: &str, extra: &[&str]) -> Serve {
    let config = tempfile::tempdir().unwrap();
    std::fs::write(
        config.path().join("mcp.json"),
        json!({ "mcpServers": servers }).to_string(),
    )
    .unwrap();
    let policy_file = config.path().join("policy.cedar");
    std::fs::write(&policy_file, policy).unwrap();
    let mut args: Vec<String> = vec![
        "serve".into(),
        "--no-builtins".into(),
        "--config-dir".into(),
        config.path().display().to_string(),
        "--state-dir".into(),
        config.path().join("state").display().to_string(),
        "--workdir".into(),
        config.path().display().to_string(),
        "--policy".into(),
        policy_file.display().to_string(),
    ];
    // The codemode tool must be asked for: MCP servers alone do not switch it on.
    if !extra.contains(&"--mode") {
        args.extend(["--mode".to_string(), "on".to_string()]);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    Serve { config, args }
}

fn client(serve: &Serve, scenario: &str, n: &str) -> Value {
    client_with(serve, scenario, n, &[])
}

fn client_with(serve: &Serve, scenario: &str, n: &str, env: &[(&str, &str)]) -> Value {
    let out = Command::new("node")
        .envs(env.iter().copied())
        .arg(CLIENT)
        .arg(testbed())
        .arg(env!("CARGO_BIN_EXE_codemode"))
        .arg(json!(serve.args).to_string())
        .arg(scenario)
        .arg(n)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

fn bad() -> Value {
    json!({"command": "node", "args": [FIXTURE, testbed()]})
}

fn everything() -> Value {
    json!({"command": "node", "args": [
        testbed().join("@modelcontextprotocol/server-everything/dist/index.js"), "stdio"]})
}

#[test]
fn item1_images_reach_the_client_as_image_blocks_and_not_as_base64_in_structured_content() {
    let s = serve(json!({"everything": everything()}), PERMIT_MCP, &[]);
    let v = client(&s, "images", "");
    assert_eq!(v["isError"], false, "{v}");
    let content = v["content"].as_array().unwrap();
    let images: Vec<&Value> = content.iter().filter(|c| c["type"] == "image").collect();
    // One from image(), one from the returned MCP result.
    assert_eq!(images.len(), 2, "{v}");
    assert!(images.iter().all(|i| i["mimeType"] == "image/png"), "{v}");
    assert!(
        images.iter().all(|i| i["size"].as_u64().unwrap() > 100),
        "{v}"
    );
    // The tiny image is over 100 base64 characters each; the structured result names sizes only.
    let image_len = images[0]["size"].as_u64().unwrap();
    assert!(
        v["structuredSize"].as_u64().unwrap() < 2 * image_len,
        "structuredContent must not repeat the base64: {v}"
    );
    assert!(
        !v["text"].as_str().unwrap().contains("iVBOR"),
        "no base64 in the text the model reads: {v}"
    );
}

#[test]
fn item2_progress_keeps_a_short_client_timeout_alive_and_forwards_upstream_progress() {
    let s = serve(json!({"bad": bad()}), PERMIT_MCP, &[]);
    let v = client(&s, "progress", "");
    // 3.2 s of work against a 1.5 s client timeout that resets on progress.
    assert_eq!(v["value"], "done after 8 steps", "{v}");
    let lines: Vec<&str> = v["progress"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("mcp__bad__slow_progress started")),
        "{lines:?}"
    );
    assert!(
        lines
            .iter()
            .filter(|l| l.starts_with("mcp__bad__slow_progress: "))
            .count()
            >= 6,
        "the upstream's own progress is forwarded: {lines:?}"
    );
}

#[test]
fn item3_every_cancelled_upstream_call_is_told_every_time() {
    let s = serve(json!({"bad": bad()}), PERMIT_MCP, &[]);
    let v = client(&s, "cancel", "12");
    // 12 rounds of: a client cancel (3 calls), a script timeout (2) and an early return (2).
    // A call the script dropped before it was sent never reaches the server; every call that
    // did reach it must be cancelled.
    assert_eq!(v["expected"], 84, "{v}");
    let arrived = v["arrived"].as_u64().unwrap();
    assert!(
        arrived >= 60,
        "most calls reach the server before they are dropped: {v}"
    );
    assert_eq!(
        v["cancelled"], v["arrived"],
        "every in-flight upstream call got notifications/cancelled: {v}"
    );
}

/// Red team: a direct call ignored the client's `notifications/cancelled`: a cancelled `bash`
/// ran to its end, and an upstream call never heard of it. Each of these cancelled direct calls
/// now reaches the upstream as a cancellation.
#[test]
fn a_direct_call_the_client_cancels_is_cancelled_upstream() {
    let mut server = bad();
    server["toolExposure"] = json!({"hang": "direct"});
    let s = serve(json!({"bad": server}), PERMIT_MCP, &["--mode", "on"]);
    let v = client(&s, "direct_cancel", "5");
    assert_eq!(v["arrived"], 5, "{v}");
    assert_eq!(
        v["cancelled"], v["arrived"],
        "every cancelled direct call was cancelled upstream: {v}"
    );
}

#[test]
fn item4_direct_tools_keep_their_output_schema_and_structured_content() {
    let mut server = bad();
    server["toolExposure"] = json!({"structured": "direct", "image": "direct"});
    let s = serve(json!({"bad": server}), PERMIT_MCP, &["--mode", "on"]);
    let v = client(&s, "direct", "");
    assert_eq!(
        v["outputSchema"],
        json!({"type": "object", "properties": {"n": {"type": "number"}}, "required": ["n"]}),
        "{v}"
    );
    assert_eq!(
        v["structuredContent"],
        json!({"n": 7}),
        "the upstream's own object: {v}"
    );
    assert_eq!(v["imageTypes"], json!(["text", "image"]), "{v}");
}

#[test]
fn item13_resources_and_prompts_reach_scripts_through_the_gate_and_the_client_in_mode_on() {
    let audit = tempfile::tempdir().unwrap();
    let audit_log = audit.path().join("audit.jsonl");
    let audit_arg = audit_log.display().to_string();
    let s = serve(
        json!({"everything": everything()}),
        PERMIT_MCP,
        &["--mode", "on", "--audit", &audit_arg],
    );
    let v = client(&s, "resources", "");
    // The client's own resource read and prompt get each left an audit line as origin client.
    let log = std::fs::read_to_string(&audit_log).unwrap_or_default();
    for tool in [
        "mcp__everything__read_resource",
        "mcp__everything__get_prompt",
    ] {
        assert!(
            log.lines()
                .any(|l| l.contains(tool) && l.contains("\"origin\":\"client\"")),
            "no client-origin audit line for {tool}:\n{log}"
        );
    }
    assert!(v["resources"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(v["read"][0], v["firstUri"], "{v}");
    assert_eq!(v["readError"], Value::Null, "{v}");
    assert!(v["messages"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(v["promptError"], Value::Null, "{v}");
    assert_eq!(v["scriptPrompt"]["messages"], v["messages"], "{v}");
    assert!(
        v["prompt"]
            .as_str()
            .unwrap()
            .starts_with("mcp__everything__"),
        "{v}"
    );
    let script = &v["script"];
    assert_eq!(script["ok"], true, "{v}");
    assert!(script["value"]["count"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(script["value"]["contents"], 1, "{v}");
    let found: Vec<&str> = v["found"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        found.contains(&"mcp__everything__read_resource"),
        "discovery finds the resource tools: {found:?}"
    );
}

/// Red-team findings: with a server's `list_resources` (or `get_prompt`) hidden, a client's own
/// `resources/list` (or `prompts/list`) still listed everything. The client's listing shows no more than a script's could.
#[test]
fn a_hidden_list_resources_or_get_prompt_hides_the_clients_listing_too() {
    let mut server = everything();
    server["toolExposure"] = json!({"list_resources": "hidden", "get_prompt": "hidden"});
    let s = serve(json!({"everything": server}), PERMIT_MCP, &["--mode", "on"]);
    let v = client(&s, "listing", "");
    assert_eq!(v["ready"], true, "{v}");
    assert_eq!(v["resources"], 0, "{v}");
    assert_eq!(v["templates"], 0, "{v}");
    assert_eq!(v["prompts"], 0, "{v}");
    let s = serve(
        json!({"everything": everything()}),
        PERMIT_MCP,
        &["--mode", "on"],
    );
    let v = client(&s, "listing", "");
    assert!(
        v["resources"].as_u64().unwrap_or(0) > 0 && v["prompts"].as_u64().unwrap_or(0) > 0,
        "listed when not hidden: {v}"
    );
}

#[test]
fn item13_a_policy_decides_on_the_server_and_the_uri() {
    let forbid = format!(
        "{PERMIT_MCP}\n@id(\"no-resources\")\nforbid (principal, action == Action::\"tool_call\", resource == Tool::\"mcp__everything__read_resource\")\nwhen {{ context.args has uri && context.args.uri like \"demo://*\" }};\n\
         @id(\"no-client-prompts\")\nforbid (principal, action == Action::\"tool_call\", resource == Tool::\"mcp__everything__get_prompt\")\nwhen {{ context.origin == \"client\" }};\n"
    );
    let s = serve(
        json!({"everything": everything()}),
        &forbid,
        &["--mode", "on"],
    );
    let v = client(&s, "resources", "");
    // The client's own read of a demo:// resource is judged by the same policy.
    assert!(
        v["firstUri"]
            .as_str()
            .unwrap_or_default()
            .starts_with("demo://"),
        "{v}"
    );
    assert!(
        v["readError"]
            .as_str()
            .unwrap_or_default()
            .contains("no-resources"),
        "{v}"
    );
    assert_eq!(v["read"], json!([]), "{v}");
    // The client's own prompts/get is a gated call too: the origin rule stops it, while the
    // same prompt from a script (origin script) still passes.
    assert!(
        v["promptError"]
            .as_str()
            .unwrap_or_default()
            .contains("no-client-prompts"),
        "{v}"
    );
    assert!(
        v["promptNoArgsError"]
            .as_str()
            .unwrap_or_default()
            .contains("no-client-prompts"),
        "without `arguments` the same prompt reaches the policy too: {v}"
    );
    assert!(
        v["scriptPrompt"]["messages"].as_u64().unwrap_or(0) > 0,
        "{v}"
    );
    let script = &v["script"];
    assert_eq!(script["ok"], false, "{v}");
    assert!(
        script["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("no-resources"),
        "{v}"
    );
}

fn memory(dir: &std::path::Path) -> Value {
    json!({"command": "node",
        "args": [testbed().join("@modelcontextprotocol/server-memory/dist/index.js")],
        "env": {"MEMORY_FILE_PATH": dir.join("memory.jsonl")}})
}

#[test]
fn item11_non_read_only_mcp_tools_ask_a_client_that_can_show_the_question() {
    let dir = tempfile::tempdir().unwrap();
    let s = serve(json!({"memory": memory(dir.path())}), ASK_MCP, &[]);
    let v = client(&s, "approval", "yes");
    assert_eq!(v["value"], "written", "{v}");
    let asked = v["asked"].as_array().unwrap();
    assert_eq!(
        asked.len(),
        1,
        "read_graph is read-only; only the write asks: {v}"
    );
    assert!(
        asked[0]
            .as_str()
            .unwrap()
            .contains("mcp__memory__create_entities")
    );

    let v = client(&s, "approval", "no");
    let text = v["text"].as_str().unwrap();
    assert!(text.contains("the user was asked"), "{text}");
    assert!(text.contains("ask the user to allow"), "{text}");
}

#[test]
fn item11_a_client_without_elicitation_is_told_nobody_could_be_asked() {
    let dir = tempfile::tempdir().unwrap();
    let s = serve(json!({"memory": memory(dir.path())}), ASK_MCP, &[]);
    let v = client(&s, "approval", "none");
    let text = v["text"].as_str().unwrap();
    assert!(
        text.contains("could not ask: this client cannot show approval requests"),
        "{text}"
    );
    assert!(!text.contains("was not approved"), "{text}");
    assert!(
        text.to_lowercase().contains("ask the user to allow"),
        "{text}"
    );
}

#[test]
fn item5_and_10_a_slow_server_does_not_hold_up_initialize_and_a_broken_one_says_why() {
    let slow = json!({"command": "sh", "args": ["-c", format!("sleep 30; exec node {FIXTURE} {}", testbed().display())]});
    let broken = json!({"command": "sh", "args": ["-c", "echo 'no such package' >&2; exit 3"]});
    let s = serve(json!({"slow": slow, "broken": broken}), PERMIT_MCP, &[]);
    let v = client(&s, "startup", "");
    assert!(
        v["initMs"].as_u64().unwrap() < 10_000,
        "initialize is answered before the 30 s server is up: {v}"
    );
    let first = v["first"].as_str().unwrap();
    assert!(first.contains("Not available now"), "{first}");
    assert!(first.contains("\"slow\" is still starting"), "{first}");
    let slow_ns = v["slowNamespace"]["unavailable"]
        .as_str()
        .unwrap_or_default();
    assert!(slow_ns.contains("still starting"), "{v}");
    let broken_text = v["brokenText"].as_str().unwrap();
    assert!(
        broken_text.contains("\"broken\"") && broken_text.contains("failed to start"),
        "{broken_text}"
    );
    assert!(broken_text.contains("no such package"), "{broken_text}");
    assert!(broken_text.contains("tried again"), "{broken_text}");
    let broken_ns = v["brokenNamespace"]["unavailable"]
        .as_str()
        .unwrap_or_default();
    assert!(broken_ns.contains("failed to start"), "{v}");
    drop(s.config);
}
