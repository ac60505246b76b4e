//! Serving the codemode MCP server over stdio and streamable HTTP.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use codemode_runtime::Codemode;
use rmcp::ServiceExt;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use super::approval::ElicitationApprover;
use super::handler::CodemodeHandler;
use crate::McpError;

/// Serves one MCP client over this process's stdin/stdout until the client disconnects.
///
/// Use the same `approvals` as the gate's approver, so that `ask` decisions reach this client.
pub async fn serve_stdio(
    codemode: Codemode,
    approvals: ElicitationApprover,
) -> Result<(), McpError> {
    let handler = CodemodeHandler::new(codemode, approvals, "stdio");
    let service = handler
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| McpError::Serve(format!("the MCP handshake on stdio failed: {e}")))?;
    service
        .waiting()
        .await
        .map_err(|e| McpError::Serve(format!("the stdio server stopped abnormally: {e}")))?;
    Ok(())
}

/// A running HTTP server; dropping it does not stop it, [`HttpServer::stop`] does.
pub struct HttpServer {
    /// Where it listens (useful after binding port 0).
    pub local_addr: SocketAddr,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl HttpServer {
    /// Stops accepting, ends every session, and waits for the server to finish.
    pub async fn stop(self) {
        self.shutdown.cancel();
        let _ = self.task.await;
    }

    /// Waits until the server stops (it stops when `shutdown` of [`serve_http`] fires).
    pub async fn wait(self) -> Result<(), McpError> {
        match self.task.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(McpError::Serve(format!("the HTTP server failed: {e}"))),
            Err(e) => Err(McpError::Serve(format!("the HTTP server task failed: {e}"))),
        }
    }
}

/// Serves MCP over streamable HTTP at `http://<addr>/mcp`, each client in its own session.
///
/// Binding a non-loopback address requires a bearer token, because whoever reaches the port can
/// run scripts with this installation's authority; with a token, every request must carry
/// `Authorization: Bearer <token>`.
pub async fn serve_http(
    codemode: Codemode,
    addr: SocketAddr,
    bearer_token: Option<String>,
    approvals: ElicitationApprover,
) -> Result<HttpServer, McpError> {
    let token = bearer_token.filter(|t| !t.is_empty());
    if !addr.ip().is_loopback() && token.is_none() {
        return Err(McpError::Serve(format!(
            "refusing to listen on {addr} without a bearer token: anyone who reaches it could run \
             scripts with your tools; pass a token, or listen on 127.0.0.1"
        )));
    }
    let shutdown = CancellationToken::new();
    let mut config = StreamableHttpServerConfig::default();
    config.cancellation_token = shutdown.child_token();
    if !addr.ip().is_loopback() {
        // Host checks guard loopback servers against DNS rebinding; a public server is guarded
        // by its token instead, and may be reached under any name.
        config = config.disable_allowed_hosts();
    }
    let service = StreamableHttpService::new(
        move || {
            Ok(CodemodeHandler::new(
                codemode.clone(),
                approvals.clone(),
                "http",
            ))
        },
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let mut router = axum::Router::new().nest_service("/mcp", service);
    if let Some(token) = token {
        let expected: Arc<[u8]> = Arc::from(Sha256::digest(token.as_bytes()).to_vec());
        router = router.layer(axum::middleware::from_fn_with_state(
            expected,
            require_token,
        ));
    }
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| McpError::Serve(format!("cannot listen on {addr}: {e}")))?;
    let local_addr = listener
        .local_addr()
        .map_err(|e| McpError::Serve(format!("cannot read the bound address: {e}")))?;
    let stop = shutdown.clone();
    let task = tokio::spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await
    });
    tracing::info!(%local_addr, "codemode MCP server listening on http://{local_addr}/mcp");
    Ok(HttpServer {
        local_addr,
        shutdown,
        task,
    })
}

/// Refuses requests without the right bearer token. Comparing digests keeps the comparison's
/// timing independent of how much of the token matched.
async fn require_token(State(expected): State<Arc<[u8]>>, req: Request, next: Next) -> Response {
    let presented = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|t| Sha256::digest(t.as_bytes()).to_vec());
    match presented {
        Some(digest) if digest.as_slice() == &*expected => next.run(req).await,
        _ => (
            StatusCode::UNAUTHORIZED,
            [(axum::http::header::WWW_AUTHENTICATE, "Bearer")],
            "missing or wrong bearer token",
        )
            .into_response(),
    }
}
