//! MCP both ways.
//!
//! * The **client** ([`McpConfig`], [`McpHub`]) connects to the user's MCP servers and turns each of
//!   their tools into a [`codemode_spec::Tool`] named `mcp__<server>__<tool>`, so that every call a
//!   script or the model makes to them goes through the gate like any other tool.
//! * The **server** ([`serve_stdio`], [`serve_http`], feature `server`) offers the `codemode` tool
//!   (and, in mode `on`, the direct tools) to any MCP client, with one gate for every call.

mod bounded_line;
mod client;
mod config;
mod error;
mod naming;
#[cfg(feature = "server")]
mod server;

pub use client::{
    ConnectOptions, McpHub, ProgressRoute, ProgressSink, ProxyError, ServerState, ServerStatus,
    route_progress, to_tool_output,
};
pub use config::{
    ExposureRule, ExposureRules, McpConfig, ServerConfig, ServerTransport, expand_vars,
    parse_exposure,
};
pub use error::McpError;
pub use naming::{
    LeftOut, MAX_TOOL_NAME, mcp_namespace, mcp_tool_name, name_server_tools, sanitize,
};
#[cfg(feature = "server")]
pub use server::{
    Activity, DEFAULT_MAX_CONNECTIONS_PER_PEER, ElicitationApprover, HttpOptions, HttpServer,
    MetricsText, ServeOptions, TokenPrincipal, serve_http, serve_stdio,
};
