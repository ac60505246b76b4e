//! The one-line note a directly declared tool gets: how a script calls it and what it resolves to.

use codemode_spec::ToolSpec;
use serde_json::Value;

use crate::render::{RenderOptions, render_type};
use crate::schema::resolve_ref;
use crate::text::json_string;

/// `Codemode: \`tools.x(args)\` resolves to …` — appended to the description of a tool that is
/// declared to the model directly, so the model knows it can also call it from scripts without the
/// codemode description repeating its whole declaration (its arguments are already declared).
///
/// The result is shown as `a string`, field names (`{ output, exit_code }`), the field names of
/// each variant of a union of objects, a one-line type, or a pointer to `describeTool`; an MCP
/// tool's as `McpResult` with the fields of its structured content.
pub fn direct_tool_note(spec: &ToolSpec) -> String {
    format!(
        "Codemode: `tools.{}(args)` resolves to {}.",
        spec.identifier(),
        describe_output(spec)
    )
}

fn describe_output(spec: &ToolSpec) -> String {
    let Some(schema) = &spec.output_schema else {
        return "a string".into();
    };
    let schema = &schema.value();
    match crate::mcp_result::structured_content(schema) {
        None => {}
        Some(None) => return "an `McpResult` (declared in the codemode tool)".into(),
        Some(Some(structured)) => {
            return match fields(&structured, &structured, 1) {
                Some(fields) => {
                    format!("`McpResult<{fields}>` (`McpResult` is declared in the codemode tool)")
                }
                None => "an `McpResult` (declared in the codemode tool)".into(),
            };
        }
    }
    let rendered = render_type(
        schema,
        &RenderOptions {
            tags: false,
            docs: false,
            ..RenderOptions::default()
        },
    );
    if rendered == "string" {
        return "a string".into();
    }
    if let Some(fields) = fields(schema, schema, 1).or_else(|| union_fields(schema, schema)) {
        return format!("`{fields}`");
    }
    if !rendered.contains('\n') && rendered.len() <= 120 {
        return format!("`{rendered}`");
    }
    format!(
        "a value; `await describeTool({})` shows its type",
        json_string(&spec.name)
    )
}

/// Follows a chain of local `$ref`s, stopping at cycles.
fn follow<'v>(mut schema: &'v Value, root: &'v Value) -> &'v Value {
    for _ in 0..32 {
        match schema.get("$ref").and_then(Value::as_str) {
            Some(reference) => match resolve_ref(reference, root) {
                Some(target) => schema = target,
                None => break,
            },
            None => break,
        }
    }
    schema
}

/// `{ a, b?, kind: "x", nested: { c } }` for an object schema, `depth` levels deep.
fn fields(schema: &Value, root: &Value, depth: usize) -> Option<String> {
    let schema = follow(schema, root);
    let properties = schema.get("properties")?.as_object()?;
    if schema.get("type").is_some_and(|t| t != "object") || properties.is_empty() {
        return None;
    }
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let parts: Vec<String> = properties
        .iter()
        .map(|(name, field)| {
            let mut part = crate::text::property_key(name);
            if !required.contains(&name.as_str()) {
                part.push('?');
            }
            let field = follow(field, root);
            if let Some(value) = field.get("const") {
                part.push_str(": ");
                part.push_str(&crate::schema::literal(value));
            } else if depth > 0
                && let Some(nested) = fields(field, root, depth - 1)
            {
                part.push_str(": ");
                part.push_str(&nested);
            }
            part
        })
        .collect();
    Some(format!("{{ {} }}", parts.join(", ")))
}

fn union_fields(schema: &Value, root: &Value) -> Option<String> {
    let schema = follow(schema, root);
    let variants = schema
        .get("anyOf")
        .or_else(|| schema.get("oneOf"))?
        .as_array()?;
    if variants.is_empty() {
        return None;
    }
    let described: Option<Vec<String>> = variants.iter().map(|v| fields(v, root, 0)).collect();
    Some(described?.join(" | "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn notes_say_what_a_call_resolves_to() {
        let mut bash = ToolSpec::new("bash", "Run a command", json!({"type": "object"}));
        bash.output_schema = Some(codemode_spec::Schema::from(
            json!({"type": "object", "properties": {
            "output": {"type": "string"}, "exit_code": {"type": "integer"}}, "required": ["output", "exit_code"]}),
        ));
        assert_eq!(
            direct_tool_note(&bash),
            "Codemode: `tools.bash(args)` resolves to `{ output, exit_code }`."
        );
        let mut mcp = ToolSpec::new("mcp__s__echo", "Echo", json!({"type": "object"}));
        mcp.output_schema = Some(codemode_spec::Schema::from(crate::mcp_result_schema(None)));
        assert_eq!(
            direct_tool_note(&mcp),
            "Codemode: `tools.mcp__s__echo(args)` resolves to an `McpResult` (declared in the codemode tool)."
        );
        mcp.output_schema = Some(codemode_spec::Schema::from(crate::mcp_result_schema(
            json!({"type": "object", "properties": {"sum": {"type": "number"}}, "required": ["sum"]})
                .as_object(),
        )));
        assert_eq!(
            direct_tool_note(&mcp),
            "Codemode: `tools.mcp__s__echo(args)` resolves to `McpResult<{ sum }>` (`McpResult` is declared in the codemode tool)."
        );
        let read = ToolSpec::new("read-file", "", json!({}));
        assert_eq!(
            direct_tool_note(&read),
            "Codemode: `tools.read_file(args)` resolves to a string."
        );
    }
}
