//! `codemode serve`: codemode as an MCP server.

use std::net::SocketAddr;
use std::process::ExitCode;

use anyhow::{Result, bail};
use clap::Args;

use crate::SetupArgs;
use crate::setup::{LimitFlags, Setup};

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
    if let Some(addr) = args.listen {
        if !addr.ip().is_loopback() && args.token.is_none() {
            bail!(
                "{addr} is reachable from other machines: pass --token (or CODEMODE_SERVE_TOKEN) so that every request must carry it, or listen on 127.0.0.1"
            );
        }
    }
    let setup = Setup::build(&args.setup, &args.limits).await?;
    for warning in &setup.warnings {
        tracing::warn!("{warning}");
    }
    #[cfg(feature = "serve")]
    let result = match args.listen {
        Some(addr) => {
            codemode_mcp::serve_http(setup.codemode.clone(), addr, args.token.clone()).await
        }
        None => codemode_mcp::serve_stdio(setup.codemode.clone()).await,
    };
    #[cfg(not(feature = "serve"))]
    let result: Result<()> = Err(anyhow::anyhow!(
        "this build of codemode has no MCP server: build it with the `serve` feature"
    ));
    setup.shutdown().await;
    result?;
    Ok(ExitCode::SUCCESS)
}
