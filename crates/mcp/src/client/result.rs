//! MCP tool results as codemode sees them.

use codemode_spec::{ContentBlock, ToolOutput};
use rmcp::model::CallToolResult;
use serde_json::{Map, Value};

/// Converts a `CallToolResult`.
///
/// * The script gets the result object itself (`content`, `structuredContent`, `isError`, without
///   `_meta`), untruncated, so it can branch on `isError` and hand image blocks
///   (`{type:"image", data, mimeType}`) to `image()`.
/// * The model (a direct call) gets text and image blocks; other block kinds become a line of
///   text saying what they were.
pub fn to_tool_output(server: &str, tool: &str, mut result: CallToolResult) -> ToolOutput {
    let is_error = result.is_error.unwrap_or(false);
    // Moved, not copied: a result of a million values is tens of megabytes a copy, and a
    // script may have many arriving at once.
    let structured = result.structured_content.take();
    let blocks = std::mem::take(&mut result.content);
    let rest = match serde_json::to_value(&result) {
        Ok(Value::Object(rest)) => rest,
        _ => Map::new(),
    };
    let mut map = Map::new();
    let content = blocks
        .into_iter()
        .map(|block| serde_json::to_value(block).unwrap_or(Value::Null))
        .collect();
    map.insert("content".into(), Value::Array(content));
    if let Some(structured) = structured {
        map.insert("structuredContent".into(), structured);
    }
    for (key, field) in rest {
        if key != "_meta" && key != "resultType" && key != "content" {
            map.insert(key, field);
        }
    }
    let value = Value::Object(map);
    let blocks = value
        .get("content")
        .and_then(Value::as_array)
        .map(|items| items.iter().map(model_block).collect::<Vec<_>>())
        .unwrap_or_default();
    let mut content = blocks;
    let has_text = content
        .iter()
        .any(|b| matches!(b, ContentBlock::Text { text } if !text.is_empty()));
    if !has_text {
        if is_error {
            content.insert(
                0,
                ContentBlock::Text {
                    text: format!("MCP tool {server}/{tool} returned an error"),
                },
            );
        } else if content.is_empty()
            && let Some(structured) = value.get("structuredContent")
        {
            content.push(ContentBlock::Text {
                text: structured.to_string(),
            });
        }
    }
    ToolOutput {
        value,
        content: Some(content),
        is_error,
        usage: None,
        held: Default::default(),
    }
}

fn model_block(block: &Value) -> ContentBlock {
    let field = |k: &str| block.get(k).and_then(Value::as_str).unwrap_or("");
    match field("type") {
        "text" => ContentBlock::Text {
            text: field("text").to_string(),
        },
        "image" => ContentBlock::Image {
            data: field("data").to_string(),
            mime_type: field("mimeType").to_string(),
        },
        "audio" => ContentBlock::Text {
            text: format!(
                "[audio ({}), {} bytes of base64; a script can read it from the result]",
                field("mimeType"),
                field("data").len()
            ),
        },
        "resource_link" => ContentBlock::Text {
            text: format!(
                "[Resource {} \"{}\" ({}): {}]",
                field("uri"),
                field("name"),
                field("mimeType"),
                field("description")
            ),
        },
        "resource" => {
            let resource = block.get("resource").cloned().unwrap_or(Value::Null);
            let uri = resource.get("uri").and_then(Value::as_str).unwrap_or("");
            match resource.get("text").and_then(Value::as_str) {
                Some(text) => ContentBlock::Text {
                    text: format!("[Resource {uri}]\n{text}"),
                },
                None => ContentBlock::Text {
                    text: format!("[Resource {uri}: binary content; a script can read it]"),
                },
            }
        }
        other => ContentBlock::Text {
            text: format!("[{other} content]"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn result(v: Value) -> CallToolResult {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn error_with_empty_text_gets_a_message() {
        let out = to_tool_output("s", "t", result(json!({"content": [], "isError": true})));
        assert!(out.is_error);
        assert_eq!(
            out.content.unwrap(),
            vec![ContentBlock::Text {
                text: "MCP tool s/t returned an error".into()
            }]
        );
        assert_eq!(out.value["isError"], json!(true));
    }

    #[test]
    fn script_value_keeps_blocks_and_drops_meta() {
        let out = to_tool_output(
            "s",
            "t",
            result(json!({
                "content": [{"type": "image", "data": "AAA=", "mimeType": "image/png"}],
                "structuredContent": {"a": 1},
                "_meta": {"x": 1}
            })),
        );
        assert_eq!(out.value["content"][0]["mimeType"], json!("image/png"));
        assert_eq!(out.value["structuredContent"], json!({"a": 1}));
        assert!(out.value.get("_meta").is_none());
        assert!(!out.is_error);
    }

    /// What a script reads, key order included: moving the parts must not change it.
    #[test]
    fn script_value_is_the_result_as_sent_less_meta() {
        let sent = json!({
            "resultType": "complete",
            "content": [{"type": "text", "text": "t"}],
            "structuredContent": null,
            "isError": false,
            "_meta": {"x": 1}
        });
        let out = to_tool_output("s", "t", result(sent));
        assert_eq!(
            serde_json::to_string(&out.value).unwrap(),
            r#"{"content":[{"type":"text","text":"t"}],"structuredContent":null,"isError":false}"#
        );
        let out = to_tool_output("s", "t", result(json!({"isError": true})));
        assert_eq!(
            serde_json::to_string(&out.value).unwrap(),
            r#"{"content":[],"isError":true}"#
        );
    }
}
