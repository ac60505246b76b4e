//! `write`: create or replace a file, atomically.

use std::sync::Arc;

use codemode_spec::{BoxFuture, CallFacts, Tool, ToolCall, ToolError, ToolOutput, ToolSpec};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::args::parse;
use crate::fs_atomic::atomic_write;
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

    fn facts(&self, args: &Value) -> Result<CallFacts, ToolError> {
        let args: WriteArgs = parse("write", args)?;
        let path = self.ctx.resolve(&args.path)?;
        path_facts(&path)
    }

    fn call(&self, call: ToolCall) -> BoxFuture<'static, Result<ToolOutput, ToolError>> {
        let ctx = self.ctx.clone();
        Box::pin(async move {
            let args: WriteArgs = parse("write", &call.args)?;
            let path = ctx.resolve(&args.path)?;
            let shown = ctx.display(&path);
            run_change(call.cancel, move || {
                let existed = path.exists();
                atomic_write(&path, args.content.as_bytes())?;
                let verb = if existed { "Replaced" } else { "Created" };
                Ok(text_output(format!(
                    "{verb} {shown}: wrote {} bytes.",
                    args.content.len()
                )))
            })
            .await
        })
    }
}
