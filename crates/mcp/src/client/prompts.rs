//! A server's prompts as one gated tool per server, `mcp__<server>__get_prompt`, so that getting
//! a prompt (which the server may compute, reading its own data) is a call like any other: the
//! policy decides on the server and the prompt's name (`context.args.name`), hooks see it and
//! the audit log records it. The MCP client's own `prompts/get` in mode `on` goes through it too.
//!
//! Deferred unless configured narrower: scripts rarely want prompts, so the tool costs no space
//! in the description, yet `searchTools` finds it and `tools.mcp__<server>__get_prompt` works.

use std::collections::HashSet;
use std::sync::Arc;

use codemode_spec::{
    CallFacts, CallKind, Exposure, PreparedCall, Schema, Tool, ToolError, ToolOutput, ToolSpec,
    prepared,
};
use serde_json::{Map, Value, json};

use super::resources::read_only;
use super::upstream::Upstream;
use crate::naming::{mcp_namespace, own_tool_claiming};

/// The server-side name the tool answers to in exposure rules.
pub(crate) const PROMPT_TOOL: &str = "get_prompt";

/// The registered name of a server's prompt tool, unless one of its own tools took it or
/// sanitizes to it (`get-prompt`).
pub(crate) fn prompt_tool_name<'a>(
    server: &str,
    own_tools: impl IntoIterator<Item = &'a str>,
    taken: &HashSet<String>,
) -> Option<String> {
    if own_tool_claiming(own_tools, PROMPT_TOOL).is_some() {
        return None;
    }
    let name = format!("{}__{PROMPT_TOOL}", mcp_namespace(server));
    (!taken.contains(&name)).then_some(name)
}

/// At most deferred: a configured `hidden` still hides it.
pub(crate) fn prompt_exposure(configured: Exposure) -> Exposure {
    if configured.visibility() < Exposure::Deferred.visibility() {
        configured
    } else {
        Exposure::Deferred
    }
}

pub(crate) struct PromptTool {
    spec: ToolSpec,
    upstream: Arc<Upstream>,
}

impl PromptTool {
    pub(crate) fn new(name: String, exposure: Exposure, upstream: Arc<Upstream>) -> Self {
        let server = upstream.name().to_string();
        let names: Vec<String> = upstream
            .catalog()
            .prompts
            .unwrap_or_default()
            .iter()
            .map(|p| p.name.to_string())
            .collect();
        let mut name_schema = json!({"type": "string", "description": "The prompt's name"});
        if !names.is_empty() {
            name_schema["enum"] = json!(names);
        }
        let spec = ToolSpec {
            name,
            description: format!(
                "Gets a prompt of MCP server {server} by name, filled in with its arguments \
                 (strings). Returns its description and messages ({{role, content}})."
            ),
            input_schema: Schema::from(json!({
                "type": "object",
                "properties": {
                    "name": name_schema,
                    "arguments": {"type": "object", "additionalProperties": {"type": "string"}}
                },
                "required": ["name"]
            })),
            output_schema: Some(Schema::from(json!({
                "type": "object",
                "properties": {
                    "description": {"type": "string"},
                    "messages": {"type": "array", "items": {"type": "object", "properties": {
                        "role": {"type": "string"}, "content": {}}, "required": ["role", "content"]}}
                },
                "required": ["messages"]
            }))),
            namespace: Some(mcp_namespace(&server)),
            annotations: read_only(),
            exposure,
            kind: CallKind::Tool,
        };
        PromptTool { spec, upstream }
    }
}

impl Tool for PromptTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn prepare(&self, args: Value) -> Result<Box<dyn PreparedCall>, ToolError> {
        let name = args
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| ToolError::invalid("get_prompt takes {name: string, arguments?}"))?
            .to_string();
        let arguments: Option<Map<String, Value>> = match args.get("arguments") {
            None | Some(Value::Null) => None,
            Some(Value::Object(map)) => Some(map.clone()),
            Some(_) => {
                return Err(ToolError::invalid(
                    "get_prompt's arguments must be an object of strings",
                ));
            }
        };
        let upstream = self.upstream.clone();
        Ok(prepared(CallFacts::default(), move |ctx| {
            Box::pin(async move {
                let result = upstream.get_prompt(&name, arguments, &ctx.cancel).await?;
                let mut value = serde_json::to_value(&result)
                    .map_err(|e| ToolError::failed(format!("unreadable prompt: {e}")))?;
                if let Value::Object(map) = &mut value {
                    map.remove("_meta");
                }
                Ok(ToolOutput::value(value))
            })
        }))
    }
}
