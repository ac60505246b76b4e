//! `ls`: the entries of one directory.

use std::path::Path;
use std::sync::Arc;

use codemode_spec::{BoxFuture, CallFacts, Tool, ToolCall, ToolError, ToolOutput, ToolSpec};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::args::parse;
use crate::paths::path_facts;
use crate::support::{Behaviour, Context, io_error, make_spec, run_blocking, text_output};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LsArgs {
    path: Option<String>,
}

pub(crate) struct LsTool {
    ctx: Arc<Context>,
    spec: ToolSpec,
}

impl LsTool {
    pub fn new(ctx: Arc<Context>) -> Self {
        let spec = make_spec(
            &ctx,
            "ls",
            "List directory",
            "List the entries of a directory, sorted by name, one a line; directories end with `/`. Hidden entries are included. Without `path`, lists the working directory. To search a whole tree, use find.",
            json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "minLength": 1, "description": "Directory to list, relative to the working directory or absolute (default: the working directory)."}
                },
                "additionalProperties": false
            }),
            Some(json!({"type": "string"})),
            Behaviour::ReadOnly,
        );
        LsTool { ctx, spec }
    }
}

impl Tool for LsTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn facts(&self, args: &Value) -> Result<CallFacts, ToolError> {
        let args: LsArgs = parse("ls", args)?;
        let root = self.ctx.resolve_root(args.path.as_deref())?;
        path_facts(&root)
    }

    fn call(&self, call: ToolCall) -> BoxFuture<'static, Result<ToolOutput, ToolError>> {
        let ctx = self.ctx.clone();
        Box::pin(async move {
            let args: LsArgs = parse("ls", &call.args)?;
            let root = ctx.resolve_root(args.path.as_deref())?;
            let max_bytes = ctx.config.max_output_bytes;
            run_blocking(call.cancel, move |_| list(&root, max_bytes)).await
        })
    }
}

fn list(dir: &Path, max_bytes: usize) -> Result<ToolOutput, ToolError> {
    let meta = std::fs::metadata(dir).map_err(|e| io_error("list", dir, &e))?;
    if !meta.is_dir() {
        return Err(ToolError::invalid(format!(
            "{} is a file, not a directory; use read to see its content",
            dir.display()
        )));
    }
    let reader = std::fs::read_dir(dir).map_err(|e| io_error("list", dir, &e))?;
    let mut names: Vec<String> = Vec::new();
    for entry in reader {
        let entry = entry.map_err(|e| io_error("list", dir, &e))?;
        let mut name = entry.file_name().to_string_lossy().into_owned();
        // Follow symlinks so a link to a directory is marked as one.
        if std::fs::metadata(entry.path()).is_ok_and(|m| m.is_dir()) {
            name.push('/');
        }
        names.push(name);
    }
    names.sort();
    if names.is_empty() {
        return Ok(text_output("(empty directory)".to_owned()));
    }
    let total = names.len();
    let mut out = String::new();
    for (shown, name) in names.iter().enumerate() {
        if out.len() + name.len() + 1 > max_bytes {
            out.push_str(&format!(
                "[Showing {shown} of {total} entries (output cap of {max_bytes} bytes reached); use find with a pattern to narrow the list.]\n"
            ));
            break;
        }
        out.push_str(name);
        out.push('\n');
    }
    Ok(text_output(out))
}
