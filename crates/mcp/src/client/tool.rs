//! One MCP tool as a codemode [`Tool`].

use std::sync::Arc;

use codemode_spec::{
    Annotations, CallFacts, Effect, Exposure, PreparedCall, Tool, ToolError, ToolSpec, prepared,
};
use rmcp::model::Tool as McpToolDef;
use serde_json::{Map, Value, json};

use super::result::to_tool_output;
use super::upstream::Upstream;
use crate::naming::mcp_namespace;

pub(crate) struct McpTool {
    spec: ToolSpec,
    /// The tool's name on its server.
    remote_name: String,
    upstream: Arc<Upstream>,
}

impl McpTool {
    pub(crate) fn new(
        name: String,
        def: &McpToolDef,
        exposure: Exposure,
        upstream: Arc<Upstream>,
    ) -> Self {
        let server = upstream.name().to_string();
        let description = def
            .description
            .as_deref()
            .filter(|d| !d.is_empty())
            .map(str::to_string)
            .or_else(|| def.title.clone())
            .unwrap_or_else(|| format!("MCP tool {} from server {server}", def.name));
        let mut hints = def.annotations.clone().unwrap_or_default();
        if !upstream.config.trust_annotations {
            // Claims of a server the user does not believe: keep the title, drop what the
            // policy would read as "cannot change anything".
            hints.read_only_hint = None;
            hints.destructive_hint = None;
            hints.idempotent_hint = None;
            hints.open_world_hint = None;
        }
        let spec = ToolSpec {
            name,
            description,
            input_schema: input_schema(def),
            output_schema: Some(result_schema(def.output_schema.as_deref())),
            namespace: Some(mcp_namespace(&server)),
            annotations: Annotations {
                title: def.title.clone().or(hints.title),
                read_only_hint: hints.read_only_hint,
                destructive_hint: hints.destructive_hint,
                idempotent_hint: hints.idempotent_hint,
                open_world_hint: hints.open_world_hint,
            },
            exposure,
            kind: codemode_spec::CallKind::Tool,
        };
        McpTool {
            spec,
            remote_name: def.name.to_string(),
            upstream,
        }
    }
}

impl Tool for McpTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn prepare(&self, args: Value) -> Result<Box<dyn PreparedCall>, ToolError> {
        let (upstream, remote) = (self.upstream.clone(), self.remote_name.clone());
        let name = self.spec.name.clone();
        Ok(prepared(CallFacts::default(), move |ctx| {
            let progress = ctx
                .provenance
                .parent_call_id
                .as_deref()
                .and_then(super::progress::sink_for)
                .map(|sink| (sink, name));
            Box::pin(async move {
                // Once the request is out, a cancelled call may still have acted on the server.
                let result = upstream
                    .call(&remote, args, &ctx.cancel, progress)
                    .await
                    .map_err(|e| e.with_effect(Effect::Unknown))?;
                Ok(to_tool_output(upstream.name(), &remote, result))
            })
        }))
    }
}

/// The server's input schema, made a proper object schema (some servers omit `type` or
/// `properties`, which declarations and validators need).
fn input_schema(def: &McpToolDef) -> Value {
    let mut schema: Map<String, Value> = def.input_schema.as_ref().clone();
    schema
        .entry("type")
        .or_insert_with(|| Value::String("object".into()));
    schema
        .entry("properties")
        .or_insert_with(|| Value::Object(Map::new()));
    Value::Object(schema)
}

/// Schema of what a script's call resolves to: the `CallToolResult` object. The tool's own output
/// schema describes `structuredContent`; its `$defs` move to the top so its `$ref`s still resolve.
fn result_schema(output: Option<&Map<String, Value>>) -> Value {
    let mut structured = output.cloned().unwrap_or_default();
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
            "mimeType": {"type": "string"}
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

/// The upstream's own output schema of an MCP tool, undoing [`result_schema`]: `None` when the
/// spec is not an MCP tool's or the server declared none.
pub(crate) fn upstream_output_schema(spec: &ToolSpec) -> Option<Map<String, Value>> {
    if !spec
        .namespace
        .as_deref()
        .is_some_and(|n| n.starts_with("mcp__"))
    {
        return None;
    }
    let root = spec.output_schema.as_ref()?.as_object()?;
    let mut structured = root
        .get("properties")?
        .get("structuredContent")?
        .as_object()?
        .clone();
    if structured.is_empty() {
        return None;
    }
    for defs in ["$defs", "definitions"] {
        if let Some(v) = root.get(defs) {
            structured.insert(defs.to_string(), v.clone());
        }
    }
    Some(structured)
}
