//! The hub: every configured server's connection, and their tools as codemode tools.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use codemode_spec::{NamespaceSpec, Tool};
use tokio::sync::watch;

use super::changes;
use super::prompts::{PROMPT_TOOL, PromptTool, prompt_exposure, prompt_tool_name};
use super::resources::{ResourceTool, resource_tool_names};
use super::tool::McpTool;
use super::upstream::{ServerState, ServerStatus, Upstream, human_duration};
use crate::config::McpConfig;
use crate::naming::{mcp_namespace, name_server_tools};

/// Timeouts for connecting to servers and calling their tools.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// How long one server may take to start, shake hands and list its tools, unless the
    /// server's own `connectTimeoutMs` or `server_connect_timeouts` says otherwise.
    pub connect_timeout: Duration,
    /// Per-server connect timeouts, by server name (a slow `npx` download, a remote server).
    pub server_connect_timeouts: BTreeMap<String, Duration>,
    /// How long a call may go without a result or a progress notification, unless the server's
    /// `timeout` says otherwise.
    pub call_timeout: Duration,
    /// A server that fails to start is tried again after this long, then after twice as long
    /// each time, up to a minute apart; `None` leaves it failed.
    pub retry_after: Option<Duration>,
}

/// The longest wait between two attempts to start a server that failed.
const RETRY_MAX: Duration = Duration::from_secs(60);

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            connect_timeout: Duration::from_secs(30),
            server_connect_timeouts: BTreeMap::new(),
            call_timeout: Duration::from_secs(60),
            retry_after: Some(Duration::from_secs(2)),
        }
    }
}

impl ConnectOptions {
    /// The connect timeout of one server.
    pub fn connect_timeout_for(&self, server: &str) -> Duration {
        self.server_connect_timeouts
            .get(server)
            .copied()
            .unwrap_or(self.connect_timeout)
    }
}

/// Owns the connections to the configured MCP servers.
///
/// Servers are connected in parallel, in the background: [`McpHub::start`] returns at once and
/// each server's tools arrive as it comes up ([`McpHub::on_tools_changed`] bumps), so one slow
/// server never holds up the others or the client. [`McpHub::connect`] waits for every first
/// attempt. A server that fails is recorded in [`McpHub::status`] and tried again in the
/// background; a server that dies is started again by the next call to one of its tools.
pub struct McpHub {
    upstreams: Vec<Arc<Upstream>>,
    disabled: Vec<String>,
    generation: watch::Receiver<u64>,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Done with every first attempt (connected or failed).
    settled: watch::Receiver<bool>,
}

impl McpHub {
    /// Starts every enabled server of `config` in the background and returns at once.
    pub fn start(config: &McpConfig, opts: ConnectOptions) -> McpHub {
        let (generation_tx, generation) = watch::channel(0u64);
        let generation_tx = Arc::new(generation_tx);
        let mut upstreams = Vec::new();
        let mut disabled = Vec::new();
        for server in config.servers() {
            if !server.enabled {
                disabled.push(server.name.clone());
                continue;
            }
            upstreams.push(Arc::new(Upstream::new(
                server.clone(),
                server
                    .connect_timeout
                    .unwrap_or_else(|| opts.connect_timeout_for(&server.name)),
                opts.call_timeout,
                generation_tx.clone(),
            )));
        }
        let (settled_tx, settled) = watch::channel(upstreams.is_empty());
        let pending = Arc::new(std::sync::atomic::AtomicUsize::new(upstreams.len()));
        let settled_tx = Arc::new(settled_tx);
        let mut tasks = Vec::new();
        for upstream in &upstreams {
            let upstream = upstream.clone();
            let pending = pending.clone();
            let settled_tx = settled_tx.clone();
            let retry_after = opts.retry_after;
            // Each server on its own: a slow one holds up neither the others nor their retries.
            tasks.push(tokio::spawn(async move {
                let first = upstream.connect().await;
                if pending.fetch_sub(1, std::sync::atomic::Ordering::AcqRel) == 1 {
                    let _ = settled_tx.send(true);
                }
                if let (Err(_), Some(delay)) = (first, retry_after) {
                    keep_trying(upstream, delay).await;
                }
            }));
        }
        // A refresher per server: one that never answers its re-listing holds up no other.
        tasks.extend(
            upstreams
                .iter()
                .map(|u| tokio::spawn(changes::follow(u.clone()))),
        );
        McpHub {
            upstreams,
            disabled,
            generation,
            tasks: Mutex::new(tasks),
            settled,
        }
    }

    /// Starts every enabled server and waits until each first attempt connected or failed.
    pub async fn connect(config: &McpConfig, opts: ConnectOptions) -> McpHub {
        let hub = McpHub::start(config, opts);
        hub.wait_started().await;
        hub
    }

    /// Waits until every server's first attempt to start finished.
    pub async fn wait_started(&self) {
        let mut settled = self.settled.clone();
        let _ = settled.wait_for(|done| *done).await;
    }

    /// One tool per MCP tool of every server, named `mcp__<server>__<tool>`, plus
    /// `mcp__<server>__list_resources` and `mcp__<server>__read_resource` for servers with
    /// resources, and `mcp__<server>__get_prompt` (deferred) for servers with prompts. A server that is down keeps the tools it had; calling one says why it is down.
    /// Tools whose exposure is `hidden` are included as hidden: the gate refuses them by name,
    /// and listings can say why they are hidden.
    pub fn tools(&self) -> Vec<Arc<dyn Tool>> {
        let mut taken = HashSet::new();
        let mut out: Vec<Arc<dyn Tool>> = Vec::new();
        for upstream in &self.upstreams {
            let catalog = upstream.catalog();
            let raw: Vec<String> = catalog.tools.iter().map(|t| t.name().to_string()).collect();
            let names = name_server_tools(upstream.name(), &raw, &taken);
            let own = || raw.iter().map(String::as_str);
            for (def, name) in catalog.tools.iter().zip(names) {
                let name = match name {
                    Ok(name) => name,
                    Err(why) => {
                        tracing::warn!(server = upstream.name(), tool = %def.name(), "{why}");
                        continue;
                    }
                };
                taken.insert(name.clone());
                let exposure = upstream.config.exposure_for(def.name());
                out.push(Arc::new(McpTool::new(
                    name,
                    def,
                    exposure,
                    upstream.clone(),
                )));
            }
            if catalog.resources.is_some() {
                for (kind, local, name) in resource_tool_names(upstream.name(), own(), &taken) {
                    let exposure = upstream.config.exposure_for(local);
                    taken.insert(name.clone());
                    out.push(Arc::new(ResourceTool::new(
                        kind,
                        name,
                        exposure,
                        upstream.clone(),
                    )));
                }
            }
            if catalog.prompts.as_ref().is_some_and(|p| !p.is_empty())
                && let Some(name) = prompt_tool_name(upstream.name(), own(), &taken)
            {
                let exposure = prompt_exposure(upstream.config.exposure_for(PROMPT_TOOL));
                taken.insert(name.clone());
                out.push(Arc::new(PromptTool::new(name, exposure, upstream.clone())));
            }
        }
        out
    }

    /// One namespace per enabled server: `mcp__<server>`, with the configured description (else
    /// the server's own) and the instructions the server sent. A server that is connecting or
    /// down says so in `unavailable`, which the codemode description and `describeNamespace`
    /// show, so the model tells "broken" from "unknown".
    pub fn namespaces(&self) -> Vec<NamespaceSpec> {
        self.upstreams
            .iter()
            .map(|u| {
                let catalog = u.catalog();
                NamespaceSpec {
                    name: mcp_namespace(u.name()),
                    description: u.config.description.clone().or(catalog.server_description),
                    instructions: catalog.instructions,
                    unavailable: unavailable_text(u),
                }
            })
            .collect()
    }

    /// One line per server that is not connected now, for the model: which server, what
    /// happened, and when it is tried again.
    pub fn unavailable(&self) -> Vec<(String, String)> {
        self.upstreams
            .iter()
            .filter_map(|u| unavailable_text(u).map(|t| (u.name().to_string(), t)))
            .collect()
    }

    /// Connecting, connected, failed (with the reason) or disabled, per configured server.
    pub fn status(&self) -> Vec<ServerStatus> {
        let mut out: Vec<ServerStatus> = self
            .upstreams
            .iter()
            .map(|u| ServerStatus {
                name: u.name().to_string(),
                state: u.state(),
            })
            .collect();
        out.extend(self.disabled.iter().map(|name| ServerStatus {
            name: name.clone(),
            state: ServerState::Disabled,
        }));
        out
    }

    /// A counter that goes up whenever a server's tools, resources, prompts or state changed;
    /// call [`McpHub::tools`] and [`McpHub::namespaces`] again when it does. The receiver has
    /// seen the current state: it wakes on the next change.
    pub fn on_tools_changed(&self) -> watch::Receiver<u64> {
        let mut changes = self.generation.clone();
        changes.borrow_and_update();
        changes
    }

    pub(crate) fn upstreams(&self) -> &[Arc<Upstream>] {
        &self.upstreams
    }

    /// Closes every connection and stops every server process this hub started, including any
    /// still starting; no server is started again afterwards.
    pub async fn shutdown(&self) {
        let tasks: Vec<_> = std::mem::take(&mut *lock(&self.tasks));
        for task in &tasks {
            task.abort();
        }
        // Aborted tasks drop what they were starting (and its process group) when they end.
        for task in tasks {
            let _ = task.await;
        }
        futures::future::join_all(self.upstreams.iter().map(|u| u.shutdown())).await;
    }
}

impl Drop for McpHub {
    fn drop(&mut self) {
        for task in lock(&self.tasks).iter() {
            task.abort();
        }
    }
}

/// What the model reads about a server that is not connected.
fn unavailable_text(u: &Upstream) -> Option<String> {
    match u.state() {
        ServerState::Connected { .. } | ServerState::Disabled => None,
        ServerState::Connecting => Some(format!(
            "Not available yet: MCP server \"{}\" is still starting; its tools appear when it is \
             up (the tool list changes).",
            u.name()
        )),
        ServerState::Failed(reason) => Some(format!(
            "Not available: {}.",
            u.unavailable(&reason).trim_end_matches('.')
        )),
    }
}

/// Tries to start a server that failed, after `delay`, then twice as long each time, up to a
/// minute apart, until it is up.
async fn keep_trying(upstream: Arc<Upstream>, mut delay: Duration) {
    loop {
        upstream.set_retry_every(Some(delay));
        tracing::debug!(server = %upstream.name(), delay = %human_duration(delay), "retrying an MCP server that failed");
        tokio::time::sleep(delay).await;
        if upstream.connect().await.is_ok() {
            upstream.set_retry_every(None);
            return;
        }
        delay = (delay * 2).min(RETRY_MAX);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
