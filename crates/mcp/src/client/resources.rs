//! A server's resources as two tools per server, so scripts reach them through the gate like
//! any tool: `mcp__<server>__list_resources` and `mcp__<server>__read_resource`.
//!
//! Tools rather than a new kind of call, because then everything the gate does for tools holds
//! for resources without a special case: the policy decides on the server (the tool's name and
//! namespace) and the URI (`context.args.uri`), hooks see the read, the audit log records it,
//! and discovery (`searchTools`, `describeNamespace`) lists them. Both are read-only.

use std::collections::HashSet;
use std::sync::Arc;

use codemode_spec::{
    Annotations, CallFacts, CallKind, ContentBlock, Exposure, PreparedCall, Tool, ToolError,
    ToolOutput, ToolSpec, prepared,
};
use serde_json::{Value, json};

use super::upstream::Upstream;
use crate::naming::{mcp_namespace, own_tool_claiming};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ResourceKind {
    List,
    Read,
}

/// The resource tools of a server whose names are free: (kind, name on the server's side for
/// exposure rules, registered name). A server's own tool of the same name, or one that sanitizes
/// to it (`read-resource`), wins.
pub(crate) fn resource_tool_names<'a>(
    server: &str,
    own_tools: impl IntoIterator<Item = &'a str> + Clone,
    taken: &HashSet<String>,
) -> Vec<(ResourceKind, &'static str, String)> {
    [
        (ResourceKind::List, "list_resources"),
        (ResourceKind::Read, "read_resource"),
    ]
    .into_iter()
    .filter(|(_, local)| own_tool_claiming(own_tools.clone(), local).is_none())
    .map(|(kind, local)| (kind, local, format!("{}__{local}", mcp_namespace(server))))
    .filter(|(_, _, name)| !taken.contains(name))
    .collect()
}

/// What the resource and prompt tools are: reads of the server's own data, safe to repeat.
pub(crate) fn read_only() -> Annotations {
    Annotations {
        title: None,
        read_only_hint: Some(true),
        destructive_hint: Some(false),
        idempotent_hint: Some(true),
        open_world_hint: None,
    }
}

pub(crate) struct ResourceTool {
    spec: ToolSpec,
    kind: ResourceKind,
    upstream: Arc<Upstream>,
}

impl ResourceTool {
    pub(crate) fn new(
        kind: ResourceKind,
        name: String,
        exposure: Exposure,
        upstream: Arc<Upstream>,
    ) -> Self {
        let server = upstream.name().to_string();
        let (description, input_schema, output_schema) = match kind {
            ResourceKind::List => (
                format!(
                    "Lists the resources of MCP server {server}: fixed ones (uri, name, \
                     mimeType, description) and URI templates to fill in. Read one with \
                     read_resource."
                ),
                json!({"type": "object", "properties": {}}),
                json!({
                    "type": "object",
                    "properties": {
                        "resources": {"type": "array", "items": {"type": "object", "properties": {
                            "uri": {"type": "string"}, "name": {"type": "string"},
                            "mimeType": {"type": "string"}, "description": {"type": "string"}},
                            "required": ["uri", "name"]}},
                        "resourceTemplates": {"type": "array", "items": {"type": "object", "properties": {
                            "uriTemplate": {"type": "string"}, "name": {"type": "string"},
                            "mimeType": {"type": "string"}, "description": {"type": "string"}},
                            "required": ["uriTemplate", "name"]}}
                    },
                    "required": ["resources", "resourceTemplates"]
                }),
            ),
            ResourceKind::Read => (
                format!(
                    "Reads a resource of MCP server {server} by URI (one from list_resources, or \
                     a URI template filled in). Each item of contents has text, or blob \
                     (base64)."
                ),
                json!({
                    "type": "object",
                    "properties": {"uri": {"type": "string", "description": "The resource's URI"}},
                    "required": ["uri"]
                }),
                json!({
                    "type": "object",
                    "properties": {"contents": {"type": "array", "items": {"type": "object", "properties": {
                        "uri": {"type": "string"}, "mimeType": {"type": "string"},
                        "text": {"type": "string"}, "blob": {"type": "string", "description": "base64"}},
                        "required": ["uri"]}}},
                    "required": ["contents"]
                }),
            ),
        };
        let spec = ToolSpec {
            name,
            description,
            input_schema: input_schema.into(),
            output_schema: Some(output_schema.into()),
            namespace: Some(mcp_namespace(&server)),
            annotations: read_only(),
            exposure,
            kind: CallKind::Tool,
        };
        ResourceTool {
            spec,
            kind,
            upstream,
        }
    }
}

impl Tool for ResourceTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn prepare(&self, args: Value) -> Result<Box<dyn PreparedCall>, ToolError> {
        let upstream = self.upstream.clone();
        let kind = self.kind;
        Ok(prepared(CallFacts::default(), move |ctx| {
            Box::pin(async move {
                match kind {
                    ResourceKind::List => {
                        let listed = upstream.list_resources_now(&ctx.cancel).await?;
                        let value = json!({
                            "resources": listed.resources,
                            "resourceTemplates": listed.templates,
                        });
                        Ok(ToolOutput::value(value))
                    }
                    ResourceKind::Read => {
                        let uri = args.get("uri").and_then(Value::as_str).ok_or_else(|| {
                            ToolError::invalid("read_resource takes {uri: string}")
                        })?;
                        let result = upstream.read_resource(uri, &ctx.cancel).await?;
                        let mut value = serde_json::to_value(&result)
                            .map_err(|e| ToolError::failed(format!("unreadable resource: {e}")))?;
                        if let Value::Object(map) = &mut value {
                            map.remove("_meta");
                        }
                        let content = contents_for_model(&value);
                        Ok(ToolOutput {
                            value,
                            content: Some(content),
                            is_error: false,
                            usage: None,
                            held: Default::default(),
                        })
                    }
                }
            })
        }))
    }
}

/// Text contents as text, images as images, other binary contents as a line saying what they are.
fn contents_for_model(value: &Value) -> Vec<ContentBlock> {
    let items = value
        .get("contents")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    items
        .iter()
        .map(|item| {
            let field = |k: &str| item.get(k).and_then(Value::as_str).unwrap_or("");
            if let Some(text) = item.get("text").and_then(Value::as_str) {
                return ContentBlock::Text {
                    text: text.to_string(),
                };
            }
            let mime = field("mimeType");
            if mime.starts_with("image/") {
                return ContentBlock::Image {
                    data: field("blob").to_string(),
                    mime_type: mime.to_string(),
                };
            }
            ContentBlock::Text {
                text: format!(
                    "[Resource {} ({}), {} bytes of base64; a script can read it]",
                    field("uri"),
                    mime,
                    field("blob").len()
                ),
            }
        })
        .collect()
}
