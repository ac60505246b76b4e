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
    result.structured_content = Some(for_client(run.structured()));
    result
}

/// A script's or cell's structured result as a client gets it: every base64 payload replaced
/// by its size (the client has the blocks already), within [`MAX_STRUCTURED_BYTES`].
pub(crate) fn for_client(mut structured: Value) -> Value {
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
    bound_structured(&mut structured, MAX_STRUCTURED_BYTES);
    structured
}

/// The most `structuredContent` a script's result carries. The text is cut to the output
/// budget, but the structured result held everything the script printed, returned and called:
/// a client that shows it to the model (some prefer it to the text) got megabytes past
/// `max_output_tokens`, and every response was that large.
const MAX_STRUCTURED_BYTES: usize = 256 * 1024;

/// Drops what the text already says, largest-risk first, until the structured result fits:
/// the printed output, then every call past the first hundred, then the returned value and
/// `store()` writes. What was left out is said in `omitted`; status, error, ids and timings
/// always stay.
fn bound_structured(structured: &mut Value, max: usize) {
    let size = |v: &Value| serde_json::to_vec(v).map_or(usize::MAX, |b| b.len());
    if size(structured) <= max {
        return;
    }
    let Some(map) = structured.as_object_mut() else {
        return;
    };
    let mut omitted = serde_json::Map::new();
    if let Some(output) = map.remove("output") {
        let items = output.as_array().map_or(0, Vec::len);
        omitted.insert(
            "output".into(),
            json!(format!(
                "{items} items, in the text content (cut to the output budget)"
            )),
        );
    }
    let too_big = |map: &serde_json::Map<String, Value>| {
        serde_json::to_vec(map).map_or(true, |b| b.len() > max)
    };
    if too_big(map)
        && let Some(Value::Array(calls)) = map.get_mut("calls")
        && calls.len() > 100
    {
        let left_out = calls.len() - 100;
        calls.truncate(100);
        omitted.insert(
            "calls".into(),
            json!(format!("the {left_out} calls after the first 100")),
        );
    }
    for key in ["value", "storeWrites", "calls"] {
        if too_big(map) && map.remove(key).is_some() {
            omitted.insert(
                key.into(),
                json!("too large for structuredContent; the text content has what fits"),
            );
        }
    }
    map.insert("omitted".into(), Value::Object(omitted));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_structured_result_keeps_its_status_and_says_what_it_left_out() {
        let big = "x".repeat(100_000);
        let mut v = json!({
            "ok": true,
            "status": "finished",
            "cell": "cell_1",
            "output": [{"type": "text", "text": big}, {"type": "text", "text": big}],
            "value": big,
            "calls": (0..500).map(|i| json!({"id": i, "name": "echo", "args": "{}"})).collect::<Vec<_>>(),
            "wallMs": 12.5,
        });
        bound_structured(&mut v, 64 * 1024);
        assert!(serde_json::to_vec(&v).unwrap().len() <= 64 * 1024, "{v}");
        assert_eq!(v["ok"], true);
        assert_eq!(v["status"], "finished");
        assert_eq!(v["cell"], "cell_1");
        assert_eq!(v["wallMs"], 12.5);
        assert!(v.get("output").is_none());
        assert!(v["omitted"]["output"].as_str().unwrap().contains("2 items"));
        assert!(v["omitted"]["value"].is_string(), "{}", v["omitted"]);
        assert_eq!(v["calls"].as_array().map(Vec::len), Some(100));

        // A small one is left whole.
        let mut small = json!({"ok": true, "output": [{"type": "text", "text": "hi"}], "value": 1});
        let before = small.clone();
        bound_structured(&mut small, 64 * 1024);
        assert_eq!(small, before);
    }
}
