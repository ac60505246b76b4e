//! `edit`: replace an exact piece of text in a file.

use std::path::Path;
use std::sync::Arc;

use codemode_spec::{BoxFuture, CallFacts, Tool, ToolCall, ToolError, ToolOutput, ToolSpec};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::args::parse;
use crate::fs_atomic::atomic_write;
use crate::paths::path_facts;
use crate::support::{Behaviour, Context, io_error, make_spec, run_change, text_output};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EditArgs {
    path: String,
    old_string: String,
    new_string: String,
    #[serde(default)]
    replace_all: bool,
}

pub(crate) struct EditTool {
    ctx: Arc<Context>,
    spec: ToolSpec,
}

impl EditTool {
    pub fn new(ctx: Arc<Context>) -> Self {
        let spec = make_spec(
            &ctx,
            "edit",
            "Edit file",
            "Replace an exact piece of text in a file. `old_string` must match the file exactly, whitespace and indentation included, and must occur once unless `replace_all` is true. Include enough surrounding lines to make it unique. The file is rewritten atomically.",
            json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "minLength": 1, "description": "File to edit, relative to the working directory or absolute."},
                    "old_string": {"type": "string", "minLength": 1, "description": "The exact text to replace."},
                    "new_string": {"type": "string", "description": "The text to put in its place."},
                    "replace_all": {"type": "boolean", "description": "Replace every occurrence instead of requiring exactly one (default false)."}
                },
                "required": ["path", "old_string", "new_string"],
                "additionalProperties": false
            }),
            Some(json!({"type": "string"})),
            Behaviour::Destructive,
        );
        EditTool { ctx, spec }
    }
}

impl Tool for EditTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn facts(&self, args: &Value) -> Result<CallFacts, ToolError> {
        let args: EditArgs = parse("edit", args)?;
        let path = self.ctx.resolve(&args.path)?;
        path_facts(&path)
    }

    fn call(&self, call: ToolCall) -> BoxFuture<'static, Result<ToolOutput, ToolError>> {
        let ctx = self.ctx.clone();
        Box::pin(async move {
            let args: EditArgs = parse("edit", &call.args)?;
            let path = ctx.resolve(&args.path)?;
            let shown = ctx.display(&path);
            run_change(call.cancel, move || edit_file(&path, &shown, &args)).await
        })
    }
}

fn edit_file(path: &Path, shown: &str, args: &EditArgs) -> Result<ToolOutput, ToolError> {
    if args.old_string.is_empty() {
        return Err(ToolError::invalid(
            "old_string is empty; give the exact text to replace (use write to create a file)",
        ));
    }
    if args.old_string == args.new_string {
        return Err(ToolError::invalid(
            "old_string and new_string are the same, so the edit would change nothing",
        ));
    }
    if path.exists() && !path.is_file() {
        return Err(ToolError::invalid(format!(
            "{} is not a regular file; edit changes text files only",
            path.display()
        )));
    }
    let bytes = std::fs::read(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            ToolError::failed(format!(
                "file not found: {} (use write to create a file)",
                path.display()
            ))
        } else {
            io_error("read", path, &e)
        }
    })?;
    let text = String::from_utf8(bytes).map_err(|_| {
        ToolError::invalid(format!(
            "{} is not UTF-8 text, so edit cannot match text in it",
            path.display()
        ))
    })?;
    let starts: Vec<usize> = text
        .match_indices(&args.old_string)
        .map(|(at, _)| at)
        .collect();
    if starts.is_empty() {
        return Err(ToolError::failed(no_match_message(
            path,
            &text,
            &args.old_string,
        )));
    }
    let lines: Vec<usize> = starts.iter().map(|at| line_of(&text, *at)).collect();
    if starts.len() > 1 && !args.replace_all {
        return Err(ToolError::failed(format!(
            "old_string occurs {} times in {} (at lines {}); include more surrounding text to make it unique, or set replace_all to true to replace them all",
            starts.len(),
            path.display(),
            join_numbers(&lines)
        )));
    }
    let updated = text.replace(&args.old_string, &args.new_string);
    atomic_write(path, updated.as_bytes())?;
    let plural = if starts.len() == 1 { "" } else { "s" };
    Ok(text_output(format!(
        "Edited {shown}: replaced {} occurrence{plural} (line{plural} {}).",
        starts.len(),
        join_numbers(&lines)
    )))
}

fn no_match_message(path: &Path, text: &str, old: &str) -> String {
    let mut message = format!(
        "old_string was not found in {}. It must match exactly, including whitespace, indentation and line breaks; read the file again and copy the text as it is.",
        path.display()
    );
    if text.contains("\r\n") && old.contains('\n') && !old.contains("\r\n") {
        message.push_str(" The file uses CRLF (\\r\\n) line endings; old_string uses \\n only.");
    } else if squash_whitespace(text).contains(&squash_whitespace(old)) {
        message.push_str(
            " The text does occur when whitespace is ignored, so the spaces, tabs or indentation differ.",
        );
    }
    message
}

fn squash_whitespace(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// 1-based line number of a byte offset.
fn line_of(text: &str, at: usize) -> usize {
    text.as_bytes()[..at]
        .iter()
        .filter(|b| **b == b'\n')
        .count()
        + 1
}

fn join_numbers(numbers: &[usize]) -> String {
    numbers
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}
