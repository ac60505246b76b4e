//! What the MCP client tests share.

use std::sync::Arc;

use codemode_mcp::{McpHub, ServerState};
use codemode_spec::Tool;

/// The hub's tool registered as `name`; the test fails naming the tools there are.
pub fn find(hub: &McpHub, name: &str) -> Arc<dyn Tool> {
    hub.tools()
        .into_iter()
        .find(|t| t.spec().name == name)
        .unwrap_or_else(|| {
            let names: Vec<String> = hub.tools().iter().map(|t| t.spec().name.clone()).collect();
            panic!("no tool {name} among {names:?}")
        })
}

/// Fails the test unless every server of the hub is connected.
#[allow(dead_code)] // Not every test binary uses it.
pub fn assert_all_connected(hub: &McpHub) {
    for status in hub.status() {
        assert!(
            matches!(status.state, ServerState::Connected { .. }),
            "{status:?}"
        );
    }
}
