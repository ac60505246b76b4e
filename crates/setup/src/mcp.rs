//! The only module that speaks to the MCP hub: start it without waiting for it, register its
//! tools when they arrive, follow its tool changes, report each server's state, stop it.
//!
//! Built against `McpHub::connect`, which resolves once every server connected or failed; it
//! runs in a task here so that the installation is usable at once. When the hub announces
//! servers as they come up, only this module changes.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use codemode_config::mcp::McpConfig;
use codemode_gate::Registry;
use codemode_mcp::{ConnectOptions, McpHub, ServerState, ServerStatus};
use tokio::sync::watch;

use crate::wiring::Wiring;

pub(crate) struct McpServers {
    hub: Arc<Mutex<Option<Arc<McpHub>>>>,
    ready: watch::Receiver<bool>,
    task: tokio::task::JoinHandle<()>,
    enabled: Vec<String>,
    disabled: Vec<String>,
}

impl McpServers {
    /// Starts connecting every enabled server of `config` in the background. `changed` goes up
    /// each time the registry took in the hub's tools.
    pub fn start(
        config: &McpConfig,
        opts: ConnectOptions,
        wiring: Arc<Wiring>,
        changed: watch::Sender<u64>,
    ) -> McpServers {
        let (ready_tx, ready) = watch::channel(false);
        let slot: Arc<Mutex<Option<Arc<McpHub>>>> = Arc::default();
        let owned = config.clone();
        let hub_slot = slot.clone();
        let task = tokio::spawn(async move {
            let hub = Arc::new(McpHub::connect(&owned, opts).await);
            *hub_slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(hub.clone());
            let mut warnings: Vec<String> = hub
                .status()
                .into_iter()
                .filter_map(|s| match s.state {
                    ServerState::Failed(problem) => Some(format!(
                        "MCP server `{}` is not connected (it is tried again in the background): {problem}",
                        s.name
                    )),
                    _ => None,
                })
                .collect();
            warnings.extend(sync(&wiring, &hub));
            wiring.warn(warnings, false);
            changed.send_modify(|n| *n += 1);
            let _ = ready_tx.send(true);
            let mut changes = hub.on_tools_changed();
            // What the hub has now is registered already; wait for the next change.
            changes.borrow_and_update();
            while changes.changed().await.is_ok() {
                let warnings = sync(&wiring, &hub);
                wiring.warn(warnings, true);
                changed.send_modify(|n| *n += 1);
            }
        });
        McpServers {
            hub: slot,
            ready,
            task,
            enabled: config
                .servers()
                .iter()
                .filter(|s| s.enabled)
                .map(|s| s.name.clone())
                .collect(),
            disabled: config
                .servers()
                .iter()
                .filter(|s| !s.enabled)
                .map(|s| s.name.clone())
                .collect(),
        }
    }

    /// Waits until every enabled server connected or failed once.
    pub async fn ready(&self) {
        let mut ready = self.ready.clone();
        let _ = ready.wait_for(|r| *r).await;
    }

    fn hub(&self) -> Option<Arc<McpHub>> {
        self.hub.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Each configured server's state; before the hub answers, enabled servers are
    /// "connecting".
    pub fn status(&self) -> Vec<ServerStatus> {
        if let Some(hub) = self.hub() {
            return hub.status();
        }
        let mut out: Vec<ServerStatus> = self
            .enabled
            .iter()
            .map(|name| ServerStatus {
                name: name.clone(),
                state: ServerState::Failed("still connecting".into()),
            })
            .collect();
        out.extend(self.disabled.iter().map(|name| ServerStatus {
            name: name.clone(),
            state: ServerState::Disabled,
        }));
        out
    }

    /// Stops following, closes every connection and stops every server process.
    pub async fn shutdown(self) {
        self.task.abort();
        let _ = self.task.await;
        let hub = self.hub.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(hub) = hub.and_then(|h| Arc::try_unwrap(h).ok()) {
            hub.shutdown().await;
        }
    }
}

/// Registers what the hub has now, applies the tool rules, and checks the policies against the
/// new tools. Returns the warnings.
fn sync(wiring: &Wiring, hub: &McpHub) -> Vec<String> {
    let mut warnings = sync_tools(wiring.registry(), hub);
    warnings.extend(wiring.apply_tool_rules());
    warnings.extend(wiring.recheck_policy());
    warnings
}

/// Makes the registry's MCP tools match the hub's: new tools registered, vanished ones removed,
/// changed ones replaced. A changed tool is briefly absent while it is replaced.
fn sync_tools(registry: &Registry, hub: &McpHub) -> Vec<String> {
    let mut warnings = Vec::new();
    let fresh = hub.tools();
    let fresh_names: HashSet<String> = fresh.iter().map(|t| t.spec().name.clone()).collect();
    let current = registry.declared_specs();
    for spec in &current {
        let from_mcp = spec
            .namespace
            .as_deref()
            .is_some_and(|n| n.starts_with("mcp__"));
        if from_mcp && !fresh_names.contains(&spec.name) {
            registry.remove(&spec.name);
        }
    }
    for ns in hub.namespaces() {
        registry.add_namespace(ns);
    }
    for tool in fresh {
        let name = tool.spec().name.clone();
        if let Some(old) = current.iter().find(|s| s.name == name) {
            let same = old.input_schema == tool.spec().input_schema
                && old.description == tool.spec().description
                && old.exposure == tool.spec().exposure;
            if same {
                continue;
            }
            registry.remove(&name);
        }
        if let Err(e) = registry.register(tool) {
            warnings.push(format!("an MCP tool was left out: {e}"));
        }
    }
    warnings
}
