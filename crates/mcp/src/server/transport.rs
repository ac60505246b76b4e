//! Serving the codemode MCP server over stdio.

use codemode_runtime::Codemode;
use rmcp::ServiceExt;

use super::ServeOptions;
use super::approval::ElicitationApprover;
use super::handler::{CodemodeHandler, OnEnd};
use super::stdio_lines::StdioLines;
use crate::McpError;

/// Serves one MCP client over this process's stdin/stdout until the client disconnects or
/// `opts.shutdown` fires. Every line that is not a JSON-RPC request is answered with an error
/// ([`StdioLines`]); the session goes on.
///
/// Use the same `approvals` as the gate's approver, so that `ask` decisions reach this client.
pub async fn serve_stdio(
    codemode: Codemode,
    approvals: ElicitationApprover,
    opts: ServeOptions,
) -> Result<(), McpError> {
    let shutdown = opts.shutdown.clone();
    let handler = CodemodeHandler::new(codemode, approvals, opts, "stdio", OnEnd::Forget);
    let service = tokio::select! {
        s = handler.serve_with_ct(
            StdioLines::new(tokio::io::stdin(), tokio::io::stdout()),
            shutdown.child_token(),
        ) => s
            .map_err(|e| McpError::Serve(format!("the MCP handshake on stdio failed: {e}")))?,
        _ = shutdown.cancelled() => return Ok(()),
    };
    service
        .waiting()
        .await
        .map_err(|e| McpError::Serve(format!("the stdio server stopped abnormally: {e}")))?;
    Ok(())
}
