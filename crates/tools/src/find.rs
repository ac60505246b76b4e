//! `find`: files and directories whose names match a glob.

use std::sync::Arc;

use codemode_spec::{PreparedCall, Tool, ToolError, ToolOutput, ToolSpec, prepared};
use rustix::fs::FileType;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::args::parse;
use crate::fs::{Ignores, Leaf, Resolved, walk};
use crate::glob::PathGlob;
use crate::paths::path_facts;
use crate::support::{
    Behaviour, Context, StopFlag, make_spec, preview, run_blocking, structured_output,
};

const DEFAULT_LIMIT: usize = 1000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FindArgs {
    pattern: String,
    path: Option<String>,
    limit: Option<usize>,
}

pub(crate) struct FindTool {
    ctx: Arc<Context>,
    spec: ToolSpec,
}

impl FindTool {
    pub fn new(ctx: Arc<Context>) -> Self {
        let spec = make_spec(
            &ctx,
            "find",
            "Find files",
            &format!(
                "Find files and directories by glob: their paths, sorted; directories end with `/`; none is an empty list. A pattern without `/` matches names anywhere in the tree (`*.rs`); one with `/` matches the path relative to the searched directory (`src/**/*.rs`). Skips what .gitignore excludes and the .git directory. Paths inside the working directory are relative to it. At most `limit` paths (default {DEFAULT_LIMIT}); `truncated` says there were more."
            ),
            json!({
                "type": "object",
                "properties": {
                    "pattern": {"type": "string", "minLength": 1, "description": "Glob such as `*.rs` or `src/**/*.test.ts`."},
                    "path": {"type": "string", "minLength": 1, "description": "Directory to search (default: the working directory)."},
                    "limit": {"type": "integer", "minimum": 1, "description": format!("Most results to return (default {DEFAULT_LIMIT}).")}
                },
                "required": ["pattern"],
                "additionalProperties": false
            }),
            Some(json!({
                "type": "object",
                "properties": {
                    "paths": {"type": "array", "items": {"type": "string"}, "description": "Relative to the working directory when inside it, else absolute; directories end with `/`."},
                    "truncated": {"type": "boolean", "description": "More paths matched than are listed (limit or output cap)."}
                },
                "required": ["paths", "truncated"],
                "additionalProperties": false
            })),
            Behaviour::ReadOnly,
        );
        FindTool { ctx, spec }
    }
}

impl Tool for FindTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn prepare(&self, args: Value) -> Result<Box<dyn PreparedCall>, ToolError> {
        let args: FindArgs = parse("find", args)?;
        let glob = PathGlob::new(&args.pattern)?;
        let root = self.ctx.resolve_root(args.path.as_deref())?;
        let facts = path_facts(&root.path)?;
        let limit = args.limit.unwrap_or(DEFAULT_LIMIT).max(1);
        let ctx = self.ctx.clone();
        Ok(prepared(facts, move |run| {
            Box::pin(run_blocking(run.cancel, move |stop| {
                find(&ctx, &root, &glob, &args.pattern, limit, &stop)
            }))
        }))
    }
}

fn find(
    ctx: &Context,
    root: &Resolved,
    glob: &PathGlob,
    pattern: &str,
    limit: usize,
    stop: &StopFlag,
) -> Result<ToolOutput, ToolError> {
    if !matches!(root.leaf, Leaf::Dir) {
        return Err(ToolError::invalid(format!(
            "{} is not a directory (or does not exist); give a directory to search",
            root.path.display()
        )));
    }
    let fd = root.open_dir()?;
    let max_bytes = ctx.config.max_output_bytes;
    let mut out = String::new();
    let mut paths: Vec<String> = Vec::new();
    let mut shown = 0usize;
    let mut total = 0usize;
    let mut byte_cap = false;
    let ignores = Ignores::above(&root.path, stop)?;
    walk(&fd, &root.path, &ignores, stop, |entry| {
        if !glob.matches(entry.rel) {
            return true;
        }
        total += 1;
        if shown < limit && !byte_cap {
            let mut line = ctx.display(entry.path);
            if entry.kind == FileType::Directory {
                line.push('/');
            }
            if out.len() + line.len() + 1 > max_bytes {
                byte_cap = true;
            } else {
                out.push_str(&line);
                out.push('\n');
                paths.push(line);
                shown += 1;
            }
        }
        true
    })?;
    if stop.is_set() {
        return Err(ToolError::cancelled());
    }
    if total == 0 {
        return Ok(structured_output(
            json!({"paths": [], "truncated": false}),
            format!(
                "No files match `{}` under {}.",
                preview(pattern, 200),
                ctx.display(&root.path)
            ),
        ));
    }
    if shown < total {
        let why = if byte_cap {
            format!("output cap of {max_bytes} bytes reached")
        } else {
            format!("limit {limit}")
        };
        out.push_str(&format!(
            "\n[Showing {shown} of {total} matches ({why}); narrow the pattern or path, or raise limit.]\n"
        ));
    }
    Ok(structured_output(
        json!({"paths": paths, "truncated": shown < total}),
        out,
    ))
}
