//! Every integration test of this crate in one binary: one link instead of one per file,
//! which keeps the build's disk use and link time down. A file that needs a process of its
//! own (a global allocator, its own `main`, its own memory figures) stays a separate target.

#[macro_use]
mod common;
mod approvals_display;
mod audit_verify;
mod child_programs;
mod cli;
mod configuration;
mod limits;
mod mcp_run;
mod protected_config;
mod serve_cell_principal;
mod serve_cells;
mod serve_elicitation;
mod serve_gateway;
mod serve_http;
mod serve_http_hardening;
mod serve_http_idle_connections;
mod serve_http_sessions;
mod serve_principal_share;
mod serve_protocol;
mod serve_readyz_secrets;
mod serve_replicas;
mod serve_replicas_session_end;
mod serve_session_expiry;
mod serve_sessionless;
mod serve_signals;
mod serve_stdio_sessions;
mod server_log_volume;
mod signal_audit;
mod terminal_approval;
mod terminal_output;
mod terminal_text;
mod wiring;
