//! The codemode MCP server: `list_tools` and `call_tool`, written by hand because the `codemode`
//! tool's description is generated from the tools registered at run time; in mode `on` also the
//! upstream servers' resources and prompts.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use codemode_runtime::{CallEvent, CallObserver, Codemode, ScriptRequest};
use codemode_spec::{CodemodeMode, Exposure, ToolSpec};
use rmcp::ErrorData;
use rmcp::ServerHandler;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock as Content,
    CustomRequest, CustomResult, ErrorCode, GetPromptRequestParams, GetPromptResponse,
    GetPromptResult, Implementation, ListPromptsResult, ListResourceTemplatesResult,
    ListResourcesResult, ListToolsResult, PaginatedRequestParams, ProgressNotificationParam,
    ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, ServerCapabilities,
    ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::{Peer, RequestContext, RoleServer};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use super::ServeOptions;
use super::approval::ElicitationApprover;
use super::result::{direct_result, script_result};
use crate::client::{ProxyError, route_progress, upstream_output_schema};

/// The second tool, declared when scripts run as cells.
const WAIT_TOOL: &str = "wait";

/// A cell's report: its text, then media, with the report as `structuredContent`.
fn cell_result(report: &codemode_runtime::CellReport, extra_text: Option<&str>) -> CallToolResult {
    let mut text = report.text.clone();
    if let Some(extra) = extra_text {
        text.push('\n');
        text.push_str(extra);
    }
    let mut content = vec![Content::text(text)];
    for block in &report.media {
        if let Ok(c) = serde_json::from_value::<Content>(block.clone()) {
            content.push(c);
        }
    }
    let mut result = if report.is_error {
        CallToolResult::error(content)
    } else {
        CallToolResult::success(content)
    };
    result.structured_content = Some(super::result::for_client(report.structured()));
    result
}

/// How often a running script tells a client that asked for progress that it is still alive.
const HEARTBEAT: Duration = Duration::from_secs(5);

/// One MCP session: its own store, budgets and approvals, keyed by `session_id`.
#[derive(Clone)]
pub(crate) struct CodemodeHandler {
    codemode: Codemode,
    approvals: ElicitationApprover,
    opts: ServeOptions,
    session: Arc<Session>,
}

/// What to do with a session's store when its connection ends.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnEnd {
    /// stdio: the session is over.
    Forget,
    /// HTTP: the session may come back on a new connection; the session table decides.
    Keep,
}

struct Session {
    /// The MCP session id when the transport has one, else one made up for this connection.
    id: OnceLock<String>,
    fallback_id: String,
    /// Tells this connection's registrations from a later connection's for the same session.
    owner: u64,
    on_end: OnEnd,
    codemode: Codemode,
    approvals: ElicitationApprover,
    /// Set once this connection asked its client about approvals left pending earlier.
    asked_pending: std::sync::atomic::AtomicBool,
}

impl Drop for Session {
    fn drop(&mut self) {
        let id = self
            .id
            .get()
            .cloned()
            .unwrap_or_else(|| self.fallback_id.clone());
        if self.on_end == OnEnd::Forget || self.id.get().is_none() {
            self.codemode.end_session(&id);
        }
        self.approvals.forget(&id, self.owner);
    }
}

static NEXT_SESSION: AtomicU64 = AtomicU64::new(1);
static NEXT_CALL: AtomicU64 = AtomicU64::new(1);

impl CodemodeHandler {
    pub(crate) fn new(
        codemode: Codemode,
        approvals: ElicitationApprover,
        opts: ServeOptions,
        transport: &str,
        on_end: OnEnd,
    ) -> Self {
        let n = NEXT_SESSION.fetch_add(1, Ordering::Relaxed);
        // Random, not pid and counter: the session's `store()` values, cells and approvals
        // outlive a killed process, and a later one with the same pid (pids are reused, and
        // every container's first process is pid 1) must not take them over.
        let fallback_id = format!("mcp-{transport}-{}", uuid::Uuid::new_v4().simple());
        CodemodeHandler {
            session: Arc::new(Session {
                id: OnceLock::new(),
                fallback_id,
                owner: n,
                on_end,
                codemode: codemode.clone(),
                approvals: approvals.clone(),
                asked_pending: std::sync::atomic::AtomicBool::new(false),
            }),
            codemode,
            approvals,
            opts,
        }
    }

    /// The session id for this request; registers the client for approvals.
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
            .register(id, context.peer.clone(), can_elicit, self.session.owner);
        // A client that comes back (a new connection for its session) is asked about the calls
        // of its cells that paused for approval while nobody could ask it.
        if can_elicit
            && self.codemode.cells().is_some()
            && !self.session.asked_pending.swap(true, Ordering::AcqRel)
        {
            let approvals = self.approvals.clone();
            let codemode = self.codemode.clone();
            let session = id.clone();
            let client = Self::client_name(context);
            tokio::spawn(async move {
                approvals.ask_pending(&codemode, &session, client).await;
            });
        }
        id.clone()
    }

    fn client_name(context: &RequestContext<RoleServer>) -> Option<String> {
        context.client_info().map(|i| i.name)
    }

    fn mode_on(&self) -> bool {
        self.codemode.mode() == CodemodeMode::On
    }

    fn codemode_tool(&self) -> Tool {
        let schema = json!({
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": "The JavaScript to run."}
            },
            "required": ["code"]
        });
        // Servers that are starting or down are named in it (their namespaces say so).
        let description = self.codemode.description();
        let mut tool = Tool::new_with_raw(
            codemode_gate::CODEMODE_TOOL,
            Some(description.into()),
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
        let _busy = self.opts.activity.enter();
        let session_id = self.session_id(&context);
        let call_id = format!("codemode_{}", NEXT_CALL.fetch_add(1, Ordering::Relaxed));
        let mut req = ScriptRequest::new(code, session_id);
        req.client = Self::client_name(&context);
        req.parent_call_id = Some(call_id.clone());
        // The client's notifications/cancelled, or codemode shutting down, aborts the script.
        let abort = self.opts.shutdown.child_token();
        let _abort_on_cancel = forward_cancel(context.ct.clone(), abort.clone());
        req.abort = abort;
        let reporter = context
            .meta
            .get_progress_token()
            .map(|token| Progress::start(context.peer.clone(), token));
        let _route = reporter.as_ref().map(|r| {
            req.on_call = Some(r.observer());
            route_progress(&call_id, r.sink())
        });
        if self.codemode.cells().is_some() {
            let report = self.codemode.start_cell(req).await;
            drop(reporter);
            return match report {
                Ok(report) => {
                    let note = report
                        .run
                        .as_ref()
                        .and_then(|run| self.unavailable_note(run));
                    cell_result(&report, note.as_deref())
                }
                Err(e) => CallToolResult::error(vec![Content::text(e.to_string())]),
            };
        }
        let run = self.codemode.run_script(req).await;
        drop(reporter);
        let note = self.unavailable_note(&run);
        script_result(&run, note.as_deref())
    }

    /// The `wait` tool: more output of a cell of this session, its result, or its end.
    async fn run_wait(
        &self,
        args: Option<Map<String, Value>>,
        context: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let _busy = self.opts.activity.enter();
        let session_id = self.session_id(&context);
        let args = args.unwrap_or_default();
        let Some(cell) = args.get("cell").and_then(Value::as_str) else {
            return CallToolResult::error(vec![Content::text(
                "wait takes {\"cell\": \"<id a codemode call returned>\"}, optionally \"timeout_ms\" or \"terminate\": true; `cell` is missing or not a string",
            )]);
        };
        let timeout = match args.get("timeout_ms") {
            None | Some(Value::Null) => None,
            Some(v) => match v.as_u64().filter(|ms| *ms <= 3_600_000) {
                Some(ms) => Some(Duration::from_millis(ms)),
                None => {
                    return CallToolResult::error(vec![Content::text(
                        "wait's `timeout_ms` is a whole number of milliseconds from 0 to 3600000",
                    )]);
                }
            },
        };
        let terminate = match args.get("terminate") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                return CallToolResult::error(vec![Content::text(
                    "wait's `terminate` is true or false",
                )]);
            }
        };
        if let Some(key) = args
            .keys()
            .find(|k| !["cell", "timeout_ms", "terminate"].contains(&k.as_str()))
        {
            return CallToolResult::error(vec![Content::text(format!(
                "wait does not know `{key}`; it takes `cell`, `timeout_ms` and `terminate`"
            ))]);
        }
        let opts = codemode_runtime::WaitOptions { timeout, terminate };
        // A client that gives up waiting does not stop the cell: it keeps running.
        tokio::select! {
            r = self.codemode.wait_cell(&session_id, cell, opts) => match r {
                Ok(report) => {
                    let note = report.run.as_ref().and_then(|run| self.unavailable_note(run));
                    cell_result(&report, note.as_deref())
                }
                Err(e) => CallToolResult::error(vec![Content::text(e.to_string())]),
            },
            _ = context.ct.cancelled() => CallToolResult::error(vec![Content::text("wait was cancelled; the cell keeps running")]),
        }
    }

    fn wait_tool(&self) -> Tool {
        let schema = json!({
            "type": "object",
            "properties": {
                "cell": {"type": "string", "description": "The cell id a codemode call returned."},
                "timeout_ms": {"type": "integer", "minimum": 0, "description": "Return after this long if the cell still runs."},
                "terminate": {"type": "boolean", "description": "Stop the cell and cancel its calls."}
            },
            "required": ["cell"]
        });
        let mut tool = Tool::new_with_raw(
            WAIT_TOOL,
            Some(
                "Continue a codemode script that yielded (status `running` or `waiting_for_approval`): returns its new output and, once it ended, its result. `terminate: true` stops it."
                    .into(),
            ),
            Arc::new(as_object(schema)),
        );
        tool.annotations = Some(ToolAnnotations::with_title("Wait for a codemode cell"));
        tool
    }

    /// When a script failed on a `tools.mcp__<server>__…` name of a server that is down, says
    /// that the server is down (the sandbox only knows the name is not there).
    fn unavailable_note(&self, run: &codemode_runtime::ScriptRun) -> Option<String> {
        let hub = self.opts.hub.as_ref()?;
        let message = &run.result.as_ref()?.error.as_ref()?.message;
        let (_, rest) = message.split_once("tools.mcp__")?;
        hub.unavailable()
            .into_iter()
            .find(|(server, _)| {
                let ns = crate::naming::sanitize(server);
                rest.starts_with(&format!("{ns}__")) || rest.starts_with(&format!("{ns} "))
            })
            .map(|(_, why)| why)
    }

    async fn run_direct(
        &self,
        name: &str,
        args: Option<Map<String, Value>>,
        context: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let _busy = self.opts.activity.enter();
        let session_id = self.session_id(&context);
        let args = args.map(Value::Object).unwrap_or_else(|| json!({}));
        let from_mcp = self
            .codemode
            .gate()
            .registry()
            .specs()
            .iter()
            .any(|s| s.name == name && is_mcp(s));
        // The client's notifications/cancelled, or codemode shutting down, cancels the call.
        let cancel = self.opts.shutdown.child_token();
        let _cancel_on_cancel = forward_cancel(context.ct.clone(), cancel.clone());
        match self
            .codemode
            .call_direct(name, args, &session_id, Self::client_name(&context), cancel)
            .await
        {
            Ok(output) => direct_result(output, from_mcp),
            Err(e) => CallToolResult::error(vec![Content::text(e.to_string())]),
        }
    }

    /// The hub, when this server offers resources and prompts; otherwise `method` (the request's
    /// own method, for the error) is not found.
    fn hub_for_proxy(&self, method: &str) -> Result<&Arc<crate::McpHub>, ErrorData> {
        match &self.opts.hub {
            Some(hub) if self.mode_on() => Ok(hub),
            _ => Err(ErrorData::new(
                ErrorCode::METHOD_NOT_FOUND,
                format!(
                    "{method} is not offered here: codemode serves its MCP servers' resources \
                     and prompts only in mode `on`"
                ),
                None,
            )),
        }
    }

    /// A request the MCP client makes itself (a resource read, a prompt) as the gated call of
    /// `tool` with origin client: policy, hooks, approval and audit as for any call. `what`
    /// names the request in errors.
    async fn call_for_client<T: serde::de::DeserializeOwned>(
        &self,
        tool: &str,
        args: Value,
        what: &str,
        context: &RequestContext<RoleServer>,
    ) -> Result<T, ErrorData> {
        let _busy = self.opts.activity.enter();
        let session_id = self.session_id(context);
        let output = self
            .codemode
            .call_for_client(
                tool,
                args,
                &session_id,
                Self::client_name(context),
                context.ct.clone(),
            )
            .await
            .map_err(|e| ErrorData::invalid_request(e.to_string(), None))?;
        if output.is_error {
            return Err(ErrorData::internal_error(
                format!("{what} failed: {}", output.value),
                None,
            ));
        }
        serde_json::from_value::<T>(output.value)
            .map_err(|e| ErrorData::internal_error(format!("{what}: unreadable answer: {e}"), None))
    }
}

fn is_mcp(spec: &ToolSpec) -> bool {
    spec.namespace
        .as_deref()
        .is_some_and(|n| n.starts_with("mcp__"))
}

impl ServerHandler for CodemodeHandler {
    fn get_info(&self) -> ServerConfig {
        let proxy = self.opts.hub.is_some() && self.mode_on();
        let capabilities = match proxy {
            true => ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .enable_resources()
                .enable_resources_list_changed()
                .enable_prompts()
                .enable_prompts_list_changed()
                .build(),
            false => ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        };
        let mut info = ServerConfig::new(capabilities);
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
            if self.codemode.cells().is_some() {
                tools.push(self.wait_tool());
            }
        }
        if self.mode_on() {
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
        } else if request.name == WAIT_TOOL
            && self.codemode.offers_codemode_tool()
            && self.codemode.cells().is_some()
        {
            self.run_wait(request.arguments, context).await
        } else {
            // Mode `only` is enforced by the gate, which refuses a model's direct call and says
            // to call the tool from a script instead.
            self.run_direct(&request.name, request.arguments, context)
                .await
        };
        Ok(CallToolResponse::Complete(result))
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let registry = self.codemode.gate().registry();
        let listed = |name: &str| {
            registry
                .exposure(name)
                .is_some_and(|e| e != Exposure::Hidden)
        };
        Ok(ListResourcesResult::with_all_items(
            self.hub_for_proxy("resources/list")?
                .resources_where(listed),
        ))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        let registry = self.codemode.gate().registry();
        let listed = |name: &str| {
            registry
                .exposure(name)
                .is_some_and(|e| e != Exposure::Hidden)
        };
        Ok(ListResourceTemplatesResult::with_all_items(
            self.hub_for_proxy("resources/templates/list")?
                .resource_templates_where(listed),
        ))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        // The client's own read is a call like any other, as the server's read_resource tool
        // (the policy sees the server and the URI).
        let tool = self
            .hub_for_proxy("resources/read")?
            .resource_read_tool(&request.uri)
            .map_err(proxy_error)?;
        let what = format!("reading {}", request.uri);
        self.call_for_client::<ReadResourceResult>(
            &tool,
            json!({ "uri": request.uri }),
            &what,
            &context,
        )
        .await
        .map(ReadResourceResponse::Complete)
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        let registry = self.codemode.gate().registry();
        let listed = |name: &str| {
            registry
                .exposure(name)
                .is_some_and(|e| e != Exposure::Hidden)
        };
        Ok(ListPromptsResult::with_all_items(
            self.hub_for_proxy("prompts/list")?.prompts_where(listed),
        ))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        // Like a resource read, as the server's get_prompt tool (the policy sees the server
        // and the prompt's name).
        let (tool, local) = self
            .hub_for_proxy("prompts/get")?
            .prompt_get_tool(&request.name)
            .map_err(proxy_error)?;
        let what = format!("getting prompt {}", request.name);
        // MCP lets a client leave `arguments` out for a prompt that takes none.
        let arguments = request.arguments.unwrap_or_default();
        let args = json!({ "name": local, "arguments": arguments });
        self.call_for_client::<GetPromptResult>(&tool, args, &what, &context)
            .await
            .map(GetPromptResponse::Complete)
    }

    /// rmcp hands a request whose params do not fit its method here, as if the method were
    /// unknown; say what is wrong with the params instead.
    async fn on_custom_request(
        &self,
        request: CustomRequest,
        _context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, ErrorData> {
        match params_error(&request.method, request.params.as_ref()) {
            Some(why) => Err(ErrorData::invalid_params(why, None)),
            None => Err(ErrorData::new(
                ErrorCode::METHOD_NOT_FOUND,
                format!("unknown method {}", request.method),
                None,
            )),
        }
    }
}

/// What is wrong with the params of a request for a method codemode knows, or `None` for a
/// method it does not know.
fn params_error(method: &str, params: Option<&Value>) -> Option<String> {
    fn check<T: serde::de::DeserializeOwned>(params: Option<&Value>) -> Result<(), String> {
        match params {
            None | Some(Value::Null) => Err("params are missing or null".into()),
            Some(p) => serde_json::from_value::<T>(p.clone())
                .map(drop)
                .map_err(|e| e.to_string()),
        }
    }
    let (checked, expected) = match method {
        "tools/call" => (
            check::<CallToolRequestParams>(params),
            "an object with \"name\" (a string) and \"arguments\" (an object)",
        ),
        "prompts/get" => (
            check::<GetPromptRequestParams>(params),
            "an object with \"name\" (a string) and \"arguments\" (an object of strings)",
        ),
        "resources/read" => (
            check::<ReadResourceRequestParams>(params),
            "an object with \"uri\" (a string)",
        ),
        "tools/list" | "resources/list" | "resources/templates/list" | "prompts/list" => (
            match params {
                None | Some(Value::Null) => Ok(()),
                Some(_) => check::<PaginatedRequestParams>(params),
            },
            "an object, with \"cursor\" (a string) if paging",
        ),
        _ => return None,
    };
    let why = checked
        .err()
        .unwrap_or_else(|| "they do not have the expected shape".into());
    Some(format!(
        "invalid params for {method}: {why}; expected {expected}"
    ))
}

fn proxy_error(e: ProxyError) -> ErrorData {
    match e {
        ProxyError::NotFound(m) => ErrorData::invalid_params(m, None),
        ProxyError::Failed(m) => ErrorData::internal_error(m, None),
    }
}

/// Cancels `to` when `from` is cancelled, until dropped.
fn forward_cancel(from: CancellationToken, to: CancellationToken) -> TaskGuard {
    TaskGuard(tokio::spawn(async move {
        from.cancelled().await;
        to.cancel();
    }))
}

/// A task aborted when this is dropped.
struct TaskGuard(tokio::task::JoinHandle<()>);

impl Drop for TaskGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Sends `notifications/progress` to a client that gave a progress token, in order: one line
/// per call started and finished, the upstream servers' own progress, and a heartbeat while
/// nothing else happens, so a client that resets its timeout on progress waits for long scripts.
struct Progress {
    tx: ProgressQueue,
    task: tokio::task::JoinHandle<()>,
}

/// Progress lines waiting for a client: bounded, since a client that does not read its stream
/// would otherwise have the host keep every line of every call (thousands a second). Past the
/// bound a line is dropped and counted, and the next line sent says how many were.
#[derive(Clone)]
struct ProgressQueue {
    tx: tokio::sync::mpsc::Sender<String>,
    dropped: Arc<std::sync::atomic::AtomicU64>,
}

/// Progress lines that may wait for a slow client.
const PROGRESS_QUEUE: usize = 256;

impl ProgressQueue {
    fn send(&self, line: String) {
        if self.tx.try_send(line).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Progress {
    fn start(peer: Peer<RoleServer>, token: rmcp::model::ProgressToken) -> Self {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(PROGRESS_QUEUE);
        let dropped = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let queue = ProgressQueue {
            tx,
            dropped: dropped.clone(),
        };
        let task = tokio::spawn(async move {
            let mut step = 0u64;
            let mut beat = tokio::time::interval(HEARTBEAT);
            beat.tick().await;
            loop {
                let mut message = tokio::select! {
                    m = rx.recv() => match m {
                        Some(m) => m,
                        None => return,
                    },
                    _ = beat.tick() => "still running".to_string(),
                };
                let lost = dropped.swap(0, Ordering::Relaxed);
                if lost > 0 {
                    message = format!(
                        "({lost} progress lines left out: they came faster than they were read) {message}"
                    );
                }
                beat.reset();
                step += 1;
                let mut note = ProgressNotificationParam::new(token.clone(), step as f64);
                note.message = Some(message);
                if peer.notify_progress(note).await.is_err() {
                    return;
                }
            }
        });
        Progress { tx: queue, task }
    }

    fn observer(&self) -> CallObserver {
        let tx = self.tx.clone();
        CallObserver::new(move |event| {
            let line = match event {
                CallEvent::Started { seq, name } => format!("call {seq}: {name} started"),
                CallEvent::Finished { seq, name, ok } => {
                    format!("call {seq}: {name} {}", if ok { "done" } else { "failed" })
                }
            };
            tx.send(line);
        })
    }

    fn sink(&self) -> crate::ProgressSink {
        let tx = self.tx.clone();
        Arc::new(move |line| tx.send(line))
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn as_object(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// A direct tool as MCP declares it; an MCP tool keeps its server's own output schema.
fn to_mcp_tool(spec: &ToolSpec) -> Tool {
    let mut tool = Tool::new_with_raw(
        spec.name.clone(),
        Some(spec.description.clone().into()),
        Arc::new(as_object(spec.input_schema.value())),
    );
    tool.output_schema = upstream_output_schema(spec).map(Arc::new);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Red team: the queue was unbounded, so a client that did not read its stream had the host
    /// keep every progress line (up to about 2.7 GB a script, by the numbers).
    #[tokio::test]
    async fn progress_lines_a_client_does_not_read_are_dropped_and_counted() {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(PROGRESS_QUEUE);
        let queue = ProgressQueue {
            tx,
            dropped: Arc::new(std::sync::atomic::AtomicU64::new(0)),
        };
        for i in 0..100_000 {
            queue.send(format!("call {i}: started"));
        }
        assert_eq!(rx.len(), PROGRESS_QUEUE);
        assert_eq!(
            queue.dropped.load(Ordering::Relaxed),
            100_000 - PROGRESS_QUEUE as u64
        );
        rx.recv().await.unwrap();
        queue.send("room again".into());
        assert_eq!(rx.len(), PROGRESS_QUEUE);
    }
}
