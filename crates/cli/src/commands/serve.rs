//! `codemode serve`: codemode as an MCP server.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Result, bail};
use clap::Args;

use crate::SetupArgs;
use crate::setup::{self, LimitFlags};

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Serve streamable HTTP on this address instead of stdio (loopback unless --token is set).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Bearer token every HTTP request must carry; required for a non-loopback address.
    #[arg(long, value_name = "TOKEN", env = "CODEMODE_SERVE_TOKEN")]
    pub token: Option<String>,
    #[command(flatten)]
    pub limits: LimitFlags,
    #[command(flatten)]
    pub setup: SetupArgs,
}

pub async fn run(args: ServeArgs) -> Result<ExitCode> {
    if let Some(addr) = args.listen
        && !addr.ip().is_loopback()
        && args.token.is_none()
    {
        bail!(
            "{addr} is reachable from other machines: pass --token (or CODEMODE_SERVE_TOKEN) so that every request must carry it, or listen on 127.0.0.1"
        );
    }
    // Questions go to the person through their MCP client (elicitation), never to a terminal:
    // stdin and stdout carry the protocol.
    let approvals = codemode_mcp::ElicitationApprover::new();
    let installation =
        setup::build_with(&args.setup, &args.limits, Some(Arc::new(approvals.clone()))).await?;
    // Scripts cannot yet wait for one server to come up, so the first connection round is
    // awaited before serving; the installation itself does not need it.
    let ready = installation.servers_ready().await;
    for warning in installation.warnings() {
        tracing::warn!("{warning}");
    }
    ready?;
    // Tell every client when the MCP servers' tools changed (the registry already follows).
    let mut changes = installation.tools_changed();
    changes.borrow_and_update();
    let notifier = approvals.clone();
    let follower = tokio::spawn(async move {
        while changes.changed().await.is_ok() {
            notifier.notify_tool_list_changed().await;
        }
    });
    let codemode = installation.codemode().clone();
    let result = match args.listen {
        Some(addr) => {
            match codemode_mcp::serve_http(codemode.clone(), addr, args.token.clone(), approvals)
                .await
            {
                Ok(server) => {
                    eprintln!("codemode: serving MCP at http://{}/mcp", server.local_addr);
                    server.wait().await
                }
                Err(e) => Err(e),
            }
        }
        None => codemode_mcp::serve_stdio(codemode.clone(), approvals).await,
    };
    follower.abort();
    installation.shutdown().await;
    result?;
    Ok(ExitCode::SUCCESS)
}
