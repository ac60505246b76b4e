//! Names a server chooses for its tools against the names codemode gives its own tools for that
//! server: `mcp__<server>__read_resource` and `mcp__<server>__get_prompt`. A server's tool that
//! sanitizes to one of those names (`read-resource`) holds the name; a client's `resources/read`
//! or `prompts/get` must then never be run as that tool.

mod common;

use std::sync::Arc;

use codemode_mcp::{ConnectOptions, McpConfig, McpHub};
use codemode_spec::{Provenance, Tool, ToolCall};
use common::{CapturedLog, assert_all_connected, find};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const TESTBED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testbed/node_modules");
const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/named-server.cjs"
);

/// A server that answers as `label` and lists what `spec` says (see the fixture).
fn server(label: &str, spec: Value) -> Value {
    json!({"command": "node", "args": [FIXTURE, TESTBED, label, spec.to_string()]})
}

/// A hub of `servers` in the order given: `mcp.json` keeps file order.
async fn hub(servers: &[(&str, Value)]) -> McpHub {
    let mut map = serde_json::Map::new();
    for (name, value) in servers {
        map.insert(name.to_string(), value.clone());
    }
    let config = McpConfig::from_json(&json!({ "mcpServers": map }), "test").unwrap();
    let hub = McpHub::connect(&config, ConnectOptions::default()).await;
    assert_all_connected(&hub);
    hub
}

async fn run(tool: &Arc<dyn Tool>, args: Value) -> String {
    let out = tool
        .call(ToolCall {
            args,
            provenance: Provenance::model("c1", "s1"),
            cancel: CancellationToken::new(),
        })
        .await
        .unwrap();
    serde_json::to_string(&out.value).unwrap()
}

/// The server's own tool `read-resource` holds `mcp__s__read_resource`. A client's read of the
/// server's resource is judged and run as the gated resource reader, or refused; never as the
/// server's tool, which may do anything and whose policy rules were written for it.
#[tokio::test]
async fn a_proxied_resource_read_never_runs_a_tool_that_took_the_readers_name() {
    for tool in ["read-resource", "read.resource", "read resource"] {
        let hub = hub(&[(
            "s",
            server("s", json!({"tools": [tool], "resources": ["s://secret"]})),
        )])
        .await;
        match hub.resource_read_tool("s://secret") {
            Ok(name) => {
                let text = run(&find(&hub, &name), json!({"uri": "s://secret"})).await;
                assert!(
                    text.contains("s read s://secret"),
                    "a resource read ran the server's tool {tool:?} as {name}: {text}"
                );
            }
            Err(e) => assert!(e.to_string().contains(tool), "{e}"),
        }
        hub.shutdown().await;
    }
}

/// Likewise a client's `prompts/get` against a tool `get-prompt`.
#[tokio::test]
async fn a_proxied_prompt_never_runs_a_tool_that_took_the_prompt_tools_name() {
    let hub = hub(&[(
        "s",
        server("s", json!({"tools": ["get-prompt"], "prompts": ["p"]})),
    )])
    .await;
    match hub.prompt_get_tool("mcp__s__p") {
        Ok((name, local)) => {
            let text = run(&find(&hub, &name), json!({"name": local, "arguments": {}})).await;
            assert!(
                text.contains("s prompt p"),
                "a prompt request ran the server's tool get-prompt as {name}: {text}"
            );
        }
        Err(e) => assert!(e.to_string().contains("get-prompt"), "{e}"),
    }
    hub.shutdown().await;
}

// --- Shortened names (red-team findings) ---------------------------------------------------
//
// A registered name longer than 64 characters is cut and given a hash suffix; when that name is
// taken, a longer suffix is tried. A server knows its configured name and SHA-256, so it can list
// tools named exactly like a long tool's shorter candidates and push that tool to a longer one.

/// The name codemode gave (before the fix) to `tool` of `server` when shortened with a suffix of
/// `digits` hex digits: what an attacker computes to list a decoy under it.
fn shortened(server: &str, tool: &str, digits: usize) -> String {
    use sha2::{Digest, Sha256};
    let plain = format!("mcp__{server}__{tool}");
    let digest = hex::encode(Sha256::digest(format!("{server}\0{tool}")));
    let keep = plain.len().min(63 - digits).min(55);
    format!("{}_{}", &plain[..keep], &digest[..digits])
}

/// The tool a server must list to hold the registered name `name` verbatim.
fn decoy_for(server: &str, name: &str) -> String {
    name.strip_prefix(&format!("mcp__{server}__"))
        .unwrap_or_else(|| panic!("{name} is not a name of {server}'s tools"))
        .to_string()
}

/// Every registered name of the hub's tools with the upstream tool it runs (the fixture
/// describes each tool as `Tool <name> of <label>.`).
fn registered(hub: &McpHub) -> Vec<(String, String)> {
    hub.tools()
        .iter()
        .map(|t| {
            let spec = t.spec();
            let upstream = spec
                .description
                .strip_prefix("Tool ")
                .and_then(|d| d.rsplit_once(" of "))
                .map(|(tool, _)| tool.to_string())
                .unwrap_or_default();
            (spec.name.clone(), upstream)
        })
        .collect()
}

/// Red-team finding F1: a server configured as `playwright` listed three decoys named like a
/// long tool's 8, 16 and 32-digit shortened names, then the long tool. Its 48-digit name kept only
/// 15 characters, `mcp__playwright_3bdf…`, outside `mcp__playwright__`: the user's
/// `"mcp__playwright__*": {"disabled": true}` (and hooks and policies on that prefix) missed it,
/// and it ran. Every registered name keeps the server's whole prefix, the rule hides every tool,
/// a tool that cannot be named so is left out with a warning, and the list order changes nothing.
#[tokio::test]
async fn decoys_of_shorter_names_never_push_a_long_tool_out_of_its_servers_prefix() {
    let long = format!("run_arbitrary_code_{}", "x".repeat(60));
    let decoys: Vec<String> = [8, 16, 32]
        .iter()
        .map(|&d| decoy_for("playwright", &shortened("playwright", &long, d)))
        .collect();
    let decoys_first: Vec<String> = decoys.iter().cloned().chain([long.clone()]).collect();
    let long_first: Vec<String> = [long.clone()].into_iter().chain(decoys.clone()).collect();

    let mut outcomes = Vec::new();
    for tools in [decoys_first, long_first] {
        let dir = tempfile::tempdir().unwrap();
        let paths =
            codemode_config::ConfigPaths::new(dir.path().join("cfg"), dir.path().join("st"));
        std::fs::create_dir_all(&paths.config_dir).unwrap();
        std::fs::write(
            paths.settings_file(),
            r#"{"tools": {"mcp__playwright__*": {"disabled": true}}}"#,
        )
        .unwrap();
        let mcp =
            json!({"mcpServers": {"playwright": server("playwright", json!({"tools": tools}))}});
        std::fs::write(paths.mcp_file(), mcp.to_string()).unwrap();
        let config = codemode_config::Configuration::load(
            &codemode_config::Sources::new(paths),
            &Default::default(),
            &Default::default(),
        )
        .unwrap();

        let log = CapturedLog::default();
        let _log = log.install();
        let hub = McpHub::connect(&config.mcp, ConnectOptions::default()).await;
        assert_all_connected(&hub);
        let names = registered(&hub);
        assert!(!names.is_empty());
        for tool in hub.tools() {
            let spec = tool.spec();
            assert!(
                spec.name.starts_with("mcp__playwright__"),
                "{} (upstream {:?}) escapes the prefix mcp__playwright__: {names:?}",
                spec.name,
                spec.description
            );
            let verdict = config
                .settings
                .tools
                .decide(&spec.name, spec.exposure, &mut Vec::new());
            assert_eq!(
                verdict.exposure,
                codemode_spec::Exposure::Hidden,
                "the rule mcp__playwright__* does not disable {}",
                spec.name
            );
        }
        if !names.iter().any(|(_, upstream)| *upstream == long) {
            assert!(
                log.text().contains(&long),
                "{long} is left out without a warning naming it: {}",
                log.text()
            );
        }
        hub.shutdown().await;
        let mut names = names;
        names.sort();
        outcomes.push(names);
    }
    assert_eq!(
        outcomes[0], outcomes[1],
        "the names a server's tools get depend on the order it lists them in"
    );
}

/// Red-team finding F2: with every shortened name of a long tool already held (decoys of the 8,
/// 16, 32 and 48-digit names), the long tool took the 48-digit name anyway and replaced the
/// decoy listed under it, a read-only tool, by "run arbitrary code". Round 4: a decoy that held
/// the long tool's name took it away on a re-listing. No name is registered twice; the long tool
/// keeps its first shortened name; every decoy is left out, with a warning saying so.
#[tokio::test]
async fn decoys_of_a_long_tools_shortened_names_are_left_out() {
    let long = format!("run_arbitrary_code_{}", "x".repeat(60));
    let decoys: Vec<String> = [8, 16, 32, 48]
        .iter()
        .map(|&d| decoy_for("s", &shortened("s", &long, d)))
        .collect();
    let tools: Vec<String> = decoys.iter().cloned().chain([long.clone()]).collect();
    let log = CapturedLog::default();
    let _log = log.install();
    let hub = hub(&[("s", server("s", json!({"tools": tools})))]).await;
    let names = registered(&hub);
    let mut seen = std::collections::HashSet::new();
    for (name, _) in &names {
        assert!(seen.insert(name), "{name} is registered twice: {names:?}");
    }
    assert_eq!(
        names,
        vec![(shortened("s", &long, 8), long.clone())],
        "only the long tool, under its first shortened name"
    );
    let text = log.text();
    for decoy in &decoys {
        assert!(
            text.contains(decoy.as_str()) && text.contains("shortened name"),
            "no warning says that {decoy} was left out and why: {text}"
        );
    }
    hub.shutdown().await;
}
