//! What the client does with messages a server sends on its own.
// Logging is deprecated by SEP-2577, but servers in use still send it; we only log it.
#![allow(deprecated)]

use std::sync::Arc;

use super::changes::Changes;
use super::progress::Watchers;
use super::server_log::{Admit, LogLimit};
use rmcp::ClientHandler;
use rmcp::ErrorData;
use rmcp::model::{
    ClientCapabilities, ClientConfig, CreateMessageRequestParams, CreateMessageResult,
    ElicitRequestParams, ElicitResult, ErrorCode, Implementation, ListRootsResult, LoggingLevel,
    LoggingMessageNotificationParam, ProgressNotificationParam,
};
use rmcp::service::{NotificationContext, RequestContext, RoleClient};

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
    /// How much of the server's own log reaches the host's.
    pub(crate) log_limit: Arc<LogLimit>,
    /// How many refused requests of the server's are logged: a server can send thousands.
    pub(crate) refusal_limit: Arc<LogLimit>,
}

impl Handler {
    /// The answer to a request for something codemode does not offer a server: an error that
    /// says so, logged against the server.
    fn refuse(&self, method: &str, what: &str) -> ErrorData {
        if let Admit::Write { dropped } = self.refusal_limit.admit(std::time::Instant::now()) {
            let server = &self.server;
            if dropped > 0 {
                tracing::warn!(
                    %server,
                    dropped,
                    "MCP server requests refused: {dropped} not logged (more than {} a second)",
                    super::server_log::MAX_PER_SECOND
                );
            }
            tracing::warn!(%server, %method, "MCP server request refused");
        }
        ErrorData::new(
            ErrorCode::METHOD_NOT_FOUND,
            format!(
                "codemode does not offer {what} to MCP servers and did not advertise it; \
                 {method} is refused"
            ),
            None,
        )
    }
}

impl ClientHandler for Handler {
    // Sampling would spend the user's model credentials outside the gate, elicitation would put
    // a server's question to the person, roots would name the workspace and home directories.
    // None is advertised (see `get_info`), and each is refused rather than answered: an empty
    // list or a "decline" would read as the person's answer.
    async fn create_message(
        &self,
        _params: CreateMessageRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        Err(self.refuse("sampling/createMessage", "sampling (model calls)"))
    }

    async fn create_elicitation(
        &self,
        _request: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        Err(self.refuse(
            "elicitation/create",
            "elicitation (questions to the person)",
        ))
    }

    async fn list_roots(
        &self,
        _context: RequestContext<RoleClient>,
    ) -> Result<ListRootsResult, ErrorData> {
        Err(self.refuse("roots/list", "roots (the workspace's directories)"))
    }

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
        let Admit::Write { dropped } = self.log_limit.admit(std::time::Instant::now()) else {
            return;
        };
        if dropped > 0 {
            tracing::warn!(
                %server,
                dropped,
                "MCP server log: {dropped} messages dropped (more than {} a second)",
                super::server_log::MAX_PER_SECOND
            );
        }
        let data = super::server_log::shown(&params.data);
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
