//! The hub: every configured server's connection, and their tools as codemode tools.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use codemode_spec::{NamespaceSpec, Tool};
use tokio::sync::{mpsc, watch};

use super::tool::McpTool;
use super::upstream::{ServerState, ServerStatus, Upstream};
use crate::config::McpConfig;
use crate::naming::{mcp_namespace, name_server_tools};

/// Timeouts for connecting to servers and calling their tools.
#[derive(Debug, Clone, Copy)]
pub struct ConnectOptions {
    /// How long one server may take to start, shake hands and list its tools, unless the
    /// server's own `connectTimeoutMs` says otherwise.
    pub connect_timeout: Duration,
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
            call_timeout: Duration::from_secs(60),
            retry_after: Some(Duration::from_secs(2)),
        }
    }
}

/// Owns the connections to the configured MCP servers.
///
/// Servers are connected in parallel; a server that fails is recorded in [`McpHub::status`] and
/// never fails the hub, so one broken server cannot take the others down. A server that dies is
/// started again by the next call to one of its tools. When a server reports that its tool list
/// changed, the hub lists it again and bumps [`McpHub::on_tools_changed`] so the runtime can
/// register the new set.
pub struct McpHub {
    upstreams: Vec<Arc<Upstream>>,
    disabled: Vec<String>,
    generation: watch::Receiver<u64>,
    refresher: tokio::task::JoinHandle<()>,
    retrier: Option<tokio::task::JoinHandle<()>>,
}

impl McpHub {
    /// Connects to every enabled server of `config`, in parallel.
    pub async fn connect(config: &McpConfig, opts: ConnectOptions) -> McpHub {
        let (generation_tx, generation) = watch::channel(0u64);
        let generation_tx = Arc::new(generation_tx);
        let (list_changed, mut changes) = mpsc::unbounded_channel::<Arc<str>>();
        let mut upstreams = Vec::new();
        let mut disabled = Vec::new();
        for server in config.servers() {
            if !server.enabled {
                disabled.push(server.name.clone());
                continue;
            }
            upstreams.push(Arc::new(Upstream::new(
                server.clone(),
                server.connect_timeout.unwrap_or(opts.connect_timeout),
                opts.call_timeout,
                list_changed.clone(),
                generation_tx.clone(),
            )));
        }
        let started = futures::future::join_all(upstreams.iter().map(|u| u.connect())).await;
        let failed: Vec<Arc<Upstream>> = upstreams
            .iter()
            .zip(&started)
            .filter(|(_, r)| r.is_err())
            .map(|(u, _)| u.clone())
            .collect();
        // Servers that failed to start are tried again in the background; one that comes up
        // bumps the generation, so whoever follows `on_tools_changed` registers its tools.
        let retrier = match opts.retry_after {
            Some(first) if !failed.is_empty() => Some(tokio::spawn(retry_failed(failed, first))),
            _ => None,
        };
        let watched = upstreams.clone();
        let refresher = tokio::spawn(async move {
            while let Some(server) = changes.recv().await {
                if let Some(upstream) = watched.iter().find(|u| u.name() == &*server) {
                    upstream.refresh_tools().await;
                }
            }
        });
        McpHub {
            upstreams,
            disabled,
            generation,
            refresher,
            retrier,
        }
    }

    /// One tool per MCP tool of every connected server, named `mcp__<server>__<tool>`.
    /// Tools whose exposure is `hidden` are included as hidden: the gate refuses them by name,
    /// and listings can say why they are hidden.
    pub fn tools(&self) -> Vec<Arc<dyn Tool>> {
        let mut taken = HashSet::new();
        let mut out: Vec<Arc<dyn Tool>> = Vec::new();
        for upstream in &self.upstreams {
            let catalog = upstream.catalog();
            let raw: Vec<String> = catalog.tools.iter().map(|t| t.name.to_string()).collect();
            let names = name_server_tools(upstream.name(), &raw, &taken);
            for (def, name) in catalog.tools.iter().zip(names) {
                taken.insert(name.clone());
                let exposure = upstream.config.exposure_for(&def.name);
                out.push(Arc::new(McpTool::new(
                    name,
                    def,
                    exposure,
                    upstream.clone(),
                )));
            }
        }
        out
    }

    /// One namespace per enabled server: `mcp__<server>`, with the configured description (else
    /// the server's own) and the instructions the server sent.
    pub fn namespaces(&self) -> Vec<NamespaceSpec> {
        self.upstreams
            .iter()
            .map(|u| {
                let catalog = u.catalog();
                NamespaceSpec {
                    name: mcp_namespace(u.name()),
                    description: u.config.description.clone().or(catalog.server_description),
                    instructions: catalog.instructions,
                }
            })
            .collect()
    }

    /// Connected, failed (with the reason) or disabled, per configured server.
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

    /// A counter that goes up whenever a server's tool list changed; call [`McpHub::tools`] again
    /// when it does.
    pub fn on_tools_changed(&self) -> watch::Receiver<u64> {
        self.generation.clone()
    }

    /// Closes every connection and stops every server process this hub started.
    pub async fn shutdown(mut self) {
        self.refresher.abort();
        if let Some(retrier) = self.retrier.take() {
            retrier.abort();
        }
        futures::future::join_all(self.upstreams.iter().map(|u| u.shutdown())).await;
    }
}

impl Drop for McpHub {
    fn drop(&mut self) {
        self.refresher.abort();
        if let Some(retrier) = &self.retrier {
            retrier.abort();
        }
    }
}

async fn retry_failed(mut pending: Vec<Arc<Upstream>>, first: Duration) {
    let mut delay = first;
    while !pending.is_empty() {
        tokio::time::sleep(delay).await;
        let results = futures::future::join_all(pending.iter().map(|u| u.connect())).await;
        pending = pending
            .into_iter()
            .zip(results)
            .filter(|(_, r)| r.is_err())
            .map(|(u, _)| u)
            .collect();
        delay = (delay * 2).min(RETRY_MAX);
    }
}
