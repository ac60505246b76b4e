//! The client side: the user's MCP servers as codemode tools.

mod handler;
mod hub;
mod result;
mod tool;
mod upstream;

pub use hub::{ConnectOptions, McpHub};
pub use result::to_tool_output;
pub use upstream::{ServerState, ServerStatus};
