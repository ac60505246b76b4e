//! The result every MCP tool resolves to in a script, declared once as `McpResult<S>`.
//!
//! An MCP client gives each tool an output schema describing the whole `CallToolResult`
//! (`{content, structuredContent?, isError?}`); repeated for every tool it was about a third of a
//! description. Here such a schema is recognised by its shape and printed as `McpResult` (or
//! `McpResult<S>` when the tool declares its structured content), and the description declares
//! the type and its content blocks once.

use serde_json::{Map, Value, json};

/// The declarations the description prints once, before `tools`, when some tool returns an
/// `McpResult`. `data` and `blob` are base64, as MCP sends them.
pub(crate) const MCP_RESULT_TYPES: &str = "type McpResult<S = unknown> = { content: Block[]; structuredContent?: S; isError?: boolean };
// `data` and `blob` are base64.
type Block = { type: \"text\"; text: string } | { type: \"image\" | \"audio\"; data: string; mimeType: string } | { type: \"resource_link\"; uri: string; name: string; mimeType?: string; description?: string } | { type: \"resource\"; resource: { uri: string; mimeType?: string; text?: string; blob?: string } };
";

/// What a script's call of an MCP tool resolves to, as a JSON Schema: the `CallToolResult` object
/// with `structured` (the tool's own output schema) as its `structuredContent`. The `$defs` of
/// `structured` move to the top so its `$ref`s still resolve. Declarations print it as
/// `McpResult<S>`; [`structured_content`] reads `S` back.
pub fn mcp_result_schema(structured: Option<&Map<String, Value>>) -> Value {
    let mut structured = structured.cloned().unwrap_or_default();
    let mut root = Map::new();
    for defs in ["$defs", "definitions"] {
        if let Some(v) = structured.remove(defs) {
            root.insert(defs.to_string(), v);
        }
    }
    let block = json!({
        "type": "object",
        "properties": {
            "type": {"type": "string", "enum": ["text", "image", "audio", "resource_link", "resource"]},
            "text": {"type": "string"},
            "data": {"type": "string", "description": "base64"},
            "mimeType": {"type": "string"},
            "uri": {"type": "string"},
            "name": {"type": "string"},
            "resource": {"type": "object"}
        },
        "required": ["type"]
    });
    root.insert("type".into(), json!("object"));
    root.insert(
        "properties".into(),
        json!({
            "content": {"type": "array", "items": block},
            "structuredContent": Value::Object(structured),
            "isError": {"type": "boolean"}
        }),
    );
    root.insert("required".into(), json!(["content"]));
    Value::Object(root)
}

/// `Some(None)` when `schema` is an MCP result without declared structured content,
/// `Some(Some(s))` with the schema of its structured content (its root `$defs` copied in so its
/// references resolve), `None` when it is not an MCP result.
///
/// Recognised by shape: an object whose only properties are `content` (an array of blocks whose
/// `type` may be `"text"`), `structuredContent` and `isError`, with `content` required. A tool's
/// own output schema almost never looks like that, and if one did, it would describe the same
/// value.
pub(crate) fn structured_content(schema: &Value) -> Option<Option<Value>> {
    let map = schema.as_object()?;
    let properties = map.get("properties")?.as_object()?;
    if !properties
        .keys()
        .all(|k| matches!(k.as_str(), "content" | "structuredContent" | "isError"))
    {
        return None;
    }
    let required: Vec<&str> = map
        .get("required")?
        .as_array()?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    if required != ["content"] {
        return None;
    }
    let content = properties.get("content")?;
    if content.get("type")? != "array" {
        return None;
    }
    let kinds = content
        .get("items")?
        .get("properties")?
        .get("type")?
        .get("enum")?
        .as_array()?;
    if !kinds.iter().any(|k| k == "text") {
        return None;
    }
    let structured = match properties.get("structuredContent") {
        None => return Some(None),
        Some(Value::Object(s)) if s.is_empty() => return Some(None),
        Some(Value::Bool(true)) => return Some(None),
        Some(s) => s.clone(),
    };
    let mut structured = structured;
    if let Value::Object(s) = &mut structured {
        for defs in ["$defs", "definitions"] {
            if let Some(v) = map.get(defs)
                && !s.contains_key(defs)
            {
                s.insert(defs.to_string(), v.clone());
            }
        }
    }
    Some(Some(structured))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_its_own_schema_and_nothing_else() {
        assert_eq!(structured_content(&mcp_result_schema(None)), Some(None));
        let own = json!({"type": "object", "$defs": {"T": {"type": "string"}},
            "properties": {"t": {"$ref": "#/$defs/T"}}});
        let wrapped = mcp_result_schema(own.as_object());
        let structured = structured_content(&wrapped).unwrap().unwrap();
        assert_eq!(structured["properties"]["t"], json!({"$ref": "#/$defs/T"}));
        assert_eq!(structured["$defs"]["T"], json!({"type": "string"}));

        assert_eq!(structured_content(&json!({"type": "object"})), None);
        let content_only = json!({"type": "object", "properties": {"content": {"type": "string"}}, "required": ["content"]});
        assert_eq!(structured_content(&content_only), None);
        let extra = json!({"type": "object", "required": ["content"], "properties": {
            "content": {"type": "array", "items": {"properties": {"type": {"enum": ["text"]}}}},
            "other": {"type": "string"}}});
        assert_eq!(structured_content(&extra), None);
    }
}
