//! A small codemode MCP server over stdio for this crate's integration tests: it connects the
//! testbed's filesystem and memory servers, permits every call, asks a person (through the
//! client) before memory writes, and serves `codemode`.
//!
//! Usage: codemode-mcp-test-server <testbed node_modules> <directory to share>

use std::sync::Arc;

use codemode_gate::{Gate, PolicySet, Registry};
use codemode_mcp::{
    ConnectOptions, ElicitationApprover, McpConfig, McpHub, ServeOptions, serve_stdio,
};
use codemode_runtime::Codemode;
use codemode_spec::CodemodeMode;
use serde_json::json;

const POLICY: &str = r#"
@id("all-but-memory-writes")
permit(principal, action == Action::"tool_call", resource) unless { resource.name == "mcp__memory__create_entities" };

@id("memory-writes")
@ask("it writes to the knowledge graph")
permit(principal, action == Action::"tool_call", resource) when { resource.name == "mcp__memory__create_entities" };
"#;

#[tokio::main]
async fn main() {
    if let Err(e) = run().await {
        eprintln!("codemode-mcp-test-server: {e}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(testbed), Some(dir)) = (args.get(1), args.get(2)) else {
        return Err("usage: codemode-mcp-test-server <testbed node_modules> <dir>".into());
    };
    let config = McpConfig::from_json(
        &json!({"mcpServers": {
            "fs": {"command": "node", "args": [
                format!("{testbed}/@modelcontextprotocol/server-filesystem/dist/index.js"), dir]},
            "memory": {"command": "node",
                "args": [format!("{testbed}/@modelcontextprotocol/server-memory/dist/index.js")],
                "env": {"MEMORY_FILE_PATH": format!("{dir}/memory.jsonl")}}
        }}),
        "test",
    )?;
    let hub = Arc::new(McpHub::connect(&config, ConnectOptions::default()).await);
    let registry = Registry::new();
    for tool in hub.tools() {
        registry.register(tool)?;
    }
    for ns in hub.namespaces() {
        registry.add_namespace(ns);
    }
    let approvals = ElicitationApprover::new();
    let gate = Gate::builder()
        .registry(registry)
        .policy(PolicySet::parse("test.cedar", POLICY)?)
        .approver(Arc::new(approvals.clone()))
        .mode(CodemodeMode::On)
        .build()?;
    let codemode = Codemode::builder().gate(gate).build()?;
    let opts = ServeOptions {
        hub: Some(hub.clone()),
        ..Default::default()
    };
    serve_stdio(codemode, approvals, opts).await?;
    hub.shutdown().await;
    Ok(())
}
