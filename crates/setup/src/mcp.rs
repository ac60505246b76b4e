//! The only module that speaks to the MCP hub: start it without waiting for it, register its
//! tools as servers come up, follow its tool changes, report each server's state, stop it.

use std::collections::HashSet;
use std::sync::Arc;

use codemode_config::mcp::McpConfig;
use codemode_gate::Registry;
use codemode_mcp::{ConnectOptions, McpHub, ServerState, ServerStatus};
use codemode_spec::{Exposure, ToolSpec};
use tokio::sync::watch;

use crate::wiring::Wiring;

pub(crate) struct McpServers {
    hub: Arc<McpHub>,
    /// The hub's tool generation the registry has taken in.
    synced: watch::Receiver<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl McpServers {
    /// Starts every enabled server of `config` in the background. `changed` goes up each time
    /// the registry took in the hub's tools (a server came up, failed, or changed its list).
    pub fn start(
        config: &McpConfig,
        opts: ConnectOptions,
        wiring: Arc<Wiring>,
        changed: watch::Sender<u64>,
    ) -> McpServers {
        let hub = Arc::new(McpHub::start(config, opts));
        let follower = hub.clone();
        let (synced_tx, synced) = watch::channel(0);
        let task = tokio::spawn(async move {
            let mut changes = follower.on_tools_changed();
            // Sync once at once: servers may have come up already.
            changes.mark_changed();
            let mut reported: HashSet<String> = HashSet::new();
            let mut recent: std::collections::VecDeque<tokio::time::Instant> = Default::default();
            while changes.changed().await.is_ok() {
                // A few syncs at once (servers coming up, one failing), then at most one a
                // second: a server announcing changes every 50 ms kept a worker busy
                // re-registering thousands of tools (red team: every call 60 to 100 times
                // slower, and shutdown waited minutes).
                let now = tokio::time::Instant::now();
                while recent.front().is_some_and(|t| now - *t > SYNC_BURST_WINDOW) {
                    recent.pop_front();
                }
                if recent.len() >= SYNC_BURST
                    && let Some(last) = recent.back()
                {
                    tokio::time::sleep_until(*last + MIN_SYNC_GAP).await;
                }
                recent.push_back(tokio::time::Instant::now());
                let generation = *changes.borrow_and_update();
                let mut warnings: Vec<String> = follower
                    .status()
                    .into_iter()
                    .filter_map(|s| match s.state {
                        ServerState::Failed(problem) if reported.insert(problem.clone()) => {
                            Some(format!(
                                "MCP server `{}` is not connected (it is tried again in the background): {problem}",
                                s.name
                            ))
                        }
                        _ => None,
                    })
                    .collect();
                // Off the async workers: registering thousands of tools is CPU work, and
                // stopping this task (shutdown) must not wait for it.
                let (w, h) = (wiring.clone(), follower.clone());
                match tokio::task::spawn_blocking(move || sync(&w, &h)).await {
                    Ok(more) => warnings.extend(more),
                    Err(e) => {
                        warnings.push(format!("taking in the MCP servers' tools failed: {e}"))
                    }
                }
                wiring.warn(warnings, true);
                changed.send_modify(|n| *n += 1);
                let _ = synced_tx.send(generation);
            }
        });
        McpServers { hub, synced, task }
    }

    /// Waits until every enabled server connected or failed once.
    pub async fn ready(&self) {
        self.when_ready().await
    }

    /// [`McpServers::ready`] as a future that borrows nothing, for a task of its own.
    pub fn when_ready(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let hub = self.hub.clone();
        let mut synced = self.synced.clone();
        async move {
            hub.wait_started().await;
            // Then wait until the registry took in what the last server brought.
            let target = *hub.on_tools_changed().borrow();
            let _ = synced.wait_for(|g| *g >= target).await;
        }
    }

    pub fn hub(&self) -> Arc<McpHub> {
        self.hub.clone()
    }

    /// Each configured server's state: connecting, connected, failed (why) or disabled.
    pub fn status(&self) -> Vec<ServerStatus> {
        self.hub.status()
    }

    /// Stops following, closes every connection and stops every server process.
    pub async fn shutdown(self) {
        self.task.abort();
        let _ = self.task.await;
        self.hub.shutdown().await;
    }
}

/// Syncs of the registry with the servers' tools that may follow one another at once within
/// [`SYNC_BURST_WINDOW`]; past them, syncs are [`MIN_SYNC_GAP`] apart.
const SYNC_BURST: usize = 4;
const SYNC_BURST_WINDOW: std::time::Duration = std::time::Duration::from_secs(2);
const MIN_SYNC_GAP: std::time::Duration = std::time::Duration::from_secs(1);

/// Registers what the hub has now, applies the tool rules, and checks the policies against the
/// new tools. Returns the warnings.
fn sync(wiring: &Wiring, hub: &McpHub) -> Vec<String> {
    // The rules' warnings are said when they are applied to every tool, just after.
    let ruled = |spec: &ToolSpec| {
        wiring
            .rules
            .decide(&spec.name, spec.exposure, &mut Vec::new())
    };
    let mut warnings = sync_tools(wiring.registry(), hub, |spec| ruled(spec).exposure);
    warnings.extend(wiring.apply_tool_rules());
    warnings.extend(wiring.recheck_policy());
    warnings.extend(wiring.unknown_policy_tools());
    warnings
}

/// Makes the registry's MCP tools match the hub's: new tools registered, vanished ones removed,
/// changed ones (any field of the spec, annotations included) swapped in place. Each goes in
/// with the exposure the settings' rules give it (`exposure`), so a tool the settings hide is
/// never callable, not even between its arrival and the rules' next pass.
fn sync_tools(
    registry: &Registry,
    hub: &McpHub,
    exposure: impl Fn(&ToolSpec) -> Exposure,
) -> Vec<String> {
    let mut warnings = Vec::new();
    let fresh = hub.tools();
    let fresh_names: HashSet<String> = fresh.iter().map(|t| t.spec().name.clone()).collect();
    let current = registry.declared_specs();
    for spec in &current {
        if is_from_mcp(spec) && !fresh_names.contains(&spec.name) {
            registry.remove(&spec.name);
        }
    }
    for ns in hub.namespaces() {
        registry.add_namespace(ns);
    }
    for tool in fresh {
        let spec = tool.spec();
        // Everything the gate judges by counts: a tool re-announced as no longer read-only is
        // judged as such from the next call on.
        if current.iter().any(|old| old == spec) {
            continue;
        }
        if let Some(other) = current.iter().find(|old| old.name == spec.name)
            && !is_from_mcp(other)
        {
            warnings.push(format!(
                "an MCP tool was left out: `{}` is already the name of a tool that is not an MCP server's",
                spec.name
            ));
            continue;
        }
        let exposure = exposure(spec);
        if let Err(e) = registry.install(tool, exposure) {
            warnings.push(format!("an MCP tool was left out: {e}"));
        }
    }
    warnings
}

fn is_from_mcp(spec: &ToolSpec) -> bool {
    spec.namespace
        .as_deref()
        .is_some_and(|n| n.starts_with("mcp__"))
}
