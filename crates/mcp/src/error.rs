//! Errors of the MCP crate.

use std::path::PathBuf;

/// What went wrong loading MCP configuration or serving MCP.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    /// The file exists but could not be read.
    #[error("cannot read MCP config {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is not JSON.
    #[error("MCP config {path} is not valid JSON: {source}; fix the syntax or remove the file")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// The JSON does not have the `mcpServers` shape.
    #[error("{source_name}: {message}")]
    Config {
        source_name: String,
        message: String,
    },
    /// The MCP server side could not start.
    #[error("cannot serve MCP: {0}")]
    Serve(String),
}

impl McpError {
    pub(crate) fn config(source_name: &str, message: impl Into<String>) -> Self {
        McpError::Config {
            source_name: source_name.to_string(),
            message: message.into(),
        }
    }
}
