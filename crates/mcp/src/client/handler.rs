//! What the client does with messages a server sends on its own.
// Logging is deprecated by SEP-2577, but servers in use still send it; we only log it.
#![allow(deprecated)]

use std::sync::Arc;

use rmcp::ClientHandler;
use rmcp::model::{
    ClientCapabilities, ClientConfig, Implementation, LoggingLevel, LoggingMessageNotificationParam,
};
use rmcp::service::{NotificationContext, RoleClient};
use tokio::sync::mpsc::UnboundedSender;

/// Per-connection handler: forwards `tools/list_changed` to the hub's refresher and logs the
/// server's log messages through `tracing` (never into results).
#[derive(Clone)]
pub(crate) struct Handler {
    pub(crate) server: Arc<str>,
    pub(crate) list_changed: UnboundedSender<Arc<str>>,
}

impl ClientHandler for Handler {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        tracing::debug!(server = %self.server, "tool list changed");
        // The hub may be shutting down; then there is nobody left to refresh for.
        let _ = self.list_changed.send(self.server.clone());
    }

    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let server = &self.server;
        let data = params.data;
        match params.level {
            LoggingLevel::Debug => tracing::debug!(%server, %data, "MCP server log"),
            LoggingLevel::Info | LoggingLevel::Notice => {
                tracing::info!(%server, %data, "MCP server log")
            }
            LoggingLevel::Warning => tracing::warn!(%server, %data, "MCP server log"),
            _ => tracing::error!(%server, %data, "MCP server log"),
        }
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("codemode", env!("CARGO_PKG_VERSION")),
        )
    }
}
