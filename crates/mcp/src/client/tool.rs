//! One MCP tool as a codemode [`Tool`].

use std::sync::Arc;

use codemode_spec::{
    Annotations, CallFacts, Effect, Exposure, PreparedCall, Schema, Tool, ToolError, ToolSpec,
    prepared,
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

/// One tool a server listed: its definition without its schemas, which are converted once,
/// when listed, and shared by every [`McpTool`] made from it (a server may list thousands of
/// tools with large schemas; converting them at every registry sync copied them all again).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ListedTool {
    /// The server's definition; its `input_schema` is empty and its `output_schema` `None`.
    pub(crate) def: McpToolDef,
    pub(crate) input_schema: Schema,
    pub(crate) output_schema: Schema,
}

impl ListedTool {
    pub(crate) fn new(mut def: McpToolDef) -> ListedTool {
        let input = std::mem::take(&mut def.input_schema);
        let input = Arc::try_unwrap(input).unwrap_or_else(|shared| (*shared).clone());
        let output = def
            .output_schema
            .take()
            .map(|output| Arc::try_unwrap(output).unwrap_or_else(|shared| (*shared).clone()));
        ListedTool {
            def,
            input_schema: Schema::from(input_schema(input)),
            output_schema: match output {
                None => PLAIN_RESULT.clone(),
                Some(output) => Schema::from(result_schema(Some(output))),
            },
        }
    }

    /// The tool's name on its server.
    pub(crate) fn name(&self) -> &str {
        &self.def.name
    }
}

/// The result schema of every tool that declares no output schema: one copy for all of them.
static PLAIN_RESULT: std::sync::LazyLock<Schema> =
    std::sync::LazyLock::new(|| Schema::from(result_schema(None)));

impl McpTool {
    pub(crate) fn new(
        name: String,
        listed: &ListedTool,
        exposure: Exposure,
        upstream: Arc<Upstream>,
    ) -> Self {
        let def = &listed.def;
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
            input_schema: listed.input_schema.clone(),
            output_schema: Some(listed.output_schema.clone()),
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
fn input_schema(mut schema: Map<String, Value>) -> Value {
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
fn result_schema(output: Option<Map<String, Value>>) -> Value {
    let mut structured = output.unwrap_or_default();
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
    let root = spec.output_schema.as_ref()?.value();
    let root = root.as_object()?;
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
