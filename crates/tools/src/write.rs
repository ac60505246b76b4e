//! `write`: create or replace a file, atomically.

use std::sync::Arc;

use codemode_spec::{PreparedCall, Tool, ToolError, ToolSpec, prepared};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::args::parse;
use crate::fs::write_atomic;
use crate::paths::path_facts;
use crate::support::{Behaviour, Context, make_spec, run_change, text_output};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WriteArgs {
    path: String,
    content: String,
}

pub(crate) struct WriteTool {
    ctx: Arc<Context>,
    spec: ToolSpec,
}

impl WriteTool {
    pub fn new(ctx: Arc<Context>) -> Self {
        let spec = make_spec(
            &ctx,
            "write",
            "Write file",
            "Create a file or replace its whole content. Missing parent directories are created. The write is atomic: the file holds either the old content or the new, never part of it. To change part of a file, use edit instead.",
            json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "minLength": 1, "description": "File to write, relative to the working directory or absolute."},
                    "content": {"type": "string", "description": "The complete new content of the file."}
                },
                "required": ["path", "content"],
                "additionalProperties": false
            }),
            Some(json!({"type": "string"})),
            Behaviour::Destructive,
        );
        WriteTool { ctx, spec }
    }
}

impl Tool for WriteTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn prepare(&self, args: Value) -> Result<Box<dyn PreparedCall>, ToolError> {
        let args: WriteArgs = parse("write", args)?;
        let target = self.ctx.resolve(&args.path)?;
        let facts = path_facts(&target.path)?;
        let shown = self.ctx.display(&target.path);
        Ok(prepared(facts, move |ctx| {
            Box::pin(run_change(ctx.cancel, move || {
                let verb = if target.exists() {
                    "Replaced"
                } else {
                    "Created"
                };
                write_atomic(&target, args.content.as_bytes())?;
                Ok(text_output(format!(
                    "{verb} {shown}: wrote {} bytes.",
                    args.content.len()
                )))
            }))
        }))
    }
}
