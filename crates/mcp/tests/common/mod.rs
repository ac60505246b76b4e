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

/// Everything written through `tracing` at warn level and above on this thread (the test's
/// runtime and the tasks rmcp spawns on it), as codemode's default log filter lets it through.
#[derive(Clone, Default)]
pub struct CapturedLog(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for CapturedLog {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[allow(dead_code)]
impl CapturedLog {
    /// Captures this thread's log until the guard is dropped.
    pub fn install(&self) -> tracing::subscriber::DefaultGuard {
        let writer = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::set_default(subscriber)
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}
