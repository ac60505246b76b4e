//! One upstream MCP server: connecting, reconnecting, listing tools and calling them.

use std::collections::{HashMap, VecDeque};
use std::process::Stdio;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use codemode_spec::ToolError;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, CancelledNotificationParam,
    ClientRequest, ServerResult, Tool as McpToolDef,
};
use rmcp::service::{Peer, PeerRequestOptions, RoleClient, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ServiceError, ServiceExt};
use serde_json::Value;
use tokio::io::AsyncBufReadExt;
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

use super::handler::Handler;
use crate::config::{ServerConfig, ServerTransport};

/// How many of a server's last stderr lines are kept to explain a failed start.
const STDERR_TAIL: usize = 20;

type Service = RunningService<RoleClient, Handler>;

/// What the hub knows about a server right now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerState {
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
    pub(crate) tools: Vec<McpToolDef>,
    pub(crate) instructions: Option<String>,
    pub(crate) server_description: Option<String>,
}

pub(crate) struct Upstream {
    pub(crate) config: ServerConfig,
    connect_timeout: Duration,
    call_timeout: Duration,
    list_changed: UnboundedSender<Arc<str>>,
    /// Bumped whenever this server's tool list changes.
    generation: Arc<tokio::sync::watch::Sender<u64>>,
    /// Serializes (re)connects so that concurrent calls to a dead server start it only once.
    connect_lock: tokio::sync::Mutex<()>,
    live: RwLock<Option<Live>>,
    catalog: RwLock<Catalog>,
    failure: RwLock<Option<String>>,
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
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
        list_changed: UnboundedSender<Arc<str>>,
        generation: Arc<tokio::sync::watch::Sender<u64>>,
    ) -> Self {
        let call_timeout = config.timeout.unwrap_or(default_call_timeout);
        Upstream {
            config,
            connect_timeout,
            call_timeout,
            list_changed,
            generation,
            connect_lock: tokio::sync::Mutex::new(()),
            live: RwLock::new(None),
            catalog: RwLock::new(Catalog::default()),
            failure: RwLock::new(None),
            stderr_tail: Arc::new(Mutex::new(VecDeque::new())),
        }
    }

    pub(crate) fn name(&self) -> &str {
        &self.config.name
    }

    pub(crate) fn catalog(&self) -> Catalog {
        read(&self.catalog).clone()
    }

    pub(crate) fn state(&self) -> ServerState {
        if let Some(reason) = read(&self.failure).clone() {
            return ServerState::Failed(reason);
        }
        match read(&self.live).as_ref() {
            Some(live) if live.peer.is_transport_closed() => ServerState::Failed(
                "the connection was lost; the next call starts the server again".into(),
            ),
            Some(_) => ServerState::Connected {
                tools: read(&self.catalog).tools.len(),
            },
            None => ServerState::Failed("not connected yet".into()),
        }
    }

    /// Connects (or reconnects) and lists the tools. Failures are recorded, never raised.
    pub(crate) async fn connect(&self) -> Result<Peer<RoleClient>, String> {
        let _guard = self.connect_lock.lock().await;
        if let Some(peer) = self.live_peer() {
            return Ok(peer);
        }
        match tokio::time::timeout(self.connect_timeout, self.start()).await {
            Ok(Ok((service, catalog, group))) => {
                let peer = service.peer().clone();
                let changed = read(&self.catalog).tools != catalog.tools;
                *write(&self.catalog) = catalog;
                if changed {
                    self.bump();
                }
                *write(&self.failure) = None;
                *write(&self.live) = Some(Live {
                    peer: peer.clone(),
                    service,
                    _group: group,
                });
                Ok(peer)
            }
            Ok(Err(reason)) => Err(self.fail(reason).await),
            Err(_) => Err(self
                .fail(format!(
                    "did not finish starting within {:.0} s; check the command, or raise \
                 \"connectTimeoutMs\" for this server in {} (a first `npx` run downloads the \
                 package and can take a minute)",
                    self.connect_timeout.as_secs_f64(),
                    self.config.source
                ))
                .await),
        }
    }

    async fn fail(&self, reason: String) -> String {
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
        tracing::warn!(server = %self.name(), %reason, "MCP server unavailable");
        *write(&self.failure) = Some(reason.clone());
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
            list_changed: self.list_changed.clone(),
        };
        let mut group = None;
        let transport = self
            .config
            .transport
            .expanded(&|v| std::env::var(v).ok())
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
                cmd.envs(env);
                if let Some(cwd) = cwd {
                    cmd.current_dir(cwd);
                }
                // Its own process group, so that stopping the server also stops whatever it
                // started (`npx` runs the real server as a grandchild).
                let mut wrapped = process_wrap::tokio::CommandWrap::from(cmd);
                wrapped.wrap(process_wrap::tokio::ProcessGroup::leader());
                let (transport, stderr) = TokioChildProcess::builder(wrapped)
                    .stderr(Stdio::piped())
                    .spawn()
                    .map_err(|e| format!("cannot start `{command}`: {e}"))?;
                group = transport
                    .id()
                    .and_then(|id| libc::pid_t::try_from(id).ok())
                    .map(ProcessGroup);
                if let Some(stderr) = stderr {
                    self.log_stderr(stderr);
                }
                handler
                    .serve(transport)
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
                handler
                    .serve(StreamableHttpClientTransport::from_config(config))
                    .await
                    .map_err(|e| format!("cannot connect to {url}: {e}"))?
            }
        };
        let tools = service
            .peer()
            .list_all_tools()
            .await
            .map_err(|e| format!("listing its tools failed: {e}"))?;
        let info = service.peer().peer_info();
        let catalog = Catalog {
            tools,
            instructions: info.as_ref().and_then(|i| i.instructions.clone()),
            server_description: info
                .as_ref()
                .and_then(|i| i.server_info.as_ref())
                .and_then(|s| s.description.clone()),
        };
        Ok((service, catalog, group))
    }

    fn log_stderr(&self, stderr: tokio::process::ChildStderr) {
        let server: Arc<str> = Arc::from(self.name());
        let tail = self.stderr_tail.clone();
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                tracing::info!(target: "codemode_mcp::stderr", server = %server, "{line}");
                let mut tail = lock(&tail);
                if tail.len() == STDERR_TAIL {
                    tail.pop_front();
                }
                tail.push_back(line);
            }
        });
    }

    /// Lists the tools again (after `tools/list_changed`). Returns true when the list changed.
    pub(crate) async fn refresh_tools(&self) -> bool {
        let Some(peer) = self.live_peer() else {
            return false;
        };
        match peer.list_all_tools().await {
            Ok(tools) => {
                let mut catalog = write(&self.catalog);
                if catalog.tools == tools {
                    return false;
                }
                catalog.tools = tools;
                drop(catalog);
                self.bump();
                true
            }
            Err(e) => {
                tracing::warn!(server = %self.name(), error = %e, "refreshing MCP tools failed");
                false
            }
        }
    }

    fn bump(&self) {
        self.generation.send_modify(|g| *g += 1);
    }

    /// Calls a tool. A server that died since the last call is restarted once first.
    /// The request is cancelled (`notifications/cancelled`) when `cancel` fires, and fails after
    /// the call timeout without a response or progress notification.
    pub(crate) async fn call(
        &self,
        tool: &str,
        args: Value,
        cancel: &CancellationToken,
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
        let peer = match self.live_peer() {
            Some(peer) => peer,
            None => tokio::select! {
                biased;
                _ = cancel.cancelled() => return Err(ToolError::cancelled()),
                r = self.connect() => r.map_err(ToolError::failed)?,
            },
        };
        let mut params = CallToolRequestParams::new(tool.to_string());
        params.arguments = arguments;
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        let options =
            PeerRequestOptions::with_timeout(self.call_timeout).reset_timeout_on_progress();
        let handle = peer
            .send_request_with_option(request, options)
            .await
            .map_err(|e| self.call_error(tool, e))?;
        let id = handle.id.clone();
        let response = tokio::select! {
            biased;
            r = handle.await_response() => r,
            _ = cancel.cancelled() => {
                let note = CancelledNotificationParam::new(
                    Some(id),
                    Some("the codemode script no longer waits for this call".into()),
                );
                if let Err(e) = peer.notify_cancelled(note).await {
                    tracing::debug!(server = %self.name(), error = %e, "could not send cancellation");
                }
                return Err(ToolError::cancelled());
            }
        };
        match response {
            Ok(ServerResult::CallToolResult(result)) => Ok(result),
            Ok(_) => Err(ToolError::failed(format!(
                "MCP server \"{}\" answered tools/call for \"{tool}\" with something other than a \
                 tool result",
                self.name()
            ))),
            Err(e) => Err(self.call_error(tool, e)),
        }
    }

    fn call_error(&self, tool: &str, e: ServiceError) -> ToolError {
        let server = self.name();
        match e {
            ServiceError::Timeout { timeout } => ToolError::timeout(format!(
                "MCP tool {server}/{tool} did not answer within {:.0} s (no result and no \
                 progress); the request was cancelled. Raise \"timeout\" for this server if the \
                 tool is slow",
                timeout.as_secs_f64()
            )),
            ServiceError::TransportClosed | ServiceError::TransportSend(_) => {
                ToolError::failed(format!(
                    "MCP server \"{server}\" closed the connection during the call to \"{tool}\" \
                     (it may have crashed); the next call starts it again"
                ))
            }
            ServiceError::McpError(data) => {
                ToolError::failed(format!("MCP tool {server}/{tool} failed: {}", data.message))
            }
            ServiceError::Cancelled { .. } => ToolError::cancelled(),
            other => ToolError::failed(format!("MCP tool {server}/{tool} failed: {other}")),
        }
    }

    pub(crate) async fn shutdown(&self) {
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
