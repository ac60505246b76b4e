//! Names a server chooses for its tools against the names codemode gives its own tools for that
//! server: `mcp__<server>__read_resource` and `mcp__<server>__get_prompt`. A server's tool that
//! sanitizes to one of those names (`read-resource`) holds the name; a client's `resources/read`
//! or `prompts/get` must then never be run as that tool.

mod common;

use std::sync::Arc;

use codemode_mcp::{ConnectOptions, McpConfig, McpHub};
use codemode_spec::{Provenance, Tool, ToolCall};
use common::{assert_all_connected, find};
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
