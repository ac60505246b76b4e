//! What the client does with messages a server sends on its own.
// Logging is deprecated by SEP-2577, but servers in use still send it; we only log it.
#![allow(deprecated)]

use std::sync::Arc;

use super::changes::Changes;
use super::progress::Watchers;
use rmcp::ClientHandler;
use rmcp::model::{
    ClientCapabilities, ClientConfig, Implementation, LoggingLevel,
    LoggingMessageNotificationParam, ProgressNotificationParam,
};
use rmcp::service::{NotificationContext, RoleClient};

/// What changed on a server, for its refresher.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Listing {
    Tools,
    Resources,
    Prompts,
}

/// Per-connection handler: notes list changes for the server's refresher, forwards progress to
/// whoever waits for the call, and logs the server's log messages through `tracing` (never into
/// results).
#[derive(Clone)]
pub(crate) struct Handler {
    pub(crate) server: Arc<str>,
    pub(crate) changes: Arc<Changes>,
    pub(crate) progress: Watchers,
}

impl ClientHandler for Handler {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        tracing::debug!(server = %self.server, "tool list changed");
        self.changes.mark(Listing::Tools);
    }

    async fn on_resource_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.changes.mark(Listing::Resources);
    }

    async fn on_prompt_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.changes.mark(Listing::Prompts);
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
