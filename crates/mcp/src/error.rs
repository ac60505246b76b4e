//! Errors of the MCP crate.

/// What went wrong serving MCP. (Configuration problems are `codemode_config::ConfigError`s.)
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    /// The MCP server side could not start.
    #[error("cannot serve MCP: {0}")]
    Serve(String),
}
