//! What stays true while tools come and go: the settings' tool rules applied to every tool, the
//! policies checked against the tools registered now, and the warnings said once each.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Mutex, MutexGuard};

use codemode_config::mcp::McpConfig;
use codemode_config::settings::ToolRules;
use codemode_gate::{PolicyError, PolicySet, Registry};
use codemode_runtime::Codemode;
use codemode_spec::{Exposure, ToolSpec};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) struct Wiring {
    pub codemode: Codemode,
    pub rules: ToolRules,
    pub policy: PolicySet,
    pub mcp: McpConfig,
    /// Why each hidden tool is hidden.
    hidden: Mutex<BTreeMap<String, String>>,
    warnings: Mutex<Vec<String>>,
    said: Mutex<HashSet<String>>,
    /// Set while the policies have not yet fit the registered tools; until then the gate holds
    /// no policy and denies every call.
    policy_error: Mutex<Option<PolicyError>>,
}

impl Wiring {
    pub fn new(codemode: Codemode, rules: ToolRules, policy: PolicySet, mcp: McpConfig) -> Self {
        Wiring {
            codemode,
            rules,
            policy,
            mcp,
            hidden: Mutex::new(BTreeMap::new()),
            warnings: Mutex::new(Vec::new()),
            said: Mutex::new(HashSet::new()),
            policy_error: Mutex::new(None),
        }
    }

    pub fn registry(&self) -> &Registry {
        self.codemode.gate().registry()
    }

    /// Records warnings not said before; with `log`, also logs them (after start-up, when
    /// nobody reads the list).
    pub fn warn(&self, warnings: impl IntoIterator<Item = String>, log: bool) {
        let mut said = lock(&self.said);
        for w in warnings {
            if said.insert(w.clone()) {
                if log {
                    tracing::warn!("{w}");
                }
                lock(&self.warnings).push(w);
            }
        }
    }

    pub fn warnings(&self) -> Vec<String> {
        lock(&self.warnings).clone()
    }

    pub fn hidden_reason(&self, name: &str) -> Option<String> {
        lock(&self.hidden).get(name).cloned()
    }

    /// Applies the tool rules to every registered tool, from the exposure each declared, so
    /// applying twice gives the same result. Returns the warnings for ignored project rules.
    pub fn apply_tool_rules(&self) -> Vec<String> {
        let registry = self.registry();
        let mut warnings = Vec::new();
        let current: BTreeMap<String, Exposure> = registry
            .specs()
            .into_iter()
            .map(|s| (s.name, s.exposure))
            .collect();
        let mut hidden = BTreeMap::new();
        for spec in registry.declared_specs() {
            let verdict = self.rules.decide(&spec.name, spec.exposure, &mut warnings);
            if verdict.exposure == Exposure::Hidden {
                let why = verdict
                    .hidden_by
                    .unwrap_or_else(|| self.declared_hidden_reason(&spec));
                hidden.insert(spec.name.clone(), why);
            }
            if current.get(&spec.name) != Some(&verdict.exposure)
                && let Err(e) = registry.set_exposure(&spec.name, verdict.exposure)
            {
                warnings.push(format!(
                    "the rule for `{}` in settings.json was not applied: {e}",
                    spec.name
                ));
            }
        }
        *lock(&self.hidden) = hidden;
        warnings
    }

    fn declared_hidden_reason(&self, spec: &ToolSpec) -> String {
        let server = spec
            .namespace
            .as_deref()
            .and_then(|ns| ns.strip_prefix("mcp__"))
            .and_then(|ns| {
                self.mcp
                    .servers()
                    .iter()
                    .find(|s| codemode_mcp::mcp_namespace(&s.name) == format!("mcp__{ns}"))
            });
        match server {
            Some(s) => format!(
                "exposure hidden for MCP server \"{}\" in {}",
                s.name, s.source
            ),
            None => "declared hidden by its source".to_string(),
        }
    }

    /// Checks the policies again against the tools registered now (the schema types
    /// `context.args` from them). If they never fit yet, the error is kept and the gate keeps
    /// denying everything; if an earlier set fitted, it stays and a warning says why.
    pub fn recheck_policy(&self) -> Option<String> {
        match self.codemode.gate().set_policy(self.policy.clone()) {
            Ok(()) => {
                *lock(&self.policy_error) = None;
                None
            }
            Err(e) => {
                let mut pending = lock(&self.policy_error);
                if pending.is_some() {
                    *pending = Some(e.clone());
                    Some(format!(
                        "the policies do not fit the tools registered now, so every call is denied until they do: {e}"
                    ))
                } else {
                    Some(format!(
                        "the policies do not fit the tools registered now, so the last policies that did stay in force: {e}"
                    ))
                }
            }
        }
    }

    /// Warnings for policies that name, as `Tool::"…"`, a tool that is not registered although
    /// its source is (built-in, or an MCP server that listed its tools): such a policy never
    /// matches, so a `forbid` written with a tool's name as its server spells it forbids
    /// nothing. Names of servers not connected yet are judged once they are.
    pub fn unknown_policy_tools(&self) -> Vec<String> {
        let registry = self.registry();
        let namespaces: HashSet<String> = registry
            .declared_specs()
            .into_iter()
            .filter_map(|s| s.namespace)
            .collect();
        let mut out = Vec::new();
        for lit in self.policy.tool_literals() {
            let (at, name) = (&lit.at, &lit.name);
            if let Some(rest) = name.strip_prefix("mcp__") {
                let server = rest.split("__").next().unwrap_or_default();
                if !namespaces.contains(&codemode_mcp::mcp_namespace(server)) {
                    continue;
                }
            }
            let Some(close) = registry.closest_if_unknown(name) else {
                continue;
            };
            let hint = match close.as_slice() {
                [] => String::new(),
                names => format!(
                    " (did you mean {}?)",
                    names
                        .iter()
                        .map(|n| lit.written_like(n))
                        .collect::<Vec<_>>()
                        .join(" or ")
                ),
            };
            out.push(format!(
                "{at} names {}, which is no registered tool, so the policy never \
                 applies{hint}; an MCP tool is registered as mcp__<server>__<tool> with every \
                 character other than letters, digits and _ replaced by _ (`codemode tools` lists \
                 the names)",
                lit.written
            ));
        }
        // A name the tools type differently is out of the policies' sight: say which.
        if let Ok(schema) = codemode_gate::PolicySchema::for_registry(registry) {
            out.extend(schema.conflicts().iter().cloned());
        }
        out
    }

    /// Marks the policies as not yet in force (the gate denies every call until they fit).
    pub fn policy_pending(&self, e: PolicyError) {
        *lock(&self.policy_error) = Some(e);
    }

    /// The reason the policies are not in force, if they are not.
    pub fn policy_error(&self) -> Option<PolicyError> {
        lock(&self.policy_error).clone()
    }
}
