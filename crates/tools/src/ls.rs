//! `ls`: the entries of one directory.

use std::sync::Arc;

use codemode_spec::{PreparedCall, Tool, ToolError, ToolOutput, ToolSpec, prepared};
use rustix::fs::FileType;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::args::parse;
use crate::fs::{MAX_DIR_ENTRIES, Resolved, read_entries};
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
            "List the entries of a directory, sorted by name, one a line; directories end with `/`, symlinks with `@`. Hidden entries are included. Without `path`, lists the working directory. To search a whole tree, use find.",
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

    fn prepare(&self, args: Value) -> Result<Box<dyn PreparedCall>, ToolError> {
        let args: LsArgs = parse("ls", args)?;
        let root = self.ctx.resolve_root(args.path.as_deref())?;
        let facts = path_facts(&root.path)?;
        let max_bytes = self.ctx.config.max_output_bytes;
        Ok(prepared(facts, move |ctx| {
            Box::pin(run_blocking(ctx.cancel, move |_| list(&root, max_bytes)))
        }))
    }
}

fn list(dir: &Resolved, max_bytes: usize) -> Result<ToolOutput, ToolError> {
    let fd = dir.open_dir()?;
    let entries = read_entries(&fd).map_err(|e| io_error("list", &dir.path, &e))?;
    let total = entries.len();
    let more = if total >= MAX_DIR_ENTRIES { "+" } else { "" };
    if total == 0 {
        return Ok(text_output("(empty directory)".to_owned()));
    }
    let mut out = String::new();
    for (shown, (name, kind)) in entries.iter().enumerate() {
        let mut name = name.to_string_lossy().into_owned();
        // Symlinks are shown as links, not followed: where they lead is for read or ls to
        // resolve (and for the policy to judge).
        match *kind {
            FileType::Directory => name.push('/'),
            FileType::Symlink => name.push('@'),
            _ => {}
        }
        if out.len() + name.len() + 1 > max_bytes {
            out.push_str(&format!(
                "[Showing {shown} of {total}{more} entries (output cap of {max_bytes} bytes reached); use find with a pattern to narrow the list.]\n"
            ));
            break;
        }
        out.push_str(&name);
        out.push('\n');
    }
    Ok(text_output(out))
}
