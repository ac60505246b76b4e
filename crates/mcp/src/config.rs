//! The MCP configuration the hub takes: read, validated and narrowed by `codemode-config`.

pub use codemode_config::mcp::{
    ExposureRule, ExposureRules, McpConfig, ServerConfig, ServerTransport, expand_vars,
    parse_exposure,
};
