//! The codemode MCP server: `list_tools` and `call_tool`, written by hand because the `codemode`
//! tool's description is generated from the tools registered at run time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use codemode_runtime::{Codemode, ScriptRequest};
use codemode_spec::{CodemodeMode, ContentBlock as SpecBlock, ToolOutput, ToolSpec};
use rmcp::ErrorData;
use rmcp::ServerHandler;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock as Content,
    Implementation, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig,
    Tool, ToolAnnotations,
};
use rmcp::service::{RequestContext, RoleServer};
use serde_json::{Map, Value, json};

use super::approval::ElicitationApprover;

/// One MCP session: its own store, budgets and approvals, keyed by `session_id`.
#[derive(Clone)]
pub(crate) struct CodemodeHandler {
    codemode: Codemode,
    approvals: ElicitationApprover,
    session: Arc<Session>,
}

struct Session {
    /// The MCP session id when the transport has one, else one made up for this connection.
    id: OnceLock<String>,
    fallback_id: String,
    codemode: Codemode,
    approvals: ElicitationApprover,
}

impl Drop for Session {
    fn drop(&mut self) {
        let id = self
            .id
            .get()
            .cloned()
            .unwrap_or_else(|| self.fallback_id.clone());
        self.codemode.end_session(&id);
        self.approvals.forget(&id);
    }
}

static NEXT_SESSION: AtomicU64 = AtomicU64::new(1);

impl CodemodeHandler {
    pub(crate) fn new(codemode: Codemode, approvals: ElicitationApprover, transport: &str) -> Self {
        let n = NEXT_SESSION.fetch_add(1, Ordering::Relaxed);
        let fallback_id = format!("mcp-{transport}-{}-{n}", std::process::id());
        CodemodeHandler {
            session: Arc::new(Session {
                id: OnceLock::new(),
                fallback_id,
                codemode: codemode.clone(),
                approvals: approvals.clone(),
            }),
            codemode,
            approvals,
        }
    }

    /// The session id for this request; registers the client for approvals on first use.
    fn session_id(&self, context: &RequestContext<RoleServer>) -> String {
        let id = self.session.id.get_or_init(|| {
            context
                .extensions
                .get::<http::request::Parts>()
                .and_then(|p| p.headers.get("mcp-session-id"))
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
                .unwrap_or_else(|| self.session.fallback_id.clone())
        });
        let can_elicit = context
            .peer
            .peer_info()
            .is_some_and(|info| info.capabilities.elicitation.is_some());
        self.approvals
            .register(id, context.peer.clone(), can_elicit);
        id.clone()
    }

    fn client_name(context: &RequestContext<RoleServer>) -> Option<String> {
        context.client_info().map(|i| i.name)
    }

    fn codemode_tool(&self) -> Tool {
        let schema = json!({
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": "The JavaScript to run."}
            },
            "required": ["code"]
        });
        let mut tool = Tool::new_with_raw(
            codemode_gate::CODEMODE_TOOL,
            Some(self.codemode.description().into()),
            Arc::new(as_object(schema)),
        );
        tool.annotations = Some(ToolAnnotations::with_title("Run a codemode script"));
        tool
    }

    async fn run_codemode(
        &self,
        args: Option<Map<String, Value>>,
        context: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let Some(code) = args
            .as_ref()
            .and_then(|a| a.get("code"))
            .and_then(Value::as_str)
        else {
            return CallToolResult::error(vec![Content::text(
                "the codemode tool takes {\"code\": \"<JavaScript>\"}; `code` is missing or not a string",
            )]);
        };
        let session_id = self.session_id(&context);
        let mut req = ScriptRequest::new(code, session_id);
        req.client = Self::client_name(&context);
        // The client's notifications/cancelled cancels the request's token; it aborts the script.
        req.abort = context.ct.clone();
        let run = self.codemode.run_script(req).await;
        let mut result = if run.is_error {
            CallToolResult::error(vec![Content::text(run.text.clone())])
        } else {
            CallToolResult::success(vec![Content::text(run.text.clone())])
        };
        result.structured_content = Some(run.structured());
        result
    }

    async fn run_direct(
        &self,
        name: &str,
        args: Option<Map<String, Value>>,
        context: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let session_id = self.session_id(&context);
        let args = args.map(Value::Object).unwrap_or_else(|| json!({}));
        match self
            .codemode
            .call_direct(name, args, &session_id, Self::client_name(&context))
            .await
        {
            Ok(output) => direct_result(output),
            Err(e) => CallToolResult::error(vec![Content::text(e.to_string())]),
        }
    }
}

impl ServerHandler for CodemodeHandler {
    fn get_info(&self) -> ServerConfig {
        let mut info = ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        );
        info.server_info = Implementation::new("codemode", env!("CARGO_PKG_VERSION"));
        info.instructions = Some(
            "Call the `codemode` tool with a short JavaScript program that calls tools as \
             `await tools.<name>(args)` and returns what you need; only the program's output \
             comes back to you."
                .into(),
        );
        info
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        self.session_id(&context);
        let mut tools = Vec::new();
        if self.codemode.offers_codemode_tool() {
            tools.push(self.codemode_tool());
        }
        if self.codemode.mode() == CodemodeMode::On {
            tools.extend(self.codemode.model_declared_tools().iter().map(to_mcp_tool));
        }
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let result = if request.name == codemode_gate::CODEMODE_TOOL
            && !self.codemode.offers_codemode_tool()
        {
            CallToolResult::error(vec![Content::text(
                "the codemode tool is not enabled here; call the declared tools directly",
            )])
        } else if request.name == codemode_gate::CODEMODE_TOOL {
            self.run_codemode(request.arguments, context).await
        } else {
            // Mode `only` is enforced by the gate, which refuses a model's direct call and says
            // to call the tool from a script instead.
            self.run_direct(&request.name, request.arguments, context)
                .await
        };
        Ok(CallToolResponse::Complete(result))
    }
}

fn as_object(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

fn to_mcp_tool(spec: &ToolSpec) -> Tool {
    let mut tool = Tool::new_with_raw(
        spec.name.clone(),
        Some(spec.description.clone().into()),
        Arc::new(as_object(spec.input_schema.clone())),
    );
    let a = &spec.annotations;
    let mut hints = ToolAnnotations::new();
    hints.title = a.title.clone();
    hints.read_only_hint = a.read_only_hint;
    hints.destructive_hint = a.destructive_hint;
    hints.idempotent_hint = a.idempotent_hint;
    hints.open_world_hint = a.open_world_hint;
    tool.annotations = Some(hints);
    tool
}

fn direct_result(output: ToolOutput) -> CallToolResult {
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
