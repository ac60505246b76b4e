//! The server side: codemode as an MCP server any MCP client can add.

mod approval;
mod handler;
mod transport;

pub use approval::ElicitationApprover;
pub use transport::{HttpServer, serve_http, serve_stdio};
