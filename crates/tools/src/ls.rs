//! `ls`: the entries of one directory.

use std::sync::Arc;

use codemode_spec::{PreparedCall, Tool, ToolError, ToolOutput, ToolSpec, prepared};
use rustix::fs::FileType;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::args::parse;
use crate::fs::{MAX_DIR_ENTRIES, Resolved, read_entries};
use crate::paths::path_facts;
use crate::support::{Behaviour, Context, io_error, make_spec, run_blocking, structured_output};

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
            "List the entries of a directory, sorted by name, each with its kind (symlinks are not followed). Hidden entries are included. Without `path`, lists the working directory. To search a whole tree, use find.",
            json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "minLength": 1, "description": "Directory to list, relative to the working directory or absolute (default: the working directory)."}
                },
                "additionalProperties": false
            }),
            Some(json!({
                "type": "object",
                "properties": {
                    "entries": {"type": "array", "items": {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string"},
                            "kind": {"type": "string", "enum": ["file", "dir", "symlink", "other"]}
                        },
                        "required": ["name", "kind"],
                        "additionalProperties": false
                    }},
                    "truncated": {"type": "boolean", "description": "The directory has more entries than are listed (output cap)."}
                },
                "required": ["entries", "truncated"],
                "additionalProperties": false
            })),
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
        return Ok(structured_output(
            json!({"entries": [], "truncated": false}),
            "(empty directory)".to_owned(),
        ));
    }
    // The script gets `{name, kind}`; a direct call reads one name a line, directories marked
    // with `/` and symlinks with `@`. Symlinks are listed, not followed: where they lead is for
    // read or ls to resolve (and for the policy to judge).
    let mut out = String::new();
    let mut listed: Vec<Value> = Vec::new();
    let mut truncated = total >= MAX_DIR_ENTRIES;
    for (shown, (name, kind)) in entries.iter().enumerate() {
        let name = name.to_string_lossy().into_owned();
        let (kind, mark) = match *kind {
            FileType::Directory => ("dir", "/"),
            FileType::Symlink => ("symlink", "@"),
            FileType::RegularFile => ("file", ""),
            _ => ("other", ""),
        };
        if out.len() + name.len() + 2 > max_bytes {
            truncated = true;
            out.push_str(&format!(
                "[Showing {shown} of {total}{more} entries (output cap of {max_bytes} bytes reached); use find with a pattern to narrow the list.]\n"
            ));
            break;
        }
        out.push_str(&name);
        out.push_str(mark);
        out.push('\n');
        listed.push(json!({"name": name, "kind": kind}));
    }
    Ok(structured_output(
        json!({"entries": listed, "truncated": truncated}),
        out,
    ))
}
