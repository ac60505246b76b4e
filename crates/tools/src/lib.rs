//! The built-in coding tools: `read`, `write`, `edit`, `ls`, `find`, `grep` and `bash`.
//!
//! Each tool implements [`codemode_spec::Tool`] and runs only behind the gate, which decides on
//! policy. The tools never check policy themselves. Instead, `prepare` resolves every path once,
//! component by component without letting the kernel follow a symlink, keeps the directory
//! handles it opened, and reports the absolute resolved path as the call's facts; `run` then
//! works on those handles only (opening, creating and renaming relative to the held directory)
//! and refuses if the path no longer leads there. A path rule therefore judges what the call
//! really touches, and neither `..`, a symlink, nor a symlink swapped in after the decision can
//! slip past it.

mod args;
mod bash;
mod config;
mod edit;
mod find;
mod fs;
mod glob;
mod grep;
mod held_bytes;
mod ls;
mod paths;
mod read;
mod support;
mod truncate;
mod write;

use std::sync::Arc;

use codemode_spec::Tool;

pub use config::ToolsConfig;
pub use paths::resolve_path;

/// Builds the seven built-in tools for one working directory.
///
/// The order is stable (read, write, edit, ls, find, grep, bash) so declarations and tool lists
/// come out the same on every run.
pub fn builtin_tools(config: &ToolsConfig) -> Vec<Arc<dyn Tool>> {
    let ctx = Arc::new(support::Context::new(config));
    vec![
        Arc::new(read::ReadTool::new(ctx.clone())),
        Arc::new(write::WriteTool::new(ctx.clone())),
        Arc::new(edit::EditTool::new(ctx.clone())),
        Arc::new(ls::LsTool::new(ctx.clone())),
        Arc::new(find::FindTool::new(ctx.clone())),
        Arc::new(grep::GrepTool::new(ctx.clone())),
        Arc::new(bash::BashTool::new(ctx)),
    ]
}
