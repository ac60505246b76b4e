//! What the client does with messages a server sends on its own.
// Logging is deprecated by SEP-2577, but servers in use still send it; we only log it.
#![allow(deprecated)]

use std::sync::Arc;

use rmcp::ClientHandler;
use rmcp::model::{
    ClientCapabilities, ClientConfig, Implementation, LoggingLevel,
    LoggingMessageNotificationParam, ProgressNotificationParam,
};
use rmcp::service::{NotificationContext, RoleClient};
use tokio::sync::mpsc::UnboundedSender;

use super::progress::Watchers;

/// What changed on a server, for the hub's refresher.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Listing {
    Tools,
    Resources,
    Prompts,
}

/// Per-connection handler: forwards list changes to the hub's refresher, progress to whoever
/// waits for the call, and logs the server's log messages through `tracing` (never into results).
#[derive(Clone)]
pub(crate) struct Handler {
    pub(crate) server: Arc<str>,
    pub(crate) list_changed: UnboundedSender<(Arc<str>, Listing)>,
    pub(crate) progress: Watchers,
}

impl ClientHandler for Handler {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        tracing::debug!(server = %self.server, "tool list changed");
        // The hub may be shutting down; then there is nobody left to refresh for.
        let _ = self
            .list_changed
            .send((self.server.clone(), Listing::Tools));
    }

    async fn on_resource_list_changed(&self, _context: NotificationContext<RoleClient>) {
        let _ = self
            .list_changed
            .send((self.server.clone(), Listing::Resources));
    }

    async fn on_prompt_list_changed(&self, _context: NotificationContext<RoleClient>) {
        let _ = self
            .list_changed
            .send((self.server.clone(), Listing::Prompts));
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.progress.deliver(
            &params.progress_token,
            params.progress,
            params.total,
            params.message.as_deref(),
        );
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
