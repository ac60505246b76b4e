//! The client side: the user's MCP servers as codemode tools.

mod backlog;
mod changes;
mod exited;
mod handler;
mod http_client;
mod hub;
mod listing;
mod ordered;
mod progress;
mod prompts;
mod proxy;
mod redact;
mod resources;
mod result;
mod screen;
mod server_log;
mod sse_events;
mod stderr_lines;
mod stdio;
mod tool;
mod upstream;

pub use hub::{ConnectOptions, McpHub};
pub use progress::{ProgressRoute, ProgressSink, route_progress};
pub use proxy::ProxyError;
pub use result::to_tool_output;
pub(crate) use tool::upstream_output_schema;
pub use upstream::{ServerState, ServerStatus};
