//! One upstream MCP server: connecting, reconnecting, listing tools and calling them.

use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use codemode_childenv::PROJECT_DIR_VAR as PROJECT_DIR_ENV;
use codemode_spec::ToolError;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, CancelledNotificationParam,
    ClientRequest, GetPromptResult, Prompt, ReadResourceResult, RequestId, Resource,
    ResourceTemplate, ServerResult,
};
use rmcp::service::{Peer, PeerRequestOptions, RoleClient, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ServiceError, ServiceExt};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::backlog::Backlog;
use super::changes::Changes;
use super::handler::{Handler, Listing};
use super::http_client::ScreenedHttp;
use super::listing;
use super::ordered::CancelAfterRequest;
use super::progress::{ProgressSink, Watchers};
use super::server_log::LogLimit;
use super::stdio::ChildTransport;
use super::tool::ListedTool;
use crate::config::{ServerConfig, ServerTransport};

/// How many of a server's last stderr lines are kept to explain a failed start.
const STDERR_TAIL: usize = 20;

type Service = RunningService<RoleClient, Handler>;

/// What the hub knows about a server right now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerState {
    /// Started in the background and not answered yet.
    Connecting,
    /// Connected, offering this many tools.
    Connected { tools: usize },
    /// Not connected; the reason says why and how to fix it.
    Failed(String),
    /// `enabled: false` in the configuration.
    Disabled,
}

/// The state of one configured server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerStatus {
    pub name: String,
    pub state: ServerState,
}

/// What a connected server told us about itself.
#[derive(Debug, Clone, Default)]
pub(crate) struct Catalog {
    pub(crate) tools: Vec<ListedTool>,
    pub(crate) instructions: Option<String>,
    pub(crate) server_description: Option<String>,
    /// `Some` when the server offers resources (the capability), with what it listed.
    pub(crate) resources: Option<Resources>,
    /// `Some` when the server offers prompts.
    pub(crate) prompts: Option<Vec<Prompt>>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Resources {
    pub(crate) resources: Vec<Resource>,
    pub(crate) templates: Vec<ResourceTemplate>,
}

/// How many call timeouts one request may take in all. Progress restarts the timeout; without
/// a total, a server reporting progress forever would hold a call (and a direct call, which has
/// no script deadline) open for good.
pub(crate) const CALL_LIMIT_FACTOR: u32 = 10;

pub(crate) struct Upstream {
    pub(crate) config: ServerConfig,
    connect_timeout: Duration,
    call_timeout: Duration,
    /// The most one request may take in all, progress or not (`CALL_LIMIT_FACTOR` timeouts).
    call_limit: Duration,
    /// What the server announced as changed, for its refresher (`changes::follow`).
    changes: Arc<Changes>,
    progress: Watchers,
    /// The server's log messages in the host's log, per second (kept across restarts).
    log_limit: Arc<LogLimit>,
    /// The server's refused requests in the host's log, per second.
    refusal_limit: Arc<LogLimit>,
    /// Set once the first attempt to start finished, whatever its outcome.
    attempted: AtomicBool,
    /// Set by `shutdown`: nothing starts the server again.
    closed: AtomicBool,
    /// How long until the background retry tries again, for the message a failed call shows.
    retry_every: Mutex<Option<Duration>>,
    /// Bumped whenever this server's tool list changes.
    generation: Arc<tokio::sync::watch::Sender<u64>>,
    /// Serializes (re)connects so that concurrent calls to a dead server start it only once.
    connect_lock: tokio::sync::Mutex<()>,
    live: RwLock<Option<Live>>,
    catalog: RwLock<Catalog>,
    failure: RwLock<Option<String>>,
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
    /// What waits to be written to the stdio server last started, to tell a server that
    /// stopped reading from one that crashed.
    backlog: RwLock<Option<Arc<Backlog>>>,
    /// Values of the configuration that may be secret, kept out of every message.
    secrets: Vec<String>,
}

struct Live {
    peer: Peer<RoleClient>,
    service: Service,
    /// Dropped after the service, so the server's leftover children go with it.
    _group: Option<ProcessGroup>,
}

/// A stdio server's process group. Dropping it kills every process still in the group: a
/// server that exits cleanly can leave children behind (`npx` runs the real server as one).
struct ProcessGroup(libc::pid_t);

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        // SAFETY: killpg only sends a signal; a group that is already gone gives ESRCH.
        unsafe {
            libc::killpg(self.0, libc::SIGKILL);
        }
    }
}

impl Upstream {
    pub(crate) fn new(
        config: ServerConfig,
        connect_timeout: Duration,
        default_call_timeout: Duration,
        generation: Arc<tokio::sync::watch::Sender<u64>>,
    ) -> Self {
        let call_timeout = config.timeout.unwrap_or(default_call_timeout);
        let secrets = super::redact::secrets_of(&config.transport);
        Upstream {
            secrets,
            config,
            connect_timeout,
            call_timeout,
            call_limit: call_timeout.saturating_mul(CALL_LIMIT_FACTOR),
            changes: Arc::default(),
            progress: Watchers::default(),
            log_limit: Arc::default(),
            refusal_limit: Arc::default(),
            attempted: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            retry_every: Mutex::new(None),
            generation,
            connect_lock: tokio::sync::Mutex::new(()),
            live: RwLock::new(None),
            catalog: RwLock::new(Catalog::default()),
            failure: RwLock::new(None),
            stderr_tail: Arc::new(Mutex::new(VecDeque::new())),
            backlog: RwLock::new(None),
        }
    }

    pub(crate) fn name(&self) -> &str {
        &self.config.name
    }

    pub(crate) fn catalog(&self) -> Catalog {
        read(&self.catalog).clone()
    }

    pub(crate) fn state(&self) -> ServerState {
        if self.closed.load(Ordering::Acquire) {
            return ServerState::Failed("codemode is shutting down".into());
        }
        if let Some(reason) = read(&self.failure).clone() {
            return ServerState::Failed(reason);
        }
        match read(&self.live).as_ref() {
            Some(live) if live.peer.is_transport_closed() => ServerState::Failed(format!(
                "MCP server \"{}\" lost its connection; the next call starts it again",
                self.name()
            )),
            Some(_) => ServerState::Connected {
                tools: read(&self.catalog).tools.len(),
            },
            None if !self.attempted.load(Ordering::Acquire) => ServerState::Connecting,
            None => ServerState::Failed(format!("MCP server \"{}\" is not connected", self.name())),
        }
    }

    /// What a call to this server's tools says while the server is down: what happened and
    /// when it is tried again.
    pub(crate) fn unavailable(&self, why: &str) -> String {
        let retry = match *lock(&self.retry_every) {
            Some(every) => format!(
                "; it is tried again in the background every {} (and by the next call)",
                human_duration(every)
            ),
            None => "; the next call tries to start it again".to_string(),
        };
        self.redact(&format!("{why}{retry}"))
    }

    /// `text` without the configuration's secrets (see `redact`).
    pub(crate) fn redact(&self, text: &str) -> String {
        super::redact::redact(text, &self.secrets)
    }

    pub(crate) fn set_retry_every(&self, every: Option<Duration>) {
        *lock(&self.retry_every) = every;
    }

    /// Connects (or reconnects) and lists the tools. Failures are recorded, never raised.
    pub(crate) async fn connect(&self) -> Result<Peer<RoleClient>, String> {
        let _guard = self.connect_lock.lock().await;
        if self.closed.load(Ordering::Acquire) {
            return Err(format!(
                "MCP server \"{}\" is not started again: codemode is shutting down",
                self.name()
            ));
        }
        if let Some(peer) = self.live_peer() {
            return Ok(peer);
        }
        let outcome = tokio::time::timeout(self.connect_timeout, self.start()).await;
        let was_failed = read(&self.failure).is_some() || !self.attempted.load(Ordering::Acquire);
        self.attempted.store(true, Ordering::Release);
        match outcome {
            Ok(Ok((service, catalog, group))) => {
                let peer = service.peer().clone();
                let changed = {
                    let old = read(&self.catalog);
                    old.tools != catalog.tools
                        || old.resources != catalog.resources
                        || old.prompts != catalog.prompts
                };
                *write(&self.catalog) = catalog;
                *write(&self.failure) = None;
                *write(&self.live) = Some(Live {
                    peer: peer.clone(),
                    service,
                    _group: group,
                });
                if self.closed.load(Ordering::Acquire) {
                    // Shut down while starting: stop what was just started.
                    self.shutdown().await;
                    return Err(format!(
                        "MCP server \"{}\" was stopped: codemode is shutting down",
                        self.name()
                    ));
                }
                if changed || was_failed {
                    self.bump();
                }
                Ok(peer)
            }
            Ok(Err(reason)) => Err(self.fail(reason).await),
            Err(_) => Err(self
                .fail(format!(
                    "did not finish starting within {}; check the command, or raise \
                     \"connectTimeoutMs\" for this server in {} (a first `npx` run downloads \
                     the package and can take a minute)",
                    human_duration(self.connect_timeout),
                    self.config.source
                ))
                .await),
        }
    }

    async fn fail(&self, reason: String) -> String {
        let reason = format!("failed to start: {reason}");
        // Give a dying process a moment to finish its last words on stderr.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let tail: Vec<String> = lock(&self.stderr_tail).iter().cloned().collect();
        let reason = if tail.is_empty() {
            format!("MCP server \"{}\": {reason}", self.name())
        } else {
            format!(
                "MCP server \"{}\": {reason}; its stderr ended with:\n{}",
                self.name(),
                tail.join("\n")
            )
        };
        let reason = self.redact(&reason);
        tracing::warn!(server = %self.name(), %reason, "MCP server unavailable");
        let first = read(&self.failure).is_none();
        *write(&self.failure) = Some(reason.clone());
        if first {
            // The description and `describeNamespace` say the server is down.
            self.bump();
        }
        reason
    }

    fn live_peer(&self) -> Option<Peer<RoleClient>> {
        read(&self.live)
            .as_ref()
            .map(|l| l.peer.clone())
            .filter(|p| !p.is_transport_closed())
    }

    async fn start(&self) -> Result<(Service, Catalog, Option<ProcessGroup>), String> {
        lock(&self.stderr_tail).clear();
        let handler = Handler {
            server: Arc::from(self.name()),
            changes: self.changes.clone(),
            progress: self.progress.clone(),
            log_limit: self.log_limit.clone(),
            refusal_limit: self.refusal_limit.clone(),
        };
        let mut group = None;
        let project_dir = self.config.project_dir.as_deref();
        let transport = self
            .config
            .transport
            .expanded(&|v| {
                if v == PROJECT_DIR_ENV {
                    return project_dir.map(|d| d.display().to_string());
                }
                std::env::var(v).ok()
            })
            .map_err(|e| format!("{e} (in {})", self.config.source))?;
        let service = match &transport {
            ServerTransport::Stdio {
                command,
                args,
                env,
                cwd,
            } => {
                let mut cmd = tokio::process::Command::new(command);
                cmd.args(args).kill_on_drop(true);
                // codemode's environment without its secrets; what the server needs of them,
                // its `env` names.
                cmd.env_clear().envs(codemode_childenv::vars());
                if let Some(dir) = project_dir {
                    cmd.env(PROJECT_DIR_ENV, dir);
                }
                cmd.envs(env);
                // Where it starts decides which program `npx` or `./server` runs, so never a
                // directory an untrusted project controls unless the server's own `cwd` says so.
                let start = self.config.start_dir.as_deref();
                let dir = match (cwd, start) {
                    (Some(cwd), Some(start)) => Some(start.join(cwd)),
                    (Some(cwd), None) => Some(cwd.clone()),
                    (None, start) => start.map(Path::to_path_buf),
                };
                if let Some(dir) = dir {
                    cmd.current_dir(dir);
                }
                // Whatever roots it is given, it cannot read the audit key or change codemode's
                // configuration (see `codemode_childenv::confine_children`).
                codemode_childenv::confine(cmd.as_std_mut())
                    .map_err(|e| format!("cannot confine `{command}`: {e}"))?;
                // Its own process group, so that stopping the server also stops whatever it
                // started (`npx` runs the real server as a grandchild).
                let mut wrapped = process_wrap::tokio::CommandWrap::from(cmd);
                wrapped.wrap(process_wrap::tokio::ProcessGroup::leader());
                let (transport, stderr) = ChildTransport::spawn(wrapped, Arc::from(self.name()))
                    .map_err(|e| {
                        format!(
                            "cannot start `{command}`: {e}{}",
                            codemode_childenv::start_failure_hint()
                        )
                    })?;
                if let Some(pid) = transport.id() {
                    codemode_childenv::started_confined(pid);
                }
                *write(&self.backlog) = Some(transport.backlog());
                group = transport
                    .id()
                    .and_then(|id| libc::pid_t::try_from(id).ok())
                    .map(ProcessGroup);
                if let Some(stderr) = stderr {
                    self.log_stderr(stderr);
                }
                handler
                    .serve(CancelAfterRequest::new(transport))
                    .await
                    .map_err(|e| format!("the MCP handshake failed: {e}"))?
            }
            ServerTransport::Http { url, headers } => {
                let mut map = HashMap::new();
                for (key, value) in headers {
                    let name = http::HeaderName::from_bytes(key.as_bytes())
                        .map_err(|e| format!("headers.{key} is not a valid header name: {e}"))?;
                    let value = http::HeaderValue::from_str(value)
                        .map_err(|e| format!("headers.{key} is not a valid header value: {e}"))?;
                    map.insert(name, value);
                }
                let config =
                    StreamableHttpClientTransportConfig::with_uri(url.as_str()).custom_headers(map);
                let client = ScreenedHttp::new(self.name().into())?;
                handler
                    .serve(StreamableHttpClientTransport::with_client(client, config))
                    .await
                    .map_err(|e| format!("cannot connect to {url}: {e}"))?
            }
        };
        let tools = listing::tools(service.peer(), listing::BOUNDS)
            .await
            .map_err(|e| format!("listing its tools failed: {e}"))
            .map(|listed| self.kept(listed))?;
        let info = service.peer().peer_info();
        let capabilities = info
            .as_ref()
            .map(|i| i.capabilities.clone())
            .unwrap_or_default();
        let resources = match capabilities.resources {
            Some(_) => Some(self.list_resources(service.peer()).await.unwrap_or_else(|e| {
                tracing::warn!(server = %self.name(), error = %e, "listing MCP resources failed");
                Resources::default()
            })),
            None => None,
        };
        let prompts = match capabilities.prompts {
            Some(_) => Some(self.list_prompts(service.peer()).await.unwrap_or_else(|e| {
                tracing::warn!(server = %self.name(), error = %e, "listing MCP prompts failed");
                Vec::new()
            })),
            None => None,
        };
        let catalog = Catalog {
            tools,
            instructions: info.as_ref().and_then(|i| i.instructions.clone()),
            server_description: info
                .as_ref()
                .and_then(|i| i.server_info.as_ref())
                .and_then(|s| s.description.clone()),
            resources,
            prompts,
        };
        Ok((service, catalog, group))
    }

    fn log_stderr(&self, stderr: tokio::process::ChildStderr) {
        let server: Arc<str> = Arc::from(self.name());
        let tail = self.stderr_tail.clone();
        tokio::spawn(async move {
            let stderr = tokio::io::BufReader::new(stderr);
            super::stderr_lines::each_line(stderr, |line| {
                tracing::info!(target: "codemode_mcp::stderr", server = %server, "{line}");
                let mut tail = lock(&tail);
                if tail.len() == STDERR_TAIL {
                    tail.pop_front();
                }
                tail.push_back(line);
            })
            .await;
        });
    }

    /// What the server announced as changed and is not listed again yet.
    pub(crate) fn changes(&self) -> &Changes {
        &self.changes
    }

    /// Lists again what a server said changed. Returns true when the list changed. A server
    /// that does not answer within the call timeout keeps its old list until it announces a
    /// change again.
    pub(crate) async fn refresh(&self, what: Listing) -> bool {
        let Some(peer) = self.live_peer() else {
            return false;
        };
        let changed = match tokio::time::timeout(self.call_timeout, self.relist(&peer, what)).await
        {
            Ok(changed) => changed,
            Err(_) => {
                tracing::warn!(
                    server = %self.name(),
                    listing = ?what,
                    "MCP server did not answer its re-listing within {}; its old list stays",
                    human_duration(self.call_timeout)
                );
                false
            }
        };
        if changed {
            self.bump();
        }
        changed
    }

    async fn relist(&self, peer: &Peer<RoleClient>, what: Listing) -> bool {
        match what {
            Listing::Tools => match listing::tools(peer, listing::BOUNDS).await {
                Ok(tools) => {
                    let tools = self.kept(tools);
                    replace_if_changed(&mut write(&self.catalog).tools, tools)
                }
                Err(e) => {
                    tracing::warn!(server = %self.name(), error = %e, "refreshing MCP tools failed");
                    false
                }
            },
            Listing::Resources => match self.list_resources(peer).await {
                Ok(r) => replace_if_changed(&mut write(&self.catalog).resources, Some(r)),
                Err(e) => {
                    tracing::warn!(server = %self.name(), error = %e, "refreshing MCP resources failed");
                    false
                }
            },
            Listing::Prompts => match self.list_prompts(peer).await {
                Ok(p) => replace_if_changed(&mut write(&self.catalog).prompts, Some(p)),
                Err(e) => {
                    tracing::warn!(server = %self.name(), error = %e, "refreshing MCP prompts failed");
                    false
                }
            },
        }
    }

    /// What a bounded listing kept; what it left out is logged against the server.
    fn kept<T>(&self, listed: listing::Listed<T>) -> Vec<T> {
        if let Some(why) = &listed.cut {
            tracing::warn!(server = %self.name(), "MCP server listing cut short: {why}");
        }
        listed.items
    }

    async fn list_prompts(&self, peer: &Peer<RoleClient>) -> Result<Vec<Prompt>, ServiceError> {
        Ok(self.kept(listing::prompts(peer, listing::BOUNDS).await?))
    }

    async fn list_resources(&self, peer: &Peer<RoleClient>) -> Result<Resources, ServiceError> {
        let resources = self.kept(listing::resources(peer, listing::BOUNDS).await?);
        // Templates are optional for a server that has resources; some answer "method not found".
        let templates = listing::resource_templates(peer, listing::BOUNDS)
            .await
            .map(|listed| self.kept(listed))
            .unwrap_or_default();
        Ok(Resources {
            resources,
            templates,
        })
    }

    fn bump(&self) {
        self.generation.send_modify(|g| *g += 1);
    }

    /// A live connection, starting the server first when it is down. Gives up when `cancel`
    /// fires.
    async fn peer(&self, cancel: &CancellationToken) -> Result<Peer<RoleClient>, ToolError> {
        if let Some(peer) = self.live_peer() {
            return Ok(peer);
        }
        tokio::select! {
            biased;
            _ = cancel.cancelled() => Err(ToolError::cancelled()),
            r = self.connect() => r.map_err(|why| ToolError::failed(self.unavailable(&why))),
        }
    }

    /// Calls a tool. A server that died since the last call is restarted once first.
    /// The request is cancelled (`notifications/cancelled`) when `cancel` fires or when this
    /// future is dropped before the answer came, and fails after the call timeout without a
    /// response or progress notification. The server's progress goes to `progress`.
    pub(crate) async fn call(
        &self,
        tool: &str,
        args: Value,
        cancel: &CancellationToken,
        progress: Option<(ProgressSink, String)>,
    ) -> Result<CallToolResult, ToolError> {
        let arguments = match args {
            Value::Object(map) => Some(map),
            Value::Null => None,
            other => {
                return Err(ToolError::invalid(format!(
                    "MCP tools take an object of named arguments, not {other}"
                )));
            }
        };
        let peer = self.peer(cancel).await?;
        let mut params = CallToolRequestParams::new(tool.to_string());
        params.arguments = arguments;
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        match self.request(&peer, request, cancel, progress).await {
            Ok(ServerResult::CallToolResult(result)) => Ok(result),
            Ok(_) => Err(ToolError::failed(format!(
                "MCP server \"{}\" answered tools/call for \"{tool}\" with something other than a \
                 tool result",
                self.name()
            ))),
            Err(e) => Err(e.into_tool_error(self, tool)),
        }
    }

    /// Lists the server's resources and templates now (and remembers them).
    pub(crate) async fn list_resources_now(
        &self,
        cancel: &CancellationToken,
    ) -> Result<Resources, ToolError> {
        let peer = self.peer(cancel).await?;
        let listed = tokio::select! {
            biased;
            _ = cancel.cancelled() => return Err(ToolError::cancelled()),
            r = self.list_resources(&peer) => r.map_err(|e| self.call_error("resources/list", e))?,
        };
        if replace_if_changed(&mut write(&self.catalog).resources, Some(listed.clone())) {
            self.bump();
        }
        Ok(listed)
    }

    /// Reads one resource (`resources/read`).
    pub(crate) async fn read_resource(
        &self,
        uri: &str,
        cancel: &CancellationToken,
    ) -> Result<ReadResourceResult, ToolError> {
        let peer = self.peer(cancel).await?;
        let params = serde_json::from_value(serde_json::json!({ "uri": uri }))
            .map_err(|e| ToolError::invalid(format!("not a resource URI: {e}")))?;
        let request =
            ClientRequest::ReadResourceRequest(rmcp::model::ReadResourceRequest::new(params));
        match self.request(&peer, request, cancel, None).await {
            Ok(ServerResult::ReadResourceResult(result)) => Ok(result),
            Ok(_) => Err(ToolError::failed(format!(
                "MCP server \"{}\" answered resources/read for {uri} with something other than \
                 the resource (it may need input codemode cannot give)",
                self.name()
            ))),
            Err(e) => Err(e.into_tool_error(self, &format!("resources/read {uri}"))),
        }
    }

    /// Gets one prompt (`prompts/get`).
    pub(crate) async fn get_prompt(
        &self,
        name: &str,
        arguments: Option<serde_json::Map<String, Value>>,
        cancel: &CancellationToken,
    ) -> Result<GetPromptResult, ToolError> {
        let peer = self.peer(cancel).await?;
        let params =
            serde_json::from_value(serde_json::json!({ "name": name, "arguments": arguments }))
                .map_err(|e| ToolError::invalid(format!("bad prompt arguments: {e}")))?;
        let request = ClientRequest::GetPromptRequest(rmcp::model::GetPromptRequest::new(params));
        match self.request(&peer, request, cancel, None).await {
            Ok(ServerResult::GetPromptResult(result)) => Ok(result),
            Ok(_) => Err(ToolError::failed(format!(
                "MCP server \"{}\" answered prompts/get for {name} with something other than \
                 the prompt",
                self.name()
            ))),
            Err(e) => Err(e.into_tool_error(self, &format!("prompts/get {name}"))),
        }
    }

    /// Sends one request and waits for its answer. Whatever stops the wait early (`cancel`, the
    /// caller dropping this future, a timeout) tells the server with `notifications/cancelled`.
    async fn request(
        &self,
        peer: &Peer<RoleClient>,
        request: ClientRequest,
        cancel: &CancellationToken,
        progress: Option<(ProgressSink, String)>,
    ) -> Result<ServerResult, RequestError> {
        if cancel.is_cancelled() {
            // Stopped before it went out: the server never hears of it.
            return Err(RequestError::Cancelled);
        }
        let options =
            PeerRequestOptions::with_timeout(self.call_timeout).reset_timeout_on_progress();
        let handle = peer
            .send_request_with_option(request, options)
            .await
            .map_err(RequestError::Service)?;
        // From here on the server knows the request: any way out but its answer cancels it.
        let mut guard = CancelOnDrop::new(peer.clone(), handle.id.clone(), self.name());
        let _watch = progress.map(|(sink, label)| {
            self.progress
                .watch(handle.progress_token.clone(), sink, label)
        });
        let response = tokio::select! {
            biased;
            r = handle.await_response() => r,
            // The guard sends the cancellation from its own task: this future may itself be
            // dropped at any await from here on, which must not lose the notification.
            _ = cancel.cancelled() => return Err(RequestError::Cancelled),
            // The guard cancels the request on the server.
            () = tokio::time::sleep(self.call_limit) => return Err(RequestError::OverLimit),
        };
        // rmcp itself cancels on its timeout; an answer or a closed transport needs nothing.
        guard.disarm();
        response.map_err(RequestError::Service)
    }

    fn call_error(&self, tool: &str, e: ServiceError) -> ToolError {
        let mut error = self.call_error_unredacted(tool, e);
        error.message = self.redact(&error.message);
        error
    }

    fn call_error_unredacted(&self, tool: &str, e: ServiceError) -> ToolError {
        let server = self.name();
        if e_is_closed(&e) {
            // rmcp's HTTP transport ends the session on a response it cannot read, and keeps the
            // reason to itself; a stdio server's such responses are failed one by one instead.
            let why = match self.config.transport {
                ServerTransport::Http { .. } => {
                    "(it may have stopped, or sent a response codemode cannot read: larger \
                     than 16 MiB, nested more than 127 levels, or not a JSON-RPC response)"
                }
                ServerTransport::Stdio { .. } if self.stopped_reading() => {
                    "(it stopped reading what codemode sends it: too many messages went unread, \
                     so it was closed as broken)"
                }
                ServerTransport::Stdio { .. } => "(it may have crashed)",
            };
            return ToolError::failed(self.unavailable(&format!(
                "MCP server \"{server}\" closed the connection during the call to \"{tool}\" {why}"
            )));
        }
        match e {
            ServiceError::Timeout { timeout } => ToolError::timeout(format!(
                "MCP tool {server}/{tool} did not answer within {:.0} s (no result and no \
                 progress); the request was cancelled. Raise \"timeout\" for this server if the \
                 tool is slow",
                timeout.as_secs_f64()
            )),
            ServiceError::McpError(data) => ToolError::failed(format!(
                "MCP tool {server}/{tool} failed: {}",
                cut_message(&data.message)
            )),
            ServiceError::Cancelled { .. } => ToolError::cancelled(),
            other => ToolError::failed(format!("MCP tool {server}/{tool} failed: {other}")),
        }
    }

    fn stopped_reading(&self) -> bool {
        read(&self.backlog)
            .as_ref()
            .is_some_and(|backlog| backlog.is_stalled())
    }

    /// Closes the session and stops the server's process group; nothing starts it again.
    pub(crate) async fn shutdown(&self) {
        self.closed.store(true, Ordering::Release);
        let live = write(&self.live).take();
        if let Some(mut live) = live {
            let _ = live
                .service
                .close_with_timeout(Duration::from_secs(3))
                .await;
        }
    }
}

// Poisoned locks only mean a panic elsewhere; the data is still consistent enough to read.
fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}
fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}
fn lock<T>(l: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    l.lock().unwrap_or_else(|e| e.into_inner())
}

fn e_is_closed(e: &ServiceError) -> bool {
    matches!(
        e,
        ServiceError::TransportClosed | ServiceError::TransportSend(_)
    )
}

fn replace_if_changed<T: PartialEq>(slot: &mut T, new: T) -> bool {
    if *slot == new {
        return false;
    }
    *slot = new;
    true
}

/// `90 s`, `2 min`, `1 h`.
pub(crate) fn human_duration(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 1.0 {
        format!("{} ms", d.as_millis())
    } else if s < 120.0 {
        format!("{s:.0} s")
    } else if s < 7200.0 {
        format!("{:.0} min", s / 60.0)
    } else {
        format!("{:.0} h", s / 3600.0)
    }
}

/// Why a request got no answer.
enum RequestError {
    Service(ServiceError),
    Cancelled,
    /// Still running at the total limit, its progress notwithstanding.
    OverLimit,
}

impl RequestError {
    fn into_tool_error(self, upstream: &Upstream, what: &str) -> ToolError {
        match self {
            RequestError::Cancelled => ToolError::cancelled(),
            RequestError::Service(e) => upstream.call_error(what, e),
            RequestError::OverLimit => ToolError::timeout(format!(
                "MCP tool {}/{what} was still running after {} in all ({CALL_LIMIT_FACTOR} times \
                 the server's timeout of {}), the most one call may take even while the server \
                 reports progress; the request was cancelled. Raise \"timeout\" for this server \
                 if the tool needs longer",
                upstream.name(),
                human_duration(upstream.call_limit),
                human_duration(upstream.call_timeout),
            )),
        }
    }
}

/// Sends `notifications/cancelled` for a request, from a task of its own, when dropped before
/// being disarmed (cancelled, the script ended, or the gate stopped waiting).
struct CancelOnDrop {
    armed: Option<(Peer<RoleClient>, RequestId)>,
    server: String,
    runtime: Option<tokio::runtime::Handle>,
}

/// The most of an upstream's error message passed on: a message may be nearly 16 MiB, and a
/// script with thousands of calls out would have the host hold every one.
const MAX_ERROR_MESSAGE_BYTES: usize = 64 * 1024;

fn cut_message(message: &str) -> std::borrow::Cow<'_, str> {
    match super::progress::head_within(message, MAX_ERROR_MESSAGE_BYTES) {
        None => message.into(),
        Some((head, rest)) => {
            format!("{head}[…{rest} more bytes of the server's message left out]").into()
        }
    }
}

const CANCEL_REASON: &str = "the codemode script no longer waits for this call";

impl CancelOnDrop {
    fn new(peer: Peer<RoleClient>, id: RequestId, server: &str) -> Self {
        CancelOnDrop {
            armed: Some((peer, id)),
            server: server.to_string(),
            runtime: tokio::runtime::Handle::try_current().ok(),
        }
    }

    fn disarm(&mut self) {
        self.armed = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some((peer, id)) = self.armed.take() else {
            return;
        };
        let server = std::mem::take(&mut self.server);
        let send = async move { notify_cancelled(peer, id, &server).await };
        match tokio::runtime::Handle::try_current()
            .ok()
            .or(self.runtime.take())
        {
            Some(runtime) => {
                runtime.spawn(send);
            }
            None => tracing::debug!("no runtime left to send a cancellation on"),
        }
    }
}

/// Sent once: over stdio `CancelAfterRequest` writes it after its request, and the streamable
/// HTTP transport tracks each request's cancellation itself.
async fn notify_cancelled(peer: Peer<RoleClient>, id: RequestId, server: &str) {
    let note = CancelledNotificationParam::new(Some(id), Some(CANCEL_REASON.into()));
    if let Err(e) = peer.notify_cancelled(note).await {
        tracing::debug!(%server, error = %e, "could not send cancellation");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upstream_error_message_is_cut_on_a_character_boundary() {
        let short = "no such file";
        assert_eq!(cut_message(short), short);
        let long = "é".repeat(MAX_ERROR_MESSAGE_BYTES); // two bytes each
        let cut = cut_message(&long);
        assert!(cut.len() < MAX_ERROR_MESSAGE_BYTES + 100, "{}", cut.len());
        assert!(cut.ends_with(&format!(
            "[…{} more bytes of the server's message left out]",
            MAX_ERROR_MESSAGE_BYTES
        )));
    }
}
