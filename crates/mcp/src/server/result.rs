//! What a client gets back: a script's run, or a direct tool's output, as a `CallToolResult`.

use codemode_runtime::ScriptRun;
use codemode_spec::{ContentBlock as SpecBlock, ToolOutput};
use rmcp::model::{CallToolResult, ContentBlock as Content};
use serde_json::{Value, json};

/// The run's text first, then its media (`image()` output, returned images, audio and binary
/// resources) as content blocks of their own. `structuredContent` is the structured result with
/// every base64 payload replaced by its size: the client has the blocks already.
pub(crate) fn script_result(run: &ScriptRun, extra_text: Option<&str>) -> CallToolResult {
    let mut text = run.text.clone();
    if let Some(extra) = extra_text {
        text.push('\n');
        text.push_str(extra);
    }
    let mut content = vec![Content::text(text)];
    for block in &run.media {
        match serde_json::from_value::<Content>(block.clone()) {
            Ok(c) => content.push(c),
            Err(e) => content.push(Content::text(format!(
                "[a {} block could not be sent: {e}]",
                block.get("type").and_then(Value::as_str).unwrap_or("media")
            ))),
        }
    }
    let mut result = if run.is_error {
        CallToolResult::error(content)
    } else {
        CallToolResult::success(content)
    };
    let mut structured = run.structured();
    if let Some(output) = structured.get_mut("output").and_then(Value::as_array_mut) {
        for item in output.iter_mut() {
            if item.get("type").and_then(Value::as_str) == Some("image")
                && let Some(map) = item.as_object_mut()
                && let Some(Value::String(data)) = map.remove("data")
            {
                map.insert("bytes".into(), json!(data.len() / 4 * 3));
                map.insert("note".into(), json!("sent as an image content block"));
            }
        }
    }
    result.structured_content = Some(structured);
    result
}

/// A direct call's output. An MCP tool's result goes back as the upstream sent it (every block
/// kind, its own `structuredContent`, `isError`); other tools' output as text and images.
pub(crate) fn direct_result(output: ToolOutput, from_mcp: bool) -> CallToolResult {
    if from_mcp && let Some(result) = upstream_result(&output) {
        return result;
    }
    let blocks = match output.content {
        Some(blocks) => blocks
            .into_iter()
            .map(|b| match b {
                SpecBlock::Text { text } => Content::text(text),
                SpecBlock::Image { data, mime_type } => Content::image(data, mime_type),
            })
            .collect(),
        None => vec![Content::text(match &output.value {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })],
    };
    let mut result = if output.is_error {
        CallToolResult::error(blocks)
    } else {
        CallToolResult::success(blocks)
    };
    if output.value.is_object() {
        result.structured_content = Some(output.value);
    }
    result
}

/// The `CallToolResult` an MCP tool's value holds (what `to_tool_output` kept of it), unless a
/// hook replaced it with something else.
fn upstream_result(output: &ToolOutput) -> Option<CallToolResult> {
    let map = output.value.as_object()?;
    let blocks = map.get("content")?.as_array()?;
    let content: Vec<Content> = blocks
        .iter()
        .map(|b| serde_json::from_value(b.clone()).ok())
        .collect::<Option<_>>()?;
    let mut result = if output.is_error {
        CallToolResult::error(content)
    } else {
        CallToolResult::success(content)
    };
    result.structured_content = map.get("structuredContent").cloned();
    Some(result)
}
